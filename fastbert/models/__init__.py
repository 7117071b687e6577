"""Encoder families with Hugging Face parameter names (see bert.py for how to share weights)."""
from fastbert.models.albert import (AlbertForMaskedLM, AlbertForMultipleChoice, AlbertForQuestionAnswering,
                                    AlbertForSequenceClassification, AlbertForTokenClassification, AlbertModel)
from fastbert.models.bert import (
    BertForMaskedLM, BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
    BertForTokenClassification, BertModel, CamembertForMaskedLM, CamembertForMultipleChoice,
    CamembertForQuestionAnswering, CamembertForSequenceClassification, CamembertForTokenClassification,
    CamembertModel, ElectraForMaskedLM, ElectraForMultipleChoice, ElectraForQuestionAnswering,
    ElectraForSequenceClassification, ElectraForTokenClassification, ElectraModel, RobertaForMaskedLM,
    RobertaForMultipleChoice, RobertaForQuestionAnswering, RobertaForSequenceClassification,
    RobertaForTokenClassification, RobertaModel, XLMRobertaForMaskedLM, XLMRobertaForMultipleChoice,
    XLMRobertaForQuestionAnswering, XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification,
    XLMRobertaModel)
from fastbert.models.distilbert import (DistilBertForMaskedLM, DistilBertForMultipleChoice,
                                        DistilBertForQuestionAnswering, DistilBertForSequenceClassification,
                                        DistilBertForTokenClassification, DistilBertModel)
from fastbert.models.modeling import CheckpointError, EncoderModel, FastPreTrainedModel

_FAMILIES = ("Bert", "Roberta", "XLMRoberta", "Camembert", "Electra", "DistilBert", "Albert")
_TASKS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
          "ForQuestionAnswering", "ForMultipleChoice")

__all__ = [f + t for f in _FAMILIES for t in _TASKS]
