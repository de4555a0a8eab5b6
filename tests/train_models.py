"""Modules as users write them today that torch.jit.script refuses (tests/test_train_package.py
checks that it does, at test time), and modules with training-mode behaviour (batch norm's
running statistics, dropout): each trains from Fortran as a training package. Every model takes
x of shape [batch, 6] and returns [batch, 3]."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, OUTPUTS = 6, 3


@dataclasses.dataclass
class Config:
    width: int = 16
    scale: float = 0.5


class DataclassConfig(nn.Module):
    """A dataclass of settings kept on the module and read in forward."""

    def __init__(self, cfg: Config = Config()):
        super().__init__()
        self.cfg = cfg
        self.fc1 = nn.Linear(FEATURES, cfg.width)
        self.fc2 = nn.Linear(cfg.width, OUTPUTS)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.cfg.scale


class Kwargs(nn.Module):
    """forward(x, **kwargs): options with defaults. Its layer is registered under a second name too
    (tied weights: the state_dict has both names' keys, named_parameters the first only)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(FEATURES, OUTPUTS)
        self.tied = self.fc

    def forward(self, x, **kwargs):
        scale = kwargs.get("scale", 2.0)
        return torch.sigmoid(self.fc(x)) * scale


class Ensemble(nn.Module):
    """Members built by a comprehension, averaged with sum() over a generator of them."""

    def __init__(self, members: int = 4):
        super().__init__()
        self.members = nn.ModuleList([nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, OUTPUTS))
                                      for _ in range(members)])

    def forward(self, x):
        return sum(m(x) for m in self.members) / len(self.members)


class Attention(nn.Module):
    """Two tokens of three features each, attending with scaled_dot_product_attention, mixed by einsum."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(3, 3 * 4)
        self.mix = nn.Parameter(torch.randn(4, 4) / 2)
        self.out = nn.Linear(2 * 4, OUTPUTS)

    def forward(self, x):
        b, *_ = x.shape
        q, k, v = self.qkv(x.reshape(b, 2, 3)).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v)
        mixed = torch.einsum("btd,de->bte", a, self.mix)
        return self.out(mixed.reshape(b, 8))


class ParameterDictModel(nn.Module):
    """Parameters in an nn.ParameterDict, its items iterated in forward."""

    def __init__(self):
        super().__init__()
        self.p = nn.ParameterDict({"weight": nn.Parameter(torch.randn(FEATURES, OUTPUTS) / 3),
                                   "bias": nn.Parameter(torch.zeros(OUTPUTS))})

    def forward(self, x):
        out = x @ self.p["weight"]
        for key, value in self.p.items():
            if key.startswith("bias"):
                out = out + value
        return torch.tanh(out)


class BatchNormModel(nn.Module):
    """Batch norm: training updates its running statistics (buffers, in place); eval mode uses them.
    And a buffer of its own that the training forward assigns anew (a running mean of the inputs,
    not updated in place), read in the same forward."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, OUTPUTS))
        self.register_buffer("input_mean", torch.linspace(-0.5, 0.5, FEATURES))

    def forward(self, x):
        if self.training:
            self.input_mean = 0.75 * self.input_mean + 0.25 * x.detach().mean(0)
        return self.net(x - self.input_mean)


class DropoutModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Dropout(0.25), nn.Linear(16, OUTPUTS))

    def forward(self, x):
        return self.net(x)


REJECTED_BY_TORCHSCRIPT = {"dataclass_config": DataclassConfig, "kwargs": Kwargs, "ensemble": Ensemble,
                           "attention": Attention, "parameter_dict": ParameterDictModel}
TRAINING_MODE = {"batch_norm": BatchNormModel, "dropout": DropoutModel}


def build(name: str) -> nn.Module:
    torch.manual_seed(17)
    cls = {**REJECTED_BY_TORCHSCRIPT, **TRAINING_MODE}[name]
    return cls().double()
