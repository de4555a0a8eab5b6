"""Example 6, Python side: the untrained network the Fortran simulation will train online.

Usage: python write_model.py <output directory>
"""

import sys
from pathlib import Path

import torch


class Emulator(torch.nn.Module):
    """Maps a column state (3 inputs) to the tendency of an expensive physics scheme."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(3, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1),
        )

    def forward(self, state):
        return self.net(state)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.jit.script(Emulator().double()).save(str(out / "emulator.pt"))
    print(f"wrote {out / 'emulator.pt'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
