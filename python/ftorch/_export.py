"""Export a PyTorch model for Fortran and check the written files: ``python -m ftorch export``.

The model comes from a Python file or module (``path/model.py:Class``, ``package.module:factory``)
or is an ``nn.Module`` instance; it is written as TorchScript (``torch.jit.script``, or
``torch.jit.trace``) and/or as an AOTInductor package (``torch.export.export`` then
``torch._inductor.aoti_compile_and_package``). Each written file is then loaded back and run on
inputs laid out as a Fortran program passes them, and its results are compared with the eager
model's.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect as pyinspect
import io
import json
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence


class ExportError(Exception):
    """Export or check failed (exit code 1). ``report`` holds what was done, if anything."""

    exit_code = 1

    def __init__(self, message: str, report: "ExportReport | None" = None):
        super().__init__(message)
        self.report = report


class UsageError(ExportError):
    """The request itself is wrong: a file, name, input shape or option (exit code 2)."""

    exit_code = 2


# Names accepted for --input dtypes; the value is the torch attribute.
_DTYPE_ALIASES = {
    "float32": "float32", "float": "float32", "f32": "float32", "real32": "float32",
    "float64": "float64", "double": "float64", "f64": "float64", "real64": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "long": "int64",
    "uint8": "uint8", "bool": "bool",
}
DTYPES = sorted(set(_DTYPE_ALIASES.values()))

# Default tolerances, those of torch.testing.assert_close; integer and bool results must be equal.
_TOLERANCES = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
}


# ----------------------------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass
class InputSpec:
    """One input of forward: its name, shape (the Fortran array's shape) and dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        return f"{self.name}: [{', '.join(map(str, self.shape))}] {self.dtype}"


def dtype_name(dtype: Any) -> str:
    """'float32' for torch.float32 (or for the name or an alias)."""
    text = str(dtype).removeprefix("torch.")
    if text not in _DTYPE_ALIASES:
        raise UsageError(f"unsupported dtype {str(dtype)!r}: use one of {', '.join(DTYPES)}")
    return _DTYPE_ALIASES[text]


def parse_input(text: str) -> tuple[tuple[int, ...], str]:
    """``"8,5:float64"`` -> ((8, 5), "float64"); the dtype defaults to float32, ``8x5`` also works
    and an empty shape (``":float32"``) is a 0-d tensor."""
    shape_text, _, dtype_text = text.partition(":")
    shape_text = shape_text.strip()
    hint = "expected SHAPE[:DTYPE] such as 8,5 or 8,5:float64"
    if shape_text in ("", "()"):
        shape: tuple[int, ...] = ()
    else:
        parts = re.split(r"\s*[,x]\s*", shape_text)
        if not all(p.isdigit() for p in parts):
            raise UsageError(f"bad --input {text!r}: {hint} (extents are positive integers)")
        shape = tuple(int(p) for p in parts)
        if any(n < 1 for n in shape):
            raise UsageError(f"bad --input {text!r}: extents must be at least 1")
    dtype_text = dtype_text.strip() or "float32"
    if dtype_text not in _DTYPE_ALIASES:
        raise UsageError(f"bad --input {text!r}: unknown dtype {dtype_text!r}; use one of {', '.join(DTYPES)}")
    return shape, _DTYPE_ALIASES[dtype_text]


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def fortran_layout(t):
    """The same values with column-major strides, as ``torch_tensor_from_array`` wraps a Fortran
    array of that shape: shape (a, b, c) with strides (1, a, a*b)."""
    dims = list(reversed(range(t.dim())))
    return t.permute(dims).contiguous().permute(dims)


def random_fortran_tensor(shape: Sequence[int], dtype: str, generator, device="cpu"):
    """Random values in a tensor laid out as a Fortran array of ``shape``: drawn with the reversed
    shape (contiguous) and permuted back, so that strides are (1, a, a*b, ...)."""
    import torch

    rshape = tuple(reversed(tuple(shape)))
    tdtype = _torch_dtype(dtype)
    if tdtype.is_floating_point:
        base = torch.randn(rshape, generator=generator, dtype=torch.float64).to(tdtype)
    elif tdtype == torch.bool:
        base = torch.randint(0, 2, rshape, generator=generator).bool()
    else:
        base = torch.randint(0, 10, rshape, generator=generator, dtype=tdtype)
    return base.permute(list(reversed(range(len(rshape))))).to(device)


def _forward_parameters(model) -> tuple[list[str], int, bool]:
    """Names of forward's positional parameters, how many are required, whether it takes *args."""
    try:
        sig = pyinspect.signature(model.forward)
    except (TypeError, ValueError):
        return [], 0, True
    names, required, varargs = [], 0, False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
            if p.default is p.empty:
                required += 1
        elif p.kind == p.VAR_POSITIONAL:
            varargs = True
    return names, required, varargs


def _normalize_inputs(model, label: str, inputs) -> tuple[list[InputSpec], list | None]:
    """InputSpecs for ``inputs`` (tensors, (shape, dtype) pairs or 'SHAPE:DTYPE' strings) and the
    given tensors (None where shapes were given)."""
    import torch

    def is_shape(x) -> bool:
        return isinstance(x, (tuple, list, torch.Size)) and all(isinstance(n, int) for n in x)

    def is_pair(x) -> bool:
        return (isinstance(x, (tuple, list)) and len(x) == 2 and is_shape(x[0])
                and isinstance(x[1], (str, torch.dtype)))

    if isinstance(inputs, (torch.Tensor, str)) or is_pair(inputs):
        inputs = [inputs]
    names, required, varargs = _forward_parameters(model)
    if not inputs:
        raise UsageError(f"no inputs: give one --input SHAPE[:DTYPE] per tensor argument of {label}.forward"
                         + (f" ({', '.join(names)})" if names else ""))
    if len(inputs) < required or (len(inputs) > len(names) and not varargs):
        wanted = f"{required}" if required == len(names) else f"{required} to {len(names)}"
        raise UsageError(f"{label}.forward({', '.join(names)}) takes {wanted} tensor(s), "
                         f"but {len(inputs)} input(s) were given")
    specs, tensors = [], []
    for i, item in enumerate(inputs):
        name = names[i] if i < len(names) else f"input{i + 1}"
        if isinstance(item, torch.Tensor):
            specs.append(InputSpec(name, tuple(item.shape), dtype_name(item.dtype)))
            tensors.append(item)
            continue
        if isinstance(item, str):
            shape, dtype = parse_input(item)
        elif is_shape(item) and item:
            shape, dtype = tuple(item), "float32"
            if any(n < 1 for n in shape):
                raise UsageError(f"input {i + 1}: extents must be at least 1, got {shape}")
        else:
            try:
                shape_in, dtype_in = item
                shape = tuple(int(n) for n in shape_in)
            except (TypeError, ValueError):
                raise UsageError(f"input {i + 1}: expected a tensor, a (shape, dtype) pair or 'SHAPE:DTYPE', "
                                 f"got {item!r}") from None
            if any(n < 1 for n in shape):
                raise UsageError(f"input {i + 1}: extents must be at least 1, got {shape}")
            dtype = dtype_name(dtype_in)
        specs.append(InputSpec(name, shape, dtype))
        tensors.append(None)
    return specs, (tensors if any(t is not None for t in tensors) else None)


# ----------------------------------------------------------------------------------------------
# Finding the model


def _display_path(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _user_frame(exc: BaseException, path: Path | None) -> str:
    """'file.py:12' of the innermost traceback frame in ``path`` (or the innermost of all)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        mine = [f for f in frames if Path(f.filename).resolve() == path]
    else:
        # The innermost frame outside torch and this package: the user's code.
        libs = [str(Path(__file__).resolve().parent)]
        torch_spec = importlib.util.find_spec("torch")
        if torch_spec is not None and torch_spec.origin:
            libs.append(str(Path(torch_spec.origin).resolve().parent))
        mine = [f for f in frames if not any(str(Path(f.filename).resolve()).startswith(lib) for lib in libs)]
    frames = mine or frames
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {_display_path(Path(f.filename))}:{f.lineno})"


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


# ----------------------------------------------------------------------------------------------
# Report


@dataclasses.dataclass
class OutputCheck:
    """One output compared with the eager model's."""

    index: int
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    problem: str = ""
    name: str = ""  # what was compared, when not the index-th output ("gradient of fc.weight")


@dataclasses.dataclass
class RunCheck:
    """One run of a written file on one set of inputs."""

    label: str
    outputs: list[OutputCheck]
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(o.ok for o in self.outputs)


@dataclasses.dataclass
class FileCheck:
    path: str
    kind: str  # "torchscript" or "pt2"
    how: str
    runs: list[RunCheck] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)


@dataclasses.dataclass
class ExportReport:
    """What ``export`` wrote and how the check went; ``str(report)`` is the CLI's summary."""

    model: str
    inputs: list[InputSpec]
    outputs: list[dict]
    torchscript: str | None = None
    torchscript_method: str | None = None
    training: bool = False
    pt2: str | None = None
    train_package: str | None = None
    dynamic_batch: list | None = None  # [min, max] (max None: unbounded)
    checks: list[FileCheck] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    tolerance: str = ""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ok"] = self.ok
        for c, cd in zip(self.checks, d["checks"]):
            cd["ok"] = c.ok
            for r, rd in zip(c.runs, cd["runs"]):
                rd["ok"] = r.ok
        return d

    def __str__(self) -> str:
        out = [f"model: {self.model}"]
        out.append("inputs (Fortran arrays of these shapes; tensors with column-major strides):")
        out += [f"  {s.describe()}" for s in self.inputs]
        out.append("outputs (eager model on these inputs):")
        out += [f"  {i + 1}: [{', '.join(map(str, o['shape']))}] {o['dtype']}" for i, o in enumerate(self.outputs)]
        if self.torchscript:
            mode = "training" if self.training else "eval"
            out.append(f"wrote {self.torchscript} (TorchScript, torch.jit.{self.torchscript_method}, {mode} mode)")
        if self.pt2:
            batch = ""
            if self.dynamic_batch:
                lo, hi = self.dynamic_batch
                batch = f", dynamic batch {lo}..{hi if hi is not None else 'any'}"
            out.append(f"wrote {self.pt2} (AOTInductor package, eval mode{batch})")
        if self.train_package:
            batch = ""
            if self.dynamic_batch:
                lo, hi = self.dynamic_batch
                batch = f", dynamic batch {lo}..{hi if hi is not None else 'any'}"
            out.append(f"wrote {self.train_package} (training package: forward and backward compiled by AOTInductor, "
                       f"parameters and buffers owned by FTorch{batch})")
        for note in self.notes:
            out.append(f"note: {note}")
        for c in self.checks:
            out.append(f"check {c.path} ({c.how}):")
            for r in c.runs:
                if r.error:
                    out.append(f"  {r.label}: FAILED: {r.error}")
                    continue
                for o in r.outputs:
                    shape = f"[{', '.join(map(str, o.shape))}] {o.dtype}"
                    verdict = "ok" if o.ok else f"MISMATCH{': ' + o.problem if o.problem else ''}"
                    diffs = ("" if o.max_abs != o.max_abs else  # NaN: shapes or dtypes differ
                             f"max abs diff {o.max_abs:.3g}, max rel diff {o.max_rel:.3g}  ")
                    what = o.name or f"output {o.index + 1}"
                    out.append(f"  {r.label:<16} {what}: {shape:<18} {diffs}{verdict}")
            if c.note:
                out.append(f"  note: {c.note}")
        if self.checks:
            out.append(f"tolerance: {self.tolerance}")
            out.append("check passed" if self.ok else "check FAILED")
        return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Error messages


@contextlib.contextmanager
def _quiet(captured: io.StringIO) -> Iterator[None]:
    """Silence torch's logging and prints (graph dumps of failed exports, compile logs)."""
    logger = logging.getLogger("torch")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            yield
    finally:
        logger.setLevel(old)


def _source_location(text: str) -> str:
    """', at file.py:12: `code`' from a TorchScript or torch.export message, '' if none."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if "<--- HERE" in lines[i]:
            code = lines[i - 1].strip() if i > 0 else ""
            for j in range(i - 1, -1, -1):
                m = re.search(r'File "([^"]+)", line (\d+)', lines[j])
                if m:
                    return f", at {_display_path(Path(m.group(1)))}:{m.group(2)}: `{code}`"
            break
    matches = list(re.finditer(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)', text))
    if matches:
        m = matches[-1]
        return f", at {_display_path(Path(m.group(1)))}:{m.group(2)}: `{m.group(3).strip()}`"
    return ""


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip().rstrip(":")
    return ""


def _script_error(label: str, exc: BaseException) -> ExportError:
    text = str(exc)
    what = (_first_line(text) or type(exc).__name__).rstrip(".")
    return ExportError(
        f"cannot script {label} with torch.jit.script: {what}{_source_location(text)}. "
        "Use --trace (trace=True) to record the operations run on the example inputs instead "
        "(Python control flow is then fixed to the path those inputs take), or rewrite that construct "
        "in the Python subset TorchScript supports."
    )


def _export_error(label: str, exc: BaseException, dynamic: bool) -> ExportError:
    text = str(exc)
    where = _source_location(text)
    name = type(exc).__name__
    if name == "GuardOnDataDependentSymNode" or "data-dependent" in text or "data dependent" in text:
        return ExportError(
            f"cannot export {label} with torch.export: Python control flow or a shape depends on tensor "
            f"values{where}. Write the branch with torch.cond (both branches are compiled) or torch.where, "
            "give the value a fixed shape, or write TorchScript (-o model.pt) with torch.jit.script, which keeps "
            "Python control flow."
        )
    if "Constraints violated" in text or "specialized" in text:
        detail = " ".join(ln.strip()[2:] for ln in text.splitlines() if ln.strip().startswith("- "))
        detail = detail.split(". If you're using")[0] if detail else _first_line(text)
        hint = ("The code fixes the batch size (a view(8, ...) or a constant); make it size-generic "
                "(x.shape[0], reshape(-1, ...)), or drop --dynamic-batch to compile for the example shapes only."
                if dynamic else "")
        return ExportError(f"cannot export {label} with torch.export: {detail}{where}. {hint}".rstrip())
    return ExportError(
        f"cannot export {label} with torch.export: {name}: {_first_line(text)}{where}. "
        "Fixed example shapes (no --dynamic-batch) or torch.cond for value-dependent branches may help; "
        "TorchScript (-o model.pt) is the alternative."
    )


def _describe_value(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, dict):
        keys = ", ".join(repr(k) for k in list(value)[:4])
        return f"a dict (keys {keys})"
    if isinstance(value, (tuple, list)):
        inner = {_describe_value(v) for v in value}
        return f"a {type(value).__name__} of " + (", ".join(sorted(inner)) or "nothing")
    return f"a {type(value).__name__}"


def _flatten_outputs(value, label: str) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    raise ExportError(f"{label}.forward returns {_describe_value(value)}: torch_model_forward passes tensors in "
                      "and out, so return a tensor or a tuple of tensors")


# ----------------------------------------------------------------------------------------------
# Comparison


def _compare(ref: list, got: list, rtol: float | None, atol: float | None) -> list[OutputCheck]:
    """Each output of ``got`` against ``ref``: shapes and dtypes equal, values within
    |got - ref| <= atol + rtol * |ref| (NaN where ref has NaN), as torch.testing.assert_close."""
    import torch

    checks = []
    for i, (r, g) in enumerate(zip(ref, got)):
        r = r.detach().cpu()
        g = g.detach().cpu()
        dt = dtype_name(g.dtype) if str(g.dtype).removeprefix("torch.") in _DTYPE_ALIASES else str(g.dtype)
        problem = ""
        if tuple(g.shape) != tuple(r.shape):
            problem = f"shape {list(g.shape)}, eager model gives {list(r.shape)}"
        elif g.dtype != r.dtype:
            problem = f"dtype {g.dtype}, eager model gives {r.dtype}"
        if problem:
            checks.append(OutputCheck(i, tuple(g.shape), dt, float("nan"), float("nan"), False, problem))
            continue
        default_rtol, default_atol = _TOLERANCES.get(dt, (0.0, 0.0))
        rt = default_rtol if rtol is None else rtol
        at = default_atol if atol is None else atol
        if g.numel() == 0:
            checks.append(OutputCheck(i, tuple(g.shape), dt, 0.0, 0.0, True))
            continue
        rd, gd = r.to(torch.float64), g.to(torch.float64)
        both_nan = torch.isnan(rd) & torch.isnan(gd)
        diff = torch.where(both_nan, torch.zeros_like(rd), (gd - rd).abs())
        diff = torch.where(torch.isinf(rd) & (gd == rd), torch.zeros_like(rd), diff)
        diff = torch.nan_to_num(diff, nan=float("inf"))
        rel = diff / rd.abs()
        rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
        ok = bool((diff <= at + rt * rd.abs()).all())
        checks.append(OutputCheck(i, tuple(g.shape), dt, float(diff.max()), float(rel.max()), ok,
                                  "" if ok else f"beyond rtol={rt:g}, atol={at:g}"))
    if len(got) != len(ref):
        checks.append(OutputCheck(len(checks), (), "", float("nan"), float("nan"), False,
                                  f"{len(got)} output(s), eager model gives {len(ref)}"))
    return checks


def _same(a: list, b: list) -> bool:
    """Whether two runs of the eager model agree (NaN equal to NaN)."""
    import torch

    def equal(x, y) -> bool:
        x, y = x.detach().cpu(), y.detach().cpu()
        return x.shape == y.shape and x.dtype == y.dtype and (
            torch.equal(x, y) or torch.allclose(x.double(), y.double(), rtol=0, atol=0, equal_nan=True))

    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------------------------
# Export


def _tolerance_text(rtol, atol) -> str:
    if rtol is None and atol is None:
        return ("per dtype as torch.testing.assert_close (float32: rtol 1.3e-6, atol 1e-5; float64: 1e-7, 1e-7); "
                "integers exact")
    return f"rtol {rtol if rtol is not None else 'per dtype'}, atol {atol if atol is not None else 'per dtype'}"


@contextlib.contextmanager
def _aoti_input_checks() -> Iterator[None]:
    """Make packages check their inputs' sizes, strides and dtypes (AOTInductor's generated code
    reads AOTI_RUNTIME_CHECK_INPUTS once, at a package's first run): a wrong size then raises
    instead of reading past the tensor's memory."""
    old = os.environ.get("AOTI_RUNTIME_CHECK_INPUTS")
    os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["AOTI_RUNTIME_CHECK_INPUTS"]
        else:
            os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = old


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Discard what native code writes to file descriptor 2 (AOTInductor prints its input-check
    errors there besides raising them)."""
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _error_text(exc: BaseException) -> str:
    """'Type: first line' of an exception; for an error raised inside TorchScript code, its last
    line (the original error; the first one only says the interpreter failed)."""
    if isinstance(exc, _ReportedError):
        return str(exc)
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if lines and "TorchScript interpreter" in lines[0]:
        last = lines[-1]
        return last if re.match(r"^\w+(Error|Exception):", last) else f"{type(exc).__name__}: {last}"
    return f"{type(exc).__name__}: {lines[0].rstrip(':') if lines else ''}".rstrip(": ")


def export(
    model_or_spec,
    inputs,
    torchscript: str | os.PathLike | None = None,
    pt2: str | os.PathLike | None = None,
    *,
    train_package: str | os.PathLike | None = None,
    trace: bool = False,
    dynamic_batch: bool = False,
    min_batch: int = 1,
    max_batch: int | None = None,
    check: bool = True,
    training: bool = False,
    freeze: bool = False,
    init_kwargs: dict | None = None,
    weights: str | os.PathLike | None = None,
    device: str = "cpu",
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    dtype: str | None = None,
) -> ExportReport:
    """Write a model as TorchScript (``torchscript``) and/or an AOTInductor package (``pt2``) for
    Fortran, then load each file back and compare its results with the eager model's.

    ``model_or_spec``: an ``nn.Module``, or ``"path/file.py:Name"`` / ``"package.module:Name"`` naming
    an nn.Module class or a function returning a module (called with ``init_kwargs``; ``weights``: a
    state_dict file to load). ``inputs``: one entry per tensor argument of forward, a tensor, a
    ``(shape, dtype)`` pair or a ``"8,5:float32"`` string; shapes are those of the Fortran arrays.

    ``train_package``: a training package to write (``python -m ftorch export --train FILE.pt2``): the
    forward and backward compiled by AOTInductor, the parameters and buffers as state FTorch owns;
    checked against eager autograd (outputs, gradients, updated buffers).

    ``trace``: torch.jit.trace instead of torch.jit.script. ``dynamic_batch``: dim 0 of every input of
    the .pt2 takes any size in [min_batch, max_batch] (max None: unbounded); the check then also runs
    other batch sizes. ``training``: TorchScript keeps training mode (the .pt2 is always eval).
    ``freeze``: torch.jit.freeze the TorchScript (inference only, parameters become constants).
    ``dtype``: "float32" or "float64": the model's floating-point parameters and buffers are
    converted to it, and inputs given as strings without a dtype take it (else float32).

    Returns an :class:`ExportReport`. Raises :class:`ExportError` (``UsageError`` for a bad request)
    when something cannot be exported or the check fails (its ``report`` then says what differed).
    """
    # What can be checked without torch first: a wrong command line fails fast.
    if torchscript is None and pt2 is None and train_package is None:
        raise UsageError("nothing to write: give a TorchScript file (-o model.pt), an AOTInductor package "
                         "(--pt2 model.pt2) and/or a training package (--train model_train.pt2)")
    if pt2 is not None and not str(pt2).endswith(".pt2"):
        raise UsageError(f"the AOTInductor package name must end with .pt2: {pt2}")
    if train_package is not None and not str(train_package).endswith(".pt2"):
        raise UsageError(f"the training package name must end with .pt2: {train_package}")
    if train_package is not None and pt2 is not None and Path(train_package) == Path(pt2):
        raise UsageError("the training package and the inference package (--pt2) need different files")
    if freeze and training:
        raise UsageError("--freeze is for inference: it cannot keep training mode (--train)")
    if min_batch < 1 or (max_batch is not None and max_batch < min_batch):
        raise UsageError(f"bad batch range {min_batch}..{max_batch}")
    if dtype is not None:
        if _DTYPE_ALIASES.get(dtype) not in ("float32", "float64"):
            raise UsageError(f"--dtype {dtype!r}: the model's dtype is float32 or float64")
        dtype = _DTYPE_ALIASES[dtype]
        items = [inputs] if isinstance(inputs, str) else list(inputs) if isinstance(inputs, (list, tuple)) else None
        if items is not None:
            inputs = [f"{x}:{dtype}" if isinstance(x, str) and ":" not in x else x for x in items]
    for item in [inputs] if isinstance(inputs, str) else inputs if isinstance(inputs, (list, tuple)) else []:
        if isinstance(item, str):
            parse_input(item)  # a syntax error is reported before the model is imported

    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise UsageError(f"bad device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {device}: this torch sees no CUDA device")

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        torch.manual_seed(seed)
        if isinstance(model_or_spec, torch.nn.Module):
            model, label = model_or_spec, type(model_or_spec).__name__
            if init_kwargs:
                raise UsageError("init_kwargs apply to a model given by name, not to a module instance")
            if weights is not None:
                load_weights(model, weights)
        elif isinstance(model_or_spec, str):
            model, label = load_model(model_or_spec, init_kwargs, weights)
        else:
            raise UsageError(f"model: expected an nn.Module or 'file.py:Name', got {type(model_or_spec).__name__}")
        if dtype is not None:
            model = model.to(_torch_dtype(dtype))
        name = type(model).__name__
        specs, given = _normalize_inputs(model, name, inputs)
        if dynamic_batch and any(len(s.shape) == 0 for s in specs):
            scalars = ", ".join(s.name for s in specs if not s.shape)
            raise UsageError(f"--dynamic-batch makes dim 0 of every input dynamic, but {scalars} has no dimension")
        if dynamic_batch:
            for s in specs:
                if not (min_batch <= s.shape[0] <= (max_batch if max_batch is not None else s.shape[0])):
                    raise UsageError(f"input {s.name}: example batch size {s.shape[0]} is outside "
                                     f"--min-batch {min_batch} .. --max-batch {max_batch}")
        was_training = model.training
        model = model.to(dev)
        try:
            return _export(model, name, label, specs, given, Path(torchscript) if torchscript else None,
                           Path(pt2) if pt2 else None, Path(train_package) if train_package else None, trace, dynamic_batch, min_batch, max_batch, check, training,
                           freeze, dev, rtol, atol, seed)
        finally:
            model.train(was_training)


def _export(model, name, label, specs, given, ts_path, pt2_path, train_path, trace, dynamic_batch, min_batch, max_batch,
            check, training, freeze, dev, rtol, atol, seed) -> ExportReport:
    import torch

    gen = torch.Generator().manual_seed(seed)

    def draw(batch: int | None = None) -> list:
        out = []
        for s in specs:
            shape = s.shape if batch is None else (batch, *s.shape[1:])
            out.append(random_fortran_tensor(shape, s.dtype, gen, dev))
        return out

    # The inputs: the given tensors (with Fortran strides) or a random draw; a second draw for the
    # check, so that a trace which fixed a data-dependent branch is likely to be caught.
    example = [fortran_layout(t.to(dev)) if t is not None else d for t, d in zip(given or [None] * len(specs), draw())]
    second = draw()

    def eager(mode: bool, args: list) -> list:
        model.train(mode)
        with torch.no_grad():
            # The reference: the model on ordinary (contiguous) tensors of the same values.
            out = model(*[a.contiguous() for a in args])
        return _flatten_outputs(out, name)

    try:
        ref0 = eager(training, example)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"{label}: forward fails on the example inputs "
                          f"({'; '.join(s.describe() for s in specs)}): {_error_text(exc)}"
                          f"{_user_frame(exc, None)}. Check the --input shapes and dtypes") from None
    report = ExportReport(
        model=label, inputs=specs,
        outputs=[{"shape": list(t.shape), "dtype": dtype_name(t.dtype) if str(t.dtype).removeprefix("torch.")
                  in _DTYPE_ALIASES else str(t.dtype)} for t in ref0],
        training=training, tolerance=_tolerance_text(rtol, atol),
    )
    # Other batch sizes, checked when the batch is dynamic.
    extra_batches: list[int] = []
    if dynamic_batch:
        b = specs[0].shape[0]
        hi = max_batch if max_batch is not None else 2 * b + 1
        extra_batches = sorted({n for n in (min_batch, min(2 * b + 1, hi)) if n != b})

    if ts_path is not None:
        report.torchscript = str(ts_path)
        report.torchscript_method = "trace" if trace else "script"
        _write_torchscript(model, name, label, example, ts_path, trace, training, freeze, report)
        if check:
            _check_torchscript(model, name, ts_path, training, dev, example, second, draw, extra_batches, eager,
                               rtol, atol, report)
    if pt2_path is not None:
        report.pt2 = str(pt2_path)
        if dynamic_batch:
            report.dynamic_batch = [min_batch, max_batch]
        if training and ts_path is not None:
            report.notes.append("the .pt2 package is compiled in eval mode (AOTInductor packages are for inference)")
        _write_pt2(model, name, label, specs, example, gen, dev, pt2_path, dynamic_batch, min_batch, max_batch, ref0,
                   report)
        if check:
            _check_pt2(model, name, pt2_path, example, second, draw, extra_batches, eager, rtol, atol, report)
    if train_path is not None:
        from . import _train_package

        report.train_package = str(train_path)
        if dynamic_batch:
            report.dynamic_batch = [min_batch, max_batch]
        written = _train_package.write(model, name, label, specs, example, dev, train_path, dynamic_batch, min_batch,
                                       max_batch)
        if check:
            _train_package.check(model, name, train_path, written, example, second, draw, extra_batches, rtol, atol,
                                 gen, report)
    if check and not report.ok:
        bad = [c for c in report.checks if not c.ok]
        run = next(r for r in bad[0].runs if not r.ok)
        reason = run.error or next(f"output {o.index + 1}: {o.problem}" for o in run.outputs if not o.ok)
        raise ExportError(f"check failed for {', '.join(c.path for c in bad)} ({run.label}: {reason})", report)
    return report


def _write_torchscript(model, name, label, example, path: Path, trace, training, freeze, report) -> None:
    import torch

    model.train(training)
    captured = io.StringIO()
    if trace:
        with warnings.catch_warnings(record=True) as caught, _quiet(captured):
            warnings.simplefilter("always", torch.jit.TracerWarning)
            try:
                # Traced on the inputs as Fortran passes them (column-major strides).
                module = torch.jit.trace(model, tuple(example), check_trace=False)
            except Exception as exc:
                raise ExportError(f"cannot trace {label} with torch.jit.trace: {_error_text(exc)}"
                                  f"{_user_frame(exc, None)}") from None
        seen = set()
        for w in caught:
            if issubclass(w.category, torch.jit.TracerWarning):
                text = f"trace warning at {_display_path(Path(w.filename))}:{w.lineno}: {_first_line(str(w.message))}"
                if text not in seen:
                    seen.add(text)
                    report.notes.append(text)
    else:
        try:
            with _quiet(captured):
                module = torch.jit.script(model)
        except Exception as exc:
            raise _script_error(label, exc) from None
    if freeze:
        module = torch.jit.freeze(module.eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        module.save(str(path))
    except Exception as exc:
        raise ExportError(f"cannot save {path}: {_error_text(exc)}") from None


def _run_checks(runs_spec, call, eager, mode, rtol, atol) -> list[RunCheck]:
    runs = []
    for run_label, args in runs_spec:
        ref = eager(mode, args)
        try:
            got = call(args)
            got = _flatten_outputs(got, "the loaded model")
        except Exception as exc:
            runs.append(RunCheck(run_label, [], _error_text(exc)))
            continue
        outs = _compare(ref, got, rtol, atol)
        run = RunCheck(run_label, outs)
        if not run.ok and _same(eager(mode, args), ref) is False:
            run.error = ("the eager model itself gives different results on each run (random operations, "
                         "dropout in training mode?): its results cannot be checked")
        runs.append(run)
    return runs


def _check_torchscript(model, name, path, training, dev, example, second, draw, extra_batches, eager, rtol, atol,
                       report) -> None:
    import torch

    try:
        loaded = torch.jit.load(str(path), map_location=dev)
    except Exception as exc:
        report.checks.append(FileCheck(str(path), "torchscript", "torch.jit.load",
                                       [RunCheck("load", [], _error_text(exc))]))
        return
    # torch_model_load calls eval() unless is_training=.true.; this is the saved mode.
    loaded.train(training)

    def call(args):
        # Inputs with column-major strides, passed as they are: torch_tensor_from_array does not copy.
        with torch.no_grad():
            return loaded(*args)

    runs_spec = [("example inputs", example), ("second draw", second)]
    runs_spec += [(f"batch {b}", draw(b)) for b in extra_batches]
    fc = FileCheck(str(path), "torchscript", "torch.jit.load, inputs with Fortran's column-major strides")
    fc.runs = _run_checks(runs_spec, call, eager, training, rtol, atol)
    for r in fc.runs:
        if r.error and ("view" in r.error or "contiguous" in r.error or "stride" in r.error):
            fc.note = ("the model fails on column-major inputs as Fortran passes them: use reshape instead of view, "
                       "or call .contiguous() on the inputs in forward")
    if not fc.ok and not fc.note and report.torchscript_method == "trace":
        fc.note = ("a trace records one path through Python control flow and fixes Python numbers; other inputs "
                   "may need another path" + (" (see the trace warnings)" if any(
                       n.startswith("trace warning") for n in report.notes) else "")
                   + ": script the model instead (no --trace)")
    report.checks.append(fc)


def _symbolic_shape(shape, names: dict) -> list:
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        else:
            text = str(d)
            for sym, nm in names.items():
                text = re.sub(rf"\b{re.escape(sym)}\b", nm, text)
            out.append(int(text) if text.isdigit() else text)
    return out


def _input_rules(placeholders, user_inputs, specs, in_shapes, dim_names, min_batch, max_batch) -> str | None:
    """The inputs the package takes, for FTorch's C++ layer to check each call against (in place of
    AOTInductor's generated checks, which cost more than the rest of a small forward):
    ``v1;dtype[dim,...]`` per input, a dim being a size or ``name:lo:hi`` (hi -1: no bound), e.g.
    ``v1;float32[batch:1:4096,5]``, the dtype as torch names it (``str(dtype)`` without
    ``torch.``; the C++ layer reads the names from torch's own table). None (the package's own
    checks are used) unless every input is a row-major tensor whose sizes are numbers or the
    dynamic batch."""
    import torch

    vals = [n.meta.get("val") for n in placeholders if n.name in user_inputs]
    if len(vals) != len(specs) or len(in_shapes) != len(specs):
        return None
    batch_names = set(dim_names.values())
    items = ["v1"]
    for val, spec, shape in zip(vals, specs, in_shapes):
        if not isinstance(val, torch.Tensor):
            return None
        if str(val.dtype).removeprefix("torch.") != spec.dtype:
            return None
        # The exported layout must be row-major (the C++ layer passes contiguous tensors); only
        # dim 0 may be dynamic, so every stride is a number.
        expected = 1
        for size, stride in reversed(list(zip(val.shape, val.stride()))):
            if not isinstance(stride, int) or (stride != expected and size != 1):
                return None
            expected *= size if isinstance(size, int) else 1
        dims = []
        for d in shape:
            if isinstance(d, int):
                dims.append(str(d))
            elif d in batch_names:
                dims.append(f"{d}:{min_batch}:{max_batch if max_batch is not None else -1}")
            else:
                return None
        items.append(f"{spec.dtype}[{','.join(dims)}]")
    return ";".join(items)


def _write_pt2(model, name, label, specs, example, gen, dev, path: Path, dynamic_batch, min_batch, max_batch, ref0,
               report) -> None:
    import torch
    import torch._inductor
    import torch.export

    import ftorch

    model.eval()
    # torch.export sees the inputs as the package will: contiguous (the C++ layer makes them so).
    args = [t.contiguous() for t in example]
    dynamic_shapes = None
    dim_names: dict[str, str] = {}
    if dynamic_batch:
        # torch.export specializes sizes 0 and 1: a dynamic dim needs an example size of at least 2.
        args = [torch.cat([a] * 2) if a.shape[0] == 1 else a for a in args]
        same = len({s.shape[0] for s in specs}) == 1
        kwargs = {"min": min_batch} | ({"max": max_batch} if max_batch is not None else {})
        shared = torch.export.Dim("batch", **kwargs)
        dims = [shared if same else torch.export.Dim(f"batch_{s.name}", **kwargs) for s in specs]
        dynamic_shapes = tuple({0: d} for d in dims)
    captured = io.StringIO()
    try:
        with _quiet(captured):
            program = torch.export.export(model, tuple(args), dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        raise _export_error(label, exc, dynamic_batch) from None

    # Shapes with symbols for dynamic sizes, as the package's metadata.
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    user_inputs = list(program.graph_signature.user_inputs)
    in_shapes = []
    for node in placeholders:
        if node.name in user_inputs and isinstance(node.meta.get("val"), torch.Tensor):
            shape = node.meta["val"].shape
            for d in shape:
                if not isinstance(d, int) and str(d) not in dim_names:
                    spec = specs[len(in_shapes)]
                    dim_names[str(d)] = "batch" if len({s.shape[0] for s in specs}) == 1 else f"batch_{spec.name}"
            in_shapes.append(_symbolic_shape(shape, dim_names))
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    out_vals = [v.meta.get("val") for v in out_node.args[0] if hasattr(v, "meta")]
    out_shapes = [_symbolic_shape(v.shape, dim_names) if isinstance(v, torch.Tensor) else None for v in out_vals]
    if len(out_shapes) != len(ref0):
        out_shapes = [list(t.shape) for t in ref0]
    meta = {
        "format": 1,
        "model": name,
        "ftorch_version": ftorch.__version__,
        "torch_version": torch.__version__,
        "inputs": [{"name": s.name, "shape": sh if dynamic_batch else list(s.shape), "dtype": s.dtype,
                    "example_shape": list(s.shape)} for s, sh in zip(specs, in_shapes or [None] * len(specs))],
        "outputs": [{"shape": sh if sh is not None else list(t.shape), "dtype": report.outputs[i]["dtype"]}
                    for i, (sh, t) in enumerate(zip(out_shapes, ref0))],
        "dynamic_batch": [min_batch, max_batch] if dynamic_batch else None,
        "parameters": _tensor_list(model.named_parameters()),
        "buffers": _tensor_list(model.named_buffers()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    configs: dict[str, Any] = {"aot_inductor.metadata": {"ftorch": json.dumps(meta)}}
    rules = _input_rules(placeholders, user_inputs, specs, in_shapes, dim_names, min_batch, max_batch)
    if rules is not None:
        configs["aot_inductor.metadata"]["ftorch_inputs"] = rules
    if dynamic_batch and min_batch < 2:
        # The compiled code's batch symbol has the range [2, max] (torch.export's 0/1 specialization),
        # so the package's input checks would refuse batch 1; the check below runs batch 1 instead.
        configs["aot_inductor.check_lowerbound"] = False
    try:
        with _quiet(captured):
            torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
    except Exception as exc:
        hint = ""
        if "compiler" in str(exc).lower() or isinstance(exc, (FileNotFoundError, OSError)):
            hint = " (AOTInductor needs a C++ compiler, g++ or clang++, at export time)"
        raise ExportError(f"AOTInductor compilation of {label} failed: {_error_text(exc)}{hint}") from None


def package_input(t):
    """An input as FTorch's C++ layer passes it to a package: ``.contiguous()`` (AOTInductor's code
    assumes the row-major strides the model was exported with, so a Fortran array's column-major
    tensor is copied). A size-1 dim's stride is arbitrary in a contiguous tensor (a Fortran x(1, 5)
    keeps strides (1, 1)) but the package's input check compares it too: view such a tensor with
    the canonical strides, the same memory."""
    t = t.contiguous()
    canonical, step = [], 1
    for n in reversed(t.shape):
        canonical.append(step)
        step *= max(n, 1)
    canonical.reverse()
    if list(t.stride()) != canonical:
        t = t.as_strided(t.shape, canonical, t.storage_offset())
    return t


def _tensor_list(named) -> list[dict]:
    return [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
             "requires_grad": bool(t.requires_grad)} for n, t in named]


class _ReportedError(Exception):
    """A failure already described (by the checking child process): reported as it is."""


def _pt2_child() -> None:
    """The child process of a .pt2 check: ``python -c ... IN OUT``. Loads the package named in IN,
    runs it on each set of inputs there, and rewrites OUT after each step, so that a crash (a signal
    inside AOTInductor's loader or the compiled code) leaves the parent what was done before it."""
    import torch
    import torch._inductor

    src, dst = sys.argv[1], sys.argv[2]
    job = torch.load(src, weights_only=False)
    done: dict = {"load_error": None, "results": []}

    def save():
        tmp = dst + ".tmp"
        torch.save(done, tmp)
        os.replace(tmp, dst)

    if os.environ.get("_FTORCH_TEST_CRASH_PT2_CHECK") == "1":  # fault injection for the test suite
        os.abort()
    with _aoti_input_checks(), _quiet_native_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = job.get("models") or [None] * len(job["runs"])
        packages = {}
        try:
            for model_name in dict.fromkeys(models):
                if model_name is None:
                    packages[None] = torch._inductor.aoti_load_package(job["path"])
                else:
                    from torch._inductor.package import load_package

                    packages[model_name] = load_package(job["path"], model_name)
        except Exception as exc:
            done["load_error"] = _error_text(exc)
            save()
            return
        save()
        for model_name, args in zip(models, job["runs"]):
            try:
                with torch.no_grad():
                    out = packages[model_name](*args)
                done["results"].append({"outputs": _flatten_outputs(out, "the loaded model")})
            except Exception as exc:
                done["results"].append({"error": _error_text(exc)})
            save()


def _run_pt2_in_child(path, inputs: list, models: list | None = None) -> tuple[str | None, list]:
    """Load and run a package in a child process: (load error, one result per input set), where a
    result is {"outputs": [...]} or {"error": text}. A crash of the child is reported, not shared."""
    import signal
    import subprocess
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "job.pt"), os.path.join(d, "done.pt")
        torch.save({"path": str(path), "runs": inputs, "models": models}, src)
        code = "from ftorch._export import _pt2_child; _pt2_child()"
        try:
            proc = subprocess.run([sys.executable, "-c", code, src, dst], capture_output=True, text=True,
                                  errors="replace", timeout=1800)
            returncode, detail = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            returncode, detail = None, "timed out after 1800 s"
        done = torch.load(dst, weights_only=False) if os.path.exists(dst) else None
    if returncode != 0:
        if returncode is None:
            why = detail
        elif returncode < 0:
            why = f"killed by signal {signal.Signals(-returncode).name}"
        else:
            why = f"exit status {returncode}" + (f": {detail}" if detail else "")
        crash = f"the checking process crashed ({why})"
        if done is None:
            return f"{crash} before the package was loaded", []
        results = done["results"] + [{"error": f"{crash} on these inputs"}]
        results += [{"error": "not run: " + crash}] * (len(inputs) - len(results))
        return done["load_error"], results
    return done["load_error"], done["results"]


def _check_pt2(model, name, path, example, second, draw, extra_batches, eager, rtol, atol, report) -> None:
    fc = FileCheck(str(path), "pt2", "aoti_load_package in a child process, inputs made contiguous as the C++ "
                                     "layer does")
    # Compiled code may differ from eager by a few ulps: Inductor fuses operations and may sum
    # in another order (vectorized or blocked reductions), so floating-point rounding differs.
    runs_spec = [("example inputs", example), ("second draw", second)]
    runs_spec += [(f"batch {b}", draw(b)) for b in extra_batches]
    # Loading and running happen in another process: a crash inside AOTInductor (seen with some
    # torch builds) fails the check with its reason instead of taking the export down with it.
    load_error, results = _run_pt2_in_child(path, [[package_input(a) for a in args] for _, args in runs_spec])
    if load_error is not None:
        fc.runs.append(RunCheck("load", [], load_error))
        report.checks.append(fc)
        return
    pending = iter(results)

    def call(args):
        result = next(pending)
        if "error" in result:
            raise _ReportedError(result["error"])
        return result["outputs"]

    fc.runs = _run_checks(runs_spec, call, eager, False, rtol, atol)
    if any(r.label == "batch 1" and not r.ok for r in fc.runs):
        fc.note = ("batch size 1 fails (torch.export traces assuming sizes >= 2, so code such as squeeze() or "
                   "broadcasting over the batch may behave differently): export with --min-batch 2")
    report.checks.append(fc)
