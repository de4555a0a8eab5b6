"""Training from Fortran against torch.optim and torch.nn.functional, computed here at test time:
the same TorchScript model, data and settings give the same loss trajectory (1e-10 relative
over >= 20 steps), the same learning rates and the same final parameters."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import COMPILERS, assert_all_passed, run
from models import loss_data, train_data

STEPS = 25
# name: (optimizer code, 7 hyper-parameters, scheduler code, 8 scheduler parameters, mode)
#   optimizer: 0 SGD(lr, momentum, weight_decay, dampening, nesterov) 1 Adam / 2 AdamW(lr, b1, b2,
#   eps, weight_decay, amsgrad) 3 RMSprop(lr, alpha, eps, weight_decay, momentum, centered)
#   4 Adagrad(lr, lr_decay, weight_decay, initial_accumulator_value, eps) 5 LBFGS(lr, max_iter,
#   history_size, strong_wolfe); scheduler: -1 none 0 step(step_size, gamma) 1 multistep(gamma,
#   m1, m2, m3) 2 exponential(gamma) 3 cosine(T_max, eta_min) 4 plateau(factor, patience,
#   threshold, cooldown, min_lr) 5 linear(start, end, total); mode: 0 building blocks,
#   1 torch_train_step with max_grad_norm 1, 2 clip norm 0.5, 3 clip value 0.05, 4 lr set at step 10,
#   7 torch_train_step with an L1 loss summed, no clipping, 8 the same with MSE (no scheduler),
#   5 as 1 with cuda_graph=.true. under FTORCH_CUDA_GRAPHS=eager: LibTorch's optimizer for the
#   first step (it makes the optimizer's state), then the work a CUDA graph captures (FTorch's
#   graph-safe update, clipping on the device), run uncaptured on the CPU, against torch.optim
CASES = {
    "sgd": (0, [0.1, 0, 0, 0, 0], -1, [], 0),
    "sgd_momentum": (0, [0.05, 0.9, 0, 0, 0], -1, [], 0),
    "sgd_nesterov": (0, [0.05, 0.9, 0, 0, 1], -1, [], 0),
    "sgd_decay_dampening": (0, [0.05, 0.9, 0.01, 0.1, 0], -1, [], 0),
    "adam": (1, [0.01, 0.9, 0.999, 1e-8, 0, 0], -1, [], 0),
    "adam_options": (1, [0.01, 0.8, 0.95, 1e-6, 0.1, 1], -1, [], 0),
    "adamw": (2, [0.01, 0.9, 0.999, 1e-8, 0.01, 0], -1, [], 0),
    "adamw_amsgrad": (2, [0.01, 0.85, 0.99, 1e-7, 0.05, 1], -1, [], 0),
    "rmsprop": (3, [0.01, 0.99, 1e-8, 0, 0, 0], -1, [], 0),
    "rmsprop_options": (3, [0.01, 0.9, 1e-6, 0.01, 0.5, 1], -1, [], 0),
    "adagrad": (4, [0.1, 0, 0, 0, 1e-10], -1, [], 0),
    "adagrad_options": (4, [0.1, 0.01, 0.01, 0.1, 1e-8], -1, [], 0),
    "lbfgs": (5, [0.5, 5, 10, 0], -1, [], 0),
    "lbfgs_strong_wolfe": (5, [1.0, 5, 10, 1], -1, [], 0),
    "step_lr": (0, [0.1, 0.5, 0, 0, 0], 0, [5, 0.5], 0),
    "multistep_lr": (0, [0.1, 0, 0, 0, 0], 1, [0.3, 3, 7, 12], 0),
    "exponential_lr": (1, [0.02, 0.9, 0.999, 1e-8, 0, 0], 2, [0.9], 0),
    "cosine_lr": (0, [0.1, 0.9, 0, 0, 0], 3, [10, 0.001], 0),
    "linear_warmup": (1, [0.02, 0.9, 0.999, 1e-8, 0, 0], 5, [0.25, 1.0, 8], 0),
    "plateau": (0, [0.5, 0, 0, 0, 0], 4, [0.5, 1, 0.3, 1, 0.01], 0),
    "clip_norm": (0, [0.2, 0, 0, 0, 0], -1, [], 2),
    "clip_value": (0, [0.2, 0, 0, 0, 0], -1, [], 3),
    "set_lr": (0, [0.1, 0.9, 0, 0, 0], -1, [], 4),
    "train_step": (1, [0.01, 0.9, 0.999, 1e-8, 0, 0], 3, [10, 0.0], 1),
    "train_step_adamw": (2, [0.01, 0.9, 0.999, 1e-8, 0.01, 0], -1, [], 1),
    "train_step_l1_sum": (1, [0.002, 0.9, 0.999, 1e-8, 0, 0], -1, [], 7),
    "train_step_mse_sum": (2, [0.002, 0.9, 0.999, 1e-8, 0.01, 0], -1, [], 8),
    "graph_sgd": (0, [0.1, 0, 0, 0, 0], -1, [], 5),
    "graph_sgd_momentum_decay": (0, [0.05, 0.9, 0.01, 0.1, 0], 0, [5, 0.5], 5),
    "graph_sgd_nesterov": (0, [0.05, 0.9, 0, 0, 1], -1, [], 5),
    "graph_adam": (1, [0.01, 0.9, 0.999, 1e-8, 0, 0], 3, [10, 0.0], 5),
    "graph_adam_options": (1, [0.01, 0.8, 0.95, 1e-6, 0.1, 1], -1, [], 5),
    "graph_adamw_amsgrad": (2, [0.01, 0.85, 0.99, 1e-7, 0.05, 1], 2, [0.9], 5),
    # mode 6: a linear warm-up (0.1 to 1 over 3 steps) made before the case's scheduler, both stepped:
    # the cosine schedule's restarts rise towards the rate before the warm-up (PyTorch's initial_lr)
    "warmup_then_cosine": (0, [0.1, 0.9, 0, 0, 0], 3, [4, 0.001], 6),
}


def case_line(name: str) -> str:
    kind, h, sched, s, mode = CASES[name]
    h = list(h) + [0.0] * (7 - len(h))
    s = list(s) + [0.0] * (8 - len(s))
    return " ".join([name, str(kind), *map(repr, map(float, h)), str(sched), *map(repr, map(float, s)), str(mode),
                     str(STEPS)])


def make_optimizer(kind, h, params):
    if kind == 0:
        return torch.optim.SGD(params, lr=h[0], momentum=h[1], weight_decay=h[2], dampening=h[3],
                               nesterov=bool(h[4]), foreach=False)
    if kind in (1, 2):
        cls = torch.optim.Adam if kind == 1 else torch.optim.AdamW
        return cls(params, lr=h[0], betas=(h[1], h[2]), eps=h[3], weight_decay=h[4], amsgrad=bool(h[5]),
                   foreach=False)
    if kind == 3:
        return torch.optim.RMSprop(params, lr=h[0], alpha=h[1], eps=h[2], weight_decay=h[3], momentum=h[4],
                                   centered=bool(h[5]), foreach=False)
    if kind == 4:
        return torch.optim.Adagrad(params, lr=h[0], lr_decay=h[1], weight_decay=h[2],
                                   initial_accumulator_value=h[3], eps=h[4], foreach=False)
    return torch.optim.LBFGS(params, lr=h[0], max_iter=int(h[1]), history_size=int(h[2]),
                             line_search_fn="strong_wolfe" if h[3] else None)


def make_scheduler(kind, s, opt):
    S = torch.optim.lr_scheduler
    return {
        -1: lambda: None,
        0: lambda: S.StepLR(opt, step_size=int(s[0]), gamma=s[1]),
        1: lambda: S.MultiStepLR(opt, milestones=[int(m) for m in s[1:4]], gamma=s[0]),
        2: lambda: S.ExponentialLR(opt, gamma=s[0]),
        3: lambda: S.CosineAnnealingLR(opt, T_max=int(s[0]), eta_min=s[1]),
        4: lambda: S.ReduceLROnPlateau(opt, factor=s[0], patience=int(s[1]), threshold=s[2], cooldown=int(s[3]),
                                       min_lr=s[4]),
        5: lambda: S.LinearLR(opt, start_factor=s[0], end_factor=s[1], total_iters=int(s[2])),
    }[kind]()


def python_run(data_dir, name):
    # FTorch runs TorchScript without graph-executor optimization (torch_jit_set_optimize), so
    # the replay does too: the same operators, hence the same rounding, also for LBFGS, which
    # amplifies the last bit of a gradient.
    with torch.jit.optimized_execution(False):
        return _python_run(data_dir, name)


def _python_run(data_dir, name):
    kind, h, sched_kind, s, mode = CASES[name]
    model = torch.jit.load(str(data_dir / "train_mlp.pt"))
    model.train()
    x, y = train_data()
    params = list(model.parameters())
    opt = make_optimizer(kind, h, params)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=3) if mode == 6 else None
    sched = make_scheduler(sched_kind, s, opt)
    losses, lrs = [], []
    for step in range(1, STEPS + 1):
        lrs.append(opt.param_groups[0]["lr"])
        if kind == 5:
            def closure():
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss
            loss = opt.step(closure).item()
        else:
            opt.zero_grad()
            if mode == 7:
                out = F.l1_loss(model(x), y, reduction="sum")
            else:
                out = F.mse_loss(model(x), y, reduction="sum" if mode == 8 else "mean")
            out.backward()
            loss = out.item()
            if mode in (1, 5):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            if mode == 2:
                torch.nn.utils.clip_grad_norm_(params, 0.5)
            if mode == 3:
                torch.nn.utils.clip_grad_value_(params, 0.05)
            opt.step()
        if warm is not None:
            warm.step()
        if sched_kind == 4:
            sched.step(loss)
        elif sched is not None:
            sched.step()
        if mode == 4 and step == 10:
            for g in opt.param_groups:
                g["lr"] = 0.02
        losses.append(loss)
    return np.array(losses), np.array(lrs), [p.detach().reshape(-1).numpy() for p in params]


def python_last_lrs(name):
    """Mode 6's schedules alone (they do not depend on the loss): per step, the warm-up's and the
    case scheduler's get_last_lr()."""
    kind, h, sched_kind, s, _ = CASES[name]
    p = torch.zeros(1, requires_grad=True)
    opt = make_optimizer(kind, h, [p])
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=3)
    sched = make_scheduler(sched_kind, s, opt)
    out = []
    for _ in range(STEPS):
        opt.step()
        warm.step()
        sched.step()
        out.append([warm.get_last_lr()[0], sched.get_last_lr()[0]])
    return out


def read_run(path):
    losses, lrs, params = [], [], []
    for line in path.read_text().splitlines():
        head, *values = line.split()
        if head == "step":
            losses.append(float(values[0]))
            lrs.append(float(values[1]))
        elif head == "param":
            params.append(np.array([float(v) for v in values]))
    return np.array(losses), np.array(lrs), params


@pytest.fixture(scope="module", params=COMPILERS)
def train_binary(request, cmake_consumer):
    return cmake_consumer(request.param) / "test_train"


# LBFGS: LibTorch's C++ LBFGS and torch.optim.LBFGS are two implementations of the same
# algorithm whose dot products and updates round differently (~1e-16 relative at step 1). The
# two-loop recursion divides by curvature products y.s that shrink as the loss converges, which
# amplifies those differences by ~4x per step (seen here: 2e-15 at step 2, 1e-11 at step 9,
# 2e-10 at step 12, 3e-3 at step 24; the same on an AMD EPYC), so no trajectory tolerance holds
# for 25 steps. What is deterministic is compared exactly or tightly; the rest is bounded:
#  - the first LBFGS_TIGHT_STEPS losses at 1e-10 relative (observed <= 1e-11: 10x margin);
#  - a second Fortran run reproduces the first bit for bit;
#  - the final loss within 5% of PyTorch's (17x the difference observed at step 25), and more
#    than 100x below the initial loss: the same convergence, not the same rounding.
LBFGS_TIGHT_STEPS = 9


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_matches_torch_optim(train_binary, data_dir, name):
    env = dict(os.environ, FTORCH_CUDA_GRAPHS="eager") if CASES[name][4] == 5 else None
    assert_all_passed(run([train_binary, data_dir, "parity", case_line(name)], check=False, env=env))
    got_loss, got_lr, got_params = read_run(data_dir / f"train_{name}.txt")
    want_loss, want_lr, want_params = python_run(data_dir, name)
    assert len(got_loss) == STEPS >= 20
    np.testing.assert_allclose(got_lr, want_lr, rtol=1e-12, atol=0)
    if CASES[name][4] == 6:  # each schedule's get_last_lr: the rate it set, not the optimizer's now
        want_last = python_last_lrs(name)
        got_last = [[float(v) for v in ln.split()[1:]] for ln in
                    (data_dir / f"train_{name}.txt").read_text().splitlines() if ln.startswith("last ")]
        np.testing.assert_allclose(np.array(got_last), np.array(want_last), rtol=1e-12, atol=0)
    if CASES[name][0] == 5:  # LBFGS: see LBFGS_TIGHT_STEPS
        np.testing.assert_allclose(got_loss[:LBFGS_TIGHT_STEPS], want_loss[:LBFGS_TIGHT_STEPS], rtol=1e-10, atol=0)
        assert abs(got_loss[-1] / want_loss[-1] - 1) < 0.05
        assert got_loss[-1] < got_loss[0] / 100
        first = (data_dir / f"train_{name}.txt").read_text()
        assert_all_passed(run([train_binary, data_dir, "parity", case_line(name)], check=False))
        assert (data_dir / f"train_{name}.txt").read_text() == first, "a second run differs"
    else:
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-10, atol=0)
        for got, want in zip(got_params, want_params, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # The TorchScript file saved from Fortran holds the trained weights.
    trained = torch.jit.load(str(data_dir / f"trained_{name}.pt"))
    assert not trained.training, "torch_model_save writes the model in eval() mode (trained in training mode)"
    for got, p in zip(got_params, trained.parameters(), strict=True):
        np.testing.assert_array_equal(got, p.detach().reshape(-1).numpy())
    if kind_uses_scheduler := CASES[name][2] >= 0:
        assert kind_uses_scheduler and len(set(got_lr)) > 1, "the schedule changed the learning rate"


def test_freeze_set_gradient_and_accumulation_match_pytorch(train_binary, data_dir):
    assert_all_passed(run([train_binary, data_dir, "params"], check=False))
    x, y = train_data()

    def replay(kind):
        with torch.jit.optimized_execution(False):
            return _replay(kind)

    def _replay(kind):
        model = torch.jit.load(str(data_dir / "train_mlp.pt"))
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
                la = F.mse_loss(model(x[:8]), y[:8])
                (0.5 * la).backward()
                lb = F.mse_loss(model(x[8:]), y[8:])
                (0.5 * lb).backward()
                losses.append(0.5 * la.item() + 0.5 * lb.item())
            else:
                loss = F.mse_loss(model(x), y)
                loss.backward()
                losses.append(loss.item())
                if kind == "setgrad":
                    params[2].grad *= 0.5
            opt.step()
        return np.array(losses), [p.detach().reshape(-1).numpy() for p in params]

    for kind in ("freeze", "setgrad", "accumulate"):
        got_loss, _, got_params = read_run(data_dir / f"train_{kind}.txt")
        want_loss, want_params = replay(kind)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-10, atol=0, err_msg=kind)
        for got, want in zip(got_params, want_params, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14, err_msg=kind)


def _check_first_layer_frozen(train_binary, data_dir, mode, trainable):
    """Runs mode under FTORCH_CUDA_GRAPHS=eager and replays it with torch.optim's Adam, the first
    layer trainable at the steps where trainable(step) holds."""
    env = dict(os.environ, FTORCH_CUDA_GRAPHS="eager")
    assert_all_passed(run([train_binary, data_dir, mode], check=False, env=env))
    got_loss, _, got_params = read_run(data_dir / f"train_{mode}.txt")
    x, y = train_data()
    with torch.jit.optimized_execution(False):
        model = torch.jit.load(str(data_dir / "train_mlp.pt"))
        params = list(model.parameters())
        opt = torch.optim.Adam(params, lr=0.01, foreach=False)
        losses = []
        for step in range(1, 13):
            for p in params[:2]:
                p.requires_grad_(trainable(step))
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
            opt.step()
    steps = [opt.state[p]["step"].item() for p in params]
    assert steps == [9, 9, 12, 12], steps
    np.testing.assert_allclose(got_loss, losses, rtol=1e-10, atol=0)
    for got, p in zip(got_params, params, strict=True):
        np.testing.assert_allclose(got, p.detach().reshape(-1).numpy(), rtol=1e-9, atol=1e-12)


def test_graph_step_with_staggered_adam_step_counts(train_binary, data_dir):
    """The CUDA-graph step's update (run uncaptured, FTORCH_CUDA_GRAPHS=eager) when the parameters'
    Adam step counts differ: the first layer was frozen for 3 steps, so it starts the graph-safe
    update 3 steps behind the others (two groups of the multi-tensor update). torch.optim's Adam
    skips parameters without a gradient in the same way."""
    _check_first_layer_frozen(train_binary, data_dir, "staggered", lambda step: step > 3)


def test_graph_step_sees_a_freeze_after_the_capture(train_binary, data_dir):
    """Which parameters require gradients is part of what a CUDA-graph step captured: freezing the
    first layer after the capture (steps 6-8) and unfreezing it (9-12) warm up and capture anew
    (a replay of the old capture would train the frozen layer, and never the unfrozen one). Run
    uncaptured (FTORCH_CUDA_GRAPHS=eager), which replays the captured set of updated parameters,
    against torch.optim's Adam, which skips parameters without a gradient."""
    _check_first_layer_frozen(train_binary, data_dir, "refreeze", lambda step: not 6 <= step <= 8)


@pytest.mark.parametrize("graph", [False, True], ids=["steps", "cuda_graph"])
def test_checkpoint_resume_across_processes_is_bit_identical(train_binary, data_dir, graph):
    """Adam (amsgrad) with a step schedule, 20 steps in one process or 10, a checkpoint and 10 in a
    new one: the same losses and parameters bit for bit. cuda_graph: torch_train_step's CUDA-graph
    step (FTORCH_CUDA_GRAPHS=eager runs the captured work on the CPU); the resumed process must do
    the graph's arithmetic from its first step, as the uninterrupted one does by then, not
    LibTorch's own optimizer step, whose rounding differs in the last bit."""
    extra, tag = (["graph"], "graph_") if graph else ([], "")
    env = dict(os.environ, FTORCH_CUDA_GRAPHS="eager") if graph else None
    for phase in ("full", "first", "second"):
        assert_all_passed(run([train_binary, data_dir, "resume", phase, *extra], check=False, env=env))
    full = (data_dir / f"resume_{tag}full.txt").read_text().splitlines()
    first = (data_dir / f"resume_{tag}first.txt").read_text().splitlines()
    second = (data_dir / f"resume_{tag}second.txt").read_text().splitlines()
    steps_full = [ln for ln in full if ln.startswith("step")]
    steps_split = [ln for ln in first if ln.startswith("step")] + [ln for ln in second if ln.startswith("step")]
    assert len(steps_full) == 20 and steps_split == steps_full
    assert [ln for ln in second if ln.startswith("param")] == [ln for ln in full if ln.startswith("param")]


def test_checkpoint_killed_while_writing_leaves_the_previous_file(train_binary, data_dir, tmp_path):
    """kill -9 of a process saving a 96 MB checkpoint (a save takes ~0.25 s here), at several
    points of a save: the file always holds the last complete checkpoint."""
    ckpt = tmp_path / "big.ckpt"
    interrupted_writes = 0
    for delay in (0.02, 0.1, 0.18):
        proc = subprocess.Popen([str(train_binary), str(data_dir), "saver", str(ckpt)], stdout=subprocess.PIPE,
                                text=True)
        try:
            saved = 0
            while saved < 2:  # two complete saves in this process, then kill during a later one
                line = proc.stdout.readline()
                assert line, "the saver stopped"
                if line.startswith("saved"):
                    saved = int(line.split()[1])
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        leftovers = list(tmp_path.glob("big.ckpt.tmp.*"))
        interrupted_writes += bool(leftovers)
        for f in leftovers:
            f.unlink()
        check = run([train_binary, data_dir, "loadcheck", ckpt], check=False)
        assert_all_passed(check)
        assert int(check.stdout.split("loaded step ")[1].split()[0]) >= 2
    assert interrupted_writes >= 1, "no kill landed inside a write"


def test_bad_inputs_are_clean_errors(train_binary, data_dir):
    assert_all_passed(run([train_binary, data_dir, "errors"], check=False))


def python_losses():
    d = loss_data()
    p, t, c, probs, b, w, pw = (d[k] for k in ("pred", "target", "classes", "probs", "binary", "class_weight",
                                                "pos_weight"))
    return {
        "mse_mean": lambda q: F.mse_loss(q, t),
        "mse_sum": lambda q: F.mse_loss(q, t, reduction="sum"),
        "mse_none": lambda q: F.mse_loss(q, t, reduction="none"),
        "l1_mean": lambda q: F.l1_loss(q, t),
        "l1_none": lambda q: F.l1_loss(q, t, reduction="none"),
        "huber_0.5": lambda q: F.huber_loss(q, t, delta=0.5),
        "huber_sum": lambda q: F.huber_loss(q, t, reduction="sum"),
        "smooth_l1_0.5": lambda q: F.smooth_l1_loss(q, t, beta=0.5),
        "smooth_l1_none_2": lambda q: F.smooth_l1_loss(q, t, reduction="none", beta=2.0),
        "ce_index": lambda q: F.cross_entropy(q, c),
        "ce_index_none": lambda q: F.cross_entropy(q, c, reduction="none"),
        "ce_options": lambda q: F.cross_entropy(q, c, weight=w, ignore_index=3, label_smoothing=0.1),
        "ce_weight_sum": lambda q: F.cross_entropy(q, c, weight=w, reduction="sum"),
        "ce_probs": lambda q: F.cross_entropy(q, probs),
        "ce_probs_smooth": lambda q: F.cross_entropy(q, probs, label_smoothing=0.2),
        "nll": lambda q: F.nll_loss(q, c),
        "nll_options": lambda q: F.nll_loss(q, c, weight=w, ignore_index=0),
        "bce": lambda q: F.binary_cross_entropy_with_logits(q, b),
        "bce_pos_weight_none": lambda q: F.binary_cross_entropy_with_logits(q, b, reduction="none", pos_weight=pw),
        "bce_weight_pos_weight": lambda q: F.binary_cross_entropy_with_logits(q, b, weight=t, pos_weight=pw),
    }, p


def test_losses_match_torch_functional(train_binary, data_dir):
    assert_all_passed(run([train_binary, data_dir, "losses"], check=False))
    lines = (data_dir / "losses.txt").read_text().splitlines()
    got = {}
    for i in range(0, len(lines), 2):
        name, *values = lines[i].split()
        _, *grad = lines[i + 1].split()
        got[name] = (np.array([float(v) for v in values]), np.array([float(v) for v in grad]))
    functions, pred = python_losses()
    assert set(got) == set(functions)
    for name, fn in functions.items():
        q = pred.clone().requires_grad_(True)
        value = fn(q)
        value.sum().backward()
        np.testing.assert_allclose(got[name][0], value.detach().reshape(-1).numpy(), rtol=1e-12, atol=1e-15,
                                   err_msg=name)
        np.testing.assert_allclose(got[name][1], q.grad.reshape(-1).numpy(), rtol=1e-12, atol=1e-15, err_msg=name)
