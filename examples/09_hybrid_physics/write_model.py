"""Example 9, Python side: the network of the hybrid model (forcing -> field), untrained.

Usage: python write_model.py <output directory>
"""

import sys
from pathlib import Path

import torch


class FieldNet(torch.nn.Module):
    """Maps a forcing profile (16 points) to the field the Fortran physics then advances."""

    def __init__(self, n: int = 16, hidden: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(n, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n))

    def forward(self, forcing):
        return self.net(forcing)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    torch.jit.script(FieldNet().double()).save(str(out / "fieldnet.pt"))
    print(f"wrote {out / 'fieldnet.pt'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
