"""Loss curves from FTorch training logs (the lines torch_train_step writes with log_every)."""

from __future__ import annotations

import re
from pathlib import Path

_LINE = re.compile(r"^\s*step\s+(\d+)\s+loss\s+(\S+)\s+lr\s+(\S+)")


def read_log(path: str | Path) -> tuple[list[int], list[float], list[float]]:
    """Steps, losses and learning rates of the progress lines in a log (other lines are skipped)."""
    steps, losses, rates = [], [], []
    for line in Path(path).read_text().splitlines():
        m = _LINE.match(line)
        if m:
            steps.append(int(m.group(1)))
            losses.append(float(m.group(2)))
            rates.append(float(m.group(3)))
    return steps, losses, rates


def plot_loss(log: str | Path, output: str | Path, title: str | None = None) -> Path:
    """Write a PNG of loss (log scale) and learning rate against step; returns its path."""
    steps, losses, rates = read_log(log)
    if not steps:
        raise ValueError(f"no progress lines ('step N  loss X  lr Y ...') in {log}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib") from exc
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, sharex=True, figsize=(7, 5), height_ratios=(3, 1))
    ax_loss.semilogy(steps, losses, color="tab:blue")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, which="both", alpha=0.3)
    ax_loss.set_title(title or f"Training loss ({Path(log).name})")
    ax_lr.plot(steps, rates, color="tab:orange")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    ax_lr.grid(True, alpha=0.3)
    fig.tight_layout()
    out = Path(output)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
