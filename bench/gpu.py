"""Training steps on a GPU with and without CUDA graphs: FTorch's torch_train_step (eager, and with
cuda_graph=.true.) side by side with PyTorch (eager, and the whole step as one torch.cuda.graph with
Adam(capturable=True)), same MLPs (float32), Adam, MSE, the loss read every step, interleaved.

    python bench/gpu.py                  # on a machine whose torch sees a CUDA device
    python bench/gpu.py --device cpu --quick
        # smoke run without a GPU: the Fortran graph rows run the captured work uncaptured
        # (FTORCH_CUDA_GRAPHS=eager), PyTorch's graph rows are left out

Writes bench/results/gpu.{md,json} (--out DIR elsewhere). The target (issue 23): the Fortran graph
step within 1.1x of PyTorch's graph step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (features, hidden, batch): the MLPs of issue 23's measurements.
SIZES = [(16, 64, 1), (16, 64, 64), (64, 256, 256), (256, 1024, 4096)]
QUICK_SIZES = [(16, 64, 1), (16, 64, 8)]


def run(cmd, env=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def result(output: str) -> float:
    for line in output.splitlines():
        if line.startswith("RESULT"):
            return float(line.split()[1])
    raise RuntimeError(f"no RESULT line in:\n{output}")


def write_results(args, torch, rows, reps, warmup, steps):
    """gpu.json and gpu.md in args.out for the rows measured so far."""
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (graph rows uncaptured)"
    results = {"device": device_name, "torch": torch.__version__, "warmup": warmup, "steps": steps, "reps": reps,
               "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(results, indent=2) + "\n")
    head = ["MLP, batch", "Fortran eager", "Fortran graph", "Python eager"]
    if args.device == "cuda":
        head += ["Python graph", "Fortran graph / Python graph"]
    lines = [f"Training step (Adam, MSE, float32, loss read every step), median of {reps} runs of {steps} steps, "
             f"{device_name}, torch {torch.__version__}. Microseconds per step.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["median_us"]
        cells = [f"{r['features']}-{r['hidden']}-{r['hidden']}-{r['features']}, {r['batch']}",
                 f"{m['fortran_eager']:.1f}", f"{m['fortran_graph']:.1f}", f"{m['python_eager']:.1f}"]
        if args.device == "cuda":
            cells += [f"{m['python_graph']:.1f}", f"{r['fortran_graph_over_python_graph']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    command = "python bench/gpu.py" + (f" --sizes {args.sizes}" if args.sizes else "") + f" --reps {reps}"
    lines += ["", f"Written by `{command}` on {datetime.date.today().isoformat()}, rows interleaved as they ran "
                  "(the rows of that run only: earlier runs and what they show are in docs/guide/performance.md)."]
    (args.out / "gpu.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--sizes", default=None,
                        help="comma-separated row numbers (0-based) of the MLPs to run, e.g. 0,1,2 (default: all)")
    args = parser.parse_args(argv)

    import ftorch
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch: use --device cpu for a smoke run", file=sys.stderr)
        return 2
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = [sizes[int(k)] for k in args.sizes.split(",")]
    reps = args.reps or (1 if args.quick else 5)
    warmup, steps = (5, 20) if args.quick else (20, 200)
    work = Path(tempfile.mkdtemp(prefix="ftorch-bench-gpu-"))
    build_dir = args.build_dir or work / "build"
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env["PATH"]) else []
    run(["cmake", "-S", HERE / "gpu", "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={ftorch.get_cmake_prefix_path()}"], env=env)
    run(["cmake", "--build", build_dir], env=env)
    fortran = [build_dir / "bench_graph"]
    python = [sys.executable, HERE / "python" / "bench_graph.py"]
    eager_env = dict(env, FTORCH_CUDA_GRAPHS="eager") if args.device == "cpu" else env

    programs = {"fortran_eager": (fortran, "eager", env), "fortran_graph": (fortran, "graph", eager_env),
                "python_eager": (python, "eager", env)}
    if args.device == "cuda":
        programs["python_graph"] = (python, "graph", env)
    rows = []
    for features, hidden, batch in sizes:
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                  torch.nn.Tanh(), torch.nn.Linear(hidden, features))
        model = work / f"mlp_{features}_{hidden}.pt"
        torch.jit.script(mlp).save(str(model))
        samples = {name: [] for name in programs}
        for _ in range(reps):
            for name, (cmd, mode, penv) in programs.items():
                out = run([*cmd, model, features, batch, args.device, mode, warmup, steps], env=penv)
                samples[name].append(result(out))
        med = {name: statistics.median(v) for name, v in samples.items()}
        row = {"features": features, "hidden": hidden, "batch": batch, "median_us": med}
        if "python_graph" in med:
            row["fortran_graph_over_python_graph"] = med["fortran_graph"] / med["python_graph"]
        row["fortran_graph_over_fortran_eager"] = med["fortran_graph"] / med["fortran_eager"]
        rows.append(row)
        # Written after every row: a run stopped by a time limit keeps the rows it finished.
        write_results(args, torch, rows, reps, warmup, steps)
        print(f"{features}-{hidden}-{hidden}-{features}, batch {batch}: "
              + ", ".join(f"{k} {v:.1f} us" for k, v in med.items()), flush=True)
    print((args.out / "gpu.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
