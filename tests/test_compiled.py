"""Compiled models: AOTInductor packages (.pt2) loaded and run from Fortran (gfortran and flang)
through torch_model_load / torch_model_forward, against the eager PyTorch model."""

from __future__ import annotations

import sys

import pytest

from conftest import COMPILERS, TESTS, assert_all_passed, run


@pytest.fixture(scope="module")
def compiled_data(data_dir):
    """The packages, compiled now by torch.export + AOTInductor (tests/models.py build_compiled)."""
    sys.path.insert(0, str(TESTS))
    import models

    if not (data_dir / "multi_io.pt2").exists():
        models.build_compiled(data_dir)
    return data_dir


@pytest.mark.parametrize("compiler", COMPILERS)
def test_compiled_models_from_fortran(cmake_consumer, compiled_data, compiler):
    proc = run([cmake_consumer(compiler) / "test_compiled", compiled_data], check=False, timeout=600)
    assert_all_passed(proc)
