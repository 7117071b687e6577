"""fastbert's public API: `__all__` lists every public name, each resolves on first use from the
module that defines it, and fastbert.optimize / quantize / cuda_graphs are plain functions."""
import inspect
import subprocess
import sys
import traceback

import pytest

import fastbert
from fastbert.models.registry import public_names

# name -> the start of the TypeError the function raises for an int
CASES = {
    "optimize": "fastbert.optimize expects a transformers PreTrainedModel",
    "quantize": "model must be a torch.nn.Module, got int",
    "cuda_graphs": "int has no forward_packed",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_entry_points_are_plain_functions(name):
    function = getattr(fastbert, name)
    assert inspect.isfunction(function) and function.__name__ == name and function.__doc__
    with pytest.raises(TypeError, match=CASES[name]) as err:
        function(42)
    frames = traceback.extract_tb(err.value.__traceback__)
    # the user's line, then the function's own body: no wrapper frame (a warning's stacklevel=2 relies on it)
    assert frames[0].filename == __file__
    assert frames[1].filename == inspect.getfile(function) and frames[1].name == name


def test_every_public_name_resolves_and_dir_lists_them():
    assert len(set(fastbert.__all__)) == len(fastbert.__all__)
    for name in fastbert.__all__:
        assert getattr(fastbert, name) is not None, name
    assert set(fastbert.__all__) <= set(dir(fastbert))
    with pytest.raises(AttributeError, match="no attribute 'BertModle'"):
        _ = fastbert.BertModle


def test_model_classes_are_the_registrys():
    from fastbert.models import FastPreTrainedModel

    exported = {name for name in fastbert.__all__ if isinstance(getattr(fastbert, name), type)
                and issubclass(getattr(fastbert, name), FastPreTrainedModel)}
    assert exported == set(public_names())
    for name, (module, _task) in public_names().items():
        assert getattr(fastbert, name).__module__ == module, name


def test_import_loads_no_torch_and_star_import_gives_all():
    code = ("import sys, fastbert; assert 'torch' not in sys.modules, 'import fastbert loaded torch'; "
            "ns = {}; exec('from fastbert import *', ns); "
            "missing = set(fastbert.__all__) - set(ns); assert not missing, missing; "
            "assert callable(ns['optimize']) and ns['BertModel'].__name__ == 'BertModel'")
    subprocess.run([sys.executable, "-c", code], check=True)
