"""Embedded Python (tests/fortran/test_python.f90 and test_python_threads.f90): torch_pymodule
calls with every argument kind, aliasing both ways, errors, several modules, autograd after
Python started, memory over 10^4 calls, OpenMP threads; and programs that never use Python do not
load it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import COMPILERS, IN_CI, TESTS, assert_all_passed, helper, require_compiler, run, tool_env

PY_DIR = TESTS / "fortran" / "py"


@pytest.mark.parametrize("compiler", COMPILERS)
def test_pymodule_calls(cmake_consumer, data_dir, compiler):
    bdir = cmake_consumer(compiler)
    proc = run([bdir / "test_python", data_dir, PY_DIR], check=False, timeout=600)
    assert_all_passed(proc)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_pymodule_from_openmp_threads(installed, tmp_path, compiler):
    fc = require_compiler(compiler)
    build = tmp_path / "build"
    configure = run(["cmake", "-S", TESTS / "projects" / "threads", "-B", build, "-G", "Ninja",
                     f"-DCMAKE_Fortran_COMPILER={fc}", f"-DCMAKE_PREFIX_PATH={installed['prefix']}"],
                    env=tool_env(), check=False)
    if configure.returncode != 0 and "OpenMP" in configure.stdout + configure.stderr and not IN_CI:
        pytest.skip(f"{compiler} has no OpenMP runtime here")
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    run(["cmake", "--build", build, "--target", "test_python_threads"], env=tool_env())
    env = dict(os.environ, OMP_NUM_THREADS="4", OMP_DYNAMIC="false")
    proc = run([build / "test_python_threads", PY_DIR], env=env, check=False, timeout=600)
    assert_all_passed(proc)


def test_core_library_links_no_python(installed):
    needed = run(["readelf", "-d", os.path.join(installed["libdir"], "libftorch_c.so")]).stdout
    assert "libpython" not in needed
    bridge = run(["readelf", "-d", os.path.join(installed["libdir"], "libftorch_python.so")]).stdout
    assert "libpython" not in bridge  # it uses the interpreter already in the process
    assert "libtorch" not in bridge


def test_a_program_that_never_uses_python_does_not_load_it(cmake_consumer, data_dir):
    bdir = cmake_consumer(COMPILERS[0])
    env = dict(os.environ, LD_DEBUG="files")
    proc = run([bdir / "test_tensor", data_dir], env=env, check=False)
    assert_all_passed(proc)
    loaded = [ln for ln in proc.stderr.splitlines() if "file=" in ln]
    assert any("libtorch_cpu" in ln for ln in loaded)  # LD_DEBUG did report the loads
    assert not any("libpython" in ln or "libftorch_python" in ln for ln in loaded)


def test_missing_libpython_is_a_clear_error(cmake_consumer, data_dir):
    bdir = cmake_consumer(COMPILERS[0])
    env = dict(os.environ, FTORCH_LIBPYTHON="/nonexistent/libpython3.11.so")
    proc = run([bdir / "error_stop", data_dir, "python_exception"], env=env, check=False)
    out = proc.stdout + proc.stderr
    assert 0 < proc.returncode < 128
    assert "[torch_pymodule_load]" in out and "FTORCH_LIBPYTHON=/nonexistent/libpython3.11.so is not a file" in out


def test_doctor_reports_the_embedded_interpreter(installed):
    out = helper("doctor")
    assert "embedded Python" in out and "libpython" in out


def test_a_python_program_calling_fortran_reuses_its_interpreter(installed, tmp_path):
    """A Fortran library used from Python (here the C API through ctypes, as an f2py or ctypes
    wrapper would): the program's own interpreter runs the calls, none is started or finalized."""
    script = tmp_path / "hosted.py"
    script.write_text(f"""
import ctypes, sys
import torch  # the host program uses torch itself
lib = ctypes.CDLL({os.path.join(installed["libdir"], "libftorch_c.so")!r})
lib.ftc_last_error.restype = ctypes.c_char_p
sys.hosted_marker = 42
results = ctypes.c_void_p()
helper = ctypes.c_void_p()
open({str(tmp_path / "probe.py")!r}, "w").write("import sys\\ndef marker():\\n    return sys.hosted_marker\\n")
assert lib.ftc_pymodule_load(ctypes.byref(helper), {str(tmp_path / "probe.py")!r}.encode()) == 0, lib.ftc_last_error()
assert lib.ftc_pymodule_call(helper, b"marker", None, ctypes.byref(results), None, 0) == 0, lib.ftc_last_error()
value = ctypes.c_int64()
assert lib.ftc_arglist_get_int(results, ctypes.c_int64(0), ctypes.byref(value)) == 0
print("marker", value.value)
""")
    proc = run([sys.executable, script])
    assert "marker 42" in proc.stdout  # the same interpreter: it sees the host's sys module state


def test_torch_mismatch_in_the_embedded_interpreter_is_explained():
    from ftorch import _embed

    import torch

    with pytest.raises(ImportError, match="FTorch was built against torch 9.9.9"):
        _embed.check_torch("9.9.9", os.path.dirname(torch.__file__))
    with pytest.raises(ImportError, match="imports torch from"):
        _embed.check_torch(torch.__version__, "/somewhere/else/torch")
    _embed.check_torch(torch.__version__, os.path.dirname(torch.__file__))


def test_a_pythonhome_without_a_standard_library_is_a_clear_error(cmake_consumer, data_dir):
    """Python stops the whole program when it cannot start (PYTHONHOME set, by a module system, for
    another Python): FTorch refuses to start it instead, through stat and errmsg."""
    bdir = cmake_consumer(COMPILERS[0])
    env = dict(os.environ, PYTHONHOME="/nonexistent")
    proc = run([bdir / "error_stop", data_dir, "python_exception"], env=env, check=False)
    out = proc.stdout + proc.stderr
    assert 0 < proc.returncode < 128
    assert "[torch_pymodule_load]" in out and "PYTHONHOME=/nonexistent has no standard library of Python 3." in out, out
    assert "Fatal Python error" not in out
    # The Python FTorch runs on, named by PYTHONHOME (its standard library's prefix): it starts.
    env = dict(os.environ, PYTHONHOME=sys.base_prefix)
    proc = run([bdir / "error_stop", data_dir, "python_exception"], env=env, check=False)
    out = proc.stdout + proc.stderr
    assert "[torch_pymodule_call]" in out and "ValueError: boom" in out, out


def test_file_modules_never_replace_a_module_of_that_name(tmp_path):
    """A file module is registered in sys.modules under its file's name (pickling its classes works)
    unless the name is taken: a standard-library module (random.py must not replace torch's
    random) or an earlier load of a file of that name (its classes stay picklable)."""
    import pickle
    import random

    from ftorch import _embed

    path, modules = list(sys.path), dict(sys.modules)
    try:
        _loads_under_names_of_their_own(tmp_path, _embed, pickle, random)
    finally:  # (this process spawns others later: tmp_path must not stay first on their sys.path)
        sys.path[:] = path
        for name in set(sys.modules) - set(modules):
            del sys.modules[name]


def _loads_under_names_of_their_own(tmp_path, _embed, pickle, random):
    (tmp_path / "random.py").write_text("VALUE = 1\n")
    mine = _embed.load(str(tmp_path / "random.py"))
    assert sys.modules["random"] is random and mine.VALUE == 1 and mine.__name__ != "random"
    (tmp_path / "tabnanny.py").write_text("VALUE = 2\n")  # a standard module not imported (yet)
    assert "tabnanny" not in sys.modules
    assert _embed.load(str(tmp_path / "tabnanny.py")).__name__ != "tabnanny" and "tabnanny" not in sys.modules
    (tmp_path / "trainer_x1.py").write_text("class Model:\n    pass\n")
    first = _embed.load(str(tmp_path / "trainer_x1.py"))
    second = _embed.load(str(tmp_path / "trainer_x1.py"))
    assert first.__name__ == "trainer_x1" and second.__name__ != "trainer_x1"
    assert type(pickle.loads(pickle.dumps(first.Model()))) is first.Model
    assert type(pickle.loads(pickle.dumps(second.Model()))) is second.Model
    (tmp_path / "broken_x1.py").write_text("raise RuntimeError('no')\n")
    with pytest.raises(RuntimeError):
        _embed.load(str(tmp_path / "broken_x1.py"))
    assert "broken_x1" not in sys.modules
