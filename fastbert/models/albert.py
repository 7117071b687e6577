"""ALBERT: factorised embeddings (embedding_size -> hidden via encoder.embedding_hidden_mapping_in)
and layer groups whose parameters are shared across depth: layer i runs group
int(i / (num_hidden_layers / num_hidden_groups)), each group holding inner_group_num layers.
Names are transformers' (`encoder.albert_layer_groups.{g}.albert_layers.{j}.attention.query.weight`),
so `AlbertModel.from_hf_config(hf.config).load_state_dict(hf.state_dict(), strict=True)` works.
hidden_states has one entry per layer run (num_hidden_layers * inner_group_num) plus the input.
"""
from typing import List

import torch
from torch import nn

from fastbert.models.config import ConfigError
from fastbert.models.embeddings import Embeddings
from fastbert.models.heads import (MaskedLMModel, MultipleChoiceModel, PooledClassifier, QuestionAnsweringModel,
                                   SequenceClassificationModel, TokenClassificationModel, activation)
from fastbert.models.layers import FastLayer, LayerParts
from fastbert.models.modeling import EncoderModel


def check_config(config, source: str) -> None:
    groups, layers = config.num_hidden_groups, config.num_hidden_layers
    if groups < 1 or groups > layers:
        raise ConfigError(f"{source}: num_hidden_groups={groups} must be in [1, num_hidden_layers={layers}]")


class AlbertAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        h = d.hidden_size
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.dense = nn.Linear(h, h)
        self.LayerNorm = nn.LayerNorm(h, eps=d.layer_norm_eps)


class AlbertLayer(FastLayer):
    def __init__(self, d):
        super().__init__()
        self.full_layer_layer_norm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)
        self.attention = AlbertAttention(d)
        self.ffn = nn.Linear(d.hidden_size, d.intermediate_size)
        self.ffn_output = nn.Linear(d.intermediate_size, d.hidden_size)
        self.init_fast(d, ffn_output_dropout=False)  # transformers: no dropout after ffn_output

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.query, a.key, a.value, a.dense, a.LayerNorm, self.ffn, self.ffn_output,
                          self.full_layer_layer_norm)


class AlbertLayerGroup(nn.Module):
    def __init__(self, d, inner: int):
        super().__init__()
        self.albert_layers = nn.ModuleList(AlbertLayer(d) for _ in range(inner))


class AlbertTransformer(nn.Module):
    def __init__(self, config, d):
        super().__init__()
        self.embedding_hidden_mapping_in = nn.Linear(d.embedding_size, d.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(d, config.inner_group_num)
                                                 for _ in range(config.num_hidden_groups))


class AlbertModel(EncoderModel):
    base_model_prefix = "albert"
    model_types = ("albert",)

    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = Embeddings(self.dims)
        self.encoder = AlbertTransformer(config, self.dims)
        self.pooler = nn.Linear(self.dims.hidden_size, self.dims.hidden_size) if add_pooling_layer else None
        self.post_init()

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, backend)
        return self.encoder.embedding_hidden_mapping_in(x)

    def encoder_layers(self) -> List[FastLayer]:
        n, groups = self.config.num_hidden_layers, self.config.num_hidden_groups
        out = []
        for i in range(n):
            out.extend(self.encoder.albert_layer_groups[int(i / (n / groups))].albert_layers)
        return out

    def pool(self, sequence_output):
        return None if self.pooler is None else torch.tanh(self.pooler(sequence_output[:, 0]))


class AlbertMLMHead(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(d.embedding_size, eps=d.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(d.vocab_size))
        self.dense = nn.Linear(d.hidden_size, d.embedding_size)
        self.decoder = nn.Linear(d.embedding_size, d.vocab_size)
        self.act = activation(d.activation)

    def forward(self, h):
        return self.decoder(self.LayerNorm(self.act(self.dense(h))))


class _AlbertHead:
    base_class, base_model_prefix, model_types = AlbertModel, "albert", ("albert",)


class AlbertForMaskedLM(_AlbertHead, MaskedLMModel):
    lm_head_name, decoder, decoder_bias = "predictions", "predictions.decoder", "predictions.bias"

    def build_head(self, config):
        self.predictions = AlbertMLMHead(self.dims)


class _Pooled(PooledClassifier):
    def pooled_dropout(self, config):
        return config.classifier_dropout_prob


class AlbertForSequenceClassification(_AlbertHead, _Pooled, SequenceClassificationModel):
    pass


class AlbertForMultipleChoice(_AlbertHead, _Pooled, MultipleChoiceModel):
    def num_outputs(self, config):
        return 1


class AlbertForTokenClassification(_AlbertHead, TokenClassificationModel):
    def token_dropout(self, config):
        p = getattr(config, "classifier_dropout_prob", None)
        return self.dims.hidden_dropout if p is None else p


class AlbertForQuestionAnswering(_AlbertHead, QuestionAnsweringModel):
    pass
