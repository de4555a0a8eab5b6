"""Writing a model as TorchScript (``torch.jit.script`` or ``torch.jit.trace``) and checking the file.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

from ._export_errors import _display_path, _error_text, ExportError, _first_line, _quiet, _script_error, _user_frame
from ._export_report import FileCheck, _run_checks, RunCheck


def _write_torchscript(model, name, label, example, path: Path, trace, training, freeze, report,
                       before_save=None) -> None:
    """before_save runs between making the module (a trace runs the forward, which may update
    buffers: the module shares them with the model) and saving it."""
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
    if before_save is not None:
        before_save()
    if freeze:
        module = torch.jit.freeze(module.eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        module.save(str(path))
    except Exception as exc:
        raise ExportError(f"cannot save {path}: {_error_text(exc)}") from None


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
