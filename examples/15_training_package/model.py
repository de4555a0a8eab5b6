"""The emulator of example 15: written as PyTorch code is written today, which torch.jit.script
refuses (a dataclass of settings, a generator over the ensemble's members), trained from Fortran
as a training package:

    python -m ftorch export model.py:Emulator --input 64,3:float64 --train emulator_train.pt2
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass
class Settings:
    members: int = 3
    width: int = 32
    dropout: float = 0.05


class Emulator(nn.Module):
    """Heating rate (1 value) from a column's temperature, humidity and wind (3 values): the mean
    of a small ensemble of MLPs with dropout."""

    def __init__(self, settings: Settings = Settings()):
        super().__init__()
        torch.manual_seed(0)
        self.settings = settings
        self.members = nn.ModuleList(
            nn.Sequential(nn.Linear(3, settings.width), nn.Tanh(), nn.Dropout(settings.dropout),
                          nn.Linear(settings.width, 1))
            for _ in range(settings.members))
        self.double()

    def forward(self, state):
        return sum(member(state) for member in self.members) / self.settings.members
