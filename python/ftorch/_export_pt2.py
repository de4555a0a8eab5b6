"""Writing a model as an AOTInductor package (``torch.export.export`` then
``torch._inductor.aoti_compile_and_package``) and checking it in a child process.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

from ._export_errors import _error_text, _export_error, ExportError, _quiet, _ReportedError
from ._export_report import FileCheck, _run_checks, RunCheck
from ._export_values import _flatten_outputs


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
                    constants = (job.get("constants") or {}).get(model_name)
                    if constants:  # a model whose constants are not stored in it (those it reads)
                        used = set(packages[model_name].get_constant_fqns())
                        packages[model_name].load_constants({k: v for k, v in constants.items() if k in used},
                                                            check_full_update=False)
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


def _run_pt2_in_child(path, inputs: list, models: list | None = None,
                      constants: dict | None = None) -> tuple[str | None, list]:
    """Load and run a package in a child process: (load error, one result per input set), where a
    result is {"outputs": [...]} or {"error": text}. A crash of the child is reported, not shared.
    ``constants``: per model name, the constants to load into it first ({name: tensor})."""
    import signal
    import subprocess
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "job.pt"), os.path.join(d, "done.pt")
        torch.save({"path": str(path), "runs": inputs, "models": models, "constants": constants}, src)
        code = "from ftorch._export_pt2 import _pt2_child; _pt2_child()"
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
