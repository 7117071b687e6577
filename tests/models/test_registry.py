"""The registry is the one table of model types: every row's classes exist and accept its model
type, and each consumer (config checks, Auto classes, optimize, fastbert.models, Encoder) reads it."""
import pytest

import fastbert
import fastbert.models as M
from fastbert.models import registry
from fastbert.models.config import ConfigError, config_from_dict


@pytest.mark.parametrize("model_type", registry.MODEL_TYPES)
def test_every_row_names_classes_that_accept_its_model_type(model_type):
    family = registry.family(model_type)
    for task in family.tasks:
        cls = family.model_class(task)
        assert cls.__name__ == family.class_name(task)
        assert model_type in cls.model_types
        assert getattr(M, cls.__name__) is cls and cls.__name__ in M.__all__
        auto = getattr(fastbert, "AutoModel" + ("" if task == "Model" else task))
        assert auto.class_for(model_type) is cls


def test_consumers_read_the_registry():
    from fastbert import encoder
    assert set(M.__all__) == set(registry.public_names())
    assert encoder._ROBERTA_LIKE == registry.ROBERTA_LIKE == ("roberta", "xlm-roberta", "camembert", "mpnet")
    assert registry.family("roberta").position_offset(1) == 2 and registry.family("bert").position_offset(0) == 0


def test_unknown_model_type_is_named_everywhere():
    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported; fastbert supports"):
        config_from_dict({"model_type": "gpt2"})
    with pytest.raises(ConfigError, match="AutoModel: model_type 'gpt2' is not supported"):
        fastbert.AutoModel.class_for("gpt2")
    with pytest.raises(ConfigError, match="has no ForCausalLM class"):
        registry.model_class("bert", "ForCausalLM")
