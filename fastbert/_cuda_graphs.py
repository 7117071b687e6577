"""fastbert.cuda_graphs(model): packed inference replayed from CUDA graphs, one graph per bucket.

At serving sizes a BERT forward is host-bound: the GPU waits on Python issuing ~100 launches. A CUDA
graph replays the whole forward from one call. Graphs need fixed shapes, so each call is rounded up
to a bucket:

- tokens T -> the smallest token bucket >= T; the T_pad = bucket - T padding tokens (id 0, type 0)
  form padding sequences of at most the sequence bucket each, after the real ones, so every token
  belongs to a sequence and cu_seqlens still ends at the token count;
- sequences B (+ the padding sequences) -> the smallest batch bucket, filled with empty sequences
  (cu_seqlens' last value repeated);
- max_seqlen -> the smallest sequence bucket >= it.

Attention never crosses sequences and every other op works per token, so the real tokens' outputs
equal the unbucketed call's; the results are sliced back to the real tokens and copied out of the
graph's buffers, which the next replay overwrites (outputs of other shapes, such as pooled ones, are
copied whole).

On CUDA a bucket's graph is captured on its first call, after `warmup` eager calls on the same
static inputs (first-call compilation and autotuning happen there, never during capture); all graphs
share one memory pool. A call is one host-to-device copy of a packed int32 metadata buffer
(input ids, token types, positions, cu_seqlens) and one replay(). Capture and replay run on the
model's device (not whichever is current) with capture_error_mode="thread_local", so other threads'
CUDA calls (a server's) go on during a capture. The graphs are dropped when the
model's weights (data_ptr or _version of any parameter or buffer; data_ptr alone for inference
tensors, which keep no version), device or dtype change.
Elsewhere (CPU) the same bucketing runs eagerly, without graphs.

The model is anything with forward_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids=None,
position_ids=None) returning a tensor (tokens, ...), a tuple of them, or a ModelOutput. Inference
only: the calls run under torch.inference_mode()."""
import bisect
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from fastbert.ops.attention import check_cu_seqlens, seqlen_int

TOKEN_BUCKETS = tuple(sorted({m << k for k in range(4, 17) for m in (2, 3)}))  # 32, 48, 64, 96, ... 196608
SEQ_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
BATCH_BUCKETS = tuple(1 << k for k in range(13))                             # 1 ... 4096


def _bucket(n: int, buckets: Sequence[int], what: str, option: str) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{what} {n} exceeds the largest bucket {buckets[-1]}; pass larger {option} "
                         f"to fastbert.cuda_graphs")
    return buckets[i]


@dataclass(frozen=True)
class Plan:
    """One call's bucket: padded sizes and which optional inputs are given."""
    tokens: int
    batch: int
    max_seqlen: int
    has_token_types: bool
    has_positions: bool

    @property
    def size(self) -> int:
        """int32 elements of the packed metadata buffer."""
        return self.tokens * (1 + self.has_token_types + self.has_positions) + self.batch + 1


def plan_for(tokens: int, batch: int, max_seqlen: int, has_token_types: bool, has_positions: bool,
             token_buckets=TOKEN_BUCKETS, seq_buckets=SEQ_BUCKETS, batch_buckets=BATCH_BUCKETS,
             seq_limit: Optional[int] = None) -> Plan:
    """The bucket for a call with these sizes. seq_limit: the model's longest sequence (its position
    table), which the max_seqlen bucket never exceeds when it holds the call's max_seqlen."""
    seq = _bucket(max(max_seqlen, 1), seq_buckets, "max_seqlen", "seq_buckets")
    if seq_limit is not None and max(max_seqlen, 1) <= seq_limit < seq:
        seq = seq_limit
    padded = _bucket(max(tokens, 1), token_buckets, "tokens", "token_buckets")
    pad_sequences = -(-(padded - tokens) // seq)
    return Plan(padded, _bucket(batch + pad_sequences, batch_buckets, "sequences", "batch_buckets"), seq,
                has_token_types, has_positions)


def _check_fits_int32(name: str, t: torch.Tensor) -> None:
    """The metadata buffer is int32: a host tensor's values must fit, or they would wrap around
    into other, valid ids. (Device tensors are not read: that would sync.)"""
    if t.device.type != "cpu" or t.numel() == 0 or t.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
        return
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    low, high = (int(v) for v in torch.aminmax(t))
    if low < -2**31 or high >= 2**31:
        raise ValueError(f"{name} has values outside int32 ({low} ... {high}); they cannot be ids, token "
                         f"types or positions")


def pack_metadata(plan: Plan, input_ids, cu_seqlens, token_type_ids=None, position_ids=None,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The plan's int32 buffer: [input ids | token types | positions | cu_seqlens], bucket-padded.
    Reads no values (shapes only), so CUDA inputs stay on the device."""
    tokens, batch = input_ids.shape[0], cu_seqlens.shape[0] - 1
    buf = torch.empty(plan.size, dtype=torch.int32, device=input_ids.device) if out is None else out
    parts = [input_ids] + [t for t, on in ((token_type_ids, plan.has_token_types),
                                           (position_ids, plan.has_positions)) if on]
    for i, t in enumerate(parts):
        row = buf[i * plan.tokens:(i + 1) * plan.tokens]
        row[:tokens].copy_(t)
        row[tokens:].zero_()                    # padding tokens: id 0, type 0, position 0
    cu = buf[len(parts) * plan.tokens:]
    cu[:batch + 1].copy_(cu_seqlens)
    # padding sequences of at most plan.max_seqlen tokens, then empty sequences; built where buf is (no
    # host tensor copied to the device on every call)
    ends = torch.arange(1, plan.batch - batch + 1, dtype=torch.int32, device=buf.device) * plan.max_seqlen + tokens
    cu[batch + 1:].copy_(ends.clamp_(max=plan.tokens))
    return buf


def unpack_metadata(plan: Plan, buf: torch.Tensor):
    """(input_ids, cu_seqlens, token_type_ids, position_ids) views into a pack_metadata buffer."""
    rows, i = [], 0
    for on in (True, plan.has_token_types, plan.has_positions):
        rows.append(buf[i * plan.tokens:(i + 1) * plan.tokens] if on else None)
        i += on
    return rows[0], buf[i * plan.tokens:], rows[1], rows[2]


def _map_tensors(out, fn):
    """out with fn applied to each tensor in it (a tensor, tuple/list, dict or ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, (tuple, list)):
        return type(out)(_map_tensors(o, fn) for o in out)
    if isinstance(out, dict):                   # transformers' ModelOutput is an OrderedDict
        return type(out)(**{k: _map_tensors(v, fn) for k, v in out.items()})
    return out


def _leaves(out):
    """The tensors in out (a tensor, tuple/list, dict or ModelOutput)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _leaves(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _leaves(o)


@dataclass
class _Graph:
    plan: Plan
    static: torch.Tensor                         # the device metadata buffer the graph reads
    graph: Any = None                            # torch.cuda.CUDAGraph once captured
    output: Any = None
    host: Optional[torch.Tensor] = None          # pinned staging buffer for CPU inputs
    copied: Any = None                           # CUDA event: the last upload from `host` is done
    calls: int = 0


@dataclass
class _State:
    signature: Tuple = ()
    graphs: Dict[Plan, _Graph] = field(default_factory=dict)


class CudaGraphs:
    """A callable with forward_packed's signature; see the module docstring."""

    def __init__(self, model, *, token_buckets: Sequence[int] = TOKEN_BUCKETS,
                 seq_buckets: Sequence[int] = SEQ_BUCKETS, batch_buckets: Sequence[int] = BATCH_BUCKETS,
                 warmup: int = 2):
        if not callable(getattr(model, "forward_packed", None)):
            raise TypeError(f"{type(model).__name__} has no forward_packed(input_ids, cu_seqlens, max_seqlen, "
                            "token_type_ids=None, position_ids=None)")
        for name, b in (("token_buckets", token_buckets), ("seq_buckets", seq_buckets),
                        ("batch_buckets", batch_buckets)):
            if not b or list(b) != sorted(set(b)) or b[0] < 1:
                raise ValueError(f"{name} must be increasing positive ints, got {b!r}")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (autotuning must not happen during capture), got {warmup}")
        self.model = model
        self.buckets = (tuple(token_buckets), tuple(seq_buckets), tuple(batch_buckets))
        self.warmup = warmup
        self._state = _State()
        self._pool = None

    # -- what invalidates the graphs -------------------------------------------------------------
    def _tensors(self):
        params = list(self.model.parameters()) if hasattr(self.model, "parameters") else []
        buffers = list(self.model.buffers()) if hasattr(self.model, "buffers") else []
        return params + buffers

    def _signature(self) -> Tuple:
        tensors = self._tensors()
        floats = [t for t in tensors if t.is_floating_point()]
        device = tensors[0].device if tensors else None
        # inference tensors (a model built under inference_mode) have no version counter
        return (device, floats[0].dtype if floats else None,
                tuple((t.data_ptr(), -1 if t.is_inference() else t._version) for t in tensors))

    @property
    def num_graphs(self) -> int:
        return sum(g.graph is not None for g in self._state.graphs.values())

    def plan(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None) -> Plan:
        limit = getattr(self.model, "max_sequence_length", None)
        seq_limit = limit() if callable(limit) and position_ids is None else None
        return plan_for(input_ids.shape[0], cu_seqlens.shape[0] - 1, int(max_seqlen), token_type_ids is not None,
                        position_ids is not None, *self.buckets, seq_limit=seq_limit)

    # -- a call ----------------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                 token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None):
        max_seqlen = seqlen_int(max_seqlen)
        if input_ids.dim() != 1 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
            raise ValueError(f"input_ids must be (tokens,) and cu_seqlens (batch + 1,), got "
                             f"{tuple(input_ids.shape)} and {tuple(cu_seqlens.shape)}")
        for name, t in (("input_ids", input_ids), ("token_type_ids", token_type_ids), ("position_ids", position_ids)):
            if t is None:
                continue
            if t.shape != input_ids.shape:
                raise ValueError(f"{name} must have input_ids' shape {tuple(input_ids.shape)}, got {tuple(t.shape)}")
            _check_fits_int32(name, t)
        if cu_seqlens.device.type == "cpu":
            if cu_seqlens.numel() > 1:
                check_cu_seqlens(cu_seqlens, input_ids.shape[0], max_seqlen)
            elif input_ids.shape[0]:
                raise ValueError(f"cu_seqlens {cu_seqlens.tolist()} holds no sequence but input_ids has "
                                 f"{input_ids.shape[0]} tokens")
        plan = self.plan(input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)
        signature = self._signature()
        if signature != self._state.signature:
            self._state = _State(signature)       # weights, device or dtype changed: drop every graph
        device = signature[0] if signature[0] is not None else input_ids.device
        tokens = input_ids.shape[0]
        with torch.inference_mode(), torch.cuda.device(device) if device.type == "cuda" else nullcontext():
            if device.type != "cuda":
                buf = pack_metadata(plan, input_ids, cu_seqlens, token_type_ids, position_ids)
                out = self._forward(plan, buf.to(device))
                return _map_tensors(out, lambda t: t[:tokens] if t.dim() and t.shape[0] == plan.tokens else t)
            entry = self._state.graphs.get(plan)
            if entry is None:
                entry = self._state.graphs[plan] = _Graph(plan, torch.empty(plan.size, dtype=torch.int32,
                                                                            device=device))
            self._upload(entry, input_ids, cu_seqlens, token_type_ids, position_ids)
            if entry.graph is None:
                out = self._warm_or_capture(entry)
            else:
                entry.graph.replay()
                out = entry.output
            # copies out of the graph's memory, which the next replay overwrites
            return _map_tensors(out, lambda t: (t[:tokens] if t.dim() and t.shape[0] == plan.tokens else t).clone())

    def _forward(self, plan: Plan, buf: torch.Tensor):
        input_ids, cu, token_types, positions = unpack_metadata(plan, buf)
        return self.model.forward_packed(input_ids, cu, plan.max_seqlen, token_type_ids=token_types,
                                         position_ids=positions)

    def _upload(self, entry: _Graph, input_ids, cu_seqlens, token_type_ids, position_ids) -> None:
        if input_ids.device.type == "cpu":        # one host-to-device copy from a pinned buffer
            if entry.host is None:
                entry.host = torch.empty(entry.plan.size, dtype=torch.int32, pin_memory=True)
                entry.copied = torch.cuda.Event()
            entry.copied.synchronize()            # the previous call's copy has left the buffer
            pack_metadata(entry.plan, input_ids, cu_seqlens, token_type_ids, position_ids, out=entry.host)
            entry.static.copy_(entry.host, non_blocking=True)
            entry.copied.record()
        else:
            pack_metadata(entry.plan, input_ids, cu_seqlens, token_type_ids, position_ids, out=entry.static)

    def _warm_or_capture(self, entry: _Graph):
        entry.calls += 1
        if entry.calls <= self.warmup:            # eager: compiles and autotunes this bucket's kernels
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                out = self._forward(entry.plan, entry.static)
            current = torch.cuda.current_stream()
            current.wait_stream(stream)
            # made on the side stream, used on this one: the allocator must not reuse them early
            for t in _leaves(out):
                t.record_stream(current)
            return out
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            entry.output = self._forward(entry.plan, entry.static)
        entry.graph = graph
        graph.replay()
        return entry.output


def cuda_graphs(model, **options) -> CudaGraphs:
    """Wrap `model` (anything with forward_packed) for bucketed, graph-replayed packed inference."""
    return CudaGraphs(model, **options)
