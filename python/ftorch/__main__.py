"""Command line of the FTorch helper: ``python -m ftorch --cmake-prefix-path``, ``... doctor``."""

from __future__ import annotations

import argparse
import sys

import ftorch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ftorch",
        description="Paths and flags for building Fortran programs against FTorch.",
    )
    paths = parser.add_mutually_exclusive_group()
    paths.add_argument("--version", action="store_true", help="FTorch version and the torch it was built for")
    paths.add_argument("--cmake-prefix-path", action="store_true", help="value for CMAKE_PREFIX_PATH")
    paths.add_argument("--cmake-dir", action="store_true", help="value for FTorch_DIR")
    paths.add_argument("--includedir", action="store_true", help="directory of the C headers")
    paths.add_argument("--libdir", action="store_true", help="directory of libftorch_c.so")
    paths.add_argument("--fortran-sources", action="store_true", help="Fortran sources, in compilation order")
    paths.add_argument("--pkg-config-path", action="store_true", help="value for PKG_CONFIG_PATH")
    paths.add_argument("--fpm-dependency", action="store_true",
                       help="the fpm.toml dependency line for a project in the current directory")
    paths.add_argument("--fpm-mpi-dependency", action="store_true",
                       help="the fpm.toml dependency line of ftorch_mpi (module ftorch_mpi, built with your MPI)")
    paths.add_argument("--fortran-mpi-source", action="store_true",
                       help="source of module ftorch_mpi, to compile with your MPI after the other sources")
    paths.add_argument("--fpm-flags", action="store_true", help="value for FPM_LDFLAGS")
    paths.add_argument("--link-flags", action="store_true", help="linker flags for plain builds")
    parser.add_argument("command", nargs="?", choices=["doctor", "plot-loss"],
                        help="doctor: check this installation and the tools around it; "
                             "plot-loss LOG [-o PNG]: loss curve of a training log")
    parser.add_argument("log", nargs="?", help="training log for plot-loss")
    parser.add_argument("-o", "--output", help="PNG written by plot-loss (default: LOG with .png)")
    args = parser.parse_args(argv)

    if args.command == "doctor":
        from ._doctor import run

        return run()
    if args.command == "plot-loss":
        from pathlib import Path

        from .plot import plot_loss

        if args.log is None:
            parser.error("plot-loss needs the training log")
        try:
            out = plot_loss(args.log, args.output or Path(args.log).with_suffix(".png"))
        except (OSError, ValueError, RuntimeError) as exc:
            print(f"python -m ftorch plot-loss: {exc}", file=sys.stderr)
            return 1
        print(out)
        return 0
    if args.version:
        print(f"ftorch {ftorch.__version__} (built against torch {ftorch.torch_version})")
    elif args.cmake_prefix_path:
        print(ftorch.get_cmake_prefix_path())
    elif args.cmake_dir:
        print(ftorch.get_cmake_dir())
    elif args.includedir:
        print(ftorch.get_include())
    elif args.libdir:
        print(ftorch.get_libdir())
    elif args.fortran_sources:
        print("\n".join(str(p) for p in ftorch.get_fortran_sources()))
    elif args.pkg_config_path:
        print(ftorch.get_pkgconfig_dir())
    elif args.fpm_dependency:
        print(ftorch.fpm_dependency())
    elif args.fpm_mpi_dependency:
        print(ftorch.fpm_mpi_dependency())
    elif args.fortran_mpi_source:
        print(ftorch.get_fortran_mpi_source())
    elif args.fpm_flags:
        print(ftorch.fpm_flags())
    elif args.link_flags:
        print(ftorch.link_flags())
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
