"""Instructions per step of FTorch (Fortran, the FTorch idiom) against the same work in C++ LibTorch,
counted by valgrind: exact and independent of the machine's load, so the ratio is a stable budget
check on one machine (absolute counts differ between CPUs: the ratio is what is compared).

    python bench/instructions.py            # measure, write bench/results/instructions.{md,json}
    python bench/instructions.py --check    # also fail (exit 1) on a regression: a ratio more than 5%
                                            # above max(target, the ratio recorded in results/)
    python bench/instructions.py --all      # every row of bench/run.py (inference, custom functions,
                                            # .pt2 packages, embedded Python: several more minutes)
    python bench/instructions.py --upstream DIR   # also the FTorch idiom against upstream FTorch,
                                            # built from its checkout at DIR (bench/upstream)

A run without --all keeps the recorded counts of the rows it does not measure. The embedded Python
rows compare a call from Fortran with the same call from Python (bench/python/pystep.py). Not
counted: data parallel (bench/distributed.py: MPI ranks wait by polling, so instructions measure
waiting, not work) and the GPU rows (valgrind runs no CUDA).

Each program runs each case at two loop lengths; the difference cancels start-up and set-up, so
a count is the cost of one step (each run also warms up for a tenth of its length, included in
the difference: hence the factor 1.1).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402  (bench/run.py: builds the programs, writes the models)

LENGTHS = bench.INSTRUCTION_LENGTHS
# case -> (arguments for n steps, target: the most instructions per step FTorch should spend as a
# multiple of C++'s, issue 21's targets). --check allows 5% over the larger of the target and the
# ratio last recorded in results/instructions.json (a target not met yet cannot regress either).
TOLERANCE = 1.05  # --check fails beyond budget * TOLERANCE


IDIOM_ROW = "FTorch idiom training step, batch 1, hidden 32"
UPSTREAM_ROW = "FTorch idiom training step, batch 1, hidden 32, against upstream FTorch"
MLP_PARAMETERS = 6  # bench/run.py make_mlp: three Linear layers, a weight and a bias each


def cases(model: Path, package: Path | None, upstream: bool = False):
    """name -> (arguments for n steps, target, reference program[, FTorch program, its arguments]):
    the checked rows (issue 21's targets), then with a package (--all) the other rows, against C++
    LibTorch; and the embedded Python rows, against the same function called from Python (target
    None: the issue sets it in microseconds of wall clock, bench/run.py --only embedded). The FTorch
    side is bench_fortran with the same arguments unless a row names its own program: the idiom rows
    run bench_idiom (bench/fortran/idiom.f90), which builds against upstream FTorch too; against
    upstream (issue 38's target: at most its count) both sides run that one source."""
    idiom_args = lambda n: [model, MLP_PARAMETERS, 1, 16, 16, n]  # noqa: E731
    table = {
        "c = a*b + a - b/2, 1 element": (lambda n: ["ops", 1, n], 1.05, "cpp"),
        "c = a*b + a - b/2, 1000 elements": (lambda n: ["ops", 1000, n], 1.05, "cpp"),
        "from_array + delete, 10^2 elements": (lambda n: ["from_array", 100, n], 1.05, "cpp"),
        "training step, batch 1, hidden 32": (lambda n: ["train", model, 1, 16, 16, n], 1.02, "cpp"),
        IDIOM_ROW: (lambda n: ["idiom", model, 1, 16, 16, n], 1.03, "cpp", "idiom", idiom_args),
        # `y = x * x` into an existing y, then backward: `=` takes the expression's result over
        # (no copy, no CopyBackwards node) where nothing can tell the difference.
        "built-in y = x*x + backward, 1 element": (lambda n: ["builtin", 1, n], 1.05, "cpp"),
    }
    if upstream:
        table[UPSTREAM_ROW] = (idiom_args, 1.0, "upstream", "idiom", idiom_args)
    if package is not None:
        script = HERE / "python" / "pystep.py"
        table.update({
            "inference, batch 1, hidden 32": (lambda n: ["infer", model, 1, 16, 16, n], 1.05, "cpp"),
            "compiled .pt2 inference, batch 1, hidden 32": (lambda n: ["compiled", package, 1, 16, 16, n], 1.05, "cpp"),
            "custom function y = x*x + backward, 1 element": (lambda n: ["custom", 1, n], 1.05, "cpp"),
            "embedded Python training step (reference: called from Python)":
                (lambda n: ["pymodule", model, 1, 16, 16, n, script], None, "python"),
            "embedded Python empty call (reference: called from Python)":
                (lambda n: ["pycall", model, 1, 16, 16, n, script], None, "python"),
        })
    return table


def table_row(name: str, r: dict) -> str:
    """A row of the table, from a result as recorded in results/instructions.json. Rows without a
    budget (embedded Python) also show the difference: their target is a time per call."""
    if r["budget"] is None:
        return (f"| {name} | {r['fortran']:,.0f} | {r['reference']:,.0f} | {r['ratio']:.3f} "
                f"(+{r['fortran'] - r['reference']:,.0f}) | +2 µs per call |")
    return f"| {name} | {r['fortran']:,.0f} | {r['reference']:,.0f} | {r['ratio']:.3f} | {r['budget']:.2f} |"


def avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def write_package(work: Path) -> Path:
    """The .pt2 of the batch-1 row. valgrind runs no AVX-512 code and AOTInductor compiles for the
    CPU it runs on (-march=native, kernels for the widest vector ISA): on an AVX-512 CPU the package
    is compiled for x86-64-v3 with AVX2 kernels, what LibTorch itself runs under valgrind (whose
    CPU reports no AVX-512), in a child process so the settings stay there."""
    env = dict(os.environ)
    if avx512():
        env.update(TORCHINDUCTOR_CPP_MARCH="x86-64-v3", ATEN_CPU_CAPABILITY="avx2")
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import run; "
            "print(run.write_compiled(Path(sys.argv[2]), [(1, 32)])[(1, 32)])")
    proc = subprocess.run([sys.executable, "-c", code, str(HERE), str(work)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling the .pt2 package failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a ratio exceeds max(target, recorded ratio) by more than 5%%")
    parser.add_argument("--all", action="store_true", help="every row of bench/run.py, not only the checked ones")
    parser.add_argument("--build-dir", type=Path, default=HERE.parent / "build" / "bench")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "instructions")
    parser.add_argument("--upstream", type=Path, metavar="DIR",
                        help="a checkout of upstream FTorch (Cambridge-ICCS/FTorch): build it beside the "
                             "benchmarks and add the FTorch idiom row against it")
    args = parser.parse_args()

    commands = bench.build(args.build_dir)
    if args.upstream is not None:
        commands["upstream"] = bench.build_upstream(args.upstream.resolve(), args.build_dir / "upstream")
    work = Path(tempfile.mkdtemp(prefix="ftorch-instructions-"))
    model = bench.write_models(work, [(1, 32)])[32]
    package = write_package(work) if args.all else None
    table = cases(model, package, upstream=args.upstream is not None)

    def sides(row):
        """(program, arguments for n steps) of FTorch's side and of the reference's."""
        make_args, _, reference, *own = row
        program, program_args = own if own else ("fortran", make_args)
        return [(program, program_args), (reference, make_args)]

    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, row in table.items():
            for side, (program, make_args) in enumerate(sides(row)):
                for n in LENGTHS:
                    jobs[name, side, n] = pool.submit(bench.valgrind_instructions, [*commands[program], *make_args(n)])
    recorded_file = HERE / "results" / "instructions.json"
    recorded = json.loads(recorded_file.read_text()) if recorded_file.exists() else {}
    measured = {}
    for name, (_, budget, reference, *_own) in table.items():
        ours, theirs = (bench.per_step(jobs[name, side, LENGTHS[0]].result(), jobs[name, side, LENGTHS[1]].result())
                        for side in (0, 1))
        measured[name] = {"fortran": ours, "reference": theirs, "reference_program": reference,
                          "ratio": ours / theirs, "budget": budget}
    # Rows not measured now (a run without --all) keep what the last run measured: the table stays
    # whole, its rows in the order of the script's cases.
    results = {name: measured.get(name, recorded.get(name)) for name in cases(model, Path("package.pt2"), True)
               if name in measured or name in recorded}

    lines = ["| instructions per step (valgrind) | FTorch (Fortran) | C++ LibTorch (or as named) | ratio | target |",
             "|---|---|---|---|---|"]
    failed = []
    for name, r in results.items():
        lines.append(table_row(name, r))
        if r["budget"] is None or name not in table:
            continue
        limit = max(r["budget"], recorded.get(name, {}).get("ratio", r["budget"])) * TOLERANCE
        if r["ratio"] > limit:
            failed.append(f"{name}: {r['ratio']:.3f} > {limit:.3f}")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    if args.out == parser.get_default("out"):
        # The recorded measurement is what the README and the guide show.
        for doc in (HERE.parent / "README.md", HERE.parent / "docs" / "guide" / "performance.md"):
            marked = re.sub(r"(<!-- instructions-table: bench/results/instructions.md -->\n).*?(<!-- /instructions-table -->)",
                            lambda m: m.group(1) + text + m.group(2), doc.read_text(), flags=re.S)
            doc.write_text(marked)
    if args.check and failed:
        print("instructions per step regressed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
