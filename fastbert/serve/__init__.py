"""`fastbert serve`: an HTTP server for one model, OpenAI- and TEI-compatible (fastapi, uvicorn,
pydantic and prometheus-client: `pip install fastbert[serve]`).

- runner.py: what a checkpoint is (embedding, sparse, reranker, classifier) and what it computes
- batcher.py: the token-budget batcher and its model thread
- schemas.py: the request bodies
- metrics.py: the Prometheus metrics
- app.py: the routes (create_app)
- server.py: running it (uvicorn, graceful shutdown), and the CLI's `serve`
"""
