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


def device_memory_program(installed, tmp_path) -> tuple[Path, dict]:
    """tests/projects/gpu built against the installed package, and the environment it runs in."""
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
    return bdir / "device_memory", env


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_device_memory_on_the_gpu(installed, data_dir, tmp_path):
    program, env = device_memory_program(installed, tmp_path)
    assert assert_all_passed(run([program, data_dir], env=env, check=False)) == 11


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_training_package_on_the_gpu(installed, data_dir, tmp_path):
    """The same program with training packages in the TorchScript model's place: one exported for
    CUDA (Inductor's GPU kernels) runs every step of it on cudaMalloc'd memory -- forward into
    wrapped device memory, FTorch's idiom, SGD steps, Adam steps captured as a CUDA graph, on wrapped
    buffers and on torch-owned tensors given new data by `=` -- against one exported for the CPU
    (the program's bounds: 1e-12 for forward and three SGD steps, 1e-10 relative for ten Adam steps;
    both packages compute float64 tanh(W x + b) * 2 with their own kernels, a few ulps apart)."""
    import shutil
    import sys

    from models import SimpleNet

    sys.path.insert(0, str(TESTS))
    import ftorch

    net = SimpleNet().double()
    net.load_state_dict(torch.jit.load(str(data_dir / "simplenet_f64.pt")).state_dict())
    dirs = {}
    for device in ("cuda", "cpu"):
        d = dirs[device] = tmp_path / device
        d.mkdir()
        report = ftorch.export(net, ["5:float64"], train_package=d / "simplenet_f64.pt2", device=device)
        assert report.ok, report
        shutil.copy(d / "simplenet_f64.pt2", d / "simplenet_f64.pt")
    program, env = device_memory_program(installed, tmp_path)
    assert assert_all_passed(run([program, dirs["cuda"], dirs["cpu"]], env=env, check=False)) == 11


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
