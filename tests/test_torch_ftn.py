"""pytorch-fortran programs (use torch_ftn) built unchanged with gfortran 12, gfortran 11 and flang through CMake
(tests/projects/ftn), their results compared with PyTorch computing the same at test time."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import torch

from conftest import COMPILERS, TESTS, require_compiler, run, tool_env

PROJECT = TESTS / "projects" / "ftn"


class Scaled(torch.nn.Module):
    def forward(self, x, scale: float, n: int):
        return x * scale + n


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("ftn_models")
    torch.manual_seed(1)
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(d / "ftn_linear.pt"))
    torch.jit.script(Scaled()).save(str(d / "ftn_scaled.pt"))
    torch.jit.script(torch.nn.Linear(3, 1)).save(str(d / "ftn_poly.pt"))
    return d


@pytest.fixture(scope="module", params=[*COMPILERS, "gfortran-11"])
def build(request, installed, tmp_path_factory):
    fc = require_compiler(request.param)
    bdir = tmp_path_factory.mktemp(f"ftn-{request.param}")
    run(["cmake", "-S", PROJECT, "-B", bdir, "-G", "Ninja", f"-DCMAKE_Fortran_COMPILER={fc}",
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}"], env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    return bdir


def rows(path):
    return [np.array([float(v) for v in line.split()]) for line in path.read_text().splitlines() if line.strip()]


def test_inference_reverses_axes_like_pytorch_fortran(build, models, tmp_path):
    out = tmp_path / "inference.txt"
    run([build / "ftn_inference", models, out])
    training, shape, y1, y2, y3, w, grown = rows(out)
    assert list(grown) == [0]  # 2000 forwards in a loop leave no handle behind (gfortran 12 too)
    assert list(training) == [1]  # the module keeps the mode it was saved in, as torch::jit::load
    assert list(shape) == [2, 3]  # a torch (3, 2) result is a Fortran (2, 3) pointer
    net = torch.jit.load(str(models / "ftn_linear.pt"))
    x = (torch.arange(1, 13, dtype=torch.float32) / 10).reshape(3, 4)  # Fortran x(4, 3), reversed
    with torch.no_grad():
        # The Fortran pointer y(2, 3) is the row-major (3, 2) result read in memory order.
        expect = net(x).reshape(-1).numpy()
        expect_neg = net(-x).reshape(-1).numpy()
    # Same LibTorch, same kernels on the same float32 inputs.
    np.testing.assert_allclose(y1, expect, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y2, expect_neg, rtol=1e-6, atol=1e-7)  # the wrap saw x change
    np.testing.assert_allclose(y3, expect_neg, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w, np.array([1, 2, 3, 4, 5]) * 0.5 + 3, rtol=0, atol=0)


def test_polynomial_training_matches_pytorch_sgd(build, models, tmp_path):
    out = tmp_path / "poly.txt"
    run([build / "ftn_polynomial", models, out])
    losses = np.concatenate(rows(out))
    model = torch.jit.load(str(models / "ftn_poly.pt"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.tensor([-1.0 + 2.0 * i / 31 for i in range(32)], dtype=torch.float32)
    feats = torch.stack([xs, xs**2, xs**3], dim=1)
    target = (0.5 - 1.5 * xs + 0.25 * xs**2 + 2.0 * xs**3).reshape(32, 1)
    expect = []
    for _ in range(50):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(feats), target)
        loss.backward()
        opt.step()
        expect.append(loss.item())
    assert losses[-1] < losses[0] / 5
    # float32: the features are computed in Fortran and in PyTorch (x**3 may round differently in
    # the last bit), and SGD's update kernels may fuse multiply-adds differently (C++ vs Python's
    # foreach path): a few float32 ulps, amplified mildly over 50 steps.
    np.testing.assert_allclose(losses, expect, rtol=1e-4, atol=0)
    saved = torch.jit.load(str(models / "ftn_poly_trained.pt"))
    # saved in the mode it trained in, as pytorch-fortran's save (torch.jit.load restores it)
    assert torch.jit.load(str(models / "ftn_poly.pt")).training and saved.training
    for p, q in zip(saved.parameters(), model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6)


def run_script_in_python(x, scale, target):
    spec = importlib.util.spec_from_file_location("ftn_train_ref", PROJECT / "ftn_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    losses = []
    while True:
        assert isinstance(x, torch.Tensor)
        done, loss = mod.ftn_pytorch_train([x, scale], target)
        losses.append(loss)
        if done:
            break
    return losses, mod.ftn_pytorch_forward([x, scale])


def test_pymodule_training_matches_python_alone(build, tmp_path):
    out, saved = tmp_path / "py.txt", tmp_path / "model.pth"
    proc = run([build / "ftn_pymodule", PROJECT / "ftn_train.py", out, saved])
    assert "trained for 25 steps" in proc.stdout
    lines = rows(out)
    losses = np.concatenate(lines[:25])
    shape, y = lines[25], lines[26]
    assert list(shape) == [1, 16]
    i = np.arange(1, 17)
    x = np.stack([(i % 5) / 4, ((3 * i) % 7) / 6, i / 16], axis=1)  # torch (16, 3) = Fortran x(3, 16)
    target = (x[:, 0] - 2 * x[:, 1] + 0.5 * x[:, 2]).reshape(16, 1)
    expect, forward = run_script_in_python(torch.tensor(x), 2.0, torch.tensor(target))
    # The same Python code on the same float64 data (dropout with the same seed): the losses are
    # the same numbers; the Fortran side receives them as real32 (printed with 9 digits, which
    # read back to the same real32).
    np.testing.assert_array_equal(np.float32(losses), np.float32(expect))
    np.testing.assert_allclose(y, forward.reshape(-1).numpy(), rtol=1e-15, atol=0)
    state = torch.load(saved)
    assert set(state) == {"0.weight", "0.bias", "3.weight", "3.bias"}


@pytest.mark.parametrize(
    "case, arg, message",
    [
        ("missing_model", "no_such_model.pt", "[torch_module%load]"),
        ("train_without_optimizer", "MODEL", "[torch_module%train] no optimizer"),
        ("python_exception", str(PROJECT / "ftn_raises.py"),
         "RuntimeError: the training script failed on purpose"),
        ("unconstructed_target", str(PROJECT / "ftn_raises.py"), "[torch_pymodule%train] tensor to add is not"),
    ],
)
def test_failures_stop_cleanly_with_the_reason(build, models, case, arg, message):
    if arg == "MODEL":
        arg = str(models / "ftn_poly.pt")
    proc = run([build / "ftn_errors", case, arg], check=False)
    assert proc.returncode != 0 and proc.returncode < 128, proc.returncode  # not a signal
    assert message in proc.stderr + proc.stdout


def test_failures_go_through_the_one_error_path_catch_scopes_included(build, models):
    """torch_ftn reports failures as every FTorch procedure does: inside a catch scope the failure
    is kept (status and "[torch_module%train] reason"), and the program goes on."""
    proc = run([build / "ftn_errors", "caught_in_scope", models / "ftn_poly.pt"], check=False)
    assert proc.returncode == 0, proc.stderr
    assert "caught 1: [torch_module%train] no optimizer: call create_optimizer_sgd first" in proc.stdout
