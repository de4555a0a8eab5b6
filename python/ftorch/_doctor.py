"""``python -m ftorch doctor``: check the installation and print the fix for each problem."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

import ftorch

FORTRAN_COMPILERS = ["gfortran", "flang-new", "flang", "flang-new-19", "ifx", "ifort", "nvfortran"]


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _tool_version(cmd: str) -> str:
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    first = out.strip().splitlines()[0] if out.strip() else "?"
    return first


class Report:
    def __init__(self) -> None:
        self.failures = 0

    def ok(self, what: str) -> None:
        print(f"[ ok ] {what}")

    def warn(self, what: str, fix: str) -> None:
        print(f"[warn] {what}\n       fix: {fix}")

    def fail(self, what: str, fix: str) -> None:
        self.failures += 1
        print(f"[FAIL] {what}\n       fix: {fix}")


def _check_torch(r: Report) -> None:
    built = ftorch.torch_version
    installed = ftorch.installed_torch_version()
    if installed is None:
        r.fail(f"torch is not installed (FTorch was built against torch {built})",
               f"pip install torch=={_public(built)}")
    elif _public(installed) != _public(built):
        r.fail(f"torch {installed} is installed but FTorch was built against torch {built}",
               f"pip install torch=={_public(built)}  (or rebuild FTorch: "
               "pip install --force-reinstall --no-build-isolation <ftorch source>)")
    else:
        r.ok(f"torch {installed} matches the torch FTorch was built against ({built})")


def _check_library(r: Report):
    lib = ftorch.get_library()
    if not lib.exists():
        r.fail(f"C++ library missing: {lib}", "reinstall FTorch: pip install --force-reinstall ftorch")
        return None
    try:
        handle = ctypes.CDLL(str(lib))
    except OSError as exc:
        r.fail(f"C++ library does not load: {exc}",
               f"install the torch it was built for: pip install torch=={_public(ftorch.torch_version)}")
        return None
    handle.ftc_check_runtime.restype = ctypes.c_int
    handle.ftc_last_error.restype = ctypes.c_char_p
    if handle.ftc_check_runtime() != 0:
        r.fail(handle.ftc_last_error().decode(errors="replace"),
               f"pip install torch=={_public(ftorch.torch_version)}")
    else:
        r.ok(f"C++ library loads LibTorch {ftorch.torch_version}: {lib}")
    return handle


def _check_embedded_python(r: Report, handle) -> None:
    """What a Fortran program's first torch_pymodule_load would use (optional feature: warnings)."""
    buf = ctypes.create_string_buffer(8192)
    handle.ftc_python_locate.restype = ctypes.c_int
    if handle.ftc_python_locate(buf, ctypes.c_int64(len(buf))) != 0:
        r.warn("embedded Python (torch_pymodule) unavailable: " + handle.ftc_last_error().decode(errors="replace"),
               "install the shared libpython of this environment's Python, or set FTORCH_LIBPYTHON")
        return
    libpython, _, executable = buf.value.decode(errors="replace").partition("\n")
    if not executable or not os.path.isfile(executable):
        r.warn(f"embedded Python: no interpreter executable found next to {libpython}",
               "set FTORCH_PYTHON to this environment's python")
        return
    probe = subprocess.run([executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, check=False)
    version = probe.stdout.strip()
    if probe.returncode != 0 or version != ftorch.torch_version:
        r.warn(f"embedded Python: {executable} imports torch {version or '(none)'}, FTorch was built against "
               f"{ftorch.torch_version}", "set FTORCH_PYTHON and FTORCH_LIBPYTHON to the environment FTorch is in")
        return
    r.ok(f"embedded Python (torch_pymodule): libpython {libpython}, interpreter {executable}")


def _check_tools(r: Report) -> None:
    compilers = [c for c in FORTRAN_COMPILERS if shutil.which(c)]
    if compilers:
        from ._modules import check_compiler, prebuilt_compiler

        for c in compilers:
            r.ok(f"Fortran compiler {c}: {_tool_version(c)}")
            if prebuilt_compiler():
                check = check_compiler(c)
                if check.ok:
                    r.ok(f"{c} reads the prebuilt modules (pkg-config --cflags --libs ftorch works with it)")
                else:
                    r.warn(f"{c} cannot use the prebuilt modules (CMake and fpm builds are not affected): "
                           f"{check.message.split(' Fix: ')[0]}",
                           f"python -m ftorch build-modules --fc {c} --prefix DIR, then "
                           f"PKG_CONFIG_PATH=DIR/lib/pkgconfig")
    else:
        r.fail("no Fortran compiler found (looked for " + ", ".join(FORTRAN_COMPILERS) + ")",
               "sudo apt-get install -y gfortran   (or flang-19 for LLVM flang)")

    builders = 0
    cmake = shutil.which("cmake")
    if cmake:
        line = _tool_version("cmake")
        m = re.search(r"(\d+)\.(\d+)", line)
        if m and (int(m.group(1)), int(m.group(2))) < (3, 21):
            r.warn(f"{line} is older than 3.21, which FTorch's CMake package needs", "pip install cmake")
        else:
            builders += 1
            r.ok(line)
    else:
        r.warn("cmake not found (needed for find_package(FTorch))", "pip install cmake ninja")
    if shutil.which("fpm"):
        builders += 1
        r.ok(f"fpm {_tool_version('fpm')}")
    else:
        r.warn("fpm not found (needed only for fpm projects)", "pip install fpm")
    if shutil.which("pkg-config") or shutil.which("pkgconf"):
        builders += 1
        r.ok("pkg-config found")
    else:
        r.warn("pkg-config not found (needed only for Makefile builds)", "sudo apt-get install -y pkg-config")
    if builders == 0:
        r.fail("no build tool for Fortran projects (cmake, fpm or pkg-config)", "pip install cmake ninja fpm")


def run() -> int:
    print(f"FTorch {ftorch.__version__} at {ftorch.get_package_dir()}")
    r = Report()
    _check_torch(r)
    handle = _check_library(r)
    if handle is not None:
        _check_embedded_python(r, handle)
    _check_tools(r)
    if r.failures:
        print(f"{r.failures} problem(s) found")
        return 1
    print("no problems found")
    return 0
