"""The model of example 13: a small MLP to export for Fortran with ``python -m ftorch export``.

    python -m ftorch export examples/13_export/model.py:MLP --input 8,5 -o mlp.pt --pt2 mlp.pt2 --dynamic-batch

A Fortran array ``x(8, 5)`` (8 samples of 5 features) reaches ``forward`` as a tensor of shape
[8, 5]; the result fills an array ``y(8, 3)``.
"""

from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    """Two hidden layers of ``n_hidden`` units with tanh; acts on [batch, n_in] inputs."""

    def __init__(self, n_in: int = 5, n_hidden: int = 16, n_out: int = 3):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_in, n_hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(n_hidden, n_hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(n_hidden, n_out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
