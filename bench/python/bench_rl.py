"""Benchmark, Python side: the train steps of bench/fortran/bench_rl.f90 written in PyTorch eager as
a Python user writes them well (foreach Adam and Polyak updates, preallocated buffers, one
host synchronisation where the algorithm needs a decision: PPO's KL early stop).

    python bench_rl.py td3 <iterations>     TorchFort's td3.yaml: batch 128, MLP 1-16-1, 2 critics 2-16-1
    python bench_rl.py ppo <iterations>     TorchFort's ppo.yaml: rollout 64, minibatch 8

Prints "seconds <total of the timed loop>"."""

from __future__ import annotations

import math
import sys
import time

import torch


class MLP(torch.nn.Module):
    """TorchFort's MLP: Linear layers, an extra bias before each hidden ReLU."""

    def __init__(self, sizes):
        super().__init__()
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.biases = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in sizes[1:-1])

    def forward(self, x):
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            if i < len(self.fcs) - 1:
                x = torch.relu(x + self.biases[i])
        return x


class Critic(MLP):
    def forward(self, s, a):
        return super().forward(torch.cat([s, a], 1))


def td3(iterations: int) -> float:
    torch.manual_seed(1)
    batch, gamma, rho, lag = 128, 0.95, 0.999, 2
    policy, critics = MLP([1, 16, 1]), [Critic([2, 16, 1]) for _ in range(2)]
    policy_t = MLP([1, 16, 1])
    policy_t.load_state_dict(policy.state_dict())
    critics_t = [Critic([2, 16, 1]) for _ in range(2)]
    for t, c in zip(critics_t, critics):
        t.load_state_dict(c.state_dict())
    for m in [policy_t, *critics_t]:
        m.requires_grad_(False)
    adam = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, foreach=True)
    p_opt = torch.optim.Adam(policy.parameters(), **adam)
    q_opts = [torch.optim.Adam(c.parameters(), **adam) for c in critics]
    p_sched = torch.optim.lr_scheduler.LinearLR(p_opt, 1.0, 0.01, 10000)
    q_scheds = [torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.01, 20000) for o in q_opts]
    # a full replay buffer of 512 transitions (as the Fortran program's when it becomes ready)
    n = 512
    steps = torch.arange(n, dtype=torch.float32)
    S = torch.sin(0.1 * steps + 1).unsqueeze(1)
    SP = torch.sin(0.1 * (steps + 1) + 1).unsqueeze(1)
    A = torch.cos(0.3 * steps + 1).unsqueeze(1)
    R = -S.squeeze(1) ** 2
    D = (steps % 50 == 0).float()
    target_params = [p for m in [policy_t, *critics_t] for p in m.parameters()]
    source_params = [p for m in [policy, *critics] for p in m.parameters()]
    t0 = time.perf_counter()
    for it in range(1, iterations + 1):
        idx = torch.randint(n, (batch,))
        s, a, sp, r, d = S[idx], A[idx], SP[idx], R[idx], D[idx]
        with torch.no_grad():
            ap = policy_t(sp) + (torch.randn_like(a) * 0.2).clamp(-0.3, 0.3)
            ap = ap.clamp(-1.0, 1.0)
            q_next = torch.minimum(critics_t[0](sp, ap), critics_t[1](sp, ap)).squeeze(1)
            y = r + q_next * gamma * (1.0 - d)
        for o in q_opts:
            o.zero_grad(set_to_none=True)
        loss = sum(torch.mean(torch.square(c(s, a).squeeze(1) - y)) for c in critics)
        loss.backward()
        for o, sch in zip(q_opts, q_scheds):
            o.step()
            sch.step()
        if it % lag == 0:
            critics[0].requires_grad_(False)
            p_opt.zero_grad(set_to_none=True)
            pl = -torch.mean(critics[0](s, policy(s)))
            pl.backward()
            p_opt.step()
            p_sched.step()
            critics[0].requires_grad_(True)
            with torch.no_grad():
                torch._foreach_mul_(target_params, rho)
                torch._foreach_add_(target_params, source_params, alpha=1.0 - rho)
    return time.perf_counter() - t0


class ActorCritic(torch.nn.Module):
    """TorchFort's ActorCriticMLP of ppo.yaml: encoder 1-16-8, actor 8-8-1, value 8-8-1, each Linear
    followed by an extra bias (as TorchFort builds it), a state-independent log sigma."""

    def __init__(self):
        super().__init__()

        def layers(sizes):
            return (torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])),
                    torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(b)) for b in sizes[1:]))

        self.enc, self.enc_b = layers([1, 16, 8])
        self.actor, self.actor_b = layers([8, 8, 1])
        self.value, self.value_b = layers([8, 8, 1])
        self.log_sigma = torch.nn.Parameter(torch.zeros(1))

    def forward(self, s):
        x = s
        for fc, b in zip(self.enc, self.enc_b):
            x = torch.relu(fc(x) + b)
        mu = self.actor[1](torch.tanh(self.actor[0](x) + self.actor_b[0])) + self.actor_b[1]
        v = self.value[1](torch.tanh(self.value[0](x) + self.value_b[0])) + self.value_b[1]
        return mu, self.log_sigma.expand_as(mu), v.squeeze(1)


def ppo(iterations: int) -> float:
    torch.manual_seed(1)
    net = ActorCritic()
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, foreach=True)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.01, 40000)
    n, batch, eps, target_kl, vf = 64, 8, 0.2, 0.02, 0.5
    steps = torch.arange(n, dtype=torch.float32)
    S = torch.sin(0.1 * steps + 1).unsqueeze(1)
    A = torch.cos(0.3 * steps + 1).clamp(-1, 1).unsqueeze(1)
    with torch.no_grad():
        mu, log_sigma, V = net(S)
        sigma = log_sigma.exp()
        LOGP = (-(A - mu) ** 2 / (2 * sigma**2) - sigma.log() - math.log(math.sqrt(2 * math.pi))).sum(1)
    ADV = torch.randn(n)
    ADV = (ADV - ADV.mean()) / (ADV.std() + 1e-8)
    RET = ADV + V
    order, pos = torch.randperm(n), 0
    t0 = time.perf_counter()
    for _ in range(iterations):
        if pos >= n:
            order, pos = torch.randperm(n), 0
        idx = order[pos:pos + batch]
        pos += batch
        s, a, logp_old, adv, ret = S[idx], A[idx], LOGP[idx], ADV[idx], RET[idx]
        mu, log_sigma, v = net(s)
        sigma = torch.exp(torch.clamp(log_sigma, -20.0, 2.0))
        logp = (-(a - mu) ** 2 / (2 * sigma**2) - sigma.log() - math.log(math.sqrt(2 * math.pi))).sum(1)
        log_ratio = logp - logp_old
        ratio = torch.exp(log_ratio)
        pl = -torch.mean(torch.minimum(adv * ratio, adv * torch.clamp(ratio, 1 - eps, 1 + eps)))
        loss = pl + vf * torch.nn.functional.mse_loss(v, ret)
        with torch.no_grad():
            kl = torch.mean((ratio - 1) - log_ratio)
        if kl.item() > 1.5 * target_kl:  # the algorithm's decision: one host synchronisation
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5, foreach=True)
        opt.step()
        sched.step()
    return time.perf_counter() - t0


def main(argv):
    torch.set_num_threads(1)
    which, iterations = argv[1], int(argv[2])
    seconds = {"td3": td3, "ppo": ppo}[which](iterations)
    print(f"seconds {seconds:.8e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
