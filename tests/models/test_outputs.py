"""fastbert's output classes are transformers' ModelOutput dataclasses with fastbert's two rules
(to_tuple in field order, a field set to None leaves keys and tuple)."""
import copy
import dataclasses
import pickle

import pytest
import torch
import transformers.modeling_outputs as hf
from transformers.utils import ModelOutput

from fastbert.models import outputs

FIELDS = {  # fastbert's tuple layout, which is also transformers'
    "BaseModelOutput": ("last_hidden_state", "hidden_states", "attentions"),
    "BaseModelOutputWithPooling": ("last_hidden_state", "pooler_output", "hidden_states", "attentions"),
    "MaskedLMOutput": ("loss", "logits", "hidden_states", "attentions"),
    "SequenceClassifierOutput": ("loss", "logits", "hidden_states", "attentions"),
    "TokenClassifierOutput": ("loss", "logits", "hidden_states", "attentions"),
    "MultipleChoiceModelOutput": ("loss", "logits", "hidden_states", "attentions"),
    "QuestionAnsweringModelOutput": ("loss", "start_logits", "end_logits", "hidden_states", "attentions"),
}


@pytest.mark.parametrize("name", list(FIELDS))
def test_is_the_transformers_class_with_the_same_fields(name):
    cls = getattr(outputs, name)
    assert issubclass(cls, getattr(hf, name)) and issubclass(cls, ModelOutput)
    assert tuple(f.name for f in dataclasses.fields(cls)) == FIELDS[name]


def test_access_tuple_none_reset_pickle_and_errors():
    logits, loss, hidden = torch.randn(2, 3), torch.tensor(0.5), (torch.randn(2, 4),)
    out = outputs.SequenceClassifierOutput(logits=logits, hidden_states=hidden)
    assert out.logits is logits and out["logits"] is logits and out[0] is logits and out.loss is None
    assert list(out.keys()) == ["logits", "hidden_states"] and out.to_tuple() == (logits, hidden)
    out.loss = loss                              # set later: still first in the tuple, as its field comes first
    assert out.to_tuple() == (loss, logits, hidden) and out[0] is loss and out[1:] == (logits, hidden)
    out.hidden_states = None                     # leaves keys and tuple
    assert "hidden_states" not in out and out.to_tuple() == (loss, logits) and out.hidden_states is None
    for twin in (pickle.loads(pickle.dumps(out)), copy.deepcopy(out)):
        assert type(twin) is type(out) and set(twin.keys()) == set(out.keys())
        assert all(torch.equal(a, b) for a, b in zip(twin.to_tuple(), out.to_tuple()))
    with pytest.raises(TypeError, match="unexpected keyword argument 'logit'"):
        outputs.MaskedLMOutput(logit=logits)
    with pytest.raises(AttributeError):
        _ = out.logit
