"""Delivery routes as users know them: one py3-none wheel per platform whose libraries need
nothing beyond torch, the C++ runtime and glibc; pkg-config alone with the build's compiler
(prebuilt modules), build-modules for other compilers, module-format mismatches explained; and
consumers' strict Fortran flags."""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, TESTS, assert_all_passed, require_compiler, run, tool_env

# What a wheel's library may need besides torch's own libraries (auditwheel's view: the C++
# runtime and glibc's libraries, present on every Linux).
SYSTEM_LIBS = {"libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0",
               "librt.so.1", "ld-linux-x86-64.so.2"}


def ftorch_dir(installed) -> Path:
    return Path(installed["prefix"])


def needed(lib: Path) -> list[str]:
    out = run(["readelf", "-d", lib]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def max_version(lib: Path, prefix: str) -> tuple[int, ...]:
    """The highest symbol version `prefix`_x.y.z that `lib` requires (objdump -T), or ()."""
    out = run(["objdump", "-T", lib]).stdout
    versions = [tuple(int(p) for p in v.split(".")) for v in re.findall(rf"\b{prefix}_([0-9.]+[0-9])\b", out)]
    return max(versions, default=())


def test_wheel_is_tagged_py3_none_platform(wheel):
    if wheel == Path():
        pytest.skip("FTORCH_TEST_USE_INSTALLED=1: no wheel was built in this session")
    assert re.fullmatch(r"ftorch-[^-]+-py3-none-(linux|manylinux\w*)_x86_64\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
        tags = [ln.split(":", 1)[1].strip() for ln in z.read(meta).decode().splitlines() if ln.startswith("Tag:")]
        names = z.namelist()
    assert tags and all(t.startswith("py3-none-") for t in tags), tags
    # The libraries and the prebuilt Fortran modules are in it.
    assert any(n.endswith("lib/libftorch_c.so") for n in names)
    assert any(n.endswith("lib/libftorch.a") for n in names)
    assert any(n.endswith("include/fortran/ftorch.mod") for n in names)


def test_libraries_need_only_torch_the_cxx_runtime_and_glibc(installed):
    """An auditwheel-style report of every shared library in the package: each needed library is
    torch's own or a system one; nothing is Python's; glibc and libstdc++ symbol versions are
    reported against those torch's own library needs."""
    import torch

    torch_lib = Path(torch.__file__).parent / "lib"
    torch_libs = {p.name for p in torch_lib.iterdir()}
    libs = sorted((ftorch_dir(installed) / "lib").glob("*.so"))
    assert {p.name for p in libs} >= {"libftorch_c.so"}
    report = []
    for lib in libs:
        deps = needed(lib)
        foreign = [d for d in deps if d not in torch_libs and d not in SYSTEM_LIBS]
        report.append(f"{lib.name}: needs {', '.join(deps)}; GLIBC {max_version(lib, 'GLIBC')}, "
                      f"GLIBCXX {max_version(lib, 'GLIBCXX')}")
        assert not foreign, f"{lib.name} needs libraries that are neither torch's nor the system's: {foreign}"
        assert not any("python" in d.lower() for d in deps), f"{lib.name} links Python: {deps}"
    print("\n".join(report))
    # The C++ layer links torch (found through its RUNPATH next to torch) and nothing else new.
    core = needed(ftorch_dir(installed) / "lib" / "libftorch_c.so")
    assert any(d.startswith("libtorch") for d in core) and any(d.startswith("libc10") for d in core)
    # glibc: a wheel built here needs the glibc of the build machine (reported above), which is why
    # it is tagged linux_x86_64 and not manylinux (test_wheel_is_tagged_py3_none_platform): a
    # manylinux_X_Y wheel would have to be built on glibc X.Y (as torch's own is).
    print(f"torch's libtorch_cpu.so: GLIBC {max_version(torch_lib / 'libtorch_cpu.so', 'GLIBC')}")
    # The static library of the prebuilt modules is an archive: it needs nothing at run time.
    archive = ftorch_dir(installed) / "lib" / "libftorch.a"
    assert archive.read_bytes()[:8] == b"!<arch>\n"


def pkg_config(*args: str, path: str) -> str:
    env = dict(tool_env(), PKG_CONFIG_PATH=path)
    return run(["pkg-config", *args], env=env).stdout.strip()


def test_pkg_config_alone_builds_with_the_wheels_compiler(installed, data_dir, tmp_path):
    """gfortran prog.f90 $(pkg-config --cflags --libs ftorch): nothing else (FTorch's route)."""
    fc = require_compiler("gfortran")
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is not installed")
    compiler = pkg_config("--variable=fortran_compiler", "ftorch", path=installed["pkgconfig"])
    assert compiler.startswith("GNU "), compiler
    flags = pkg_config("--cflags", "--libs", "ftorch", path=installed["pkgconfig"]).split()
    shutil.copy(TESTS / "projects" / "run_model.f90", tmp_path)
    run([fc, "run_model.f90", *flags, "-o", "run_model"], cwd=tmp_path)
    assert_all_passed(run([tmp_path / "run_model", data_dir], check=False))


def test_module_check_accepts_the_wheels_compiler(installed):
    require_compiler("gfortran")
    out = run([sys.executable, "-m", "ftorch", "check-modules", "--fc", "gfortran"], env=tool_env())
    assert "reads the modules" in out.stdout


def test_module_check_explains_another_compiler(installed):
    fc = require_compiler("flang-new-19")
    proc = run([sys.executable, "-m", "ftorch", "check-modules", "--fc", fc], env=tool_env(), check=False)
    assert proc.returncode == 1
    assert "module format mismatch" in proc.stderr and "GFORTRAN module version" in proc.stderr, proc.stderr
    assert "!mod$" in proc.stderr and f"build-modules --fc {fc}" in proc.stderr, proc.stderr


def test_module_check_explains_another_gfortran_version(installed, tmp_path):
    """Modules written by a gfortran of another module format version: the same copy of the
    prebuilt modules, with ftorch.mod's version changed, is refused by gfortran and explained."""
    require_compiler("gfortran")
    import ftorch._modules as modules

    fake = tmp_path / "modules"
    shutil.copytree(modules.prebuilt_module_dir(), fake)
    text = gzip.decompress((fake / "ftorch.mod").read_bytes())
    first, rest = text.split(b"\n", 1)
    version = re.search(rb"version '(\d+)'", first).group(1)
    other = str(int(version) - 1).encode()
    (fake / "ftorch.mod").write_bytes(gzip.compress(first.replace(b"'" + version + b"'", b"'" + other + b"'") +
                                                    b"\n" + rest))
    check = modules.check_compiler("gfortran", fake)
    assert not check.ok
    assert f"GFORTRAN module version '{other.decode()}'" in check.message
    assert f"GFORTRAN module version '{version.decode()}'" in check.message
    assert "build-modules --fc gfortran" in check.message


def test_build_modules_for_flang_then_pkg_config(installed, data_dir, tmp_path):
    """Another compiler: build-modules once into a directory with its own ftorch.pc, then
    pkg-config --cflags --libs ftorch with that directory first builds the program."""
    fc = require_compiler("flang-new-19")
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is not installed")
    prefix = tmp_path / "ftorch-flang"
    out = run([sys.executable, "-m", "ftorch", "build-modules", "--fc", fc, "--prefix", prefix], env=tool_env())
    pc = prefix / "lib" / "pkgconfig" / "ftorch.pc"
    assert str(pc) in out.stdout and pc.exists()
    assert "!mod$" in (prefix / "include" / "fortran" / "ftorch.mod").read_text(errors="replace")[:8]
    flags = pkg_config("--cflags", "--libs", "ftorch", path=f"{pc.parent}{os.pathsep}{installed['pkgconfig']}").split()
    shutil.copy(TESTS / "projects" / "run_model.f90", tmp_path)
    run([fc, "run_model.f90", *flags, "-o", "run_model"], cwd=tmp_path)
    assert_all_passed(run([tmp_path / "run_model", data_dir], check=False))
    check = run([sys.executable, "-m", "ftorch", "check-modules", "--fc", fc, "--module-dir", pc.parent.parent.parent /
                 "include" / "fortran"], env=tool_env())
    assert "reads the modules" in check.stdout


STRICT_FLAGS = {
    # User procedures reach the C layer boxed (ftorch_callbacks), not through c_funloc, which
    # Fortran 2008 allows only for interoperable procedures: so -std=f2008 as well as f2018.
    "gfortran-f2008": ("gfortran", "-std=f2008 -Wall -Wextra -Werror -fdefault-real-8 -fimplicit-none"),
    "gfortran-f2018": ("gfortran", "-std=f2018 -Wall -Wextra -Werror -fdefault-real-8 -fimplicit-none"),
    # pytorch-fortran's example flags (-cpp: CMake preprocesses, then compiles with -fpreprocessed,
    # where an apostrophe in a comment is an unterminated character constant to the preprocessor).
    "gfortran-cpp": ("gfortran", "-ffree-form -std=f2008 -fimplicit-none -cpp -Wall -Wextra -Werror -fdefault-real-8"),
    # flang accepts only -std=f2018.
    "flang-new-19": ("flang-new-19", "-std=f2018 -fimplicit-none"),
    "flang-new-19-cpp": ("flang-new-19", "-cpp -std=f2018 -fimplicit-none -fdefault-real-8"),
}


@pytest.mark.parametrize("case", sorted(STRICT_FLAGS))
def test_consumer_with_strict_flags(installed, data_dir, tmp_path, case):
    """The consumer's CMAKE_Fortran_FLAGS apply to FTorch's sources in its build: strict standard
    conformance, every warning an error, default real of 8 bytes, implicit none. The consumer runs
    a model and hands FTorch its own procedures as callbacks."""
    compiler, flags = STRICT_FLAGS[case]
    fc = require_compiler(compiler)
    bdir = tmp_path / "build"
    run(["cmake", "-S", TESTS / "projects" / "strict", "-B", bdir, "-G", "Ninja", f"-DCMAKE_Fortran_COMPILER={fc}",
         f"-DCMAKE_Fortran_FLAGS={flags}", f"-DCMAKE_PREFIX_PATH={installed['prefix']}"],
        env=tool_env())
    proc = run(["cmake", "--build", bdir, "--verbose"], env=tool_env(), check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert flags.split()[0] in proc.stdout  # the flags did reach the compiler
    # Not one warning from FTorch's sources (compiled in the consumer's build) under the user's flags;
    # the consumer's own files (tests/projects) may warn about their own code.
    warnings = [ln for ln in (proc.stdout + proc.stderr).splitlines()
                if "warning" in ln.lower() and "/projects/" not in ln]
    assert not warnings, "\n".join(warnings[:20])
    assert_all_passed(run([bdir / "run_model", data_dir], check=False))
    assert assert_all_passed(run([bdir / "callbacks"], check=False)) == 5


def test_one_torch_pin():
    """The torch release is written once, in pyproject.toml's build requirements: the CMake
    message, the metadata provider's message and quickstart.sh read it from there."""
    pin = re.search(r'"(torch==[^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    version = pin.split("==")[1]
    for path in ("cmake/FTorchTorch.cmake", "tools/ftorch_build_meta.py", "tools/quickstart.sh"):
        assert version not in (REPO / path).read_text(), f"{path} repeats the torch pin {version}"
    spec = importlib.util.spec_from_file_location("ftorch_build_meta_probe", REPO / "tools" / "ftorch_build_meta.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.default_torch_pin() == pin


def test_shipped_fortran_comments_survive_the_c_preprocessor():
    """Consumers compile the shipped sources with -cpp (some with -Werror): a full-line comment with
    an odd number of ASCII apostrophes ("missing terminating ' character") or a C comment opener
    breaks their build (test_consumer_with_strict_flags compiles the main modules only)."""
    bad = []
    for path in sorted((REPO / "src" / "fortran").rglob("*")):
        if path.suffix not in (".f90", ".fypp", ".inc"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            if text.startswith("!") and (text.count("'") % 2 == 1 or "/*" in text):
                bad.append(f"{path.relative_to(REPO)}:{number}: {text}")
    assert bad == []
