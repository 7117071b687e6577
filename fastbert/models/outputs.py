"""Model outputs that behave like transformers' ModelOutput.

Attribute access (`out.logits`), key access (`out["logits"]`) and index access (`out[0]`), where
fields left as None are skipped, as in transformers. `to_tuple()` is what `return_dict=False` returns.
"""
from collections import OrderedDict


class ModelOutput(OrderedDict):
    _fields: tuple = ()

    def __init__(self, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - set(self._fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {unknown}; fields are {self._fields}")
        for name in self._fields:
            if kwargs.get(name) is not None:
                self[name] = kwargs[name]

    def __getattr__(self, name):
        if name in type(self)._fields:
            return self.get(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in self._fields:
            if value is None:
                self.pop(name, None)
            else:
                self[name] = value
        else:
            super().__setattr__(name, value)

    def __getitem__(self, key):
        if isinstance(key, str):
            return super().__getitem__(key)
        return self.to_tuple()[key]

    def __reduce__(self):
        return (_rebuild, (type(self), dict(self)))

    def to_tuple(self) -> tuple:
        return tuple(self[name] for name in self._fields if name in self)


def _rebuild(cls, values):
    return cls(**values)


class BaseModelOutput(ModelOutput):
    _fields = ("last_hidden_state", "hidden_states", "attentions")


class BaseModelOutputWithPooling(ModelOutput):
    _fields = ("last_hidden_state", "pooler_output", "hidden_states", "attentions")


class MaskedLMOutput(ModelOutput):
    _fields = ("loss", "logits", "hidden_states", "attentions")


class SequenceClassifierOutput(ModelOutput):
    _fields = ("loss", "logits", "hidden_states", "attentions")


class TokenClassifierOutput(ModelOutput):
    _fields = ("loss", "logits", "hidden_states", "attentions")


class MultipleChoiceModelOutput(ModelOutput):
    _fields = ("loss", "logits", "hidden_states", "attentions")


class QuestionAnsweringModelOutput(ModelOutput):
    _fields = ("loss", "start_logits", "end_logits", "hidden_states", "attentions")
