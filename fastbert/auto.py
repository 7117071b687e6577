"""Auto classes: pick the fastbert class from config.json's model_type, as transformers' Auto* do.

    model = fastbert.AutoModelForSequenceClassification.from_pretrained(path, dtype=None, device=None)
"""
import os

from fastbert import models as M
from fastbert.models.config import ConfigError, config_from_dict, read_config_dict

_FAMILIES = {  # model_type -> class name prefix
    "bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert",
    "electra": "Electra", "distilbert": "DistilBert", "albert": "Albert",
}


class _AutoBase:
    _suffix = "Model"

    def __init__(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is built with .from_pretrained(path) or .from_config(config)")

    @classmethod
    def class_for(cls, model_type: str):
        if model_type not in _FAMILIES:
            raise ConfigError(f"model_type {model_type!r} is not supported by {cls.__name__}; "
                              f"supported: {sorted(_FAMILIES)}")
        return getattr(M, _FAMILIES[model_type] + cls._suffix)

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, dtype=None, device=None):
        from fastbert.hub import resolve_directory

        directory = resolve_directory(path_or_hub_id)
        data = read_config_dict(os.path.join(directory, "config.json"))
        return cls.class_for(data["model_type"]).from_pretrained(directory, dtype=dtype, device=device)

    @classmethod
    def from_config(cls, config):
        """A freshly initialised model (transformers' init) for a transformers config or config dict."""
        if isinstance(config, dict):
            config = config_from_dict(config)
        return cls.class_for(config.model_type).from_hf_config(config)


class AutoModel(_AutoBase):
    _suffix = "Model"


class AutoModelForMaskedLM(_AutoBase):
    _suffix = "ForMaskedLM"


class AutoModelForSequenceClassification(_AutoBase):
    _suffix = "ForSequenceClassification"


class AutoModelForTokenClassification(_AutoBase):
    _suffix = "ForTokenClassification"


class AutoModelForQuestionAnswering(_AutoBase):
    _suffix = "ForQuestionAnswering"


class AutoModelForMultipleChoice(_AutoBase):
    _suffix = "ForMultipleChoice"


# AutoTokenizer lives in fastbert/tokenizer/auto.py (fastbert.AutoTokenizer); here for fastbert.auto users.
def __getattr__(name):
    if name == "AutoTokenizer":
        try:
            from fastbert.tokenizer import AutoTokenizer
        except ImportError as e:
            raise AttributeError("fastbert.AutoTokenizer is not available (fastbert/tokenizer/auto.py)") from e
        return AutoTokenizer
    raise AttributeError(f"module 'fastbert.auto' has no attribute {name!r}")
