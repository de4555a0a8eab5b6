"""Every example under examples/ builds against the installed package and runs, with gfortran
and with flang; example 2 also runs through its own script, as the README shows."""

from __future__ import annotations

import sys

import pytest

from conftest import COMPILERS, REPO, require_compiler, run, tool_env

_builds = {}


@pytest.fixture(scope="module")
def examples(installed, tmp_path_factory):
    work = tmp_path_factory.mktemp("examples")
    run([sys.executable, REPO / "examples" / "02_inference" / "write_model.py", work])
    run([sys.executable, REPO / "examples" / "05_model_gradients" / "write_model.py", work])

    def build(compiler):
        fc = require_compiler(compiler)
        if compiler not in _builds:
            bdir = work / f"build-{compiler}"
            run(["cmake", "-S", REPO / "examples", "-B", bdir, "-G", "Ninja", f"-DCMAKE_Fortran_COMPILER={fc}",
                 f"-DCMAKE_PREFIX_PATH={installed['prefix']}"], env=tool_env())
            run(["cmake", "--build", bdir], env=tool_env())
            _builds[compiler] = bdir
        return _builds[compiler], work

    return build


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("example", ["tensors", "inference", "errors", "autograd", "model_gradients"])
def test_example_runs(examples, compiler, example):
    bdir, work = examples(compiler)
    proc = run([bdir / example, work])
    number = {"tensors": 1, "inference": 2, "errors": 3, "autograd": 4, "model_gradients": 5}[example]
    assert f"example {number} finished" in proc.stdout


def test_inference_demo_script(installed, tmp_path):
    env = dict(tool_env(), FTORCH_EXAMPLE_DIR=str(tmp_path))
    proc = run(["bash", REPO / "examples" / "02_inference" / "run.sh", sys.executable], env=env)
    assert "example 2 finished" in proc.stdout
