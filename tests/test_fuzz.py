"""Misuse fuzzer (tests/fortran/test_fuzz.fypp, a fypp template: the CMake consumer project
generates test_fuzz.f90 from it): from a seed, 10^4 random calls with wrong ranks, shapes, dtypes
and devices, deleted, stale and garbage handles, expressions as arguments, bad models, losses,
autograd, optimizers and scopes. Every failure must be a clean status with an errmsg, the calls
whose outcome is certain must have it, no handle may leak, and the program must never die on a
signal.

A seed replays the same calls with every compiler: FTORCH_FUZZ_SEED=<n> adds that seed to the
fixed ones (`tests/.../test_fuzz <data_dir> <n> [n_calls] trace` prints each call as it goes).
"""

from __future__ import annotations

import os
import signal

import pytest

from conftest import COMPILERS, assert_all_passed, run

SEEDS = [1, 55, 80]
if os.environ.get("FTORCH_FUZZ_SEED", "").strip():
    SEEDS.append(int(os.environ["FTORCH_FUZZ_SEED"]))


def describe_signal(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_fuzz(cmake_consumer, data_dir, compiler, seed):
    binary = cmake_consumer(compiler) / "test_fuzz"
    proc = run([binary, data_dir, seed], check=False, timeout=600)
    replay = f"replay: {binary} {data_dir} {seed} 10000 trace"
    assert proc.returncode >= 0, (
        f"seed {seed} ({compiler}): test_fuzz died on {describe_signal(proc.returncode)}; {replay}\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    try:
        assert_all_passed(proc)
    except AssertionError as failure:
        raise AssertionError(f"seed {seed} ({compiler}); {replay}\n{failure}") from None
