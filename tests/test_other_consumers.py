"""Downstream projects built by fpm, by a plain Makefile with pkg-config, and C programs
using the C API through CMake (device_paths also on a GPU, where there is one)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

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


@pytest.fixture(scope="module")
def c_project(installed, tmp_path_factory) -> Path:
    """tests/projects/c (the programs c_api and device_paths), built once for this module."""
    bdir = tmp_path_factory.mktemp("c_build")
    run(["cmake", "-S", TESTS / "projects" / "c", "-B", bdir, f"-DFTorch_DIR={installed['cmake_dir']}"],
        env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    return bdir


def test_c_program_uses_the_c_api(c_project):
    assert_all_passed(run([c_project / "c_api"], check=False))


class DeviceMLP(torch.nn.Module):
    """The model of device_paths: Linear(4, 8), tanh, Linear(8, 3), in float64."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def write_device_model(directory: Path) -> None:
    """mlp.pt (TorchScript) and mlp_io.txt ("N NIN NOUT", inputs, outputs; row-major, exact reprs)."""
    torch.manual_seed(1234)
    model = DeviceMLP().double()
    torch.jit.script(model).save(str(directory / "mlp.pt"))
    x = torch.linspace(-1.0, 1.0, 24, dtype=torch.float64).reshape(6, 4)
    with torch.no_grad():
        y = model(x)
    values = [" ".join(repr(v) for v in t.flatten().tolist()) for t in (x, y)]
    (directory / "mlp_io.txt").write_text("6 4 3\n" + "\n".join(values) + "\n")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_c_program_device_paths(c_project, tmp_path, device):
    """Tensors, no-copy wrapping, forward, training and a checkpoint read back on the CPU, on the
    device: "cpu" everywhere (the program's logic), "cuda" where torch sees a GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device available to torch")
    write_device_model(tmp_path)
    proc = run([c_project / "device_paths", device, tmp_path], check=False, timeout=600)
    assert_all_passed(proc)
    assert (tmp_path / f"checkpoint_{device}.pt").is_file()
