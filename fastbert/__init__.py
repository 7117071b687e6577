"""fastbert: fast BERT-family encoders for PyTorch.

A C++ WordPiece tokenizer, fused Triton kernels and drop-in Hugging Face-compatible modules.
Public names are imported lazily so `import fastbert` stays cheap.
"""
import importlib
import importlib.util

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "BertTokenizer": "fastbert.tokenizer",
    "BatchEncoding": "fastbert.tokenizer",
    "AutoTokenizer": "fastbert.tokenizer",
    "AutoModel": "fastbert.auto",
    "AutoModelForMaskedLM": "fastbert.auto",
    "AutoModelForSequenceClassification": "fastbert.auto",
    "AutoModelForTokenClassification": "fastbert.auto",
    "AutoModelForQuestionAnswering": "fastbert.auto",
    "AutoModelForMultipleChoice": "fastbert.auto",
    "Encoder": "fastbert.encoder",
    "optimize": "fastbert.optimize",
    "quantize": "fastbert.quantize",
    "QuantizedLinear": "fastbert.quantize",
    "ops": "fastbert.ops",
    "cuda_graphs": "fastbert.cuda_graphs",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        # `from fastbert import _C` (or any submodule not imported yet) asks here first; the import
        # system loads the submodule after an AttributeError, so torch and the models stay unloaded
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
            raise AttributeError(f"module 'fastbert' has no attribute {name!r}")
        models = importlib.import_module("fastbert.models")
        if name in getattr(models, "__all__", ()):
            return getattr(models, name)
        raise AttributeError(f"module 'fastbert' has no attribute {name!r}")
    mod = importlib.import_module(module)
    return mod if name == "ops" else getattr(mod, name)


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
