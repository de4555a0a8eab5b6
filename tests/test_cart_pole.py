"""TorchFort's cart-pole problem learned through module torchfort (tests/fortran/test_cart_pole.f90):
TorchFort's environment constants, reward, TD3 configuration, networks and training schedule (one
training step per exploring episode, an evaluation every 25 episodes, solved when the policy
without noise balances the pole for 470 steps), with fixed seeds. One compiler: the learning
itself is compiler-independent library code (the RL parity tests cover the compilers)."""

from __future__ import annotations

import torch
from torch import nn

from conftest import COMPILERS, run
from test_torchfort import _to_yaml

# TorchFort's examples/cpp/cart_pole/config.yaml, its values (TorchScript networks written below).
CONFIG = {
    "general": {"report_frequency": 100},
    "algorithm": {"type": "td3", "parameters": {
        "batch_size": 512, "num_critics": 2, "policy_lag": 2, "nstep": 1, "nstep_reward_reduction": "sum_no_skip",
        "gamma": 0.99, "rho": 0.99}},
    "actor": {"type": "space_noise", "parameters": {
        "a_low": -1.0, "a_high": 1.0, "clip": 0.3, "sigma_train": 0.1, "sigma_explore": 0.2, "adaptive": 0}},
    "replay_buffer": {"type": "uniform", "parameters": {"max_size": 50000, "min_size": 1024}},
    "policy_model": {"type": "torchscript", "parameters": {"filename": '"{dir}/policy.pt"'}},
    "critic_model": {"type": "torchscript", "parameters": {"filename": '"{dir}/value.pt"'}},
    "optimizer": {"type": "adam", "parameters": {
        "learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0, "eps": "1e-6", "amsgrad": 0}},
    "policy_lr_scheduler": {"type": "cosine_annealing", "parameters": {"T_max": 500000000}},
    "critic_lr_scheduler": {"type": "cosine_annealing", "parameters": {"T_max": 500000000}},
}
# Episodes allowed. TorchFort's own C++ example, run against this package (docs/guide/
# migrating-torchfort.md), solved it at episode 625; this program with torch seed 333 at episode 700,
# and with seeds 1-6 at 600, 550, 875, 525, 675, 850 (2026-11-28). Another CPU's rounding changes
# the trajectory as another seed does: 1500 leaves 1.7x the slowest of those seven.
MAX_EPISODES = 1500


class Policy(nn.Module):
    """4 -> 128 -> 64 -> 1, ReLU, tanh output (TorchFort's cart_pole policy)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1), nn.Tanh())

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(state)


class Critic(nn.Module):
    """(state, action) concatenated: 5 -> 128 -> 64 -> 1, ReLU."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([state, action], dim=1))


def _initialized(model: nn.Module) -> nn.Module:
    """Weights uniform in +-sqrt(1/fan_in), biases zero (TorchFort's initialization)."""
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            bound = (1.0 / layer.in_features) ** 0.5
            nn.init.uniform_(layer.weight, -bound, bound)
            nn.init.zeros_(layer.bias)
    return model


def test_td3_learns_torchforts_cart_pole(cmake_consumer, tmp_path):
    """Solved (an evaluation episode of 470 steps or more) within MAX_EPISODES episodes (about 15 s
    here)."""
    torch.manual_seed(666)
    torch.jit.script(_initialized(Policy())).save(str(tmp_path / "policy.pt"))
    torch.jit.script(_initialized(Critic())).save(str(tmp_path / "value.pt"))
    config = tmp_path / "cart_pole.yaml"
    config.write_text(_to_yaml(CONFIG).replace("{dir}", str(tmp_path)))
    binary = cmake_consumer(COMPILERS[0]) / "test_cart_pole"
    proc = run([binary, config, MAX_EPISODES], timeout=900)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("solved at episode "), proc.stdout[-3000:] + proc.stderr[-3000:]
