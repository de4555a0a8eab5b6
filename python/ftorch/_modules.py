"""Fortran module files: the prebuilt ones in the wheel, a check that a compiler can read them,
and ``build-modules``, which compiles the shipped sources once for another compiler.

Module files (.mod) are compiler-specific: gfortran writes gzip files with a format version,
flang a text format of its own, Intel and NVIDIA binary ones. The wheel ships modules built by the
compiler of its build (``fortran_compiler`` in ftorch.pc); other compilers read the sources.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import _build_info


def prebuilt_module_dir() -> Path:
    """Directory of the prebuilt .mod files (include/fortran)."""
    from . import get_include

    return get_include() / "fortran"


def prebuilt_compiler() -> str:
    """The compiler (id and version) that built the prebuilt modules, or "" if the wheel has none."""
    return _build_info.fortran_compiler if (prebuilt_module_dir() / "ftorch.mod").exists() else ""


def module_format(mod_file: Path) -> str:
    """What a .mod file says about the compiler that wrote it: gfortran's "GFORTRAN module
    version 'N'", flang's "!mod$ vN", or a short description of an unknown format."""
    data = Path(mod_file).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    data = data.removeprefix(b"\xef\xbb\xbf")  # flang starts its text format with a UTF-8 byte order mark
    head = data[:200].split(b"\n", 1)[0].decode("latin-1")
    if head.startswith("GFORTRAN module version"):
        return head.split(" created", 1)[0]
    if head.startswith("!mod$"):
        return " ".join(head.split()[:2])
    return "unknown format (" + data[:8].hex() + ")"


def _compiler_family(fc: str) -> str:
    """gnu, llvm, intel, nvidia or other, from the compiler's --version banner."""
    try:
        banner = subprocess.run([fc, "--version"], capture_output=True, text=True, timeout=60).stdout.lower()
    except (OSError, subprocess.SubprocessError):
        banner = ""
    name = Path(fc).name.lower()
    if "gnu fortran" in banner:
        return "gnu"
    if "flang" in banner or "flang" in name:
        return "llvm"
    if "intel" in banner or name.startswith(("ifx", "ifort")):
        return "intel"
    if "nvidia" in banner or name.startswith(("nvfortran", "pgfortran")):
        return "nvidia"
    return "other"


def _module_dir_flag(fc: str, directory: Path) -> list[str]:
    if _compiler_family(fc) in ("intel", "nvidia"):
        return ["-module", str(directory)]
    return ["-J", str(directory)]  # gfortran, flang, Cray


def compiler_module_format(fc: str) -> str:
    """The module format `fc` writes (compiles a one-line module in a temporary directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "ftorch_probe.f90"
        src.write_text("module ftorch_probe\nend module ftorch_probe\n")
        proc = subprocess.run([fc, "-c", src.name, *_module_dir_flag(fc, Path(tmp))], cwd=tmp,
                              capture_output=True, text=True, errors="replace", timeout=300)
        mod = Path(tmp) / "ftorch_probe.mod"
        if proc.returncode != 0 or not mod.exists():
            raise RuntimeError(f"{fc} could not compile a one-line module: {proc.stderr.strip()[:500]}")
        return module_format(mod)


@dataclass
class ModuleCheck:
    ok: bool
    message: str


def check_compiler(fc: str, module_dir: Path | None = None) -> ModuleCheck:
    """Whether `fc` can use the modules in `module_dir` (default: the prebuilt ones): compiles a
    program that uses ftorch; on failure, explains the mismatch of module formats and what to do."""
    module_dir = Path(module_dir) if module_dir is not None else prebuilt_module_dir()
    if shutil.which(fc) is None:
        return ModuleCheck(False, f"Fortran compiler '{fc}' not found")
    if not (module_dir / "ftorch.mod").exists():
        return ModuleCheck(False, f"no prebuilt module ftorch.mod in {module_dir} (this wheel was built without a "
                                  f"Fortran compiler): use `python -m ftorch build-modules --fc {fc} --prefix DIR`")
    ours = module_format(module_dir / "ftorch.mod")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "uses_ftorch.f90"
        src.write_text("program uses_ftorch\n  use ftorch\n  implicit none\nend program uses_ftorch\n")
        proc = subprocess.run([fc, "-c", src.name, f"-I{module_dir}", "-o", "uses_ftorch.o"], cwd=tmp,
                              capture_output=True, text=True, errors="replace", timeout=300)
    if proc.returncode == 0:
        return ModuleCheck(True, f"{fc} reads the modules in {module_dir} ({ours})")
    try:
        theirs = compiler_module_format(fc)
    except RuntimeError as exc:
        theirs = f"? ({exc})"
    built_by = prebuilt_compiler() if module_dir == prebuilt_module_dir() else ""
    why = (f"module format mismatch: ftorch.mod in {module_dir} is '{ours}'"
           + (f" (written by {built_by})" if built_by else "")
           + f", but {fc} writes '{theirs}'. Module files only work with the compiler (and, for gfortran, "
           f"the module format version) that wrote them." if ours != theirs else
           f"{fc} cannot use the modules in {module_dir} ({ours}): "
           + " ".join(proc.stderr.strip().splitlines()[-3:])[:600])
    fix = (f" Fix: build them once for {fc}: python -m ftorch build-modules --fc {fc} --prefix DIR, then "
           f"export PKG_CONFIG_PATH=DIR/lib/pkgconfig (or compile the sources of "
           f"`pkg-config --variable=fortran_source_names ftorch` with your program).")
    return ModuleCheck(False, why + fix)


def build_modules(fc: str, prefix: Path, flags: list[str] | None = None, verbose: bool = False) -> Path:
    """Compile the shipped Fortran sources with `fc` into `prefix` (include/fortran/*.mod,
    lib/libftorch.a) and write prefix/lib/pkgconfig/ftorch.pc for that compiler; returns the .pc."""
    from . import get_fortran_sources, get_include, get_libdir, torch_version, __version__

    if shutil.which(fc) is None:
        raise RuntimeError(f"Fortran compiler '{fc}' not found")
    prefix = Path(prefix).resolve()
    moddir, libdir = prefix / "include" / "fortran", prefix / "lib"
    pcdir = libdir / "pkgconfig"
    for d in (moddir, pcdir):
        d.mkdir(parents=True, exist_ok=True)
    family = _compiler_family(fc)
    pic = ["-fpic"] if family == "nvidia" else ["-fPIC"]
    flags = list(flags or ["-O2"])
    objects = []
    with tempfile.TemporaryDirectory() as tmp:
        for src in get_fortran_sources():
            obj = Path(tmp) / (src.stem + ".o")
            cmd = [fc, *flags, *pic, "-c", str(src), "-o", str(obj), *_module_dir_flag(fc, moddir), f"-I{moddir}"]
            if verbose:
                print(" ".join(cmd), flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
            if proc.returncode != 0:
                raise RuntimeError(f"{fc} failed on {src.name}:\n{proc.stderr.strip()[-3000:]}")
            objects.append(str(obj))
        archive = libdir / "libftorch.a"
        archive.unlink(missing_ok=True)
        ar = shutil.which("ar") or "ar"
        proc = subprocess.run([ar, "rcs", str(archive), *objects], capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"ar failed: {proc.stderr.strip()}")
    version = subprocess.run([fc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    core = get_libdir()
    pc = pcdir / "ftorch.pc"
    pc.write_text(
        f"# FTorch's Fortran modules built for {fc} by `python -m ftorch build-modules`; the C++ layer\n"
        f"# stays in the installed wheel ({core}).\n"
        f"prefix={prefix}\n"
        "libdir=${prefix}/lib\n"
        "fortran_moddir=${prefix}/include/fortran\n"
        f"fortran_compiler={version[0] if version else fc}\n"
        f"ftorch_libdir={core}\n"
        f"torch_version={torch_version}\n\n"
        "Name: ftorch\n"
        f"Description: Fortran bindings to LibTorch (modules built for {fc})\n"
        f"Version: {__version__}\n"
        f"Cflags: -I{get_include()} -I${{fortran_moddir}}\n"
        "Libs: -L${libdir} -lftorch -L${ftorch_libdir} -Wl,-rpath,${ftorch_libdir} -lftorch_c\n")
    return pc
