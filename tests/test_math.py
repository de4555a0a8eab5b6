"""Tensor arithmetic and autograd from Fortran against PyTorch, computed here at test time.

tests/fortran/test_math.f90 records each case (dtype and values in row-major order) in
math_results.txt; each case below is the same expression in PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import COMPILERS, assert_all_passed, run
from models import math_inputs

DTYPE_CODES = {torch.int32: 3, torch.int64: 4, torch.float32: 6, torch.float64: 7}
f32 = lambda x: float(np.float32(x))  # a Fortran real32 literal, as the double it is passed as

VALUES = {
    "a+b": lambda t: t["a"] + t["b"],
    "a-b": lambda t: t["a"] - t["b"],
    "a*b": lambda t: t["a"] * t["b"],
    "a/b": lambda t: t["a"] / t["b"],
    "a**b": lambda t: t["a"] ** t["b"],
    "a+c": lambda t: t["a"] + t["c"],
    "c*a": lambda t: t["c"] * t["a"],
    "-a": lambda t: -t["a"],
    "a*b+a-b/2": lambda t: t["a"] * t["b"] + t["a"] - t["b"] / 2,
    "a+2.5": lambda t: t["a"] + 2.5,
    "2.5+a": lambda t: 2.5 + t["a"],
    "a-0.25f": lambda t: t["a"] - f32(0.25),
    "0.25f-a": lambda t: f32(0.25) - t["a"],
    "a*3i8": lambda t: t["a"] * 3,
    "3i16*a": lambda t: 3 * t["a"],
    "a/2i32": lambda t: t["a"] / 2,
    "2i64/a": lambda t: 2 / t["a"],
    "a/0.5": lambda t: t["a"] / 0.5,
    "7/a": lambda t: 7 / t["a"],
    "a**2": lambda t: t["a"] ** 2,
    "a**3i64": lambda t: t["a"] ** 3,
    "a**-1i8": lambda t: t["a"] ** -1,
    "a**0.5f": lambda t: t["a"] ** f32(0.5),
    "a**2i16": lambda t: t["a"] ** 2,
    "a**2i32": lambda t: t["a"] ** 2,
    "a**2.0f": lambda t: t["a"] ** 2.0,
    "a*s1": lambda t: t["a"] * torch.tensor([2.5], dtype=torch.float64),
    "s1*a": lambda t: torch.tensor([2.5], dtype=torch.float64) * t["a"],
    "a**1.5": lambda t: t["a"] ** 1.5,
    "2**a": lambda t: 2 ** t["a"],
    "1.5**a": lambda t: 1.5 ** t["a"],
    "a**3*1.5-a": lambda t: 1.5 * t["a"] ** 3 - t["a"],
    "i32+1": lambda t: t["i32"] + 1,
    "i32+1.5": lambda t: t["i32"] + 1.5,
    "i32/i32": lambda t: t["i32"] / t["i32"],
    "i32*a": lambda t: t["i32"] * t["a"],
    "a32*2.0d0": lambda t: t["a32"] * 2.0,
    "a32+a": lambda t: t["a32"] + t["a"],
    "i32**2": lambda t: t["i32"] ** 2,
    "exp": lambda t: torch.exp(t["a"]),
    "log": lambda t: torch.log(t["a"]),
    "sqrt": lambda t: torch.sqrt(t["a"]),
    "abs": lambda t: torch.abs(t["a"] - 1.0),
    "sin": lambda t: torch.sin(t["a"]),
    "cos": lambda t: torch.cos(t["a"]),
    "tanh": lambda t: torch.tanh(t["a"]),
    "sigmoid": lambda t: torch.sigmoid(t["a"]),
    "relu": lambda t: torch.relu(t["a"] - 1.0),
    "matmul": lambda t: t["a"] @ t["b"].T,
    "matmul_vec": lambda t: t["a"] @ t["c"],
    "sum": lambda t: t["a"].sum(),
    "mean": lambda t: t["a"].mean(),
    "sum_dim1": lambda t: t["a"].sum(dim=0),
    "mean_dim2_keep": lambda t: t["a"].mean(dim=1, keepdim=True),
    "reshape": lambda t: t["a"].reshape(3, 2),
    "permute": lambda t: t["a"].permute(1, 0),
    "transpose": lambda t: t["a"].transpose(0, 1),
    "clone": lambda t: t["a"].clone(),
    "detach": lambda t: t["a"].detach(),
    "a32_exp": lambda t: torch.exp(t["a32"]),
}

GRADIENTS = {
    "g:a*b": lambda a, b, t: (a * b).sum(),
    "g:a/b": lambda a, b, t: (a / b).sum(),
    "g:a**b": lambda a, b, t: (a**b).sum(),
    "g:a-b": lambda a, b, t: (a - b).sum(),
    "g:a+c": lambda a, b, t: ((a + t["c"]) * b).sum(),
    "g:scalars": lambda a, b, t: (2.0 / a + b**3 - f32(0.5) * a * b).sum(),
    "g:pow_scalar_base": lambda a, b, t: (2**a * b).sum(),
    "g:neg": lambda a, b, t: (-(a * b)).sum(),
    "g:exp": lambda a, b, t: (torch.exp(a) * b).sum(),
    "g:log": lambda a, b, t: (torch.log(a) * b).sum(),
    "g:sqrt": lambda a, b, t: (torch.sqrt(a) * b).sum(),
    "g:abs": lambda a, b, t: (torch.abs(a - 1.0) * b).sum(),
    "g:sin": lambda a, b, t: (torch.sin(a) * b).sum(),
    "g:cos": lambda a, b, t: (torch.cos(a) * b).sum(),
    "g:tanh": lambda a, b, t: (torch.tanh(a) * b).sum(),
    "g:sigmoid": lambda a, b, t: (torch.sigmoid(a) * b).sum(),
    "g:relu": lambda a, b, t: (torch.relu(a - 1.0) * b).sum(),
    "g:matmul": lambda a, b, t: ((a @ b.T) ** 2).sum(),
    "g:mean": lambda a, b, t: (a * b).mean(),
    "g:sum_dim": lambda a, b, t: ((a * b).sum(dim=1) ** 2).sum(),
    "g:reshape": lambda a, b, t: (a.reshape(3, 2) * b.reshape(3, 2) ** 2).sum(),
    "g:permute": lambda a, b, t: (a.permute(1, 0) * b.transpose(0, 1) ** 2).sum(),
    "g:clone": lambda a, b, t: (a.clone() * b).sum(),
    "g:detach": lambda a, b, t: (a.detach() * b).sum(),
}


def read_results(path):
    lines = path.read_text().splitlines()
    out = {}
    for i in range(0, len(lines), 2):
        name, dtype, n = lines[i].split()
        values = np.array([float(v) for v in lines[i + 1].split()]) if int(n) else np.zeros(0)
        out[name] = (int(dtype), values)
    return out


@pytest.fixture(scope="module", params=COMPILERS)
def results(request, cmake_consumer, data_dir):
    bdir = cmake_consumer(request.param)
    (data_dir / "math_results.txt").unlink(missing_ok=True)
    proc = run([bdir / "test_math", data_dir], check=False)
    assert_all_passed(proc)
    return read_results(data_dir / "math_results.txt")


def tolerance(dtype):
    return 1e-6 if dtype == torch.float32 else 1e-12


@pytest.mark.parametrize("case", sorted(VALUES))
def test_value_and_dtype_match_pytorch(results, case):
    expected = VALUES[case](math_inputs())
    dtype, got = results[case]
    assert dtype == DTYPE_CODES[expected.dtype], f"dtype {dtype} vs {expected.dtype}"
    want = expected.reshape(-1).double().numpy()
    np.testing.assert_allclose(got, want, rtol=tolerance(expected.dtype), atol=0)


@pytest.mark.parametrize("case", sorted(GRADIENTS))
def test_gradient_matches_pytorch(results, case):
    t = math_inputs()
    a = t["a"].clone().requires_grad_(True)
    b = t["b"].clone().requires_grad_(True)
    GRADIENTS[case](a, b, t).backward()
    grads = [g if g is not None else torch.zeros(2, 3, dtype=torch.float64) for g in (a.grad, b.grad)]
    want = torch.cat([g.reshape(-1) for g in grads]).numpy()
    _, got = results[case]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


def test_every_case_was_checked(results):
    assert set(results) == set(VALUES) | set(GRADIENTS)
