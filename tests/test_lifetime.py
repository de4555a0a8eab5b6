"""Value semantics of `=` and handle lifetime (tests/fortran/test_lifetime.f90) with every
supported Fortran compiler: gfortran 11, gfortran 12 (Debian 12's default) and flang 19."""

from __future__ import annotations

import pytest

from conftest import assert_all_passed, require_compiler, run, tool_env, TESTS

LIFETIME_COMPILERS = ["gfortran-11", "gfortran", "flang-new-19"]
_builds = {}


@pytest.fixture(scope="module", params=LIFETIME_COMPILERS)
def lifetime(request, installed, cmake_consumer, data_dir, tmp_path_factory):
    compiler = request.param
    if compiler in ("gfortran", "flang-new-19"):
        return compiler, cmake_consumer(compiler) / "test_lifetime"
    fc = require_compiler(compiler)
    bdir = tmp_path_factory.mktemp(f"lifetime-{compiler}")
    run(["cmake", "-S", TESTS / "projects" / "cmake", "-B", bdir, "-G", "Ninja", f"-DCMAKE_Fortran_COMPILER={fc}",
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}", f"-DFTORCH_TEST_DATA={data_dir}", "-DCMAKE_BUILD_TYPE=Debug"],
        env=tool_env())
    run(["cmake", "--build", bdir, "--target", "test_lifetime"], env=tool_env())
    return compiler, bdir / "test_lifetime"


def test_value_semantics_and_lifetime(lifetime):
    compiler, binary = lifetime
    env = tool_env()
    env["FTORCH_LIVE_HANDLES_WARN"] = "0"
    assert_all_passed(run([binary], env=env, check=False))


def test_growing_handles_warn_at_run_time(lifetime):
    """The run-time signal of a leak: with a low threshold, the unmarked function results of
    gfortran <= 12 (never finalized) trigger the warning; flang finalizes them, so it stays quiet."""
    compiler, binary = lifetime
    env = tool_env()
    env["FTORCH_LIVE_HANDLES_WARN"] = "300"
    proc = run([binary, "--plain-function-results"], env=env, check=False)
    assert_all_passed(proc)
    leaked = int(proc.stdout.split("plain function results leaked ")[1].split()[0])
    warned = "FTorch warning:" in proc.stderr and "torch_result" in proc.stderr
    if compiler.startswith("gfortran"):
        assert leaked == 1000 and warned, proc.stderr
    else:
        assert leaked == 0 and not warned, proc.stderr
