"""DistilBERT: BERT's layer under other names (q_lin/k_lin/v_lin/out_lin, sa_layer_norm, ffn.lin1/lin2,
output_layer_norm), no token type embeddings, no pooler. Names are transformers', so

    fast = DistilBertModel.from_hf_config(hf.config); fast.load_state_dict(hf.state_dict(), strict=True)

works both ways. forward() takes token_type_ids and ignores them, as transformers' does.
"""
import dataclasses
from typing import List

import torch
from torch import nn

from fastbert.models.config import ACTIVATIONS, Dims
from fastbert.models.embeddings import Embeddings
from fastbert.models.heads import (MaskedLMModel, MultipleChoiceModel, QuestionAnsweringModel,
                                   SequenceClassificationModel, TokenClassificationModel, activation)
from fastbert.models.layers import FastLayer, LayerParts
from fastbert.models.modeling import EncoderModel
from fastbert.models.outputs import BaseModelOutput


def resolve_dims(config) -> Dims:
    """DistilBertConfig's names (dim, n_layers, hidden_dim, ...); no token types; LayerNorm eps 1e-12."""
    return Dims(config.model_type, config.vocab_size, config.dim, config.dim, config.n_layers,
                config.n_heads, config.hidden_dim, ACTIVATIONS[config.activation], 1e-12,
                config.max_position_embeddings, 0, config.pad_token_id, float(config.dropout),
                float(config.attention_dropout))


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_lin = nn.Linear(d.hidden_size, d.hidden_size)
        self.k_lin = nn.Linear(d.hidden_size, d.hidden_size)
        self.v_lin = nn.Linear(d.hidden_size, d.hidden_size)
        self.out_lin = nn.Linear(d.hidden_size, d.hidden_size)


class FFN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin1 = nn.Linear(d.hidden_size, d.intermediate_size)
        self.lin2 = nn.Linear(d.intermediate_size, d.hidden_size)


class TransformerBlock(FastLayer):
    def __init__(self, d):
        super().__init__()
        self.attention = MultiHeadSelfAttention(d)
        self.sa_layer_norm = nn.LayerNorm(d.hidden_size, eps=1e-12)
        self.ffn = FFN(d)
        self.output_layer_norm = nn.LayerNorm(d.hidden_size, eps=1e-12)
        self.init_fast(d, attn_output_dropout=False)  # transformers: no dropout after out_lin

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.q_lin, a.k_lin, a.v_lin, a.out_lin, self.sa_layer_norm,
                          self.ffn.lin1, self.ffn.lin2, self.output_layer_norm)


class Transformer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(d) for _ in range(d.num_layers))


class DistilBertModel(EncoderModel):
    base_model_prefix = "distilbert"
    model_types = ("distilbert",)
    has_token_types = False
    output_class = BaseModelOutput

    def __init__(self, config, add_pooling_layer: bool = False):
        if add_pooling_layer:
            raise ValueError("DistilBertModel has no pooler (transformers' DistilBERT has none); "
                             "pass add_pooling_layer=False")
        super().__init__(config)
        self.embeddings = Embeddings(self.dims)
        self.transformer = Transformer(self.dims)
        self.post_init()

    def init_fixed_tables(self, modules) -> None:
        """With sinusoidal_pos_embds, transformers initialises the position table as sin (even
        features) and cos (odd) of position / 10000 ** (2 * (feature // 2) / dim)."""
        table = self.embeddings.position_embeddings
        if getattr(self.config, "sinusoidal_pos_embds", False) and table in modules:
            n, dim = table.weight.shape
            features = torch.arange(dim, dtype=torch.float64)
            angle = torch.arange(n, dtype=torch.float64)[:, None] / 10000 ** (2 * (features // 2) / dim)
            table.weight.copy_(torch.where(features % 2 == 0, angle.sin(), angle.cos()))

    def get_position_embeddings(self) -> nn.Embedding:
        """transformers' accessor (DistilBERT's alone): the position table."""
        return self.embeddings.position_embeddings

    def resize_position_embeddings(self, new_num_position_embeddings: int) -> None:
        """transformers' DistilBERT resize: the position table gets that many rows and
        config.max_position_embeddings follows; old rows are kept, new ones initialised (a sinusoidal
        table is computed for the new length)."""
        n, old = int(new_num_position_embeddings), self.embeddings.position_embeddings
        if n < 1:
            raise ValueError(f"new_num_position_embeddings must be at least 1, got {n}")
        if n == old.num_embeddings:
            return
        new = nn.Embedding(n, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype)
        self.embeddings.position_embeddings = new
        self.init_weights([new])                      # a sinusoidal table is filled here, as at construction
        if not getattr(self.config, "sinusoidal_pos_embds", False):
            with torch.no_grad():
                keep = min(n, old.num_embeddings)
                new.weight[:keep] = old.weight[:keep]
        new.weight.requires_grad_(old.weight.requires_grad)
        new._is_hf_initialized = True
        self.config.max_position_embeddings = n
        self.dims = dataclasses.replace(self.dims, max_position_embeddings=n)

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        return self.embeddings(input_ids, None, position_ids, inputs_embeds, backend)

    def short_embeddings(self):
        return self.embeddings

    def encoder_layers(self) -> List[FastLayer]:
        return list(self.transformer.layer)


class _DistilBertHead:
    base_class, base_model_prefix, model_types = DistilBertModel, "distilbert", ("distilbert",)

    def get_position_embeddings(self) -> nn.Embedding:
        return self.distilbert.get_position_embeddings()

    def resize_position_embeddings(self, new_num_position_embeddings: int) -> None:
        self.distilbert.resize_position_embeddings(new_num_position_embeddings)
        self.dims = self.distilbert.dims


class DistilBertForMaskedLM(_DistilBertHead, MaskedLMModel):
    def build_head(self, config):
        d = self.dims
        self.vocab_transform = nn.Linear(d.hidden_size, d.hidden_size)
        self.vocab_layer_norm = nn.LayerNorm(d.hidden_size, eps=1e-12)
        self.vocab_projector = nn.Linear(d.hidden_size, d.vocab_size)

    decoder = "vocab_projector"

    def mlm_logits(self, h):
        h = self.vocab_layer_norm(activation(self.dims.activation)(self.vocab_transform(h)))
        return self.vocab_projector(h)


class _PreClassifier:
    """h[:, 0] -> pre_classifier -> ReLU -> dropout -> classifier."""

    def build_head(self, config):
        d = self.dims
        self.pre_classifier = nn.Linear(d.hidden_size, d.hidden_size)
        self.classifier = nn.Linear(d.hidden_size, self.num_outputs(config))
        self.dropout = nn.Dropout(config.seq_classif_dropout)

    def num_outputs(self, config):
        return config.num_labels

    def classify(self, out):
        h = torch.relu(self.pre_classifier(out.last_hidden_state[:, 0]))
        return self.classifier(self.dropout(h))

    choice_logits = classify


class DistilBertForSequenceClassification(_DistilBertHead, _PreClassifier, SequenceClassificationModel):
    pass


class DistilBertForMultipleChoice(_DistilBertHead, _PreClassifier, MultipleChoiceModel):
    def num_outputs(self, config):
        return 1


class DistilBertForTokenClassification(_DistilBertHead, TokenClassificationModel):
    def token_dropout(self, config):
        return config.dropout


class DistilBertForQuestionAnswering(_DistilBertHead, QuestionAnsweringModel):
    def qa_dropout(self, config):
        return config.qa_dropout
