"""Python side of FTorch's embedded interpreter (used by libftorch_python; not a public API).

Fortran programs reach these functions through ``torch_pymodule_load`` / ``torch_pymodule_call``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback


def check_torch(version: str, torch_dir: str) -> None:
    """Fail unless ``import torch`` gives the torch FTorch was built against and runs on."""
    import torch

    here = os.path.realpath(os.path.dirname(torch.__file__))
    want = os.path.realpath(torch_dir)
    if here != want:
        raise ImportError(
            f"the embedded interpreter imports torch from {here}, but FTorch runs on the torch at {want}; "
            f"run the program in the environment that holds {want} (or set FTORCH_PYTHON and "
            "FTORCH_LIBPYTHON to that environment's interpreter and libpython)"
        )
    if torch.__version__ != version:
        raise ImportError(
            f"the embedded interpreter has torch {torch.__version__}, but FTorch was built against torch "
            f"{version}; reinstall FTorch in this environment (pip install --no-build-isolation ftorch)"
        )


def load(name: str):
    """A module from a file path (executed anew; its directory goes first on sys.path) or by
    dotted name (imported, shared with other imports of it)."""
    if name.endswith(".py") or os.sep in name:
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no Python file {path}")
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        # Registered in sys.modules (pickle and dataclasses look classes up there) under the file's
        # name, unless that name is taken: by a module already imported or of the standard library
        # (a file random.py must not replace the standard library's for torch) or by an earlier load
        # of a file of that name (whose classes must stay picklable); then under a name of its own.
        module_name = stem = os.path.splitext(os.path.basename(path))[0]
        taken = set(getattr(sys, "stdlib_module_names", ()))  # (Python 3.10+: also those not imported yet)
        n = 1
        while module_name in sys.modules or module_name in taken:
            n += 1
            module_name = f"_ftorch_file_{n}_{stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            if sys.modules.get(module_name) is module:
                del sys.modules[module_name]
            raise
        return module
    return importlib.import_module(name)


def describe(exc_type, exc_value, exc_tb) -> str:
    """'module.Type: message' and the traceback, for the Fortran side's errmsg."""
    name = getattr(exc_type, "__qualname__", str(exc_type))
    module = getattr(exc_type, "__module__", "builtins")
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    trace = "".join(traceback.format_exception(exc_type, exc_value, exc_tb))
    return f"{name}: {exc_value}\n{trace.rstrip()}"
