"""The training step of a training package (``python -m ftorch export --train``) from Fortran, against
the same step written in C++ LibTorch and in Python/PyTorch eager, measured side by side
(issue 36's targets: at most 0.3x C++ at batch 1, hidden 32; at most 0.7x at batch 64, hidden 256).

    python bench/train_package.py            # writes bench/results/train_package.{md,json}
    python bench/train_package.py --quick    # smoke run: one size, few steps

The step: forward of bench/run.py's MLP (float64), MSE loss, backward, Adam's update. Fortran runs
``torch_train_step`` on the package (its compiled step: forward, loss, backward and the update in
one AOTInductor graph, in place on FTorch's tensors); C++ runs the TorchScript export of the same
model with ``torch::optim::Adam`` (bench/cpp/bench.cpp, built and run as a C++ user does: LibTorch's
default TorchScript executor);
Python runs the model eagerly with ``torch.optim.Adam`` (bench/python/bench.py). Also: the same
Fortran program on the TorchScript model (what the package replaces), and on the package with the
compiled step turned off (FTORCH_COMPILED_STEP=0: the compiled forward and backward as autograd
nodes, LibTorch's Adam). And forward-only inference: the package in eval mode against the
inference package (--pt2) of the same model, both from Fortran. Interleaved repetitions; per-step
medians; one intra-op thread.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import instructions  # noqa: E402  (bench/instructions.py: whether valgrind can run the kernels)
import run as bench  # noqa: E402  (bench/run.py: builds the programs, the MLP)

TARGETS = {(1, 32): 0.3, (64, 256): 0.7}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--build-dir", type=Path)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    import torch

    import ftorch

    sizes = [(1, 32)] if args.quick else [(1, 32), (64, 256)]
    steps = {32: 3000, 256: 400} if not args.quick else {32: 50}
    reps = args.reps if not args.quick else 1
    work = Path(tempfile.mkdtemp(prefix="ftorch-train-package-"))
    commands = bench.build(args.build_dir or work / "build")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = {}
    # Instruction counts this machine cannot make (AVX-512: valgrind runs none of it) keep those of
    # the last run that made them, with its date.
    previous_file = args.out / "train_package.json"
    previous = json.loads(previous_file.read_text()) if previous_file.exists() else {}
    for batch, hidden in sizes:
        script = work / f"mlp_{hidden}.pt"
        torch.jit.script(bench.make_mlp(hidden)).save(str(script))
        package = work / f"mlp_{hidden}_b{batch}_train.pt2"
        inference = work / f"mlp_{hidden}_b{batch}.pt2"
        ftorch.export(bench.make_mlp(hidden).eval(), [((batch, 16), torch.float64)], pt2=inference, check=False)
        print(f"exporting the training package, batch {batch}, hidden {hidden} ...", flush=True)
        ftorch.export(bench.make_mlp(hidden), [((batch, 16), torch.float64)], train_package=package, check=False)
        n = steps[hidden]
        runs = {
            "package_fortran": ([*commands["fortran"], "train", package, batch, 16, 16, n], {}),
            "package_fortran_uncompiled_step": ([*commands["fortran"], "train", package, batch, 16, 16, n],
                                                {"FTORCH_COMPILED_STEP": "0"}),
            "torchscript_fortran": ([*commands["fortran"], "train", script, batch, 16, 16, n], {}),
            "libtorch_cpp": ([*commands["cpp"], "train", script, batch, 16, 16, n], {}),
            "pytorch_python": ([*commands["python"], "train", script, batch, 16, 16, n], {}),
            "package_inference_fortran": ([*commands["fortran"], "infer", package, batch, 16, 16, n], {}),
            "pt2_inference_fortran": ([*commands["fortran"], "compiled", inference, batch, 16, 16, n], {}),
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(reps):
            for key, (cmd, extra) in runs.items():
                out = bench.parse(bench.run(cmd, env={**env, **extra}))
                times[key].append(out["seconds"] / n)
        med = {k: statistics.median(v) for k, v in times.items()}
        # Instructions of the two forward-only rows at batch 1 (where the calls' overhead shows; at the
        # larger size the kernels are all), where valgrind runs the kernels (no AVX-512: the packages
        # are compiled for the CPU they run on).
        counts = None
        if (shutil.which("valgrind") is not None and not instructions.avx512() and not args.quick
                and (batch, hidden) == (1, 32)):
            counts = {}
            for key in ("package_inference_fortran", "pt2_inference_fortran"):
                cmd = runs[key][0][:-1]
                counts[key] = bench.per_step(*(bench.valgrind_instructions([*cmd, n_])
                                               for n_ in bench.INSTRUCTION_LENGTHS))
        counted_on = previous.get("date") if counts is None else None
        if counts is None:
            earlier = previous.get("rows", {}).get(f"batch {batch}, hidden {hidden}", {})
            counts = earlier.get("inference_instructions")
            counted_on = earlier.get("inference_instructions_date", counted_on) if counts else None
        rows[f"batch {batch}, hidden {hidden}"] = {
            "median_seconds": med,
            "package_over_cpp": med["package_fortran"] / med["libtorch_cpp"],
            "uncompiled_step_over_cpp": med["package_fortran_uncompiled_step"] / med["libtorch_cpp"],
            "package_over_python": med["package_fortran"] / med["pytorch_python"],
            "inference_package_over_pt2": med["package_inference_fortran"] / med["pt2_inference_fortran"],
            "inference_instructions": counts,
            **({"inference_instructions_date": counted_on} if counted_on else {}),
            "target": TARGETS.get((batch, hidden)),
        }
    cpu = "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    result = {"date": datetime.date.today().isoformat(), "cpu": cpu, "cores": os.cpu_count(),
              "torch": torch.__version__, "quick": args.quick, "rows": rows}
    us = 1e6
    lines = [f"Measured on {cpu} ({os.cpu_count()} cores), 1 intra-op thread, torch {torch.__version__}"
             f"{' (quick smoke run)' if args.quick else ''}; per-step medians of {reps} interleaved runs.", "",
             "| training step (MLP, MSE, Adam) | package, Fortran | package, compiled step off | TorchScript, "
             "Fortran | C++ LibTorch (TorchScript, its defaults) | Python eager | package / C++ | target |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        m = r["median_seconds"]
        lines.append(f"| {name} | {m['package_fortran'] * us:.3g} µs | {m['package_fortran_uncompiled_step'] * us:.3g} µs"
                     f" | {m['torchscript_fortran'] * us:.3g} µs | {m['libtorch_cpp'] * us:.3g} µs | "
                     f"{m['pytorch_python'] * us:.3g} µs | {r['package_over_cpp']:.2f} | "
                     f"{'<= ' + str(r['target']) if r['target'] is not None else ''} |")
    lines += ["", "| forward only (inference), from Fortran | training package (eval mode) | inference package "
              "(--pt2) | ratio | instructions per call (package / --pt2) | target |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        m, c = r["median_seconds"], r["inference_instructions"]
        counted = (f"{c['package_inference_fortran']:.0f} / {c['pt2_inference_fortran']:.0f} = "
                   f"{c['package_inference_fortran'] / c['pt2_inference_fortran']:.3f}" if c else "not counted")
        if c and r.get("inference_instructions_date"):
            counted += f" (counted on {r['inference_instructions_date']})"
        lines.append(f"| {name} | {m['package_inference_fortran'] * us:.3g} µs | {m['pt2_inference_fortran'] * us:.3g} µs"
                     f" | {r['inference_package_over_pt2']:.2f} | {counted} | <= 1 |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_package.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "train_package.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
