"""Downstream projects built by fpm, by a plain Makefile with pkg-config, and a C program
using the C API through CMake."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from conftest import COMPILERS, TESTS, assert_all_passed, helper, require_compiler, run, tool_env


@pytest.mark.parametrize("compiler", COMPILERS)
def test_fpm_project(installed, data_dir, tmp_path, compiler):
    fc = require_compiler(compiler)
    if shutil.which("fpm", path=tool_env()["PATH"]) is None:
        pytest.skip("fpm not installed")
    project = tmp_path / "fpm_project"
    shutil.copytree(TESTS / "projects" / "fpm", project)
    (project / "app").mkdir()
    shutil.copy(TESTS / "projects" / "run_model.f90", project / "app" / "main.f90")
    dependency = run([sys.executable, "-m", "ftorch", "--fpm-dependency"], cwd=project).stdout.strip()
    manifest = (project / "fpm.toml.in").read_text() + dependency + "\n"
    (project / "fpm.toml").write_text(manifest)
    env = dict(tool_env(), FPM_LDFLAGS=installed["fpm_flags"])
    proc = run(["fpm", "run", "--compiler", fc, "--", data_dir], cwd=project, env=env, check=False)
    assert_all_passed(proc)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_makefile_project_with_pkg_config(installed, data_dir, tmp_path, compiler):
    fc = require_compiler(compiler)
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config not installed")
    project = tmp_path / "make_project"
    shutil.copytree(TESTS / "projects" / "make", project)
    shutil.copy(TESTS / "projects" / "run_model.f90", project)
    env = dict(os.environ, PKG_CONFIG_PATH=installed["pkgconfig"])
    run(["make", f"FC={fc}"], cwd=project, env=env)
    assert_all_passed(run([project / "build" / "run_model", data_dir], check=False))


def test_c_program_uses_the_c_api(installed, tmp_path):
    bdir = tmp_path / "c_build"
    run(["cmake", "-S", TESTS / "projects" / "c", "-B", bdir, f"-DFTorch_DIR={installed['cmake_dir']}"],
        env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    assert_all_passed(run([bdir / "c_api"], check=False))
