"""Command line of the FTorch helper: ``python -m ftorch --cmake-prefix-path``, ``... doctor``,
``... export``, ``... inspect``."""

from __future__ import annotations

import argparse
import json
import os
import sys

import ftorch


def _fail(prog: str, exc: BaseException) -> int:
    """One line on stderr for an expected error; its exit code (2: usage, 1: failure)."""
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return getattr(exc, "exit_code", 1)


def _print(text) -> None:
    """Print to stdout; a reader that stops early (| head) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _unexpected(prog: str, exc: BaseException) -> int:
    if os.environ.get("FTORCH_TRACEBACK") == "1":
        raise exc
    print(f"{prog}: error: {type(exc).__name__}: {exc} (FTORCH_TRACEBACK=1 shows the traceback)", file=sys.stderr)
    return 1


def _add_export(subparsers) -> None:
    prog = "python -m ftorch export"
    parser = subparsers.add_parser(
        "export", help="write a model for Fortran and check it",
        description="Write a PyTorch model as TorchScript (-o) and/or an AOTInductor package (--pt2) for "
                    "Fortran, then load each file back, run it on inputs laid out as Fortran passes them "
                    "(column-major) and compare with the eager model.",
        epilog="Exit status: 0 written and checked, 1 export or check failed, 2 usage error. Example: "
               f"{prog} model.py:MLP --input 8,5 -o mlp.pt --pt2 mlp.pt2 --dynamic-batch",
    )
    parser.add_argument("model", metavar="MODEL",
                        help="path/to/file.py:Name or package.module:Name: an nn.Module class, or a function "
                             "returning a module (file.py alone: its only nn.Module class)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="one per tensor argument of forward, in order: the Fortran array's shape and dtype, "
                             "e.g. 8,5 or 8,3:float64 (dtype default float32; also float16, bfloat16, int8..int64, "
                             "uint8, bool)")
    parser.add_argument("-o", "--output", metavar="FILE.pt", help="TorchScript file to write")
    parser.add_argument("--pt2", metavar="FILE.pt2", help="AOTInductor package to write (torch.export + "
                                                          "aoti_compile_and_package; needs a C++ compiler)")
    parser.add_argument("--trace", action="store_true",
                        help="TorchScript by torch.jit.trace on the example inputs instead of torch.jit.script")
    parser.add_argument("--freeze", action="store_true",
                        help="torch.jit.freeze the TorchScript (inference only: parameters become constants)")
    parser.add_argument("--train", nargs="?", const=True, default=False, metavar="FILE.pt2",
                        help="with a file: write a training package (forward and backward compiled by AOTInductor, "
                             "trainable from Fortran without TorchScript); alone: keep training mode in the "
                             "TorchScript (default: eval mode; the --pt2 package is always eval)")
    parser.add_argument("--dynamic-batch", action="store_true",
                        help="dim 0 of every input of the .pt2 may take any size in [--min-batch, --max-batch]; "
                             "the check also runs other batch sizes")
    parser.add_argument("--min-batch", type=int, default=1, metavar="N",
                        help="smallest batch size with --dynamic-batch (default 1; use 2 if the check fails "
                             "at batch 1)")
    parser.add_argument("--max-batch", type=int, default=None, metavar="N",
                        help="largest batch size with --dynamic-batch (default: unbounded)")
    parser.add_argument("--init-kwargs", metavar="JSON", help='keyword arguments for the class, e.g. \'{"n": 5}\'')
    parser.add_argument("--weights", metavar="FILE",
                        help="state_dict (or checkpoint holding one) to load, written by torch.save")
    parser.add_argument("--device", default="cpu", help="device of the model and inputs (default cpu)")
    parser.add_argument("--no-check", action="store_true", help="write the files without checking them")
    parser.add_argument("--rtol", type=float, help="relative tolerance of the check (default: per dtype)")
    parser.add_argument("--atol", type=float, help="absolute tolerance of the check (default: per dtype)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    parser.add_argument("--dtype", metavar="DTYPE",
                        help="float32 or float64: convert the model's parameters and buffers, and the inputs "
                             "given without a dtype, to it (default: as the model is, inputs float32)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=_run_export)


def _run_export(args, parser) -> int:
    prog = parser.prog
    from ._export import export
    from ._export_errors import ExportError, UsageError

    try:
        init_kwargs = None
        if args.init_kwargs is not None:
            try:
                init_kwargs = json.loads(args.init_kwargs)
            except ValueError as exc:
                raise UsageError(f"--init-kwargs is not JSON: {exc}") from None
            if not isinstance(init_kwargs, dict):
                raise UsageError('--init-kwargs must be a JSON object such as \'{"n": 5}\'')
        train_package = args.train if isinstance(args.train, str) else None
        if train_package is not None and not train_package.endswith(".pt2"):
            raise UsageError(f"--train {train_package}: a training package is a .pt2 file (alone, --train keeps the "
                             "TorchScript in training mode; put it after MODEL)")
        report = export(args.model, args.input, torchscript=args.output, pt2=args.pt2, train_package=train_package,
                        trace=args.trace,
                        dynamic_batch=args.dynamic_batch, min_batch=args.min_batch, max_batch=args.max_batch,
                        check=not args.no_check, training=args.train is True, freeze=args.freeze, init_kwargs=init_kwargs,
                        weights=args.weights, device=args.device, rtol=args.rtol, atol=args.atol, seed=args.seed,
                        dtype=args.dtype)
    except ExportError as exc:
        if exc.report is not None:
            _print(json.dumps(exc.report.to_dict(), indent=2) if args.json else exc.report)
        return _fail(prog, exc)
    except Exception as exc:
        return _unexpected(prog, exc)
    _print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0


def _add_inspect(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect", help="inputs, outputs, parameters and a Fortran snippet of a model",
        description="Show what Fortran code needs to call a TorchScript model or an AOTInductor package "
                    "(.pt2): forward's inputs and outputs, parameters and buffers, training mode, and a "
                    "Fortran snippet.",
    )
    parser.add_argument("file", metavar="MODEL", help="TorchScript file (.pt) or AOTInductor package (.pt2)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="shape and dtype of each tensor argument of forward: run the model once and report "
                             "the outputs' shapes")
    parser.add_argument("--device", default="cpu", help="device to load a TorchScript model on (default cpu)")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    parser.set_defaults(run=_run_inspect)


def _run_inspect(args, parser) -> int:
    prog = parser.prog
    from ._export_errors import ExportError
    from ._inspect import format_inspection, inspect_model

    try:
        info = inspect_model(args.file, args.input or None, device=args.device)
    except ExportError as exc:
        return _fail(prog, exc)
    except Exception as exc:
        return _unexpected(prog, exc)
    _print(json.dumps(info, indent=2) if args.json else format_inspection(info))
    return 0


def _add_modules(subparsers) -> None:
    """check-modules: can a compiler use the prebuilt module files; build-modules: build them for
    another compiler into a directory with its own ftorch.pc."""
    from . import _modules

    check = subparsers.add_parser("check-modules", help="can a Fortran compiler use the prebuilt modules",
                                  description=_modules.check_compiler.__doc__)
    build = subparsers.add_parser("build-modules", help="build the Fortran modules for another compiler",
                                  description=_modules.build_modules.__doc__)
    for parser in (check, build):
        parser.add_argument("--fc", required=True,
                            help="Fortran compiler (a command such as gfortran, flang-new-19, ifx)")
    check.add_argument("--module-dir", help="directory of the .mod files (default: the prebuilt ones)")
    build.add_argument("--prefix", required=True, help="directory to write include/fortran, lib/libftorch.a "
                                                       "and lib/pkgconfig/ftorch.pc into")
    build.add_argument("--flags", default="-O2", help='compiler flags (default "-O2")')
    build.add_argument("-v", "--verbose", action="store_true", help="print each compile command")
    check.set_defaults(run=_run_check_modules)
    build.set_defaults(run=_run_build_modules)


def _run_check_modules(args, parser) -> int:
    from . import _modules

    check = _modules.check_compiler(args.fc, args.module_dir)
    print(check.message, file=sys.stdout if check.ok else sys.stderr)
    return 0 if check.ok else 1


def _run_build_modules(args, parser) -> int:
    from . import _modules

    try:
        pc = _modules.build_modules(args.fc, args.prefix, args.flags.split(), verbose=args.verbose)
    except RuntimeError as exc:
        return _fail(parser.prog, exc)
    print(f"built FTorch's modules with {args.fc}; use them with:\n"
          f"  export PKG_CONFIG_PATH={pc.parent}${{PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}}\n"
          f"  {args.fc} app.f90 $(pkg-config --cflags --libs ftorch)\n{pc}")
    return 0


def _add_doctor_and_plot(subparsers) -> None:
    doctor = subparsers.add_parser("doctor", help="check this installation and the tools around it")
    doctor.set_defaults(run=_run_doctor)
    plot = subparsers.add_parser("plot-loss", help="loss curve of a training log")
    plot.add_argument("log", help="training log (the lines torch_train_step writes)")
    plot.add_argument("-o", "--output", help="PNG to write (default: LOG with .png)")
    plot.set_defaults(run=_run_plot_loss)
    metrics = subparsers.add_parser("plot-metrics", help="metrics of a TorchFort wandb-hook log (e.g. rewards)")
    metrics.add_argument("log", help="the log enable_wandb_hook writes ($TORCHFORT_LOGDIR/torchfort.log)")
    metrics.add_argument("-m", "--metric", action="append", help="a metric to draw (METRIC or MODEL/METRIC; "
                         "repeatable; default: all)")
    metrics.add_argument("-o", "--output", help="PNG to write (default: LOG with .png)")
    metrics.set_defaults(run=_run_plot_metrics)


def _run_doctor(args, parser) -> int:
    from ._doctor import run

    return run()


def _run_plot_loss(args, parser) -> int:
    from pathlib import Path

    from .plot import plot_loss

    try:
        out = plot_loss(args.log, args.output or Path(args.log).with_suffix(".png"))
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def _run_plot_metrics(args, parser) -> int:
    from pathlib import Path

    from .plot import plot_metrics

    try:
        out = plot_metrics(args.log, args.output or Path(args.log).with_suffix(".png"), args.metric)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="python -m ftorch",
        description="Paths and flags for building Fortran programs against FTorch, and its tools "
                    "(python -m ftorch COMMAND -h for each command).",
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
    paths.add_argument("--fortran-mpi-mpifh-source", action="store_true",
                       help="the same module over mpif.h, for a compiler that cannot read your MPI's mpi_f08 module")
    paths.add_argument("--torchfort-mpi-source", action="store_true",
                       help="C source of TorchFort's distributed models and RL systems, to compile with mpicc "
                            "into the program")
    paths.add_argument("--fpm-flags", action="store_true", help="value for FPM_LDFLAGS")
    paths.add_argument("--link-flags", action="store_true", help="linker flags for plain builds")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_doctor_and_plot(subparsers)
    _add_export(subparsers)
    _add_inspect(subparsers)
    _add_modules(subparsers)
    args = parser.parse_args(argv)
    if args.command is not None:
        return args.run(args, subparsers.choices[args.command])
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
    elif args.fortran_mpi_mpifh_source:
        print(ftorch.get_fortran_mpi_source("mpif.h"))
    elif args.torchfort_mpi_source:
        print(ftorch.get_torchfort_mpi_source())
    elif args.fpm_flags:
        print(ftorch.fpm_flags())
    elif args.link_flags:
        print(ftorch.link_flags())
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
