"""What the rotary families (ModernBERT, NomicBERT) share: no position embeddings, RoPE on q/k of the
fused QKV projection, gated MLPs, and an encoder loop that hands each layer its tokens' positions.

Positions: the padded forward uses transformers' convention, the token's index in its padded row
(or the given position_ids), for the rotation and for sliding windows alike; forward_packed uses
the offset inside each packed sequence. Both come out of shapes and cu_seqlens with no host sync.
"""
import contextlib
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint

from fastbert.models.config import ConfigError
from fastbert.models.layers import call_module, fused_weight, is_plain
from fastbert.models.inputs import check_packed_shapes
from fastbert.models.modeling import EncoderModel, FastPreTrainedModel
from fastbert.models.outputs import BaseModelOutput
from fastbert.ops import add_layer_norm
from fastbert.ops.linear import linear
from fastbert.ops.varlen import Packing, pack, packed_positions, repad

# transformers' ACT2FN names -> the function (gelu is the exact erf GELU, as transformers)
ACTIVATIONS = {
    "gelu": F.gelu, "gelu_python": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "swish": F.silu, "relu": F.relu,
}


def activation_fn(name: str, source: str, key: str):
    if name not in ACTIVATIONS:
        raise ConfigError(f"{source}: {key}={name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def check_probability(config, names, source: str) -> None:
    for name in names:
        p = getattr(config, name, None)
        if p is not None and not (isinstance(p, (int, float)) and 0 <= p <= 1):
            raise ConfigError(f"{source}: {name}={p!r} is not a probability in [0, 1]")


def check_rope_type(params: dict, source: str, what: str) -> float:
    """The theta of a 'default' rope_parameters entry (other RoPE scalings are not implemented)."""
    rope_type = (params or {}).get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(f"{source}: {what} rope_type={rope_type!r} is not supported (fastbert implements "
                          "the default RoPE only)")
    if "rope_theta" not in params:
        raise ConfigError(f"{source}: {what} has no rope_theta")
    return float(params["rope_theta"])


@dataclass
class Positions:
    """Per packed token: `rotary` positions (tokens,) int64, and `window` indices for local attention
    (None: the offsets inside each packed sequence); `span` bounds window distances (row width)."""
    rotary: torch.Tensor
    window: Optional[torch.Tensor]
    span: int


def padded_positions(packing: Packing, position_ids: Optional[torch.Tensor]) -> Positions:
    """transformers' positions for a padded batch: each real token's index in its row, or position_ids."""
    b, s, device = packing.batch, packing.seqlen, packing.cu_seqlens.device
    if packing.indices is None:
        window, rotary = None, torch.arange(s, device=device).repeat(b)
    else:
        window = rotary = packing.indices % s
    if position_ids is not None:
        rotary = pack(position_ids.expand(b, s), packing).long()
    return Positions(rotary, window, s)


def sequence_positions(cu_seqlens: torch.Tensor, max_seqlen: int, tokens: int,
                       position_ids: Optional[torch.Tensor]) -> Positions:
    """Positions of packed sequences: 0..len-1 each (or position_ids); windows in the same offsets."""
    rotary = packed_positions(cu_seqlens, tokens) if position_ids is None else position_ids.long()
    return Positions(rotary, None, max_seqlen)


def _plain_linear(module: nn.Module) -> bool:
    return is_plain(module, nn.Linear, bias_required=False)


def apply_linear(h: torch.Tensor, module: nn.Module, backend: str, residual=None) -> torch.Tensor:
    """module(h) (+ residual): fastbert's GEMM (residual add in its epilogue) for a plain nn.Linear; any
    other module (a peft LoRA wrapper, a QuantizedLinear, one with hooks) runs itself, so it is never
    bypassed by reading its .weight."""
    if _plain_linear(module):
        return linear(h, module.weight, module.bias, residual=residual, backend=backend)
    y = call_module(module, h, None if residual is None else residual.shape[-1])
    return y if residual is None else y + residual.to(y.dtype)


def fused_linear(h: torch.Tensor, linears, cache: dict, backend: str) -> torch.Tensor:
    """The outputs of several Linears on the same input, side by side: one GEMM over their
    concatenated weights when all are plain, else each module run on its own."""
    if all(_plain_linear(m) for m in linears):
        weight, bias = fused_weight(linears, cache)
        return linear(h, weight, bias, backend=backend)
    return torch.cat([apply_linear(h, m, backend) for m in linears], dim=-1)


def layer_norm(x: torch.Tensor, norm: nn.Module, backend: str = "auto", residual=None) -> torch.Tensor:
    """norm(x + residual) for an nn.LayerNorm (bias or not) through fastbert's fused op; Identity passes."""
    if isinstance(norm, nn.Identity):
        return x if residual is None else x + residual
    if not is_plain(norm, nn.LayerNorm):   # a wrapped or replaced norm runs itself
        return norm(x if residual is None else x + residual)
    return add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps, backend=backend)


def post_norm(h: torch.Tensor, dense: nn.Linear, residual: torch.Tensor, norm: nn.LayerNorm, dropout_p: float,
              backend: str) -> torch.Tensor:
    """norm(dropout(dense(h)) + residual), the post-LN step; without dropout the residual add is the
    GEMM's epilogue and the LayerNorm alone follows."""
    if dropout_p == 0.0 and residual.dtype == h.dtype:
        return layer_norm(apply_linear(h, dense, backend, residual=residual), norm, backend)
    a = F.dropout(apply_linear(h, dense, backend), dropout_p, dropout_p > 0)
    return layer_norm(a.to(residual.dtype), norm, backend, residual=residual)


def residual_linear(h: torch.Tensor, layer: nn.Linear, residual: torch.Tensor, dropout_p: float,
                    backend: str) -> torch.Tensor:
    """residual + dropout(h W^T + b); without dropout the add is the GEMM's epilogue (oneDNN on CPU)."""
    if dropout_p == 0.0 and residual.dtype == h.dtype:
        return apply_linear(h, layer, backend, residual=residual)
    out = F.dropout(apply_linear(h, layer, backend), dropout_p, dropout_p > 0)
    return residual + out.to(residual.dtype)


def dense_attention(q, k, v, packing: Packing, positions: Positions, window: Optional[int], dropout_p: float):
    """Unfused padded attention that returns probabilities (output_attentions=True): (tokens, heads,
    dim) -> same, plus probs (batch, heads, seq, seq). Keys at padding get the dtype's min score."""
    b, s = packing.batch, packing.seqlen
    keep = torch.zeros(b * s, dtype=torch.bool, device=q.device)
    if packing.indices is None:
        keep[:] = True
    else:
        keep[packing.indices] = True
    allowed = keep.view(b, 1, 1, s).expand(b, 1, s, s)
    if window is not None:
        idx = torch.arange(s, device=q.device)
        allowed = allowed & ((idx[:, None] - idx[None, :]).abs() <= window)
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, torch.finfo(q.dtype).min)

    def pad(t):  # (tokens, heads, dim) -> (batch, heads, seq, dim)
        return repad(t, packing).transpose(1, 2)

    scores = torch.matmul(pad(q), pad(k).transpose(-1, -2)) / math.sqrt(q.shape[-1]) + bias
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = torch.matmul(F.dropout(probs, dropout_p, dropout_p > 0), pad(v)).transpose(1, 2)
    return pack(out, packing), probs


class RotaryFamily(FastPreTrainedModel):
    """Base of the rotary families' models: transformers-like initialisation for norms without bias
    (the registry hooks `check_config` / `resolve_dims` of the family file read the config)."""

    def encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
               output_hidden_states):
        """The bare encoder's output for a task head (return_dict=True)."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                               output_hidden_states=output_hidden_states, return_dict=True, **extra)

    def init_std(self, module: nn.Module, name: str) -> Tuple[float, Optional[float]]:
        """(std, truncation cutoff in stds or None) for a Linear/Embedding named `name`."""
        return getattr(self.config, "initializer_range", 0.02), None

    def init_weights(self, modules=None) -> None:
        names = {m: n for n, m in self.named_modules()}
        with torch.no_grad():
            for m in (self.modules() if modules is None else modules):
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    std, cutoff = self.init_std(m, names.get(m, ""))
                    if cutoff is None:
                        m.weight.normal_(0.0, std)
                    else:
                        nn.init.trunc_normal_(m.weight, 0.0, std, -cutoff * std, cutoff * std)
                    if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                        m.weight[m.padding_idx].zero_()
                    if isinstance(m, nn.Linear) and m.bias is not None:
                        m.bias.zero_()
                elif isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    if m.bias is not None:
                        m.bias.zero_()
                for pname, p in m.named_parameters(recurse=False):
                    if pname == "bias" and not isinstance(m, (nn.Linear, nn.LayerNorm)):
                        p.zero_()  # MLM output bias
        self.tie_weights()


class RotaryEncoderModel(RotaryFamily, EncoderModel):
    """embeddings -> unpad -> layers(x, packing, positions) -> repad, plus `forward_packed`.

    Families supply `embed(input_ids, token_type_ids, position_ids, inputs_embeds, backend)` on packed
    (tokens,) tensors -> (tokens, hidden), an nn.ModuleList
    `self.layers` (transformers' name in both families), `finish(x)` (a final norm, identity by
    default) and `pool(sequence_output)`."""

    @property
    def layers(self) -> nn.ModuleList:
        # transformers' attribute name; a property so it wins over EncoderModel.layers() (nn.Module
        # keeps the ModuleList in _modules, where plain attribute lookup would not look first)
        return self._modules["layers"]

    def max_sequence_length(self) -> int:
        return self.dims.max_position_embeddings   # rotary tables are built up to this length

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def run_layers(self, x, packing: Packing, positions: Positions, output_attentions: bool,
                   output_hidden_states: bool):
        """-> (final hidden (tokens, hidden), packed hidden states or None, attentions or None)."""
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        ckpt_kwargs, every, offload = self._checkpoint_options
        backend = self._backend
        layers = list(self.layers)
        for i, layer in enumerate(layers):
            if checkpointing and i % every == 0:
                with save_on_cpu(pin_memory=x.is_cuda) if offload else contextlib.nullcontext():
                    x, probs = checkpoint(layer, x, packing, positions, bool(output_attentions), backend,
                                          **ckpt_kwargs)
            else:
                x, probs = layer(x, packing, positions, bool(output_attentions), backend)
            if output_attentions:
                attentions.append(probs)
            if output_hidden_states and i < len(layers) - 1:
                hidden_states.append(x)
        x = self.finish(x)
        if output_hidden_states:
            hidden_states.append(x)   # the last entry is last_hidden_state, as transformers
        return x, hidden_states, attentions

    # EncoderModel.forward with the rotary families' positions: a Positions (rotary and window), which
    # embed ignores and every layer takes
    def padded_positions(self, packing: Packing, input_ids, position_ids) -> Positions:
        return padded_positions(packing, position_ids)

    def run_encoder(self, x, packing: Packing, positions: Positions, output_attentions: bool,
                    hidden_states: Optional[list]):
        x, hidden, attentions = self.run_layers(x, packing, positions, output_attentions, hidden_states is not None)
        if hidden_states is not None:
            hidden_states[:] = [repad(h, packing) for h in hidden]   # the last is after `finish`
        return x, attentions

    def forward_packed(self, input_ids, cu_seqlens, max_seqlen: int, token_type_ids=None,
                       position_ids=None) -> BaseModelOutput:
        """EncoderModel.forward_packed's contract (no device-to-host sync; values checked by
        `check_packed` on the host copy): last_hidden_state (tokens, hidden). Sliding windows are
        measured in the offsets inside each packed sequence; rotary positions default to them."""
        token_type_ids = self.token_types(token_type_ids)
        check_packed_shapes(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)
        tokens = input_ids.shape[0]
        packing = Packing(None, cu_seqlens, max_seqlen, cu_seqlens.shape[0] - 1, max_seqlen)
        positions = sequence_positions(cu_seqlens, max_seqlen, tokens, position_ids)
        x = self.embed(input_ids, token_type_ids, positions.rotary, None, self._backend)
        x, _, _ = self.run_layers(x, packing, positions, False, False)
        return BaseModelOutput(last_hidden_state=x)
