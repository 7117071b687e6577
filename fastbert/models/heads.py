"""Task heads with transformers' layouts and losses, shared by every family.

A concrete class (e.g. BertForSequenceClassification) picks its bare encoder (`base_class`), builds
its head modules under transformers' names in `build_head`, and maps encoder output to logits.
The losses are transformers' conventions: MLM / token classification ignore label -100;
sequence classification follows config.problem_type (regression: MSE, single label: cross
entropy, multi label: BCE-with-logits), inferred like transformers when unset; question answering
clamps start/end positions to the sequence length and ignores that index.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from fastbert.models.activations import Activation
from fastbert.models.modeling import FastPreTrainedModel
from fastbert.models.outputs import (MaskedLMOutput, MultipleChoiceModelOutput, QuestionAnsweringModelOutput,
                                     SequenceClassifierOutput, TokenClassifierOutput)

def activation(act: Activation):
    """The module-free function of a resolved activation (Dims.activation)."""
    return act.fn


# ---- building blocks under transformers' names ------------------------------------------------------
class Pooler(nn.Module):
    """BERT's pooler: tanh(dense(h[:, 0]))."""

    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))


class PredictionTransform(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dense = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.LayerNorm = nn.LayerNorm(dims.hidden_size, eps=dims.layer_norm_eps)
        self.act = activation(dims.activation)

    def forward(self, h):
        return self.LayerNorm(self.act(self.dense(h)))


class LMPrediction(nn.Module):
    """BERT's cls.predictions: transform, decoder (tied to the word embeddings), bias."""

    def __init__(self, dims):
        super().__init__()
        self.transform = PredictionTransform(dims)
        self.decoder = nn.Linear(dims.hidden_size, dims.vocab_size)
        self.bias = nn.Parameter(torch.zeros(dims.vocab_size))

    def forward(self, h):
        return self.decoder(self.transform(h))


class BertMLMHead(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.predictions = LMPrediction(dims)

    def forward(self, h):
        return self.predictions(h)


class RobertaLMHead(nn.Module):
    """RoBERTa's lm_head: dense, exact GELU, layer_norm, decoder (tied), bias."""

    def __init__(self, dims):
        super().__init__()
        self.dense = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.layer_norm = nn.LayerNorm(dims.hidden_size, eps=dims.layer_norm_eps)
        self.decoder = nn.Linear(dims.hidden_size, dims.vocab_size)
        self.bias = nn.Parameter(torch.zeros(dims.vocab_size))

    def forward(self, h):
        return self.decoder(self.layer_norm(F.gelu(self.dense(h))))


class ClassificationHead(nn.Module):
    """RoBERTa/ELECTRA sequence classifier on h[:, 0]: dropout, dense, act, dropout, out_proj."""

    def __init__(self, config, dims, act):
        super().__init__()
        p = config.classifier_dropout if config.classifier_dropout is not None else dims.hidden_dropout
        self.dense = nn.Linear(dims.hidden_size, dims.hidden_size)
        self.dropout = nn.Dropout(p)
        self.out_proj = nn.Linear(dims.hidden_size, config.num_labels)
        self.act = act

    def forward(self, h):
        x = self.dropout(h[:, 0])
        x = self.dropout(self.act(self.dense(x)))
        return self.out_proj(x)


def classifier_dropout(config, dims) -> float:
    p = getattr(config, "classifier_dropout", None)
    return dims.hidden_dropout if p is None else p


# ---- losses --------------------------------------------------------------------------------------------
def sequence_classification_loss(config, logits, labels):
    num_labels = config.num_labels
    if config.problem_type is None:  # transformers infers it once and stores it on the config
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.mse_loss(logits, labels)
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    if config.problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels)
    raise ValueError(f"config.problem_type {config.problem_type!r} is not one of 'regression', "
                     "'single_label_classification', 'multi_label_classification'")


def qa_loss(start_logits, end_logits, start_positions, end_positions, attention_mask=None):
    """transformers' QA loss (positions outside the sequence are clamped to its length and ignored). With
    an attention_mask, padded positions are out of the softmax (their logits set to the dtype's minimum)
    and a target on padding is ignored like one outside: fastbert's padded rows are zeros, so their
    logits are the head's bias, which training cannot push below the real positions' (transformers'
    are computed on pad tokens, and can), and a padded batch would learn worse than transformers'."""
    ignored = start_logits.size(1)

    def one(logits, positions):
        if positions.dim() > 1:
            positions = positions.squeeze(-1)
        positions = positions.clamp(0, ignored)
        if attention_mask is not None:
            pad = attention_mask.to(logits.device) == 0
            logits = logits.masked_fill(pad, torch.finfo(logits.dtype).min)
            on_pad = pad.gather(1, positions.clamp(max=ignored - 1)[:, None]).squeeze(1)
            positions = positions.masked_fill(on_pad, ignored)
        return F.cross_entropy(logits, positions, ignore_index=ignored)

    return (one(start_logits, start_positions) + one(end_logits, end_positions)) / 2


def ignore_padding(labels, attention_mask, ignore_index: int = -100):
    """Per-token labels with padded positions set to ignore_index (MLM, token classification): the loss
    reads no padded row (fastbert's are zeros; a label there would only train the head's bias)."""
    if attention_mask is None or labels.shape != attention_mask.shape:
        return labels
    return labels.masked_fill(attention_mask.to(labels.device) == 0, ignore_index)


# ---- task models ---------------------------------------------------------------------------------------
class TaskModel(FastPreTrainedModel):
    """An encoder (attribute named base_model_prefix) plus a head built by `build_head`.

    One forward for every task: encode, `head(out, inputs) -> {output field: tensor}`, and
    `loss(fields, **targets)` when targets are given. Tasks differ only in those two hooks, their
    output class, and (question answering) the names of the targets."""

    base_class = None
    uses_pooler = False
    output_class = None

    def __init__(self, config):
        super().__init__(config)
        self.add_module(self.base_model_prefix, self.base_class(config, add_pooling_layer=self.uses_pooler))
        self.build_head(config)
        self.post_init()

    def build_head(self, config) -> None:
        raise NotImplementedError

    def head(self, out, inputs: dict) -> dict:
        raise NotImplementedError

    def loss(self, fields: dict, **targets) -> torch.Tensor:
        raise NotImplementedError

    def without_padding(self, fields: dict, targets: dict, attention_mask) -> tuple:
        """(fields, targets) as the loss reads them: heads whose loss could see padded positions hide
        them here (see qa_loss, ignore_padding); the returned outputs are unchanged."""
        return fields, targets

    def encoder_inputs(self, inputs: dict) -> dict:
        return inputs

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None):
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                      position_ids=position_ids, inputs_embeds=inputs_embeds)
        return self.run(inputs, dict(labels=labels), output_attentions, output_hidden_states, return_dict)

    def run(self, inputs: dict, targets: dict, output_attentions, output_hidden_states, return_dict):
        out = self.base_model(**self.encoder_inputs(inputs), output_attentions=output_attentions,
                              output_hidden_states=output_hidden_states, return_dict=True)
        fields = self.head(out, inputs)
        loss = None
        if all(t is not None for t in targets.values()):
            fields_read, targets = self.without_padding(fields, targets, inputs["attention_mask"])
            loss = self.loss(fields_read, **targets)
        return self._finish(self.output_class(loss=loss, **fields, hidden_states=out.hidden_states,
                                              attentions=out.attentions), return_dict)


class MaskedLMModel(TaskModel):
    """Families name their LM head's parts; the decoder's weight is tied to the word embeddings."""

    output_class = MaskedLMOutput
    lm_head_name: Optional[str] = None  # the module build_head sets (its forward gives the logits)
    decoder: str = ""                   # path of the decoder Linear, e.g. "cls.predictions.decoder"
    decoder_bias: Optional[str] = None  # the head's own bias that decoder.bias is tied to, if any

    def tied_weights(self):
        tied = {f"{self.decoder}.weight": f"{self.base_model_prefix}.embeddings.word_embeddings.weight"}
        if self.decoder_bias is not None:
            tied[f"{self.decoder}.bias"] = self.decoder_bias
        return tied

    def get_output_embeddings(self) -> nn.Linear:
        return self.get_submodule(self.decoder)

    def mlm_logits(self, sequence_output):
        return getattr(self, self.lm_head_name)(sequence_output)

    def head(self, out, inputs):
        return {"logits": self.mlm_logits(out.last_hidden_state)}

    def without_padding(self, fields, targets, attention_mask):
        return fields, {"labels": ignore_padding(targets["labels"], attention_mask)}

    def loss(self, fields, labels):
        logits = fields["logits"]
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))  # -100 ignored


class PooledClassifier:
    """Mixin: dropout + classifier on the pooler output (BERT, ALBERT, RoBERTa multiple choice)."""

    uses_pooler = True

    def build_head(self, config):
        self.dropout = nn.Dropout(self.pooled_dropout(config))
        self.classifier = nn.Linear(self.dims.hidden_size, self.num_outputs(config))

    def pooled_dropout(self, config):
        return classifier_dropout(config, self.dims)

    def num_outputs(self, config):
        return config.num_labels

    def classify(self, out):
        return self.classifier(self.dropout(out.pooler_output))

    choice_logits = classify


class SequenceClassificationModel(TaskModel):
    output_class = SequenceClassifierOutput

    def classify(self, out):
        raise NotImplementedError

    def head(self, out, inputs):
        return {"logits": self.classify(out)}

    def loss(self, fields, labels):
        return sequence_classification_loss(self.config, fields["logits"], labels)


class TokenClassificationModel(TaskModel):
    output_class = TokenClassifierOutput

    def build_head(self, config):
        self.dropout = nn.Dropout(self.token_dropout(config))
        self.classifier = nn.Linear(self.dims.hidden_size, config.num_labels)

    def token_dropout(self, config) -> float:
        return classifier_dropout(config, self.dims)

    def head(self, out, inputs):
        return {"logits": self.classifier(self.dropout(out.last_hidden_state))}

    def without_padding(self, fields, targets, attention_mask):
        return fields, {"labels": ignore_padding(targets["labels"], attention_mask)}

    def loss(self, fields, labels):
        return F.cross_entropy(fields["logits"].view(-1, self.config.num_labels), labels.view(-1))  # -100 ignored


class QuestionAnsweringModel(TaskModel):
    output_class = QuestionAnsweringModelOutput

    def qa_dropout(self, config) -> Optional[float]:
        return None  # DistilBERT applies dropout before qa_outputs

    def build_head(self, config):
        if self.qa_dropout(config) is not None:
            self.dropout = nn.Dropout(self.qa_dropout(config))
        self.qa_outputs = nn.Linear(self.dims.hidden_size, config.num_labels)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, output_attentions=None,
                output_hidden_states=None, return_dict=None):
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                      position_ids=position_ids, inputs_embeds=inputs_embeds)
        return self.run(inputs, dict(start_positions=start_positions, end_positions=end_positions),
                        output_attentions, output_hidden_states, return_dict)

    def head(self, out, inputs):
        h = out.last_hidden_state
        if hasattr(self, "dropout"):
            h = self.dropout(h)
        start_logits, end_logits = self.qa_outputs(h).split(1, dim=-1)
        return {"start_logits": start_logits.squeeze(-1).contiguous(),
                "end_logits": end_logits.squeeze(-1).contiguous()}

    def without_padding(self, fields, targets, attention_mask):
        return fields, {**targets, "attention_mask": attention_mask}   # qa_loss leaves padding out

    def loss(self, fields, start_positions, end_positions, attention_mask=None):
        return qa_loss(fields["start_logits"], fields["end_logits"], start_positions, end_positions, attention_mask)


class MultipleChoiceModel(TaskModel):
    output_class = MultipleChoiceModelOutput

    def choice_logits(self, out):
        raise NotImplementedError

    def encoder_inputs(self, inputs):
        """(batch, num_choices, seq[, dim]) -> (batch * num_choices, seq[, dim])."""
        ref = inputs["input_ids"] if inputs["input_ids"] is not None else inputs["inputs_embeds"]
        if ref is None or ref.dim() < 3:
            raise ValueError("multiple choice inputs must be (batch, num_choices, seq), got shape "
                             f"{None if ref is None else tuple(ref.shape)}")
        keep = {"inputs_embeds": 2}
        return {name: None if t is None else t.reshape(-1, *t.shape[-keep.get(name, 1):])
                for name, t in inputs.items()}

    def head(self, out, inputs):
        ref = inputs["input_ids"] if inputs["input_ids"] is not None else inputs["inputs_embeds"]
        return {"logits": self.choice_logits(out).view(-1, ref.shape[1])}

    def loss(self, fields, labels):
        return F.cross_entropy(fields["logits"], labels)
