"""The one table of model types fastbert runs: model_type -> the family file and its classes.

Everything that needs to know the supported model types reads it from here (config checks, the
Auto classes, fastbert.optimize, fastbert.models' public names, Encoder's position offsets).
Adding a family touches this table and the family's own file only:

1. Write fastbert/models/<family>.py: a bare encoder `<Prefix>Model(EncoderModel)` (its `embed`,
   `layers`, optional `pool`; layers are FastLayer subclasses returning LayerParts) and the heads
   `<Prefix>For<Task>` it supports, each with `model_types = ("<model_type>",)`.
2. Optionally, in that file: `resolve_dims(config) -> Dims` when the transformers config names its
   sizes differently from BertConfig, and `check_config(config, source)` to raise ConfigError for
   settings the family cannot honour.
3. Add one `Family(...)` row below: model_type, module, class-name prefix, the tasks it has, and
   its position-id convention.
"""
import importlib
from dataclasses import dataclass
from typing import Optional

from fastbert.models.errors import ConfigError

TASKS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
         "ForQuestionAnswering", "ForMultipleChoice")


@dataclass(frozen=True)
class Family:
    model_type: str              # transformers' config.model_type
    module: str                  # the file that implements it
    prefix: str                  # class names are prefix + task: "Bert" -> BertModel, BertForMaskedLM, ...
    roberta_positions: bool = False  # position ids start at pad_token_id + 1 (fairseq's convention)
    activation_key: Optional[str] = "hidden_act"  # the config attribute naming the FFN activation
                                                # (None: the family's check_config checks it)
    tasks: tuple = TASKS         # "Model" (the bare encoder) and the heads the family provides

    def class_name(self, task: str = "Model") -> str:
        return self.prefix + task

    def model_class(self, task: str = "Model"):
        """The fastbert class for a task ("Model" for the bare encoder); ConfigError if the family has none."""
        if task not in self.tasks:
            raise ConfigError(f"model_type {self.model_type!r} has no {task} class in fastbert "
                              f"(it has: {', '.join(self.class_name(t) for t in self.tasks)})")
        return getattr(importlib.import_module(self.module), self.class_name(task))

    def hook(self, name: str):
        """An optional per-family function of the family's module (resolve_dims, check_config), or None."""
        return getattr(importlib.import_module(self.module), name, None)

    def position_offset(self, pad_token_id: Optional[int]) -> int:
        """What position 0 of a sequence is numbered: 0, or pad_token_id + 1 for RoBERTa-like models."""
        if not self.roberta_positions:
            return 0
        return (1 if pad_token_id is None else pad_token_id) + 1


FAMILIES = {f.model_type: f for f in (
    Family("bert", "fastbert.models.bert", "Bert"),
    Family("roberta", "fastbert.models.bert", "Roberta", roberta_positions=True),
    Family("xlm-roberta", "fastbert.models.bert", "XLMRoberta", roberta_positions=True),
    Family("camembert", "fastbert.models.bert", "Camembert", roberta_positions=True),
    Family("electra", "fastbert.models.bert", "Electra"),
    Family("distilbert", "fastbert.models.distilbert", "DistilBert", activation_key="activation"),
    Family("albert", "fastbert.models.albert", "Albert"),
    Family("mpnet", "fastbert.models.mpnet", "MPNet", roberta_positions=True),
    Family("deberta-v2", "fastbert.models.deberta", "DebertaV2"),
    Family("deberta", "fastbert.models.deberta_v1", "Deberta", tasks=TASKS[:5]),   # transformers: no MultipleChoice
    Family("modernbert", "fastbert.models.modernbert", "ModernBert", activation_key=None),
    Family("nomic_bert", "fastbert.models.nomic_bert", "NomicBert", activation_key=None,
           tasks=("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")),
)}
MODEL_TYPES = tuple(FAMILIES)
ROBERTA_LIKE = tuple(t for t, f in FAMILIES.items() if f.roberta_positions)


def family(model_type, source: str = "config") -> Family:
    """The registry row for a model type; ConfigError naming the supported ones otherwise."""
    found = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported; fastbert supports {MODEL_TYPES}")
    return found


def model_class(model_type, task: str = "Model", source: str = "config"):
    return family(model_type, source).model_class(task)


def public_names() -> dict:
    """{class name: (module, task)} of every class the registry names (fastbert.models' exports)."""
    return {f.class_name(t): (f.module, t) for f in FAMILIES.values() for t in f.tasks}
