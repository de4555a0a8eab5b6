"""GPU programs of the suite: Fortran on CUDA memory allocated through libcudart and wrapped
without a copy (tests/projects/gpu). It is compiled everywhere (so that it follows the API), and
built and run where torch sees a CUDA device; tools/gpu_check.sh runs it on a GPU machine."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
import torch

from conftest import TESTS, assert_all_passed, require_compiler, run, tool_env

PROJECT = TESTS / "projects" / "gpu"


def test_device_memory_program_compiles(cmake_consumer, tmp_path):
    """Compiled against the installed modules on any machine (linking needs libcudart)."""
    fc = require_compiler("gfortran")
    modules = cmake_consumer("gfortran") / "ftorch_modules"
    run([fc, "-c", PROJECT.parent / "device_checks.f90", f"-I{modules}", "-J", tmp_path, "-o", tmp_path / "dc.o"])
    run([fc, "-c", PROJECT / "device_memory.f90", f"-I{modules}", f"-I{tmp_path}", "-J", tmp_path, "-o", tmp_path / "dm.o"])
    assert (tmp_path / "dm.o").is_file()


def libcudart() -> str | None:
    """libcudart of the CUDA toolkit, or the one the CUDA build of torch depends on."""
    for pattern in ("/usr/local/cuda*/lib64/libcudart.so*",
                    str(Path(torch.__file__).parent.parent / "nvidia" / "*" / "lib" / "libcudart.so*"),
                    str(Path(torch.__file__).parent.parent / "nvidia" / "cu*" / "lib" / "libcudart.so*")):
        found = sorted(glob.glob(pattern))
        if found:
            return found[-1]
    return None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_device_memory_on_the_gpu(installed, data_dir, tmp_path):
    fc = require_compiler("gfortran")
    bdir = tmp_path / "build"
    cudart = libcudart()
    extra = [f"-DCUDART_LIBRARY={cudart}"] if cudart else []
    run(["cmake", "-S", PROJECT, "-B", bdir, "-G", "Ninja", f"-DCMAKE_Fortran_COMPILER={fc}",
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}", *extra], env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    env = dict(os.environ)
    if cudart:
        env["LD_LIBRARY_PATH"] = str(Path(cudart).parent) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    assert assert_all_passed(run([bdir / "device_memory", data_dir], env=env, check=False)) == 11


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_idiom_copies_keep_every_value(installed, tmp_path, device):
    """bench/transfer.py runs FTorch's GPU idiom through the C API (input copied up, forward, output
    copied down into a host array) with staging off and in 4 and 16 MiB chunks, at 64 MiB and at a
    size that is no multiple of a chunk, and checks every value; on the CPU the same calls run
    without copies (the script cannot rot where there is no GPU)."""
    import sys

    from conftest import REPO

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    run([sys.executable, REPO / "bench" / "transfer.py", "--device", device, "--reps", "2", "--out", tmp_path],
        env=tool_env())
    assert (tmp_path / "transfer.json").is_file()
