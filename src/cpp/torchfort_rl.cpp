// torchfort_rl.cpp - TorchFort's off-policy reinforcement-learning API (torchfort_rl.h) over
// LibTorch: DDPG, TD3 and SAC systems by name, configured in YAML (torchfort_rl_config.cpp), a
// replay buffer with N-step returns, exploration and target-smoothing noise on actions or
// parameters, SAC's squashed Gaussian policy with a tuned entropy coefficient, target networks with
// Polyak averaging, checkpoints that resume bit for bit.
//
// The algorithms follow their publications (Lillicrap et al. 2016 for DDPG, Fujimoto et al. 2018
// for TD3, Haarnoja et al. 2018 for SAC) and TorchFort's configuration; where TorchFort's own implementation departs from the
// algorithm it documents (DDPG smoothing its targets, N-step returns running past the end of an
// episode, SAC storing unscaled actions), the algorithm is followed. docs/guide/reinforcement-learning.md states each rule.
#include "torchfort_rl_common.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "torchfort_rl.h"
#include "torchfort_rl_config.hpp"

namespace tf {
namespace rl {

// ---------------------------------------------------------------------------- networks



// A critic's value of each (state, action) pair: one number per sample.
at::Tensor q_value(Net &critic, const at::Tensor &s, const at::Tensor &a) {
  at::Tensor q = forward(critic, {s, a});
  if (q.numel() != s.size(0))
    usage("the critic returns " + shape_text(q) + " for a batch of " + std::to_string(s.size(0)) +
          " states: it must return one value per sample (e.g. [batch, 1])");
  return q.reshape({s.size(0)});
}


// TorchFort's initialization of critics (each of several gets its own draw): weights of rank >= 2
// orthogonal with gain sqrt(2), other weights 1, biases named "bias" 0.
void init_critic(Net &net) {
  torch::NoGradGuard no_grad;
  for (const auto &p : net.module.named_parameters()) {
    at::Tensor v = p.value;
    if (p.name.find("weight") != std::string::npos) {
      if (v.dim() >= 2) {
        torch::nn::init::orthogonal_(v, std::sqrt(2.0));
      } else {
        v.fill_(1.0);
      }
    } else if (p.name.find("bias") != std::string::npos) {
      v.zero_();
    }
  }
}

// target = rho * target + (1 - rho) * source, parameter by parameter.
void polyak(Net &target, const Net &source, double rho) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < target.params.size(); ++i) {
    target.params[i].mul_(rho);
    target.params[i].add_((1.0 - rho) * source.params[i]);
  }
}

// A copy of a network that follows it (no gradients, evaluation mode).
void make_target(Net &target, const Net &source) {
  torch::NoGradGuard no_grad;  // (a clone made with autograd on would not be a leaf)
  target.set(source.module.clone());
  set_requires_grad(target, false);
  target.module.eval();
}

// TorchFort's SACMLP as a TorchScript module: hidden layers encoder_fc_<i> (Linear, an extra zero
// bias encoder_b_<i>, ReLU, dropout), then the action means out_fc_1_<L> (+ out_b_1_<L>) and the
// log standard deviations, a function of the state (out_fc_2_<L> + out_b_2_<L>) or one parameter
// per action (out_b_2_<L>, log_sigma_init). forward returns (means, log standard deviations).
torch::jit::Module build_sac_mlp(const NetConfig &n) {
  const std::vector<int64_t> &sizes = n.layer_sizes;
  const size_t last = sizes.size() - 2;  // index of the output layer
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module root(c10::QualifiedName("__torch__.torchfort.SACMLP"), cu, /*shouldMangle=*/true);
  root.register_attribute("training", c10::BoolType::get(), true);
  root.register_attribute("dropout", c10::FloatType::get(), n.dropout);
  auto linear = [&](const std::string &name, int64_t in, int64_t out) {
    torch::nn::Linear l(in, out);
    torch::jit::Module fc(c10::QualifiedName("__torch__.torchfort.Linear"), cu, /*shouldMangle=*/true);
    fc.register_attribute("training", c10::BoolType::get(), true);
    fc.register_parameter("weight", l->weight.detach().requires_grad_(true), false);
    fc.register_parameter("bias", l->bias.detach().requires_grad_(true), false);
    fc.define("def forward(self, x):\n    return torch.linear(x, self.weight, self.bias)\n");
    root.register_module(name, fc);
  };
  const std::string L = std::to_string(last);
  for (size_t i = 0; i < last; ++i) {
    root.register_parameter("encoder_b_" + std::to_string(i), torch::zeros({sizes[i + 1]}).requires_grad_(true), false);
    linear("encoder_fc_" + std::to_string(i), sizes[i], sizes[i + 1]);
  }
  root.register_parameter("out_b_1_" + L, torch::zeros({sizes[last + 1]}).requires_grad_(true), false);
  linear("out_fc_1_" + L, sizes[last], sizes[last + 1]);
  root.register_parameter("out_b_2_" + L,
                          (torch::ones({sizes[last + 1]}) * n.log_sigma_init).requires_grad_(true), false);
  if (n.state_dependent_sigma) linear("out_fc_2_" + L, sizes[last], sizes[last + 1]);
  std::ostringstream src;
  src << "def forward(self, state):\n"
      << "    if state.dim() == 1:\n        state = state.unsqueeze(0)\n"
      << "    x = state.reshape([state.size(0), -1])\n";
  for (size_t i = 0; i < last; ++i)
    src << "    x = torch.dropout(torch.relu(self.encoder_fc_" << i << ".forward(x) + self.encoder_b_" << i
        << "), self.dropout, self.training)\n";
  src << "    mu = self.out_fc_1_" << L << ".forward(x) + self.out_b_1_" << L << "\n";
  if (n.state_dependent_sigma) {
    src << "    log_sigma = self.out_fc_2_" << L << ".forward(x) + self.out_b_2_" << L << "\n";
  } else {
    src << "    log_sigma = self.out_b_2_" << L << "\n";
  }
  src << "    return (mu, log_sigma)\n";
  root.define(src.str());
  return root;
}

// A draw of SAC's squashed Gaussian policy: a = tanh(u), u ~ N(mu, sigma) (reparametrized), and
// log pi(a | s) summed over the action's elements, with the tanh correction
// log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2 u)).
struct Draw {
  at::Tensor action, log_prob;
};

Draw squashed_gaussian(Net &policy, const at::Tensor &state) {
  const std::vector<at::Tensor> out = forward_all(policy, {state});
  if (out.size() < 2)
    usage("the SAC policy must return (action means, log standard deviations); it returns " +
          std::to_string(out.size()) + " tensor");
  const at::Tensor &mu = out[0];
  const at::Tensor sigma = at::exp(at::clamp(out[1], -20.0, 2.0));
  const at::Tensor u = (mu + sigma * at::empty_like(mu).normal_(0.0, 1.0)).clone();
  return {at::tanh(u), per_sample_sum(normal_log_prob(u, mu, sigma)) - tanh_log_det(u)};
}

// ---------------------------------------------------------------------------- noise

// Noise on a policy's actions ("space") or on its parameters ("parameter"), as independent
// Gaussian draws or an Ornstein-Uhlenbeck process (mean 0), optionally scaled by the spread of the
// actions or parameters (adaptive) and clipped to [-clip, clip] (clip 0: unclipped).
class Noise {
 public:
  Noise(const ActorConfig &c, double sigma, double clip)
      : parameter_(c.type.rfind("parameter", 0) == 0),
        ou_(c.type.size() > 3 && c.type.compare(c.type.size() - 3, 3, "_ou") == 0),
        sigma_(sigma),
        clip_(clip),
        dt_(c.dt),
        xi_(c.xi),
        adaptive_(c.adaptive) {}

  // The policy's (perturbed) action for state.
  at::Tensor operator()(Net &policy, const at::Tensor &state) {
    if (!parameter_) {
      at::Tensor action = forward(policy, {state});
      const double sigma = adaptive_ ? sigma_ * at::std(action, /*unbiased=*/false).item<double>() : sigma_;
      at::Tensor noise = draw(0, action, sigma);
      initialized_ = true;
      return action + noise;
    }
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> saved;
    for (size_t i = 0; i < policy.params.size(); ++i) {
      at::Tensor &p = policy.params[i];
      saved.push_back(p.clone());
      const double sigma = adaptive_ ? sigma_ * at::std(p, /*unbiased=*/false).item<double>() : sigma_;
      p.copy_(p + draw(i, p, sigma));
    }
    initialized_ = true;
    at::Tensor action;
    try {
      action = forward(policy, {state});
    } catch (...) {
      for (size_t i = 0; i < saved.size(); ++i) policy.params[i].copy_(saved[i]);
      throw;
    }
    for (size_t i = 0; i < saved.size(); ++i) policy.params[i].copy_(saved[i]);
    return action;
  }

  // The process's state (for checkpoints).
  std::vector<at::Tensor> state() const { return state_; }
  bool initialized() const { return initialized_; }
  void restore(std::vector<at::Tensor> state, bool initialized) {
    state_ = std::move(state);
    initialized_ = initialized;
  }

 private:
  // The noise for item i (an action batch, or parameter i) of the shape of `like`.
  at::Tensor draw(size_t i, const at::Tensor &like, double sigma) {
    if (state_.size() <= i) state_.resize(i + 1);
    at::Tensor &st = state_[i];
    if (ou_ && initialized_) {
      if (st.sizes() != like.sizes())
        usage("Ornstein-Uhlenbeck noise keeps one state per action element: it was started for " + shape_text(st) +
              ", now asked for " + shape_text(like) + " (keep the number of states per call constant)");
      st = st + (xi_ * (0.0 - st) * dt_ + sigma * at::empty_like(like).normal_(0.0, std::sqrt(dt_)));
    } else {
      st = at::empty_like(like).normal_(0.0, sigma);
    }
    return clip_ > 0 ? st.clamp(-clip_, clip_) : st;
  }

  bool parameter_, ou_;
  double sigma_, clip_, dt_, xi_;
  bool adaptive_;
  bool initialized_ = false;
  std::vector<at::Tensor> state_;
};


// ---------------------------------------------------------------------------- replay buffer

// Transitions of n_envs environments, max_size/n_envs steps each (the oldest step dropped when
// full), sampled with N-step returns from the system's own generator: uniformly, or (prioritized)
// in proportion to priority^alpha with importance weights.
class ReplayBuffer {
 public:
  struct Batch {
    at::Tensor s, a, sp, r, d;
    at::Tensor w;      // importance weights (prioritized buffers; undefined otherwise)
    at::Tensor where;  // the samples' storage positions (step * n_envs + env), for new priorities
  };

  ReplayBuffer(const RLConfig &c, const torch::Device &device, c10::ScalarType dtype)
      : n_envs_(c.replay_buffer.n_envs),
        capacity_(c.replay_buffer.max_size / c.replay_buffer.n_envs),
        min_steps_(c.replay_buffer.min_size / c.replay_buffer.n_envs),
        nstep_(c.nstep),
        gamma_(c.gamma),
        device_(device),
        dtype_(dtype) {
    const std::string &m = c.nstep_reward_reduction;
    skip_ = m.find("_no_skip") == std::string::npos;
    mean_ = m.rfind("mean", 0) == 0;
    weighted_ = m.rfind("weighted_mean", 0) == 0;
    const ReplayBufferConfig &rb = c.replay_buffer;
    prioritized_ = rb.type == "prioritized";
    alpha_ = rb.alpha;
    beta_ = rb.beta0;
    beta_max_ = rb.beta_max;
    beta_step_ = rb.beta_steps > 0 ? (rb.beta_max - rb.beta0) / static_cast<double>(rb.beta_steps) : 0.0;
  }

  bool prioritized() const { return prioritized_; }

  int64_t n_envs() const { return n_envs_; }
  int64_t size() const { return size_; }
  int64_t needed() const { return std::max(min_steps_, nstep_); }
  bool ready() const { return size_ >= needed(); }

  // One step of every environment: s, a, sp of shape [n_envs, ...], r and d of n_envs values.
  void push(const at::Tensor &s, const at::Tensor &a, const at::Tensor &sp, const at::Tensor &r,
            const at::Tensor &d) {
    torch::NoGradGuard no_grad;
    if (!s_.defined()) {
      s_ = storage(s);
      a_ = storage(a);
      sp_ = storage(sp);
      r_ = storage(r);
      d_ = storage(d);
      d_cpu_ = at::zeros({capacity_, n_envs_}, at::TensorOptions().dtype(at::kFloat));
      priority_ = at::zeros({capacity_, n_envs_}, at::TensorOptions().dtype(at::kDouble));
    }
    check(s_, s, "state");
    check(a_, a, "action");
    check(sp_, sp, "state_new");
    const int64_t pos = size_ < capacity_ ? (head_ + size_) % capacity_ : head_;
    s_[pos].copy_(s);
    a_[pos].copy_(a);
    sp_[pos].copy_(sp);
    r_[pos].copy_(r.reshape({n_envs_}));
    d_[pos].copy_(d.reshape({n_envs_}));
    d_cpu_[pos].copy_(d.reshape({n_envs_}));
    priority_[pos].fill_(max_priority_);  // new transitions: the largest priority seen
    if (size_ < capacity_) {
      ++size_;
    } else {
      head_ = (head_ + 1) % capacity_;
    }
  }

  // batch samples, each a start step and environment drawn uniformly among those with nstep steps
  // stored after them; with a skipping reduction, a start whose episode ends before its nstep-th
  // step is drawn again. The return sums gamma^k r_k up to the episode's end (then d = 1), divided
  // by the number of steps (mean) or by the sum of their weights (weighted_mean).
  Batch sample(int64_t batch, at::Generator &gen) {
    torch::NoGradGuard no_grad;
    if (prioritized_) return sample_prioritized(batch, gen);
    const int64_t high = (size_ - nstep_ + 1) * n_envs_;
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor idx = at::randint(high, {batch}, gen, longs);
    if (skip_ && nstep_ > 1) {
      for (int round = 0;; ++round) {
        const at::Tensor bad = ends_early(idx).nonzero().reshape({-1});
        if (bad.numel() == 0) break;
        if (round == 1000)
          usage("the replay buffer holds no stretch of nstep=" + std::to_string(nstep_) + " steps without an episode "
                "end for " + std::to_string(bad.numel()) + " of " + std::to_string(batch) + " samples after 1000 "
                "draws: episodes are shorter than nstep (use a *_no_skip nstep_reward_reduction)");
        idx.index_put_({bad}, at::randint(high, {bad.numel()}, gen, longs));
      }
    }
    return gather(idx);
  }

  // batch samples drawn in proportion to p^alpha among the valid starts (nstep steps stored after
  // them and, with a skipping reduction, no episode end before the last), one in each of batch
  // equal strata of the total (Schaul et al.'s proportional variant), with importance weights
  // (P_min / P_i)^beta; beta grows by (beta_max - beta0) / beta_steps at each sampling first.
  Batch sample_prioritized(int64_t batch, at::Generator &gen) {
    beta_ = std::min(beta_max_, beta_ + beta_step_);
    const auto longs = at::TensorOptions().dtype(at::kLong);
    const auto doubles = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor order = (at::arange(size_, longs) + head_).remainder(capacity_);
    at::Tensor valid = at::zeros({size_, n_envs_}, at::TensorOptions().dtype(at::kBool));
    valid.slice(0, 0, size_ - nstep_ + 1).fill_(true);
    if (skip_ && nstep_ > 1) {
      const at::Tensor all = at::arange(size_ * n_envs_, longs);
      valid = valid.logical_and(ends_early(all).logical_not().reshape({size_, n_envs_}));
    }
    const at::Tensor weight =
        at::where(valid, priority_.index_select(0, order).pow(alpha_), at::zeros({}, doubles)).reshape({-1});
    const at::Tensor positive = weight.gt(0).nonzero().reshape({-1});
    if (positive.numel() == 0)
      usage("the prioritized replay buffer has no start to sample: " +
            std::string(skip_ && nstep_ > 1 ? "episodes are shorter than nstep (use a *_no_skip "
                                              "nstep_reward_reduction)"
                                            : "every priority is 0"));
    const at::Tensor cumulative = weight.cumsum(0);
    const double total = cumulative[-1].item<double>();
    const at::Tensor u = (at::arange(batch, doubles) + at::rand({batch}, gen, doubles)) * (total / batch);
    const at::Tensor idx = at::searchsorted(cumulative, u, /*out_int32=*/false, /*right=*/true)
                               .clamp_max(positive[-1].item<int64_t>());
    const at::Tensor chosen = weight.index_select(0, idx);
    const double smallest = weight.index_select(0, positive).min().item<double>();
    Batch b = gather(idx);
    b.w = (smallest / chosen).pow(beta_).to(device_, dtype_);
    return b;
  }

  // New priorities |td error| + 1e-6 of the samples at positions `where` (in order: a start
  // drawn twice keeps its last).
  void update_priorities(const at::Tensor &where, const at::Tensor &td) {
    if (!prioritized_) return;
    const at::Tensor p = td.detach().abs().to(at::kCPU, at::kDouble) + 1e-6;
    const auto w = where.accessor<int64_t, 1>();
    const auto v = p.accessor<double, 1>();
    auto prio = priority_.accessor<double, 2>();
    for (int64_t i = 0; i < w.size(0); ++i) {
      prio[w[i] / n_envs_][w[i] % n_envs_] = v[i];
      max_priority_ = std::max(max_priority_, v[i]);
    }
  }

  // The samples of start indices idx (step * n_envs + env over the stored steps, oldest first).
  Batch gather(const at::Tensor &idx) const {
    const int64_t batch = idx.size(0);
    const at::Tensor step_cpu = idx.div(n_envs_, "floor");
    const at::Tensor step = step_cpu.to(device_);
    const at::Tensor env = idx.remainder(n_envs_).to(device_);
    const at::Tensor p0 = (step + head_).remainder(capacity_);
    Batch b;
    b.where = (step_cpu + head_).remainder(capacity_) * n_envs_ + idx.remainder(n_envs_);
    b.s = s_.index({p0, env});
    b.a = a_.index({p0, env});
    b.sp = sp_.index({p0, env});
    at::Tensor ret = r_.index({p0, env});
    at::Tensor done = d_.index({p0, env});
    at::Tensor alive = done < 0.5;
    at::Tensor count = at::ones_like(ret), norm = at::ones_like(ret);
    for (int64_t k = 1; k < nstep_; ++k) {
      const at::Tensor pk = (step + (head_ + k)).remainder(capacity_);
      const double g = std::pow(gamma_, static_cast<double>(k));
      const at::Tensor rk = r_.index({pk, env}), dk = d_.index({pk, env});
      std::vector<int64_t> view(b.sp.dim(), 1);
      view[0] = batch;
      b.sp = at::where(alive.view(view), sp_.index({pk, env}), b.sp);
      ret = at::where(alive, ret + rk * g, ret);
      count = at::where(alive, count + 1.0, count);
      norm = at::where(alive, norm + g, norm);
      done = at::where(alive, dk, done);
      alive = alive.logical_and(dk < 0.5);
    }
    if (weighted_) {
      ret = ret / norm;
    } else if (mean_) {
      ret = ret / count;
    }
    b.r = ret;
    b.d = done;
    return b;
  }

  // The stored steps, oldest first.
  void save(const std::string &file) const {
    torch::serialize::OutputArchive archive;
    archive.write("size", c10::IValue(size_));
    if (size_ > 0) {
      const at::Tensor order = (at::arange(size_, at::TensorOptions().dtype(at::kLong)) + head_).remainder(capacity_);
      const at::Tensor o = order.to(device_);
      archive.write("s", s_.index_select(0, o).cpu());
      archive.write("a", a_.index_select(0, o).cpu());
      archive.write("sp", sp_.index_select(0, o).cpu());
      archive.write("r", r_.index_select(0, o).cpu());
      archive.write("d", d_.index_select(0, o).cpu());
      if (prioritized_) archive.write("priority", priority_.index_select(0, order));
    }
    if (prioritized_) {
      archive.write("max_priority", c10::IValue(max_priority_));
      archive.write("beta", c10::IValue(beta_));
    }
    archive.save_to(file);
  }

  void load(const std::string &file) {
    torch::serialize::InputArchive archive;
    archive.load_from(file);
    c10::IValue size;
    if (!archive.try_read("size", size)) usage(file + " is not a replay buffer (no size)");
    const int64_t n = size.toInt();
    if (n > capacity_)
      usage(file + " holds " + std::to_string(n) + " steps, more than this buffer's " + std::to_string(capacity_) +
            " (max_size/n_envs)");
    std::vector<at::Tensor> t(5);
    const char *keys[5] = {"s", "a", "sp", "r", "d"};
    if (n > 0)
      for (int i = 0; i < 5; ++i)
        if (!archive.try_read(keys[i], t[i])) usage(file + " is not a replay buffer (no " + keys[i] + ")");
    for (int i = 0; n > 0 && i < 5; ++i)
      if (t[i].dim() < 2 || t[i].size(0) != n || t[i].size(1) != n_envs_)
        usage(file + " holds transitions of " + shape_text(t[i]) + " for " + std::to_string(n_envs_) +
              " environments: it belongs to another system");
    at::Tensor priority;
    c10::IValue max_priority, beta;
    if (prioritized_ && ((n > 0 && !archive.try_read("priority", priority)) ||
                         !archive.try_read("max_priority", max_priority) || !archive.try_read("beta", beta)))
      usage(file + " holds a uniform replay buffer; this system's is prioritized");
    head_ = 0;
    size_ = 0;
    s_ = a_ = sp_ = r_ = d_ = d_cpu_ = priority_ = at::Tensor();
    for (int64_t i = 0; i < n; ++i) push(t[0][i], t[1][i], t[2][i], t[3][i], t[4][i]);
    if (prioritized_) {
      if (n > 0) priority_.slice(0, 0, n).copy_(priority);
      max_priority_ = max_priority.toDouble();
      beta_ = beta.toDouble();
    }
  }

 private:
  at::Tensor storage(const at::Tensor &like) const {
    std::vector<int64_t> sizes{capacity_};
    for (int64_t d : like.sizes()) sizes.push_back(d);
    return at::zeros(sizes, at::TensorOptions().dtype(dtype_).device(device_));
  }
  static void check(const at::Tensor &store, const at::Tensor &t, const char *what) {
    if (store.sizes().slice(1) != t.sizes())
      usage(std::string("the ") + what + " has shape " + shape_text(t) + ", but the replay buffer holds " +
            shape_text(store[0]) + " (as in the first transition; the first dimension is the environment)");
  }
  // Whether the episode of each start (index step*n_envs + env) ends before its nstep-th step.
  at::Tensor ends_early(const at::Tensor &idx) const {
    const at::Tensor step = idx.div(n_envs_, "floor"), env = idx.remainder(n_envs_);
    at::Tensor ended = at::zeros(idx.sizes(), at::TensorOptions().dtype(at::kBool));
    for (int64_t k = 0; k + 1 < nstep_; ++k)
      ended = ended.logical_or(d_cpu_.index({(step + (head_ + k)).remainder(capacity_), env}) > 0.5f);
    return ended;
  }

  int64_t n_envs_, capacity_, min_steps_, nstep_;
  double gamma_;
  torch::Device device_;
  c10::ScalarType dtype_;
  bool skip_ = true, mean_ = false, weighted_ = false;
  bool prioritized_ = false;
  double alpha_ = 0, beta_ = 0, beta_max_ = 0, beta_step_ = 0, max_priority_ = 1.0;
  int64_t head_ = 0, size_ = 0;
  at::Tensor s_, a_, sp_, r_, d_, d_cpu_;
  at::Tensor priority_;  // [capacity, n_envs], CPU double
};

// ---------------------------------------------------------------------------- systems

// TorchFort's default seed of a replay buffer's generator (std::mt19937's), plus the rank.
constexpr uint64_t kSamplerSeed = 5489;

struct System {
  std::string name;
  RLConfig cfg;
  torch::Device model_device{torch::kCPU}, rb_device{torch::kCPU};
  c10::ScalarType dtype = at::kFloat;
  Net policy, policy_target;
  std::vector<Net> critics, critic_targets;
  std::unique_ptr<ReplayBuffer> buffer;
  std::unique_ptr<Noise> noise_train, noise_explore;  // noise_train: TD3's target smoothing (not SAC)
  // SAC's entropy coefficient alpha = exp(log_alpha): off (alpha 0 without an optimizer), fixed, or tuned
  at::Tensor log_alpha;
  bool alpha_on = false;
  std::unique_ptr<RunningNormalizer> state_norm, reward_norm;  // normalize_states, normalize_rewards
  std::shared_ptr<ftc::Optim> alpha_optim;
  std::unique_ptr<Schedule> alpha_schedule;
  at::Generator sampler = at::make_generator<at::CPUGeneratorImpl>(kSamplerSeed);
  int64_t train_steps = 0;
  fs::path log_file;
  int rank = 0;
  std::unique_ptr<Ranks> ranks;  // a distributed system's
  std::mutex mutex;

  bool td3() const { return cfg.algorithm == "td3"; }
  bool sac() const { return cfg.algorithm == "sac"; }
  at::Tensor clamp(const at::Tensor &a) const { return a.clamp(cfg.actor.a_low, cfg.actor.a_high); }
  // SAC's actions: [a_low, a_high] <-> [-1, 1] (the policy's and the critics' scale)
  at::Tensor scale(const at::Tensor &a) const {
    return 2.0 * ((a - cfg.actor.a_low) / (cfg.actor.a_high - cfg.actor.a_low)) - 1.0;
  }
  at::Tensor unscale(const at::Tensor &a) const {
    return 0.5 * (cfg.actor.a_high - cfg.actor.a_low) * (a + 1.0) + cfg.actor.a_low;
  }
  // alpha * x (none when off); alpha is a constant here (its own loss trains it).
  at::Tensor entropy_term(const at::Tensor &log_prob) const {
    return alpha_on ? at::exp(log_alpha.detach()) * log_prob : at::zeros_like(log_prob);
  }
  at::Tensor input(const at::Tensor &t) const { return t.to(model_device, dtype); }
  // A state as the networks see it: normalized once the normalizer has statistics.
  at::Tensor state_in(const at::Tensor &t) const {
    const at::Tensor x = input(t);
    return state_norm && state_norm->initialized() ? (*state_norm)(x) : x;
  }
};

void train(System &sys, Net &net, const SchedulerConfig *schedule) {
  if (net.params.empty()) usage("a network of the system has no parameters to train");
  net.optim = make_optim(sys.cfg.optimizer, net.params, sys.cfg.filename);
  if (schedule) net.schedule = std::make_unique<Schedule>(*net.optim->opt, *schedule);
}

torch::jit::Module build(const NetConfig &n, const System &sys, const char *what) {
  if (n.type == "torchscript") return load_script(n.filename, sys.model_device, what, sys.cfg.filename);
  if (n.type == "sacmlp") {
    torch::jit::Module m = build_sac_mlp(n);
    m.to(sys.model_device);
    return m;
  }
  torch::jit::Module m = build_mlp(n.layer_sizes, n.dropout, n.flatten_non_batch_dims, n.type == "criticmlp");
  m.to(sys.model_device);
  return m;
}

std::shared_ptr<System> create_system(const char *name, const char *config_fname, int model_dev, int rb_dev) {
  if (name == nullptr || *name == '\0') usage("the system name is empty");
  if (config_fname == nullptr) usage("the configuration file name is a null pointer");
  auto sys = std::make_shared<System>();
  sys->name = name;
  sys->cfg = read_rl_config(config_fname);
  const RLConfig &c = sys->cfg;
  sys->model_device = model_device(model_dev);
  sys->rb_device = model_device(rb_dev);
  if (sys->model_device.is_cuda() && sys->rb_device.is_cuda() && sys->model_device != sys->rb_device)
    usage("model_device and rb_device are two different GPUs (" + std::to_string(model_dev) + ", " +
          std::to_string(rb_dev) + "): use one GPU, or the CPU for one of them");

  sys->policy.set(build(c.policy, *sys, "the policy model"));
  if (sys->policy.params.empty()) usage("the policy model has no parameters");
  sys->dtype = sys->policy.params[0].scalar_type();
  if (!at::isFloatingType(sys->dtype)) usage("the policy's parameters are not floating point");
  train(*sys, sys->policy, c.has_policy_scheduler ? &c.policy_scheduler : nullptr);
  if (!sys->sac()) make_target(sys->policy_target, sys->policy);  // (SAC has no target policy)

  sys->critics.resize(c.num_critics);
  sys->critic_targets.resize(c.num_critics);
  for (int64_t i = 0; i < c.num_critics; ++i) {
    Net &q = sys->critics[i];
    q.set(build(c.critic, *sys, "the critic model"));
    for (const auto &p : q.params)
      if (p.scalar_type() != sys->dtype)
        usage("the critic's parameters are " + ftc::dtype_name(p.scalar_type()) + ", the policy's " +
              ftc::dtype_name(sys->dtype) + ": both networks need one precision");
    init_critic(q);
    train(*sys, q, c.has_critic_scheduler ? &c.critic_scheduler : nullptr);
    make_target(sys->critic_targets[i], q);
  }
  sys->buffer = std::make_unique<ReplayBuffer>(c, sys->rb_device, sys->dtype);
  if (sys->td3()) sys->noise_train = std::make_unique<Noise>(c.actor, c.actor.sigma_train, c.actor.clip);
  if (!sys->sac()) sys->noise_explore = std::make_unique<Noise>(c.actor, c.actor.sigma_explore, 0.0);
  if (sys->sac()) {
    // alpha 0 turns the entropy term off, unless an optimizer tunes alpha (it then starts at 0.01)
    sys->alpha_on = c.alpha > 0 || c.has_alpha_optimizer;
    if (c.alpha == 0 && c.has_alpha_optimizer)
      std::cout << "TORCHFORT::WARN: " << sys->name << ": alpha_optimizer is configured but alpha is 0: alpha starts "
                   "at 0.01" << std::endl;
    const double alpha = c.alpha > 0 ? c.alpha : 0.01;
    sys->log_alpha = at::full({1}, std::log(alpha), at::TensorOptions().dtype(sys->dtype).device(sys->model_device))
                         .requires_grad_(true);
    if (c.has_alpha_optimizer) {
      sys->alpha_optim = make_optim(c.alpha_optimizer, {sys->log_alpha}, c.filename);
      if (c.has_alpha_scheduler) sys->alpha_schedule = std::make_unique<Schedule>(*sys->alpha_optim->opt, c.alpha_scheduler);
    }
  }
  if (c.normalize_states) sys->state_norm = std::make_unique<RunningNormalizer>(false);
  if (c.normalize_rewards) sys->reward_norm = std::make_unique<RunningNormalizer>(true);
  if (c.enable_wandb_hook) sys->log_file = wandb_log_file(sys->name, c.text);
  if (c.verbose)
    std::cout << "TORCHFORT::INFO: " << c.algorithm << " system " << sys->name << ": batch_size " << c.batch_size
              << ", nstep " << c.nstep << " (" << c.nstep_reward_reduction << "), gamma " << c.gamma << ", rho "
              << c.rho << ", critics " << c.num_critics << ", policy_lag " << c.policy_lag << ", actions in ["
              << c.actor.a_low << ", " << c.actor.a_high << "], " << c.actor.type << ", replay buffer "
              << c.replay_buffer.max_size << " transitions (ready at " << c.replay_buffer.min_size << "), "
              << ftc::dtype_name(sys->dtype) << std::endl;
  return sys;
}

// Makes a new system distributed over ranks (see Ranks): rank 0's networks everywhere, the
// targets restarted from them, each rank's sampler seeded apart.
void distribute(System &sys, std::unique_ptr<Ranks> ranks) {
  sys.ranks = std::move(ranks);
  sys.rank = sys.ranks->rank;
  sys.sampler.set_current_seed(kSamplerSeed + static_cast<uint64_t>(sys.rank));
  sys.ranks->attach(sys.policy.module, sys.policy.optim);
  for (Net &q : sys.critics) sys.ranks->attach(q.module, q.optim);
  if (sys.alpha_optim) {
    torch::jit::Module alpha(c10::QualifiedName("__torch__.torchfort.Alpha"));
    alpha.register_parameter("log_alpha", sys.log_alpha, false);
    sys.ranks->attach(alpha, sys.alpha_optim);
  }
  if (!sys.sac()) make_target(sys.policy_target, sys.policy);
  for (size_t i = 0; i < sys.critics.size(); ++i) make_target(sys.critic_targets[i], sys.critics[i]);
}

void report(System &sys, const char *model, const Net &net, double loss) {
  if (sys.cfg.report_frequency <= 0 || net.step_train % sys.cfg.report_frequency != 0 || sys.rank != 0) return;
  const double lr = net.optim->opt->param_groups().at(0).options().get_lr();
  std::cout << "TORCHFORT::INFO: model: " << model << ", step_train: " << net.step_train
            << ", loss: " << static_cast<float>(loss) << ", lr: " << lr << std::endl;
  if (!sys.log_file.empty()) {
    const std::string who = std::string(model) == "critic" ? "critic_0" : "actor";
    write_step_metric(sys.log_file, who, "train_loss", net.step_train, number_text(static_cast<float>(loss)));
    write_step_metric(sys.log_file, who, "train_lr", net.step_train, number_text(lr));
  }
}

// Clipping, the optimizer's and the schedule's step when the accumulation is complete.
bool update(System &sys, Net &net) {
  const bool step = (net.step_current + 1) % sys.cfg.grad_accumulation_steps == 0;
  if (step) {
    ftc::before_update(*net.optim);  // (distributed: the gradients averaged over the ranks)
    if (sys.cfg.max_grad_norm > 0) clip_grad_norm(net.params, sys.cfg.max_grad_norm);
    optimizer_step(*net.optim->opt);
    ftc::after_update(*net.optim);
    ++net.optim->steps;
    if (net.schedule) net.schedule->step();
  }
  ++net.step_train;
  ++net.step_current;
  return step;
}

void zero_grad_if_starting(System &sys, Net &net) {
  if (net.step_current % sys.cfg.grad_accumulation_steps == 0) net.optim->opt->zero_grad(/*set_to_none=*/true);
}

// The first n critics without gradients while the policy trains through them (restored however
// the update ends).
struct FrozenCritics {
  std::vector<Net> &nets;
  size_t n;
  FrozenCritics(std::vector<Net> &critics, size_t count) : nets(critics), n(count) {
    for (size_t i = 0; i < n; ++i) set_requires_grad(nets[i], false);
  }
  ~FrozenCritics() {
    for (size_t i = 0; i < n; ++i) set_requires_grad(nets[i], true);
  }
};

// The critics' step towards targets y: the sum of their mean squared errors (weighted by the
// importance weights of a prioritized buffer; the mean over the critics reported). The first
// critic's errors become the samples' new priorities.
float train_critics(System &sys, const ReplayBuffer::Batch &b, const at::Tensor &y) {
  const at::Tensor &s = b.s, &a = b.a;
  at::Tensor loss;
  for (Net &q : sys.critics) {
    q.module.train();
    zero_grad_if_starting(sys, q);
  }
  std::vector<ftc::Optim *> optims;
  for (Net &q : sys.critics) optims.push_back(q.optim.get());
  at::Tensor first_error;
  const double total = averaged(optims, [&] {
    for (Net &q : sys.critics) {
      const at::Tensor error = q_value(q, s, a) - y;
      if (&q == &sys.critics[0]) first_error = error;
      const at::Tensor l = b.w.defined() ? at::mean(b.w * at::square(error)) : at::mean(at::square(error));
      loss = loss.defined() ? loss + l : l;
    }
    const double value = finite_loss(loss, "critic loss", sys.train_steps, sys.alpha_optim ? "SAC's alpha" : "");
    loss.backward();
    return value;
  });
  // Only the errors of a step that succeeded on every rank become priorities: a NaN or infinite
  // loss's would make every later batch of a prioritized buffer copies of one transition.
  sys.buffer->update_priorities(b.where, first_error);
  const float q_loss = static_cast<float>(total / static_cast<double>(sys.critics.size()));
  for (Net &q : sys.critics) update(sys, q);
  report(sys, "critic", sys.critics[0], q_loss);
  return q_loss;
}

// The minimum of the critics' (or their targets') values.
at::Tensor min_q(std::vector<Net> &critics, const at::Tensor &s, const at::Tensor &a) {
  at::Tensor q = q_value(critics[0], s, a);
  for (size_t i = 1; i < critics.size(); ++i) q = at::minimum(q, q_value(critics[i], s, a));
  return q;
}

// DDPG and TD3.
void train_deterministic(System &sys, const ReplayBuffer::Batch &b, float &p_loss, float &q_loss) {
  const RLConfig &c = sys.cfg;
  const bool update_policy = sys.train_steps % c.policy_lag == 0;
  const at::Tensor &s = b.s, &a = b.a, &sp = b.sp, &r = b.r, &d = b.d;
  // Targets: y = r + gamma^nstep (1 - d) min_i Q'_i(s', a'), a' from the target policy (TD3: with
  // clipped noise).
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    at::Tensor ap = sys.td3() ? (*sys.noise_train)(sys.policy_target, sp) : forward(sys.policy_target, {sp});
    ap = sys.clamp(ap);
    const at::Tensor q_next = min_q(sys.critic_targets, sp, ap);
    y = r + q_next * std::pow(c.gamma, static_cast<double>(c.nstep)) * (1.0 - d);
  }
  q_loss = train_critics(sys, b, y);

  // Policy: maximise the first critic's value of its actions.
  p_loss = 0;
  if (update_policy) {
    Net &pi = sys.policy;
    bool stepped;
    {
      FrozenCritics frozen(sys.critics, 1);
      pi.module.train();
      zero_grad_if_starting(sys, pi);
      p_loss = static_cast<float>(averaged({pi.optim.get()}, [&] {
        const at::Tensor pl = -at::mean(q_value(sys.critics[0], s, forward(pi, {s})));
        const double value = finite_loss(pl, "policy loss", sys.train_steps, "the critics");
        pl.backward();
        return value;
      }));
      stepped = update(sys, pi);
    }
    if (stepped) {
      for (size_t i = 0; i < sys.critics.size(); ++i) polyak(sys.critic_targets[i], sys.critics[i], c.rho);
      polyak(sys.policy_target, sys.policy, c.rho);
    }
    report(sys, "actor", pi, p_loss);
  }
}

// SAC: alpha's step (when tuned), the critics' towards soft targets, the policy's, the critics'
// targets' Polyak update. Actions are in the policy's scale [-1, 1].
void train_sac(System &sys, const ReplayBuffer::Batch &b, float &p_loss, float &q_loss) {
  const RLConfig &c = sys.cfg;
  const at::Tensor &s = b.s, &a = b.a, &sp = b.sp, &r = b.r, &d = b.d;
  Net &pi = sys.policy;
  if (sys.alpha_optim) {
    // alpha towards the target entropy: minimise -log_alpha (log pi(a|s) + target)
    torch::optim::Optimizer &opt = *sys.alpha_optim->opt;
    if (pi.step_current % c.grad_accumulation_steps == 0) opt.zero_grad(/*set_to_none=*/true);
    double target = c.target_entropy;
    if (target > 0) target = -static_cast<double>(a[0].numel());  // the usual heuristic: -(action size)
    at::Tensor log_prob;
    {
      torch::NoGradGuard no_grad;
      log_prob = squashed_gaussian(pi, s).log_prob + target;
    }
    averaged({sys.alpha_optim.get()}, [&] {
      const at::Tensor alpha_loss = -at::mean(sys.log_alpha * log_prob);
      const double value = finite_loss(alpha_loss, "alpha loss (SAC's entropy tuning)", sys.train_steps);
      alpha_loss.backward();
      return value;
    });
    if ((pi.step_current + 1) % c.grad_accumulation_steps == 0) {
      ftc::before_update(*sys.alpha_optim);
      optimizer_step(opt);
      ftc::after_update(*sys.alpha_optim);
      ++sys.alpha_optim->steps;
      if (sys.alpha_schedule) sys.alpha_schedule->step();
    }
  }
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    const Draw next = squashed_gaussian(pi, sp);
    const at::Tensor q_next = min_q(sys.critic_targets, sp, next.action) - sys.entropy_term(next.log_prob);
    y = r + q_next * std::pow(c.gamma, static_cast<double>(c.nstep)) * (1.0 - d);
  }
  q_loss = train_critics(sys, b, y);

  bool stepped;
  {
    FrozenCritics frozen(sys.critics, sys.critics.size());
    pi.module.train();
    zero_grad_if_starting(sys, pi);
    p_loss = static_cast<float>(averaged({pi.optim.get()}, [&] {
      const Draw now = squashed_gaussian(pi, s);
      const at::Tensor pl = -at::mean(min_q(sys.critics, s, now.action) - sys.entropy_term(now.log_prob));
      const double value = finite_loss(pl, "policy loss", sys.train_steps,
                                       sys.alpha_optim ? "SAC's alpha and the critics" : "the critics");
      pl.backward();
      return value;
    }));
    stepped = update(sys, pi);
  }
  if (stepped)
    for (size_t i = 0; i < sys.critics.size(); ++i) polyak(sys.critic_targets[i], sys.critics[i], c.rho);
  report(sys, "actor", pi, p_loss);
}

void train_step(System &sys, float &p_loss, float &q_loss) {
  together(sys.ranks.get(), "to start the train step", [&] {
    if (!sys.buffer->ready())
      usage("the replay buffer holds " + std::to_string(sys.buffer->size()) + " steps; training needs " +
            std::to_string(sys.buffer->needed()) + " (min_size/n_envs, and nstep): call "
            "torchfort_rl_off_policy_is_ready before training");
  });
  ++sys.train_steps;
  ReplayBuffer::Batch b = sys.buffer->sample(sys.cfg.batch_size, sys.sampler);
  // On the model's device, states and rewards normalized with the statistics of everything the
  // buffer received so far.
  b.s = sys.state_in(b.s);
  b.sp = sys.state_in(b.sp);
  b.a = sys.input(b.a);
  b.r = sys.input(b.r);
  b.d = sys.input(b.d);
  if (b.w.defined()) b.w = sys.input(b.w);  // (importance weights, made where the buffer is)
  if (sys.reward_norm) b.r = (*sys.reward_norm)(b.r.unsqueeze(1)).squeeze(1);
  if (sys.sac()) {
    train_sac(sys, b, p_loss, q_loss);
  } else {
    train_deterministic(sys, b, p_loss, q_loss);
  }
}

// ---------------------------------------------------------------------------- checkpoints


std::vector<std::pair<std::string, Net *>> nets(System &sys) {
  std::vector<std::pair<std::string, Net *>> out{{"policy", &sys.policy}};
  if (!sys.sac()) out.emplace_back("policy_target", &sys.policy_target);
  for (size_t i = 0; i < sys.critics.size(); ++i) {
    out.emplace_back("critic_" + std::to_string(i), &sys.critics[i]);
    out.emplace_back("critic_target_" + std::to_string(i), &sys.critic_targets[i]);
  }
  return out;
}

void write_noise(torch::serialize::OutputArchive &archive, const std::string &key, const Noise *noise) {
  if (noise == nullptr) return;
  archive.write(key + "_initialized", c10::IValue(noise->initialized()));
  archive.write(key + "_state", c10::IValue(c10::List<at::Tensor>(noise->state())));
}

void read_noise(torch::serialize::InputArchive &archive, const std::string &key, Noise *noise,
                const std::string &file) {
  if (noise == nullptr) return;
  c10::IValue initialized, state;
  if (!archive.try_read(key + "_initialized", initialized) || !archive.try_read(key + "_state", state))
    usage(file + " has no state of the " + key + " noise: it belongs to another kind of system");
  std::vector<at::Tensor> tensors;
  for (const at::Tensor &t : state.toTensorVector()) tensors.push_back(t);
  noise->restore(std::move(tensors), initialized.toBool());
}

void save_checkpoint(System &sys, const fs::path &dir) {
  fs::create_directories(dir);
  for (auto &[sub, net] : nets(sys)) save_net(*net, dir / sub);
  fs::create_directories(dir / "replay_buffer");
  write_atomically(dir / "replay_buffer" / "buffer.pt", [&](const std::string &f) { sys.buffer->save(f); });
  write_atomically(dir / "state.pt", [&](const std::string &f) {
    torch::serialize::OutputArchive archive;
    archive.write("algorithm", c10::IValue(sys.cfg.algorithm));
    archive.write("num_critics", c10::IValue(static_cast<int64_t>(sys.critics.size())));
    archive.write("train_steps", c10::IValue(sys.train_steps));
    for (auto &[sub, net] : nets(sys)) {
      archive.write(sub + "_step_train", c10::IValue(net->step_train));
      archive.write(sub + "_step_current", c10::IValue(net->step_current));
    }
    {
      std::lock_guard<std::mutex> lock(sys.sampler.mutex());
      archive.write("sampler", sys.sampler.get_state());
    }
    // The default generators (the noise draws, SAC's and PPO's samples): resumed bit for bit.
    ftc::write_rng_states(archive, "rng.", ftc::rng_states());
    write_noise(archive, "noise_train", sys.noise_train.get());
    write_noise(archive, "noise_explore", sys.noise_explore.get());
    if (sys.sac()) archive.write("log_alpha", sys.log_alpha.detach().cpu());
    if (sys.sac() && sys.log_alpha.grad().defined()) archive.write("log_alpha_grad", sys.log_alpha.grad().cpu());
    if (sys.state_norm) sys.state_norm->write(archive, "state_normalizer");
    if (sys.reward_norm) sys.reward_norm->write(archive, "reward_normalizer");
    archive.save_to(f);
  });
  if (sys.alpha_optim) {
    fs::create_directories(dir / "alpha");
    write_atomically(dir / "alpha" / "optimizer.pt", [&](const std::string &f) { torch::save(*sys.alpha_optim->opt, f); });
    if (sys.alpha_schedule)
      write_atomically(dir / "alpha" / "lr.pt", [&](const std::string &f) { sys.alpha_schedule->save(f); });
  }
}

void load_checkpoint(System &sys, const fs::path &dir, const std::function<void()> &checked) {
  if (!fs::is_directory(dir)) usage("the checkpoint directory " + dir.string() + " does not exist");
  const fs::path state_file = dir / "state.pt";
  require_file(state_file);
  require_file(dir / "replay_buffer" / "buffer.pt");
  torch::serialize::InputArchive archive;
  archive.load_from(state_file.string());
  c10::IValue algorithm, critics;
  if (!archive.try_read("algorithm", algorithm) || !archive.try_read("num_critics", critics))
    usage(state_file.string() + " is not the state of an off-policy system");
  if (algorithm.toStringRef() != sys.cfg.algorithm || critics.toInt() != static_cast<int64_t>(sys.critics.size()))
    usage("the checkpoint holds a " + algorithm.toStringRef() + " system with " + std::to_string(critics.toInt()) +
          " critics; this one is " + sys.cfg.algorithm + " with " + std::to_string(sys.critics.size()));
  // Every file is read and checked before anything of the system changes.
  std::vector<torch::jit::Module> modules;
  for (auto &[sub, net] : nets(sys)) {
    require_file(dir / sub / "model.pt");
    if (net->optim) require_file(dir / sub / "optimizer.pt");
    if (net->schedule) require_file(dir / sub / "lr.pt");
    modules.push_back(load_script((dir / sub / "model.pt").string(), sys.model_device, "the checkpoint's network"));
    torch::NoGradGuard no_grad;
    torch::jit::Module probe = net->module.clone();
    copy_state(probe, modules.back(), (dir / sub / "model.pt").string());
  }
  ReplayBuffer buffer = *sys.buffer;
  buffer.load((dir / "replay_buffer" / "buffer.pt").string());
  c10::IValue train_steps, sampler;
  if (!archive.try_read("train_steps", train_steps) || !archive.try_read("sampler", sampler))
    usage(state_file.string() + " is not the state of an off-policy system");
  at::Tensor log_alpha;
  if (sys.sac() && !archive.try_read("log_alpha", log_alpha))
    usage(state_file.string() + " has no log_alpha: it is not the state of a SAC system");
  RunningNormalizer state_norm(false), reward_norm(true);
  if (sys.state_norm) state_norm.read(archive, "state_normalizer", state_file.string());
  if (sys.reward_norm) reward_norm.read(archive, "reward_normalizer", state_file.string());
  if (sys.alpha_optim) {
    require_file(dir / "alpha" / "optimizer.pt");
    if (sys.alpha_schedule) require_file(dir / "alpha" / "lr.pt");
  }
  const auto rng = ftc::read_rng_states(archive, "rng.", state_file.string());  // (none before it was kept)
  checked();
  if (rng) ftc::set_rng_states(*rng);

  size_t i = 0;
  for (auto &[sub, net] : nets(sys)) {
    copy_state(net->module, modules[i++], (dir / sub / "model.pt").string());
    if (net->optim) ftc::load_optimizer_state(*net->optim->opt, (dir / sub / "optimizer.pt").string(), sys.model_device);
    if (net->optim) load_grads(net->params, dir / sub / "grads.pt");
    if (net->schedule) net->schedule->load((dir / sub / "lr.pt").string());
    c10::IValue st, sc;
    if (archive.try_read(sub + "_step_train", st)) net->step_train = st.toInt();
    if (archive.try_read(sub + "_step_current", sc)) net->step_current = sc.toInt();
  }
  *sys.buffer = std::move(buffer);
  sys.train_steps = train_steps.toInt();
  {
    std::lock_guard<std::mutex> lock(sys.sampler.mutex());
    sys.sampler.set_state(sampler.toTensor());
  }
  read_noise(archive, "noise_train", sys.noise_train.get(), state_file.string());
  read_noise(archive, "noise_explore", sys.noise_explore.get(), state_file.string());
  if (sys.sac()) {
    torch::NoGradGuard no_grad;
    sys.log_alpha.copy_(log_alpha.reshape(sys.log_alpha.sizes()));
    at::Tensor grad;
    sys.log_alpha.mutable_grad() = archive.try_read("log_alpha_grad", grad)
                                       ? grad.to(sys.log_alpha.device(), sys.log_alpha.scalar_type())
                                       : at::Tensor();
  }
  if (sys.state_norm) *sys.state_norm = state_norm;
  if (sys.reward_norm) *sys.reward_norm = reward_norm;
  if (sys.alpha_optim) {
    ftc::load_optimizer_state(*sys.alpha_optim->opt, (dir / "alpha" / "optimizer.pt").string(), sys.model_device);
    if (sys.alpha_schedule) sys.alpha_schedule->load((dir / "alpha" / "lr.pt").string());
  }
}

void load_model(System &sys, const fs::path &dir, const std::function<void()> &checked) {
  std::vector<std::pair<Net *, torch::jit::Module>> loaded;
  auto read = [&](Net &net, const fs::path &sub) {
    require_file(dir / sub / "model.pt");
    torch::jit::Module m = load_script((dir / sub / "model.pt").string(), sys.model_device, "the network");
    torch::NoGradGuard no_grad;
    torch::jit::Module probe = net.module.clone();
    copy_state(probe, m, (dir / sub / "model.pt").string());
    loaded.emplace_back(&net, std::move(m));
  };
  read(sys.policy, "policy");
  for (size_t i = 0; i < sys.critics.size(); ++i) read(sys.critics[i], "critic_" + std::to_string(i));
  auto statistics = model_state_statistics(dir, sys.state_norm != nullptr);
  checked();
  for (auto &[net, m] : loaded) copy_state(net->module, m, dir.string());
  if (statistics) *sys.state_norm = std::move(*statistics);
  torch::NoGradGuard no_grad;
  auto copy = [](Net &to, const Net &from) {
    for (size_t i = 0; i < to.params.size(); ++i) to.params[i].copy_(from.params[i]);
  };
  if (!sys.sac()) copy(sys.policy_target, sys.policy);
  for (size_t i = 0; i < sys.critics.size(); ++i) copy(sys.critic_targets[i], sys.critics[i]);
}

// ---------------------------------------------------------------------------- registry

Systems<System> systems("off-policy", "torchfort_rl_off_policy_create_system");

// ---------------------------------------------------------------------------- arrays

// The policy's actions for a batch of states (predict_arrays).
at::Tensor action_of(System &sys, const at::Tensor &x, bool explore) {
  sys.policy.module.eval();
  if (sys.sac())  // the mean action, or a draw of the policy, in [a_low, a_high]
    return sys.unscale(explore ? squashed_gaussian(sys.policy, x).action : at::tanh(forward(sys.policy, {x})));
  return sys.clamp(explore ? (*sys.noise_explore)(sys.policy, x) : forward(sys.policy, {x}));
}

// The first critic's value of each (state, action) pair (evaluate_arrays).
at::Tensor value_of(System &sys, const at::Tensor &x, const at::Tensor &a) {
  Net &q = sys.critics[0];
  q.module.eval();
  at::Tensor act = sys.input(a);
  if (sys.sac()) act = sys.scale(act);  // (SAC's critics see actions in [-1, 1])
  return q_value(q, x, act);
}

// One transition per environment into the buffer (s, a, sp with the environment first).
void push(System &sys, const at::Tensor &s, const at::Tensor &sp, const at::Tensor &a, const at::Tensor &r,
          const at::Tensor &d) {
  const int64_t n = sys.buffer->n_envs();
  if (s.size(0) != n || a.size(0) != n || r.numel() != n || d.numel() != n)
    usage("the system has " + std::to_string(n) + " environments (replay_buffer n_envs); the state is " +
          shape_text(s) + ", the action " + shape_text(a) + ", the reward " + std::to_string(r.numel()) +
          " and final_state " + std::to_string(d.numel()) + " values" +
          (n > 1 ? " (use torchfort_rl_off_policy_update_replay_buffer_multi with the environment as the batch "
                   "dimension)"
                 : ""));
  torch::NoGradGuard no_grad;
  const at::Tensor states = finite_values(s, sys.dtype, "state_old"), next = finite_values(sp, sys.dtype, "state_new"),
                   actions = finite_values(a, sys.dtype, "action_old"), rewards = finite_values(r, sys.dtype, "reward"),
                   done = finite_values(d, sys.dtype, "final_state");
  const auto to = [&](const at::Tensor &t) { return t.to(sys.rb_device); };
  sys.buffer->push(to(states), sys.sac() ? sys.scale(to(actions)) : to(actions), to(next), to(rewards), to(done));
  if (sys.state_norm) sys.state_norm->update(states);
  if (sys.reward_norm) sys.reward_norm->update(rewards.reshape({n, 1}));
}

torchfort_result_t update_arrays(const char *fn, const char *name, void *state_old, void *state_new, size_t state_dim,
                                 int64_t *state_shape, void *action_old, size_t action_dim, int64_t *action_shape,
                                 const void *reward, bool final_state, torchfort_datatype_t dtype, cudaStream_t stream,
                                 bool fortran) {
  return systems.with(fn, name, [&](System &sys) {
    const at::Tensor s = wrap(state_old, state_dim, state_shape, dtype, fortran, "state_old", true);
    const at::Tensor sp = wrap(state_new, state_dim, state_shape, dtype, fortran, "state_new", true);
    const at::Tensor a = wrap(action_old, action_dim, action_shape, dtype, fortran, "action_old", true);
    if (reward == nullptr) usage("reward is a null pointer");
    const at::Tensor r = wrap(const_cast<void *>(reward), 0, nullptr, dtype, fortran, "reward", true).reshape({1});
    const at::Tensor d = at::full({1}, final_state ? 1.0 : 0.0, at::TensorOptions().dtype(sys.dtype));
    StreamScope scope(sys.rb_device, stream);
    push(sys, s.unsqueeze(0), sp.unsqueeze(0), a.unsqueeze(0), r, d);
  });
}

torchfort_result_t update_multi_arrays(const char *fn, const char *name, void *state_old, void *state_new,
                                       size_t state_dim, int64_t *state_shape, void *action_old, size_t action_dim,
                                       int64_t *action_shape, void *reward, size_t reward_dim, int64_t *reward_shape,
                                       void *final_state, size_t final_state_dim, int64_t *final_state_shape,
                                       torchfort_datatype_t dtype, cudaStream_t stream, bool fortran) {
  return systems.with(fn, name, [&](System &sys) {
    const at::Tensor s = wrap(state_old, state_dim, state_shape, dtype, fortran, "state_old", true);
    const at::Tensor sp = wrap(state_new, state_dim, state_shape, dtype, fortran, "state_new", true);
    const at::Tensor a = wrap(action_old, action_dim, action_shape, dtype, fortran, "action_old", true);
    const at::Tensor r = wrap(reward, reward_dim, reward_shape, dtype, fortran, "reward", true);
    const at::Tensor d = wrap(final_state, final_state_dim, final_state_shape, dtype, fortran, "final_state", true);
    if (s.dim() == 0 || a.dim() == 0) usage("state_old and action_old need the environment dimension");
    StreamScope scope(sys.rb_device, stream);
    push(sys, s, sp, a, r.reshape({-1}), done_flags(d, sys.dtype));
  });
}

}  // namespace rl
}  // namespace tf

// ---------------------------------------------------------------------------- the C API

using namespace tf;
using namespace tf::rl;

TORCHFORT_RL_SHARED_ENTRY_POINTS(off_policy, tf::rl)

TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_off_policy_update_replay_buffer,
                          (const char *name, void *state_old, void *state_new, size_t state_dim, int64_t *state_shape,
                           void *action_old, size_t action_dim, int64_t *action_shape, const void *reward,
                           bool final_state, torchfort_datatype_t dtype, cudaStream_t stream),
                          update_arrays,
                          (name, state_old, state_new, state_dim, state_shape, action_old, action_dim, action_shape,
                           reward, final_state, dtype, stream))
TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_off_policy_update_replay_buffer_multi,
                          (const char *name, void *state_old, void *state_new, size_t state_dim, int64_t *state_shape,
                           void *action_old, size_t action_dim, int64_t *action_shape, void *reward, size_t reward_dim,
                           int64_t *reward_shape, void *final_state, size_t final_state_dim,
                           int64_t *final_state_shape, torchfort_datatype_t dtype, cudaStream_t stream),
                          update_multi_arrays,
                          (name, state_old, state_new, state_dim, state_shape, action_old, action_dim, action_shape,
                           reward, reward_dim, reward_shape, final_state, final_state_dim, final_state_shape, dtype,
                           stream))
