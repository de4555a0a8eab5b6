"""Off-policy reinforcement learning written in Python with PyTorch from the published algorithms
(DDPG: Lillicrap et al. 2016; TD3: Fujimoto et al. 2018; SAC with automatic entropy tuning:
Haarnoja et al. 2018) and TorchFort's configuration (config.rst), as the reference the package's
torchfort_rl layer is tested against.

Everything random is drawn in a documented order so that a run here and a run of the package see
the same draws: the replay buffer's start indices from its own generator (seed 5489), noise from
torch's global generator (torchfort_set_manual_seed). The N-step return of a start (step t,
environment e) is sum_k gamma^k r_{t+k} over k < nstep, stopping after the step that ends the
episode (then d = 1); a start whose episode ends before its last step is drawn again unless the
reduction is a *_no_skip one; mean divides by the number of steps summed, weighted_mean by the sum of
their weights. Written per sample with Python loops (the package vectorizes)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

SAMPLER_SEED = 5489


class Noise:
    """Gaussian or Ornstein-Uhlenbeck noise on actions (space) or parameters (parameter)."""

    def __init__(self, actor: dict, sigma: float, clip: float):
        kind = actor["type"]
        self.parameter = kind.startswith("parameter")
        self.ou = kind.endswith("_ou")
        self.sigma, self.clip = sigma, clip
        self.dt, self.xi = float(actor.get("dt", 0.0)), float(actor.get("xi", 0.0))
        self.adaptive = actor.get("adaptive", False) in (True, 1, "true")
        self.state: list = []
        self.initialized = False

    def _draw(self, i: int, like: torch.Tensor, sigma: float) -> torch.Tensor:
        while len(self.state) <= i:
            self.state.append(None)
        if self.ou and self.initialized:
            st = self.state[i]
            self.state[i] = st + (self.xi * (0.0 - st) * self.dt
                                  + sigma * torch.empty_like(like).normal_(0.0, math.sqrt(self.dt)))
        else:
            self.state[i] = torch.empty_like(like).normal_(0.0, sigma)
        st = self.state[i]
        return st.clamp(-self.clip, self.clip) if self.clip > 0 else st

    def __call__(self, policy, state):
        if not self.parameter:
            action = policy(state)
            sigma = self.sigma * torch.std(action, unbiased=False).item() if self.adaptive else self.sigma
            noise = self._draw(0, action, sigma)
            self.initialized = True
            return action + noise
        params = list(policy.parameters())
        with torch.no_grad():
            saved = [p.clone() for p in params]
            for i, p in enumerate(params):
                sigma = self.sigma * torch.std(p, unbiased=False).item() if self.adaptive else self.sigma
                p.copy_(p + self._draw(i, p, sigma))
        self.initialized = True
        action = policy(state)
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        return action


def squashed_gaussian(policy, state):
    """A reparametrized draw a = tanh(u), u ~ N(mu, sigma), and log pi(a|s) with the tanh correction."""
    mu, log_sigma = policy(state)[:2]
    sigma = torch.exp(torch.clamp(log_sigma, -20.0, 2.0))
    u = (mu + sigma * torch.empty_like(mu).normal_(0.0, 1.0)).clone()
    log_prob = -torch.square(u - mu) / (2 * torch.square(sigma)) - sigma.log() - math.log(math.sqrt(2.0 * math.pi))
    correction = torch.sum(torch.flatten(2.0 * (math.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u)), 1), 1)
    return torch.tanh(u), torch.sum(torch.flatten(log_prob, 1), 1) - correction


class RunningNormalizer:
    """Per-feature running mean and unbiased variance (Chan et al.'s merge of Welford's sums)."""

    def __init__(self, scale_only: bool):
        self.scale_only, self.count, self.mean, self.m2 = scale_only, 0, None, None

    def update(self, x):
        flat = x.reshape(x.shape[0], -1).double()  # (float64 statistics whatever the dtype)
        mean = flat.mean(0)
        m2 = torch.sum(torch.square(flat - mean.unsqueeze(0)), 0)
        n = x.shape[0]
        if self.count == 0:
            self.mean, self.m2, self.count = mean, m2, n
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + torch.square(delta) * (self.count * n / total)
        self.count = total

    def __call__(self, x):
        if self.count < 2:
            return x
        flat = x.reshape(x.shape[0], -1)
        spread = torch.sqrt(self.m2 / (self.count - 1) + 1e-8).to(x.dtype)
        y = flat / spread if self.scale_only else (flat - self.mean.to(x.dtype)) / spread
        return y.reshape(x.shape)


class ReplayBuffer:
    def __init__(self, cfg: dict, gamma: float, nstep: int, reduction: str):
        p = cfg["parameters"]
        self.n_envs = int(p.get("n_envs", 1))
        self.capacity = int(p["max_size"]) // self.n_envs
        self.steps: list = []  # oldest first: (s, a, sp, r, d) with the environment first
        # prioritized (Schaul et al. 2016, proportional): a priority per (step, environment)
        self.prioritized = cfg.get("type", "uniform") == "prioritized"
        self.alpha = float(p.get("alpha", 0.6))
        self.beta, beta_max = float(p.get("beta0", 0.4)), float(p.get("beta_max", 1.0))
        beta_steps = int(p.get("beta_steps", 100000))
        self.beta_max, self.beta_step = beta_max, (beta_max - self.beta) / beta_steps if beta_steps > 0 else 0.0
        self.priorities: list = []
        self.max_priority = 1.0
        self.gamma, self.nstep = gamma, nstep
        self.skip = not reduction.endswith("_no_skip")
        self.reduction = reduction.replace("_no_skip", "")
        self.generator = torch.Generator().manual_seed(SAMPLER_SEED)

    def push(self, s, a, sp, r, d):
        self.steps.append((s.clone(), a.clone(), sp.clone(), r.clone(), d.clone()))
        self.priorities.append([self.max_priority] * self.n_envs)
        if len(self.steps) > self.capacity:
            self.steps.pop(0)
            self.priorities.pop(0)

    def _ends_early(self, t: int, e: int) -> bool:
        return any(self.steps[t + k][4][e] > 0.5 for k in range(self.nstep - 1))

    def _draw_prioritized(self, batch: int):
        self.beta = min(self.beta_max, self.beta + self.beta_step)
        steps = len(self.steps)
        weights = []
        for t in range(steps):
            for e in range(self.n_envs):
                valid = t <= steps - self.nstep and not (self.skip and self.nstep > 1 and self._ends_early(t, e))
                weights.append(self.priorities[t][e] ** self.alpha if valid else 0.0)
        weight = torch.tensor(weights, dtype=torch.float64)
        cumulative = weight.cumsum(0)
        total = cumulative[-1].item()
        u = (torch.arange(batch, dtype=torch.float64) + torch.rand(batch, generator=self.generator, dtype=torch.float64)) \
            * (total / batch)
        last = int(weight.gt(0).nonzero().reshape(-1)[-1])
        idx = torch.searchsorted(cumulative, u, right=True).clamp_max(last)
        smallest = weight[weight > 0].min().item()
        return idx, (smallest / weight[idx]).pow(self.beta)

    def update_priorities(self, idx, td):
        """|td| + 1e-6 for each sample, in order (a start drawn twice keeps its last)."""
        for i, err in zip(idx.tolist(), td.detach().abs().double().tolist()):
            self.priorities[i // self.n_envs][i % self.n_envs] = err + 1e-6
            self.max_priority = max(self.max_priority, err + 1e-6)

    def sample(self, batch: int):
        """(s, a, sp, r, d, importance weights or None, start indices)"""
        weights = None
        if self.prioritized:
            idx, weights = self._draw_prioritized(batch)
        else:
            high = (len(self.steps) - self.nstep + 1) * self.n_envs
            idx = torch.randint(high, (batch,), generator=self.generator)
        if self.skip and self.nstep > 1 and not self.prioritized:
            while True:
                bad = [i for i in range(batch) if self._ends_early(int(idx[i]) // self.n_envs, int(idx[i]) % self.n_envs)]
                if not bad:
                    break
                idx[bad] = torch.randint(high, (len(bad),), generator=self.generator)
        out = {k: [] for k in "s a sp r d".split()}
        for i in range(batch):
            t, e = int(idx[i]) // self.n_envs, int(idx[i]) % self.n_envs
            s, a, sp, r, d = (x[e] for x in self.steps[t])
            ret, count, norm, done = r.clone(), 1, 1.0, d.clone()
            alive = bool(d < 0.5)
            for k in range(1, self.nstep):
                if not alive:
                    break
                g = self.gamma ** k
                _, _, spk, rk, dk = (x[e] for x in self.steps[t + k])
                sp = spk
                ret = ret + rk * g
                count, norm, done = count + 1, norm + g, dk.clone()
                alive = bool(dk < 0.5)
            if self.reduction == "weighted_mean":
                ret = ret / norm
            elif self.reduction == "mean":
                ret = ret / count
            for key, v in zip("s a sp r d".split(), (s, a, sp, ret, done)):
                out[key].append(v)
        dtype = out["r"][0].dtype
        return [*(torch.stack(out[k]) for k in "s a sp r d".split()),
                None if weights is None else weights.to(dtype), idx]


def _number(v):
    return float(v) if isinstance(v, str) and v not in ("true", "false") else v


def _optimizer(cfg: dict, params):
    o = cfg["optimizer"]
    p = {k: _number(v) for k, v in (o.get("parameters") or {}).items()}
    if o["type"] == "adam":
        return torch.optim.Adam(params, lr=p.get("learning_rate", 1e-3), betas=(p.get("beta1", 0.9), p.get("beta2", 0.999)),
                                eps=p.get("eps", 1e-8), weight_decay=p.get("weight_decay", 0.0), foreach=False)
    return torch.optim.SGD(params, lr=p.get("learning_rate", 1e-3), momentum=p.get("momentum", 0.0),
                           dampening=p.get("dampening", 0.0), weight_decay=p.get("weight_decay", 0.0),
                           nesterov=p.get("nesterov", False) in (True, 1, "true"), foreach=False)


class OffPolicy:
    """DDPG, TD3 or SAC from a configuration (a dict as the YAML file holds it), starting from the
    networks of a checkpoint directory (its policy/, critic_<i>/ and target model.pt files)."""

    def __init__(self, cfg: dict, start: Path):
        a = cfg["algorithm"]["parameters"]
        self.td3 = cfg["algorithm"]["type"] == "td3"
        self.sac = cfg["algorithm"]["type"] == "sac"
        self.batch = int(a["batch_size"])
        self.gamma, self.rho = float(a["gamma"]), float(a["rho"])
        self.nstep = int(a.get("nstep", 1))
        self.lag = int(a.get("policy_lag", 1)) if self.td3 else 1
        n_critics = int(a.get("num_critics", 2)) if (self.td3 or self.sac) else 1
        actor = cfg["actor"]["parameters"] | {"type": cfg["actor"]["type"]}
        self.low, self.high = float(actor["a_low"]), float(actor["a_high"])
        self.noise_train = Noise(actor, float(actor.get("sigma_train", 0)), float(actor.get("clip", 0))) if self.td3 else None
        self.noise_explore = None if self.sac else Noise(actor, float(actor["sigma_explore"]), 0.0)
        self.buffer = ReplayBuffer(cfg["replay_buffer"], self.gamma, self.nstep,
                                   a.get("nstep_reward_reduction", "sum"))
        load = lambda sub: torch.jit.load(str(start / sub / "model.pt"), map_location="cpu")  # noqa: E731
        self.policy = load("policy")
        self.policy_target = None if self.sac else load("policy_target")
        self.critics = [load(f"critic_{i}") for i in range(n_critics)]
        self.critic_targets = [load(f"critic_target_{i}") for i in range(n_critics)]
        for m in [self.policy_target, *self.critic_targets]:
            if m is None:
                continue
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
        general = cfg["optimizer"].get("general") or {}
        self.accumulate = int(general.get("grad_accumulation_steps", 1))
        self.max_norm = float(general.get("max_grad_norm", 0.0))
        self.p_opt = _optimizer(cfg, list(self.policy.parameters()))
        self.q_opts = [_optimizer(cfg, list(q.parameters())) for q in self.critics]
        self.train_steps, self.p_calls, self.q_calls = 0, 0, 0
        flag = lambda key: a.get(key, False) in (True, 1, "true")  # noqa: E731
        self.state_norm = RunningNormalizer(False) if flag("normalize_states") else None
        self.reward_norm = RunningNormalizer(True) if flag("normalize_rewards") else None
        if self.sac:
            dtype = next(self.policy.parameters()).dtype
            alpha = float(a.get("alpha", 0.0))
            self.alpha_on = alpha > 0 or "alpha_optimizer" in cfg
            self.log_alpha = torch.full((1,), math.log(alpha if alpha > 0 else 0.01), dtype=dtype, requires_grad=True)
            self.target_entropy = float(a.get("target_entropy", 1.0))
            self.alpha_opt = (_optimizer({"optimizer": cfg["alpha_optimizer"]}, [self.log_alpha])
                              if "alpha_optimizer" in cfg else None)

    def scale(self, a):
        return 2.0 * ((a - self.low) / (self.high - self.low)) - 1.0

    def unscale(self, a):
        return 0.5 * (self.high - self.low) * (a + 1.0) + self.low

    def push(self, s, a, sp, r, d):
        """SAC keeps actions in its policy's scale [-1, 1]; the normalizers see states and rewards."""
        self.buffer.push(s, self.scale(a) if self.sac else a, sp, r, d)
        if self.state_norm:
            self.state_norm.update(s)
        if self.reward_norm:
            self.reward_norm.update(r.reshape(-1, 1))

    def state_in(self, s):
        return self.state_norm(s) if self.state_norm and self.state_norm.count > 0 else s

    def entropy_term(self, log_prob):
        return torch.exp(self.log_alpha.detach()) * log_prob if self.alpha_on else torch.zeros_like(log_prob)

    def clamp(self, a):
        return a.clamp(self.low, self.high)

    @staticmethod
    def q(critic, s, a):
        return critic(s, a).reshape(s.shape[0])

    def _step(self, opt, params, calls):
        if (calls + 1) % self.accumulate == 0:
            if self.max_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, self.max_norm)
            opt.step()
            return True
        return False

    def min_q(self, critics, s, a):
        q = self.q(critics[0], s, a)
        for c in critics[1:]:
            q = torch.minimum(q, self.q(c, s, a))
        return q

    def critic_step(self, s, a, y, weights=None, idx=None):
        for q in self.critics:
            q.train()
        if self.q_calls % self.accumulate == 0:
            for o in self.q_opts:
                o.zero_grad(set_to_none=True)
        loss = None
        for i, q in enumerate(self.critics):
            error = self.q(q, s, a) - y
            if i == 0 and weights is not None:
                self.buffer.update_priorities(idx, error)
            term = torch.mean(weights * torch.square(error)) if weights is not None else torch.mean(torch.square(error))
            loss = term if loss is None else loss + term
        loss.backward()
        for q, o in zip(self.critics, self.q_opts):
            self._step(o, list(q.parameters()), self.q_calls)
        self.q_calls += 1
        return loss.item() / len(self.critics)

    def sac_step(self, s, a, sp, r, d, weights, idx):
        if self.alpha_opt is not None:
            if self.p_calls % self.accumulate == 0:
                self.alpha_opt.zero_grad(set_to_none=True)
            target = self.target_entropy if self.target_entropy <= 0 else -float(a[0].numel())
            with torch.no_grad():
                log_prob = squashed_gaussian(self.policy, s)[1] + target
            (-torch.mean(self.log_alpha * log_prob)).backward()
            if (self.p_calls + 1) % self.accumulate == 0:
                self.alpha_opt.step()
        with torch.no_grad():
            ap, logp = squashed_gaussian(self.policy, sp)
            q_next = self.min_q(self.critic_targets, sp, ap) - self.entropy_term(logp)
            y = r + q_next * self.gamma ** self.nstep * (1.0 - d)
        q_loss = self.critic_step(s, a, y, weights, idx)
        for q in self.critics:
            for p in q.parameters():
                p.requires_grad_(False)
        self.policy.train()
        if self.p_calls % self.accumulate == 0:
            self.p_opt.zero_grad(set_to_none=True)
        act, logp = squashed_gaussian(self.policy, s)
        pl = -torch.mean(self.min_q(self.critics, s, act) - self.entropy_term(logp))
        pl.backward()
        for q in self.critics:
            for p in q.parameters():
                p.requires_grad_(True)
        stepped = self._step(self.p_opt, list(self.policy.parameters()), self.p_calls)
        self.p_calls += 1
        if stepped:
            with torch.no_grad():
                for target, source in zip(self.critic_targets, self.critics):
                    for t, src in zip(target.parameters(), source.parameters()):
                        t.mul_(self.rho)
                        t.add_((1.0 - self.rho) * src)
        return pl.item(), q_loss

    def train_step(self):
        self.train_steps += 1
        s, a, sp, r, d, weights, idx = self.buffer.sample(self.batch)
        s, sp = self.state_in(s), self.state_in(sp)
        if self.reward_norm:
            r = self.reward_norm(r.unsqueeze(1)).squeeze(1)
        if self.sac:
            return self.sac_step(s, a, sp, r, d, weights, idx)
        with torch.no_grad():
            ap = self.noise_train(self.policy_target, sp) if self.td3 else self.policy_target(sp)
            ap = self.clamp(ap)
            y = r + self.min_q(self.critic_targets, sp, ap) * self.gamma ** self.nstep * (1.0 - d)
        q_loss = self.critic_step(s, a, y, weights, idx)
        p_loss = 0.0
        if self.train_steps % self.lag == 0:
            for p in self.critics[0].parameters():
                p.requires_grad_(False)
            self.policy.train()
            if self.p_calls % self.accumulate == 0:
                self.p_opt.zero_grad(set_to_none=True)
            pl = -torch.mean(self.q(self.critics[0], s, self.policy(s)))
            pl.backward()
            p_loss = pl.item()
            for p in self.critics[0].parameters():
                p.requires_grad_(True)
            stepped = self._step(self.p_opt, list(self.policy.parameters()), self.p_calls)
            self.p_calls += 1
            if stepped:
                with torch.no_grad():
                    for target, source in [*zip(self.critic_targets, self.critics), (self.policy_target, self.policy)]:
                        for t, src in zip(target.parameters(), source.parameters()):
                            t.mul_(self.rho)
                            t.add_((1.0 - self.rho) * src)
        return p_loss, q_loss

    def predict(self, s):
        s = self.state_in(s)
        with torch.no_grad():
            self.policy.eval()
            if self.sac:
                return self.unscale(torch.tanh(self.policy(s)[0]))
            return self.clamp(self.policy(s))

    def predict_explore(self, s):
        s = self.state_in(s)
        with torch.no_grad():
            self.policy.eval()
            if self.sac:
                return self.unscale(squashed_gaussian(self.policy, s)[0])
            return self.clamp(self.noise_explore(self.policy, s))

    def evaluate(self, s, a):
        s = self.state_in(s)
        with torch.no_grad():
            self.critics[0].eval()
            return self.q(self.critics[0], s, self.scale(a) if self.sac else a)


class PPO:
    """PPO with the clipped objective (Schulman et al. 2017) and GAE (Schulman et al. 2016) from a
    configuration, starting from the actor-critic network of a checkpoint directory
    (actor_critic/model.pt, returning means, log standard deviations and values). The rollout's
    epochs are drawn with the system's generator (randperm, seed 5489)."""

    def __init__(self, cfg: dict, start: Path):
        a = cfg["algorithm"]["parameters"]
        flag = lambda key, default: a.get(key, default) in (True, 1, "true")  # noqa: E731
        self.batch = int(a["batch_size"])
        self.gamma, self.lam = float(a["gamma"]), float(a["gae_lambda"])
        self.epsilon, self.clip_q = float(a.get("epsilon", 0.2)), float(a.get("clip_q", 0.0))
        self.target_kl = float(a["target_kl_divergence"])
        self.ent_coef, self.vf_coef = float(a.get("entropy_loss_coefficient", 0.0)), float(a.get("value_loss_coefficient", 0.5))
        self.normalize_advantage = flag("normalize_advantage", True)
        self.state_norm = RunningNormalizer(False) if flag("normalize_states", False) else None
        self.return_norm = RunningNormalizer(True) if flag("normalize_returns", False) else None
        self.squashed = cfg["actor"]["type"] == "squashed_gaussian_ac"
        self.low, self.high = float(cfg["actor"]["parameters"]["a_low"]), float(cfg["actor"]["parameters"]["a_high"])
        rb = cfg["rollout_buffer"]["parameters"]
        self.n_envs = int(rb.get("n_envs", 1))
        self.steps = int(rb["size"]) // self.n_envs
        self.net = torch.jit.load(str(start / "actor_critic" / "model.pt"), map_location="cpu")
        general = cfg["optimizer"].get("general") or {}
        self.accumulate = int(general.get("grad_accumulation_steps", 1))
        self.max_norm = float(general.get("max_grad_norm", 0.0))
        self.opt = _optimizer(cfg, list(self.net.parameters()))
        self.generator = torch.Generator().manual_seed(SAMPLER_SEED)
        self.rollout: list = []
        self.ready = False
        self.calls = 0

    def state_in(self, s):
        return self.state_norm(s) if self.state_norm and self.state_norm.count > 0 else s

    def run(self, s):
        mu, log_sigma, value = self.net(s)[:3]
        sigma = torch.exp(torch.clamp(log_sigma, -20.0, 2.0)).expand_as(mu)
        return mu, sigma, value.reshape(s.shape[0])

    def policy_scale(self, a):
        a = a.clamp(self.low, self.high)
        return 2.0 * ((a - self.low) / (self.high - self.low)) - 1.0 if self.squashed else a

    def action_scale(self, a):
        return 0.5 * (self.high - self.low) * (a + 1.0) + self.low if self.squashed else a.clamp(self.low, self.high)

    def evaluate_actions(self, s, a):
        mu, sigma, value = self.run(s)
        def total(t):
            return torch.sum(torch.flatten(t, 1), 1)
        def normal(x):
            return -torch.square(x - mu) / (2 * torch.square(sigma)) - sigma.log() - math.log(math.sqrt(2.0 * math.pi))
        if not self.squashed:
            return total(normal(a)), total(sigma.log() + 0.5 * (1.0 + math.log(2.0 * math.pi))), value
        eps = torch.finfo(torch.float32).eps
        y = torch.clamp(a, -1.0 + eps, 1.0 - eps)
        u = 0.5 * (y.log1p() - (-y).log1p())
        log_prob = total(normal(u)) - total(torch.log(1.0 - torch.square(a) + 1e-6))
        return log_prob, -log_prob, value

    def push(self, s, a, r, d):
        """One step of every environment; the one after a full rollout closes it."""
        a = self.policy_scale(a)
        seen = self.state_in(s)  # the state as the policy saw it when it chose a (before this update)
        if self.state_norm:
            self.state_norm.update(s)
        with torch.no_grad():
            self.net.eval()
            log_prob, _, value = self.evaluate_actions(seen, a)
        if len(self.rollout) == self.steps:
            if not self.ready:
                self.finalize(value)
            return
        self.rollout.append((seen.clone(), a.clone(), r.clone(), value, log_prob, d.clone()))

    def finalize(self, last_value):
        s, a, r, v, logp, d = (torch.stack(x) for x in zip(*self.rollout))
        adv, ret = torch.zeros_like(r), torch.zeros_like(r)
        gae = torch.zeros(self.n_envs, dtype=r.dtype)
        next_value = last_value
        for t in reversed(range(self.steps)):
            nnt = 1.0 - d[t]
            delta = r[t] + self.gamma * next_value * nnt - v[t]
            gae = delta + self.gamma * self.lam * nnt * gae
            adv[t], ret[t] = gae, gae + v[t]
            next_value = v[t]
        if self.return_norm:
            self.return_norm.update(ret.reshape(-1, 1))
            scaled = lambda t: self.return_norm(t.reshape(-1, 1)).reshape(t.shape)  # noqa: E731
            ret, adv = scaled(ret), scaled(adv)  # (the values stay in the network's scale)
        if self.normalize_advantage:
            flat = adv.flatten()
            n = flat.numel()
            mean = torch.sum(flat) / n
            adv = (adv - mean) / torch.sqrt(torch.sum(torch.square(flat - mean)) / (n - 1.0) + 1e-8)
        self.data = (s, a, v, logp, adv, ret)
        self.ready = True
        self.order, self.pos = torch.randperm(self.steps * self.n_envs, generator=self.generator), 0

    def reset(self):
        self.rollout, self.ready = [], False

    def train_step(self):
        total = self.steps * self.n_envs
        if self.pos >= total:
            self.order, self.pos = torch.randperm(total, generator=self.generator), 0
        idx = self.order[self.pos:min(self.pos + self.batch, total)]
        self.pos = min(self.pos + self.batch, total)
        step, env = idx // self.n_envs, idx % self.n_envs
        s, a, v_old, logp_old, adv, ret = (x[step, env] for x in self.data)  # s: as seen when acting
        self.net.train()
        log_prob, entropy, value = self.evaluate_actions(s, a)
        log_ratio = log_prob - logp_old
        ratio = torch.exp(log_ratio)
        pl = -torch.mean(torch.minimum(adv * ratio, adv * torch.clamp(ratio, 1.0 - self.epsilon, 1.0 + self.epsilon)))
        v_pred = v_old + torch.clamp(value - v_old, -self.clip_q, self.clip_q) if self.clip_q > 0 else value
        ql = torch.nn.functional.mse_loss(v_pred, ret)
        loss = pl + self.vf_coef * ql + self.ent_coef * -torch.mean(entropy)
        with torch.no_grad():
            kl = torch.mean((ratio - 1.0) - log_ratio).item()
        if not (self.target_kl > 0 and kl > 1.5 * self.target_kl):
            if self.calls % self.accumulate == 0:
                self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if (self.calls + 1) % self.accumulate == 0:
                if self.max_norm > 0:
                    torch.nn.utils.clip_grad_norm_(list(self.net.parameters()), self.max_norm)
                self.opt.step()
            self.calls += 1
        return pl.item(), ql.item()

    def predict(self, s):
        with torch.no_grad():
            self.net.eval()
            mu = self.run(self.state_in(s))[0]
            return self.action_scale(torch.tanh(mu) if self.squashed else mu)

    def predict_explore(self, s):
        with torch.no_grad():
            self.net.eval()
            mu, sigma, _ = self.run(self.state_in(s))
            u = (mu + sigma * torch.empty_like(mu).normal_(0.0, 1.0)).clone()
            return self.action_scale(torch.tanh(u) if self.squashed else u)

    def evaluate(self, s, a):
        with torch.no_grad():
            self.net.eval()
            return self.run(self.state_in(s))[2]
