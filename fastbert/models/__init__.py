"""Encoder families with Hugging Face parameter names (see bert.py for how to share weights).

The public class names (BertModel, RobertaForMaskedLM, ...) are the registry's (registry.py)."""
import importlib

from fastbert.models.loading import CheckpointError  # noqa: F401  (re-exported: fastbert.models.CheckpointError)
from fastbert.models.modeling import EncoderModel, FastPreTrainedModel  # noqa: F401  (re-exported base classes)
from fastbert.models.registry import public_names

__all__ = list(public_names())
for _name, (_module, _task) in public_names().items():
    globals()[_name] = getattr(importlib.import_module(_module), _name)
del _name, _module, _task
