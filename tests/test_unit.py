"""The C++ core's unit tests (tests/unit, GoogleTest), built with the wheel (FTORCH_UNIT_TESTS=ON,
from the library's own objects) and run before the end-to-end suite (conftest orders them first)."""

from __future__ import annotations

import os
import re

import pytest
from conftest import IN_CI, REPO, run


def _binary():
    found = sorted(REPO.glob("build/*/ftorch_unit_tests"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def test_cpp_unit_tests(wheel):
    binary = _binary()
    if binary is None:
        message = ("tests/unit was not built: GoogleTest missing (Debian: apt-get install libgtest-dev), "
                   "or FTORCH_TEST_USE_INSTALLED=1 skipped the build")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    proc = run([binary, "--gtest_brief=1"], env={**os.environ, "OMP_NUM_THREADS": "1"})
    passed = re.search(r"\[  PASSED  \] (\d+) tests?", proc.stdout)
    written = len(re.findall(r"^TEST\(", (REPO / "tests" / "unit" / "test_core.cpp").read_text(), re.M))
    assert passed and int(passed.group(1)) == written, proc.stdout[-3000:]
