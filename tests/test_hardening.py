"""Ordinary Fortran against the handle rules (tests/fortran/test_hardening.f90), and `x = f(x)`
under autograd replayed line for line in PyTorch, computed here at test time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import COMPILERS, assert_all_passed, run


def read_rows(path):
    return [np.array([float(v) for v in line.split()]) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module", params=COMPILERS)
def hardening(request, cmake_consumer, data_dir):
    binary = cmake_consumer(request.param) / "test_hardening"
    proc = run([binary, data_dir], check=False)
    assert_all_passed(proc)
    return {name: read_rows(data_dir / f"hardening_{name}.txt") for name in ("xfx", "timestep", "model")}


def test_every_check_passes(hardening):
    assert set(hardening) == {"xfx", "timestep", "model"}


def test_x_equals_f_of_x_matches_pytorch(hardening):
    x0 = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.5, 0.5, -2.0], dtype=torch.float64, requires_grad=True)
    x = x0.clone()
    x = x * y
    x = x**2
    x = torch.sin(x)
    x = x * x + y
    x.sum().backward()
    values, gx, gy = hardening["xfx"]
    # Same LibTorch kernels, same order of operations: exact up to the decimal round trip.
    np.testing.assert_allclose(values, x.detach().numpy(), rtol=1e-15, atol=0)
    np.testing.assert_allclose(gx, x0.grad.numpy(), rtol=1e-14, atol=0)
    np.testing.assert_allclose(gy, y.grad.numpy(), rtol=1e-14, atol=0)


def test_time_stepping_gradients_match_pytorch(hardening):
    s0 = torch.tensor([0.1, 0.4, -0.3, 0.8], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.2, -0.6, 0.9, 0.3], dtype=torch.float64, requires_grad=True)
    s = s0.clone()
    for _ in range(50):
        s = s + 0.05 * torch.tanh(s * w)
        s = s**2 * 0.01 + s * 0.999
    (s * s).sum().backward()
    values, g0, gw = hardening["timestep"]
    # tanh is vectorized (its last bits may differ between AVX2 and AVX-512 kernels); over 50
    # steps such differences stay far below 1e-12 relative in float64.
    np.testing.assert_allclose(values, s.detach().numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(g0, s0.grad.numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(gw, w.grad.numpy(), rtol=1e-12, atol=0)


def test_model_time_stepping_gradients_match_pytorch(hardening, data_dir):
    net = torch.jit.load(str(data_dir / "simplenet_f64.pt"))
    s = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=torch.float64)
    for _ in range(10):
        s = s + 0.1 * net(s)
    (s * s).sum().backward()
    values, gw, gb = hardening["model"]
    weight, bias = net.fc.weight, net.fc.bias
    np.testing.assert_allclose(values, s.detach().numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(gw, weight.grad.T.reshape(-1).numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gb, bias.grad.numpy(), rtol=1e-12, atol=1e-15)
