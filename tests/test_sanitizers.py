"""The C++ layer built with AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer
included, -DFTORCH_SANITIZE=ON), and the Fortran test programs run against it with zero reports.

The programs are not instrumented themselves (Fortran); they preload the ASan runtime so that
every allocation of the process -- ours, LibTorch's, the Fortran runtime's -- is checked. The only
suppressions are for LibTorch's own reports, each named and explained in
tests/sanitizers/lsan.supp.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, TESTS, assert_all_passed, require_compiler, run, tool_env

# Test programs and arguments (after the data directory) run under the sanitizers.
PROGRAMS = [
    ("test_tensor", []),
    ("test_model", []),
    ("test_errors", []),
    ("test_math", []),
    ("test_hardening", []),
    ("test_train", ["params"]),
    ("test_train", ["losses"]),
    ("test_train", ["errors"]),
]


def asan_runtime() -> str:
    path = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.fail(f"gcc's ASan runtime not found ({path!r})")
    return path


@pytest.fixture(scope="module")
def sanitized_consumer(tmp_path_factory, data_dir, wheel):
    """tests/projects/cmake built with gfortran against a sanitizer build of FTorch."""
    fc = require_compiler("gfortran")
    build = tmp_path_factory.mktemp("sanitize-build")
    prefix = tmp_path_factory.mktemp("sanitize-prefix")
    # -O1 -g1: the optimization level the sanitizers' documentation recommends, and line tables
    # for the reports' stack traces; compiles the LibTorch-heavy sources markedly faster than -O2 -g.
    run(["cmake", "-S", REPO, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
         "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1", "-DFTORCH_SANITIZE=ON", f"-DPython_EXECUTABLE={sys.executable}", f"-DCMAKE_INSTALL_PREFIX={prefix}"],
        env=tool_env())
    run(["cmake", "--build", build], env=tool_env())
    run(["cmake", "--install", build], env=tool_env())
    consumer = tmp_path_factory.mktemp("sanitize-consumer")
    run(["cmake", "-S", TESTS / "projects" / "cmake", "-B", consumer, "-G", "Ninja",
         f"-DCMAKE_Fortran_COMPILER={fc}", f"-DCMAKE_PREFIX_PATH={prefix}", f"-DFTORCH_TEST_DATA={data_dir}",
         "-DCMAKE_BUILD_TYPE=Debug"], env=tool_env())
    # Only the programs run below (the project has more).
    run(["cmake", "--build", consumer, "--target", *sorted({program for program, _ in PROGRAMS})], env=tool_env())
    return consumer


@pytest.mark.parametrize("program,args", PROGRAMS, ids=[" ".join([p, *a]) for p, a in PROGRAMS])
def test_no_sanitizer_reports(sanitized_consumer, data_dir, program, args):
    env = dict(os.environ)
    env["LD_PRELOAD"] = asan_runtime()
    env["ASAN_OPTIONS"] = "detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=86"
    env["LSAN_OPTIONS"] = f"suppressions={TESTS / 'sanitizers' / 'lsan.supp'}:print_suppressions=0"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:exitcode=87"
    env["FTORCH_NO_RSS"] = "1"  # ASan's quarantine keeps freed memory: LeakSanitizer checks leaks here
    proc = run([sanitized_consumer / program, data_dir, *args], env=env, check=False, timeout=1200)
    reports = [line for line in proc.stderr.splitlines() if "Sanitizer" in line or "runtime error:" in line]
    assert not reports, "\n".join(reports) + "\n--- stderr\n" + proc.stderr[-6000:]
    assert_all_passed(proc)
