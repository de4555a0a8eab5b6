"""Many ranks, one model: inference of N MPI ranks, each with its own batch of columns, through a
node-shared model (torch_model_load_shared: one model on rank 0 of the node, the batches gathered
there and run as one) against every rank holding its own model -- on its own CPU core, or (on a
GPU machine) with its own CUDA context.

    python bench/node_shared.py            # ranks 1, 2, 4, 8, 16 (up to the cores), writes bench/results/node_shared.{md,json}
    python bench/node_shared.py --quick    # smoke run: 1 and 2 ranks, a tiny model

Models: an MLP from a column's NLEV=60 levels to its tendency, small (hidden 128) and medium
(hidden 1024), float32, at a batch of 256 columns per rank. Every rank runs 1 thread; the shared
model's leader runs with the threads its rank has (1 on the CPU; the GPU does the work on cuda).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from distributed import env_one_thread as mpi_env, result_line, run  # noqa: E402  (bench/distributed.py)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--build-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    import ftorch
    import torch

    nlev, batch = (8, 16) if args.quick else (60, 256)
    sizes = {"small": 16} if args.quick else {"small": 128, "medium": 1024}
    warmup, steps = (2, 5) if args.quick else (20, 200)
    repeats = args.repeats or (1 if args.quick else 3)
    cores = os.cpu_count() or 1
    ranks_list = [1, 2] if args.quick else [n for n in (1, 2, 4, 8, 16) if n <= cores]
    gpu = torch.cuda.is_available()
    work = Path(tempfile.mkdtemp(prefix="ftorch-bench-node-shared-"))
    build_dir = args.build_dir or work / "build"
    env = mpi_env()
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env["PATH"]) else []
    run(["cmake", "-S", HERE / "node_shared", "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_Fortran_COMPILER=gfortran", f"-DCMAKE_PREFIX_PATH={ftorch.get_cmake_prefix_path()}"], env=env)
    run(["cmake", "--build", build_dir], env=env)
    program = build_dir / "bench_node_shared"

    # (label, device, mode): every rank on its own CPU core; one model per node; on a GPU machine
    # also every rank with its own CUDA context.
    variants = [("local CPU (each rank its own model)", "cpu", "local"),
                ("node-shared, leader on the CPU", "cpu", "shared")]
    if gpu:
        variants += [("local CUDA (each rank its own context)", "cuda", "local"),
                     ("node-shared, leader on the GPU", "cuda", "shared")]
    rows = {}
    for size, hidden in sizes.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(nlev, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                    torch.nn.Tanh(), torch.nn.Linear(hidden, nlev))
        path = work / f"{size}.pt"
        torch.jit.script(model).save(str(path))
        for ranks in ranks_list:
            for label, device, mode in variants:
                samples = []
                for _ in range(repeats):
                    out = run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", ranks, program, path, nlev,
                               batch, device, mode, warmup, steps], env=env)
                    samples.append(result_line(out)[0])
                rows.setdefault(size, {}).setdefault(str(ranks), {})[label] = statistics.median(samples)
    results = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": cores, "torch": torch.__version__,
                    "ftorch": ftorch.__version__, "gpu": torch.cuda.get_device_name(0) if gpu else None},
        "models": {size: {"levels": nlev, "hidden": hidden} for size, hidden in sizes.items()},
        "batch_per_rank": batch, "calls": steps, "repeats": repeats,
        "ms_per_forward": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "node_shared.json").write_text(json.dumps(results, indent=2) + "\n")
    labels = [v[0] for v in variants]
    table = [
        f"Inference of N ranks, {batch} columns of {nlev} levels each per rank, float32 MLP "
        f"{nlev}-h-h-{nlev}: ms per forward call of the slowest rank, median of {repeats} runs of {steps} calls "
        f"({results['machine']['cpu']}, {cores} cores, 1 thread per rank, torch {torch.__version__}"
        + (f", {results['machine']['gpu']}" if gpu else ", no GPU") + ").",
        "",
        "| model | ranks | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for size, by_ranks in rows.items():
        for ranks, row in by_ranks.items():
            table.append(f"| {size} (h={sizes[size]}) | {ranks} | " + " | ".join(f"{row[k]:.3f}" for k in labels) + " |")
    (args.out / "node_shared.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
