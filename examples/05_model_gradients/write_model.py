"""Example 5, Python side: a small MLP saved as TorchScript, plus the gradients PyTorch computes
for the inputs and loss that model_gradients.f90 uses, so the Fortran program can check itself.

Usage: python write_model.py <output directory>
"""

import sys
from pathlib import Path

import torch


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    torch.jit.script(model).save(str(out / "mlp.pt"))

    # The same data as model_gradients.f90: x(4, 3) = 0.1*(i + j), target(4, 2) = 0.5.
    x = torch.tensor([[0.1 * (i + j) for j in range(1, 4)] for i in range(1, 5)], dtype=torch.float64)
    x.requires_grad_(True)
    y = model(x)
    y.sum().backward()  # d(sum of outputs)/d(input)
    dx = x.grad.clone()
    model.zero_grad()
    loss = ((model(x.detach()) - 0.5) ** 2).mean()
    loss.backward()
    dw = model[0].weight.grad  # d(loss)/d(first layer's weight), shape [8, 3]

    def fortran_order(t):
        return "\n".join(repr(v) for v in t.T.reshape(-1).tolist())

    (out / "expected_dx.txt").write_text(fortran_order(dx) + "\n")
    (out / "expected_dw.txt").write_text(fortran_order(dw) + "\n")
    (out / "expected_loss.txt").write_text(repr(loss.item()) + "\n")
    print(f"wrote {out / 'mlp.pt'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
