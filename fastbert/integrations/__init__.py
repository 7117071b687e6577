"""Optional integrations with other frameworks, each imported only when used.

- ``fastbert.integrations.ray``: ``Embedder``, a callable class for Ray Data's ``map_batches``.
- ``fastbert.integrations.corpus``: ``fastbert embed-corpus``, resumable corpus embedding, in this
  process or on Ray.

Nothing here is imported by ``import fastbert``; Ray itself is imported only by the Ray runner.
"""
