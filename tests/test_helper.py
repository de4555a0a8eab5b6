"""The Python helper and the package's files: paths, CLI, fpm line, doctor, wheel contents,
version pinning and the configure-time torch check of the CMake package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, TESTS, helper, run, tool_env


def pyproject_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_import_does_not_import_torch(wheel):
    code = "import sys, ftorch; print(ftorch.__version__); print('torch' in sys.modules)"
    out = run([sys.executable, "-c", code]).stdout.split()
    assert out == [pyproject_version(), "False"]


def test_version_reports_ftorch_and_torch(wheel):
    import torch

    assert helper("--version") == f"ftorch {pyproject_version()} (built against torch {torch.__version__})"


def test_manifest_versions_agree_with_pyproject():
    fpm = tomllib.loads((REPO / "fpm.toml").read_text())
    assert fpm["name"] == "ftorch" and fpm["version"] == pyproject_version()


@pytest.mark.parametrize(
    "flag, relative",
    [
        ("--cmake-dir", "FTorchConfig.cmake"),
        ("--cmake-prefix-path", "share/cmake/FTorch/FTorchConfigVersion.cmake"),
        ("--libdir", "libftorch_c.so"),
        ("--includedir", "ftorch_c.h"),
        ("--pkg-config-path", "ftorch.pc"),
        ("--libdir", "pkgconfig/ftorch.pc"),
    ],
)
def test_path_flags_point_at_installed_files(wheel, flag, relative):
    assert (Path(helper(flag)) / relative).is_file()


def test_fortran_sources_are_listed_in_compilation_order(wheel):
    files = [Path(p) for p in helper("--fortran-sources").splitlines()]
    assert all(f.is_file() for f in files)
    names = [f.stem for f in files]
    assert names[0] == "ftorch_kinds" and names[-3:] == ["ftorch", "torch_ftn", "torchfort"]
    assert names.index("ftorch_tensor") < names.index("ftorch_model")
    assert names.index("ftorch_arglist") < names.index("ftorch_model") < names.index("ftorch_python")


def test_fpm_dependency_is_relative_to_the_project(wheel, tmp_path):
    proc = run([sys.executable, "-m", "ftorch", "--fpm-dependency"], cwd=tmp_path)
    line = proc.stdout.strip()
    m = re.fullmatch(r'ftorch = \{ path = "([^"]+)" \}', line)
    assert m, line
    assert not os.path.isabs(m.group(1))
    assert (tmp_path / m.group(1) / "fpm.toml").is_file()


def test_fpm_and_link_flags(wheel):
    libdir = helper("--libdir")
    assert helper("--fpm-flags") == f"-L{libdir} -Wl,-rpath,{libdir} -lftorch_c"
    assert helper("--link-flags") == helper("--fpm-flags")


def test_pkg_config_file(wheel):
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config not installed")
    env = dict(os.environ, PKG_CONFIG_PATH=helper("--pkg-config-path"))
    out = run(["pkg-config", "--cflags", "--libs", "ftorch"], env=env).stdout
    assert "-lftorch_c" in out and "-I" in out and "-Wl,-rpath," in out
    srcdir = run(["pkg-config", "--variable=fortran_srcdir", "ftorch"], env=env).stdout.strip()
    names = run(["pkg-config", "--variable=fortran_source_names", "ftorch"], env=env).stdout.split()
    assert all((Path(srcdir) / n).is_file() for n in names)


def test_doctor_passes_on_a_good_installation(wheel):
    proc = run([sys.executable, "-m", "ftorch", "doctor"], env=tool_env(), check=False)
    assert proc.returncode == 0, proc.stdout
    assert "no problems found" in proc.stdout


def test_doctor_reports_a_torch_mismatch_with_its_fix(wheel, tmp_path):
    # A torch distribution of another version earlier on sys.path than the real one.
    dist = tmp_path / "torch-2.12.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    env = dict(tool_env(), PYTHONPATH=str(tmp_path))
    proc = run([sys.executable, "-m", "ftorch", "doctor"], env=env, check=False)
    assert proc.returncode == 1
    assert "torch 2.12.0 is installed but FTorch was built against torch" in proc.stdout
    assert "fix: pip install torch==" in proc.stdout


def test_doctor_reports_missing_compilers_and_tools(wheel, tmp_path):
    # Only python itself on PATH: no Fortran compiler, no cmake, fpm or pkg-config.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    env = dict(os.environ, PATH=str(bindir))
    proc = run([sys.executable, "-m", "ftorch", "doctor"], env=env, check=False)
    assert proc.returncode == 1
    assert "no Fortran compiler found" in proc.stdout and "apt-get install -y gfortran" in proc.stdout
    assert "fix: pip install cmake" in proc.stdout


def test_wheel_contents_and_pinned_torch(wheel):
    if not wheel.name:
        pytest.skip("testing an installed package, not a fresh wheel")
    import torch

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    expected = {
        "ftorch/__init__.py", "ftorch/__main__.py", "ftorch/_doctor.py", "ftorch/_build_info.py",
        "ftorch/fpm.toml", "ftorch/lib/libftorch_c.so", "ftorch/lib/pkgconfig/ftorch.pc",
        "ftorch/include/ftorch_c.h", "ftorch/include/ftorch_c_enums.h", "ftorch/share/cmake/FTorch/FTorchConfig.cmake",
        "ftorch/share/cmake/FTorch/FTorchConfigVersion.cmake", "ftorch/share/cmake/FTorch/FTorchTargets.cmake",
        "ftorch/src/fortran/ftorch.f90", "ftorch/src/fortran/ftorch_tensor.f90",
        "ftorch/src/fortran/ftorch_model.f90", "ftorch/src/fortran/ftorch_test_utils.f90",
        "ftorch/src/fortran/ftorch_python.f90", "ftorch/src/fortran/ftorch_arglist.f90",
        "ftorch/src/fortran/torch_ftn.f90", "ftorch/lib/libftorch_python.so", "ftorch/_embed.py",
        "ftorch/include/ftorch_c_python.h", "ftorch/include/ftorch_c_arglist.h", "ftorch/src/fortran/ftorch_c_api.f90",
        "ftorch/_export.py", "ftorch/_export_errors.py", "ftorch/_export_values.py", "ftorch/_discovery.py",
        "ftorch/_export_report.py", "ftorch/_export_torchscript.py", "ftorch/_export_pt2.py",
        "ftorch/_inspect.py", "ftorch/_modules.py",
        "ftorch/lib/libftorch.a", "ftorch/include/fortran/ftorch.mod",
    }
    assert expected <= names
    assert not any(n.endswith((".o", ".fypp")) for n in names), "no object or template files"
    # Module files only as the prebuilt set of the build's compiler, in their own directory.
    assert all(n.startswith("ftorch/include/fortran/") for n in names if n.endswith((".mod", ".smod")))
    public = torch.__version__.split("+")[0]
    assert f"Requires-Dist: torch=={public}" in metadata.splitlines()


def test_library_runpath_reaches_torch_lib(wheel):
    libdir = Path(helper("--libdir"))
    out = run(["readelf", "-d", libdir / "libftorch_c.so"]).stdout
    assert "(RUNPATH)" in out and "[$ORIGIN/../../torch/lib]" in out
    exported = run(["nm", "-D", "--defined-only", libdir / "libftorch_c.so"]).stdout.split("\n")
    symbols = [line.split()[-1] for line in exported if line.strip()]
    assert symbols and all(s.startswith(("ftc_", "torchfort_")) for s in symbols), \
        "only the C API (and TorchFort's, torchfort.h) is exported"


def test_cmake_configure_rejects_a_different_torch(wheel, tmp_path):
    """The CMake package checks the torch next to it at configure time."""
    site = tmp_path / "site"
    shutil.copytree(helper("--cmake-prefix-path"), site / "ftorch")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.12.0+cpu'\n")
    proc = run(["cmake", "-S", TESTS / "projects" / "cmake", "-B", tmp_path / "build",
                f"-DCMAKE_PREFIX_PATH={site / 'ftorch'}"], env=tool_env(), check=False)
    assert proc.returncode != 0
    assert "torch version mismatch" in proc.stdout + proc.stderr
    assert "pip install torch==" in proc.stdout + proc.stderr


def test_cmake_version_file_accepts_this_version_only(wheel, tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(v LANGUAGES C)\n"
        f"find_package(FTorch {pyproject_version()} EXACT REQUIRED)\n"
        "find_package(FTorch 99.0 QUIET)\n"
        "if(FTorch_FOUND)\n  message(FATAL_ERROR \"version 99 accepted\")\nendif()\n"
    )
    run(["cmake", "-S", project, "-B", tmp_path / "b", f"-DFTorch_DIR={helper('--cmake-dir')}"], env=tool_env())


def test_plot_loss_turns_a_training_log_into_a_png(wheel, tmp_path):
    pytest.importorskip("matplotlib")
    log = tmp_path / "train.log"
    log.write_text("other output\n" + "".join(
        f"step {100 * i}  loss {1.0 / i:.7E}  lr {1e-3:.4E}  0.0500 ms/step\n" for i in range(1, 11)))
    proc = run([sys.executable, "-m", "ftorch", "plot-loss", log, "-o", tmp_path / "curve.png"])
    assert proc.stdout.strip() == str(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    from ftorch.plot import read_log

    steps, losses, rates = read_log(log)
    assert steps == [100 * i for i in range(1, 11)] and losses[1] == 0.5 and rates[0] == 1e-3


def test_plot_metrics_draws_a_wandb_hook_log(wheel, tmp_path):
    """plot-metrics: the TorchFort wandb-hook lines (model, step, metric, value), all metrics or the
    named ones; an unknown metric or a log without metric lines is an error naming what exists."""
    pytest.importorskip("matplotlib")
    log = tmp_path / "torchfort.log"
    log.write_text("TORCHFORT::INFO: other output\n" + "".join(
        f"TORCHFORT::WANDB: model: tracker, step: {i}, episode_reward: {-1.0 / i:.6e}\n"
        f"TORCHFORT::WANDB: model: critic_0, step: {10 * i}, train_loss: {0.5 ** i:.6e}\n" for i in range(1, 6)))
    from ftorch.plot import read_metrics

    metrics = read_metrics(log)
    assert metrics["tracker/episode_reward"] == ([1, 2, 3, 4, 5], [float(f"{-1.0 / i:.6e}") for i in range(1, 6)])
    assert metrics["critic_0/train_loss"][0] == [10, 20, 30, 40, 50]
    for args in ([], ["-m", "episode_reward"], ["-m", "critic_0/train_loss", "-m", "episode_reward"]):
        png = tmp_path / f"m{len(args)}.png"
        proc = run([sys.executable, "-m", "ftorch", "plot-metrics", log, *args, "-o", png])
        assert proc.stdout.strip() == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    proc = run([sys.executable, "-m", "ftorch", "plot-metrics", log, "-m", "reward"], check=False)
    assert proc.returncode == 1 and "no metric reward" in proc.stderr and "tracker/episode_reward" in proc.stderr
    (tmp_path / "empty.log").write_text("nothing here\n")
    proc = run([sys.executable, "-m", "ftorch", "plot-metrics", tmp_path / "empty.log"], check=False)
    assert proc.returncode == 1 and "no metric lines" in proc.stderr


def test_plot_loss_rejects_a_log_without_progress_lines(wheel, tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("nothing here\n")
    proc = run([sys.executable, "-m", "ftorch", "plot-loss", log], check=False)
    assert proc.returncode == 1 and "no progress lines" in proc.stderr
