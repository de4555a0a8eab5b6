"""Compiled models: AOTInductor packages (.pt2) loaded and run from Fortran (gfortran 12, flang;
gfortran 11 for the Fortran program)
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

    if not (data_dir / "ftorch_pt2" / "mlp_rules_unreadable.pt2").exists():
        models.build_compiled(data_dir)
    return data_dir


@pytest.mark.parametrize("packages", ["torch", "ftorch"])
@pytest.mark.parametrize("compiler", [*COMPILERS, "gfortran-11"])
def test_compiled_models_from_fortran(cmake_consumer, compiled_data, compiler, packages):
    """The packages as torch writes them (aoti_compile_and_package: their generated input checks
    run) and as the helper writes them (ftorch.export: FTorch checks the inputs the package records)."""
    args = [compiled_data] + ([compiled_data / "ftorch_pt2"] if packages == "ftorch" else [])
    targets = None if compiler in COMPILERS else ["test_compiled"]
    proc = run([cmake_consumer(compiler, targets) / "test_compiled", *args], check=False, timeout=600)
    assert_all_passed(proc)
    # Every failure there is asked for with stat: AOTInductor's own error lines stay off stderr.
    assert "Error:" not in proc.stderr and "input_handles" not in proc.stderr, proc.stderr


# AOTInductor's names for instruction sets -> /proc/cpuinfo flags (as compiled.cpp checks them).
ISA_FLAGS = {"AVX2": ["avx2"], "AVX512": ["avx512f", "avx512bw"], "AVX512_VNNI": ["avx512_vnni"],
             "AVX512_BF16": ["avx512_bf16"]}


def test_package_for_another_cpu_is_refused(installed, compiled_data, tmp_path):
    """A package whose code needs instructions this CPU lacks (its metadata names them) is refused
    at load with the missing ones named, instead of crashing with an illegal instruction."""
    import ctypes
    import json
    import zipfile
    from pathlib import Path

    flags = set(Path("/proc/cpuinfo").read_text().split())
    missing = [isa for isa, needs in ISA_FLAGS.items() if not all(f in flags for f in needs)]
    if not missing:
        pytest.skip("this CPU has every instruction set the check knows")
    package = tmp_path / "other_cpu.pt2"
    with zipfile.ZipFile(compiled_data / "mlp_dynamic.pt2") as src, \
            zipfile.ZipFile(package, "w", zipfile.ZIP_STORED) as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                meta["AOTI_CPU_ISA"] = missing[-1]
                data = json.dumps(meta).encode()
            dst.writestr(item, data)
    lib = ctypes.CDLL(str(Path(installed["libdir"]) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    model = ctypes.c_void_p()
    status = lib.ftc_model_load(ctypes.byref(model), str(package).encode(), 0, -1, 0, 0)
    message = lib.ftc_last_error().decode()
    assert status != 0 and not model.value, message
    assert "this CPU lacks " + missing[-1] in message, message
