"""FTorch from OpenMP threads (tests/fortran/test_threads.f90, built by the CMake project
tests/projects/threads with gfortran and with LLVM flang): per-thread training bit-identical to
serial training, concurrent inference on one shared model, per-thread grad-mode scopes, errors
and catch scopes, and the live-handle count across threads."""

from __future__ import annotations

import os

import pytest

from conftest import COMPILERS, IN_CI, TESTS, assert_all_passed, require_compiler, run, tool_env

# Debian/Ubuntu package that gives LLVM flang its OpenMP runtime (libomp); gfortran has libgomp.
FLANG_OPENMP_PACKAGE = "libomp-19-dev"


_package: list = []


def compiled_package(tmp_path_factory):
    """A small .pt2 with a dynamic batch (x(nb, 5) -> y(nb, 3)), exported once per session."""
    if not _package:
        import sys

        import torch

        sys.path.insert(0, str(TESTS))
        import ftorch

        torch.manual_seed(0)
        path = tmp_path_factory.mktemp("threads_pt2") / "mlp.pt2"
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        assert ftorch.export(model, ["4,5"], pt2=path, dynamic_batch=True, check=False).ok
        _package.append(path)
    return _package[0]


@pytest.mark.parametrize("compiler", COMPILERS)
def test_threads(installed, data_dir, tmp_path, tmp_path_factory, compiler):
    fc = require_compiler(compiler)
    build = tmp_path / "build"
    configure = run(["cmake", "-S", TESTS / "projects" / "threads", "-B", build, "-G", "Ninja",
                     f"-DCMAKE_Fortran_COMPILER={fc}", f"-DCMAKE_PREFIX_PATH={installed['prefix']}"],
                    env=tool_env(), check=False)
    if configure.returncode != 0 and "OpenMP" in configure.stdout + configure.stderr and "flang" in compiler:
        reason = f"{compiler} has no OpenMP runtime here (install {FLANG_OPENMP_PACKAGE})"
        if IN_CI:
            pytest.fail(reason + "\n" + configure.stderr[-3000:])
        pytest.skip(reason)
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    run(["cmake", "--build", build], env=tool_env())
    env = dict(os.environ, OMP_NUM_THREADS="4", OMP_DYNAMIC="false")
    env.pop("OMP_THREAD_LIMIT", None)
    proc = run([build / "test_threads", data_dir, compiled_package(tmp_path_factory)], env=env, check=False,
               timeout=600)
    assert_all_passed(proc)
    # Standard error is the program's own after threads captured it at once (case g).
    assert "standard error after the compiled loads" in proc.stderr, proc.stderr[-3000:]
    # Handles made on one thread and freed on another are no leak (case g).
    assert "grew from step to step" not in proc.stderr, proc.stderr
