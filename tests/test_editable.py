"""An editable install (pip install -e) finds its built files: the Python sources come from the
checkout while the library, CMake package and Fortran sources are installed next to torch."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, TESTS, assert_all_passed, run, tool_env


@pytest.fixture(scope="module")
def editable_env(tmp_path_factory, wheel):
    """A fresh venv whose site-packages links the running environment's torch (so the library's
    relative RUNPATH resolves) and sees its build tools through a .pth file."""
    venv = tmp_path_factory.mktemp("editable") / "venv"
    run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    main_site = Path(sysconfig.get_paths()["purelib"])
    for entry in main_site.iterdir():
        if entry.name == "torch" or (entry.name.startswith("torch-") and entry.name.endswith(".dist-info")):
            (site / entry.name).symlink_to(entry)
    (site / "zz_build_tools.pth").write_text(str(main_site) + "\n")
    run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", REPO], env=tool_env())
    return py


def test_editable_install_reports_built_files(editable_env):
    code = "import ftorch; print(ftorch.__file__); print(ftorch.get_cmake_dir())"
    module_file, cmake_dir = run([editable_env, "-c", code]).stdout.split()
    assert Path(module_file).is_relative_to(REPO / "python"), "Python sources come from the checkout"
    assert (Path(cmake_dir) / "FTorchConfig.cmake").is_file()
    proc = run([editable_env, "-m", "ftorch", "doctor"], env=tool_env(), check=False)
    assert proc.returncode == 0, proc.stdout


def test_editable_install_builds_a_consumer(editable_env, data_dir, tmp_path):
    prefix = run([editable_env, "-m", "ftorch", "--cmake-prefix-path"]).stdout.strip()
    bdir = tmp_path / "build"
    run(["cmake", "-S", TESTS / "projects" / "cmake", "-B", bdir, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}",
         f"-DFTORCH_TEST_DATA={data_dir}"], env=tool_env())
    run(["cmake", "--build", bdir, "--target", "test_model"], env=tool_env())
    assert_all_passed(run([bdir / "test_model", data_dir], check=False))
