"""What an export says when it fails: its exceptions and the texts that point at the user's code.

torch is imported inside the functions, so that ``import ftorch`` stays fast.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from ._export_report import ExportReport


class ExportError(Exception):
    """Export or check failed (exit code 1). ``report`` holds what was done, if anything."""

    exit_code = 1

    def __init__(self, message: str, report: "ExportReport | None" = None):
        super().__init__(message)
        self.report = report


class UsageError(ExportError):
    """The request itself is wrong: a file, name, input shape or option (exit code 2)."""

    exit_code = 2


class _ReportedError(Exception):
    """A failure already described (by the checking child process): reported as it is."""


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
