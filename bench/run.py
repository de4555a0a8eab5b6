"""Overhead of FTorch against C++ LibTorch (the floor: same kernels, no binding) and against
Python/PyTorch eager, measured side by side.

    python bench/run.py                 # full run (several minutes), writes bench/results/latest.{md,json}
    python bench/run.py --quick         # smoke run: tiny sizes, seconds
    python bench/run.py --threads 4     # intra-op threads for all three programs (default 1)
    python bench/run.py --instructions  # also count instructions per training step (valgrind)

The three programs of each case run interleaved (F C P F C P ...) after a warm-up inside each
process; each reports the time of its timed loop. The table gives per-step median and min-max
over the repetitions, and the ratios Fortran/C++ and Python/Fortran of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = ("fortran", "cpp", "python")


def run(cmd, env=None, cwd=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def make_mlp(hidden: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, 16)).double()


def write_models(directory: Path, sizes) -> dict:
    import torch

    paths = {}
    for batch, hidden in sizes:
        path = directory / f"mlp_{hidden}.pt"
        torch.jit.script(make_mlp(hidden)).save(str(path))
        paths[hidden] = path
    return paths


def write_compiled(directory: Path, sizes) -> dict:
    """The same MLPs exported (torch.export) and compiled by AOTInductor into .pt2 packages, one per
    (batch, hidden), batch static as a deployment would fix it: written as users write them, by
    `python -m ftorch export --pt2` (whose package records its inputs: FTorch checks calls itself)."""
    import torch

    import ftorch

    paths = {}
    for batch, hidden in sizes:
        path = directory / f"mlp_{hidden}_b{batch}.pt2"
        ftorch.export(make_mlp(hidden).eval(), [((batch, 16), torch.float64)], pt2=path, check=False)
        paths[(batch, hidden)] = path
    return paths


def compiled_ratios(results, sizes) -> dict:
    """The .pt2 forward from Fortran against TorchScript from C++ (the issue's targets: <= 0.5 at
    batch 1, <= 1.0 at the largest size) and against TorchScript from Fortran, per size."""
    ratios = {}
    for batch, hidden in sizes:
        compiled = results["cases"].get(f"compiled .pt2 inference, batch {batch}, hidden {hidden}")
        script = results["cases"].get(f"inference, batch {batch}, hidden {hidden}")
        if compiled and script:
            ratios[f"batch {batch}, hidden {hidden}"] = {
                "pt2_fortran_over_torchscript_cpp": compiled["fortran"]["median"] / script["cpp"]["median"],
                "pt2_fortran_over_torchscript_fortran": compiled["fortran"]["median"] / script["fortran"]["median"],
                "pt2_fortran_over_pt2_cpp": compiled["fortran"]["median"] / compiled["cpp"]["median"],
            }
    return ratios


def compiled_table(ratios) -> str:
    rows = ["| forward of the MLP | .pt2 from Fortran / TorchScript from C++ | .pt2 / TorchScript, both from "
            "Fortran | .pt2 from Fortran / .pt2 from C++ |", "|---|---|---|---|"]
    for name, r in ratios.items():
        rows.append(f"| {name} | {r['pt2_fortran_over_torchscript_cpp']:.2f} | "
                    f"{r['pt2_fortran_over_torchscript_fortran']:.2f} | {r['pt2_fortran_over_pt2_cpp']:.2f} |")
    return "\n".join(rows) + "\n"


def build(build_dir: Path) -> dict:
    import ftorch
    import torch.utils

    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env["PATH"]) else []
    run(["cmake", "-S", HERE, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={ftorch.get_cmake_prefix_path()}",
         f"-DFTORCH_BENCH_TORCH_DIR={Path(torch.utils.cmake_prefix_path) / 'Torch'}"], env=env)
    run(["cmake", "--build", build_dir], env=env)
    return {"fortran": [build_dir / "bench_fortran"], "cpp": [build_dir / "bench_cpp"],
            "idiom": [build_dir / "bench_idiom"], "python": [sys.executable, HERE / "python" / "bench.py"]}


def build_upstream(source: Path, build_dir: Path) -> list:
    """Upstream FTorch (a Cambridge-ICCS/FTorch checkout at `source`) built and installed against
    the running environment's torch, then bench/fortran/idiom.f90 built against it (bench/upstream):
    the command of the same program as build()'s "idiom", on upstream's library. Side by side only
    where that source is at hand (CI has no network: its rows stay against C++)."""
    import torch.utils

    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env["PATH"]) else []
    torch_prefix = Path(torch.utils.cmake_prefix_path)
    build_dir = Path(build_dir).resolve()
    library, prefix, program = build_dir / "ftorch", build_dir / "prefix", build_dir / "program"
    run(["cmake", "-S", source, "-B", library, *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_INSTALL_PREFIX={prefix}", f"-DCMAKE_PREFIX_PATH={torch_prefix}", "-DGPU_DEVICE=NONE",
         "-DFTORCH_BUILD_UNIT_TESTS=OFF", "-DFTORCH_BUILD_INTEGRATION_TESTS=OFF"], env=env)
    run(["cmake", "--build", library, "--target", "install"], env=env)
    run(["cmake", "-S", HERE / "upstream", "-B", program, *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix};{torch_prefix}"], env=env)
    run(["cmake", "--build", program], env=env)
    return [program / "bench_idiom"]


def parse(output: str) -> dict:
    return {k: float(v) for k, v in re.findall(r"^(\w+)\s+(\S+)\s*$", output, re.M)}


def measure(commands, args, iterations, reps, env):
    """Interleaved repetitions; per-step seconds and peak RSS per program."""
    results = {p: {"step_seconds": [], "peak_rss_kib": 0} for p in PROGRAMS}
    for _ in range(reps):
        for p in PROGRAMS:
            out = parse(run([*commands[p], *args], env=env))
            results[p]["step_seconds"].append(out["seconds"] / iterations)
            results[p]["peak_rss_kib"] = max(results[p]["peak_rss_kib"], int(out["peak_rss_kib"]))
    for p in PROGRAMS:
        s = results[p]["step_seconds"]
        results[p].update(median=statistics.median(s), min=min(s), max=max(s))
    results["fortran_over_cpp"] = results["fortran"]["median"] / results["cpp"]["median"]
    results["python_over_fortran"] = results["python"]["median"] / results["fortran"]["median"]
    return results


def measure_embedding(commands, model, script, iterations, reps, env) -> dict:
    """The training step of batch 1, hidden 32 through TorchScript from Fortran, through an embedded
    Python function from Fortran, and the same Python function called from Python; and an empty
    Python function called from Fortran and from Python. Interleaved repetitions, per-call medians.
    The Python functions time themselves ("inner"): a call's cost beyond the work Python does anyway
    is outer - inner, which does not depend on how fast that work ran in this process."""
    runs = {
        "torchscript_fortran": [*commands["fortran"], "train", model, 1, 16, 16, iterations],
        "pymodule_fortran": [*commands["fortran"], "pymodule", model, 1, 16, 16, iterations, script],
        "pymodule_python": [*commands["python"], "pymodule", model, 1, 16, 16, iterations, script],
        "noop_fortran": [*commands["fortran"], "pycall", model, 1, 16, 16, iterations * 5, script],
        "noop_python": [*commands["python"], "pycall", model, 1, 16, 16, iterations * 5, script],
    }
    times = {k: [] for k in runs}
    beyond = {k: [] for k in runs if "torchscript" not in k}
    for _ in range(reps):
        for k, cmd in runs.items():
            n = iterations * 5 if k.startswith("noop") else iterations
            out = parse(run(cmd, env=env))
            times[k].append(out["seconds"] / n)
            if k in beyond:
                beyond[k].append((out["seconds"] - out["inner_seconds"]) / n)
    result = {k: statistics.median(v) for k, v in times.items()}
    result.update({f"{k}_beyond_work": statistics.median(v) for k, v in beyond.items()})
    return result


def embedding_table(e) -> str:
    us = 1e6
    return "\n".join([
        "| embedded Python (batch 1, hidden 32), per call | Fortran → Python (torch_pymodule) | Python → Python | "
        "Fortran → TorchScript |",
        "|---|---|---|---|",
        f"| training step (Adam, MSE) | {e['pymodule_fortran'] * us:.3g} µs | {e['pymodule_python'] * us:.3g} µs | "
        f"{e['torchscript_fortran'] * us:.3g} µs |",
        f"| of which outside the Python function | {e['pymodule_fortran_beyond_work'] * us:.2g} µs | "
        f"{e['pymodule_python_beyond_work'] * us:.2g} µs | |",
        f"| empty function (2 tensors in, a float out) | {e['noop_fortran'] * us:.3g} µs | "
        f"{e['noop_python'] * us:.3g} µs | |",
    ]) + "\n"


INSTRUCTION_LENGTHS = (200, 1200)


def valgrind_instructions(command) -> int:
    """Instructions a program executes (valgrind's cachegrind, one intra-op thread; Python's string
    hashing fixed, which otherwise changes dictionary probes from run to run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                               *map(str, command)], capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                                       PYTHONHASHSEED="0"))
        m = re.search(r"summary: (\d+)", out.read_text()) if out.exists() else None
        if proc.returncode != 0 or m is None:
            raise RuntimeError(f"valgrind {' '.join(map(str, command))} failed:\n{proc.stderr[-3000:]}")
        return int(m.group(1))


def per_step(short_total: int, long_total: int, lengths=INSTRUCTION_LENGTHS) -> float:
    """Instructions per step from runs of two lengths (start-up cancels; each run also warms up for
    a tenth of its length, hence the 1.1)."""
    return (long_total - short_total) / (1.1 * (lengths[1] - lengths[0]))


def instructions_per_step(commands, make_args):
    """valgrind instruction counts per step of the Fortran and C++ programs. make_args(n) gives the
    command-line arguments for n steps."""
    if shutil.which("valgrind") is None:
        return None
    try:
        counts = {p: per_step(*(valgrind_instructions([*commands[p], *make_args(n)]) for n in INSTRUCTION_LENGTHS))
                  for p in ("fortran", "cpp")}
    except RuntimeError:
        return None
    counts["fortran_over_cpp"] = counts["fortran"] / counts["cpp"]
    return counts


def custom_function_overhead(results) -> dict:
    """Per program: time of a custom-function application + backward over the same operation
    with built-in operators."""
    out = {}
    for name, r in results["cases"].items():
        if name.startswith("custom function"):
            builtin = results["cases"].get(name.replace("custom function", "built-in"))
            if builtin:
                size = name.split(", ", 1)[1]
                out[size] = {p: r[p]["median"] / builtin[p]["median"] for p in PROGRAMS}
    return out


def table(results) -> str:
    lines = ["| case | Fortran (FTorch) | C++ (LibTorch) | Python (PyTorch) | Fortran/C++ | Python/Fortran |",
             "|---|---|---|---|---|---|"]

    def fmt(r):
        return f"{r['median'] * 1e6:.3g} µs ({r['min'] * 1e6:.3g}–{r['max'] * 1e6:.3g})"

    for name, r in results["cases"].items():
        lines.append(f"| {name} | {fmt(r['fortran'])} | {fmt(r['cpp'])} | {fmt(r['python'])} | "
                     f"{r['fortran_over_cpp']:.3f} | {r['python_over_fortran']:.2f} |")
    lines.append("")
    lines.append("| peak RSS (MiB) | Fortran | C++ | Python |")
    lines.append("|---|---|---|---|")
    for name, r in results["cases"].items():
        lines.append(f"| {name} | " + " | ".join(f"{r[p]['peak_rss_kib'] / 1024:.0f}" for p in PROGRAMS) + " |")
    overhead = custom_function_overhead(results)
    if overhead:
        lines.append("")
        lines.append("| custom function / built-in operators (y = x*x + backward) | Fortran | C++ | Python |")
        lines.append("|---|---|---|---|")
        for name, r in overhead.items():
            lines.append(f"| {name} | " + " | ".join(f"{r[p]:.2f}" for p in PROGRAMS) + " |")
    if results.get("compiled"):
        lines.append("")
        lines.append(compiled_table(results["compiled"]).rstrip("\n"))
    if results.get("embedding"):
        lines.append("")
        lines.append(embedding_table(results["embedding"]).rstrip("\n"))
    rss = results.get("rss")
    if rss:
        lines.append("")
        lines.append(f"RSS of the training step (batch 1, hidden 32) at step 10^3 and at step "
                     f"{rss['steps']:.0e}: " + ", ".join(
                         f"{p} {rss[p]['rss_at_1000'] / 1024:.1f} → {rss[p]['rss_at_end'] / 1024:.1f} MiB"
                         for p in PROGRAMS))
    ins = results.get("instructions")
    if ins:
        lines.append("")
        lines.append("| instructions per step (valgrind) | Fortran | C++ | Fortran/C++ |")
        lines.append("|---|---|---|---|")
        for name, c in ins.items():
            if c:
                lines.append(f"| {name} | {c['fortran']:,.0f} | {c['cpp']:,.0f} | {c['fortran_over_cpp']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few iterations (smoke test)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every program (default 1)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 5, quick 1)")
    parser.add_argument("--instructions", action="store_true", help="valgrind instruction counts (slow)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="directory of latest.md / latest.json")
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--only", default="", help="comma-separated substrings: run the matching cases only")
    args = parser.parse_args(argv)

    quick = args.quick
    reps = args.reps or (1 if quick else 5)
    sizes = [(1, 32), (4, 16)] if quick else [(1, 32), (64, 256), (256, 1024)]
    steps = {32: 20000, 256: 2000, 1024: 200, 16: 50} if not quick else {32: 50, 16: 50}
    build_dir = args.build_dir or (HERE.parent / "build" / "bench")
    work = Path(tempfile.mkdtemp(prefix="ftorch-bench-"))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))

    commands = build(build_dir)
    models = write_models(work, sizes)
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "python": platform.python_version(), "threads": args.threads},
               "quick": quick, "cases": {}}
    try:
        import torch

        results["machine"]["torch"] = torch.__version__
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            results["machine"]["cpu"] = names[0]
    except OSError:
        pass

    only = [s for s in args.only.split(",") if s]

    def case(name, cmd, n):
        if only and not any(s in name for s in only):
            return
        print(f"measuring {name} ...", flush=True)
        results["cases"][name] = measure(commands, cmd, n, reps, env)

    for batch, hidden in sizes:
        n = steps[hidden]
        for mode in ("train", "infer"):
            name = f"{'training step' if mode == 'train' else 'inference'}, batch {batch}, hidden {hidden}"
            case(name, [mode, models[hidden], batch, 16, 16, n], n)
    compiled_sizes = sizes if not quick else sizes[:1]
    if not only or any(s in "compiled .pt2 inference" for s in only):
        print("compiling .pt2 packages (AOTInductor) ...", flush=True)
        packages = write_compiled(work, compiled_sizes)
        for batch, hidden in compiled_sizes:
            n = steps[hidden]
            case(f"compiled .pt2 inference, batch {batch}, hidden {hidden}",
                 ["compiled", packages[(batch, hidden)], batch, 16, 16, n], n)
    for elements in ((1, 1000) if not quick else (1, 10)):
        n = 20000 if not quick else 100
        case(f"c = a*b + a - b/2, {elements} element{'s' if elements > 1 else ''}", ["ops", elements, n], n)
    for elements in ((10**2, 10**4, 10**6, 10**8) if not quick else (10**2, 10**4)):
        n = 20000 if not quick else 100
        case(f"from_array + delete, 10^{len(str(elements)) - 1} elements", ["from_array", elements, n], n)

    for elements in ((1, 1000) if not quick else (1, 10)):
        n = 10000 if not quick else 100
        plural = "s" if elements > 1 else ""
        case(f"custom function y = x*x + backward, {elements} element{plural}", ["custom", elements, n], n)
        case(f"built-in y = x*x + backward, {elements} element{plural}", ["builtin", elements, n], n)

    if not only or "embedded" in only:
        print("measuring embedded Python ...", flush=True)
        results["embedding"] = measure_embedding(commands, models[32], HERE / "python" / "pystep.py",
                                                 5000 if not quick else 50, reps, env)

    if not only or "RSS" in only:
        rss_steps = 100000 if not quick else 1100
        print("measuring RSS over a long training run ...", flush=True)
        rss = {"steps": rss_steps}
        for p in PROGRAMS:
            out = parse(run([*commands[p], "rss", models[32], 1, 16, 16, rss_steps], env=env))
            rss[p] = {"rss_at_1000": out["rss_at_1000"], "rss_at_end": out["rss_at_end"]}
        results["rss"] = rss
    if args.instructions:
        print("counting instructions (valgrind) ...", flush=True)
        results["instructions"] = {
            "training step, batch 1, hidden 32": instructions_per_step(
                commands, lambda n: ["train", models[32], 1, 16, 16, n]),
            "c = a*b + a - b/2, 1 element": instructions_per_step(commands, lambda n: ["ops", 1, n],
                                                                  (2000, 12000)),
            "from_array + delete, 10^2 elements": instructions_per_step(
                commands, lambda n: ["from_array", 100, n], (2000, 12000)),
        }

    results["custom_function_overhead"] = custom_function_overhead(results)
    results["compiled"] = compiled_ratios(results, compiled_sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    m = results["machine"]
    header = (f"Measured on {m['cpu']} ({m['cores']} cores), {m['threads']} intra-op thread(s), torch "
              f"{m.get('torch', '?')}, Python {m['python']}{' (quick smoke run)' if quick else ''}.\n\n")
    (args.out / "latest.md").write_text(header + table(results))
    print(header + table(results))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
