"""Model outputs: transformers' own output dataclasses, with two fastbert rules on top.

Each class subclasses the transformers class of the same name (so `isinstance(out,
transformers.modeling_outputs.MaskedLMOutput)` holds, and transformers pipelines, which rebuild
anything that is not a transformers `ModelOutput` as a plain dict, keep it as an output). They
have the same fields in the same order, hence attribute access (`out.logits`), key access
(`out["logits"]`) and index access (`out[0]`) skipping fields left as None, and `to_tuple()` is
what `return_dict=False` returns.

fastbert's rules, kept from before these classes were transformers': `to_tuple()` (and so index
access) follows the field order even for fields set after construction, and a field set to None
leaves the keys and the tuple, as if never set (transformers would keep the old value as a key).
"""
from collections import OrderedDict
from dataclasses import dataclass, fields

from transformers import modeling_outputs as hf
from transformers.utils import ModelOutput as HFModelOutput


class ModelOutput(HFModelOutput):
    """Base of fastbert's outputs (not a dataclass itself; every concrete subclass is one)."""

    def __post_init__(self):
        super().__post_init__()
        self.__dict__["_built"] = True         # from now on a field set to None leaves the keys

    def __setattr__(self, name, value):
        if value is None and self.__dict__.get("_built") and name in self:
            OrderedDict.__delitem__(self, name)  # transformers forbids del on outputs; this is a field reset
        super().__setattr__(name, value)

    def to_tuple(self) -> tuple:
        return tuple(self[f.name] for f in fields(self) if f.name in self)


@dataclass
class BaseModelOutput(ModelOutput, hf.BaseModelOutput):
    """last_hidden_state, hidden_states, attentions"""


@dataclass
class BaseModelOutputWithPooling(ModelOutput, hf.BaseModelOutputWithPooling):
    """last_hidden_state, pooler_output, hidden_states, attentions"""


@dataclass
class MaskedLMOutput(ModelOutput, hf.MaskedLMOutput):
    """loss, logits, hidden_states, attentions"""


@dataclass
class SequenceClassifierOutput(ModelOutput, hf.SequenceClassifierOutput):
    """loss, logits, hidden_states, attentions"""


@dataclass
class TokenClassifierOutput(ModelOutput, hf.TokenClassifierOutput):
    """loss, logits, hidden_states, attentions"""


@dataclass
class MultipleChoiceModelOutput(ModelOutput, hf.MultipleChoiceModelOutput):
    """loss, logits, hidden_states, attentions"""


@dataclass
class QuestionAnsweringModelOutput(ModelOutput, hf.QuestionAnsweringModelOutput):
    """loss, start_logits, end_logits, hidden_states, attentions"""
