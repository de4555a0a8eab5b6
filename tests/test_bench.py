"""The benchmark suite cannot rot: its smoke run (tiny sizes, seconds) builds the three programs,
runs every case and writes the table and the JSON. No timing is asserted."""

from __future__ import annotations

import json
import sys

from conftest import REPO, run, tool_env


def test_benchmark_smoke_run(installed, tmp_path):
    out = tmp_path / "results"
    run([sys.executable, REPO / "bench" / "run.py", "--quick", "--out", out, "--build-dir", tmp_path / "build"],
        env=tool_env())
    results = json.loads((out / "latest.json").read_text())
    cases = results["cases"]
    assert any(name.startswith("training step") for name in cases)
    assert any(name.startswith("inference") for name in cases)
    assert any(name.startswith("c = a*b") for name in cases)
    assert any(name.startswith("from_array") for name in cases)
    assert any(name.startswith("custom function") for name in cases)
    assert results["custom_function_overhead"], 'custom function vs built-in ratios'
    for name, r in cases.items():
        for program in ("fortran", "cpp", "python"):
            assert r[program]["median"] > 0 and r[program]["peak_rss_kib"] > 0, (name, program)
        assert r["fortran_over_cpp"] > 0 and r["python_over_fortran"] > 0
    assert set(results["rss"]) >= {"fortran", "cpp", "python"}
    table = (out / "latest.md").read_text()
    assert "| case | Fortran (FTorch) | C++ (LibTorch) | Python (PyTorch) | Fortran/C++ | Python/Fortran |" in table
