"""FTorch helper: where an installed FTorch keeps its files and how to build against them.

Importing this package does not import torch (it is fast); ``doctor``, ``export`` and
``inspect_model`` load it when called.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import _build_info

__all__ = [
    "fpm_mpi_dependency",
    "get_fortran_mpi_source",
    "get_torchfort_mpi_source",
    "__version__",
    "torch_version",
    "installed_torch_version",
    "get_package_dir",
    "get_cmake_prefix_path",
    "get_cmake_dir",
    "get_include",
    "get_libdir",
    "get_library",
    "get_fortran_source_dir",
    "get_fortran_sources",
    "get_pkgconfig_dir",
    "fpm_dependency",
    "fpm_flags",
    "link_flags",
    "export",
    "inspect_model",
]

__version__: str = _build_info.version
#: The torch release the C++ layer was compiled against (e.g. "2.13.0+cpu").
torch_version: str = _build_info.torch_version

# The built files (library, CMake package, sources) sit next to _build_info.py, also in an
# editable install where the Python sources are redirected to the source tree.
_ROOT = Path(_build_info.__file__).resolve().parent


def installed_torch_version() -> str | None:
    """Version of the torch distribution installed in this environment (None if absent)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def get_package_dir() -> Path:
    """Root of the installed FTorch files."""
    return _ROOT


def get_cmake_prefix_path() -> Path:
    """Directory to add to CMAKE_PREFIX_PATH for ``find_package(FTorch)``."""
    return _ROOT


def get_cmake_dir() -> Path:
    """Directory holding FTorchConfig.cmake (a value for ``FTorch_DIR``)."""
    return _ROOT / "share" / "cmake" / "FTorch"


def get_include() -> Path:
    """Directory of the C API headers (ftorch_c.h)."""
    return _ROOT / "include"


def get_libdir() -> Path:
    """Directory of the C++ library libftorch_c.so."""
    return _ROOT / "lib"


def get_library() -> Path:
    """Path of the C++ library."""
    return get_libdir() / "libftorch_c.so"


def get_fortran_source_dir() -> Path:
    """Directory of the Fortran module sources."""
    return _ROOT / "src" / "fortran"


def get_fortran_sources() -> list[Path]:
    """Fortran sources in compilation order (each module after those it uses)."""
    return [get_fortran_source_dir() / name for name in _build_info.fortran_sources]


def get_pkgconfig_dir() -> Path:
    """Directory to add to PKG_CONFIG_PATH for ``pkg-config ftorch``."""
    return get_libdir() / "pkgconfig"


def link_flags() -> str:
    """Linker flags for a program using FTorch (library path, run path, library)."""
    libdir = get_libdir()
    return f"-L{libdir} -Wl,-rpath,{libdir} -lftorch_c"


def fpm_dependency(project_dir: str | os.PathLike[str] = ".") -> str:
    """The ``[dependencies]`` line of an fpm.toml in ``project_dir``.

    fpm 0.12 only accepts relative paths, so the path is relative to the project directory.
    """
    rel = os.path.relpath(_ROOT, Path(project_dir).resolve())
    return f'ftorch = {{ path = "{Path(rel).as_posix()}" }}'


def fpm_mpi_dependency(project_dir: str | os.PathLike[str] = ".") -> str:
    """The ``[dependencies]`` line of the ``ftorch_mpi`` package (module ftorch_mpi, compiled by
    fpm with the project's MPI) for an fpm.toml in ``project_dir``."""
    rel = os.path.relpath(_ROOT / "mpi", Path(project_dir).resolve())
    return f'ftorch_mpi = {{ path = "{Path(rel).as_posix()}" }}'


def get_torchfort_mpi_source() -> Path:
    """The C source of TorchFort's distributed models (torchfort_create_distributed_model), to
    compile with your MPI's C compiler (mpicc) and link into the program."""
    return _ROOT / "mpi" / "torchfort_mpi.c"


def get_fortran_mpi_source(interface: str = "mpi_f08") -> Path:
    """The source of module ftorch_mpi, to compile with your MPI wrapper after the other sources:
    over ``use mpi_f08`` (default), or over ``include 'mpif.h'`` (``interface="mpif.h"``) for a
    compiler that cannot read your MPI's mpi_f08 module (one built by another compiler)."""
    if interface not in ("mpi_f08", "mpif.h"):
        raise ValueError(f"interface must be 'mpi_f08' or 'mpif.h', not {interface!r}")
    return _ROOT / "mpi" / ("src" if interface == "mpi_f08" else "mpifh") / "ftorch_mpi.f90"


def fpm_flags() -> str:
    """Flags for fpm's FPM_LDFLAGS (or ``--link-flag``): fpm cannot set -L from a manifest."""
    return link_flags()


def export(model_or_spec, inputs, torchscript=None, pt2=None, **options):
    """Write a model for Fortran as TorchScript (``torchscript``) and/or an AOTInductor package
    (``pt2``), then load each file back, run it on inputs laid out as Fortran passes them and compare
    with the eager model. ``model_or_spec``: an ``nn.Module`` or ``"file.py:Name"``; ``inputs``: a
    tensor, ``(shape, dtype)`` or ``"8,5:float32"`` per tensor argument of forward. Options:
    train_package (a training package to write: forward and backward compiled, trainable from
    Fortran without TorchScript, checked against eager autograd), trace, dynamic_batch, min_batch, max_batch, check, training, freeze, init_kwargs, weights,
    device, rtol, atol, seed. Returns a report (``.ok``, ``.to_dict()``, ``str()``); raises
    ``ftorch.ExportError`` on failure. Same as ``python -m ftorch export``."""
    from ._export import export as _export

    return _export(model_or_spec, inputs, torchscript, pt2, **options)


def inspect_model(path, inputs=None, device="cpu"):
    """Describe a TorchScript model or AOTInductor package (.pt2) as a dict: forward's inputs and
    outputs (their shapes when ``inputs`` are given, or recorded in the package), parameters,
    buffers, training mode and a Fortran snippet (key ``"fortran"``). Same as ``python -m ftorch
    inspect``."""
    from ._inspect import inspect_model as _inspect

    return _inspect(path, inputs, device=device)


def __getattr__(name: str):
    # ftorch.ExportError without importing the export code (or torch) before it is needed.
    if name in ("ExportError", "UsageError"):
        from . import _export_errors

        return getattr(_export_errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
