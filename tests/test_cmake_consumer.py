"""A downstream CMake project (find_package(FTorch), FTorch::ftorch) built with gfortran and
with LLVM flang; its Fortran test programs run here and under CTest. Today's distributions'
compilers (gfortran 13 and 14, flang 22: NEWER_COMPILERS) build and run the same programs and the
clean error stops."""

from __future__ import annotations

import os

import pytest
import torch

from conftest import COMPILERS, NEWER_COMPILERS, assert_all_passed, run, tool_env

PROGRAMS = ["test_tensor", "test_model", "test_errors", "test_memory"]


def consumer_build(cmake_consumer, compiler):
    """The project built with `compiler` (only these programs for the newer compilers)."""
    return cmake_consumer(compiler, None if compiler in COMPILERS else [*PROGRAMS, "error_stop"])


@pytest.mark.parametrize("compiler", [*COMPILERS, *NEWER_COMPILERS])
@pytest.mark.parametrize("program", PROGRAMS)
def test_fortran_program_passes(cmake_consumer, data_dir, compiler, program):
    bdir = consumer_build(cmake_consumer, compiler)
    proc = run([bdir / program, data_dir], check=False, timeout=600)
    assert_all_passed(proc)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_model_saved_from_fortran_loads_in_python(cmake_consumer, data_dir, compiler):
    bdir = cmake_consumer(compiler)
    saved = data_dir / "saved_by_fortran.pt"
    saved.unlink(missing_ok=True)
    assert_all_passed(run([bdir / "test_model", data_dir], check=False))
    reloaded = torch.jit.load(str(saved))
    original = torch.jit.load(str(data_dir / "simplenet_f64.pt"))
    x = torch.linspace(-1.0, 1.0, 5, dtype=torch.float64)
    torch.testing.assert_close(reloaded(x), original(x), rtol=0, atol=0)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_ctest_runs_the_suite(cmake_consumer, compiler):
    bdir = cmake_consumer(compiler)
    proc = run(["ctest", "--output-on-failure"], cwd=bdir, env=tool_env(), check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "100% tests passed" in proc.stdout


# case -> (procedure named in the message, reason in the message)
ERROR_CASES = {
    "missing_file": ("torch_model_load", "cannot open model file"),
    "corrupt_file": ("torch_model_load", "not a loadable TorchScript model"),
    "wrong_shape": ("torch_model_forward", "cannot be multiplied"),
    "wrong_inputs": ("torch_model_forward", "argument"),
    "cuda_tensor": ("torch_tensor_from_array", "no CUDA/HIP device is available"),
    "cuda_model": ("torch_model_load", "no CUDA/HIP device is available"),
    "dtype": ("torch_tensor_zeros", "unsupported dtype 5"),
    "unconstructed": ("torch_tensor_get_rank", "not constructed"),
    "shape_mismatch_add": ("operator(+)", "must match the size"),
    "backward_no_grad": ("torch_tensor_backward", "does not require grad"),
    "gradient_before_backward": ("torch_tensor_get_gradient", "no gradient yet"),
    "implicit_backward_non_scalar": ("torch_tensor_backward", "one-element tensor"),
    "python_exception": ("torch_pymodule_call", "ValueError: boom"),
}

# Cases that fail only where no GPU is present.
CUDA_CASES = {"cuda_tensor", "cuda_model"}


def assert_clean_error_stop(proc, procedure: str, reason: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode > 0, f"expected a non-zero exit status, got {proc.returncode}\n{output}"
    assert proc.returncode < 128, f"terminated by a signal ({proc.returncode})\n{output}"
    assert "core dumped" not in output.lower() and "terminate called" not in output
    assert f"[{procedure}]" in output and reason in output, output
    assert "not reached" not in output


@pytest.mark.parametrize("compiler", [*COMPILERS, *NEWER_COMPILERS])
@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_failure_without_stat_stops_cleanly(cmake_consumer, data_dir, compiler, case):
    if case in CUDA_CASES and torch.cuda.is_available():
        pytest.skip("a GPU is available here: the CUDA request succeeds")
    bdir = consumer_build(cmake_consumer, compiler)
    proc = run([bdir / "error_stop", data_dir, case], check=False)
    assert_clean_error_stop(proc, *ERROR_CASES[case])


@pytest.mark.parametrize("compiler", COMPILERS)
def test_torch_version_mismatch_at_run_time_with_stat(cmake_consumer, data_dir, fake_torch, compiler):
    bdir = cmake_consumer(compiler)
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_torch / "lib"))
    assert_all_passed(run([bdir / "version_check", data_dir], env=env, check=False))


@pytest.mark.parametrize("compiler", COMPILERS)
def test_torch_version_mismatch_at_run_time_without_stat(cmake_consumer, data_dir, fake_torch, compiler):
    bdir = cmake_consumer(compiler)
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_torch / "lib"))
    proc = run([bdir / "error_stop", data_dir, "version"], env=env, check=False)
    assert_clean_error_stop(proc, "torch_tensor_zeros", "torch version mismatch")
