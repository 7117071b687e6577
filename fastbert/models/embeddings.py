"""Word + position (+ token type) embeddings, computed on the real tokens only.

Parameter names are transformers' (word_embeddings, position_embeddings, token_type_embeddings,
LayerNorm). Positions follow the family: BERT-style 0..seq-1 by column; RoBERTa-style
padding_idx + 1 + running count of non-pad ids (pad ids keep padding_idx), as transformers does.
"""
import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.padding import Packing, pack


class Embeddings(nn.Module):
    def __init__(self, dims, roberta_positions: bool = False):
        super().__init__()
        self.roberta_positions = roberta_positions
        self.padding_idx = dims.pad_token_id
        self.word_embeddings = nn.Embedding(dims.vocab_size, dims.embedding_size, padding_idx=dims.pad_token_id)
        self.position_embeddings = nn.Embedding(dims.max_position_embeddings, dims.embedding_size,
                                                padding_idx=dims.pad_token_id if roberta_positions else None)
        if dims.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(dims.type_vocab_size, dims.embedding_size)
        self.LayerNorm = nn.LayerNorm(dims.embedding_size, eps=dims.layer_norm_eps)
        self.dropout = nn.Dropout(dims.hidden_dropout)

    def max_sequence_length(self) -> int:
        n = self.position_embeddings.num_embeddings
        return n - self.padding_idx - 1 if self.roberta_positions else n

    def _positions(self, packing: Packing, input_ids, position_ids, device) -> torch.Tensor:
        b, s = packing.batch, packing.seqlen
        if position_ids is not None:
            return pack(position_ids.expand(b, s), packing)
        if not self.roberta_positions:
            if packing.indices is None:
                return torch.arange(s, device=device).repeat(b)
            return packing.indices % s
        if input_ids is None:  # no ids to find padding in: sequential, as transformers
            pos = torch.arange(self.padding_idx + 1, s + self.padding_idx + 1, device=device).expand(b, s)
            return pack(pos, packing)
        real = input_ids.ne(self.padding_idx).int()
        pos = torch.cumsum(real, dim=1).type_as(real) * real + self.padding_idx
        return pack(pos, packing)

    def forward(self, packing: Packing, input_ids=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None) -> torch.Tensor:
        """-> (tokens, embedding_size) for the real tokens of the batch."""
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if inputs_embeds is not None:
            words = pack(inputs_embeds, packing)
        else:
            words = self.word_embeddings(pack(input_ids, packing))
        other = self.position_embeddings(self._positions(packing, input_ids, position_ids, device))
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:   # all type 0: add the one row instead of a lookup
                other = other + self.token_type_embeddings.weight[0]
            else:
                other = other + self.token_type_embeddings(pack(token_type_ids, packing))
        if words.dtype != other.dtype:
            words = words.to(other.dtype)
        x = ops.add_layer_norm(words, other, self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps)
        return F.dropout(x, self.dropout.p, self.training)
