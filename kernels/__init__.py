"""Triton kernels only (no torch.nn, no dispatch); installed as `fastbert.kernels`.

Import the submodules directly (`from fastbert.kernels import attention`): they import triton.
"""
import os as _os
import sys as _sys

if __name__ == "kernels":
    # Imported under the top-level name: the repository root is on sys.path (pytest or `python -c`
    # run from it). That name belongs to Hugging Face's `kernels` package, a dependency of
    # transformers >= 5.25, which imports it; this folder would shadow it. Load that package in
    # this module's place when it is installed (fastbert itself only imports fastbert.kernels).
    import importlib.machinery as _machinery
    import importlib.util as _util

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _elsewhere = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _root]
    _spec = _machinery.PathFinder.find_spec("kernels", _elsewhere)
    if _spec is not None and _spec.origin != _os.path.abspath(__file__):
        _module = _util.module_from_spec(_spec)
        _sys.modules["kernels"] = _module  # the import system returns what sys.modules holds
        _spec.loader.exec_module(_module)
