"""Example 2, Python side: a small network standing in for an ML parameterisation, saved as
TorchScript, plus the outputs PyTorch gives for the inputs the Fortran program builds.

Usage: python write_model.py <output directory>
"""

import sys
from pathlib import Path

import torch


class Parameterisation(torch.nn.Module):
    """Maps a column state (8 levels) to a tendency on the same levels."""

    def __init__(self, levels: int = 8, hidden: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(levels, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, levels)
        )

    def forward(self, state):
        return self.net(state)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Parameterisation().double().eval()
    torch.jit.script(model).save(str(out / "parameterisation.pt"))

    # The same inputs as inference.f90: 16 columns x 8 levels, state(col, lev) = sin(0.1*col*lev).
    cols = torch.arange(1, 17, dtype=torch.float64).reshape(16, 1)
    levs = torch.arange(1, 9, dtype=torch.float64).reshape(1, 8)
    with torch.no_grad():
        tendency = model(torch.sin(0.1 * cols * levs))
    # Fortran order, one value per line.
    values = tendency.T.reshape(-1).tolist()
    (out / "expected_tendency.txt").write_text("\n".join(repr(v) for v in values) + "\n")
    print(f"wrote {out / 'parameterisation.pt'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
