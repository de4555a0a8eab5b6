"""Session fixtures: build and install the package once, write the models, build consumers.

The wheel is built from this checkout (incrementally, in build/) and installed into the running
Python environment, so that every downstream project below uses FTorch as a user would.
Set FTORCH_TEST_USE_INSTALLED=1 to test the already installed package instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
COMPILERS = ["gfortran", "flang-new-19"]
IN_CI = os.environ.get("CI", "").lower() == "true"
# Today's distributions' compilers, from a Debian 13 root (tools/newer_compilers.sh): they and the
# programs they build run inside that root, which sees the host's build directories.
NEWER_COMPILERS = ["gfortran-13", "gfortran-14", "flang-new-22"]
NEWER_BIN = Path(os.environ.get("FTORCH_NEWER_COMPILERS", "/opt/ftorch-newer")) / "bin"
_in_root_dirs: set[Path] = set()


def pytest_collection_modifyitems(session, config, items):
    """The C++ unit tests first: fast, and the first to name a broken core."""
    items.sort(key=lambda item: item.path.name != "test_unit.py")


def run(cmd, *, cwd=None, env=None, check=True, timeout=1800):
    """Run a command, returning the completed process; on failure show its output. A program
    built by one of NEWER_COMPILERS runs inside their Debian 13 root (its runtime libraries)."""
    cmd = [str(c) for c in cmd]
    if Path(cmd[0]).is_absolute() and any(Path(cmd[0]).is_relative_to(d) for d in _in_root_dirs):
        cmd = [str(NEWER_BIN / "in-root"), *cmd]
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, errors="replace", timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def helper(*args: str) -> str:
    """Output of the installed helper CLI (python -m ftorch ...)."""
    return run([sys.executable, "-m", "ftorch", *args]).stdout.strip()


def require_compiler(name: str) -> str:
    if name in NEWER_COMPILERS:
        unavailable = os.environ.get("FTORCH_NEWER_COMPILERS_UNAVAILABLE")
        if unavailable:  # (.ci/run: the machine cannot run them; it says so again at its end)
            pytest.skip(f"{name}: {unavailable}")
        path = str(NEWER_BIN / name) if (NEWER_BIN / name).exists() else None
        hint = "run tools/newer_compilers.sh"
    else:
        path, hint = shutil.which(name), "install it"
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is required in CI but not installed ({hint})")
        pytest.skip(f"{name} not installed ({hint})")
    return path


def built_in_root(directory: Path, compiler: str) -> None:
    """Programs under `directory` were built by `compiler`: run() runs them where it runs."""
    if compiler in NEWER_COMPILERS:
        _in_root_dirs.add(Path(directory).resolve())


def tool_env() -> dict[str, str]:
    """Environment whose PATH starts with this interpreter's bin dir (cmake, ninja, fpm)."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this checkout, installed into the running environment."""
    if os.environ.get("FTORCH_TEST_USE_INSTALLED") == "1":
        return Path()
    out = tmp_path_factory.mktemp("wheel")
    # The C++ unit tests (tests/unit) are built beside the library from the same objects.
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out,
         "--config-settings=cmake.define.FTORCH_UNIT_TESTS=ON", REPO], env=tool_env())
    (whl,) = out.glob("ftorch-*.whl")
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", whl])
    return whl


@pytest.fixture(scope="session")
def installed(wheel) -> dict[str, str]:
    """Paths reported by the installed helper."""
    return {
        "prefix": helper("--cmake-prefix-path"),
        "cmake_dir": helper("--cmake-dir"),
        "libdir": helper("--libdir"),
        "pkgconfig": helper("--pkg-config-path"),
        "fpm_flags": helper("--fpm-flags"),
    }


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """TorchScript models and PyTorch reference outputs, written now by tests/models.py."""
    sys.path.insert(0, str(TESTS))
    import models

    return models.build(tmp_path_factory.mktemp("data"))


_cmake_builds: dict[str, Path] = {}
_cmake_built_all: set[str] = set()


@pytest.fixture(scope="session")
def cmake_consumer(installed, data_dir, tmp_path_factory):
    """Build tests/projects/cmake with a given Fortran compiler (configured once per compiler):
    every program, or only `targets` (what the compilers outside COMPILERS, gfortran 11, run)."""

    def build(compiler: str, targets: list[str] | None = None) -> Path:
        fc = require_compiler(compiler)
        if compiler not in _cmake_builds:
            bdir = tmp_path_factory.mktemp(f"cmake-{compiler}")
            run(["cmake", "-S", TESTS / "projects" / "cmake", "-B", bdir, "-G", "Ninja",
                 f"-DCMAKE_Fortran_COMPILER={fc}", f"-DCMAKE_PREFIX_PATH={installed['prefix']}",
                 f"-DFTORCH_TEST_DATA={data_dir}", "-DCMAKE_BUILD_TYPE=Debug"], env=tool_env())
            _cmake_builds[compiler] = bdir
            built_in_root(bdir, compiler)
        bdir = _cmake_builds[compiler]
        if targets is not None and compiler not in _cmake_built_all:
            run(["cmake", "--build", bdir, "--target", *targets], env=tool_env())  # incremental
        elif compiler not in _cmake_built_all:
            run(["cmake", "--build", bdir], env=tool_env())
            _cmake_built_all.add(compiler)
        return bdir

    return build


def assert_all_passed(proc) -> int:
    """The Fortran program's last line is 'N passed, 0 failed' with N > 0; returns N."""
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output\n{proc.stderr}"
    last = lines[-1].strip()
    failures = [ln for ln in lines if ln.startswith("FAIL")]
    assert last.endswith(" passed, 0 failed") and proc.returncode == 0, (
        f"{last}\n" + "\n".join(failures) + f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    n = int(last.split()[0])
    assert n > 0
    return n


@pytest.fixture(scope="session")
def fake_torch(tmp_path_factory) -> Path:
    """A torch/lib directory of links to the real LibTorch whose version.py claims another
    release: loading it through LD_LIBRARY_PATH simulates a torch upgrade after installing FTorch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    real = Path(spec.origin).parent
    root = tmp_path_factory.mktemp("faketorch") / "torch"
    (root / "lib").mkdir(parents=True)
    for lib in (real / "lib").iterdir():
        (root / "lib" / lib.name).symlink_to(lib)
    # A CUDA build of torch finds its CUDA libraries in site-packages/nvidia, next to torch/.
    if (real.parent / "nvidia").is_dir():
        (root.parent / "nvidia").symlink_to(real.parent / "nvidia")
    (root / "version.py").write_text("__version__ = '2.12.0+cpu'\n")
    return root
