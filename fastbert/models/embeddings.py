"""Word + position (+ token type) embeddings, computed on the real tokens only.

Parameter names are transformers' (word_embeddings, position_embeddings, token_type_embeddings,
LayerNorm). Position ids come in packed, from EncoderModel (padded_positions / packed_positions):
BERT-style 0..len-1; RoBERTa-style padding_idx + 1 + running count of non-pad ids (pad ids keep
padding_idx), as transformers does.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.models.layers import is_plain
from fastbert.ops.add_layer_norm import embed_layer_norm_cpu
from fastbert.models.registry import family


class Embeddings(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.roberta_positions = family(dims.model_type).roberta_positions  # the registry's convention
        self.padding_idx = dims.pad_token_id
        self.word_embeddings = nn.Embedding(dims.vocab_size, dims.embedding_size, padding_idx=dims.pad_token_id)
        self.position_embeddings = nn.Embedding(dims.max_position_embeddings, dims.embedding_size,
                                                padding_idx=dims.pad_token_id if self.roberta_positions else None)
        if dims.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(dims.type_vocab_size, dims.embedding_size)
        self.LayerNorm = nn.LayerNorm(dims.embedding_size, eps=dims.layer_norm_eps)
        self.dropout = nn.Dropout(dims.hidden_dropout)

    def _plain(self) -> bool:
        """Every submodule is the plain torch one with no hooks (no max_norm renormalising a table
        on lookup), and the LayerNorm has both parameters: the tensors say all that the forward does,
        and embed_layer_norm_cpu may run it without calling them."""
        tables = [self.word_embeddings, self.position_embeddings, getattr(self, "token_type_embeddings", None)]
        return (all(t is None or (is_plain(t, nn.Embedding) and t.max_norm is None) for t in tables)
                and is_plain(self.LayerNorm, nn.LayerNorm) and self.LayerNorm.weight is not None
                and self.LayerNorm.bias is not None)

    def _type_table(self) -> Optional[torch.Tensor]:
        return self.token_type_embeddings.weight if hasattr(self, "token_type_embeddings") else None

    def max_sequence_length(self) -> int:
        n = self.position_embeddings.num_embeddings
        return n - self.padding_idx - 1 if self.roberta_positions else n

    def forward(self, input_ids: Optional[torch.Tensor], token_type_ids: Optional[torch.Tensor],
                position_ids: torch.Tensor, inputs_embeds: Optional[torch.Tensor] = None,
                backend: str = "auto") -> torch.Tensor:
        """Packed (tokens,) ids (or (tokens, embedding_size) inputs_embeds) -> (tokens, embedding_size)."""
        if (inputs_embeds is None and backend == "auto" and not self.training and self._plain()
                and (x := embed_layer_norm_cpu(input_ids, position_ids,
                                               token_type_ids if self._type_table() is not None else None,
                                               self.word_embeddings.weight, self.position_embeddings.weight,
                                               self._type_table(),
                                               self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps))
                is not None):
            return x
        words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        other = self.position_embeddings(position_ids)
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:   # all type 0: add the one row instead of a lookup
                other = other + self.token_type_embeddings.weight[0]
            else:
                other = other + self.token_type_embeddings(token_type_ids)
        if words.dtype != other.dtype:
            words = words.to(other.dtype)
        norm = self.LayerNorm
        if is_plain(norm, nn.LayerNorm):
            x = ops.add_layer_norm(words, other, norm.weight, norm.bias, norm.eps, backend=backend)
        else:
            x = norm(words + other)
        return F.dropout(x, self.dropout.p, self.training)
