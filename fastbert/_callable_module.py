"""A submodule callable as the function it is named after (`fastbert.optimize(model)`).

`fastbert.optimize` names both a function (through the package's lazy attributes) and the module
that defines it; once anything imports the module, the import system makes the package attribute
the module. Giving the module a class whose `__call__` is the function itself keeps both spellings
working, with no frame in between: a warning's stacklevel=2, and a traceback, name the user's line.
"""
import sys
import types
from typing import Callable


def make_callable(module_name: str, function: Callable) -> None:
    """Make the module `module_name` (already imported: call this at the end of it) call `function`."""
    module = sys.modules[module_name]
    cls = type(f"Callable{function.__name__.title().replace('_', '')}Module", (types.ModuleType,),
               {"__call__": staticmethod(function), "__doc__": module.__doc__})
    module.__class__ = cls
