"""TorchFort's API (torchfort.h, module torchfort): a TorchFort program (tests/fortran/test_torchfort.f90)
trains YAML-configured models with gfortran 11, gfortran 12 and flang 19, and its losses, outputs and final weights equal
training written in Python with PyTorch from the same configuration, seed and data (TorchFort's
built-in MLP, its losses, optimizers, gradient clipping and accumulation, and each of its learning-rate
schedules); checkpoints resume bit for bit; a C program reaches the same API through torchfort.h."""

from __future__ import annotations

import math

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import COMPILERS, TESTS, assert_all_passed, helper, run, tool_env


def _mpi_build(installed, tmp_path) -> Path:
    """tests/projects/mpi (Fortran and C, find_package(MPI), FTorch::torchfort_mpi)."""
    from test_distributed import require_mpi

    require_mpi()
    bdir = tmp_path / "build"
    run(["cmake", "-S", TESTS / "projects" / "mpi", "-B", bdir, "-G", "Ninja", "-DCMAKE_Fortran_COMPILER=gfortran",
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}"], env=tool_env())
    run(["cmake", "--build", bdir, "--target", "test_torchfort_distributed", "test_torchfort_distributed_without"],
        env=tool_env())
    return bdir

SEED, STEPS, BATCH = 1234, 8, 6

# name -> configuration (written as YAML by _to_yaml). "f8..." models are float64 TorchScript files.
CONFIGS = {
    "adam_cosine": {
        "general": {"report_frequency": 4},
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 16, 3]}},
        "loss": {"type": "MSE"},
        "optimizer": {"type": "adam", "parameters": {"learning_rate": "1e-2", "weight_decay": 0.01},
                      "general": {"max_grad_norm": 0.5}},
        "lr_scheduler": {"type": "cosine_annealing", "parameters": {"T_max": 5}},
    },
    "sgd_multistep_accum": {
        "model": {"type": "MLP", "parameters": {"layer_sizes": [4, 8, 8, 3], "flatten_non_batch_dims": "false"}},
        "loss": {"type": "l1", "parameters": {"reduction": "sum"}},
        "optimizer": {"type": "sgd", "parameters": {"learning_rate": 0.02, "momentum": 0.9, "nesterov": "true"},
                      "general": {"grad_accumulation_steps": 2}},
        "lr_scheduler": {"type": "multistep", "parameters": {"milestones": [1, 2], "gamma": 0.5}},
    },
    "adam_amsgrad_polynomial": {
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 12, 3]}},
        "loss": {"type": "mse", "parameters": {"reduction": "sum"}},
        "optimizer": {"type": "adam", "parameters": {"learning_rate": "5e-3", "beta1": 0.8, "beta2": 0.99,
                                                      "eps": "1e-6", "amsgrad": 1}},
        "lr_scheduler": {"type": "polynomial", "parameters": {"total_iters": 6, "power": 2.0}},
    },
    "sgd_step": {
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 8, 3]}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "sgd", "parameters": {"learning_rate": 0.1, "weight_decay": "1e-3", "dampening": 0.1,
                                                     "momentum": 0.5}},
        "lr_scheduler": {"type": "step", "parameters": {"step_size": 2, "gamma": 0.7}},
    },
    "adam_linear": {
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 8, 3]}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "adam"},
        "lr_scheduler": {"type": "linear", "parameters": {"total_iters": 4}},
    },
    "adam_dropout": {
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 16, 16, 3], "dropout": 0.3}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "adam"},
    },
    "f8_torchscript": {
        "model": {"type": "torchscript", "parameters": {"filename": '"{dir}/f8_model.pt"'}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "sgd", "parameters": {"learning_rate": 0.05}},
    },
}


def _to_yaml(value, indent=0) -> str:
    """A configuration as a user writes it: nested blocks, [a, b] lists, plain scalars."""
    out = ""
    for key, v in value.items():
        if isinstance(v, dict):
            out += " " * indent + f"{key}:\n" + _to_yaml(v, indent + 2)
        elif isinstance(v, list):
            out += " " * indent + f"{key}: [{', '.join(str(i) for i in v)}]\n"
        else:
            out += " " * indent + f"{key}: {v}\n"
    return out


def _number(v):
    return float(v) if isinstance(v, str) and v not in ("true", "false") else v


def _flag(v):
    return v in (True, 1, "true")


EXTRA_FILES = {
    "bad_key.yaml": "model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\n    layer_size: [4, 3]\n",
    "no_optimizer.yaml": "model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 8, 3]\nloss:\n  type: mse\n",
}


def _data(dtype):
    x = torch.tensor([[(((i * 7 + b * 3) % 11) - 5) / 8.0 for i in range(1, 5)] for b in range(1, BATCH + 1)],
                     dtype=dtype)
    y = torch.tensor([[(((j * 5 + b * 2) % 7) - 3) / 4.0 for j in range(1, 4)] for b in range(1, BATCH + 1)],
                     dtype=dtype)
    return x, y


class TorchFortMLP(torch.nn.Module):
    """TorchFort's built-in MLP as its documentation and source describe it (written here from that
    description): Linear layers, an extra zero bias before each hidden ReLU, dropout after it."""

    def __init__(self, sizes, flatten=True, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.biases = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in sizes[1:-1])
        self.flatten = flatten

    def forward(self, x):
        if self.flatten:
            x = x.reshape(x.shape[0], -1)
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            if i < len(self.fcs) - 1:
                x = torch.nn.functional.dropout(torch.relu(x + self.biases[i]), self.p, self.training)
        return x

    def torchfort_parameters(self):  # TorchFort's order: the extra biases, then each layer
        return list(self.biases) + [p for fc in self.fcs for p in (fc.weight, fc.bias)]


def _schedule(opt, cfg):
    """PyTorch's scheduler for TorchFort's: TorchFort's LibTorch schedules compute each rate from the
    number of earlier steps, so they are PyTorch's one optimizer step later; constructing the PyTorch
    scheduler after the first optimizer step gives exactly that."""
    kind = cfg["type"]
    p = {k: _number(v) for k, v in (cfg.get("parameters") or {}).items()}
    p = {k: (int(v) if k in ("step_size", "total_iters", "T_max") else v) for k, v in p.items()}
    S = torch.optim.lr_scheduler
    if kind == "step":
        return S.StepLR(opt, p["step_size"], p.get("gamma", 0.1))
    if kind == "multistep":
        return S.MultiStepLR(opt, p["milestones"], p.get("gamma", 0.1))
    if kind == "polynomial":
        return S.PolynomialLR(opt, p["total_iters"], p.get("power", 1.0))
    if kind == "cosine_annealing":
        return S.CosineAnnealingLR(opt, p["T_max"], p.get("eta_min", 0.0))
    if kind == "linear":  # TorchFort's default start factor is 0.3333333, not 1/3
        return S.LinearLR(opt, p.get("start_factor", 0.3333333), p.get("end_factor", 1.0), p["total_iters"])
    raise AssertionError(kind)


def reference(name, cfg, directory):
    """Losses, inference output and final parameters of PyTorch training with cfg."""
    dtype = torch.float64 if name.startswith("f8") else torch.float32
    x, y = _data(dtype)
    torch.manual_seed(SEED)
    m = cfg["model"]
    if m["type"].lower() == "mlp":
        p = m["parameters"]
        model = TorchFortMLP(p["layer_sizes"], _flag(p.get("flatten_non_batch_dims", True)), p.get("dropout", 0.0))
        params = model.torchfort_parameters()
    else:
        model = torch.jit.load(str(directory / "f8_model.pt"))
        params = list(model.parameters())
    o = cfg["optimizer"]
    op = {k: _number(v) for k, v in (o.get("parameters") or {}).items()}
    general = o.get("general") or {}
    if o["type"] == "adam":
        opt = torch.optim.Adam(params, lr=op.get("learning_rate", 1e-3),
                               betas=(op.get("beta1", 0.9), op.get("beta2", 0.999)), eps=op.get("eps", 1e-8),
                               weight_decay=op.get("weight_decay", 0.0), amsgrad=_flag(op.get("amsgrad", False)))
    else:
        opt = torch.optim.SGD(params, lr=op.get("learning_rate", 1e-3), momentum=op.get("momentum", 0.0),
                              dampening=op.get("dampening", 0.0), weight_decay=op.get("weight_decay", 0.0),
                              nesterov=_flag(op.get("nesterov", False)))
    accumulate = general.get("grad_accumulation_steps", 1)
    max_norm = general.get("max_grad_norm", 0.0)
    loss_cfg = cfg["loss"]
    reduction = (loss_cfg.get("parameters") or {}).get("reduction", "mean")
    loss_fn = torch.nn.functional.mse_loss if loss_cfg["type"].lower() == "mse" else torch.nn.functional.l1_loss
    schedule, losses = None, []
    for step in range(STEPS):
        if step % accumulate == 0:
            opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x).flatten(), y.flatten(), reduction=reduction)
        loss.backward()
        if (step + 1) % accumulate == 0:
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, max_norm)
            opt.step()
            if "lr_scheduler" in cfg:
                if schedule is None:
                    schedule = _schedule(opt, cfg["lr_scheduler"])
                else:
                    schedule.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        out = model(x)
    return losses, out, [p.detach() for p in params]


@pytest.fixture(scope="module")
def torchfort_dir(tmp_path_factory, installed):
    import ctypes

    d = tmp_path_factory.mktemp("torchfort")
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    torch.jit.script(net).save(str(d / "f8_model.pt"))
    for name, cfg in CONFIGS.items():
        (d / f"{name}.yaml").write_text(_to_yaml(cfg).replace("{dir}", str(d)))
    for name, text in EXTRA_FILES.items():
        (d / name).write_text(text)
    (d / "configs.txt").write_text("".join(f"{n}\n" for n in CONFIGS))
    # A checkpoint of a model trained 2**40 times (its state.pt rewritten): counters beyond 32 bits.
    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    first = next(iter(CONFIGS))
    assert lib.torchfort_create_model(b"big_counters", str(d / f"{first}.yaml").encode(), -1) == 0
    assert lib.torchfort_save_checkpoint(b"big_counters", str(d / "ckpt_big").encode()) == 0
    state = torch.jit.load(str(d / "ckpt_big" / "state.pt"))
    state._c.setattr("step_train", 2**40)
    state.save(str(d / "ckpt_big" / "state.pt"))
    return d


@pytest.mark.parametrize("compiler", ["gfortran-11", *COMPILERS])
def test_torchfort_program_trains_as_pytorch(compiler, cmake_consumer, torchfort_dir, tmp_path):
    work = tmp_path / "run"
    shutil.copytree(torchfort_dir, work)
    targets = None if compiler in COMPILERS else ["test_torchfort"]
    binary = cmake_consumer(compiler, targets) / "test_torchfort"
    proc = run([binary, work], check=False)
    assert_all_passed(proc)
    # report_frequency: TorchFort's progress line every 4 steps
    assert "TORCHFORT::INFO: model: adam_cosine, step_train: 8, loss: " in proc.stdout
    # every error was reported with its reason on standard error
    assert "TORCHFORT::ERROR: torchfort_train: no model named 'no_such_model'" in proc.stderr
    assert "unknown key 'layer_size' in model.parameters (allowed: layer_sizes, dropout, flatten_non_batch_dims)" in proc.stderr
    assert "cannot be trained: its configuration" in proc.stderr
    assert "step counters do not fit 32-bit integers" in proc.stderr
    for name, cfg in CONFIGS.items():
        losses, out, params = reference(name, cfg, work)
        values = [float(v) for v in (work / f"{name}.out").read_text().split()]
        got_losses, got_out = (torch.tensor(values[:STEPS], dtype=torch.float64),
                               torch.tensor(values[STEPS:], dtype=torch.float64))
        # float64: the same operations in the same order (1e-12). float32: LibTorch's C++ optimizers
        # and torch.optim's Python ones order a few operations differently (Adam's bias corrections,
        # the clipping norm); after 8 steps that is a few float32 roundings of relative size 6e-8.
        rtol = 1e-12 if name.startswith("f8") else 2e-6
        torch.testing.assert_close(got_losses, torch.tensor(losses, dtype=torch.float64), rtol=rtol, atol=rtol,
                                   msg=lambda m: f"{name} losses: {m}")
        # Fortran's output (3, batch) is the tensor [batch, 3]
        torch.testing.assert_close(got_out.reshape(BATCH, 3), out.to(torch.float64), rtol=rtol, atol=rtol,
                                   msg=lambda m: f"{name} inference: {m}")
        # the model file is TorchScript that torch.jit.load reads and runs, with the trained weights
        saved = torch.jit.load(str(work / f"{name}.pt"))
        for got, want in zip(saved.parameters(), params):
            torch.testing.assert_close(got, want, rtol=rtol, atol=rtol, msg=lambda m: f"{name} weights: {m}")
        torch.testing.assert_close(saved(_data(out.dtype)[0]).detach(), out, rtol=rtol, atol=rtol)


C_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include "torchfort.h"
#include "ftorch_c.h"
int main(int argc, char **argv) {
  if (argc < 2) return 9;
  char config[1024];
  snprintf(config, sizeof config, "%s/adam_cosine.yaml", argv[1]);
  float x[6][4], y[6][3], out[6][3], loss = 0;
  for (int b = 0; b < 6; ++b) {
    for (int i = 0; i < 4; ++i) x[b][i] = (float)(((i + 1) * 7 + (b + 1) * 3) % 11 - 5) / 8.0f;
    for (int j = 0; j < 3; ++j) y[b][j] = (float)(((j + 1) * 5 + (b + 1) * 2) % 7 - 3) / 4.0f;
  }
  int64_t xs[2] = {6, 4}, ys[2] = {6, 3};
  if (torchfort_set_manual_seed(1234) != TORCHFORT_RESULT_SUCCESS) return 1;
  if (torchfort_create_model("c", config, TORCHFORT_DEVICE_CPU) != TORCHFORT_RESULT_SUCCESS) return 2;
  for (int s = 0; s < 8; ++s) {
    if (torchfort_train("c", x, 2, xs, y, 2, ys, &loss, TORCHFORT_FLOAT, NULL) != TORCHFORT_RESULT_SUCCESS) return 3;
    printf("%.9e\n", loss);
  }
  if (torchfort_inference("c", x, 2, xs, out, 2, ys, TORCHFORT_FLOAT, NULL) != TORCHFORT_RESULT_SUCCESS) return 4;
  for (int b = 0; b < 6; ++b) for (int j = 0; j < 3; ++j) printf("%.9e\n", out[b][j]);
  torchfort_result_t r = torchfort_train("c", x, 2, xs, y, 2, ys, &loss, (torchfort_datatype_t)7, NULL);
  if (r != TORCHFORT_RESULT_INVALID_USAGE || strstr(ftc_last_error(), "unknown or unsupported dtype") == NULL) return 5;
  r = torchfort_create_model("gpu", config, 0);
  if (r != TORCHFORT_RESULT_NOT_SUPPORTED && r != TORCHFORT_RESULT_SUCCESS) return 6;
  return 0;
}
"""


def _compile_c(tmp_path, source: str) -> Path:
    """tmp_path/main from a C program over torchfort.h and libftorch_c (skipped without a C compiler)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "main.c").write_text(source)
    libdir = helper("--libdir")
    run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", tmp_path / "main.c", f"-I{helper('--includedir')}",
         f"-L{libdir}", "-lftorch_c", f"-Wl,-rpath,{libdir}", "-o", tmp_path / "main"])
    return tmp_path / "main"


def test_c_program_through_torchfort_h(installed, torchfort_dir, tmp_path):
    _compile_c(tmp_path, C_PROGRAM)
    proc = run([tmp_path / "main", torchfort_dir])
    # (TorchFort's progress lines, report_frequency 4, are on the same output)
    values = [float(v) for v in proc.stdout.split("\n") if v.strip() and not v.startswith("TORCHFORT::")]
    assert "TORCHFORT::INFO: model: c, step_train: 4, loss: " in proc.stdout
    losses, out, _ = reference("adam_cosine", CONFIGS["adam_cosine"], torchfort_dir)
    torch.testing.assert_close(torch.tensor(values[:STEPS], dtype=torch.float64),
                               torch.tensor(losses, dtype=torch.float64), rtol=2e-6, atol=2e-6)
    # C's row-major [6][3] output is the tensor [6, 3] itself
    torch.testing.assert_close(torch.tensor(values[STEPS:]).reshape(BATCH, 3), out, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("text, message", [
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimiser:\n  type: adam\n",
     "unknown key 'optimiser' in the configuration (allowed: general, model, loss, optimizer, lr_scheduler"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: adamw\n",
     "optimizer.type is 'adamw', which is not one of: sgd, adam"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  parameters:\n"
     "    learning_rate: fast\n", "optimizer.parameters.learning_rate must be a number, not 'fast'"),
    ("model:\n  type: mlp\n", "model.parameters needs the key 'layer_sizes'"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\n    layer_sizes: [4, 3]\n", "is given twice"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3\n", "not valid YAML"),
    ("general:\n  report_frequency: 1\n", "needs the key 'model'"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\nlr_scheduler:\n  type: step\n",
     "an lr_scheduler block needs an optimizer block"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: step\n", "lr_scheduler.parameters needs the key 'step_size'"),
    ("model:\n  type: torchscript\n  parameters:\n    filename: nowhere.pt\n", "the model file nowhere.pt"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  general:\n"
     "    max_grad_norm: -1\n", "optimizer.general.max_grad_norm must be >= 0, not -1"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: multistep\n  parameters:\n    milestones: [2, 2]\n", "milestones must be strictly increasing"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: linear\n  parameters:\n    total_iters: 5\n    start_factor: 0\n", "start_factor must be in (0, 1]"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  general:\n"
     "    max_grad_norm: .nan\n", "optimizer.general.max_grad_norm must be a number, not '.nan'"),
    # Values that would make the rate negative or infinite, or apply nothing, and empty values
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: step\n  parameters:\n    step_size: 10\n    gamma: -0.5\n", "lr_scheduler.parameters.gamma must be >= 0"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: multistep\n  parameters:\n    milestones: [0, 2]\n", "milestones must be >= 1"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: polynomial\n  parameters:\n    total_iters: 10\n    power: -1\n", "power must be >= 0"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\nlr_scheduler:\n"
     "  type: cosine_annealing\n  parameters:\n    T_max: 10\n    eta_min: -1e-4\n", "eta_min must be >= 0"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  parameters:\n"
     "    learning_rate:\n", "optimizer.parameters.learning_rate has no value"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\n    dropout: ~\n", "model.parameters.dropout has no value"),
    # Optimizer values torch.optim refuses (LibTorch would fail only when the model is made)
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: adam\n  parameters:\n"
     "    learning_rate: -1e-3\n", "optimizer.parameters.learning_rate must be >= 0, not -1e-3"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  parameters:\n"
     "    weight_decay: -0.1\n", "optimizer.parameters.weight_decay must be >= 0"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  parameters:\n"
     "    momentum: -0.9\n", "optimizer.parameters.momentum must be >= 0"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: sgd\n  parameters:\n"
     "    nesterov: true\n", "nesterov needs a momentum > 0 and no dampening"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: adam\n  parameters:\n"
     "    beta2: 1.0\n", "beta1 and beta2 must be in [0, 1)"),
    ("model:\n  type: mlp\n  parameters:\n    layer_sizes: [4, 3]\noptimizer:\n  type: adam\n  parameters:\n"
     "    eps: -1e-8\n", "optimizer.parameters.eps must be >= 0"),
])
def test_configuration_errors_name_the_file_key_and_what_is_allowed(installed, tmp_path, text, message):
    """Each mistake is TORCHFORT_RESULT_INVALID_USAGE with the file, line and key in the message."""
    import ctypes

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    config = tmp_path / "config.yaml"
    config.write_text(text)
    status = lib.torchfort_create_model(f"m{abs(hash(text))}".encode(), str(config).encode(), -1)
    assert status == 1
    error = lib.ftc_last_error().decode()
    assert message in error and str(config) in error, error


def test_distributed_model_equals_single_process_training(installed, tmp_path):
    """torchfort_create_distributed_model on 2 MPI ranks (torchfort_mpi.c compiled with the program's
    MPI through FTorch::torchfort_mpi): each rank trains on half the batch; losses and weights equal
    one process on the whole batch; a step failing on one rank within an accumulation cycle leaves
    no rank with its gradients; without torchfort_mpi.c the call says how to get it."""
    from test_distributed import assert_every_rank_passed, mpirun

    (tmp_path / "dist.yaml").write_text(_to_yaml({
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 8, 3]}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "adam", "parameters": {"learning_rate": "1e-2"}, "general": {"max_grad_norm": 0.5}},
        "lr_scheduler": {"type": "step", "parameters": {"step_size": 2}},
    }))
    (tmp_path / "accum.yaml").write_text(_to_yaml({
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 8, 3]}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "sgd", "parameters": {"learning_rate": "1e-2"}, "general": {"grad_accumulation_steps": 2}},
    }))
    bdir = _mpi_build(installed, tmp_path)
    assert_every_rank_passed(mpirun(2, bdir / "test_torchfort_distributed", tmp_path), 2)
    proc = mpirun(1, bdir / "test_torchfort_distributed_without", tmp_path, check=False)
    assert proc.returncode != 0
    assert "distributed models need MPI, which FTorch takes from your program" in proc.stderr


MPI_C_PROGRAM = r"""
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <torchfort.h>

/* Two ranks train one distributed model on different data: after the steps, both hold the same
   weights (their predictions agree exactly) and they differ from a rank-local model's. */
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int ok = torchfort_create_distributed_model("dist", argv[1], MPI_COMM_WORLD, TORCHFORT_DEVICE_CPU) ==
           TORCHFORT_RESULT_SUCCESS;
  ok = ok && torchfort_create_model("alone", argv[1], TORCHFORT_DEVICE_CPU) == TORCHFORT_RESULT_SUCCESS;
  float x[6][4], y[6][3], out[6][3], alone[6][3], loss = 0;
  int64_t xs[2] = {6, 4}, ys[2] = {6, 3};
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 4; ++j) x[i][j] = (float)sin(0.3 * (i + 1) * (j + 1) + rank);
    for (int j = 0; j < 3; ++j) y[i][j] = (float)cos(0.2 * (i + j) - rank);
  }
  for (int step = 0; step < 3 && ok; ++step) {
    ok = torchfort_train("dist", x, 2, xs, y, 2, ys, &loss, TORCHFORT_FLOAT, 0) == TORCHFORT_RESULT_SUCCESS &&
         torchfort_train("alone", x, 2, xs, y, 2, ys, &loss, TORCHFORT_FLOAT, 0) == TORCHFORT_RESULT_SUCCESS;
  }
  /* the same input on both ranks: rank 0's x */
  MPI_Bcast(x, 24, MPI_FLOAT, 0, MPI_COMM_WORLD);
  ok = ok && torchfort_inference("dist", x, 2, xs, out, 2, ys, TORCHFORT_FLOAT, 0) == TORCHFORT_RESULT_SUCCESS;
  ok = ok && torchfort_inference("alone", x, 2, xs, alone, 2, ys, TORCHFORT_FLOAT, 0) == TORCHFORT_RESULT_SUCCESS;
  float other[6][3], other_alone[6][3];
  MPI_Sendrecv(out, 18, MPI_FLOAT, 1 - rank, 0, other, 18, MPI_FLOAT, 1 - rank, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Sendrecv(alone, 18, MPI_FLOAT, 1 - rank, 1, other_alone, 18, MPI_FLOAT, 1 - rank, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  int same = 1, alone_differs = 0;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 3; ++j) {
      same = same && out[i][j] == other[i][j];
      alone_differs = alone_differs || alone[i][j] != other_alone[i][j];
    }
  printf("rank %d: %s\n", rank, ok && same && alone_differs ? "distributed ok" : "FAILED");
  MPI_Finalize();
  return ok && same && alone_differs ? 0 : 1;
}
"""


def test_distributed_model_through_the_torchfort_mpi_source(installed, tmp_path):
    """Without CMake, as the docs say: `mpicc -c $(python -m ftorch --torchfort-mpi-source)
    $(pkg-config --cflags ftorch)`, linked into a C program with pkg-config's flags; two ranks that
    train on different data end with the same weights (gradients averaged), unlike rank-local
    models."""
    from test_distributed import mpirun, require_mpi

    require_mpi()
    if shutil.which("pkg-config") is None or shutil.which("mpicc") is None:
        pytest.skip("pkg-config or mpicc not installed")
    env = dict(os.environ, PKG_CONFIG_PATH=installed["pkgconfig"])
    source = run([sys.executable, "-m", "ftorch", "--torchfort-mpi-source"]).stdout.strip()
    assert Path(source).is_file() and source.endswith("torchfort_mpi.c")
    cflags = run(["pkg-config", "--cflags", "ftorch"], env=env).stdout.split()
    libs = run(["pkg-config", "--libs", "ftorch"], env=env).stdout.split()
    run(["mpicc", "-c", source, *cflags, "-o", tmp_path / "torchfort_mpi.o"])
    (tmp_path / "main.c").write_text(MPI_C_PROGRAM)
    libdir = helper("--libdir")
    run(["mpicc", "-std=c99", tmp_path / "main.c", tmp_path / "torchfort_mpi.o", *cflags, *libs,
         f"-Wl,-rpath,{libdir}", "-lm", "-o", tmp_path / "main"])
    (tmp_path / "dist.yaml").write_text(_to_yaml({
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 8, 3]}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "adam", "parameters": {"learning_rate": "1e-2"}},
    }))
    proc = mpirun(2, tmp_path / "main", str(tmp_path / "dist.yaml"))
    assert proc.stdout.count("distributed ok") == 2, proc.stdout + proc.stderr


def test_a_transposed_label_or_output_array_is_refused(installed, tmp_path):
    """A label or output array with the model's element count but another batch (y(batch, 3) where
    y(3, batch) was meant: the tensor [3, batch] against the model's [batch, 3]) is
    TORCHFORT_RESULT_INVALID_USAGE, never elements paired with the wrong ones; the right arrays train."""
    import ctypes

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    config = tmp_path / "t.yaml"
    config.write_text(_to_yaml({"model": {"type": "mlp", "parameters": {"layer_sizes": [4, 3]}},
                                "loss": {"type": "mse"}, "optimizer": {"type": "sgd"}}))
    assert lib.torchfort_create_model(b"transposed", str(config).encode(), -1) == 0
    x, y = _data(torch.float32)
    yt = y.t().contiguous()
    loss = ctypes.c_float()

    def shape(t):
        return (ctypes.c_int64 * t.dim())(*t.shape)

    def train(label):
        return lib.torchfort_train(b"transposed", ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(2), shape(x),
                                   ctypes.c_void_p(label.data_ptr()), ctypes.c_size_t(2), shape(label),
                                   ctypes.byref(loss), -1, None)

    assert train(yt) == 1
    assert "not the same batch" in lib.ftc_last_error().decode()
    assert train(y) == 0
    out = torch.zeros_like(yt)
    assert lib.torchfort_inference(b"transposed", ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(2), shape(x),
                                   ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(2), shape(out), -1, None) == 1
    assert "not the same batch" in lib.ftc_last_error().decode() and bool((out == 0).all())


def test_a_loss_that_is_not_finite_changes_nothing(installed, tmp_path):
    """A NaN in a batch's labels: torchfort_train fails with TORCHFORT_RESULT_INTERNAL_ERROR naming
    the loss, and the model predicts as before (TorchFort would step and make every weight NaN);
    the next finite batch trains."""
    import ctypes

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    config = tmp_path / "t.yaml"
    config.write_text(_to_yaml({"model": {"type": "mlp", "parameters": {"layer_sizes": [4, 3]}},
                                "loss": {"type": "mse"}, "optimizer": {"type": "adam"}}))
    assert lib.torchfort_create_model(b"nan_loss", str(config).encode(), -1) == 0
    x, y = _data(torch.float32)
    bad = y.clone()
    bad[0, 0] = float("nan")
    loss = ctypes.c_float()
    shape = lambda t: (ctypes.c_int64 * t.dim())(*t.shape)  # noqa: E731
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731

    def train(label):
        return lib.torchfort_train(b"nan_loss", ptr(x), ctypes.c_size_t(2), shape(x), ptr(label), ctypes.c_size_t(2),
                                   shape(label), ctypes.byref(loss), -1, None)

    def infer():
        out = torch.zeros_like(y)
        assert lib.torchfort_inference(b"nan_loss", ptr(x), ctypes.c_size_t(2), shape(x), ptr(out),
                                       ctypes.c_size_t(2), shape(out), -1, None) == 0
        return out

    before = infer()
    assert train(bad) == 3
    assert "the loss is nan at training step 1; the model was not changed" in lib.ftc_last_error().decode()
    assert torch.equal(infer(), before)
    assert train(y) == 0 and math.isfinite(loss.value) and not torch.equal(infer(), before)


def test_save_model_writes_a_model_for_inference(installed, tmp_path):
    """torchfort_save_model right after training steps (no inference call between) writes the
    model in eval mode, as torch_model_save does: torch.jit.load's model applies no dropout."""
    import ctypes

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    config = tmp_path / "d.yaml"
    config.write_text(_to_yaml({"model": {"type": "mlp", "parameters": {"layer_sizes": [4, 16, 3], "dropout": 0.5}},
                                "loss": {"type": "mse"}, "optimizer": {"type": "sgd"}}))
    assert lib.torchfort_create_model(b"dropout_save", str(config).encode(), -1) == 0
    x, y = _data(torch.float32)
    loss = ctypes.c_float()
    shape = lambda t: (ctypes.c_int64 * t.dim())(*t.shape)  # noqa: E731
    assert lib.torchfort_train(b"dropout_save", ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(2), shape(x),
                               ctypes.c_void_p(y.data_ptr()), ctypes.c_size_t(2), shape(y), ctypes.byref(loss), -1,
                               None) == 0
    assert lib.torchfort_save_model(b"dropout_save", str(tmp_path / "m.pt").encode()) == 0
    saved = torch.jit.load(str(tmp_path / "m.pt"))
    assert not any(m.training for m in saved.modules())
    assert torch.equal(saved(x), saved(x))


def test_inference_into_a_narrower_array_keeps_the_values_or_fails(installed, tmp_path):
    """A float64 model's results into float32 output arrays (torchfort_inference with
    TORCHFORT_FLOAT): rounded as Fortran's real() rounds, but values beyond float32's range are an
    error, never infinities."""
    import ctypes

    class Scale(torch.nn.Module):
        def forward(self, x):
            return x.double() * 1e39

    torch.jit.script(Scale()).save(str(tmp_path / "scale.pt"))
    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    config = tmp_path / "s.yaml"
    config.write_text(_to_yaml({"model": {"type": "torchscript", "parameters": {"filename": f'"{tmp_path}/scale.pt"'}}}))
    assert lib.torchfort_create_model(b"narrow", str(config).encode(), -1) == 0, lib.ftc_last_error()
    x = torch.ones(2, 3)
    out = torch.zeros(2, 3)
    shape = lambda t: (ctypes.c_int64 * t.dim())(*t.shape)  # noqa: E731
    status = lib.torchfort_inference(b"narrow", ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(2), shape(x),
                                     ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(2), shape(out), -1, None)
    assert status != 0 and "infinities" in lib.ftc_last_error().decode(), lib.ftc_last_error()
    assert bool((out == 0).all())


def _wandb_config(tmp_path, report_frequency):
    """A built-in MLP's configuration with the wandb hook on."""
    config = tmp_path / "wandb.yaml"
    config.write_text(_to_yaml({
        "general": {"report_frequency": report_frequency, "enable_wandb_hook": "true"},
        "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 3]}},
        "loss": {"type": "mse"},
        "optimizer": {"type": "sgd"},
    }))
    return config


def _train_2d(lib, name, x, y, loss):
    """torchfort_train of model `name` on 2-D x and y (torch tensors) from ctypes: its status."""
    import ctypes

    shape_x = (ctypes.c_int64 * 2)(*x.shape)
    shape_y = (ctypes.c_int64 * 2)(*y.shape)
    return lib.torchfort_train(name, ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(2), shape_x,
                               ctypes.c_void_p(y.data_ptr()), ctypes.c_size_t(2), shape_y, ctypes.byref(loss),
                               -1, None)


def test_wandb_hook_writes_the_metrics_log(installed, tmp_path, monkeypatch):
    """enable_wandb_hook with TORCHFORT_LOGDIR: the training loss and rate every report_frequency
    steps and the program's own metrics, in the line format TorchFort's wandb_helper.py parses, and
    the configuration copied next to the log with the model's name as its identifier."""
    import ctypes
    import re

    logdir = tmp_path / "logs"
    monkeypatch.setenv("TORCHFORT_LOGDIR", str(logdir))
    config = _wandb_config(tmp_path, report_frequency=2)
    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    name = b"wandb_model"
    assert lib.torchfort_create_model(name, str(config).encode(), -1) == 0
    x, y = _data(torch.float32)
    loss = ctypes.c_float()
    losses = []
    for _ in range(4):
        assert _train_2d(lib, name, x, y, loss) == 0
        losses.append(loss.value)
    lib.torchfort_wandb_log_double.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_double]
    assert lib.torchfort_wandb_log_double(name, b"energy", 7, 1.5) == 0
    lines = (logdir / "torchfort.log").read_text().splitlines()
    pattern = re.compile(r"^TORCHFORT::WANDB: model: (.*?), step: (\d{1,}), (.*?): (.*)")  # wandb_helper.py's
    parsed = [pattern.match(ln).groups() for ln in lines]
    assert [(m, s, k) for m, s, k, _ in parsed] == [
        ("wandb_model", "2", "train_loss"), ("wandb_model", "2", "train_lr"),
        ("wandb_model", "4", "train_loss"), ("wandb_model", "4", "train_lr"), ("wandb_model", "7", "energy")]
    assert float(parsed[2][3]) == pytest.approx(losses[3], rel=1e-5)  # printed with 6 digits
    assert float(parsed[1][3]) == 1e-3 and float(parsed[4][3]) == 1.5
    copy = (logdir / "config_wandb_model.yaml").read_text()
    assert copy.startswith(config.read_text()) and copy.endswith('identifier: "wandb_model"\n')


def test_wandb_log_failures_never_fail_a_step_already_taken(installed, tmp_path, monkeypatch, capfd):
    """A metrics log that cannot be written: at creation an error; after a training step (whose update
    is done) a warning on standard error, once while it keeps failing, and the step succeeds; the
    program's own torchfort_wandb_log_* call fails."""
    import ctypes

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    config = _wandb_config(tmp_path, report_frequency=1)
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("TORCHFORT_LOGDIR", str(tmp_path / "a_file" / "logs"))
    assert lib.torchfort_create_model(b"unlogged", str(config).encode(), -1) == 1
    assert "TORCHFORT_LOGDIR" in lib.ftc_last_error().decode(), lib.ftc_last_error()

    logdir = tmp_path / "logs"
    monkeypatch.setenv("TORCHFORT_LOGDIR", str(logdir))
    name = b"log_fails"
    assert lib.torchfort_create_model(name, str(config).encode(), -1) == 0
    x, y = _data(torch.float32)
    loss = ctypes.c_float()

    def train():
        return _train_2d(lib, name, x, y, loss)

    assert train() == 0
    (logdir / "torchfort.log").unlink()
    (logdir / "torchfort.log").mkdir()  # (root writes through permissions: a directory cannot be appended to)
    capfd.readouterr()
    losses = []
    for _ in range(3):
        assert train() == 0, lib.ftc_last_error()
        losses.append(loss.value)
    assert losses[2] < losses[0]  # the steps were taken
    err = capfd.readouterr().err
    assert err.count("TORCHFORT::WARN: cannot write the wandb hook's log") == 1, err
    lib.torchfort_wandb_log_double.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_double]
    assert lib.torchfort_wandb_log_double(name, b"energy", 7, 1.5) == 1
    assert "cannot write the wandb hook's log" in lib.ftc_last_error().decode()


DEVICE_C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "torchfort.h"
/* usage: prog CONFIG DEVICE FLOAT64 CHECKPOINT_DIR: 8 training steps of model CONFIG on DEVICE
   (TORCHFORT_DEVICE_CPU or a GPU number), the losses and the inference output printed, a checkpoint
   written there and read into a model on the CPU, whose inference output is printed too. */
int main(int argc, char **argv) {
  if (argc < 5) return 9;
  const int device = atoi(argv[2]), f8 = atoi(argv[3]);
  double xd[6][4], yd[6][3], od[6][3], cd[6][3], ld = 0;
  float xf[6][4], yf[6][3], of[6][3], cf[6][3], lf = 0;
  for (int b = 0; b < 6; ++b) {
    for (int i = 0; i < 4; ++i) xf[b][i] = (float)(xd[b][i] = (((i + 1) * 7 + (b + 1) * 3) % 11 - 5) / 8.0);
    for (int j = 0; j < 3; ++j) yf[b][j] = (float)(yd[b][j] = (((j + 1) * 5 + (b + 1) * 2) % 7 - 3) / 4.0);
  }
  void *x = f8 ? (void *)xd : (void *)xf, *y = f8 ? (void *)yd : (void *)yf, *loss = f8 ? (void *)&ld : (void *)&lf;
  void *out = f8 ? (void *)od : (void *)of, *back = f8 ? (void *)cd : (void *)cf;
  const torchfort_datatype_t dt = f8 ? TORCHFORT_DOUBLE : TORCHFORT_FLOAT;
  int64_t xs[2] = {6, 4}, ys[2] = {6, 3}, st = 0, si = 0;
  if (torchfort_set_manual_seed(1234) != TORCHFORT_RESULT_SUCCESS) return 1;
  if (torchfort_create_model("m", argv[1], device) != TORCHFORT_RESULT_SUCCESS) return 2;
  for (int s = 0; s < 8; ++s) {
    if (torchfort_train("m", x, 2, xs, y, 2, ys, loss, dt, NULL) != TORCHFORT_RESULT_SUCCESS) return 3;
    printf("%.17e\n", f8 ? ld : (double)lf);
  }
  if (torchfort_inference("m", x, 2, xs, out, 2, ys, dt, NULL) != TORCHFORT_RESULT_SUCCESS) return 4;
  if (torchfort_save_checkpoint("m", argv[4]) != TORCHFORT_RESULT_SUCCESS) return 5;
  if (torchfort_create_model("cpu", argv[1], TORCHFORT_DEVICE_CPU) != TORCHFORT_RESULT_SUCCESS) return 6;
  if (torchfort_load_checkpoint("cpu", argv[4], &st, &si) != TORCHFORT_RESULT_SUCCESS || st != 8) return 7;
  if (torchfort_inference("cpu", x, 2, xs, back, 2, ys, dt, NULL) != TORCHFORT_RESULT_SUCCESS) return 8;
  for (int b = 0; b < 6; ++b)
    for (int j = 0; j < 3; ++j) printf("%.17e\n", f8 ? od[b][j] : (double)of[b][j]);
  for (int b = 0; b < 6; ++b)
    for (int j = 0; j < 3; ++j) printf("%.17e\n", f8 ? cd[b][j] : (double)cf[b][j]);
  return 0;
}
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda_graphs"])
def test_torchfort_models_train_on_the_gpu(installed, torchfort_dir, tmp_path, graphs):
    """Models created on GPU 0 (TorchFort's device argument), given host arrays as TorchFort's
    programs do, with and without `enable_cuda_graphs`: the losses and outputs of every
    configuration except dropout's (its masks come from the GPU's generator) equal PyTorch's on the
    CPU, and a checkpoint written on the GPU resumes on the CPU with the same outputs. Bounds: float64
    1e-10 (cuBLAS and the CPU's BLAS order the sums of the 4- to 16-long dot products differently, a
    few ulps per step, through 8 steps of Adam or SGD); float32 1e-5 (those ulps are float32's,
    6e-8, through the same 8 steps; the CPU run itself is within 2e-6 of PyTorch)."""
    _compile_c(tmp_path, DEVICE_C_PROGRAM)
    for name, cfg in CONFIGS.items():
        if name == "adam_dropout":
            continue
        cfg = {**cfg, "general": {**cfg.get("general", {}), "enable_cuda_graphs": str(graphs).lower()}}
        config = tmp_path / f"{name}.yaml"
        config.write_text(_to_yaml(cfg).replace("{dir}", str(torchfort_dir)))
        proc = run([tmp_path / "main", config, "0", "1" if name.startswith("f8") else "0", tmp_path / f"{name}_ckpt"],
                   check=False)
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        values = torch.tensor([float(v) for v in proc.stdout.split("\n") if v.strip() and not v.startswith("TORCHFORT::")],
                              dtype=torch.float64)
        losses, out, _ = reference(name, cfg, torchfort_dir)
        tol = 1e-10 if name.startswith("f8") else 1e-5
        torch.testing.assert_close(values[:STEPS], torch.tensor(losses, dtype=torch.float64), rtol=tol, atol=tol,
                                   msg=lambda m: f"{name} losses on the GPU: {m}")
        torch.testing.assert_close(values[STEPS:STEPS + 18].reshape(BATCH, 3), out.to(torch.float64), rtol=tol,
                                   atol=tol, msg=lambda m: f"{name} inference on the GPU: {m}")
        torch.testing.assert_close(values[STEPS + 18:], values[STEPS:STEPS + 18], rtol=tol, atol=tol,
                                   msg=lambda m: f"{name}: the GPU's checkpoint on the CPU: {m}")


@pytest.mark.parametrize("device", [-1, 0], ids=["cpu_uncaptured", "cuda"])
def test_cuda_graph_steps_equal_eager_steps(installed, tmp_path, monkeypatch, device):
    """`enable_cuda_graphs: true`: after 3 warm-up calls, training's forward, loss and backward and
    inference's forward are replays of one capture, reading each call's arrays (new values every
    step) through copies of their own. Against the same model without graphs: the same losses and
    outputs at every step, with gradient accumulation (2 calls per update) and clipping; a loss that
    is not finite after the capture (at a cycle's first and second call) fails the call and leaves
    the model and the cycle's gradients as they were; a checkpoint loaded in between (gradients
    replaced) is captured again. On the CPU (FTORCH_CUDA_GRAPHS=eager: the replayed work, uncaptured)
    the two runs are bit for bit equal; on a GPU a captured cuBLAS call may take another algorithm
    than the eager one (the capture runs on a stream of its own), so float32 within 1e-6 relative."""
    import ctypes

    if device >= 0 and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if device < 0:
        monkeypatch.setenv("FTORCH_CUDA_GRAPHS", "eager")
    lib = _ctypes_lib()
    cfg = {"model": {"type": "mlp", "parameters": {"layer_sizes": [4, 16, 3]}}, "loss": {"type": "mse"},
           "optimizer": {"type": "adam", "parameters": {"learning_rate": "1e-2"},
                         "general": {"grad_accumulation_steps": 2, "max_grad_norm": 0.5}}}
    names = {}
    for graphs in ("false", "true"):
        config = tmp_path / f"{graphs}.yaml"
        config.write_text(_to_yaml({**cfg, "general": {"enable_cuda_graphs": graphs}}))
        names[graphs] = f"graphs_{graphs}_{device}".encode()
        assert lib.torchfort_set_manual_seed(7) == 0
        assert lib.torchfort_create_model(names[graphs], str(config).encode(), device) == 0, lib.ftc_last_error()
    x0, y0 = _data(torch.float32)

    def train(name, x, y):
        loss = ctypes.c_float()
        rc = lib.torchfort_train(name, _ptr(x), ctypes.c_size_t(2), _shape(x), _ptr(y), ctypes.c_size_t(2), _shape(y),
                                 ctypes.byref(loss), -1, None)
        return rc, loss.value

    def infer(name, x):
        out = torch.zeros(x.shape[0], 3)
        assert lib.torchfort_inference(name, _ptr(x), ctypes.c_size_t(2), _shape(x), _ptr(out), ctypes.c_size_t(2),
                                       _shape(out), -1, None) == 0
        return out

    rtol = 0 if device < 0 else 1e-6
    for step in range(14):
        x = (x0 * (1 + 0.1 * step)).contiguous()
        y = (y0 - 0.05 * step).contiguous()
        if step in (6, 9):  # a cycle's first call (6) and second (9), both after the capture
            bad = y.clone()
            bad[1, 2] = float("nan")
            before = {g: infer(n, x) for g, n in names.items()}
            for g, n in names.items():
                rc, _ = train(n, x, bad)
                assert rc == 3, (g, step)
                assert "the loss is nan" in lib.ftc_last_error().decode()
                assert torch.equal(infer(n, x), before[g]), (g, step)
        if step == 11:  # a checkpoint of the model without graphs loaded into both (mid-cycle)
            assert lib.torchfort_save_checkpoint(names["false"], str(tmp_path / "ckpt").encode()) == 0
            for n in names.values():
                assert lib.torchfort_load_checkpoint(n, str(tmp_path / "ckpt").encode(), None, None) == 0
        (rc0, l0), (rc1, l1) = train(names["false"], x, y), train(names["true"], x, y)
        assert rc0 == 0 and rc1 == 0, lib.ftc_last_error()
        assert l1 == pytest.approx(l0, rel=rtol, abs=0), step
        torch.testing.assert_close(infer(names["true"], x), infer(names["false"], x), rtol=rtol, atol=rtol)


def _ctypes_lib():
    import ctypes

    lib = ctypes.CDLL(str(Path(helper("--libdir")) / "libftorch_c.so"))
    lib.ftc_last_error.restype = ctypes.c_char_p
    return lib


def _ptr(t):
    import ctypes

    return ctypes.c_void_p(t.data_ptr())


def _shape(t):
    import ctypes

    return (ctypes.c_int64 * t.dim())(*t.shape)


def _tensor_list(lib, *tensors):
    """A TorchFort tensor list over the tensors' memory (float32, C order)."""
    import ctypes

    handle = ctypes.c_void_p()
    assert lib.torchfort_tensor_list_create(ctypes.byref(handle)) == 0
    for t in tensors:
        assert lib.torchfort_tensor_list_add_tensor(handle, _ptr(t), ctypes.c_size_t(t.dim()), _shape(t), -1) == 0
    return handle


class _BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.fc(x))


def test_a_loss_that_is_not_finite_leaves_the_running_statistics(installed, tmp_path):
    """A NaN in a batch's inputs of a model with BatchNorm: the forward updated the running
    statistics before the loss was seen; the failed torchfort_train puts them back, so inference
    (which reads them) is as before, not NaN."""
    import ctypes

    lib = _ctypes_lib()
    torch.manual_seed(3)
    torch.jit.script(_BatchNormNet()).save(str(tmp_path / "bn.pt"))
    config = tmp_path / "bn.yaml"
    config.write_text(_to_yaml({"model": {"type": "torchscript", "parameters": {"filename": f'"{tmp_path}/bn.pt"'}},
                                "loss": {"type": "mse"}, "optimizer": {"type": "adam"}}))
    assert lib.torchfort_create_model(b"bn_nan", str(config).encode(), -1) == 0, lib.ftc_last_error()
    x, y = _data(torch.float32)
    loss = ctypes.c_float()

    def train(inputs):
        return lib.torchfort_train(b"bn_nan", _ptr(inputs), ctypes.c_size_t(2), _shape(inputs), _ptr(y),
                                   ctypes.c_size_t(2), _shape(y), ctypes.byref(loss), -1, None)

    def infer():
        out = torch.zeros_like(y)
        assert lib.torchfort_inference(b"bn_nan", _ptr(x), ctypes.c_size_t(2), _shape(x), _ptr(out),
                                       ctypes.c_size_t(2), _shape(out), -1, None) == 0
        return out

    assert train(x) == 0
    before = infer()
    bad = x.clone()
    bad[2, 1] = float("nan")
    assert train(bad) == 3 and "the loss is nan" in lib.ftc_last_error().decode()
    assert torch.equal(infer(), before)


def test_a_checkpoint_that_fails_to_load_changes_nothing(installed, tmp_path):
    """A checkpoint written by an SGD model loaded into an Adam model of the same network: the
    optimizer's file fails to load, after the weights' file was read. The model keeps its weights
    and its Adam state: it goes on exactly as a twin that never tried the load."""
    import ctypes

    lib = _ctypes_lib()
    net = {"type": "mlp", "parameters": {"layer_sizes": [4, 8, 3]}}
    for opt in ("sgd", "adam"):
        (tmp_path / f"{opt}.yaml").write_text(_to_yaml({"model": net, "loss": {"type": "mse"},
                                                         "optimizer": {"type": opt}}))
    x, y = _data(torch.float32)
    loss = ctypes.c_float()

    def train(name):
        assert lib.torchfort_train(name, _ptr(x), ctypes.c_size_t(2), _shape(x), _ptr(y), ctypes.c_size_t(2),
                                   _shape(y), ctypes.byref(loss), -1, None) == 0, lib.ftc_last_error()
        return loss.value

    def infer(name):
        out = torch.zeros_like(y)
        assert lib.torchfort_inference(name, _ptr(x), ctypes.c_size_t(2), _shape(x), _ptr(out),
                                       ctypes.c_size_t(2), _shape(out), -1, None) == 0
        return out

    for name, opt in ((b"ck_sgd", "sgd"), (b"ck_adam", "adam"), (b"ck_twin", "adam")):
        assert lib.torchfort_set_manual_seed(11) == 0
        assert lib.torchfort_create_model(name, str(tmp_path / f"{opt}.yaml").encode(), -1) == 0
    train(b"ck_sgd")
    assert lib.torchfort_save_checkpoint(b"ck_sgd", str(tmp_path / "ck").encode()) == 0
    for name in (b"ck_adam", b"ck_twin"):
        train(name)
    before = infer(b"ck_adam")
    assert lib.torchfort_load_checkpoint(b"ck_adam", str(tmp_path / "ck").encode(), None, None) != 0
    assert torch.equal(infer(b"ck_adam"), before)
    assert train(b"ck_adam") == train(b"ck_twin")
    assert torch.equal(infer(b"ck_adam"), infer(b"ck_twin"))


def test_graph_steps_refuse_arguments_divided_otherwise(installed, tmp_path, monkeypatch):
    """enable_cuda_graphs (FTORCH_CUDA_GRAPHS=eager on the CPU: the replayed work, uncaptured): after
    the capture, torchfort_train_multiarg with the label passed among the inputs (the same tensors,
    divided otherwise) is refused as the steps without graphs refuse it: the division is part of
    what a capture is kept for, so a GPU captures again rather than replay the first division."""
    import ctypes

    monkeypatch.setenv("FTORCH_CUDA_GRAPHS", "eager")
    lib = _ctypes_lib()
    config = tmp_path / "g.yaml"
    config.write_text(_to_yaml({"general": {"enable_cuda_graphs": "true"},
                                "model": {"type": "mlp", "parameters": {"layer_sizes": [4, 3]}},
                                "loss": {"type": "mse"}, "optimizer": {"type": "adam"}}))
    assert lib.torchfort_create_model(b"split", str(config).encode(), -1) == 0
    x, y = _data(torch.float32)
    loss = ctypes.c_float()

    empty = _tensor_list(lib)
    for step in range(5):
        inputs, labels = _tensor_list(lib, x), _tensor_list(lib, y)
        assert lib.torchfort_train_multiarg(b"split", inputs, labels, ctypes.byref(loss), empty, None) == 0, \
            (step, lib.ftc_last_error())
    rc = lib.torchfort_train_multiarg(b"split", _tensor_list(lib, x, y), empty, ctypes.byref(loss), empty, None)
    assert rc != 0 and "forward failed: Expected at most 2 argument(s)" in lib.ftc_last_error().decode()


class _TwoOutputs(torch.nn.Module):
    def forward(self, x):
        return 2 * x, x.sum(dim=1)


def test_inference_with_a_wrong_second_output_writes_nothing(installed, tmp_path):
    """torchfort_inference_multiarg with the second output array of the wrong size: an error, and the
    first output array keeps its values (every output is checked before any is written)."""
    import ctypes

    lib = _ctypes_lib()
    torch.jit.script(_TwoOutputs()).save(str(tmp_path / "two.pt"))
    config = tmp_path / "two.yaml"
    config.write_text(_to_yaml({"model": {"type": "torchscript",
                                          "parameters": {"filename": f'"{tmp_path}/two.pt"'}}}))
    assert lib.torchfort_create_model(b"two_out", str(config).encode(), -1) == 0, lib.ftc_last_error()
    x, _ = _data(torch.float32)
    first, second = torch.full_like(x, -7.0), torch.zeros(5)

    rc = lib.torchfort_inference_multiarg(b"two_out", _tensor_list(lib, x), _tensor_list(lib, first, second), None)
    assert rc != 0 and "output 2" in lib.ftc_last_error().decode()
    assert torch.equal(first, torch.full_like(x, -7.0))
    right = torch.zeros(6)
    assert lib.torchfort_inference_multiarg(b"two_out", _tensor_list(lib, x), _tensor_list(lib, first, right), None) == 0
    assert torch.equal(first, 2 * x) and torch.allclose(right, x.sum(dim=1))
