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


# The wandb hook's metric lines of the TorchFort API (enable_wandb_hook, TORCHFORT_LOGDIR).
_METRIC = re.compile(r"^TORCHFORT::WANDB: model: (.*), step: (-?\d+), ([^:]+): (\S+)\s*$")


def read_metrics(path: str | Path) -> dict[str, tuple[list[int], list[float]]]:
    """The metrics of a TorchFort wandb-hook log ($TORCHFORT_LOGDIR/torchfort.log), by
    "MODEL/METRIC": steps and values, in the order they were written (other lines are skipped)."""
    metrics: dict[str, tuple[list[int], list[float]]] = {}
    for line in Path(path).read_text().splitlines():
        m = _METRIC.match(line)
        if m:
            steps, values = metrics.setdefault(f"{m.group(1)}/{m.group(3)}", ([], []))
            steps.append(int(m.group(2)))
            values.append(float(m.group(4)))
    return metrics


def plot_metrics(log: str | Path, output: str | Path, names: list[str] | None = None,
                 title: str | None = None) -> Path:
    """Write a PNG with one panel per metric of a wandb-hook log (all, or those named as METRIC or
    MODEL/METRIC) against its step; returns its path."""
    metrics = read_metrics(log)
    if not metrics:
        raise ValueError(f"no metric lines ('TORCHFORT::WANDB: model: M, step: N, METRIC: VALUE') in {log}")
    if names:
        chosen = {k: v for k, v in metrics.items() if k in names or k.split("/", 1)[1] in names}
        missing = [n for n in names if not any(n == k or n == k.split("/", 1)[1] for k in chosen)]
        if missing:
            raise ValueError(f"no metric {', '.join(missing)} in {log} (it has: {', '.join(metrics)})")
        metrics = chosen
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib") from exc
    fig, axes = plt.subplots(len(metrics), 1, sharex=False, figsize=(7, 2.5 * len(metrics) + 0.5), squeeze=False)
    for ax, (name, (steps, values)) in zip(axes[:, 0], metrics.items()):
        ax.plot(steps, values, color="tab:blue")
        ax.set_ylabel(name.split("/", 1)[1])
        ax.set_xlabel(f"step ({name.split('/', 1)[0]})")
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_title(title or f"Metrics ({Path(log).name})")
    fig.tight_layout()
    out = Path(output)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
