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

import copy

import os
import warnings
from pathlib import Path

from ._discovery import load_model, load_weights
from ._export_errors import _error_text, ExportError, UsageError, _user_frame
from ._export_pt2 import _check_pt2, _write_pt2
from ._export_report import ExportReport
from ._export_torchscript import _check_torchscript, _write_torchscript
from ._export_values import _DTYPE_ALIASES, dtype_name, _flatten_outputs, fortran_layout, _normalize_inputs, parse_input, random_fortran_tensor, _tolerance_text, _torch_dtype


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
    if not dynamic_batch and (min_batch != 1 or max_batch is not None):
        raise UsageError("--min-batch and --max-batch bound the batch of --dynamic-batch, which is not given (without "
                         "it every input keeps its example shape)")
    if torchscript is None:
        # (options of the TorchScript file only: without one they would change nothing)
        for flag, given in (("--trace", trace), ("--freeze", freeze), ("--train without a file", training)):
            if given:
                raise UsageError(f"{flag} applies to the TorchScript file (-o FILE.pt), which is not asked for")
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
        elif isinstance(model_or_spec, str):
            model, label = load_model(model_or_spec, init_kwargs, None)
        else:
            raise UsageError(f"model: expected an nn.Module or 'file.py:Name', got {type(model_or_spec).__name__}")
        if model is model_or_spec and _converts(model, dtype, dev):
            # The caller's module stays as it is: converted is a copy of it.
            try:
                model = copy.deepcopy(model)
            except Exception as exc:
                raise UsageError(f"--dtype/--device convert a copy of the model, but it cannot be copied "
                                 f"(copy.deepcopy: {exc}); convert it yourself before exporting") from None
        if dtype is not None:
            model = model.to(_torch_dtype(dtype))
        if weights is not None:  # after the dtype: float64 weights are not rounded through float32
            load_weights(model, weights)
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
        modes = [(m, m.training) for m in model.modules()]
        model = model.to(dev)
        try:
            return _export(model, name, label, specs, given, Path(torchscript) if torchscript else None,
                           Path(pt2) if pt2 else None, Path(train_package) if train_package else None, trace, dynamic_batch, min_batch, max_batch, check, training,
                           freeze, dev, rtol, atol, seed)
        finally:
            for m, mode in modes:  # the caller's modes, module by module
                m.training = mode


def _converts(model, dtype, dev) -> bool:
    """Whether model.to(dtype) or model.to(dev) would change the model."""
    tensors = list(model.parameters()) + list(model.buffers())
    if any(t.device != dev for t in tensors):
        return True
    return dtype is not None and any(t.is_floating_point() and t.dtype != _torch_dtype(dtype) for t in tensors)


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

    # A forward in training mode updates buffers even without gradients (BatchNorm's running
    # statistics, in place, or a buffer the forward assigns anew): the files are written from the
    # model's own buffers, and the caller gets them back, the same tensors with the same values,
    # whatever the reference runs did to them.
    kept = [(m, n, b, b.detach().clone()) for m in model.modules() for n, b in m._buffers.items() if b is not None]

    def restore_buffers() -> None:
        with torch.no_grad():
            for m, n, b, value in kept:
                m._buffers[n] = b
                b.copy_(value)

    def eager(mode: bool, args: list) -> list:
        model.train(mode)
        with torch.no_grad():
            # The reference: the model on ordinary (contiguous) tensors of the same values.
            out = model(*[a.contiguous() for a in args])
        return _flatten_outputs(out, name)

    try:
        return _export_files(model, name, label, specs, ts_path, pt2_path, train_path, trace, dynamic_batch,
                             min_batch, max_batch, check, training, freeze, dev, rtol, atol, gen, draw, example,
                             second, eager, restore_buffers)
    finally:
        restore_buffers()


def _export_files(model, name, label, specs, ts_path, pt2_path, train_path, trace, dynamic_batch, min_batch,
                  max_batch, check, training, freeze, dev, rtol, atol, gen, draw, example, second, eager,
                  restore_buffers) -> ExportReport:
    try:
        ref0 = eager(training, example)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"{label}: forward fails on the example inputs "
                          f"({'; '.join(s.describe() for s in specs)}): {_error_text(exc)}"
                          f"{_user_frame(exc, None)}. Check the --input shapes and dtypes") from None
    restore_buffers()
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
        _write_torchscript(model, name, label, example, ts_path, trace, training, freeze, report,
                           before_save=restore_buffers)
        if check:
            _check_torchscript(model, name, ts_path, training, dev, example, second, draw, extra_batches, eager,
                               rtol, atol, report)
    if pt2_path is not None:
        restore_buffers()
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

        restore_buffers()
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
