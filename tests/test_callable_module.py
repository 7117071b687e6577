"""fastbert.optimize, fastbert.quantize and fastbert.cuda_graphs are functions through the package's
lazy attributes and modules once imported (the import system then sets the package attribute to
the module): both spellings call the function, with no fastbert frame in between."""
import importlib
import traceback

import pytest

import fastbert

# name -> the start of the TypeError the function raises for an int
CASES = {
    "optimize": "fastbert.optimize expects a transformers PreTrainedModel",
    "quantize": "model must be a torch.nn.Module, got int",
    "cuda_graphs": "int has no forward_packed",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_imported_module_calls_the_function(name):
    module = importlib.import_module(f"fastbert.{name}")
    assert getattr(fastbert, name) is module, "importing the module should make it the package attribute"
    assert module.__doc__ and module.__name__ == f"fastbert.{name}"
    with pytest.raises(TypeError, match=CASES[name]) as err:
        module(42)
    frames = traceback.extract_tb(err.value.__traceback__)
    # the user's line, then the function's own file: no wrapper frame (a warning's stacklevel=2 relies on it)
    assert frames[0].filename == __file__
    assert frames[1].filename == module.__file__ and frames[1].name == name, [(f.filename, f.name) for f in frames]
