"""No silent wrong values (tests/fortran/test_safety.f90): what a compiler lets through (non-contiguous
sections, overlapping wrapped memory, pointers into function results, lossy conversions) and the
handle rules' holes (`=` into shared memory, parameters given history) get Fortran's right values
or a clear error, with gfortran 11, gfortran 12 and flang 19."""

from __future__ import annotations

import pytest

from conftest import COMPILERS, NEWER_COMPILERS, assert_all_passed, run

SAFETY_COMPILERS = ["gfortran-11", *COMPILERS, *NEWER_COMPILERS]


@pytest.mark.parametrize("compiler", SAFETY_COMPILERS)
def test_no_silent_wrong_values(compiler, cmake_consumer, data_dir):
    targets = None if compiler in COMPILERS else ["test_safety"]
    binary = cmake_consumer(compiler, targets) / "test_safety"
    assert_all_passed(run([binary, data_dir], check=False))
