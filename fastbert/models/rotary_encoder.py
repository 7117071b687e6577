"""The rotary position scheme that ModernBERT and NomicBERT share: no position embeddings; each layer
rotates q and k of its fused QKV projection by the tokens' positions (RoPE), and ModernBERT's local
layers attend within a window measured in the same positions. Everything else is the common stack:
the layers compose layers.py's steps, and EncoderModel runs them (the positions reach each layer in
its packing, LayerPacking.positions).

Positions: the padded forward uses transformers' convention, the token's index in its padded row
(or the given position_ids), for the rotation and for sliding windows alike; forward_packed uses
the offset inside each packed sequence. Both come out of shapes and cu_seqlens with no host sync.
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert.models.config import ConfigError
from fastbert.models.layers import LayerPacking, layer_packing
from fastbert.models.modeling import EncoderModel, FastPreTrainedModel
from fastbert.ops.attention import sliding_window_attention, varlen_attention
from fastbert.ops.rotary import rotary
from fastbert.ops.varlen import Packing, pack, packed_positions, repad, token_positions


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
    (None: the offsets inside each packed sequence). Window distances are bounded by the packing's
    seqlen (the padded row's width, or max_seqlen on packed input). `given`: the rotary positions
    are the caller's position_ids (else they are below that seqlen); `rope`: a family's cos / sin
    of this forward, if it computes them once for all layers (ModernBERT)."""
    rotary: torch.Tensor
    window: Optional[torch.Tensor]
    given: bool = False
    rope: Optional[Callable] = None


def padded_positions(packing: Packing, position_ids: Optional[torch.Tensor]) -> Positions:
    """transformers' positions for a padded batch: each real token's index in its row, or position_ids."""
    columns = token_positions(packing, packing.total)
    given = None if position_ids is None else position_ids.expand(packing.batch, packing.seqlen)
    rotary = columns if given is None else pack(given, packing).long()
    return Positions(rotary, None if packing.indices is None else columns, given=given is not None)


def dense_attention(q, k, v, packing: Packing, window: Optional[int], dropout_p: float):
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


def rotary_attention(qkv: torch.Tensor, packing: LayerPacking, rope: Callable, key, window: Optional[int],
                     dropout_p: float, output_attentions: bool, backend: str
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The rotary layers' attention: qkv (tokens, 3, heads, head_dim) -> context (tokens, heads, head_dim)
    and, with output_attentions, the probabilities. q and k are rotated in place by the packing's
    positions, with the cos / sin of `rope(positions, key, dtype)` (fastbert.ops.rotary.Rotary with
    key = theta, or a family's tables of the forward); `window` (None: global) is the half-width of
    local attention."""
    positions: Positions = packing.positions
    cos, sin = rope(positions.rotary, key, qkv.dtype)            # (tokens, head_dim // 2)
    q, k = rotary(qkv, cos, sin, inplace=True, backend=backend)
    v = qkv[:, 2]
    if output_attentions:
        return dense_attention(q, k, v, packing, window, dropout_p)
    if q.shape[0] == 0:   # no real token (an empty batch has no row for the kernel)
        return q.new_zeros(q.shape), None
    if window is None or packing.seqlen - 1 <= window:           # no row reaches past the window
        return varlen_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, dropout_p=dropout_p,
                                backend=backend), None
    return sliding_window_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, window, positions.window,
                                    dropout_p=dropout_p, backend=backend), None


class RotaryFamily(FastPreTrainedModel):
    """Base of the rotary families' models (the registry hooks `check_config` / `resolve_dims` of the
    family file read the config)."""

    def encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
               output_hidden_states):
        """The bare encoder's output for a task head (return_dict=True)."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                               output_hidden_states=output_hidden_states, return_dict=True, **extra)



class RotaryEncoderModel(RotaryFamily, EncoderModel):
    """EncoderModel with the rotary position scheme: the positions go to the layers (in their packing),
    not to the embeddings; `finish(x)` (a final norm, identity by default) follows the last layer.

    Families supply `embed(input_ids, token_type_ids, position_ids, inputs_embeds, backend)` on packed
    (tokens,) tensors -> (tokens, hidden) (it ignores position_ids), an nn.ModuleList `self.layers`
    (transformers' name in both families) of layers that read `packing.positions`, and
    `pool(sequence_output)`."""

    def encoder_layers(self):
        return list(self.layers)

    def max_sequence_length(self) -> int:
        return self.dims.max_position_embeddings   # rotary tables are built up to this length

    def padded_positions(self, packing: Packing, input_ids, position_ids) -> Positions:
        return padded_positions(packing, position_ids)

    def packed_positions(self, cu_seqlens: torch.Tensor, tokens: int, position_ids) -> Positions:
        """Positions of packed sequences: 0..len-1 each (or position_ids); windows in the same offsets."""
        if position_ids is None:
            return Positions(packed_positions(cu_seqlens, tokens), None)
        return Positions(position_ids.long(), None, given=True)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def run_encoder(self, x, packing: Packing, positions: Positions, output_attentions: bool,
                    hidden_states: Optional[list]):
        x, attentions = self._run_layers(x, layer_packing(packing, positions), output_attentions, hidden_states)
        x = self.finish(x)
        if hidden_states is not None:
            hidden_states[-1] = repad(x, packing)   # the last is after `finish`, as transformers'
        return x, attentions
