"""Training packages (``python -m ftorch export MODEL --train FILE.pt2``): the model's forward and
backward compiled by AOTInductor, no TorchScript. The Fortran training programs written for a
TorchScript model (tests/fortran/test_train.f90) run unchanged on a package put in the TorchScript
file's place, and follow torch.optim's trajectory on the eager model; tests/fortran/
test_train_package.f90 covers what only packages do (models TorchScript rejects, batch-norm
buffers, dropout, saving a package, errors)."""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import COMPILERS, TESTS, assert_all_passed, run
from models import train_data, train_model
from test_train import CASES, case_line, python_run, read_run

# The cases run on a package: every optimizer (with and without options), every scheduler kind,
# the one-call training step (with clipping; with MSE and L1 summed, without), the clipping calls,
# and the CUDA-graph step's update
# (run uncaptured on the CPU).
PACKAGE_CASES = ["sgd_nesterov", "adam", "adamw_amsgrad", "rmsprop_options", "adagrad_options", "lbfgs",
                 "multistep_lr", "exponential_lr", "linear_warmup", "plateau", "clip_norm", "clip_value",
                 "train_step", "train_step_adamw", "train_step_l1_sum", "train_step_mse_sum", "graph_adam_options"]
# torch_train_step with MSE and Adam/AdamW runs the package's compiled step (FTORCH_COMPILED_STEP=
# require fails the step if it would not); the same cases again with the eager step (=0).
COMPILED_STEP = {"train_step": "require", "train_step_adamw": "require", "train_step_mse_sum": "require"}


@pytest.fixture(scope="module")
def package_dir(data_dir, tmp_path_factory):
    """data_dir's files, with train_mlp.pt replaced by a training package of the same model and
    weights (torch_model_load tells them apart by content)."""
    sys.path.insert(0, str(TESTS))
    import ftorch

    d = tmp_path_factory.mktemp("package")
    for f in data_dir.iterdir():
        if f.is_file() and f.name != "train_mlp.pt":
            (d / f.name).symlink_to(f)
    report = ftorch.export(train_model(), ["16,4:float64"], train_package=d / "train_mlp.pt2", dynamic_batch=True)
    assert report.ok, report
    shutil.copy(d / "train_mlp.pt2", d / "train_mlp.pt")
    return d


@pytest.fixture(scope="module", params=COMPILERS)
def train_binary(request, cmake_consumer):
    return cmake_consumer(request.param) / "test_train"


# The package's kernels are Inductor's (fused, vectorized: tanh and the bias sums may round
# differently from ATen's eager kernels, by an ulp) where the reference runs eager TorchScript:
# the first step's loss agrees to ~1e-16 and the trajectories drift apart as optimizers amplify
# the differences. Bounds: losses 1e-9 relative over 25 steps, parameters 1e-8 relative (atol
# 1e-11) -- 10x the TorchScript-vs-torch.optim bounds of test_train.py, for the compiled kernels.
@pytest.mark.parametrize("name", PACKAGE_CASES)
def test_package_trains_like_torch_optim(train_binary, package_dir, data_dir, name):
    env = dict(os.environ, FTORCH_COMPILED_STEP=COMPILED_STEP.get(name, "1"))
    if CASES[name][4] == 5:
        env["FTORCH_CUDA_GRAPHS"] = "eager"
    assert_all_passed(run([train_binary, package_dir, "parity", case_line(name)], check=False, env=env))
    got_loss, got_lr, got_params = read_run(package_dir / f"train_{name}.txt")
    want_loss, want_lr, want_params = python_run(data_dir, name)
    np.testing.assert_allclose(got_lr, want_lr, rtol=1e-12, atol=0)
    if CASES[name][0] == 5:  # LBFGS amplifies the last bit (see test_train.py): the first steps, and convergence
        np.testing.assert_allclose(got_loss[:5], want_loss[:5], rtol=1e-9, atol=0)
        assert abs(got_loss[-1] / want_loss[-1] - 1) < 0.05
    else:
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-9, atol=0)
        for got, want in zip(got_params, want_params, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-11)
    # torch_model_save of a package to a name not ending in .pt2: the state_dict, as torch.load reads it.
    state = torch.load(package_dir / f"trained_{name}.pt", weights_only=True)
    assert list(state) == [n for n, _ in train_model().named_parameters()]
    for got, value in zip(got_params, state.values(), strict=True):
        np.testing.assert_array_equal(got, value.reshape(-1).numpy())


@pytest.mark.parametrize("name", sorted(COMPILED_STEP))
def test_eager_step_of_a_package_matches_too(cmake_consumer, package_dir, data_dir, name):
    """FTORCH_COMPILED_STEP=0: the same steps through the compiled forward and backward nodes and
    LibTorch's optimizer."""
    binary = cmake_consumer(COMPILERS[0]) / "test_train"
    env = dict(os.environ, FTORCH_COMPILED_STEP="0")
    assert_all_passed(run([binary, package_dir, "parity", case_line(name)], check=False, env=env))
    got_loss, _, got_params = read_run(package_dir / f"train_{name}.txt")
    want_loss, _, want_params = python_run(data_dir, name)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-9, atol=0)
    for got, want in zip(got_params, want_params, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-11)


def test_required_compiled_step_says_why_not(cmake_consumer, package_dir):
    """FTORCH_COMPILED_STEP=require on a step the compiled graph does not compute (SGD here): an
    error naming the reason, not a silent slow path."""
    binary = cmake_consumer(COMPILERS[0]) / "test_train"
    env = dict(os.environ, FTORCH_COMPILED_STEP="require")
    proc = run([binary, package_dir, "parity", case_line("train_step").replace(" 1 0.01 ", " 0 0.01 ", 1)],
               check=False, env=env)
    assert proc.returncode != 0
    assert "FTORCH_COMPILED_STEP=require, but this step is not the compiled one: the optimizer is not Adam or AdamW" \
        in proc.stderr, proc.stderr


def test_a_parameter_in_another_memory_layout_trains_with_the_compiled_step(cmake_consumer, data_dir, tmp_path):
    """A parameter the module holds in another memory order than row-major (here a Linear weight
    stored transposed, as channels-last convolution weights are): the package holds it row-major
    (the compiled step writes parameters in place, with the strides it was traced with), and the
    compiled step (FTORCH_COMPILED_STEP=require) follows torch.optim on the ordinary model."""
    sys.path.insert(0, str(TESTS))
    import ftorch
    from torch.export.pt2_archive._package import PT2ArchiveReader

    d = tmp_path / "package"
    d.mkdir()
    for f in data_dir.iterdir():
        if f.is_file() and f.name != "train_mlp.pt":
            (d / f.name).symlink_to(f)
    model = train_model()
    first = model[0]
    first.weight = torch.nn.Parameter(first.weight.detach().t().contiguous().t())  # same values, column-major
    assert not first.weight.is_contiguous()
    # (check=False: the run below compares its training with torch.optim's)
    report = ftorch.export(model, ["16,4:float64"], train_package=d / "train_mlp.pt2", dynamic_batch=True,
                           check=False)
    assert report.ok, report
    with PT2ArchiveReader(str(d / "train_mlp.pt2")) as reader:
        state = torch.load(io.BytesIO(reader.read_bytes("ftorch/state.pt")), weights_only=True)
    assert all(p.is_contiguous() for p in state["parameters"])
    shutil.copy(d / "train_mlp.pt2", d / "train_mlp.pt")
    binary = cmake_consumer(COMPILERS[0]) / "test_train"
    assert_all_passed(run([binary, d, "parity", case_line("train_step")], check=False,
                          env=dict(os.environ, FTORCH_COMPILED_STEP="require")))
    got_loss, _, got_params = read_run(d / "train_train_step.txt")
    want_loss, _, want_params = python_run(data_dir, "train_step")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-9, atol=0)
    for got, want in zip(got_params, want_params, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_package_freeze_set_gradient_accumulation(cmake_consumer, package_dir, data_dir, compiler):
    binary = cmake_consumer(compiler) / "test_train"
    assert_all_passed(run([binary, package_dir, "params"], check=False))
    # The same runs in eager PyTorch (the model of the package, its weights).
    got = {k: read_run(package_dir / f"train_{k}.txt") for k in ("freeze", "setgrad", "accumulate")}
    x, y = train_data()
    for kind, (got_loss, _, got_params) in got.items():
        model = train_model()
        params = list(model.parameters())
        if kind == "freeze":
            params[0].requires_grad_(False)
            params[1].requires_grad_(False)
        opt = (torch.optim.Adam(params, lr=0.01, foreach=False) if kind == "accumulate"
               else torch.optim.SGD(params, lr=0.1, foreach=False))
        losses = []
        for _ in range(5):
            opt.zero_grad()
            if kind == "accumulate":
                la = torch.nn.functional.mse_loss(model(x[:8]), y[:8])
                (0.5 * la).backward()
                lb = torch.nn.functional.mse_loss(model(x[8:]), y[8:])
                (0.5 * lb).backward()
                losses.append(0.5 * la.item() + 0.5 * lb.item())
            else:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                losses.append(loss.item())
                if kind == "setgrad":
                    params[2].grad *= 0.5
            opt.step()
        np.testing.assert_allclose(got_loss, losses, rtol=1e-9, atol=0, err_msg=kind)
        for g, p in zip(got_params, params, strict=True):
            np.testing.assert_allclose(g, p.detach().reshape(-1).numpy(), rtol=1e-8, atol=1e-12, err_msg=kind)


def test_package_checkpoint_resume_is_bit_identical(cmake_consumer, package_dir):
    binary = cmake_consumer(COMPILERS[0]) / "test_train"
    for phase in ("full", "first", "second"):
        assert_all_passed(run([binary, package_dir, "resume", phase], check=False))
    full = (package_dir / "resume_full.txt").read_text().splitlines()
    first = (package_dir / "resume_first.txt").read_text().splitlines()
    second = (package_dir / "resume_second.txt").read_text().splitlines()
    steps_full = [ln for ln in full if ln.startswith("step")]
    steps_split = [ln for ln in first if ln.startswith("step")] + [ln for ln in second if ln.startswith("step")]
    assert len(steps_full) == 20 and steps_split == steps_full
    assert [ln for ln in second if ln.startswith("param")] == [ln for ln in full if ln.startswith("param")]


# ------------------------------------------------------------------------------------------------
# Models TorchScript rejects, and training-mode behaviour (tests/train_models.py), from Fortran.

BATCH = 5
# The package's kernels are Inductor's: fused loops that sum (matmul bias gradients, batch-norm
# statistics, the attention's softmax and einsum) in another order than ATen's eager kernels,
# vectorized or blocked by the CPU's instruction set. Each reduction may round differently by a
# few ulps; float64 values are compared at 1e-10 relative (atol 1e-12), ~1e5 ulps of margin for
# the few reductions in a row these models have.
RTOL, ATOL = 1e-10, 1e-12


def fortran_order(t: torch.Tensor) -> str:
    return " ".join(repr(float(v)) for v in t.detach().t().reshape(-1))


def write_matrix(path, t: torch.Tensor) -> None:
    path.write_text(f"2 {t.shape[0]} {t.shape[1]}\n{fortran_order(t)}\n")


def read_got(path) -> dict:
    got = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[0] in ("grad", "param", "evalgrad"):
            got[parts[0] + " " + parts[1]] = np.array([float(v) for v in parts[2:]])
        else:
            got[parts[0]] = np.array([float(v) for v in parts[1:]])
    return got


# The package each test of this module needs (by test name; the parametrized one by its `name`).
PACKAGE_OF_TEST = {"test_dropout_masks_follow_the_seed_set_from_fortran": "dropout", "test_package_errors": "kwargs",
                   "test_forwards_without_gradients_read_the_state_where_it_is": "kwargs",
                   "test_package_training_loop_keeps_handles_flat": "batch_norm",
                   "test_inspect_describes_a_training_package": "batch_norm",
                   "test_package_of_an_earlier_ftorch_still_trains": "batch_norm",
                   "test_hooks_on_a_package_see_its_gradients": "dataclass_config",
                   "test_float32_package_trains_like_eager": "ensemble:float32"}
# Compilers of the tests below beyond COMPILERS: gfortran 11 builds only this program.
PACKAGE_COMPILERS = [*COMPILERS, "gfortran-11"]


def package_binary(cmake_consumer, compiler):
    return cmake_consumer(compiler, None if compiler in COMPILERS else ["test_train_package"]) / "test_train_package"


def _export_into(d: str, name: str) -> str:
    packaged(Path(d), *name.split(":"))
    return name


@pytest.fixture(scope="module")
def model_dir(request, tmp_path_factory):
    """A directory for the models of train_models.py as training packages (see `packaged`). The
    packages the selected tests need are exported first, two at a time (each export is mostly one
    compiler process: the two cores halve the wait)."""
    sys.path.insert(0, str(TESTS))
    d = tmp_path_factory.mktemp("train_models")
    needed = set()
    for item in request.session.items:
        if item.module is not request.module:
            continue
        if item.originalname == "test_models_torchscript_rejects_train_from_fortran":
            needed.add(item.callspec.params["name"])
        elif item.originalname in PACKAGE_OF_TEST:
            needed.add(PACKAGE_OF_TEST[item.originalname])
    if len(needed) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(_export_into, [str(d)] * len(needed), sorted(needed)))
    return d


def packaged(d, name: str, dtype: str = "float64"):
    """`name` of train_models.py exported (once) into d as a training package with a dynamic batch
    (from 2 for batch norm, which cannot train on one sample), with its input and output gradient
    (<name>_x.txt, <name>_g.txt); <name>.pt2, or <name>_f32.pt2 for dtype "float32" (the model
    in float32); for "kwargs" also an inference package (kwargs_inference.pt2)."""
    import ftorch
    import train_models

    file = d / f"{name}{'' if dtype == 'float64' else '_f32'}.pt2"
    if file.exists():
        return d
    g = torch.Generator().manual_seed(23 + sorted([*train_models.REJECTED_BY_TORCHSCRIPT,
                                                   *train_models.TRAINING_MODE]).index(name))
    model = train_models.build(name) if dtype == "float64" else train_models.build(name).float()
    # (check=False: every test of these packages compares what Fortran computes with eager PyTorch
    # itself; the export's own check is tested on train_mlp.pt2, package_dir)
    report = ftorch.export(model, [f"{BATCH},{train_models.FEATURES}:{dtype}"],
                           train_package=file, dynamic_batch=True,
                           min_batch=2 if name == "batch_norm" else 1, check=False)
    assert report.ok, report
    write_matrix(d / f"{name}_x.txt", torch.randn(BATCH, train_models.FEATURES, generator=g, dtype=torch.float64))
    write_matrix(d / f"{name}_g.txt", torch.randn(BATCH, train_models.OUTPUTS, generator=g, dtype=torch.float64))
    if name == "kwargs":
        ftorch.export(train_models.build("kwargs"), [f"{BATCH},{train_models.FEATURES}:float64"],
                      pt2=d / "kwargs_inference.pt2", check=False)
    return d


def read_matrix(path) -> torch.Tensor:
    head, values = path.read_text().splitlines()[:2]
    _, n1, n2 = map(int, head.split())
    return torch.tensor([float(v) for v in values.split()], dtype=torch.float64).reshape(n2, n1).t().contiguous()


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("name", ["dataclass_config", "kwargs", "ensemble", "attention", "parameter_dict", "batch_norm"])
def test_models_torchscript_rejects_train_from_fortran(cmake_consumer, model_dir, compiler, name):
    import train_models

    if name in train_models.REJECTED_BY_TORCHSCRIPT:
        with pytest.raises(Exception):
            torch.jit.script(train_models.build(name))
    binary = cmake_consumer(compiler) / "test_train_package"
    assert_all_passed(run([binary, packaged(model_dir, name), "grads", name], check=False))
    got = read_got(model_dir / f"{name}_got.txt")

    # Eager PyTorch: the same loss, sum(out * g), in training mode.
    model = train_models.build(name)
    x = read_matrix(model_dir / f"{name}_x.txt").requires_grad_(True)
    g = read_matrix(model_dir / f"{name}_g.txt")
    model.train()
    out = model(x)
    (out * g).sum().backward()
    np.testing.assert_allclose(got["out"], out.detach().reshape(-1).numpy(), rtol=RTOL, atol=ATOL)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(got["grad " + n], p.grad.reshape(-1).numpy(), rtol=RTOL, atol=ATOL, err_msg=n)
    np.testing.assert_allclose(got["xgrad"], x.grad.reshape(-1).numpy(), rtol=RTOL, atol=ATOL)
    # The state after the training forward: batch norm's running statistics updated as eager's.
    state = torch.load(model_dir / f"{name}_state.pt", weights_only=True)
    assert list(state) == list(model.state_dict())
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(state[key].numpy(), value.numpy(), rtol=RTOL, atol=ATOL, err_msg=key)
    # Eval mode on the initial state, without gradients and with them (batch norm on its running
    # statistics).
    fresh = train_models.build(name).eval()
    with torch.no_grad():
        np.testing.assert_allclose(got["eval"], fresh(x).reshape(-1).numpy(), rtol=RTOL, atol=ATOL)
    xe = x.detach().clone().requires_grad_(True)
    out_e = fresh(xe)
    (out_e * g).sum().backward()
    np.testing.assert_allclose(got["evalout"], out_e.detach().reshape(-1).numpy(), rtol=RTOL, atol=ATOL)
    for n, p in fresh.named_parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        np.testing.assert_allclose(got["evalgrad " + n], grad.reshape(-1).numpy(), rtol=RTOL, atol=ATOL, err_msg=n)
    np.testing.assert_allclose(got["evalxgrad"], xe.grad.reshape(-1).numpy(), rtol=RTOL, atol=ATOL)
    # One Adam step: the state_dict and the updated package hold the stepped parameters. Adam's
    # first step is lr * g / (|g| + eps), eps = 1e-8: a gradient that vanishes mathematically (the
    # attention's key bias, to which softmax is invariant) is rounding noise of ~1e-17 there, and
    # the step magnifies a 1e-16 difference in it by lr / eps = 1e6; hence atol 1e-8 here.
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    opt.step()
    stepped = torch.load(model_dir / f"{name}_stepped.pt", weights_only=True)
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(stepped[key].numpy(), value.numpy(), rtol=RTOL, atol=1e-8, err_msg=key)
    from torch._inductor.package import load_package
    from torch.export.pt2_archive._package import PT2ArchiveReader

    with PT2ArchiveReader(str(model_dir / f"{name}_stepped.pt2")) as reader:
        packed = torch.load(io.BytesIO(reader.read_bytes("ftorch/state.pt")), weights_only=True)
    for got_p, value in zip(packed["parameters"], (p for _, p in model.named_parameters()), strict=True):
        np.testing.assert_array_equal(got_p.numpy(), stepped[[k for k, v in model.named_parameters()
                                                              if v is value][0]].numpy())
    # Python loads the saved package's compiled forward too, and runs it on the saved state.
    forward = load_package(str(model_dir / f"{name}_stepped.pt2"), "forward")
    with torch.no_grad():
        result = forward(*packed["parameters"], *packed["buffers"], x.detach())[0]
        np.testing.assert_allclose(result.numpy(), torch.func.functional_call(
            model.train(), dict(model.named_parameters()) | dict(zip([n for n, _ in model.named_buffers()],
                                                                     packed["buffers"])), (x.detach(),)).numpy(),
            rtol=RTOL, atol=ATOL)
    # The forward without gradients after the step (training mode): the stepped parameters. Adam's
    # step magnifies rounding noise in a vanishing gradient (see above): atol 1e-8 again.
    with torch.no_grad():
        np.testing.assert_allclose(got["stepped"], model.train()(x.detach()).reshape(-1).numpy(), rtol=RTOL,
                                   atol=1e-8)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_dropout_masks_follow_the_seed_set_from_fortran(cmake_consumer, model_dir, compiler):
    assert_all_passed(run([cmake_consumer(compiler) / "test_train_package", packaged(model_dir, "dropout"), "dropout",
                           "dropout"],
                          check=False))


@pytest.mark.parametrize("compiler", COMPILERS)
def test_package_errors(cmake_consumer, model_dir, compiler):
    assert_all_passed(run([cmake_consumer(compiler) / "test_train_package", packaged(model_dir, "kwargs"), "errors",
                           "kwargs"],
                          check=False))


@pytest.mark.parametrize("compiler", COMPILERS)
def test_forwards_without_gradients_read_the_state_where_it_is(cmake_consumer, model_dir, compiler):
    assert_all_passed(run([cmake_consumer(compiler) / "test_train_package", packaged(model_dir, "kwargs"), "bound",
                           "kwargs"], check=False))


# What PT2ArchiveWriter writes into every archive itself.
WRITTEN_BY_EVERY_ARCHIVE = {"archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id"}


def as_earlier_ftorch(package: Path, out: Path) -> None:
    """`package` as FTorch wrote it before packages held a compiled step, an inference model and an
    eval-mode backward: its record for FTorch's C++ layer names none of them (the files may stay:
    only what the record names is loaded)."""
    from torch.export.pt2_archive._package import PT2ArchiveReader, PT2ArchiveWriter

    from ftorch._train_package import RECORD_FOR_CPP as record

    dropped = ("step=", "eval_backward=", "infer=", "infer_state=")
    with PT2ArchiveReader(str(package)) as reader, PT2ArchiveWriter(str(out)) as writer:
        names = reader.get_file_names()
        assert record in names, names
        for name in names:
            if name == record:
                lines = reader.read_string(name).splitlines(keepends=True)
                kept = [ln for ln in lines if not ln.startswith(dropped)]
                assert len(lines) - len(kept) == 4, lines
                writer.write_string(name, "".join(kept))
            elif name not in WRITTEN_BY_EVERY_ARCHIVE:
                writer.write_bytes(name, reader.read_bytes(name))


@pytest.mark.parametrize("compiler", COMPILERS)
def test_package_of_an_earlier_ftorch_still_trains(cmake_consumer, model_dir, compiler):
    """A package exported before the compiled step, the inference model and eval-mode gradients
    existed: trained on the eager step, the same numbers as today's package; its eval forwards as
    the inference model's; eval-mode gradients refused with what to do."""
    as_earlier_ftorch(packaged(model_dir, "batch_norm") / "batch_norm.pt2", model_dir / "batch_norm_older.pt2")
    env = dict(os.environ, FTORCH_COMPILED_STEP="0")
    assert_all_passed(run([cmake_consumer(compiler) / "test_train_package", model_dir, "older", "batch_norm"],
                          check=False, env=env))


@pytest.mark.parametrize("compiler", PACKAGE_COMPILERS)
def test_hooks_on_a_package_see_its_gradients(cmake_consumer, model_dir, compiler):
    """The package is a node of Fortran's autograd graph: a hook on its output doubles the
    gradient entering the compiled backward, a hook on its first parameter halves the gradient
    leaving it; every gradient equals eager PyTorch with the same hooks (RTOL/ATOL above)."""
    import train_models

    name = "dataclass_config"
    assert_all_passed(run([package_binary(cmake_consumer, compiler), packaged(model_dir, name), "hooks", name],
                          check=False))
    got = read_got(model_dir / f"{name}_hooked.txt")
    model = train_models.build(name).train()
    x = read_matrix(model_dir / f"{name}_x.txt").requires_grad_(True)
    g = read_matrix(model_dir / f"{name}_g.txt")
    next(model.parameters()).register_hook(lambda grad: grad * 0.5)
    out = model(x)
    out.register_hook(lambda grad: grad * 2)
    (out * g).sum().backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(got["grad " + n], p.grad.reshape(-1).numpy(), rtol=RTOL, atol=ATOL, err_msg=n)
    np.testing.assert_allclose(got["xgrad"], x.grad.reshape(-1).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("compiler", PACKAGE_COMPILERS)
def test_float32_package_trains_like_eager(cmake_consumer, model_dir, compiler):
    """A float32 package (the ensemble of train_models.py) trained from Fortran by the explicit
    loop (forward, MSE, backward, Adam lr 0.01) for 10 steps follows eager float32 PyTorch.
    Bounds: float32's unit roundoff is 6e-8; Inductor's fused kernels sum (matmuls, the batch sums
    of bias gradients, the ensemble mean) in another order than ATen's, by instruction set, so each
    value may differ by a few ulps (~1e-7 relative). Adam's update lr*m/(sqrt(v)+eps) is as
    sensitive as the gradient's relative error where |g| >> eps (no gradient of this model vanishes),
    so 10 steps move the parameters apart by ~1e-8; rtol 1e-5 / atol 1e-6 leaves ~100x margin and
    stays 10^4 below one step's change (~lr = 1e-2), so a wrong step fails."""
    import torch.nn.functional as F
    import train_models

    name = "ensemble"
    assert_all_passed(run([package_binary(cmake_consumer, compiler), packaged(model_dir, name, "float32"), "float32",
                           name], check=False))
    got = read_got(model_dir / f"{name}_f32_got.txt")
    model = train_models.build(name).float().train()
    x = read_matrix(model_dir / f"{name}_x.txt").float()
    y = read_matrix(model_dir / f"{name}_g.txt").float()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5, atol=0)
    assert losses[-1] < losses[0]
    for n, p in model.named_parameters():
        np.testing.assert_allclose(got[f"param {n}"], p.detach().reshape(-1).numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=n)


def test_package_training_loop_keeps_handles_flat(cmake_consumer, model_dir):
    assert_all_passed(run([cmake_consumer(COMPILERS[0]) / "test_train_package", packaged(model_dir, "batch_norm"),
                           "memory", "batch_norm"],
                          check=False))


def test_cli_names_a_training_package_pt2(tmp_path):
    """--train FILE must be a .pt2 (alone, --train keeps TorchScript's training mode)."""
    model = TESTS / "train_models.py"
    proc = run([sys.executable, "-m", "ftorch", "export", f"{model}:Kwargs", "--input", "5,6", "--train", "x.pt"],
               check=False)
    assert proc.returncode == 2 and "a training package is a .pt2 file" in proc.stderr, proc.stderr


def test_export_refuses_what_cannot_train(tmp_path):
    import ftorch

    class IntegerOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x).argmax(dim=1)

    with pytest.raises(ftorch.UsageError, match="floating-point outputs"):
        ftorch.export(IntegerOutput(), ["3,4"], train_package=tmp_path / "bad.pt2")
    with pytest.raises(ftorch.UsageError, match="must end with .pt2"):
        ftorch.export(IntegerOutput(), ["3,4"], train_package=tmp_path / "bad.pt")

    seen = torch.zeros(4)

    class BufferChangesShape(torch.nn.Module):  # a buffer the forward assigns a value of another shape
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.register_buffer("seen", seen)

        def forward(self, x):
            self.seen = x.detach().clone()
            return self.fc(x)

    with pytest.raises(ftorch.UsageError, match=r"assigns buffer seen \(shape \(4,\), float32 on cpu\) a value of "
                                                r"shape \(3, 4\), float32 on cpu"):
        ftorch.export(model := BufferChangesShape(), ["3,4"], train_package=tmp_path / "bad.pt2")
    assert model.seen is seen and torch.equal(seen, torch.zeros(4))  # the caller's buffer, as it was

    class EvalModeUpdates(torch.nn.Module):  # a running mean updated in eval mode too
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.register_buffer("mean", torch.zeros(4))

        def forward(self, x):
            self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
            return self.fc(x - self.mean)

    class EvalModeCounts(EvalModeUpdates):  # in place, read by no output
        def forward(self, x):
            self.mean.add_(1.0)
            return self.fc(x)

    class EvalModeCountsThroughData(EvalModeUpdates):  # in place through .data (its own version counter)
        def forward(self, x):
            self.mean.data.add_(1.0)
            return self.fc(x)

    for cls in (EvalModeUpdates, EvalModeCounts, EvalModeCountsThroughData):
        with pytest.raises(ftorch.UsageError, match=r"the eval-mode forward of .* changes buffer mean: .*"
                                                    r"\(under `if self.training:`\)"):
            ftorch.export(model := cls(), ["3,4"], train_package=tmp_path / "bad.pt2")
        assert torch.equal(model.mean, torch.zeros(4))


def test_inspect_describes_a_training_package(model_dir):
    proc = run([sys.executable, "-m", "ftorch", "inspect", packaged(model_dir, "batch_norm") / "batch_norm.pt2"])
    out = proc.stdout
    assert "(training package, class BatchNormModel)" in out, out
    assert "eval mode runs its own compiled forward, with its own backward" in out
    assert "forwards without gradients run the inference model" in out
    assert "torch_train_step with MSE and Adam/AdamW runs the compiled training step" in out
    assert "net.1.running_mean" in out and "trainable" in out
    assert "batch: dim 0 of every input may be 2..any" in out


def test_a_package_from_before_tied_weights_were_recorded_still_loads(model_dir, tmp_path):
    """A package whose record lists a tied weight's second name as a plain key (FTorch before the
    key:name pairs) loads, and torch_model_save's state_dict leaves that key out, as it did; a
    key:name pair naming no parameter or buffer is a damaged package."""
    import ctypes

    from torch.export.pt2_archive._package import PT2ArchiveReader, PT2ArchiveWriter

    from conftest import helper
    from ftorch._train_package import RECORD_FOR_CPP as record

    def rewritten(out: Path, change) -> Path:
        with PT2ArchiveReader(str(packaged(model_dir, "kwargs") / "kwargs.pt2")) as reader, \
                PT2ArchiveWriter(str(out)) as writer:
            for name in reader.get_file_names():
                if name == record:
                    lines = reader.read_string(name).splitlines(keepends=True)
                    (k,) = [i for i, ln in enumerate(lines) if ln.startswith("state_dict=")]
                    assert "tied.weight:fc.weight" in lines[k], lines[k]
                    lines[k] = change(lines[k])
                    writer.write_string(name, "".join(lines))
                elif name not in WRITTEN_BY_EVERY_ARCHIVE:
                    writer.write_bytes(name, reader.read_bytes(name))
        return out

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    model = ctypes.c_void_p()
    older = rewritten(tmp_path / "older.pt2", lambda ln: ln.replace(":fc.weight", "").replace(":fc.bias", ""))
    assert lib.ftc_model_load(ctypes.byref(model), str(older).encode(), 0, -1, 0, -1) == 0, lib.ftc_last_error()
    assert lib.ftc_model_save(model, str(tmp_path / "older_state.pt").encode()) == 0, lib.ftc_last_error()
    assert list(torch.load(tmp_path / "older_state.pt", weights_only=True)) == ["fc.weight", "fc.bias"]
    damaged = rewritten(tmp_path / "damaged.pt2", lambda ln: ln.replace(":fc.weight", ":no.such"))
    assert lib.ftc_model_load(ctypes.byref(model), str(damaged).encode(), 0, -1, 0, -1) != 0
    assert "names 'no.such', which is neither a parameter nor a buffer" in lib.ftc_last_error().decode()
    lib.ftc_model_delete(ctypes.byref(model))
