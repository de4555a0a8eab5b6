"""The API reference: tools/build_docs.py builds it with FORD from the sources (fypp templates
preprocessed) and its check fails on any undocumented public entity or argument.

Needs only Python with fypp and FORD (no build of FTorch, no compiler): skipped where FORD is not
installed, except in CI, where tools/quickstart.sh installs it.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import IN_CI

REPO = Path(__file__).resolve().parent.parent
BUILD_DOCS = REPO / "tools" / "build_docs.py"

if importlib.util.find_spec("ford") is None:
    if IN_CI:
        pytest.fail("FORD is required in CI (tools/quickstart.sh installs it)", pytrace=False)
    pytest.skip("FORD is not installed (pip install ford)", allow_module_level=True)


def build_docs(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BUILD_DOCS, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          errors="replace", timeout=600)


def test_api_reference_is_complete(tmp_path):
    out = tmp_path / "api"
    proc = build_docs("--check", "--output", out)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert "check passed" in proc.stdout
    assert (out / "index.html").is_file()
    # Pages of key procedures (generic interfaces have pages of their own), with the argument
    # descriptions of their specific procedures.
    from_array = (out / "interface" / "torch_tensor_from_array.html").read_text()
    assert "permute_dims" in from_array and "outlives the tensor" in from_array
    forward = (out / "interface" / "torch_model_forward.html").read_text()
    assert "output_tensors" in forward and "one per tensor forward returns" in forward
    assert (out / "proc" / "torch_model_load.html").is_file()
    # Every module has its page, ftorch_mpi (which uses the user's MPI) included.
    for module in ["ftorch", "ftorch_tensor_type", "ftorch_model", "ftorch_optim", "ftorch_mpi", "torch_ftn",
                   "ftorch_test_utils"]:
        assert (out / "module" / f"{module}.html").is_file(), module


def test_check_fails_on_undocumented_public_entity(tmp_path):
    src = tmp_path / "fortran"
    shutil.copytree(REPO / "src" / "fortran", src)
    runtime = src / "ftorch_runtime.f90"
    text = runtime.read_text()
    assert "implicit none\n" in text and "end module ftorch_runtime" in text
    # A public subroutine without any comment, and a private one (private helpers need none).
    text = text.replace("implicit none\n", "implicit none\n  public :: ftorch_probe_undocumented\n", 1)
    text = text.replace("end module ftorch_runtime",
                        "  subroutine ftorch_probe_undocumented(n)\n"
                        "    integer, intent(in) :: n\n"
                        "  end subroutine ftorch_probe_undocumented\n\n"
                        "  subroutine ftorch_probe_private(m)\n"
                        "    integer, intent(in) :: m\n"
                        "  end subroutine ftorch_probe_private\n"
                        "end module ftorch_runtime")
    runtime.write_text(text)
    proc = build_docs("--check", "--src", src, "--output", tmp_path / "api")
    assert proc.returncode == 1, f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    reported = [line for line in proc.stdout.splitlines() if line.startswith("undocumented public entity:")]
    # The subroutine and its argument, named with their module and the file to edit.
    assert "undocumented public entity: ftorch_runtime::ftorch_probe_undocumented [ftorch_runtime.f90]" in reported
    assert "undocumented public entity: ftorch_runtime::ftorch_probe_undocumented(n) [ftorch_runtime.f90]" in reported
    assert not [line for line in reported if "ftorch_runtime::" in line and "probe_undocumented" not in line]
    assert "check failed" in proc.stderr
    assert "ftorch_probe_private" not in proc.stdout
