"""TorchFort's reinforcement-learning train steps from Fortran (module torchfort, this package's
torchfort_rl layer) against the same steps written in Python with PyTorch eager as a Python user
writes them well (bench/python/bench_rl.py: foreach Adam and Polyak updates, preallocated buffers),
measured side by side with TorchFort's own test configurations (bench/configs/td3.yaml, ppo.yaml).
Issue 40's target: the Fortran step at most 0.7x Python's.

    python bench/rl.py            # writes bench/results/rl.{md,json}
    python bench/rl.py --quick    # smoke run: few steps, one repetition

Interleaved repetitions; per-step medians; one intra-op thread.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402  (bench/run.py: builds the programs)

TARGET = 0.7
CASES = {"td3": ("off", HERE / "configs" / "td3.yaml"), "ppo": ("on", HERE / "configs" / "ppo.yaml")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--build-dir", type=Path)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    import torch

    work = Path(tempfile.mkdtemp(prefix="ftorch-rl-"))
    build_dir = args.build_dir or work / "build"
    bench.build(build_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    n = 50 if args.quick else 2000
    reps = 1 if args.quick else args.reps
    rows = {}
    for case, (mode, config) in CASES.items():
        runs = {"fortran": [build_dir / "bench_rl", mode, config, 1, 1, n],
                "python": [sys.executable, HERE / "python" / "bench_rl.py", case, n]}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(reps):
            for key, cmd in runs.items():
                times[key].append(bench.parse(bench.run(cmd, env=env))["seconds"] / n)
        median = {k: statistics.median(v) for k, v in times.items()}
        rows[case] = {"median_seconds": median, "fortran_over_python": median["fortran"] / median["python"],
                      "target": TARGET}
        print(f"{case}: Fortran {median['fortran'] * 1e6:.1f} us, Python {median['python'] * 1e6:.1f} us, "
              f"ratio {rows[case]['fortran_over_python']:.2f}", flush=True)
    cpu = "unknown"
    if Path("/proc/cpuinfo").exists():
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    result = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "cpu": cpu,
              "steps": n, "reps": reps, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rl.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"Measured {result['date']} on {cpu}, torch {torch.__version__}, one intra-op thread, median of "
             f"{reps} interleaved runs of {n} steps.", "",
             "| train step (TorchFort's test config) | Fortran (torchfort_rl) | Python (PyTorch eager) | "
             "Fortran/Python | target |", "|---|---|---|---|---|"]
    for case, row in rows.items():
        m = row["median_seconds"]
        lines.append(f"| {case} | {m['fortran'] * 1e6:.1f} us | {m['python'] * 1e6:.1f} us | "
                     f"{row['fortran_over_python']:.2f} | <= {TARGET} |")
    (args.out / "rl.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
