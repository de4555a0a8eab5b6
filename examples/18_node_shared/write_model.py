"""Write the emulator of example 18: an MLP from a column's state (NLEV levels) to its tendency."""

import sys
from pathlib import Path

import torch

NLEV = 16


def main(directory: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(NLEV, 64), torch.nn.Tanh(), torch.nn.Linear(64, NLEV))
    path = Path(directory) / "emulator.pt"
    torch.jit.script(model).save(str(path))
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
