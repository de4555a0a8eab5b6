"""Finding and loading the model to export: ``path/model.py:Class``, ``package.module:factory``,
and weights from a state_dict or TorchScript file.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect as pyinspect
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from ._export_errors import _display_path, ExportError, UsageError, _user_frame


def _import_file(path: Path):
    stem = path.stem
    name = stem if stem.isidentifier() and stem not in sys.modules else f"_ftorch_user_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: TorchScript resolves the names of the model's module through
    # sys.modules, and the file's own directory is importable as for `python file.py`.
    sys.modules[name] = module
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except SystemExit:
        del sys.modules[name]
        raise UsageError(f"importing {_display_path(path)} ran sys.exit(): keep the script part under "
                         "`if __name__ == \"__main__\":`") from None
    except Exception as exc:  # the user's code: report where it failed
        del sys.modules[name]
        raise UsageError(f"importing {_display_path(path)} failed: {type(exc).__name__}: {exc}"
                         f"{_user_frame(exc, path)}") from None
    return module


def _candidates(module) -> list[str]:
    import torch

    out = []
    for key, value in vars(module).items():
        if key.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            out.append(key)
        elif pyinspect.isfunction(value):
            out.append(f"{key}()")
    return out


def load_model(spec: str, init_kwargs: dict | None = None, weights: str | os.PathLike | None = None):
    """The nn.Module named by ``spec`` (``file.py:Name``, ``package.module:Name``, or ``file.py`` with
    one nn.Module class), built with ``init_kwargs``, with the state_dict in ``weights`` loaded.
    Returns (module, label) where label names it for messages."""
    import torch

    source, sep, attr = spec.rpartition(":")
    if not sep:
        source, attr = spec, ""
    if not source:
        raise UsageError(f"bad model {spec!r}: expected path/to/file.py:Name or package.module:Name")
    path = None
    if source.endswith(".py") or "/" in source or os.sep in source or Path(source).is_file():
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"no such file: {source}")
        module = _import_file(path)
        where = _display_path(path)
    else:
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as exc:
            if exc.name and source.startswith(exc.name):
                raise UsageError(f"no module named {source!r} (and no file {source!r}); give path/to/file.py:Name "
                                 "or an importable module") from None
            raise UsageError(f"importing {source} failed: ModuleNotFoundError: {exc}") from None
        except Exception as exc:
            raise UsageError(f"importing {source} failed: {type(exc).__name__}: {exc}"
                             f"{_user_frame(exc, None)}") from None
        where = source
    found = _candidates(module)
    if not attr:
        classes = [c for c in found if not c.endswith("()")]
        if len(classes) != 1:
            raise UsageError(f"{where}: name the model as {source}:Name"
                             + (f" (nn.Module classes here: {', '.join(classes)})" if classes else ""))
        attr = classes[0]
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            listing = f"; it defines: {', '.join(found)}" if found else "; it defines no nn.Module class or function"
            raise UsageError(f"{where} has no {attr!r}{listing}")
        obj = getattr(obj, part)
    label = attr
    if isinstance(obj, torch.nn.Module):
        if init_kwargs:
            raise UsageError(f"{attr} in {where} is already a module instance: --init-kwargs does not apply")
        model = obj
    elif callable(obj):
        try:
            model = obj(**(init_kwargs or {}))
        except TypeError as exc:
            raise UsageError(f"cannot build {attr}(**{init_kwargs or {}}): {exc}") from None
        except Exception as exc:
            raise ExportError(f"building {attr}(**{init_kwargs or {}}) failed: {type(exc).__name__}: {exc}"
                              f"{_user_frame(exc, path)}") from None
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"{attr}(...) returned {type(model).__name__}, not a torch.nn.Module: name an nn.Module "
                             "class or a function that returns one")
    else:
        raise UsageError(f"{attr} in {where} is a {type(obj).__name__}, not an nn.Module class or factory function")
    if weights is not None:
        load_weights(model, weights)
    return model, f"{label} from {where}"


def _is_torchscript_archive(path: Path) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return any(re.search(r"(^|/)code/", n) for n in zf.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def load_weights(model, weights: str | os.PathLike) -> None:
    """Load a state_dict, or a checkpoint dict holding one (under 'state_dict', 'model_state_dict'
    or 'model'), or a TorchScript file's parameters and buffers, into ``model``; 'module.' prefixes
    of DataParallel/DDP are removed."""
    import pickle

    import torch

    path = Path(weights)
    if not path.is_file():
        raise UsageError(f"no such weights file: {weights}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if _is_torchscript_archive(path):  # its parameters and buffers
                state = torch.jit.load(str(path), map_location="cpu").state_dict()
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in first or "Weights only" in first:
            first = "not tensors that torch.load(weights_only=True) can read"
        raise UsageError(f"cannot read weights {weights}: {first}; save them with "
                         "torch.save(model.state_dict(), FILE)") from None
    if isinstance(state, torch.jit.ScriptModule):
        state = state.state_dict()
    if isinstance(state, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"{weights} holds no state_dict (a dict of tensors, or a checkpoint with one under "
                         "'state_dict', 'model_state_dict' or 'model')")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise UsageError(f"weights {weights} do not fit the model: " + " ".join(lines[1:4] or lines[:1])) from None
