"""Writes example 12's TorchScript model: a small MLP acting on rows (batch, 2), as pytorch-fortran
models do. Usage: python write_model.py WORK_DIR"""

import sys
from pathlib import Path

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
torch.jit.script(model).save(str(Path(sys.argv[1]) / "pf_mlp.pt"))
