"""What a Fortran programmer needs to call a model: ``python -m ftorch inspect MODEL``.

Reads a TorchScript file (``torch.jit.save``) or an AOTInductor package (``.pt2``): forward's
inputs and outputs, parameters and buffers, training mode, and a Fortran snippet that calls it.
torch is imported inside the functions.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Sequence

from ._export_errors import ExportError, UsageError, _error_text
from ._export_pt2 import _aoti_input_checks, _tensor_list, package_input
from ._export_values import _normalize_inputs, random_fortran_tensor

_FORTRAN_KINDS = {
    "float32": ("real", "real32"), "float64": ("real", "real64"),
    "int8": ("integer", "int8"), "int16": ("integer", "int16"),
    "int32": ("integer", "int32"), "int64": ("integer", "int64"),
}
_CHECKPOINT_FORMAT = "ftorch-checkpoint-1"  # the "format" entry of a checkpoint (src/cpp/internal.hpp)
_RESERVED = {"model", "inputs", "outputs", "args", "results", "torch", "ftorch", "nbatch"}


def _archive_kind(path: Path) -> str:
    """'torchscript' or 'pt2'; a UsageError saying what the file is otherwise."""
    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory, not a model file")
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except zipfile.BadZipFile:
        raise UsageError(f"{path} is not a TorchScript model or an AOTInductor package (.pt2): "
                         "not a zip archive") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    base = {n.rsplit("/", 1)[-1] for n in names}
    if "archive_format" in base:
        if any("/aotinductor/" in f"/{n}" for n in names):
            return "pt2"
        raise UsageError(f"{path} is a PT2 archive without an AOTInductor model (an ExportedProgram from "
                         "torch.export.save?): compile one with `python -m ftorch export ... --pt2 FILE.pt2` "
                         "or torch._inductor.aoti_compile_and_package")
    if "constants.pkl" in base and any(re.search(r"(^|/)code/", n) for n in names):
        return "torchscript"
    if "data.pkl" in base:
        raise UsageError(f"{path} is a torch.save file (a state_dict or pickled object), not a TorchScript model: "
                         "write one with `python -m ftorch export file.py:Model --weights "
                         f"{path.name} --input ... -o model.pt`")
    raise UsageError(f"{path} is not a TorchScript model or an AOTInductor package (.pt2)")


def _tree_leaves(spec_json: str) -> int | None:
    """Leaves of a serialized pytree spec (AOTInductor's call spec), None if unreadable."""
    try:
        _, tree = json.loads(spec_json)
    except (ValueError, TypeError):
        return None

    def count(node) -> int:
        if node.get("type") is None:
            return 1
        return sum(count(c) for c in node.get("children_spec", []))

    if tree.get("type") == "builtins.tuple" and len(tree.get("children_spec", [])) == 2:
        args = tree["children_spec"][0]  # (args, kwargs)
        return count(args)
    return count(tree)


def _run_outputs(call, specs, device) -> list[dict]:
    import torch

    gen = torch.Generator().manual_seed(0)
    args = [random_fortran_tensor(s.shape, s.dtype, gen, device) for s in specs]
    with torch.no_grad():
        out = call(args)
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not all(isinstance(t, torch.Tensor) for t in outs):
        raise ExportError(f"forward returns {type(out).__name__}, not a tensor or a tuple of tensors")
    return [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in outs]


def inspect_model(path: str | Path, inputs: Sequence | None = None, device: str = "cpu") -> dict:
    """Describe a TorchScript model or an AOTInductor package as a dict (see ``format_inspection``).

    ``inputs``: shapes and dtypes of forward's tensors (as for ``ftorch.export``); the model then runs
    once on random inputs laid out as Fortran passes them and the outputs' shapes are reported.
    """
    path = Path(path)
    kind = _archive_kind(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "torchscript":
            info = _inspect_torchscript(path, inputs, device)
        else:
            from ._train_package import read_meta

            train = read_meta(path)
            info = _inspect_pt2(path, inputs) if train is None else _inspect_train_package(path, train, inputs)
    info["fortran"] = fortran_snippet(info)
    return info


def _inspect_torchscript(path: Path, inputs, device) -> dict:
    import torch

    try:
        model = torch.jit.load(str(path), map_location=device)
    except Exception as exc:
        raise ExportError(f"cannot load {path} with torch.jit.load: {_error_text(exc)}") from None
    if getattr(model, "format", None) == _CHECKPOINT_FORMAT:
        steps = getattr(model, "step", None)
        raise UsageError(f"{path} is an FTorch checkpoint (torch_checkpoint_save, step {steps}), not a model: "
                         "inspect the model's TorchScript file; torch_checkpoint_load loads the checkpoint into it")
    info: dict[str, Any] = {"file": str(path), "format": "torchscript", "class": model.original_name,
                            "device": device, "training": bool(model.training)}
    info["modules_in_other_mode"] = [n for n, m in model.named_modules() if n and m.training != model.training]
    try:
        schema = model.forward.schema
    except (AttributeError, RuntimeError):
        raise UsageError(f"{path}: the TorchScript module has no forward method") from None
    args = schema.arguments[1:]
    info["inputs"] = [{"name": a.name, "type": str(a.type),
                       "default": repr(a.default_value) if a.has_default_value() else None} for a in args]
    ret = schema.returns[0].type if schema.returns else None
    info["returns"] = str(ret) if ret is not None else "None"
    if isinstance(ret, torch._C.TupleType):
        info["outputs"] = [{"type": str(t)} for t in ret.elements()]
    elif ret is not None and str(ret) != "NoneType":
        info["outputs"] = [{"type": str(ret)}]
    else:
        info["outputs"] = []
    info["signature"] = (f"forward({', '.join(f'{a.name}: {a.type}' for a in args)}) -> {info['returns']}")
    info["parameters"] = _tensor_list(model.named_parameters())
    info["buffers"] = _tensor_list(model.named_buffers())
    info["parameter_count"] = sum(p.numel() for p in model.parameters())
    info["outputs_from_run"] = False
    if inputs:
        specs, _ = _normalize_inputs(_SchemaModel(args), info["class"], inputs)
        for spec, entry in zip(specs, info["inputs"]):
            entry["shape"], entry["dtype"] = list(spec.shape), spec.dtype
        was = model.training
        model.eval()  # as torch_model_load leaves it by default
        try:
            info["outputs"] = _run_outputs(lambda a: model(*a), specs, device)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"forward fails on the given inputs: {_error_text(exc)}") from None
        finally:
            model.train(was)
        info["outputs_from_run"] = True
    return info


class _SchemaModel:
    """Stands for a loaded model in _normalize_inputs: forward's parameters from its schema."""

    def __init__(self, args):
        import inspect

        params = [inspect.Parameter(a.name if a.name.isidentifier() else f"arg{i}",
                                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=None if a.has_default_value() else inspect.Parameter.empty)
                  for i, a in enumerate(args)]
        sig = inspect.Signature(params)

        def forward(*a):
            return None

        forward.__signature__ = sig  # type: ignore[attr-defined]
        self.forward = forward


def _inspect_pt2(path: Path, inputs) -> dict:
    import torch
    import torch._inductor

    try:
        package = torch._inductor.aoti_load_package(str(path))
    except Exception as exc:
        raise ExportError(f"cannot load {path} with aoti_load_package: {_error_text(exc)}") from None
    meta = dict(package.get_metadata())
    ours = None
    if "ftorch" in meta:
        try:
            ours = json.loads(meta.pop("ftorch"))
        except ValueError:
            ours = None
    device = meta.get("AOTI_DEVICE_KEY", "cpu") or "cpu"
    info: dict[str, Any] = {"file": str(path), "format": "pt2", "class": (ours or {}).get("model"),
                            "device": device, "training": None, "modules_in_other_mode": []}
    in_spec, out_spec = (package.loader.get_call_spec() + [None, None])[:2]
    n_in, n_out = _tree_leaves(in_spec or ""), _tree_leaves(out_spec or "")
    if ours:
        info["inputs"] = [{"name": i["name"], "type": "Tensor", "shape": i["shape"], "dtype": i["dtype"],
                           "example_shape": i.get("example_shape")} for i in ours["inputs"]]
        info["outputs"] = [{"type": "Tensor", "shape": o["shape"], "dtype": o["dtype"]} for o in ours["outputs"]]
        info["dynamic_batch"] = ours.get("dynamic_batch")
        info["parameters"] = ours.get("parameters", [])
        info["buffers"] = ours.get("buffers", [])
        info["exported_with"] = {"ftorch": ours.get("ftorch_version"), "torch": ours.get("torch_version")}
    else:
        info["inputs"] = [{"name": f"input{i + 1}", "type": "Tensor"} for i in range(n_in or 0)]
        info["outputs"] = [{"type": "Tensor"} for _ in range(n_out or 0)]
        info["dynamic_batch"] = None
        info["parameters"] = [{"name": n} for n in package.get_constant_fqns()]
        info["buffers"] = []
    counted = [p for p in info["parameters"] if "shape" in p]
    info["parameter_count"] = (sum(_numel(p["shape"]) for p in counted) if counted or not info["parameters"]
                               else None)
    info["returns"] = ("Tensor" if len(info["outputs"]) == 1 else
                       f"Tuple[{', '.join('Tensor' for _ in info['outputs'])}]")
    info["signature"] = (f"forward({', '.join(i['name'] + ': Tensor' for i in info['inputs'])}) -> "
                         f"{info['returns']}")
    info["metadata"] = meta
    info["outputs_from_run"] = False
    if inputs:
        specs, _ = _normalize_inputs(_SchemaModel(_named_args(info["inputs"])), info["class"] or "model", inputs)
        for spec, entry in zip(specs, info["inputs"]):
            entry["shape"], entry["dtype"] = list(spec.shape), spec.dtype
        with _aoti_input_checks():
            try:
                # Contiguous, as FTorch's C++ layer passes inputs to a package.
                info["outputs"] = _run_outputs(lambda a: package(*[package_input(t) for t in a]), specs, device)
            except ExportError:
                raise
            except Exception as exc:
                raise ExportError(f"the package rejects or fails on the given inputs: {_error_text(exc)}") from None
        info["outputs_from_run"] = True
    return info


def _named_args(entries):
    """Objects like a schema's arguments (name, has_default_value) for the package's inputs."""

    class Arg:
        def __init__(self, name):
            self.name = name

        def has_default_value(self):
            return False

    return [Arg(e["name"]) for e in entries]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 1
    return n


# ----------------------------------------------------------------------------------------------
# Text


def _fortran_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "x"
    if not base[0].isalpha():
        base = "x" + base
    if base.lower() in _RESERVED:
        base = base + "_in"
    out, k = base, 2
    while out.lower() in taken:
        out, k = f"{base}{k}", k + 1
    taken.add(out.lower())
    return out


def _fortran_dims(shape, dynamic: bool) -> str:
    dims = []
    for d in shape:
        if isinstance(d, int):
            dims.append(str(d))
        else:
            dims.append(re.sub(r"\bbatch(_\w+)?\b", lambda m: "n" + m.group(0), str(d)))
    return ", ".join(dims)


def fortran_snippet(info: dict) -> str:
    """Declarations and calls that run the model on Fortran arrays (FTorch's API)."""
    taken: set[str] = set()
    kinds: set[str] = set()
    decls, calls, notes = [], [], []
    dynamic = bool(info.get("dynamic_batch"))
    sizes: dict[str, int] = {}

    # Without recorded dtypes, the arrays take the dtype of the model's floating-point parameters.
    param_dtypes = [p.get("dtype") for p in info.get("parameters", []) if p.get("dtype") in ("float32", "float64")]
    guess = param_dtypes[0] if param_dtypes else "float32"

    def declare(name: str, entry: dict, what: str) -> None:
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if dtype is None or shape is None:
            decls.append(f"! {what} {name}: {entry.get('type', 'Tensor')}, shape and dtype not recorded "
                         f"(give --input to inspect; {guess} is the parameters' dtype)")
            ftype, kind = _FORTRAN_KINDS[guess]
            decls.append(f"{ftype}({kind}), target :: {name}(...)")
            kinds.add(kind)
            return
        for d, ex in zip(shape, entry.get("example_shape") or shape):
            if not isinstance(d, int):
                sizes.setdefault("n" + str(d), ex if isinstance(ex, int) else 8)
        if not shape:
            notes.append(f"! {what} {name} is a 0-d tensor: Fortran arrays have rank >= 1, so pass an array "
                         "of size 1 and reshape it in the model")
        if dtype in _FORTRAN_KINDS:
            ftype, kind = _FORTRAN_KINDS[dtype]
            kinds.add(kind)
            dims = f"({_fortran_dims(shape, dynamic)})" if shape else ""
            decls.append(f"{ftype}({kind}), target :: {name}{dims}".ljust(40) + f" ! {what}, {dtype}")
        else:
            decls.append(f"! {what} {name}: {dtype} has no Fortran array kind in FTorch; convert it in the model")

    in_names = []
    for k, entry in enumerate(info["inputs"]):
        if entry.get("type", "Tensor") not in ("Tensor", "Optional[Tensor]"):
            notes.append(f"! forward's argument {entry['name']} is a {entry['type']}: pass it in a torch_arglist "
                         "(torch_arglist_add) with torch_model_forward(model, args, outputs)")
            continue
        name = _fortran_name(entry["name"], taken)
        in_names.append(name)
        declare(name, entry, f"input {k + 1}")
    outs = info.get("outputs") or []
    out_names = []
    for k, entry in enumerate(outs):
        name = _fortran_name("out" if len(outs) == 1 else f"out{k + 1}", taken)
        out_names.append(name)
        if entry.get("type", "Tensor") not in ("Tensor",) and "shape" not in entry:
            notes.append(f"! output {k + 1} is a {entry['type']}: receive it in a torch_arglist "
                         "(torch_model_forward(model, args, results))")
        declare(name, entry, f"output {k + 1}")
    device = "torch_kCUDA" if str(info.get("device", "cpu")).startswith("cuda") else "torch_kCPU"
    load_args = f'model, "{Path(info["file"]).name}", {device}'
    if info.get("training"):
        notes.append("! saved in training mode: torch_model_load switches it to eval() for inference "
                     "(is_training=.true. keeps it training)")
    lines = ["use, intrinsic :: iso_fortran_env, only: " + ", ".join(sorted(kinds or {"real32"})), "use ftorch"]
    for size, example in sizes.items():
        lo = (info.get("dynamic_batch") or [1])[0]
        lines.append(f"integer, parameter :: {size} = {example}".ljust(40) + f" ! any size >= {lo}")
    lines += decls
    lines.append("type(torch_model) :: model")
    lines.append(f"type(torch_tensor) :: inputs({max(len(in_names), 1)}), outputs({max(len(out_names), 1)})")
    lines.append("")
    lines.append(f"call torch_model_load({load_args})")
    for k, name in enumerate(in_names):
        calls.append(f"call torch_tensor_from_array(inputs({k + 1}), {name}, {device})")
    for k, name in enumerate(out_names):
        calls.append(f"call torch_tensor_from_array(outputs({k + 1}), {name}, {device})")
    lines += calls
    lines.append("call torch_model_forward(model, inputs, outputs)".ljust(40) + " ! results land in the output arrays")
    lines.append("call torch_delete(inputs)")
    lines.append("call torch_delete(outputs)")
    lines.append("call torch_model_delete(model)")
    return "\n".join(notes + lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _inspect_train_package(path: Path, meta: dict, inputs) -> dict:
    """A training package, from the record its exporter wrote (nothing is loaded or run)."""
    if inputs:
        raise UsageError(f"{path} is a training package: its inputs' shapes are recorded (shown without --input); "
                         "--input runs TorchScript models and inference packages")
    info: dict[str, Any] = {"file": str(path), "format": "train", "class": meta.get("model"),
                            "device": meta.get("device", "cpu"), "training": True, "modules_in_other_mode": []}
    info["inputs"] = [{"name": i["name"], "type": "Tensor", "shape": i["shape"], "dtype": i["dtype"]}
                      for i in meta["inputs"]]
    info["outputs"] = [{"type": "Tensor", "shape": o["shape"], "dtype": o["dtype"]} for o in meta["outputs"]]
    info["dynamic_batch"] = meta.get("dynamic_batch")
    info["parameters"] = meta.get("parameters", [])
    info["buffers"] = meta.get("buffers", [])
    info["parameter_count"] = sum(_numel(p["shape"]) for p in info["parameters"])
    info["exported_with"] = {"ftorch": meta.get("ftorch_version"), "torch": meta.get("torch_version")}
    info["eval_mode"] = ("the training-mode code (the model computes the same in both modes)"
                         if meta.get("eval") == "forward" else
                         "its own compiled forward" + (", with its own backward" if meta.get("eval_backward") else
                                                       " (no gradients in eval mode: exported by an earlier FTorch)"))
    info["inference_model"] = bool(meta.get("infer"))
    info["compiled_step"] = meta.get("step")
    info["random_values"] = meta.get("random_values", 0)
    info["returns"] = ("Tensor" if len(info["outputs"]) == 1 else
                       f"Tuple[{', '.join('Tensor' for _ in info['outputs'])}]")
    info["signature"] = (f"forward({', '.join(i['name'] + ': Tensor' for i in info['inputs'])}) -> "
                         f"{info['returns']}")
    info["outputs_from_run"] = False
    return info


def format_inspection(info: dict) -> str:
    kind = {"torchscript": "TorchScript", "pt2": "AOTInductor package",
            "train": "training package"}[info["format"]]
    out = [f"file: {info['file']} ({kind}" + (f", class {info['class']}" if info.get("class") else "") + ")"]
    if info["format"] == "torchscript":
        mode = "training" if info["training"] else "eval"
        out.append(f"mode: saved in {mode} mode (torch_model_load calls eval() unless is_training=.true.)")
        if info["modules_in_other_mode"]:
            out.append(f"  submodules in the other mode: {', '.join(info['modules_in_other_mode'])}")
    elif info["format"] == "train":
        out.append(f"mode: trainable (forward and backward compiled by AOTInductor, parameters and buffers held by "
                   f"FTorch); device {info['device']}")
        out.append(f"  eval mode runs {info['eval_mode']}")
        if info.get("inference_model"):
            out.append("  forwards without gradients run the inference model (it reads the parameters in place)")
        if info.get("compiled_step"):
            out.append("  torch_train_step with MSE and Adam/AdamW runs the compiled training step")
        if info.get("random_values"):
            out.append("  training mode draws random numbers (dropout): torch_manual_seed sets them")
        if info.get("dynamic_batch"):
            lo, hi = info["dynamic_batch"]
            out.append(f"batch: dim 0 of every input may be {lo}..{hi if hi is not None else 'any'} "
                       "(other dims fixed)")
        else:
            out.append("batch: fixed (the package takes only the shapes below)")
    else:
        out.append(f"mode: inference (compiled in eval mode); device {info['device']}")
        if info.get("dynamic_batch"):
            lo, hi = info["dynamic_batch"]
            out.append(f"batch: dim 0 of every input may be {lo}..{hi if hi is not None else 'any'} "
                       "(other dims fixed)")
        elif info.get("class"):
            out.append("batch: fixed (the package takes only the shapes below)")
    out.append(f"signature: {info['signature']}")
    out.append("inputs:")
    for k, entry in enumerate(info["inputs"]):
        text = f"  {k + 1} {entry['name']}: {entry.get('type', 'Tensor')}"
        if "shape" in entry:
            text += f" {_shape_text(entry['shape'])} {entry['dtype']}"
        if entry.get("default") is not None:
            text += f" = {entry['default']}"
        out.append(text)
    if not info["inputs"]:
        out.append("  none")
    src = " (from a run on the given inputs)" if info.get("outputs_from_run") else ""
    out.append(f"outputs{src}:")
    for k, entry in enumerate(info["outputs"]):
        text = f"  {k + 1}: " + (f"{_shape_text(entry['shape'])} {entry['dtype']}" if "shape" in entry
                                 else entry.get("type", "Tensor"))
        out.append(text)
    if not info["outputs"]:
        out.append("  none")
    elif not any("shape" in e for e in info["outputs"]):
        out.append("  (shapes: give --input SHAPE[:DTYPE] for each input to run the model once)")
    count = info.get("parameter_count")
    out.append(f"parameters: {_count(len(info['parameters']), 'tensor')}"
               + (f", {_count(count, 'value')}" if count is not None else ""))
    for p in info["parameters"]:
        if "shape" in p:
            grad = ("compiled in" if info["format"] == "pt2" else
                    "requires_grad" if p.get("requires_grad") else "no grad")
            if info["format"] == "train":
                grad = "trainable" if p.get("requires_grad") else "frozen"
            out.append(f"  {p['name']:<28} {_shape_text(p['shape']):<12} {p['dtype']:<8} {grad}")
        else:
            out.append(f"  {p['name']}")
    out.append(f"buffers: {_count(len(info['buffers']), 'tensor')}")
    for b in info["buffers"]:
        out.append(f"  {b['name']:<28} {_shape_text(b['shape']):<12} {b['dtype']}")
    out.append("Fortran:")
    out += ["  " + ln if ln else "" for ln in info["fortran"].splitlines()]
    return "\n".join(out)
