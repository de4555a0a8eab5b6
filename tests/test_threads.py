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


@pytest.mark.parametrize("compiler", COMPILERS)
def test_threads(installed, data_dir, tmp_path, compiler):
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
    proc = run([build / "test_threads", data_dir], env=env, check=False, timeout=600)
    assert_all_passed(proc)
    # Handles made on one thread and freed on another are no leak (case g).
    assert "grew from step to step" not in proc.stderr, proc.stderr
