"""The benchmark suite cannot rot: its smoke run (tiny sizes, seconds) builds the three programs,
runs every case and writes the table and the JSON. No timing is asserted."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO, run, tool_env


@pytest.fixture(scope="module")
def bench_build(tmp_path_factory):
    """One build of bench/CMakeLists.txt's programs for the benchmarks that run them (the C++
    program alone takes a minute to compile)."""
    return tmp_path_factory.mktemp("bench-build")


def test_benchmark_smoke_run(installed, tmp_path, bench_build):
    out = tmp_path / "results"
    run([sys.executable, REPO / "bench" / "run.py", "--quick", "--out", out, "--build-dir", bench_build],
        env=tool_env())
    results = json.loads((out / "latest.json").read_text())
    cases = results["cases"]
    assert any(name.startswith("training step") for name in cases)
    assert any(name.startswith("inference") for name in cases)
    assert any(name.startswith("c = a*b") for name in cases)
    assert any(name.startswith("from_array") for name in cases)
    assert any(name.startswith("compiled .pt2 inference") for name in cases)
    assert results["compiled"], ".pt2 against TorchScript ratios"
    assert any(name.startswith("custom function") for name in cases)
    assert results["custom_function_overhead"], 'custom function vs built-in ratios'
    for name, r in cases.items():
        for program in ("fortran", "cpp", "python"):
            assert r[program]["median"] > 0 and r[program]["peak_rss_kib"] > 0, (name, program)
        assert r["fortran_over_cpp"] > 0 and r["python_over_fortran"] > 0
    assert set(results["rss"]) >= {"fortran", "cpp", "python"}
    table = (out / "latest.md").read_text()
    assert "| case | Fortran (FTorch) | C++ (LibTorch) | Python (PyTorch) | Fortran/C++ | Python/Fortran |" in table
    # bench/rl.py --quick in the same build: TorchFort's TD3 and PPO train steps from Fortran and Python
    run([sys.executable, REPO / "bench" / "rl.py", "--quick", "--out", out, "--build-dir", bench_build],
        env=tool_env())
    rl = json.loads((out / "rl.json").read_text())["rows"]
    assert set(rl) == {"td3", "ppo"}
    for row in rl.values():
        assert row["median_seconds"]["fortran"] > 0 and row["median_seconds"]["python"] > 0
    assert "| td3 |" in (out / "rl.md").read_text()


def test_training_package_benchmark_smoke_run(installed, tmp_path, bench_build):
    """bench/train_package.py --quick: the package's step from Fortran beside C++ and Python."""
    import json

    out = tmp_path / "results"
    run([sys.executable, REPO / "bench" / "train_package.py", "--quick", "--out", out, "--build-dir", bench_build],
        timeout=1800)
    result = json.loads((out / "train_package.json").read_text())
    row = result["rows"]["batch 1, hidden 32"]
    assert set(row["median_seconds"]) == {"package_fortran", "package_fortran_uncompiled_step", "torchscript_fortran",
                                          "libtorch_cpp", "pytorch_python", "package_inference_fortran",
                                          "pt2_inference_fortran"}
    assert all(v > 0 for v in row["median_seconds"].values())


def test_distributed_benchmark_smoke_run(installed, tmp_path):
    """bench/distributed.py --quick: FTorch's data-parallel step (mpirun, 1 and 2 ranks) and
    PyTorch's DDP on Gloo, side by side; the table and the JSON are written."""
    import shutil

    import pytest

    from conftest import IN_CI

    if shutil.which("mpirun") is None or shutil.which("mpif90") is None:
        if IN_CI:
            pytest.fail("OpenMPI is required in CI")
        pytest.skip("OpenMPI not installed")
    out = tmp_path / "results"
    run([sys.executable, REPO / "bench" / "distributed.py", "--quick", "--out", out, "--build-dir", tmp_path / "build"],
        env=tool_env())
    results = json.loads((out / "distributed.json").read_text())
    assert set(results["median_ms"]) == {"fortran_1", "fortran_2", "python_1", "python_2"}
    assert all(v > 0 for v in results["median_ms"].values())
    assert results["weak_scaling"]["fortran"] > 0 and results["fortran_over_python_2_ranks"] > 0
    assert results["step_with_no_exchange_ms"] > 0 and results["fortran_1_update_ms"] > 0
    assert results["step_with_barrier_only_ms"] > 0
    assert "| ranks | FTorch (torch_ddp over MPI) | Python DDP (Gloo) | FTorch/Python |" in (out / "distributed.md").read_text()


def test_gpu_benchmark_smoke_run(installed, tmp_path):
    """bench/gpu.py --device cpu --quick: the GPU benchmark's programs on the CPU (the Fortran graph
    rows run the captured work uncaptured, FTORCH_CUDA_GRAPHS=eager); the table and the JSON are
    written. On a GPU, tools/gpu_check.sh runs the real benchmark."""
    out = tmp_path / "results"
    run([sys.executable, REPO / "bench" / "gpu.py", "--device", "cpu", "--quick", "--out", out, "--build-dir",
         tmp_path / "build"], env=tool_env())
    results = json.loads((out / "gpu.json").read_text())
    assert len(results["rows"]) == 2
    for row in results["rows"]:
        assert set(row["median_us"]) == {"fortran_eager", "fortran_graph", "python_eager"}
        assert all(v > 0 for v in row["median_us"].values())
    assert "| MLP, batch | Fortran eager | Fortran graph | Python eager |" in (out / "gpu.md").read_text()


def test_documented_instruction_counts_are_the_recorded_measurement():
    """The README's and the guide's instruction tables show bench/results/instructions.json (what
    bench/instructions.py measured last and what CI's --check compares against), number for number."""
    recorded = json.loads((REPO / "bench" / "results" / "instructions.json").read_text())
    readme = (REPO / "README.md").read_text()
    guide = (REPO / "docs" / "guide" / "performance.md").read_text()
    table = (REPO / "bench" / "results" / "instructions.md").read_text()
    assert table.strip() in guide and table.strip() in readme
    sys.path.insert(0, str(REPO / "bench"))
    import instructions

    for name, r in recorded.items():
        assert instructions.table_row(name, r) in table, name


def test_documented_timings_are_the_recorded_measurement():
    """The guide's table of timings is bench/results/latest.md (what bench/run.py measured last), and
    the training-package table quotes bench/results/train_package.json, number for number."""
    import re

    guide = (REPO / "docs" / "guide" / "performance.md").read_text()
    table = re.search(r"<!-- bench-table -->\n(.*?)<!-- /bench-table -->", guide, flags=re.S).group(1)
    assert table.strip() == (REPO / "bench" / "results" / "latest.md").read_text().strip()
    recorded = json.loads((REPO / "bench" / "results" / "train_package.json").read_text())
    for name, row in recorded["rows"].items():
        m = row["median_seconds"]
        line = next(ln for ln in guide.splitlines() if ln.startswith(f"| {name} |") and "≤" in ln)
        cells = [c.strip() for c in line.strip("|").split("|")]
        for cell, key in zip(cells[1:6], ["package_fortran", "package_fortran_uncompiled_step", "torchscript_fortran",
                                          "libtorch_cpp", "pytorch_python"]):
            number, unit = cell.split()
            digits = len(number.replace(".", "").lstrip("0"))  # significant digits shown
            recorded_value = m[key] / {"ms": 1e-3, "µs": 1e-6}[unit]
            assert float(f"{recorded_value:.{digits}g}") == float(number), (name, key, cell, m[key])
        assert cells[6] == f"{row['package_over_cpp']:.2f}", (name, cells[6])


def test_node_shared_benchmark_smoke_run(installed, tmp_path):
    """bench/node_shared.py --quick: 1 and 2 ranks through a node-shared model and with a model of
    their own; the table and the JSON are written."""
    import shutil

    import pytest

    from conftest import IN_CI

    if shutil.which("mpirun") is None or shutil.which("mpif90") is None:
        if IN_CI:
            pytest.fail("OpenMPI is required in CI")
        pytest.skip("OpenMPI not installed")
    out = tmp_path / "results"
    run([sys.executable, REPO / "bench" / "node_shared.py", "--quick", "--out", out, "--build-dir",
         tmp_path / "build"], env=tool_env())
    rows = json.loads((out / "node_shared.json").read_text())["ms_per_forward"]["small"]
    assert set(rows) == {"1", "2"}
    for row in rows.values():
        assert row["node-shared, leader on the CPU"] > 0 and row["local CPU (each rank its own model)"] > 0
    assert "| model | ranks |" in (out / "node_shared.md").read_text()

