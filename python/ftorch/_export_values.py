"""Inputs and outputs of an export: dtype names, input specifications, arrays laid out as Fortran
passes them, the outputs of a model as a flat list.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import dataclasses
import inspect as pyinspect
import re
from typing import Any, Sequence

from ._export_errors import ExportError, UsageError


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


def _tolerance_text(rtol, atol) -> str:
    if rtol is None and atol is None:
        return ("per dtype as torch.testing.assert_close (float32: rtol 1.3e-6, atol 1e-5; float64: 1e-7, 1e-7); "
                "integers exact")
    return f"rtol {rtol if rtol is not None else 'per dtype'}, atol {atol if atol is not None else 'per dtype'}"
