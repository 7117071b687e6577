"""fastbert: fast BERT-family encoders for PyTorch.

A C++ WordPiece tokenizer, fused Triton kernels and drop-in Hugging Face-compatible modules.

Every public name is listed in `_EXPORTS` (and so in `__all__` and `dir(fastbert)`) with the module
that defines it; it is imported on first use, so `import fastbert` and the tokenizer alone load
neither torch nor the models. The model classes are fastbert.models' (the registry's table).
"""
import importlib

__version__ = "0.1.0"

_MODEL_TASKS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                "ForQuestionAnswering", "ForMultipleChoice")

# module -> the public names it defines
_EXPORTS = {
    "fastbert.tokenizer": ("AutoTokenizer", "BatchEncoding", "BertTokenizer"),
    "fastbert.auto": ("AutoModel",) + tuple("AutoModel" + t for t in _MODEL_TASKS[1:]),
    "fastbert.encoder": ("Encoder",),
    "fastbert._optimize": ("optimize",),
    "fastbert._quantize": ("quantize", "QuantizedLinear", "quantize_embeddings"),
    "fastbert._cuda_graphs": ("cuda_graphs", "CudaGraphs"),
    "fastbert.models.config": ("ConfigError",),
    "fastbert.models": ("CheckpointError",) + tuple(
        prefix + task
        for prefix in ("Bert", "Roberta", "XLMRoberta", "Camembert", "Electra", "DistilBert", "Albert", "MPNet",
                       "DebertaV2", "ModernBert")
        for task in _MODEL_TASKS
    ) + tuple("Deberta" + t for t in _MODEL_TASKS[:5]) + tuple("NomicBert" + t for t in _MODEL_TASKS[:4]),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", "ops", *_MODULE_OF]


def __getattr__(name):
    # Only the names above: anything else (a submodule such as _C that is not imported yet) raises
    # AttributeError at once, and the import system then loads the submodule.
    if name == "ops":
        return importlib.import_module("fastbert.ops")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'fastbert' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
