"""fastbert.Encoder: sentence embeddings from a checkpoint, like sentence-transformers' `encode`.

The pipeline is the sentence-transformers one (Transformer -> Pooling -> optional Normalize), read
from the checkpoint's own files: modules.json, <transformer dir>/sentence_bert_config.json
(max_seq_length) and <pooling dir>/config.json. What makes it fast:
- the input is read in windows of `sort_window` texts (SORT_WINDOW by default, rounded up to whole
  batches; None or 0: the whole input as one window). Each window is tokenized by
  fastbert.AutoTokenizer (the C++ WordPiece tokenizer for BERT-style vocabularies; it releases the
  GIL and runs on its own threads) on a worker thread while the model runs the previous window's
  batches, so tokenization hides behind the model and a large corpus never holds all its ids at once;
- inside a window, batches are formed after sorting by token count (not by characters), so a batch
  carries almost no padding, and the fastbert model does no work on what little padding there is
  (the packed path's GEMMs see none at all, so a window-local sort costs little: on a 2-core CPU,
  8,716 lines took the same time, within noise, with 4,096-text windows as with one global sort);
- a second worker prepares batch k + 1's host tensors while the model runs batch k;
- the encoder is fastbert.AutoModel (fused QKV, fused bias+GELU and add+LayerNorm, varlen attention),
  its GEMMs reading packed weights on the CPU in fp32 (model.prepack_weights(), turned on here: MKL's
  packed GEMM for a few dozen tokens, oneDNN's for more, and the layers' lean path, which gathers
  each layer's lookups and checks once; a copy is remade after the weights change through the
  parameters; after an in-place write through `param.data`, which no version counter sees, call
  model.prepack_weights() again).
- on the CPU one text, or a batch of at most `Encoder.one_thread_tokens` tokens, runs on all of
  torch's intra-op threads only while other processes leave that many cores idle (measured over the
  last 0.1 s from /proc/stat, less this process's own CPU time; after a quiet stretch of over a
  second, the last reading until a new 0.1 s has passed: _IdleCores), else on one. The
  trade-off: on idle cores a second thread shares the GEMMs (each streams its whole weight matrix
  at batch 1) and cuts the latency; on cores another process keeps busy, an OpenMP team waits at
  every one of a forward's ~30 parallel regions for a thread the scheduler has parked, and a short
  text got 5-20x slower (2 threads, 2-core machine, other processes busy: p50 78-96 ms against 12-14
  on one thread). Where /proc/stat cannot be read, small batches always run on one thread.
Results come back in input order. `Encoder.overlap = False` runs all of it serially on the caller's
thread (same batches, same results).

`encode` takes sentence-transformers' options under their names (prompt / prompt_name, truncate_dim,
precision, output_value, normalize_embeddings, convert_to_numpy / convert_to_tensor, batch_size,
show_progress_bar) and applies them in its order: prompt prepended to the text -> pooling (prompt
tokens left out when the Pooling config says include_prompt: false) -> the checkpoint's Normalize
module -> truncate_dim -> normalize_embeddings -> precision (fastbert.embedding_quantization, the
math of sentence_transformers.quantization.quantize_embeddings, in fastbert.quantize).
"""
import contextlib
import itertools
import json
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from fastbert.models.registry import ROBERTA_LIKE as _ROBERTA_LIKE  # positions start after padding_idx

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens")
# legacy 1_Pooling/config.json flags -> pooling mode (sentence-transformers' own names)
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def _read_json(path: Path, shape: type = dict):
    """The file's JSON, which must be a `shape` (an object; for modules.json a list of objects)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    entries = value if shape is list and isinstance(value, list) else [value]
    if not isinstance(value, shape) or not all(isinstance(v, dict) for v in entries):
        what = "a list of objects" if shape is list else "a JSON object"
        raise ValueError(f"{path} must hold {what}, got {json.dumps(value)[:80]}")
    return value


def _pooling_modes(config: dict, source: Path) -> tuple:
    """The pooling mode(s) named by a sentence-transformers Pooling config (new or legacy keys)."""
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        if not isinstance(modes, (str, list)) or not all(isinstance(m, str) for m in modes):
            raise ValueError(f"{source}: pooling_mode must be a mode name or a list of them, got {modes!r}")
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
    else:
        modes = tuple(mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key))
    if not modes:
        raise ValueError(f"{source}: no pooling mode is enabled")
    bad = [m for m in modes if m not in POOLINGS]
    if bad:
        raise ValueError(f"{source}: pooling mode {bad[0]!r} is not supported by fastbert.Encoder "
                         f"(supported: {POOLINGS})")
    return modes


def read_sentence_config(path) -> dict:
    """model_dir, pooling (tuple of modes), normalize and max_seq_length for a checkpoint directory.

    Without modules.json (a plain transformers checkpoint) this is mean pooling, no normalization,
    as sentence-transformers does for such a model."""
    path = Path(path)
    out = {"model_dir": path, "pooling": ("mean",), "normalize": False, "max_seq_length": None,
           "do_lower_case": False, "include_prompt": True, "prompts": {}, "default_prompt_name": None,
           "similarity_fn_name": "cosine"}
    st_file = path / "config_sentence_transformers.json"
    if st_file.is_file():
        cfg = _read_json(st_file)
        prompts = cfg.get("prompts") or {}
        if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
            raise ValueError(f"{st_file}: 'prompts' must map prompt names to strings, got {prompts!r}")
        out["prompts"] = dict(prompts)
        out["default_prompt_name"] = cfg.get("default_prompt_name")
        similarity = cfg.get("similarity_fn_name") or "cosine"
        if similarity not in SIMILARITIES:
            raise ValueError(f"{st_file}: similarity_fn_name must be one of {SIMILARITIES}, got {similarity!r}")
        out["similarity_fn_name"] = similarity
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return out
    for module in _read_json(modules_file, list):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = path / module.get("path", "")
        if kind == "Transformer":
            out["model_dir"] = where
            st_config = where / "sentence_bert_config.json"
            if st_config.is_file():
                cfg = _read_json(st_config)
                out["max_seq_length"] = cfg.get("max_seq_length")
                if out["max_seq_length"] is not None and (isinstance(out["max_seq_length"], bool) or
                                                          not isinstance(out["max_seq_length"], int)
                                                          or out["max_seq_length"] < 1):
                    raise ValueError(f"{st_config}: max_seq_length must be a positive int, "
                                     f"got {out['max_seq_length']!r}")
                out["do_lower_case"] = bool(cfg.get("do_lower_case", False))
        elif kind == "Pooling":
            pooling_file = where / "config.json"
            if not pooling_file.is_file():
                raise OSError(f"{modules_file} names a Pooling module but {pooling_file} does not exist")
            pooling_config = _read_json(pooling_file)
            out["pooling"] = _pooling_modes(pooling_config, pooling_file)
            out["include_prompt"] = bool(pooling_config.get("include_prompt", True))
        elif kind == "Normalize":
            out["normalize"] = True
        else:
            raise ValueError(f"{modules_file}: module type {module.get('type')!r} is not supported by "
                             "fastbert.Encoder (supported: Transformer, Pooling, Normalize)")
    return out


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """(batch, seq, hidden) states and (batch, seq) mask -> (batch, hidden * len(modes)), in fp32.

    Several modes are concatenated in the given order, as sentence-transformers does. "cls" is the
    first position the mask keeps (the [CLS] token, or the first one after an excluded prompt)."""
    hidden = hidden.float()
    m = mask.unsqueeze(-1).to(hidden.dtype)                          # (batch, seq, 1)
    counts = m.sum(dim=1).clamp(min=1e-9)                             # (batch, 1)
    parts = []
    for mode in modes:
        if mode == "cls":
            first = mask.to(torch.int32).argmax(dim=1)                   # (batch,)
            parts.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), first])
        elif mode == "max":
            parts.append(hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            parts.append((hidden * m).sum(dim=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((hidden * m).sum(dim=1) / counts.sqrt())
        else:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def pool_packed(hidden: torch.Tensor, lengths: Sequence[int], modes: Sequence[str], skip: int = 0) -> torch.Tensor:
    """pool() on packed tokens: (tokens, hidden) states of sequences of the given lengths, back to
    back -> (batch, hidden * len(modes)) in fp32. The first `skip` tokens of each sequence (an
    excluded prompt) are left out, as pool() does with a mask. Reads no device value."""
    hidden = hidden.float()
    device, batch = hidden.device, len(lengths)
    if batch == 1:      # one text (batch 1): slices, no index tensors
        return _pool_one(hidden[:lengths[0]], modes, skip)
    lengths_t = torch.tensor(lengths, dtype=torch.long)
    starts_t = torch.cumsum(lengths_t, 0) - lengths_t
    seq = torch.repeat_interleave(torch.arange(batch), lengths_t).to(device)          # (tokens,)
    pos = torch.arange(hidden.shape[0]) - torch.repeat_interleave(starts_t, lengths_t)
    keep = (pos >= skip).to(device=device, dtype=hidden.dtype).unsqueeze(1)          # (tokens, 1)
    counts = torch.tensor([max(n - skip, 0) for n in lengths], dtype=hidden.dtype,
                          device=device).clamp(min=1e-9).unsqueeze(1)                 # (batch, 1)
    width = hidden.shape[1]
    parts = []
    for mode in modes:
        if mode == "cls":
            first = starts_t + torch.where(lengths_t > skip, skip, 0)
            parts.append(hidden.index_select(0, first.clamp(max=max(hidden.shape[0] - 1, 0)).to(device)))
        elif mode == "max":
            masked = hidden.masked_fill(keep == 0, float("-inf"))
            init = hidden.new_full((batch, width), float("-inf"))
            parts.append(init.scatter_reduce(0, seq[:, None].expand(-1, width), masked, "amax"))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            sums = hidden.new_zeros((batch, width)).index_add_(0, seq, hidden * keep)
            parts.append(sums / (counts if mode == "mean" else counts.sqrt()))
        else:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _pool_one(hidden: torch.Tensor, modes: Sequence[str], skip: int) -> torch.Tensor:
    """pool_packed for one sequence's (length, hidden) fp32 states -> (1, hidden * len(modes)). On a CPU
    without autograd the same sums run in numpy: right after a forward has streamed the weights
    through the caches every call runs cold, and numpy's calls cost half of torch's there."""
    host = hidden.device.type == "cpu" and not hidden.requires_grad
    states = hidden.numpy() if host else hidden
    kept = states[skip:]
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(states[skip if len(kept) else 0:][:1])
        elif mode == "max" and len(kept):
            parts.append((np.amax if host else torch.amax)(kept, 0, keepdims=True))
        elif mode == "max":            # nothing kept: -inf, as pool() gives
            empty = hidden.new_full((1, hidden.shape[1]), float("-inf"))
            parts.append(empty.numpy() if host else empty)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            count = max(len(kept), 1e-9)
            parts.append(kept.sum(0, keepdims=True) / (count if mode == "mean" else count ** 0.5))
        else:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
    out = parts[0] if len(parts) == 1 else (np.concatenate if host else torch.cat)(parts, 1)
    return torch.from_numpy(out) if host else out


def _normalize_rows(vectors: torch.Tensor) -> torch.Tensor:
    """F.normalize(vectors, p=2, dim=1); one CPU row in numpy (see _pool_one)."""
    if vectors.shape[0] != 1 or vectors.device.type != "cpu" or vectors.requires_grad:
        return F.normalize(vectors, p=2, dim=1)
    row = vectors.numpy()
    return torch.from_numpy(row / np.float32(max(float(np.sqrt(row[0] @ row[0])), 1e-12)))


OUTPUT_VALUES = ("sentence_embedding", "token_embeddings", None)
# sentence-transformers' built-in prompt names: present (empty) even when the checkpoint sets none
_DEFAULT_PROMPTS = {"query": "", "document": ""}


# texts tokenized and length-sorted together by encode(): large enough that a local sort forms
# batches nearly as even as a global one (pydoc lines, batch 32: 2.6% padding against 1.0%) and the
# tokenizer's per-call cost vanishes, small enough that the first batch starts early (100,000 lines,
# 2-core CPU: 34 ms against 311 ms when all are tokenized first) and a window's ids take little memory
SORT_WINDOW = 4096


class _Prefetch:
    """Iterates fn(item) over items (any iterable) in order. With background=True, one worker thread
    takes item k + 1 from the iterable and runs fn on it while the caller works on fn(item k)
    (tokenization and host-side batch preparation then hide behind the model's work; if taking the
    item waits, on another _Prefetch, the worker waits, not the caller). An exception raised by fn,
    or by the iterable, surfaces in the caller at that item; leaving the with-block, normally or by
    an exception, cancels what is queued and joins the thread."""

    def __init__(self, fn, items, background: bool, name: str = "fastbert-prefetch"):
        self.fn, self.items = fn, items
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name) if background else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def __iter__(self):
        if self.pool is None:
            yield from map(self.fn, self.items)
            return
        items, done = iter(self.items), object()

        def step():          # one worker: the iterable is only ever advanced by one thread
            item = next(items, done)
            return done if item is done else self.fn(item)

        future = self.pool.submit(step)
        while (result := future.result()) is not done:
            future = self.pool.submit(step)
            yield result


class _IdleCores:
    """The cores other processes leave idle: the machine's busy CPU time (/proc/stat's first line,
    all but idle and iowait) less this process's own (time.process_time, every thread of it), over
    the last INTERVAL seconds or more, re-read at most that often (a read costs microseconds). A
    stretch of over STALE seconds (this process quiet that long) tells of load that may be long over
    (another engine's minute of work, a finished job): the last reading stands and a new interval
    starts. get() is None before the first interval has passed, and where /proc/stat cannot be read."""
    INTERVAL, STALE = 0.1, 1.0
    clock = staticmethod(time.monotonic)

    def __init__(self):
        self.cores = os.cpu_count() or 1
        self.idle = None
        try:
            self.fd, self.tick = os.open("/proc/stat", os.O_RDONLY), 1.0 / os.sysconf("SC_CLK_TCK")
            self.sample = self._read()
        except (OSError, ValueError, IndexError):
            self.fd = None

    def _read(self) -> tuple:
        ticks = [int(v) for v in os.pread(self.fd, 512, 0).split(b"\n", 1)[0].split()[1:9]]
        busy = sum(ticks) - ticks[3] - ticks[4]     # user nice system irq softirq steal (guest is in user)
        return self.clock(), busy * self.tick, time.process_time()

    def get(self) -> Optional[float]:
        if self.fd is not None and (age := self.clock() - self.sample[0]) >= self.INTERVAL:
            now = self._read()
            if age < self.STALE or self.idle is None:
                others = (now[1] - self.sample[1]) - (now[2] - self.sample[2])    # CPU seconds not ours
                self.idle = self.cores - max(others, 0.0) / (now[0] - self.sample[0])
            self.sample = now
        return self.idle


_idle_cores = None


def _watch_cores() -> None:
    """Start the process's _IdleCores (an Encoder does when it is made, so that its first interval
    has passed by its first small batch)."""
    global _idle_cores
    if _idle_cores is None:
        _idle_cores = _IdleCores()


def _small_batch_threads(before: int) -> int:
    """Intra-op threads for a small CPU batch: all `before` while other processes leave that many
    cores idle (ours included), else one."""
    _watch_cores()
    idle = _idle_cores.get()
    return before if idle is not None and idle + 0.5 >= before else 1


@contextlib.contextmanager
def _intra_op_threads(n: int, before: int):
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
_CPU = torch.device("cpu")


def _as_matrix(embeddings, name: str) -> torch.Tensor:
    """Embeddings as a 2-D float32 CPU-or-device tensor: one row per vector."""
    if isinstance(embeddings, (list, tuple)) and embeddings and isinstance(embeddings[0], torch.Tensor):
        embeddings = torch.stack(list(embeddings))
    t = torch.as_tensor(np.asarray(embeddings) if not isinstance(embeddings, torch.Tensor) else embeddings)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2:
        raise ValueError(f"{name} must be one vector or a 2-D batch of them, got shape {tuple(t.shape)}")
    return t.float()


class Encoder:
    """Sentence embeddings: `Encoder.from_pretrained(path).encode(texts)`.

    prompts / default_prompt_name / truncate_dim as in sentence-transformers' SentenceTransformer
    (prompts from the checkpoint's config_sentence_transformers.json, overridable here);
    include_prompt: whether pooling sees the prompt's tokens (the Pooling config's key);
    similarity_fn_name: what `similarity` computes (the checkpoint's, else "cosine")."""

    # tokenize window i + 1 on a worker thread while the model runs window i, and prepare batch
    # k + 1's host tensors on another while it runs batch k; False: everything on the caller's thread
    overlap = True
    # CPU batches of at most this many tokens run on one intra-op thread unless the cores are idle (module docstring)
    one_thread_tokens = 64

    def __init__(self, model, tokenizer, pooling=("mean",), normalize: bool = False,
                 max_seq_length: int = 512, do_lower_case: bool = False, prompts: Optional[dict] = None,
                 default_prompt_name: Optional[str] = None, truncate_dim: Optional[int] = None,
                 include_prompt: bool = True, similarity_fn_name: str = "cosine"):
        if similarity_fn_name not in SIMILARITIES:
            raise ValueError(f"similarity_fn_name must be one of {SIMILARITIES}, got {similarity_fn_name!r}")
        self.similarity_fn_name = similarity_fn_name
        self.model = model.eval()
        if callable(getattr(model, "prepack_weights", None)):   # fastbert's models: see prepack_weights
            model.prepack_weights()
        self.tokenizer = tokenizer
        self.pooling = (pooling,) if isinstance(pooling, str) else tuple(pooling)
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.do_lower_case = do_lower_case
        self.prompts = {**_DEFAULT_PROMPTS, **(prompts or {})}
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {default_prompt_name!r} is not one of the prompts "
                             f"{sorted(self.prompts)}")
        self.default_prompt_name = default_prompt_name
        self.truncate_dim = self._check_truncate_dim(truncate_dim)
        self.include_prompt = include_prompt
        self._prompt_lengths = {}
        _watch_cores()

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None, quantize: Optional[str] = None,
                        truncate_dim: Optional[int] = None, prompts: Optional[dict] = None,
                        default_prompt_name: Optional[str] = None) -> "Encoder":
        """quantize="int8": dynamic int8 Linear layers (fastbert.quantize), CPU float32 only.
        prompts: merged over the checkpoint's (these win); default_prompt_name replaces the
        checkpoint's."""
        from fastbert.tokenizer.auto import AutoTokenizer, local_dir as _local_dir
        from fastbert.auto import AutoModel

        path = _local_dir(path)
        st = read_sentence_config(path)
        model_dir = st["model_dir"]
        if not (model_dir / "config.json").is_file():
            raise OSError(f"{model_dir} has no config.json: not a model checkpoint directory")
        if device is None:
            device = "cuda" if torch.cuda.is_available() and quantize is None else "cpu"
        if quantize is not None:
            from fastbert._quantize import DTYPES
            if quantize not in DTYPES:
                raise ValueError(f"quantize must be one of {DTYPES} or None, got {quantize!r}")
            if torch.device(device).type != "cpu" or dtype not in (None, torch.float32, "float32"):
                raise ValueError(f"quantize={quantize!r} runs on CPU in float32; got device={device!r}, "
                                 f"dtype={dtype}")
            dtype = torch.float32                              # a half-precision checkpoint loads in float32
        model = AutoModel.from_pretrained(str(model_dir), dtype=dtype, device=device)
        if quantize is not None:
            from fastbert._quantize import quantize as quantize_model
            quantize_model(model, quantize)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        max_len = st["max_seq_length"] or cls._default_max_length(model.config, tokenizer)
        return cls(model, tokenizer, st["pooling"], st["normalize"], int(max_len), st["do_lower_case"],
                   prompts={**st["prompts"], **(prompts or {})},
                   default_prompt_name=default_prompt_name or st["default_prompt_name"],
                   truncate_dim=truncate_dim, include_prompt=st["include_prompt"],
                   similarity_fn_name=st["similarity_fn_name"])

    @staticmethod
    def _default_max_length(config, tokenizer) -> int:
        limit = getattr(config, "max_position_embeddings", 512)
        if getattr(config, "model_type", "") in _ROBERTA_LIKE:
            pad = getattr(config, "pad_token_id", None)
            limit -= (1 if pad is None else pad) + 1
        tok_limit = getattr(tokenizer, "model_max_length", None)
        return min(limit, tok_limit) if isinstance(tok_limit, int) and tok_limit > 0 else limit

    @property
    def device(self) -> torch.device:
        for tensor in self.model.parameters():
            return tensor.device
        return next(self.model.buffers()).device

    def _check_truncate_dim(self, truncate_dim):
        if truncate_dim is None:
            return None
        if isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1:
            raise ValueError(f"truncate_dim must be a positive int or None, got {truncate_dim!r}")
        return truncate_dim

    def similarity(self, embeddings1, embeddings2) -> torch.Tensor:
        """sentence-transformers' SentenceTransformer.similarity: a (len1, len2) float32 tensor of
        scores by similarity_fn_name: "cosine", "dot", or the negated "euclidean" / "manhattan"
        distance (higher is more similar). Takes what encode returns: arrays, tensors, lists, 1-D rows."""
        a, b = (_as_matrix(e, name) for e, name in ((embeddings1, "embeddings1"), (embeddings2, "embeddings2")))
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"embeddings1 has dimension {a.shape[1]}, embeddings2 {b.shape[1]}")
        if self.similarity_fn_name == "cosine":
            return F.normalize(a, dim=1) @ F.normalize(b, dim=1).T
        if self.similarity_fn_name == "dot":
            return a @ b.T
        return -torch.cdist(a, b, p=2.0 if self.similarity_fn_name == "euclidean" else 1.0)

    def similarity_pairwise(self, embeddings1, embeddings2) -> torch.Tensor:
        """sentence-transformers' SentenceTransformer.similarity_pairwise: the score of embeddings1[i]
        with embeddings2[i], a (len,) float32 tensor, by similarity_fn_name as in `similarity`."""
        a, b = (_as_matrix(e, name) for e, name in ((embeddings1, "embeddings1"), (embeddings2, "embeddings2")))
        if a.shape != b.shape:
            raise ValueError(f"embeddings1 has shape {tuple(a.shape)}, embeddings2 {tuple(b.shape)}: "
                             "pairwise scores need one row of each per pair")
        if self.similarity_fn_name == "cosine":
            return (F.normalize(a, dim=1) * F.normalize(b, dim=1)).sum(dim=1)
        if self.similarity_fn_name == "dot":
            return (a * b).sum(dim=1)
        return -(a - b).norm(p=2.0 if self.similarity_fn_name == "euclidean" else 1.0, dim=1)

    def get_embedding_dimension(self) -> int:
        """As sentence-transformers': the length of encode()'s vectors (the pooled width, or
        truncate_dim when it is set and smaller)."""
        dim = self.model.config.hidden_size * len(self.pooling)
        return dim if self.truncate_dim is None else min(dim, self.truncate_dim)

    get_sentence_embedding_dimension = get_embedding_dimension   # its name before sentence-transformers 6

    def encode_query(self, sentences=None, prompt_name: Optional[str] = None, prompt: Optional[str] = None,
                     **kwargs):
        """sentence-transformers' encode_query: encode() with the "query" prompt when neither prompt
        nor prompt_name is given ("" when the checkpoint has none: default_prompt_name does not apply)."""
        if prompt_name is None and prompt is None:
            prompt_name, prompt = ("query", None) if "query" in self.prompts else (None, "")
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, **kwargs)

    def encode_document(self, sentences=None, prompt_name: Optional[str] = None, prompt: Optional[str] = None,
                        **kwargs):
        """sentence-transformers' encode_document: encode() with the first of the "document",
        "passage" and "corpus" prompts the checkpoint has when neither prompt nor prompt_name is given."""
        if prompt_name is None and prompt is None:
            prompt_name = next((name for name in ("document", "passage", "corpus") if name in self.prompts), None)
            prompt = "" if prompt_name is None else None
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, **kwargs)

    def _resolve_prompt(self, prompt: Optional[str], prompt_name: Optional[str]) -> Optional[str]:
        """sentence-transformers' rule: prompt wins over prompt_name, then default_prompt_name."""
        if prompt is not None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
            if prompt_name is not None:
                warnings.warn(f"encode() got both prompt and prompt_name={prompt_name!r}: using prompt, "
                              "as sentence-transformers does", stacklevel=3)
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(f"prompt_name {prompt_name!r} is not one of the prompts {sorted(self.prompts)}")
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts[self.default_prompt_name]
        return None

    def _tokenize(self, texts: list) -> list:
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        enc = self.tokenizer(texts, padding=False, truncation=True, max_length=self.max_seq_length)
        return list(enc["input_ids"])

    def _prompt_length(self, prompt: str) -> int:
        """The prompt's token count as sentence-transformers counts it: the prompt tokenized alone,
        less a trailing special token ([SEP])."""
        if prompt not in self._prompt_lengths:
            ids = self._tokenize([prompt])[0]
            special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
            self._prompt_lengths[prompt] = len(ids) - (1 if ids and ids[-1] in special else 0)
        return self._prompt_lengths[prompt]

    def _host_batch(self, rows: list, packed: bool):
        """Host tensors of one batch of token id rows (the part that can run beside the model).
        packed: (one buffer [ids | 0 | cumsum(lengths)], pinned on CUDA, token count, longest row);
        else (input_ids, attention_mask) padded to the longest row."""
        lengths = [len(r) for r in rows]
        if packed:
            values = [t for r in rows for t in r]
            tokens = len(values)
            values.append(0)
            values.extend(itertools.accumulate(lengths))
            host = torch.tensor(values, dtype=torch.long)
            if self.device.type == "cuda":
                host = host.pin_memory()
            return host, tokens, max(lengths)
        flat = torch.tensor([t for r in rows for t in r], dtype=torch.long)
        lengths = torch.tensor(lengths)
        mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]        # (batch, width)
        ids = torch.full(mask.shape, getattr(self.tokenizer, "pad_token_id", None) or 0, dtype=torch.long)
        ids[mask] = flat
        return ids, mask.long()

    def _threads_for(self, tokens: int, device: Optional[torch.device] = None, texts: int = 0):
        """The intra-op threads of a small CPU batch (at most one_thread_tokens tokens, or `texts` ==
        1: one text of any length): the current setting while the machine has that many cores idle,
        else one (see the module docstring); a larger batch keeps the current setting. torch's thread
        count is per OS thread once set (OpenMP's), so another Python thread's forward keeps its own.
        device: self.device, if read."""
        before = torch.get_num_threads()
        if ((device or self.device).type != "cpu" or (tokens > self.one_thread_tokens and texts != 1)
                or before == 1):
            return contextlib.nullcontext()
        threads = _small_batch_threads(before)
        if threads == before:
            return contextlib.nullcontext()
        if callable(getattr(self.model, "pack_for_threads", None)):   # MKL's copies packed for all threads
            self.model.pack_for_threads(tokens)
        return _intra_op_threads(threads, before)

    def _forward_packed(self, host: torch.Tensor, tokens: int, max_seqlen: int,
                        device: Optional[torch.device] = None) -> torch.Tensor:
        """The model's packed forward on one host buffer (from _host_batch): (tokens, hidden). One
        non-blocking copy; nothing is read back. device: self.device, if read. A fastbert model's
        packed_states skips forward_packed's shape checks and output object (the tokenizer made
        these inputs)."""
        buf = host.to(device or self.device, non_blocking=True)
        input_ids, cu_seqlens = buf[:tokens], buf[tokens:].to(torch.int32)
        if callable(states := getattr(self.model, "packed_states", None)):
            return states(input_ids, cu_seqlens, max_seqlen)
        return self.model.forward_packed(input_ids, cu_seqlens, max_seqlen).last_hidden_state

    def encode(self, sentences: Union[str, Sequence[str]] = None, prompt_name: Optional[str] = None,
               prompt: Optional[str] = None, batch_size: int = 32, show_progress_bar: bool = False,
               output_value: Optional[str] = "sentence_embedding", precision: str = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: Optional[bool] = None, truncate_dim: Optional[int] = None,
               pooling: Optional[str] = None, sort_window: Optional[int] = SORT_WINDOW, texts=None,
               inputs=None, device=None, **kwargs):
        """Embeds `sentences`; a str gives one vector, a list gives (len, dim) in input order.

        The options are sentence-transformers' (SentenceTransformer.encode), with these fastbert
        additions: pooling ("mean" | "cls" | "max" | "mean_sqrt_len_tokens") overrides the
        checkpoint's. The checkpoint's Normalize module always runs, before truncate_dim, as in
        sentence-transformers (set `encoder.normalize = False` to drop it);
        normalize_embeddings=True also normalizes after truncate_dim, as sentence-transformers'
        True. The texts may be passed as `sentences`, `inputs` (sentence-transformers 6's name) or
        `texts`, as a str, a list or tuple of str, or a 1-D numpy array of str. device must be None
        or the encoder's own device (it does not move the model). precision != "float32" quantizes
        the whole result with ranges from the result itself (fastbert.quantize_embeddings).
        output_value "token_embeddings" gives one (tokens, hidden) tensor per text; None gives one dict
        per text (input_ids, attention_mask, token_embeddings, sentence_embedding, and prompt_length
        with a prompt),
        each value unpadded: the text's own tokens only. convert_to_tensor returns a tensor
        (float32 on the model's device; quantized ones on the CPU), else convert_to_numpy an
        array, else a list of 1-D tensors.

        sort_window (a fastbert addition): texts are tokenized and sorted by token count in windows
        of this many texts, rounded up to a whole number of batches (so only the input's last batch
        can be short, and the batches, and the progress bar, count as with one window); window
        i + 1 is tokenized while the model runs window i. None or 0: the whole input is one window
        (tokenized up front, sorted globally). Embeddings equal the one-window ones to float
        rounding (a batch's rows may differ), in input order either way."""
        from fastbert._quantize import PRECISIONS, quantize_embeddings

        if kwargs:
            raise TypeError(f"Encoder.encode() got unexpected keyword argument(s): {sorted(kwargs)}")
        given = {k: v for k, v in (("sentences", sentences), ("inputs", inputs), ("texts", texts)) if v is not None}
        if len(given) > 1:
            raise TypeError(f"Encoder.encode() got the texts twice: {' and '.join(given)}")
        sentences = next(iter(given.values()), None)
        here = self.device
        want = torch.device(device) if device is not None else here
        if want.type != here.type or want.index not in (None, here.index):
            raise ValueError(f"device={device!r}: this Encoder runs on {here}; build one there with "
                             "Encoder.from_pretrained(..., device=...)")
        if isinstance(sentences, np.ndarray) and sentences.ndim == 1 and sentences.dtype.kind in "UO":
            sentences = sentences.tolist()              # sentence-transformers takes arrays of str
        single = isinstance(sentences, str)
        items = [sentences] if single else sentences
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"texts must be a str or a list of str, got {type(items).__name__}")
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is a {type(t).__name__}, expected str")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if sort_window is not None and (isinstance(sort_window, bool) or not isinstance(sort_window, int)
                                        or sort_window < 0):
            raise ValueError(f"sort_window must be a positive int, or None or 0 for the whole input, "
                             f"got {sort_window!r}")
        modes = self.pooling if pooling is None else (pooling,)
        for mode in modes:
            if mode not in POOLINGS:
                raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
        if output_value not in OUTPUT_VALUES:
            raise ValueError(f"output_value must be one of {OUTPUT_VALUES}, got {output_value!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if precision != "float32" and output_value is None:
            raise ValueError("precision applies to embeddings; with output_value=None use float32")
        dim = self.model.config.hidden_size * len(modes)
        truncate_dim = self._check_truncate_dim(truncate_dim) or self.truncate_dim
        if truncate_dim is not None and truncate_dim > dim:
            raise ValueError(f"truncate_dim {truncate_dim} exceeds the embedding dimension {dim}")
        text_prompt = self._resolve_prompt(prompt, prompt_name)
        if convert_to_tensor:
            convert_to_numpy = False
        if output_value != "sentence_embedding":      # per-text outputs: lists, as sentence-transformers
            convert_to_tensor = convert_to_numpy = False

        out = self._embed(list(items), batch_size, modes, normalize_embeddings, show_progress_bar,
                          text_prompt, truncate_dim, output_value, sort_window)
        if precision != "float32":
            out = quantize_embeddings(out, precision)    # numpy: an array, or a list per text
            if convert_to_tensor:
                out = torch.from_numpy(out)
            elif not convert_to_numpy and output_value == "sentence_embedding":
                out = list(torch.from_numpy(out))
        elif output_value == "sentence_embedding":
            if convert_to_numpy:
                out = out.cpu().numpy()
            elif not convert_to_tensor:
                out = list(out)
        return out[0] if single else out

    def _sorted_batches(self, texts: list, window: range, batch_size: int, prompt: str) -> list:
        """One window of texts tokenized (prompt first) and cut into batches, longest first (as
        sentence-transformers): [(input indices, token id rows)]. Runs on the tokenizing worker."""
        rows = self._tokenize([prompt + texts[i] for i in window])
        order = sorted(range(len(rows)), key=lambda j: -len(rows[j]))
        parts = (order[s:s + batch_size] for s in range(0, len(order), batch_size))
        return [([window[j] for j in part], [rows[j] for j in part]) for part in parts]

    def _finish(self, vectors: torch.Tensor, truncate_dim: Optional[int], normalize: bool) -> torch.Tensor:
        """Pooled vectors through the checkpoint's Normalize module (if any), truncate_dim, then encode's
        normalize_embeddings flag (after truncation, as sentence-transformers' True)."""
        if self.normalize:
            vectors = _normalize_rows(vectors)
        if truncate_dim is not None:
            vectors = vectors[:, :truncate_dim]
        return _normalize_rows(vectors) if normalize else vectors

    def _short_text(self, text: str, modes, skip: int) -> Optional[torch.Tensor]:
        """One text's pooled (1, dim) float32 vector through the model's short_states, the batch-1 path
        of a fastbert model on a CPU (the text short enough for the C++ layer stack); None where it does
        not apply (the caller then runs the general path, which tokenizes again)."""
        short_states = getattr(self.model, "short_states", None)
        if short_states is None:
            return None
        ids = self._tokenize([text])[0]
        with self._threads_for(len(ids), _CPU, 1):
            hidden = short_states(ids)
        return None if hidden is None else _pool_one(hidden, modes, skip)

    @torch.inference_mode()
    def _embed(self, texts, batch_size, modes, normalize, show_progress_bar, prompt, truncate_dim,
               output_value, sort_window=SORT_WINDOW):
        """(len(texts), dim) float32 for sentence embeddings, else a list per text."""
        prompt_length = self._prompt_length(prompt) if prompt else 0
        skip = 0 if self.include_prompt else prompt_length  # leading tokens pooling leaves out
        n = len(texts)
        if (n == 1 and output_value == "sentence_embedding" and not show_progress_bar
                and (vectors := self._short_text((prompt or "") + texts[0], modes, skip)) is not None):
            return self._finish(vectors, truncate_dim, normalize).contiguous()
        device = self.device
        dim = self.model.config.hidden_size * len(modes)
        out = torch.empty((len(texts), truncate_dim or dim), dtype=torch.float32, device=device)
        per_text = [None] * len(texts)
        if not texts:
            return out if output_value == "sentence_embedding" else []
        step = -(-sort_window // batch_size) * batch_size if sort_window else n   # whole batches
        windows = [range(s, min(s + step, n)) for s in range(0, n, step)]
        packed = output_value == "sentence_embedding" and hasattr(self.model, "forward_packed")
        tokenized = _Prefetch(lambda window: self._sorted_batches(texts, window, batch_size, prompt or ""),
                              windows, background=self.overlap and len(windows) > 1, name="fastbert-tokenize")
        prepared = _Prefetch(lambda batch: (*batch, self._host_batch(batch[1], packed)),
                             itertools.chain.from_iterable(tokenized), background=self.overlap and n > batch_size)
        bar = None
        if show_progress_bar:
            from tqdm.auto import tqdm
            bar = tqdm(total=-(-n // batch_size), desc="Batches")
        # on any exit: both workers joined (prepared's first: its worker may wait on tokenized's)
        with tokenized, prepared, bar or contextlib.nullcontext():
            for idx, rows, host in prepared:
                # a small batch on one intra-op thread, its pooling too (index_add_ would wake the team)
                with self._threads_for(host[1] if packed else host[0].numel(), device, len(rows)):
                    if packed:      # real tokens only, pooled per sequence on the packed states
                        vectors = pool_packed(self._forward_packed(*host, device), [len(r) for r in rows], modes,
                                              skip)
                    else:
                        input_ids, attention_mask = (t.to(device) for t in host)
                        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                        pool_mask = attention_mask
                        if skip:
                            pool_mask = attention_mask.clone()
                            pool_mask[:, :skip] = 0
                        vectors = pool(hidden, pool_mask, modes)
                    vectors = self._finish(vectors, truncate_dim, normalize and output_value == "sentence_embedding")
                    if bar is not None:
                        bar.update()
                    if output_value == "sentence_embedding":
                        if len(idx) == 1:
                            out[idx[0]] = vectors[0]
                        else:
                            out[torch.tensor(idx, device=out.device)] = vectors
                        continue
                    for j, (i, row) in enumerate(zip(idx, rows)):
                        tokens = hidden[j, :len(row)].float()
                        if output_value == "token_embeddings":
                            per_text[i] = tokens
                        else:
                            item = {"input_ids": input_ids[j, :len(row)],
                                    "attention_mask": attention_mask[j, :len(row)],
                                    "token_embeddings": tokens, "sentence_embedding": vectors[j]}
                            if prompt:
                                item["prompt_length"] = prompt_length
                            per_text[i] = item
        return out if output_value == "sentence_embedding" else per_text
