"""Weak scaling of data-parallel training: the same MLP (>= 1 M parameters), the same local batch
per rank, 1 rank x 1 thread against 2 ranks x 1 thread; FTorch (Fortran, torch_ddp over MPI)
side by side with Python (torch.nn.parallel.DistributedDataParallel on Gloo).

    python bench/distributed.py            # full run (a few minutes), writes bench/results/distributed.{md,json}
    python bench/distributed.py --quick    # smoke run: a tiny model, seconds

For Fortran the step time is split into compute (forward + backward), gradient averaging (the
MPI all-reduces of torch_ddp_sync_gradients, including waiting for the slower rank) and update;
the same run then repeats the loop with the averaging replaced by a plain MPI_Allreduce of as many
float32 values, in the same place of the step (the averaging's floor, in the same context), and
once more with no exchange at all: 2 ranks that never wait for each other, sharing only the
machine (what the cores alone cost, without the exchange and the synchronized steps), and with
nothing but a barrier in the averaging's place (what keeping the ranks in step costs).
PyTorch's DDP overlaps its all-reduce with backward, so only its total is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "python"))


def run(cmd, env=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def result_line(output: str) -> list[float]:
    for line in output.splitlines():
        if line.startswith("RESULT"):
            return [float(v) for v in line.split()[1:]]
    raise RuntimeError(f"no RESULT line in:\n{output}")


def env_one_thread() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_python(ranks: int, args: list) -> list[float]:
    env = env_one_thread()
    env.update(WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, HERE / "python" / "bench_ddp.py", *map(str, args)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(ranks)]
    outputs = [p.communicate() for p in procs]
    for p, (out, err) in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"python DDP rank failed:\n{out}\n{err}")
    return result_line(outputs[0][0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--more-ranks", default="",
                        help="more rank counts for the weak-scaling rows, e.g. 4,8 (a machine with that many cores)")
    args = parser.parse_args(argv)
    more = [int(n) for n in args.more_ranks.split(",") if n.strip()]

    import ftorch
    import torch
    from bench_ddp import mlp

    features, hidden, batch, warmup, steps = (16, 32, 8, 2, 5) if args.quick else (256, 1024, 64, 5, 40)
    repeats = args.repeats or (1 if args.quick else 5)
    work = Path(tempfile.mkdtemp(prefix="ftorch-bench-ddp-"))
    build_dir = args.build_dir or work / "build"
    torch.manual_seed(0)
    model = mlp(features, hidden)
    n_params = sum(p.numel() for p in model.parameters())
    torch.jit.script(model).save(str(work / "mlp.pt"))

    env = env_one_thread()
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env["PATH"]) else []
    run(["cmake", "-S", HERE / "mpi", "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_Fortran_COMPILER=gfortran", f"-DCMAKE_PREFIX_PATH={ftorch.get_cmake_prefix_path()}"], env=env)
    run(["cmake", "--build", build_dir], env=env)
    program = build_dir / "bench_ddp"

    samples = {f"{lang}_{n}": [] for n in (1, 2, *more) for lang in ("fortran", "python")}
    split = []
    update_1 = []
    for _ in range(repeats):
        for ranks in (1, 2, *more):
            out = run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", ranks, program, work / "mlp.pt",
                       features, batch, warmup, steps], env=env)
            values = result_line(out)
            samples[f"fortran_{ranks}"].append(values[0])
            if ranks == 2:
                split.append(values[1:8])
            else:
                update_1.append(values[3])
            samples[f"python_{ranks}"].append(run_python(ranks, [features, hidden, batch, warmup, steps])[0])
    med = {k: statistics.median(v) for k, v in samples.items()}
    compute, comm, update, plain_step, plain, alone, in_step = (statistics.median(s[i] for s in split) for i in range(7))
    results = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "ftorch": ftorch.__version__},
        "model": {"features": features, "hidden": hidden, "parameters": n_params, "local_batch": batch,
                  "dtype": "float32", "optimizer": "SGD(momentum)"},
        "steps": steps, "repeats": repeats,
        "median_ms": med,
        "fortran_2_split_ms": {"compute": compute, "average_gradients": comm, "update": update},
        "plain_mpi_allreduce_ms": plain,
        "step_with_plain_allreduce_ms": plain_step,
        "averaging_over_plain_allreduce": comm / plain,
        "step_with_no_exchange_ms": alone,
        "fortran_1_update_ms": statistics.median(update_1),
        "step_with_barrier_only_ms": in_step,
        "weak_scaling": {"fortran": med["fortran_2"] / med["fortran_1"], "python": med["python_2"] / med["python_1"]},
        "weak_scaling_by_ranks": {str(n): {"fortran": med[f"fortran_{n}"] / med["fortran_1"],
                                           "python": med[f"python_{n}"] / med["python_1"]} for n in (2, *more)},
        "fortran_over_python_2_ranks": med["fortran_2"] / med["python_2"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed.json").write_text(json.dumps(results, indent=2) + "\n")
    table = [
        f"Data-parallel training step, {n_params:,} parameters (float32 MLP {features}-{hidden}-{hidden}-{features}), "
        f"local batch {batch}, 1 thread per rank, median of {repeats} runs of {steps} steps "
        f"({results['machine']['cpu']}, {results['machine']['cores']} cores, torch {torch.__version__}).",
        "",
        "| ranks | FTorch (torch_ddp over MPI) | Python DDP (Gloo) | FTorch/Python |",
        "|---|---|---|---|",
        f"| 1 | {med['fortran_1']:.3f} ms | {med['python_1']:.3f} ms | {med['fortran_1'] / med['python_1']:.2f} |",
        f"| 2 | {med['fortran_2']:.3f} ms | {med['python_2']:.3f} ms | {med['fortran_2'] / med['python_2']:.2f} |",
        f"| 2 ranks / 1 rank (weak scaling) | {results['weak_scaling']['fortran']:.3f} | "
        f"{results['weak_scaling']['python']:.3f} | |",
        *(f"| {n} | {med[f'fortran_{n}']:.3f} ms ({med[f'fortran_{n}'] / med['fortran_1']:.3f}x 1 rank) | "
          f"{med[f'python_{n}']:.3f} ms ({med[f'python_{n}'] / med['python_1']:.3f}x) | "
          f"{med[f'fortran_{n}'] / med[f'python_{n}']:.2f} |" for n in more),
        "",
        f"FTorch on 2 ranks per step: compute {compute:.3f} ms, gradient averaging {comm:.3f} ms, update {update:.3f} ms "
        f"(on 1 rank: {statistics.median(update_1):.3f} ms); "
        f"the same loop with a plain MPI_Allreduce of the same {4 * n_params / 1e6:.1f} MB in place of the averaging: "
        f"{plain:.3f} ms for the all-reduce (averaging / plain = {comm / plain:.2f}), {plain_step:.3f} ms per step. "
        f"With no exchange at all (each rank trains alone, at its own pace): {alone:.3f} ms per step, "
        f"{alone / med['fortran_1']:.3f}x the 1-rank step; with only a barrier in the averaging's place: "
        f"{in_step:.3f} ms, {in_step / med['fortran_1']:.3f}x.",
    ]
    (args.out / "distributed.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
