"""Auto classes: pick the fastbert class from config.json's model_type, as transformers' Auto* do.

    model = fastbert.AutoModelForSequenceClassification.from_pretrained(path, dtype=None, device=None,
                                                                        backend="auto")
"""
import os

from fastbert.models import registry
from fastbert.models.config import config_from_dict, read_config_dict


class _AutoBase:
    _suffix = "Model"

    def __init__(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is built with .from_pretrained(path) or .from_config(config)")

    @classmethod
    def class_for(cls, model_type: str):
        return registry.model_class(model_type, cls._suffix, source=cls.__name__)

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, dtype=None, device=None, backend: str = "auto", *,
                        revision=None, cache_dir=None, local_files_only: bool = False, token=None, **kwargs):
        """The model class for config.json's model_type, loaded by its from_pretrained (which takes
        transformers' arguments: torch_dtype, device_map, num_labels, ...). A peft adapter's folder
        or hub id gives its base model with the adapter loaded (a peft.PeftModel)."""
        from fastbert.hub import load_adapter, resolve_directory

        directory = resolve_directory(path_or_hub_id, revision=revision, cache_dir=cache_dir,
                                      local_files_only=local_files_only, token=token)
        # a peft adapter: its base model, of the class its own config names, then the adapter
        adapted = load_adapter(directory, lambda base: cls.from_pretrained(
            base, dtype=dtype, device=device, backend=backend, cache_dir=cache_dir,
            local_files_only=local_files_only, token=token, **kwargs))
        if adapted is not None:
            return adapted
        data = read_config_dict(os.path.join(directory, "config.json"))
        return cls.class_for(data["model_type"]).from_pretrained(directory, dtype=dtype, device=device,
                                                                 backend=backend, **kwargs)

    @classmethod
    def from_config(cls, config, backend: str = "auto"):
        """A freshly initialised model (transformers' init) for a transformers config or config dict."""
        if isinstance(config, dict):
            config = config_from_dict(config)
        return cls.class_for(config.model_type).from_hf_config(config, backend=backend)


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
