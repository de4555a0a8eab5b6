"""What an export did and checked: the report that ``python -m ftorch export`` prints and
``ftorch.export`` returns, and the runs of a written file compared with the eager model's.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import dataclasses

from ._export_errors import _error_text
from ._export_values import _DTYPE_ALIASES, dtype_name, _flatten_outputs, InputSpec, _TOLERANCES


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
        batch = ""
        if self.dynamic_batch:
            lo, hi = self.dynamic_batch
            batch = f", dynamic batch {lo}..{hi if hi is not None else 'any'}"
        if self.pt2:
            out.append(f"wrote {self.pt2} (AOTInductor package, eval mode{batch})")
        if self.train_package:
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
        if not (g.is_floating_point() or g.is_complex()):
            rt, at = 0.0, 0.0  # integers and booleans exactly, whatever tolerance was given
        if g.is_complex():  # real and imaginary parts, each within the tolerance
            r, g = torch.view_as_real(r.resolve_conj()), torch.view_as_real(g.resolve_conj())
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
        # (an infinite reference allows nothing but itself: its bound atol + rtol * inf would allow anything)
        bound = torch.where(torch.isinf(rd), torch.zeros_like(rd), at + rt * rd.abs())
        ok = bool((diff <= bound).all())
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
