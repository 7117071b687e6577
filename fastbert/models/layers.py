"""The fast path shared by every family: one post-LN transformer layer on packed tokens.

    x (tokens, hidden) ─► fused QKV GEMM ─► varlen attention ─► out GEMM ─► add+LayerNorm
                       ─► FFN1 GEMM (+ bias+GELU epilogue) ─► FFN2 GEMM ─► add+LayerNorm

Parameters keep transformers' separate query/key/value Linear modules (names, sharing, loading);
their weights are concatenated for one GEMM (fused_weight): without autograd the parameters become
slices of one concatenation, so that no in-place edit can leave it stale; with autograd it is a
plain torch.cat so gradients reach each Linear.

Modules mean what they hold: the fused path reads `.weight` / `.bias` only of modules that are
exactly nn.Linear / nn.LayerNorm with no hooks. Anything else swapped in (a peft LoRA layer, a
quantized Linear, a hooked module) is called as a module, so what it adds is honoured.

CPU fp32 inference can read packed copies of the weights instead (PackedWeights, for a model that
opted in through EncoderModel.prepack_weights: fastbert.Encoder's does): fastbert's own GEMM or MKL's
packed one for a few dozen tokens, oneDNN's blocked weights for more (fastbert.ops.linear), no weight
reorder per GEMM. Such a model's eval forward with autograd off then takes the lean path (LeanPlan,
run_lean): the same ops on the same tensors, with each layer's module lookups, checks and packed
weights gathered once and re-checked per call by identity and version only (a few microseconds a
layer, against about 150 for the module path's per-op checks and dispatch at batch 1). Up to
STACK_MAX_TOKENS tokens (one short text) the whole stack then runs in one C++ call
(fastbert._C.layers_forward, csrc/py_layers.cpp) on the plans' native layers: no per-op calls and
conversions, and no torch op waking OpenMP's threads between the GEMMs (one 26-token text on 2
threads, whole Encoder.encode: 2.8 ms p50 against 3.7 op by op with MKL's GEMMs).

Every op gets the model's `backend` ("auto" | "triton" | "torch"): fastbert.ops.linear (oneDNN
epilogues for CPU inference, see there), varlen_attention, bias_gelu, add_layer_norm.
`output_attentions=True` uses a padded attention that materialises the probabilities
(fastbert.ops.attention_probs_ref). Dropout sites are transformers' per family (see `init_fast`).
Under autocast the GEMM outputs are low precision while the residual stream is not: add+LayerNorm
then takes both in their promoted dtype, as transformers' `LayerNorm(dense(x) + residual)` does.
"""
import dataclasses
import inspect
import math
import operator
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from fastbert import _C, ops
from fastbert._quantize import QuantizedLinear
from fastbert.models.activations import Activation
from fastbert.ops.attention import attention_probs_ref
from fastbert.ops import quantized_linear as ql
from fastbert.ops.length_runs import packed_attention_calls, varlen_attention_cpu
from fastbert.ops.linear import STACK_MAX_TOKENS, linear, pack_weight, packed_linear, uses_cpu_gemm
from fastbert.ops.varlen import Packing, check_cu_seqlens, pack, repad


def is_plain(module: nn.Module, cls: type, bias_required: bool = True) -> bool:
    """Exactly `cls` (not a subclass or wrapper), with no hooks: its tensors say all it does. A
    Linear without bias counts only with bias_required=False (the BERT-shaped layers fuse biases)."""
    if type(module) is not cls:
        return False
    if cls is nn.Linear and module.bias is None and bias_required:
        return False
    return not _hooked(module)   # an `or` of the four hook dicts: a third of a generator's time, ~80 calls a forward


def adapter_base_layer(module: nn.Module) -> Optional[nn.Module]:
    """The module an adapter wraps (peft's LoRA layers keep it as `base_layer`), or None."""
    inner = getattr(module, "base_layer", None)
    return inner if isinstance(inner, nn.Module) else None


def call_module(module: nn.Module, x: torch.Tensor, width: Optional[int] = None,
                owner: Optional[nn.Module] = None) -> torch.Tensor:
    """module(x) for a module the layer cannot look inside: it must give a tensor of x's rows and
    `width` features (any number when None), else a ValueError naming it (its path in owner)."""
    y = module(x)
    if isinstance(y, torch.Tensor) and y.shape[:-1] == x.shape[:-1] and width in (None, y.shape[-1]):
        return y
    name = next((n for n, m in owner.named_modules() if m is module), None) if owner is not None else None
    label = f"{type(owner).__name__}.{name} ({type(module).__name__})" if name else type(module).__name__
    got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
    want = ", ".join(str(n) for n in (*x.shape[:-1], "features" if width is None else width))
    raise ValueError(f"{label} returned {got}; fastbert's layer needs a tensor of shape ({want})")


def fused_weight(linears, cache: dict) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The weights (and biases, when every Linear has one) of several Linears on the same input,
    concatenated for one GEMM. With autograd a plain torch.cat, so that gradients reach each Linear
    (and under torch.compile, which hoists it). Without, the Linears' parameters become row slices of
    one concatenation, kept in `cache`: then every later in-place write, through `.data` too (which
    no version counter sees), lands in the tensor the GEMM reads. It is rebuilt when a parameter no
    longer is its slice (replaced: `.to(dtype)`, `p.data = t`, load_state_dict(assign=True))."""
    groups = [[m.weight for m in linears]]
    if all(m.bias is not None for m in linears):
        groups.append([m.bias for m in linears])
    if torch.compiler.is_compiling() or (torch.is_grad_enabled()
                                         and any(p.requires_grad for g in groups for p in g)):
        fused = [torch.cat(g) for g in groups]
    else:
        fused = [_shared_concatenation(g, cache, name) for g, name in zip(groups, ("weight", "bias"))]
    return fused[0], fused[1] if len(fused) > 1 else None


def _shared_concatenation(params, cache: dict, name: str) -> torch.Tensor:
    fused = cache.get(name)
    if fused is None or not _slices_of(fused, params):
        with torch.inference_mode(False), torch.no_grad():   # a normal tensor, usable outside inference mode
            fused = torch.cat(params)
            start = 0
            for p in params:
                p.data = fused[start:start + p.shape[0]]
                start += p.shape[0]
        cache[name] = fused
    return fused


def _slices_of(fused: torch.Tensor, params) -> bool:
    """Each parameter is still its row slice of fused (same memory, dtype and device)."""
    row_bytes = fused.stride(0) * fused.element_size()
    start = 0
    for p in params:
        if (p.dtype != fused.dtype or p.device != fused.device or p.shape[1:] != fused.shape[1:]
                or p.data_ptr() != fused.data_ptr() + start * row_bytes or not p.is_contiguous()):
            return False
        start += p.shape[0]
    return start == fused.shape[0]


class FreshOnCopy:
    """A cache of what a model can remake (packed weights, plans): a pickle or a deep copy of the model
    starts with an empty one of its own, never a share of the original's."""

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __deepcopy__(self, memo):
        return type(self)()


class PackedWeights(FreshOnCopy):
    """pack_weight copies of one layer's Linear weights, made on first use, for CPU fp32 inference.

    A copy is remade when a weight it was made from has other memory (replaced: `.to()`, `p.data = t`,
    load_state_dict(assign=True)) or another version (any in-place write through the parameter:
    load_state_dict, an optimizer step, `with torch.no_grad(): p.mul_(2)`). A write through `p.data`
    (`p.data.mul_(2)`) bumps no version counter and is not seen: after one, call the model's
    prepack_weights() again (it drops every copy). Copies are not pickled or deep-copied. It also
    holds the layer's LeanPlan, which goes with it."""

    def __init__(self):
        self._entries = {}
        self.plan: Optional[LeanPlan] = None      # the layer's lean path (FastLayer.lean_plan)
        self.no_plan: Optional[Watch] = None      # while current, the layer's modules still have no plan
        self.int8: Optional[tuple] = None         # the layer's int8 native form and its Watch (int8_native)

    def get(self, key, weight: torch.Tensor, sources) -> Optional[torch.Tensor]:
        """The packed copy of `weight` (built from the parameters `sources`), current; None for a
        parameter made in inference mode (it has no version counter to watch)."""
        if any(p.is_inference() for p in sources):
            return None
        stamp = [(p.data_ptr(), p._version) for p in sources]
        entry = self._entries.get(key)
        if entry is None or entry[0] != stamp:
            # the sources' tensors are kept: no other weight can take their memory while a stamp names it
            entry = self._entries[key] = (stamp, [p.detach() for p in sources], pack_weight(weight))
        return entry[2]

def _packed(store: Optional[PackedWeights], key, h, weight, bias, backend, residual=None, sources=None):
    """store's copy of weight when oneDNN runs this GEMM, else None."""
    if store is None or not uses_cpu_gemm(h, weight, backend, bias, residual):
        return None
    return store.get(key, weight, (weight,) if sources is None else sources)


# ---- the steps every layer is made of: the fused op for plain modules, the module itself otherwise -----
def apply_linear(h: torch.Tensor, module: nn.Module, backend: str, *, residual: Optional[torch.Tensor] = None,
                 activation: Optional[Activation] = None, width: Optional[int] = None,
                 owner: Optional[nn.Module] = None, packed: Optional[PackedWeights] = None) -> torch.Tensor:
    """module(h), then + residual or the activation: fastbert.ops.linear (the add or the activation in
    the GEMM's epilogue where it has one) for a plain nn.Linear; any other module (a peft LoRA wrapper,
    a QuantizedLinear, one with hooks) runs itself and must give `width` features (call_module).
    packed: the layer's PackedWeights, if it has them."""
    epilogue = None if activation is None else activation.epilogue
    if is_plain(module, nn.Linear, bias_required=False):
        w, b = module.weight, module.bias
        y = linear(h, w, b, residual=residual, activation=epilogue, backend=backend,
                   packed=_packed(packed, module, h, w, b, backend, residual))
        return y if activation is None or epilogue is not None else activation.fn(y)
    if residual is None and epilogue == "gelu" and is_plain(module, QuantizedLinear):
        return ql.quantized_linear(h, module._packed, gelu=True)   # the GELU in the int8 rescale pass
    y = call_module(module, h, residual.shape[-1] if residual is not None else width, owner)
    if residual is not None:
        return y + residual.to(y.dtype)
    return y if activation is None else activation.fn(y)


def fused_linear(h: torch.Tensor, linears, cache: dict, backend: str, width: Optional[int] = None,
                 owner: Optional[nn.Module] = None, packed: Optional[PackedWeights] = None) -> torch.Tensor:
    """The outputs of several Linears on the same input, side by side: one GEMM over their concatenated
    weights (fused_weight, `cache` its store) when all are plain and all or none have a bias, else each
    module run on its own (each giving `width` features). packed: the layer's PackedWeights, if any."""
    if (all(is_plain(m, nn.Linear, bias_required=False) for m in linears)
            and len({m.bias is None for m in linears}) == 1):
        weight, bias = fused_weight(linears, cache)
        # the copy follows the Linears' own parameters (their versions are not the concatenation's)
        key = tuple(linears)
        return linear(h, weight, bias, backend=backend,
                      packed=_packed(packed, key, h, weight, bias, backend, sources=[m.weight for m in linears]))
    if all(is_plain(m, QuantizedLinear) for m in linears) and len({m.bias is None for m in linears}) == 1:
        return ql.quantized_linear(h, _joined_int8(linears, cache))
    return torch.cat([apply_linear(h, m, backend, width=width, owner=owner, packed=packed) for m in linears], dim=-1)


def _joined_int8(linears, cache: dict) -> ql.PackedLinear:
    """ql.join of the QuantizedLinears' packed weights, kept in `cache` while each still holds the
    packed weight it was joined from (load_state_dict repacks: then it is joined again)."""
    sources = tuple(m._packed for m in linears)
    held = cache.get("int8")
    if held is None or len(held[0]) != len(sources) or any(a is not b for a, b in zip(held[0], sources)):
        for name in ("weight", "bias"):             # the fp32 concatenation is no longer read
            cache.pop(name, None)
        held = cache["int8"] = (sources, ql.join(sources))
    return held[1]


def add_norm(h: torch.Tensor, residual: Optional[torch.Tensor], norm: nn.Module, backend: str,
             owner: Optional[nn.Module] = None) -> torch.Tensor:
    """norm(h + residual) (residual None: norm(h)): the fused add+LayerNorm op for a plain nn.LayerNorm
    (bias or not), a plain add for nn.Identity, the module itself otherwise. Under autocast h (a GEMM
    output) and the residual can differ in dtype: both take the promoted one."""
    if residual is not None and h.dtype != residual.dtype:
        dtype = torch.promote_types(h.dtype, residual.dtype)
        h, residual = h.to(dtype), residual.to(dtype)
    if isinstance(norm, nn.Identity):
        return h if residual is None else h + residual
    if is_plain(norm, nn.LayerNorm) and norm.weight is not None:
        return ops.add_layer_norm(h, residual, norm.weight, norm.bias, norm.eps, backend=backend)
    return call_module(norm, h if residual is None else h + residual, h.shape[-1], owner)


def post_norm(h: torch.Tensor, dense: nn.Module, residual: torch.Tensor, norm: nn.Module, dropout_p: float,
              backend: str, owner: Optional[nn.Module] = None, packed: Optional[PackedWeights] = None
              ) -> torch.Tensor:
    """norm(dropout(dense(h)) + residual), the post-LN step. Without dropout, on oneDNN, the residual
    add runs in the GEMM's epilogue and the LayerNorm alone follows (one pass fewer); an int8 dense
    layer takes the add and the LayerNorm into the pass that rescales its GEMM's output."""
    if (isinstance(h, ql.QuantizedRows) or h.dtype == torch.float32) and _int8_add_norm(dense, residual, norm,
                                                                                        dropout_p):
        return ql.quantized_linear_add_norm(h, dense._packed, residual, norm.weight, norm.bias, norm.eps)
    if (dropout_p == 0.0 and residual.dtype == h.dtype and is_plain(dense, nn.Linear, bias_required=False)
            and uses_cpu_gemm(h, dense.weight, backend, dense.bias, residual)):
        w, b = dense.weight, dense.bias
        y = linear(h, w, b, residual=residual, backend=backend,
                   packed=_packed(packed, dense, h, w, b, backend, residual))
        return add_norm(y, None, norm, backend, owner)
    a = apply_linear(h, dense, backend, width=residual.shape[-1], owner=owner, packed=packed)
    return add_norm(F.dropout(a, dropout_p, dropout_p > 0), residual, norm, backend, owner)


def _int8_add_norm(dense: nn.Module, residual: torch.Tensor, norm: nn.Module, dropout_p: float) -> bool:
    """post_norm runs dense's int8 GEMM with the residual add and the LayerNorm in its rescale pass."""
    return (dropout_p == 0.0 and residual.dtype == torch.float32 and is_plain(dense, QuantizedLinear)
            and is_plain(norm, nn.LayerNorm) and norm.weight is not None
            and norm.normalized_shape == (residual.shape[-1],))


def residual_linear(h: torch.Tensor, dense: nn.Module, residual: torch.Tensor, dropout_p: float,
                    backend: str) -> torch.Tensor:
    """residual + dropout(dense(h)), the pre-LN step; without dropout the add is the GEMM's epilogue."""
    if dropout_p == 0.0 and residual.dtype == h.dtype:
        return apply_linear(h, dense, backend, residual=residual)
    out = F.dropout(apply_linear(h, dense, backend), dropout_p, dropout_p > 0)
    return residual + out.to(residual.dtype)


@dataclasses.dataclass
class LayerPacking(Packing):
    """The packing every layer gets, with what the model's position scheme hands the layers: absolute
    positions are the embeddings' own (none here); relative attention reads `positions` (tokens,), the
    coordinate distances are measured in, and `context` (per-forward tensors the layers share: a bias
    table, relative embeddings); the rotary families read `positions`, a rotary_encoder.Positions."""
    positions: Any = None
    context: Optional[dict] = None


def layer_packing(packing: Packing, positions: Any, **context) -> LayerPacking:
    return LayerPacking(packing.indices, packing.cu_seqlens, packing.max_seqlen, packing.batch, packing.seqlen,
                        positions=positions, context=context)


def padded_columns(packing: Packing, *ts):
    """For attention that returns probabilities: each (tokens, ...) tensor repadded to (batch, seq, ...),
    the (batch, seq) key mask and the (batch, seq) column positions."""
    mask = packing.mask()
    positions = torch.arange(packing.seqlen, device=mask.device).expand(packing.batch, -1)
    return [repad(t, packing) for t in ts], mask, positions


def padded_attention(q, k, v, packing: Packing, dropout_p: float):
    """Attention with probabilities: (tokens, heads, dim) -> same, plus probs (batch, heads, seq, seq)."""
    qp, kp, vp = (repad(t, packing) for t in (q, k, v))          # (batch, seq, heads, dim), zeros at padding
    probs = attention_probs_ref(qp, kp, packing.mask())
    out = torch.matmul(F.dropout(probs, dropout_p, training=dropout_p > 0), vp.transpose(1, 2))
    return pack(out.transpose(1, 2), packing), probs


class LayerParts:
    """The modules one layer is made of, under whatever names the family uses."""
    __slots__ = ("query", "key", "value", "attn_out", "attn_norm", "ffn_in", "ffn_out", "ffn_norm")

    def __init__(self, query, key, value, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm):
        self.query, self.key, self.value = query, key, value
        self.attn_out, self.attn_norm = attn_out, attn_norm
        self.ffn_in, self.ffn_out, self.ffn_norm = ffn_in, ffn_out, ffn_norm

    def modules(self) -> tuple:
        """The eight modules in the order above (a lean plan's and an int8 native form's)."""
        return tuple(getattr(self, name) for name in self.__slots__)


class EncoderLayer(GradientCheckpointingLayer):
    """Base of every family's layer: forward(x (tokens, hidden), packing, output_attentions, backend)
    -> (x, attention probabilities or None), run by EncoderModel's loop.

    A transformers GradientCheckpointingLayer: when checkpointing is on (its `gradient_checkpointing`
    flag and `_gradient_checkpointing_func`, set by the model's activation_checkpointing_enable or by
    transformers' own on an optimized model) its forward runs inside that function, so code that finds
    checkpointed layers as transformers' tests do finds these."""


class FastLayer(EncoderLayer):
    """The post-LN layer of the BERT-shaped families (and NomicBERT): subclasses set `parts()` and call
    `init_fast(dims)`; `attend` and `ffn_hidden` are what a family may vary."""

    def init_fast(self, dims, attn_output_dropout: bool = True, ffn_output_dropout: bool = True) -> None:
        """The flags say where the family applies hidden dropout, as transformers does: BERT-shaped
        layers after both output projections, DistilBERT not after the attention one, ALBERT not
        after the FFN one."""
        self.num_heads = dims.num_heads
        self.head_dim = dims.head_dim
        self.hidden_size = dims.hidden_size
        self.intermediate_size = dims.intermediate_size
        self.activation = dims.activation
        self.hidden_dropout = dims.hidden_dropout
        self.attn_output_dropout = dims.hidden_dropout if attn_output_dropout else 0.0
        self.ffn_output_dropout = dims.hidden_dropout if ffn_output_dropout else 0.0
        self.attention_dropout = dims.attention_dropout
        self._qkv_cache = {}
        self.packed_weights: Optional[PackedWeights] = None   # set by EncoderModel.prepack_weights

    def lean_plan(self) -> Optional["LeanPlan"]:
        """This layer's LeanPlan (kept in its PackedWeights), current, or None where the lean path
        cannot run it: training, packed weights off (EncoderModel.prepack_weights), hooks on the layer
        or its modules, a module that is not a plain nn.Linear / nn.LayerNorm with a bias, a family
        that changes the layer. Remade when a module or parameter is replaced or a Linear's weight is
        written in place (as PackedWeights sees it); checking that costs a few microseconds."""
        store = self.packed_weights
        if store is None or self.training or _hooked(self) or not _lean_class(type(self)):
            return None
        if store.plan is None or not store.plan.current():
            # a layer that has no plan (int8 Linears, a module of a family's own) keeps a Watch of its
            # modules instead: checking them again (parts() and _build_plan, ~15 us) ran 7 times per int8
            # batch-1 encode (pack_for_threads, lean_plans, the short path). Not where a hook declined
            # the plan: a Watch holds while hook dicts stay empty, and removing the hook must bring the
            # plan back.
            if store.no_plan is not None and store.no_plan.current():
                return None
            modules = self.parts().modules()
            store.plan = _build_plan(self, modules)
            links = _links(self, modules) if store.plan is None else None
            watch = None if links is None else module_watch(links, modules)
            store.no_plan = watch if watch is not None and watch.current() else None
        return store.plan

    def parts(self) -> LayerParts:
        raise NotImplementedError

    def _qkv(self, p: LayerParts, x: torch.Tensor, backend: str) -> torch.Tensor:
        """(tokens, 3, heads, head_dim) q, k, v: one GEMM over the fused weights when all are plain."""
        width = self.num_heads * self.head_dim
        qkv = fused_linear(x, (p.query, p.key, p.value), self._qkv_cache, backend, width, owner=self,
                           packed=self.packed_weights)
        return qkv.view(x.shape[0], 3, self.num_heads, self.head_dim)

    def attend(self, qkv: torch.Tensor, packing: Packing, output_attentions: bool, dropout_p: float, backend: str
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """qkv (tokens, 3, heads, head_dim) -> context (tokens, heads, head_dim) and, with output_attentions,
        the probabilities. This is where the position scheme enters a layer: absolute positions are in
        the embeddings, so plain attention here; relative and rotary layers override it."""
        q, k, v = qkv.unbind(1)
        if output_attentions:
            return padded_attention(q, k, v, packing, dropout_p)
        if q.shape[0] == 0:   # no real token (an empty batch has no row for the kernel)
            return q.new_zeros(q.shape), None
        return ops.varlen_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, dropout_p=dropout_p,
                                    backend=backend), None

    def ffn_hidden(self, x: torch.Tensor, p: LayerParts, backend: str) -> torch.Tensor:
        """(tokens, intermediate) input of the FFN's output projection: act(ffn_in(x)), the activation in
        the GEMM's epilogue (a gated MLP overrides it)."""
        return apply_linear(x, p.ffn_in, backend, activation=self.activation, width=self.intermediate_size,
                            owner=self, packed=self.packed_weights)

    def forward(self, x: torch.Tensor, packing: Packing, output_attentions: bool = False, backend: str = "auto"
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The post-LN layer: attention, then the FFN, each followed by add+LayerNorm."""
        p = self.parts()
        train = self.training
        ctx, probs = self.attend(self._qkv(p, x, backend), packing, output_attentions,
                                 self.attention_dropout if train else 0.0, backend)
        x = post_norm(ctx.reshape(x.shape[0], self.num_heads * self.head_dim), p.attn_out, x, p.attn_norm,
                      self.attn_output_dropout if train else 0.0, backend, owner=self, packed=self.packed_weights)
        ffn_dropout = self.ffn_output_dropout if train else 0.0
        if self._int8_ffn(p, x, ffn_dropout):   # the GELU's output goes to the next GEMM as int8 codes
            h = ql.quantized_linear_gelu_rows(x, p.ffn_in._packed)
        else:
            h = self.ffn_hidden(x, p, backend)
        return post_norm(h, p.ffn_out, x, p.ffn_norm, ffn_dropout, backend, owner=self,
                         packed=self.packed_weights), probs

    def _int8_ffn(self, p: LayerParts, x: torch.Tensor, dropout_p: float) -> bool:
        """Both FFN GEMMs int8 per_token around an erf GELU (this class's ffn_hidden), the add+LayerNorm
        in the second's rescale pass: the first's pass can hand the second its int8 input."""
        return (type(self).ffn_hidden is FastLayer.ffn_hidden and self.activation.epilogue == "gelu"
                and is_plain(p.ffn_in, QuantizedLinear) and p.ffn_in.backend == "per_token"
                and is_plain(p.ffn_out, QuantizedLinear) and p.ffn_out.backend == "per_token"
                and x.dtype == torch.float32 and _int8_add_norm(p.ffn_out, x, p.ffn_norm, dropout_p))


# ---- the lean path: CPU fp32 inference of the default post-LN layer, its per-call work gathered once ----
_LEAN_METHODS = ("forward", "_qkv", "attend", "ffn_hidden")
_lean_classes = {}


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _global_hooks() -> bool:
    """Hooks registered for every module (torch.nn.modules.module.register_module_forward_hook, ...)."""
    g = torch.nn.modules.module
    return bool(g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
                or g._global_backward_pre_hooks)


def _lean_class(cls: type) -> bool:
    """cls runs FastLayer's own layer (not a family's other attention, QKV or FFN)."""
    if cls not in _lean_classes:
        _lean_classes[cls] = all(inspect.unwrap(getattr(cls, name)) is inspect.unwrap(getattr(FastLayer, name))
                                 for name in _LEAN_METHODS)
    return _lean_classes[cls]


def _links(layer: nn.Module, modules) -> Optional[list]:
    """(parent's module dict, name, child) for every step from the layer down to each of `modules`:
    while each still holds, no module on the way has been replaced. None if one is not inside it."""
    where = {id(m): name for name, m in layer.named_modules(remove_duplicate=False)}
    links = {}
    for m in modules:
        if id(m) not in where:
            return None
        parent = layer
        for part in where[id(m)].split("."):
            child = parent._modules[part]
            links[id(parent), part] = (parent._modules, part, child)
            parent = child
    return list(links.values())


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_version_of = operator.attrgetter("_version")


class Watch:
    """What says that a plan's modules and tensors are still the model's: each (mapping, key) still
    holds its object (a child module, a parameter, a flag), each hook dict is empty, each tensor keeps
    its memory and each `versioned` one its version. Flattened once, so that current() runs as a few
    C-level loops: a short text's forward checks its plans right after the last forward streamed the
    weights through the caches, when each Python step costs several times more."""
    __slots__ = ("dicts", "keys", "objects", "hooks", "tensors", "versioned", "stamp")

    def __init__(self, places=(), hooks=(), tensors=(), versioned=()):
        places = list(places)
        self.dicts, self.keys, self.objects = ([place[i] for place in places] for i in range(3))
        self.hooks = list(hooks)
        self.tensors = [t for t in tensors if t is not None]
        self.versioned = list(versioned)
        self.stamp = self._stamp()

    def _stamp(self) -> list:
        return [*map(torch.Tensor.data_ptr, self.tensors), *map(_version_of, self.versioned)]

    def current(self) -> bool:
        return (all(map(operator.is_, map(dict.get, self.dicts, self.keys), self.objects))
                and not any(self.hooks) and self._stamp() == self.stamp)

    @staticmethod
    def joined(watches) -> "Watch":
        """One Watch for all of `watches` (each current now): current while every one of them is."""
        out = Watch()
        for w in watches:
            for name in ("dicts", "keys", "objects", "hooks", "tensors", "versioned"):
                getattr(out, name).extend(getattr(w, name))
        out.stamp = out._stamp()
        return out


def module_watch(links, modules, versioned=()) -> Watch:
    """The Watch of `modules`: the same modules in the same places (links, as _links gives them), no
    hooks on them, the same parameter objects, each parameter's memory, and `versioned`'s versions."""
    params = [(m._parameters, name, t) for m in modules for name, t in m._parameters.items()]
    return Watch([*links, *params], [getattr(m, h) for m in modules for h in _HOOK_DICTS], [t for _, _, t in params],
                 versioned)


class LeanPlan:
    """One FastLayer's forward for CPU fp32 inference, with what every call would look up, check and
    pack made once (FastLayer.lean_plan): its modules' tensors, the fused QKV bias, the packed weights
    (the layer's PackedWeights) and what says they are current. forward() runs the same ops as the
    layer's own forward, in the same order, without their per-op checks and dispatch."""
    __slots__ = ("params", "qkv_bias", "packed", "epilogue", "act_fn", "heads", "head_dim", "norms", "_native",
                 "watch")

    def __init__(self, layer: "FastLayer", links, modules, qkv_bias, packed):
        q, k, v, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm = modules
        self.qkv_bias, self.packed = qkv_bias, packed
        # (weight, bias) of each Linear and LayerNorm: the parameter objects, whose data can change
        self.params = [(m._parameters["weight"], m._parameters["bias"]) for m in (q, k, v, attn_out, ffn_in, ffn_out,
                                                                                 attn_norm, ffn_norm)]
        # the packed copies were made from the Linear weights: their versions too (an in-place write)
        self.watch = module_watch(links, modules, versioned=[w for w, _ in self.params[:6]])
        self.norms = [(n.normalized_shape, n.eps) for n in (attn_norm, ffn_norm)]
        self.epilogue = layer.activation.epilogue
        self.act_fn = None if self.epilogue is not None else layer.activation.fn
        self.heads, self.head_dim = layer.num_heads, layer.head_dim
        self._native = None

    def native(self):
        """This layer as a fastbert._C.Layer for layers_forward (csrc/py_layers.cpp: the whole stack in
        one call on a few tokens), made on first use; None where that path cannot run it (an activation
        other than the erf GELU, a head_dim it does not take, a CPU without AVX-512). It reads the
        packed copies and, in place, the biases and LayerNorm parameters of this plan."""
        if self._native is None:
            self._native = self._make_native() or False
        return self._native or None

    def _make_native(self):
        (shape1, eps1), (shape2, eps2) = self.norms
        hidden = self.heads * self.head_dim
        if (self.epilogue != "gelu" or self.act_fn is not None or self.head_dim % 16 or self.head_dim > 128
                or tuple(shape1) != (hidden,) or tuple(shape2) != (hidden,) or not _C.linear_f32_available()):
            return None
        qkv, out, ffn_in, ffn_out = self.packed
        _, _, _, (_, out_bias), (_, ffn_in_bias), (_, ffn_out_bias), (w1, b1), (w2, b2) = self.params

        def bias(b, n):
            return (torch.zeros(n) if b is None else b.detach()).numpy()
        return _C.Layer(qkv.own().numpy(), bias(self.qkv_bias, 3 * hidden), out.own().numpy(), bias(out_bias, hidden),
                        w1.detach().numpy(), b1.detach().numpy(), eps1, ffn_in.own().numpy(),
                        bias(ffn_in_bias, ffn_in.shape[0]), ffn_out.own().numpy(), bias(ffn_out_bias, hidden),
                        w2.detach().numpy(), b2.detach().numpy(), eps2, self.heads, self.head_dim)

    def current(self) -> bool:
        """Still this layer's: the same modules in the same places, no hooks, the same parameters
        (objects, addresses, weight versions)."""
        return self.watch.current()

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        """x (tokens, hidden) -> the layer's output; attend(q, k, v) -> (tokens, heads, head_dim)."""
        qkv_packed, out_packed, ffn_in_packed, ffn_out_packed = self.packed
        _, _, _, (_, out_bias), (_, ffn_in_bias), (_, ffn_out_bias), (w1, b1), (w2, b2) = self.params
        (shape1, eps1), (shape2, eps2) = self.norms
        tokens = x.shape[0]
        qkv = packed_linear(x, qkv_packed, self.qkv_bias).view(tokens, 3, self.heads, self.head_dim)
        ctx = attend(*qkv.unbind(1)).view(tokens, self.heads * self.head_dim)
        x = F.layer_norm(packed_linear(ctx, out_packed, out_bias, residual=x), shape1, w1, b1, eps1)
        h = packed_linear(x, ffn_in_packed, ffn_in_bias, activation=self.epilogue)
        if self.act_fn is not None:
            h = self.act_fn(h)
        return F.layer_norm(packed_linear(h, ffn_out_packed, ffn_out_bias, residual=x), shape2, w2, b2, eps2)


def int8_native(layer: nn.Module) -> Optional[tuple]:
    """(fastbert._C.Int8Layer, Watch): `layer` with fastbert.quantize's int8 Linears as the short forward
    runs it (csrc/py_layers.cpp: run_int8_layers, the same passes as FastLayer.forward's int8 steps and
    the same exact int32 sums, so the same bits), and what says it is still the layer's; None where that
    cannot run it: not FastLayer's own post-LN layer, training, hooks, a Linear that is not a plain
    per_token QuantizedLinear, LayerNorms without float32 weight and bias, an activation other than the
    erf GELU, widths that are not multiples of 16, a CPU without AVX-512 VNNI. Kept in the layer's
    PackedWeights while its Watch holds, as a lean plan's native form is."""
    if (not isinstance(layer, FastLayer) or layer.training or _hooked(layer) or not _lean_class(type(layer))
            or layer.activation.epilogue != "gelu" or not _C.int8_gemm_available()):
        return None
    store = layer.packed_weights
    if store is not None and store.int8 is not None and store.int8[1].current():
        return store.int8
    held = _make_int8_native(layer)
    if store is not None:
        store.int8 = held
    return held


def _make_int8_native(layer: "FastLayer") -> Optional[tuple]:
    p = layer.parts()
    linears = (p.query, p.key, p.value, p.attn_out, p.ffn_in, p.ffn_out)
    norms = (p.attn_norm, p.ffn_norm)
    hidden = layer.num_heads * layer.head_dim
    if (not all(is_plain(m, QuantizedLinear) and m.backend == "per_token" for m in linears)
            or len({m.bias is None for m in linears[:3]}) != 1
            or not all(is_plain(n, nn.LayerNorm) and n.weight is not None and n.bias is not None
                       and n.weight.dtype == n.bias.dtype == torch.float32 and tuple(n.normalized_shape) == (hidden,)
                       for n in norms)
            or layer.head_dim % 16 or layer.head_dim > 128 or p.ffn_in.out_features % 16):
        return None
    modules = p.modules()
    links = _links(layer, modules)
    if links is None:
        return None

    def weight(packed: ql.PackedLinear):
        return ql.gemm_panels(packed), packed.w_scale, packed.wsum, packed.bias_or_zeros
    norm1, norm2 = ((n.weight.detach().numpy(), n.bias.detach().numpy(), float(n.eps)) for n in norms)
    native = _C.Int8Layer(weight(_joined_int8(linears[:3], layer._qkv_cache)), weight(p.attn_out._packed),
                          weight(p.ffn_in._packed), weight(p.ffn_out._packed), *norm1, *norm2, layer.num_heads,
                          layer.head_dim)
    # the packed weights are rebuilt, not written, when a QuantizedLinear's buffers are loaded
    flags = [(m.__dict__, "_packed", m._packed) for m in linears]
    flags += [(layer.__dict__, "activation", layer.activation), *((n.__dict__, "eps", n.eps) for n in norms)]
    return native, Watch.joined([module_watch(links, modules), Watch(flags)])


def _build_plan(layer: "FastLayer", modules) -> Optional[LeanPlan]:
    q, k, v, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm = modules
    linears = (q, k, v, attn_out, ffn_in, ffn_out)
    if (any(map(_hooked, modules))
            or not all(is_plain(m, nn.Linear) and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"
                       for m in linears)
            or not all(is_plain(n, nn.LayerNorm) and n.weight is not None and n.bias is not None
                       for n in (attn_norm, ffn_norm))):
        return None
    links = _links(layer, modules)
    store = layer.packed_weights
    weight, bias = fused_weight((q, k, v), layer._qkv_cache)
    packed = [store.get((q, k, v), weight, (q.weight, k.weight, v.weight))]
    packed += [store.get(m, m.weight, (m.weight,)) for m in (attn_out, ffn_in, ffn_out)]
    if links is None or any(p is None for p in packed):     # a weight made in inference mode: no version to watch
        return None
    return LeanPlan(layer, links, modules, bias, packed)


def lean_plans(layers, x: torch.Tensor, backend: str) -> Optional[list]:
    """The layers' LeanPlans when this forward can run them (run_lean), else None: CPU fp32 inference
    on at least one token (autograd off, not under torch.compile, backend "auto"), no global module
    hooks, and every layer a FastLayer that can (FastLayer.lean_plan)."""
    if (backend != "auto" or x.device.type != "cpu" or x.dtype != torch.float32 or not x.shape[0]
            or torch.is_grad_enabled() or torch.compiler.is_compiling() or _global_hooks()):
        return None
    plans = []
    for layer in layers:
        plan = layer.lean_plan() if isinstance(layer, FastLayer) else None
        if plan is None:
            return None
        plans.append(plan)
    return plans


def run_native(plans, x: torch.Tensor, bounds) -> Optional[torch.Tensor]:
    """x (tokens, hidden) through every plan's layer as one C++ call (fastbert._C.layers_forward) on
    the sequences of `bounds` ((batch + 1,) int64 numpy cumulative lengths): the output, on a copy of
    x; None where that cannot run: more than STACK_MAX_TOKENS tokens, a plan without a native layer
    (LeanPlan.native), no AVX-512."""
    if not 0 < x.shape[0] <= STACK_MAX_TOKENS or None in (layers := [plan.native() for plan in plans]):
        return None
    out = x.clone(memory_format=torch.contiguous_format)
    done = _C.layers_forward(out.numpy(), bounds, layers, 1.0 / math.sqrt(plans[0].head_dim), torch.get_num_threads())
    return out if done else None


def run_lean(plans, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """The layers' forward by their plans: packed x (tokens, hidden) -> the last layer's output. The
    sequence bounds are checked once for all layers (cu_seqlens on the CPU, as varlen_attention checks
    them per call). Up to STACK_MAX_TOKENS tokens, when every plan has a native layer, the stack is one
    C++ call; else plan by plan, attention by fastbert.ops.length_runs' CPU path, else varlen_attention."""
    check_cu_seqlens(cu_seqlens, x.shape[0], max_seqlen)
    if not plans:
        return x
    if x.shape[0] <= STACK_MAX_TOKENS and (out := run_native(plans, x, cu_seqlens.to(torch.int64).numpy())) is not None:
        return out
    scale = 1.0 / math.sqrt(plans[0].head_dim)
    kernel = packed_attention_calls(cu_seqlens, plans[0].head_dim, scale)   # bounds converted once, not per layer

    def attend(q, k, v):
        out = kernel(q, k, v) if kernel is not None else None
        if out is None:
            out = varlen_attention_cpu(q, k, v, cu_seqlens, 0.0, scale)
        return ops.varlen_attention(q, k, v, cu_seqlens, max_seqlen) if out is None else out

    for plan in plans:
        x = plan.forward(x, attend)
    return x
