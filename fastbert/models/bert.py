"""BERT-shaped encoders: BERT (and MiniLM / bge / e5 checkpoints), RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA.

Module and parameter names are transformers' (`encoder.layer.{i}.attention.self.query.weight`, ...),
so `model.load_state_dict(hf_model.state_dict(), strict=True)` works both ways. To build one next
to an existing transformers model:

    fast = BertModel.from_hf_config(hf.config)                 # or RobertaForMaskedLM, ...
    fast.load_state_dict(hf.state_dict(), strict=True)

Differences from transformers, by design: the encoder runs on packed real tokens, so padding rows
of last_hidden_state / hidden_states are zeros (transformers fills them with values computed on
pad tokens), and per-token head outputs at padding positions are the head applied to zeros. So the
losses leave padded positions out (fastbert.models.heads): MLM and token labels there are ignored,
and question answering's softmax spans the real positions only (a padded position's logit would be the
head's bias, which training cannot push down). They equal transformers' when the labels at padding are
-100 (MLM, token classification) or there is no padding (question answering); sequence and
multiple-choice classification read position 0, which with left padding is a pad token, zeros here.
output_attentions=True (or attn_implementation="eager") takes an unfused attention path
(probabilities materialised; rows of padded queries are not meaningful).
"""
from typing import List

import torch
from torch import nn

from fastbert.models.activations import GELU, RELU
from fastbert.models.embeddings import Embeddings
from fastbert.models.heads import (BertMLMHead, ClassificationHead, MaskedLMModel, MultipleChoiceModel, Pooler,
                                   PooledClassifier, QuestionAnsweringModel, RobertaLMHead,
                                   SequenceClassificationModel, TokenClassificationModel)
from fastbert.models.layers import FastLayer, LayerParts
from fastbert.models.modeling import EncoderModel
from fastbert.models.outputs import BaseModelOutput


# ---- the layer, under transformers' names ----------------------------------------------------------
class BertSelfAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.query = nn.Linear(d.hidden_size, d.hidden_size)
        self.key = nn.Linear(d.hidden_size, d.hidden_size)
        self.value = nn.Linear(d.hidden_size, d.hidden_size)


class DenseNorm(nn.Module):
    """BertSelfOutput / BertOutput: dense then LayerNorm(x + residual)."""

    def __init__(self, d_in, d):
        super().__init__()
        self.dense = nn.Linear(d_in, d.hidden_size)
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)


class BertAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.self = BertSelfAttention(d)
        self.output = DenseNorm(d.hidden_size, d)


class BertIntermediate(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, d.intermediate_size)


class BertLayer(FastLayer):
    def __init__(self, d):
        super().__init__()
        self.attention = BertAttention(d)
        self.intermediate = BertIntermediate(d)
        self.output = DenseNorm(d.intermediate_size, d)
        self.init_fast(d)

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.self.query, a.self.key, a.self.value, a.output.dense, a.output.LayerNorm,
                          self.intermediate.dense, self.output.dense, self.output.LayerNorm)


class BertEncoder(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(d) for _ in range(d.num_layers))


# ---- bare encoders -----------------------------------------------------------------------------------
class BertModel(EncoderModel):
    base_model_prefix = "bert"
    model_types = ("bert",)

    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        d = self.dims
        self.embeddings = Embeddings(d)
        if d.embedding_size != d.hidden_size:  # ELECTRA's factorised embeddings
            self.embeddings_project = nn.Linear(d.embedding_size, d.hidden_size)
        self.encoder = BertEncoder(d)
        self.pooler = Pooler(d.hidden_size) if add_pooling_layer else None
        self.post_init()

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, backend)
        return self.embeddings_project(x) if hasattr(self, "embeddings_project") else x

    def short_embeddings(self):
        return None if hasattr(self, "embeddings_project") else self.embeddings

    def encoder_layers(self) -> List[FastLayer]:
        return list(self.encoder.layer)

    def pool(self, sequence_output):
        return None if self.pooler is None else self.pooler(sequence_output)


class RobertaModel(BertModel):
    base_model_prefix = "roberta"
    model_types = ("roberta",)


class XLMRobertaModel(RobertaModel):
    model_types = ("xlm-roberta",)


class CamembertModel(RobertaModel):
    model_types = ("camembert",)


class ElectraModel(BertModel):
    base_model_prefix = "electra"
    model_types = ("electra",)

    output_class = BaseModelOutput  # no pooler_output

    def __init__(self, config, add_pooling_layer: bool = False):
        if add_pooling_layer:
            raise ValueError("ElectraModel has no pooler (transformers' ELECTRA has none); "
                             "pass add_pooling_layer=False")
        super().__init__(config, add_pooling_layer=False)


# ---- BERT heads ------------------------------------------------------------------------------------
class BertForMaskedLM(MaskedLMModel):
    base_class, base_model_prefix, model_types = BertModel, "bert", ("bert",)
    lm_head_name, decoder, decoder_bias = "cls", "cls.predictions.decoder", "cls.predictions.bias"

    def build_head(self, config):
        self.cls = BertMLMHead(self.dims)


class BertForSequenceClassification(PooledClassifier, SequenceClassificationModel):
    base_class, base_model_prefix, model_types = BertModel, "bert", ("bert",)


class BertForMultipleChoice(PooledClassifier, MultipleChoiceModel):
    base_class, base_model_prefix, model_types = BertModel, "bert", ("bert",)

    def num_outputs(self, config):
        return 1


class BertForTokenClassification(TokenClassificationModel):
    base_class, base_model_prefix, model_types = BertModel, "bert", ("bert",)


class BertForQuestionAnswering(QuestionAnsweringModel):
    base_class, base_model_prefix, model_types = BertModel, "bert", ("bert",)


# ---- RoBERTa heads (XLM-R and CamemBERT reuse them under their own names) ----------------------------
class RobertaForMaskedLM(MaskedLMModel):
    base_class, base_model_prefix, model_types = RobertaModel, "roberta", ("roberta",)
    lm_head_name, decoder, decoder_bias = "lm_head", "lm_head.decoder", "lm_head.bias"

    def build_head(self, config):
        self.lm_head = RobertaLMHead(self.dims)


class RobertaForSequenceClassification(SequenceClassificationModel):
    base_class, base_model_prefix, model_types = RobertaModel, "roberta", ("roberta",)

    def build_head(self, config):
        self.classifier = ClassificationHead(config, self.dims, torch.tanh)

    def classify(self, out):
        return self.classifier(out.last_hidden_state)


class RobertaForMultipleChoice(PooledClassifier, MultipleChoiceModel):
    base_class, base_model_prefix, model_types = RobertaModel, "roberta", ("roberta",)

    def pooled_dropout(self, config):
        return self.dims.hidden_dropout  # RoBERTa ignores classifier_dropout here, as transformers

    def num_outputs(self, config):
        return 1


class RobertaForTokenClassification(TokenClassificationModel):
    base_class, base_model_prefix, model_types = RobertaModel, "roberta", ("roberta",)


class RobertaForQuestionAnswering(QuestionAnsweringModel):
    base_class, base_model_prefix, model_types = RobertaModel, "roberta", ("roberta",)


def _renamed(base, name, model_type, encoder):
    return type(name, (base,), {"model_types": (model_type,), "base_class": encoder, "__module__": __name__,
                                "__doc__": f"{base.__name__} for {model_type} checkpoints."})


XLMRobertaForMaskedLM = _renamed(RobertaForMaskedLM, "XLMRobertaForMaskedLM", "xlm-roberta", XLMRobertaModel)
XLMRobertaForSequenceClassification = _renamed(RobertaForSequenceClassification,
                                               "XLMRobertaForSequenceClassification", "xlm-roberta",
                                               XLMRobertaModel)
XLMRobertaForTokenClassification = _renamed(RobertaForTokenClassification, "XLMRobertaForTokenClassification",
                                            "xlm-roberta", XLMRobertaModel)
XLMRobertaForQuestionAnswering = _renamed(RobertaForQuestionAnswering, "XLMRobertaForQuestionAnswering",
                                          "xlm-roberta", XLMRobertaModel)
XLMRobertaForMultipleChoice = _renamed(RobertaForMultipleChoice, "XLMRobertaForMultipleChoice", "xlm-roberta",
                                       XLMRobertaModel)
CamembertForMaskedLM = _renamed(RobertaForMaskedLM, "CamembertForMaskedLM", "camembert", CamembertModel)
CamembertForSequenceClassification = _renamed(RobertaForSequenceClassification,
                                              "CamembertForSequenceClassification", "camembert", CamembertModel)
CamembertForTokenClassification = _renamed(RobertaForTokenClassification, "CamembertForTokenClassification",
                                           "camembert", CamembertModel)
CamembertForQuestionAnswering = _renamed(RobertaForQuestionAnswering, "CamembertForQuestionAnswering",
                                         "camembert", CamembertModel)
CamembertForMultipleChoice = _renamed(RobertaForMultipleChoice, "CamembertForMultipleChoice", "camembert",
                                      CamembertModel)


# ---- ELECTRA heads -----------------------------------------------------------------------------------
class ElectraGeneratorPredictions(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, d.embedding_size)
        self.LayerNorm = nn.LayerNorm(d.embedding_size, eps=d.layer_norm_eps)

    def forward(self, h):
        return self.LayerNorm(GELU.fn(self.dense(h)))


class ElectraForMaskedLM(MaskedLMModel):
    base_class, base_model_prefix, model_types = ElectraModel, "electra", ("electra",)

    decoder = "generator_lm_head"

    def build_head(self, config):
        self.generator_predictions = ElectraGeneratorPredictions(self.dims)
        self.generator_lm_head = nn.Linear(self.dims.embedding_size, self.dims.vocab_size)

    def mlm_logits(self, h):
        return self.generator_lm_head(self.generator_predictions(h))


class ElectraForSequenceClassification(SequenceClassificationModel):
    base_class, base_model_prefix, model_types = ElectraModel, "electra", ("electra",)

    def build_head(self, config):
        self.classifier = ClassificationHead(config, self.dims, GELU.fn)

    def classify(self, out):
        return self.classifier(out.last_hidden_state)


class ElectraSequenceSummary(nn.Module):
    """ELECTRA's multiple-choice summary (config summary_*): first token, projection, activation."""

    def __init__(self, config, d):
        super().__init__()
        kind = getattr(config, "summary_type", "first")
        if kind != "first":
            raise ValueError(f"ELECTRA summary_type={kind!r} is not supported (fastbert supports 'first')")
        self.summary = nn.Identity()
        if getattr(config, "summary_use_proj", False):
            to_labels = getattr(config, "summary_proj_to_labels", False) and config.num_labels > 0
            self.summary = nn.Linear(d.hidden_size, config.num_labels if to_labels else d.hidden_size)
        act = getattr(config, "summary_activation", None)
        acts = {None: lambda x: x, "gelu": GELU.fn, "tanh": torch.tanh, "relu": RELU.fn}
        if act not in acts:
            raise ValueError(f"ELECTRA summary_activation={act!r} is not supported ({sorted(map(str, acts))})")
        self.activation = acts[act]
        self.first_dropout = nn.Dropout(getattr(config, "summary_first_dropout", 0.0) or 0.0)
        self.last_dropout = nn.Dropout(getattr(config, "summary_last_dropout", 0.0) or 0.0)

    def forward(self, h):
        return self.last_dropout(self.activation(self.summary(self.first_dropout(h[:, 0]))))


class ElectraForMultipleChoice(MultipleChoiceModel):
    base_class, base_model_prefix, model_types = ElectraModel, "electra", ("electra",)

    def build_head(self, config):
        self.sequence_summary = ElectraSequenceSummary(config, self.dims)
        out = self.sequence_summary.summary
        self.classifier = nn.Linear(out.out_features if isinstance(out, nn.Linear) else self.dims.hidden_size, 1)

    def choice_logits(self, out):
        return self.classifier(self.sequence_summary(out.last_hidden_state))


class ElectraForTokenClassification(TokenClassificationModel):
    base_class, base_model_prefix, model_types = ElectraModel, "electra", ("electra",)


class ElectraForQuestionAnswering(QuestionAnsweringModel):
    base_class, base_model_prefix, model_types = ElectraModel, "electra", ("electra",)
