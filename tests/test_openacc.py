"""OpenACC and FTorch (tests/projects/openacc): arrays of an `!$acc data` region wrapped through
`!$acc host_data use_device`, forward into them, OpenACC kernels and FTorch seeing each other's
writes, training on them, against the same steps on CPU arrays. Built with gfortran -fopenacc, and
with the kernels also compiled for NVIDIA GPUs (-foffload=nvptx-none, Debian's
gcc-12-offload-nvptx; .ci/run installs it). Without a GPU OpenACC runs on the host and so do the
tensors; with one (tools/gpu_check.sh, where the compiler can offload) they are CUDA tensors over
OpenACC's device copies."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import IN_CI, TESTS, assert_all_passed, require_compiler, run, tool_env

PROJECT = TESTS / "projects" / "openacc"
# GCC 12 targets sm_35 by default, which the CUDA 13 ptxas that verifies the code no longer knows;
# sm_80 PTX 7.0 is assembled by CUDA 11.x to 13 and JIT-compiled by the driver for newer GPUs.
NVPTX = "-foffload=nvptx-none;-foffload-options=nvptx-none=-misa=sm_80 -mptx=7.0"


def can_offload(fc: str, tmp_path) -> bool:
    src = tmp_path / "probe.f90"
    src.write_text("program p\ninteger :: i, a(4)\n!$acc parallel loop copyout(a)\ndo i = 1, 4\na(i) = i\nend do\n"
                   "print *, sum(a)\nend program p\n")
    proc = subprocess.run([fc, "-fopenacc", *NVPTX.split(";"), src, "-o", tmp_path / "probe"], capture_output=True,
                          text=True)
    return proc.returncode == 0


@pytest.mark.parametrize("offload", ["host", "nvptx"])
def test_openacc_arrays_as_tensors(installed, data_dir, tmp_path, offload):
    fc = require_compiler("gfortran")
    flags = "-foffload=disable"  # host only, also where an offload compiler is installed
    if offload == "nvptx":
        if not can_offload(fc, tmp_path):
            if IN_CI:
                pytest.fail("gfortran cannot offload to nvptx-none: install gcc-12-offload-nvptx")
            pytest.skip("gfortran cannot offload to nvptx-none (apt-get install gcc-12-offload-nvptx)")
        flags = NVPTX
    bdir = tmp_path / "build"
    run(["cmake", "-S", PROJECT, "-B", bdir, "-G", "Ninja", f"-DCMAKE_Fortran_COMPILER={fc}",
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}", f"-DOFFLOAD={flags}"], env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    # A host-only build on a machine with a GPU and libgomp's nvptx plugin: libgomp would pick the
    # GPU, for which the program has no code ("target function wasn't mapped"); OpenACC's own
    # variable sends it to the host.
    env = dict(os.environ, ACC_DEVICE_TYPE="host") if offload == "host" else None
    proc = run([bdir / "openacc", data_dir], env=env, check=False)
    assert assert_all_passed(proc) == 5
