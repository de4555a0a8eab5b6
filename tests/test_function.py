"""Custom autograd functions in Fortran, the functional gradient API, gradcheck, hooks,
saved-tensor hooks, checkpointing and anomaly mode (tests/fortran/test_function.f90), compared
with PyTorch computed here at test time."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian, jvp

from conftest import COMPILERS, assert_all_passed, run

# Elementwise transcendental kernels (sin, cos, tanh, exp) are vectorized and their last bits may
# differ between the AVX2 and AVX-512 code paths LibTorch picks at run time; the Fortran program
# and this process may not take the same one. 1e-12 relative bounds that in float64 for these
# short chains; results made of exact operations are compared at 1e-15.
RTOL = 1e-12


@pytest.fixture(scope="module", params=COMPILERS)
def results(request, cmake_consumer, data_dir, tmp_path_factory):
    binary = cmake_consumer(request.param) / "test_function"
    env = dict(os.environ)
    # A fixed mmap threshold: freed large blocks go back to the system, so the RSS the program
    # reads is the memory in use (glibc otherwise raises the threshold after the first free).
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    workdir = tmp_path_factory.mktemp(f"function-{request.param}")
    proc = run([binary, data_dir], cwd=workdir, env=env, check=False)
    assert_all_passed(proc)
    assert "peak memory drops" in proc.stdout, "the offload memory check did not run"
    assert not list(workdir.iterdir()), "offload files left behind"
    rows = {}
    for line in (data_dir / "function_results.txt").read_text().splitlines():
        name, *values = line.split()
        rows[name] = np.array([float(v) for v in values])
    return rows


def close(got, want, rtol=RTOL):
    np.testing.assert_allclose(got, want.detach().reshape(-1).numpy(), rtol=rtol, atol=1e-300)


def test_tutorial_linear_function_matches_pytorch_autograd(results):
    x = torch.tensor([[math.sin(0.3 * i + 0.7 * j) for j in range(1, 4)] for i in range(1, 5)],
                     dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[math.cos(0.5 * j) for j in range(1, 4)], [0.2 * j - 0.3 for j in range(1, 4)]],
                     dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.1, -0.4], dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.linear(x, w, b)
    (y * y).sum().backward()
    close(results["linear_y"], y)
    close(results["linear_gx"], x.grad)
    close(results["linear_gw"], w.grad)
    close(results["linear_gb"], b.grad)


def test_context_features_match_pytorch(results):
    x = torch.tensor([0.5, -1.25, 2.0], dtype=torch.float64, requires_grad=True)
    y = 0.5 * x**3
    y.sum().backward()
    close(results["cube_y"], y, rtol=1e-15)
    close(results["cube_gx"], x.grad, rtol=1e-15)
    x.grad = None
    (3 * torch.sin(x)).sum().backward()
    close(results["split_gx"], x.grad)


def test_double_backward_matches_pytorch(results):
    x = torch.tensor([0.5, -1.5, 2.5], dtype=torch.float64, requires_grad=True)
    out = x * x
    (dx,) = torch.autograd.grad((out * out).sum(), x, create_graph=True)
    dx.sum().backward()
    close(results["twice_dx"], dx, rtol=1e-15)
    close(results["twice_gx"], x.grad, rtol=1e-15)


def test_functional_api_matches_pytorch(results):
    x = torch.tensor([0.1, 0.7, -0.4], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.3, -0.8, 0.5], dtype=torch.float64, requires_grad=True)
    v = torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64)
    u = torch.tanh(w * x) * w
    (dudx,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    ((dudx - 1) ** 2).sum().backward()
    close(results["pinn_dudx"], dudx)
    close(results["pinn_gw"], w.grad)
    u = torch.sin(w * x)
    gx, gw = torch.autograd.grad(u, (x, w), grad_outputs=v, retain_graph=True)
    close(results["vjp_gx"], gx)
    close(results["vjp_gw"], gw)
    wd = w.detach()
    close(results["jacobian"], jacobian(lambda t: torch.sin(wd * t), x.detach()))
    close(results["jvp"], jvp(lambda t: torch.sin(wd * t), x.detach(), v)[1])
    close(results["vjp"], gw)


def test_eligibility_trace_hook_matches_pytorch(results):
    w = torch.tensor([0.2, -0.4, 0.6], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    z = torch.zeros(3, dtype=torch.float64)

    def trace(g):
        nonlocal z
        z = 0.5 * z + g
        return 0.1 * 2.0 * z

    w.register_hook(trace)
    for i in range(1, 4):
        w.grad = None
        torch.sin(w * x * i).sum().backward()
    close(results["trace_grad"], w.grad)


def test_checkpointed_time_stepping_matches_pytorch(results):
    s0 = torch.tensor([0.1, 0.4, -0.3, 0.8], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.2, -0.6, 0.9, 0.3], dtype=torch.float64, requires_grad=True)
    s = s0 * 1
    for _ in range(20):
        s = s + 0.1 * torch.tanh(w * s)
    (s * s).sum().backward()
    close(results["checkpoint_g0"], s0.grad)
    close(results["checkpoint_gw"], w.grad)
