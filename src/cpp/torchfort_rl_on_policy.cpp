// torchfort_rl_on_policy.cpp - TorchFort's on-policy reinforcement-learning API (the
// torchfort_rl_on_policy_* functions of torchfort_rl.h) over LibTorch: PPO systems by name,
// configured in YAML (torchfort_rl_config.cpp), an actor-critic network with a Gaussian policy
// (clipped or tanh-squashed), a rollout buffer with generalized advantage estimation, minibatch
// epochs, checkpoints that resume bit for bit.
//
// The algorithm follows its publications (PPO with the clipped objective: Schulman et al. 2017;
// GAE: Schulman et al. 2016) and TorchFort's configuration; where TorchFort's implementation departs
// from them (the last step of a rollout bootstrapped with the done flag of the step after it,
// log_sigma_init ignored, an epoch reshuffled after n_steps instead of n_steps * n_envs samples) the
// publications are followed. docs/guide/reinforcement-learning.md states each rule.
#include "torchfort_rl_common.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "torchfort_rl.h"
#include "torchfort_rl_config.hpp"

namespace tf {
namespace rl {
namespace on_policy {

// ---------------------------------------------------------------------------- the network

// TorchFort's ActorCriticMLP as a TorchScript module: encoder_fc_<i> (+ encoder_b_<i>, ReLU,
// dropout); the actor actor_fc_entry, actor_fc_<i> (tanh, dropout) and actor_fc_mu (the means, and
// the log standard deviations when they depend on the state; otherwise actor_b_log_sigma, started
// at log_sigma_init); the value value_fc_entry, value_fc_<i> (tanh, dropout; the last linear).
// forward returns (means, log standard deviations, values).
torch::jit::Module build_actor_critic(const ActorCriticConfig &m) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module root(c10::QualifiedName("__torch__.torchfort.ActorCriticMLP"), cu, /*shouldMangle=*/true);
  root.register_attribute("training", c10::BoolType::get(), true);
  root.register_attribute("dropout", c10::FloatType::get(), m.dropout);
  auto layer = [&](const std::string &fc, const std::string &bias, int64_t in, int64_t out, double bias_value) {
    torch::nn::Linear l(in, out);
    torch::jit::Module sub(c10::QualifiedName("__torch__.torchfort.Linear"), cu, /*shouldMangle=*/true);
    sub.register_attribute("training", c10::BoolType::get(), true);
    sub.register_parameter("weight", l->weight.detach().requires_grad_(true), false);
    sub.register_parameter("bias", l->bias.detach().requires_grad_(true), false);
    sub.define("def forward(self, x):\n    return torch.linear(x, self.weight, self.bias)\n");
    root.register_module(fc, sub);
    root.register_parameter(bias, (torch::ones({out}) * bias_value).requires_grad_(true), false);
  };
  const auto &enc = m.encoder_layer_sizes, &act = m.actor_layer_sizes, &val = m.value_layer_sizes;
  const int64_t width = enc.back(), na = act.back();
  std::ostringstream src;
  src << "def forward(self, state):\n"
      << "    if state.dim() == 1:\n        state = state.unsqueeze(0)\n"
      << "    x = state.reshape([state.size(0), -1])\n";
  for (size_t i = 0; i + 1 < enc.size(); ++i) {
    const std::string k = std::to_string(i);
    layer("encoder_fc_" + k, "encoder_b_" + k, enc[i], enc[i + 1], 0.0);
    src << "    x = torch.dropout(torch.relu(torch.linear(x, self.encoder_fc_" << k << ".weight, self.encoder_fc_" << k << ".bias) + self.encoder_b_" << k
        << "), self.dropout, self.training)\n";
  }
  layer("actor_fc_entry", "actor_b_entry", width, act[0], 0.0);
  src << "    a = torch.dropout(torch.tanh(torch.linear(x, self.actor_fc_entry.weight, self.actor_fc_entry.bias) + self.actor_b_entry), self.dropout, "
         "self.training)\n";
  for (size_t i = 0; i + 2 < act.size(); ++i) {
    const std::string k = std::to_string(i);
    layer("actor_fc_" + k, "actor_b_" + k, act[i], act[i + 1], 0.0);
    src << "    a = torch.dropout(torch.tanh(torch.linear(a, self.actor_fc_" << k << ".weight, self.actor_fc_" << k << ".bias) + self.actor_b_" << k
        << "), self.dropout, self.training)\n";
  }
  const int64_t last = act[act.size() - 2];
  if (m.state_dependent_sigma) {
    layer("actor_fc_mu", "actor_b_mu", last, 2 * na, 0.0);
    src << "    mu_sigma = torch.linear(a, self.actor_fc_mu.weight, self.actor_fc_mu.bias) + self.actor_b_mu\n"
        << "    mu = mu_sigma[:, :" << na << "]\n    log_sigma = mu_sigma[:, " << na << ":]\n";
  } else {
    layer("actor_fc_mu", "actor_b_mu", last, na, 0.0);
    root.register_parameter("actor_b_log_sigma", (torch::ones({na}) * m.log_sigma_init).requires_grad_(true), false);
    src << "    mu = torch.linear(a, self.actor_fc_mu.weight, self.actor_fc_mu.bias) + self.actor_b_mu\n"
        << "    log_sigma = self.actor_b_log_sigma.expand([mu.size(0), " << na << "])\n";
  }
  layer("value_fc_entry", "value_b_entry", width, val[0], 0.0);
  src << "    q = torch.linear(x, self.value_fc_entry.weight, self.value_fc_entry.bias) + self.value_b_entry\n";
  for (size_t i = 0; i + 1 < val.size(); ++i) {
    const std::string k = std::to_string(i);
    layer("value_fc_" + k, "value_b_" + k, val[i], val[i + 1], 0.0);
    src << "    q = torch.linear(torch.dropout(torch.tanh(q), self.dropout, self.training), self.value_fc_" << k
        << ".weight, self.value_fc_" << k << ".bias) + self.value_b_" << k << "\n";
  }
  src << "    return (mu, log_sigma, q)\n";
  root.define(src.str());
  return root;
}

// The policy and value of states: means, standard deviations (exp of the log standard deviations
// clipped to [-20, 2], as large as the means) and one value per sample.
struct Outputs {
  at::Tensor mu, sigma, value;
};

Outputs run(Net &net, const at::Tensor &state) {
  const std::vector<at::Tensor> out = forward_all(net, {state});
  if (out.size() < 3)
    usage("the actor-critic model must return (action means, log standard deviations, values); it returns " +
          std::to_string(out.size()) + " tensors");
  Outputs o;
  o.mu = out[0];
  o.sigma = at::exp(at::clamp(out[1], -20.0, 2.0)).expand_as(o.mu);
  const int64_t n = state.size(0);
  if (out[2].numel() != n)
    usage("the actor-critic model returns " + shape_text(out[2]) + " values for " + std::to_string(n) +
          " states: one per sample is needed");
  o.value = out[2].reshape({n});
  return o;
}

// ---------------------------------------------------------------------------- rollout buffer

// size/n_envs steps of n_envs environments, with the policy's value and log-probability of each
// action when it was given. Once full, the next transition's value closes the rollout: generalized
// advantage estimates and returns are computed, and minibatches are drawn without replacement
// (an epoch: every sample once, in an order drawn from the system's generator).
class RolloutBuffer {
 public:
  struct Batch {
    at::Tensor s, a, value, log_prob, advantage, ret;
  };

  RolloutBuffer(const PPOConfig &c, const torch::Device &device, c10::ScalarType dtype)
      : steps_(c.size / c.n_envs), n_envs_(c.n_envs), gamma_(c.gamma), lambda_(c.gae_lambda), device_(device),
        dtype_(dtype) {}

  int64_t n_envs() const { return n_envs_; }
  int64_t count() const { return count_; }
  int64_t steps() const { return steps_; }
  bool ready() const { return finalized_; }

  // One step of every environment (the environment first). When the buffer is full, the values
  // close the rollout instead (the transition itself is not kept).
  void push(const at::Tensor &s, const at::Tensor &a, const at::Tensor &r, const at::Tensor &value,
            const at::Tensor &log_prob, const at::Tensor &done, at::Generator &gen) {
    torch::NoGradGuard no_grad;
    if (count_ == steps_) {
      if (!finalized_) finalize(value, gen);
      return;
    }
    if (!s_.defined() || s_.sizes().slice(1) != s.sizes() || a_.sizes().slice(1) != a.sizes()) {
      if (count_ > 0)
        usage("the state " + shape_text(s) + " or action " + shape_text(a) + " differs from the rollout's (" +
              shape_text(s_[0]) + ", " + shape_text(a_[0]) + ", the environment first)");
      s_ = storage(s);
      a_ = storage(a);
      r_ = storage(r);
      v_ = storage(value);
      logp_ = storage(log_prob);
      done_ = storage(done);
    }
    s_[count_].copy_(s);
    a_[count_].copy_(a);
    r_[count_].copy_(r);
    v_[count_].copy_(value);
    logp_[count_].copy_(log_prob);
    done_[count_].copy_(done);
    ++count_;
  }

  void reset() {
    count_ = 0;
    finalized_ = false;
    pos_ = 0;
  }

  // Advantages scaled to mean 0 and unit spread over the whole rollout: this process's, or every
  // rank's rollout (as TorchFort does: the mean and spread of all of them, by two all-reduces).
  void normalize_advantages(Ranks *ranks) {
    torch::NoGradGuard no_grad;
    const at::Tensor all = adv_.flatten();
    if (ranks == nullptr) {
      const double n = static_cast<double>(all.numel());
      const at::Tensor mean = at::sum(all) / n;
      const at::Tensor spread = at::sqrt(at::sum(at::square(all - mean)) / (n - 1.0) + 1e-8);
      adv_ = (adv_ - mean) / spread;
      return;
    }
    const auto totals = ranks->sum({static_cast<double>(all.numel()), at::sum(all).item<double>()});
    const double n = totals[0], mean = totals[1] / n;
    const double squares = ranks->sum({at::sum(at::square(all - mean)).item<double>()})[0];
    adv_ = (adv_ - mean) / std::sqrt(squares / (n - 1.0) + 1e-8);
  }

  // Returns and advantages divided by the running spread of the returns (as TorchFort does). The
  // stored values stay as the value network gave them: it learns the scaled returns, so they are
  // already in its scale, the one value clipping (clip_q) compares its new values with.
  void normalize_returns(RunningNormalizer &returns) {
    torch::NoGradGuard no_grad;
    returns.update(ret_.reshape({-1, 1}));
    const auto scaled = [&](const at::Tensor &t) { return returns(t.reshape({-1, 1})).reshape(t.sizes()); };
    ret_ = scaled(ret_);
    adv_ = scaled(adv_);
  }

  // The next minibatch of the epoch (the last one of an epoch may be smaller).
  Batch sample(int64_t batch, at::Generator &gen) {
    torch::NoGradGuard no_grad;
    const int64_t total = steps_ * n_envs_;
    if (pos_ >= total) shuffle(gen);
    const int64_t end = std::min(pos_ + batch, total);
    const at::Tensor idx = order_.slice(0, pos_, end);
    pos_ = end;
    const at::Tensor step = idx.div(n_envs_, "floor").to(device_), env = idx.remainder(n_envs_).to(device_);
    return {s_.index({step, env}),    a_.index({step, env}),   v_.index({step, env}),
            logp_.index({step, env}), adv_.index({step, env}), ret_.index({step, env})};
  }

  void save(const std::string &file) const {
    torch::serialize::OutputArchive archive;
    archive.write("count", c10::IValue(count_));
    archive.write("finalized", c10::IValue(finalized_));
    archive.write("pos", c10::IValue(pos_));
    if (count_ > 0) {
      const char *keys[] = {"s", "a", "r", "v", "logp", "done"};
      const at::Tensor *t[] = {&s_, &a_, &r_, &v_, &logp_, &done_};
      for (int i = 0; i < 6; ++i) archive.write(keys[i], t[i]->slice(0, 0, count_).cpu());
    }
    if (finalized_) {
      archive.write("adv", adv_.cpu());
      archive.write("ret", ret_.cpu());
      archive.write("order", order_);
    }
    archive.save_to(file);
  }

  void load(const std::string &file) {
    torch::serialize::InputArchive archive;
    archive.load_from(file);
    c10::IValue count, finalized, pos;
    if (!archive.try_read("count", count) || !archive.try_read("finalized", finalized) || !archive.try_read("pos", pos))
      usage(file + " is not a rollout buffer");
    const int64_t n = count.toInt();
    if (n > steps_) usage(file + " holds " + std::to_string(n) + " steps, more than this buffer's " + std::to_string(steps_));
    const char *keys[] = {"s", "a", "r", "v", "logp", "done"};
    std::vector<at::Tensor> t(6);
    for (int i = 0; n > 0 && i < 6; ++i)
      if (!archive.try_read(keys[i], t[i]) || t[i].dim() < 2 || t[i].size(1) != n_envs_)
        usage(file + " is not a rollout buffer of " + std::to_string(n_envs_) + " environments");
    at::Tensor adv, ret, order;
    if (finalized.toBool() && (!archive.try_read("adv", adv) || !archive.try_read("ret", ret) ||
                               !archive.try_read("order", order)))
      usage(file + " is not a rollout buffer (a closed rollout without its advantages)");
    reset();
    s_ = a_ = at::Tensor();
    if (n > 0) {
      s_ = storage(t[0][0]);
      a_ = storage(t[1][0]);
      r_ = storage(t[2][0]);
      v_ = storage(t[3][0]);
      logp_ = storage(t[4][0]);
      done_ = storage(t[5][0]);
      at::Tensor *dst[] = {&s_, &a_, &r_, &v_, &logp_, &done_};
      for (int i = 0; i < 6; ++i) dst[i]->slice(0, 0, n).copy_(t[i]);
    }
    count_ = n;
    finalized_ = finalized.toBool();
    pos_ = pos.toInt();
    if (finalized_) {
      adv_ = adv.to(device_, dtype_);
      ret_ = ret.to(device_, dtype_);
      order_ = order;
    }
  }

 private:
  at::Tensor storage(const at::Tensor &like) const {
    std::vector<int64_t> sizes{steps_};
    for (int64_t d : like.sizes()) sizes.push_back(d);
    return at::zeros(sizes, at::TensorOptions().dtype(dtype_).device(device_));
  }

  // Generalized advantage estimation backwards over the rollout: delta_t = r_t + gamma V_{t+1}
  // (1 - d_t) - V_t, A_t = delta_t + gamma lambda (1 - d_t) A_{t+1}, returns A_t + V_t; V_T the
  // values of the states that follow the last step.
  void finalize(const at::Tensor &last_values, at::Generator &gen) {
    at::Tensor gae = at::zeros({n_envs_}, at::TensorOptions().dtype(dtype_).device(device_));
    adv_ = at::zeros_like(r_);
    ret_ = at::zeros_like(r_);
    at::Tensor next_value = last_values.to(device_, dtype_);
    for (int64_t t = steps_ - 1; t >= 0; --t) {
      const at::Tensor next_non_terminal = 1.0 - done_[t];
      const at::Tensor delta = r_[t] + gamma_ * next_value * next_non_terminal - v_[t];
      gae = delta + gamma_ * lambda_ * next_non_terminal * gae;
      adv_[t].copy_(gae);
      ret_[t].copy_(gae + v_[t]);
      next_value = v_[t];
    }
    finalized_ = true;
    shuffle(gen);
  }

  void shuffle(at::Generator &gen) {
    order_ = at::randperm(steps_ * n_envs_, gen, at::TensorOptions().dtype(at::kLong));
    pos_ = 0;
  }

  int64_t steps_, n_envs_;
  double gamma_, lambda_;
  torch::Device device_;
  c10::ScalarType dtype_;
  int64_t count_ = 0, pos_ = 0;
  bool finalized_ = false;
  at::Tensor s_, a_, r_, v_, logp_, done_, adv_, ret_, order_;
};

// ---------------------------------------------------------------------------- systems

constexpr uint64_t kSamplerSeed = 5489;

struct System {
  std::string name;
  PPOConfig cfg;
  torch::Device model_device{torch::kCPU}, rb_device{torch::kCPU};
  c10::ScalarType dtype = at::kFloat;
  Net net;
  std::unique_ptr<RolloutBuffer> buffer;
  std::unique_ptr<RunningNormalizer> state_norm, return_norm;
  bool advantages_normalized = false, returns_normalized = false;
  at::Generator sampler = at::make_generator<at::CPUGeneratorImpl>(kSamplerSeed);
  int64_t train_steps = 0;
  fs::path log_file;
  int rank = 0;
  std::unique_ptr<Ranks> ranks;  // a distributed system's
  std::mutex mutex;

  bool squashed() const { return cfg.actor == "squashed_gaussian_ac"; }
  at::Tensor state_in(const at::Tensor &t) const {
    const at::Tensor x = t.to(model_device, dtype);
    return state_norm && state_norm->initialized() ? (*state_norm)(x) : x;
  }
  // Actions as the policy sees them: clipped to the bounds (gaussian_ac), then scaled to [-1, 1]
  // (squashed_gaussian_ac); and back.
  at::Tensor policy_scale(const at::Tensor &a) const {
    const at::Tensor clipped = a.clamp(cfg.a_low, cfg.a_high);
    return squashed() ? 2.0 * ((clipped - cfg.a_low) / (cfg.a_high - cfg.a_low)) - 1.0 : clipped;
  }
  at::Tensor action_scale(const at::Tensor &a) const {
    return squashed() ? 0.5 * (cfg.a_high - cfg.a_low) * (a + 1.0) + cfg.a_low : a.clamp(cfg.a_low, cfg.a_high);
  }
};

// log pi(a|s) (per sample), the policy's entropy (per sample) and the values, for given actions
// (in the policy's scale; a squashed policy's action is first mapped back through atanh).
std::tuple<at::Tensor, at::Tensor, at::Tensor> evaluate_actions(System &sys, const at::Tensor &s, const at::Tensor &a) {
  const Outputs o = run(sys.net, s);
  if (!sys.squashed())
    return {per_sample_sum(normal_log_prob(a, o.mu, o.sigma)),
            per_sample_sum(o.sigma.log() + 0.5 * (1.0 + std::log(2.0 * M_PI))), o.value};
  const double eps = std::numeric_limits<float>::epsilon();
  const at::Tensor y = at::clamp(a, -1.0 + eps, 1.0 - eps);
  const at::Tensor u = 0.5 * (y.log1p() - (-y).log1p());
  const at::Tensor log_prob =
      per_sample_sum(normal_log_prob(u, o.mu, o.sigma)) - per_sample_sum(at::log(1.0 - at::square(a) + 1e-6));
  return {log_prob, -log_prob, o.value};
}

// A draw of the policy (in its scale).
at::Tensor draw(System &sys, const at::Tensor &s) {
  const Outputs o = run(sys.net, s);
  const at::Tensor u = (o.mu + o.sigma * at::empty_like(o.mu).normal_(0.0, 1.0)).clone();
  return sys.squashed() ? at::tanh(u) : u;
}

std::shared_ptr<System> create_system(const char *name, const char *config_fname, int model_dev, int rb_dev) {
  if (name == nullptr || *name == '\0') usage("the system name is empty");
  if (config_fname == nullptr) usage("the configuration file name is a null pointer");
  auto sys = std::make_shared<System>();
  sys->name = name;
  sys->cfg = read_ppo_config(config_fname);
  const PPOConfig &c = sys->cfg;
  sys->model_device = model_device(model_dev);
  sys->rb_device = model_device(rb_dev);
  if (sys->model_device.is_cuda() && sys->rb_device.is_cuda() && sys->model_device != sys->rb_device)
    usage("model_device and rb_device are two different GPUs: use one GPU, or the CPU for one of them");
  if (c.model.type == "torchscript") {
    sys->net.set(load_script(c.model.filename, sys->model_device, "the actor-critic model", c.filename));
  } else {
    torch::jit::Module m = build_actor_critic(c.model);
    m.to(sys->model_device);
    sys->net.set(m);
  }
  if (sys->net.params.empty()) usage("the actor-critic model has no parameters");
  sys->dtype = sys->net.params[0].scalar_type();
  sys->net.optim = make_optim(c.optimizer, sys->net.params, c.filename);
  if (c.has_scheduler) sys->net.schedule = std::make_unique<Schedule>(*sys->net.optim->opt, c.scheduler);
  sys->buffer = std::make_unique<RolloutBuffer>(c, sys->rb_device, sys->dtype);
  if (c.normalize_states) sys->state_norm = std::make_unique<RunningNormalizer>(false);
  if (c.normalize_returns) sys->return_norm = std::make_unique<RunningNormalizer>(true);
  if (c.enable_wandb_hook) sys->log_file = wandb_log_file(sys->name, c.text);
  if (c.verbose)
    std::cout << "TORCHFORT::INFO: ppo system " << sys->name << ": batch_size " << c.batch_size << ", gamma "
              << c.gamma << ", gae_lambda " << c.gae_lambda << ", epsilon " << c.epsilon << ", " << c.actor
              << " in [" << c.a_low << ", " << c.a_high << "], rollout " << c.size << " transitions of " << c.n_envs
              << " environments, " << ftc::dtype_name(sys->dtype) << std::endl;
  return sys;
}

// Makes a new system distributed over ranks (see Ranks): rank 0's network everywhere, each rank's
// sampler seeded apart.
void distribute(System &sys, std::unique_ptr<Ranks> ranks) {
  sys.ranks = std::move(ranks);
  sys.rank = sys.ranks->rank;
  sys.sampler.set_current_seed(kSamplerSeed + static_cast<uint64_t>(sys.rank));
  sys.ranks->attach(sys.net.module, sys.net.optim);
}

// One transition per environment (s, a with the environment first).
void push(System &sys, const at::Tensor &s, const at::Tensor &a, const at::Tensor &r, const at::Tensor &d) {
  const int64_t n = sys.buffer->n_envs();
  if (s.size(0) != n || a.size(0) != n || r.numel() != n || d.numel() != n)
    usage("the system has " + std::to_string(n) + " environments (rollout_buffer n_envs); the state is " +
          shape_text(s) + ", the action " + shape_text(a) + ", the reward " + std::to_string(r.numel()) +
          " and final_state " + std::to_string(d.numel()) + " values" +
          (n > 1 ? " (use torchfort_rl_on_policy_update_rollout_buffer_multi with the environment as the batch "
                   "dimension)"
                 : ""));
  torch::NoGradGuard no_grad;
  const at::Tensor states = finite_values(s, sys.dtype, "state").to(sys.model_device);
  const at::Tensor actions = sys.policy_scale(finite_values(a, sys.dtype, "action").to(sys.model_device));
  const at::Tensor rewards = finite_values(r, sys.dtype, "reward"), done = finite_values(d, sys.dtype, "final_state");
  // The state as the policy saw it when it chose the action (predict_explore, before this state
  // joins the statistics): kept so, in the buffer, with the log-probability and value of that
  // view; training reads it as stored, so that a step's first ratio to the old policy is 1 however
  // the statistics move on.
  const at::Tensor seen = sys.state_in(states);
  if (sys.state_norm) sys.state_norm->update(states);
  sys.net.module.eval();
  const auto [log_prob, entropy, value] = evaluate_actions(sys, seen, actions);
  (void)entropy;
  const auto to = [&](const at::Tensor &t) { return t.to(sys.rb_device, sys.dtype); };
  sys.buffer->push(to(seen), to(actions), to(rewards.reshape({n})), to(value), to(log_prob), to(done.reshape({n})),
                   sys.sampler);
  if (sys.buffer->ready()) {
    if (sys.return_norm && !sys.returns_normalized) {
      sys.buffer->normalize_returns(*sys.return_norm);
      sys.returns_normalized = true;
    }
    // (A distributed system's over every rank's rollout, in the next train step: a collective.)
    if (sys.cfg.normalize_advantage && !sys.advantages_normalized && !sys.ranks) {
      sys.buffer->normalize_advantages(nullptr);
      sys.advantages_normalized = true;
    }
  }
}

// One PPO minibatch step: the clipped surrogate objective, the (clipped) value loss and the entropy
// bonus; skipped (no update) when the approximate KL divergence exceeds 1.5 target_kl_divergence.
void train_step(System &sys, float &p_loss, float &q_loss) {
  const PPOConfig &c = sys.cfg;
  together(sys.ranks.get(), "to start the train step", [&] {
    if (!sys.buffer->ready())
      usage("the rollout buffer is not complete (" + std::to_string(sys.buffer->count()) + " of " +
            std::to_string(sys.buffer->steps()) + " steps, then one more transition to close it): call "
            "torchfort_rl_on_policy_is_ready before training");
  });
  // A distributed system's advantages (see push); also a rollout a distributed system saved before
  // its first step and one process resumed.
  if (c.normalize_advantage && !sys.advantages_normalized) {
    sys.buffer->normalize_advantages(sys.ranks.get());
    sys.advantages_normalized = true;
  }
  ++sys.train_steps;
  Net &net = sys.net;
  const bool reporting = c.report_frequency > 0 && sys.train_steps % c.report_frequency == 0 && sys.rank == 0;
  at::Tensor loss, pl, ql;
  double kl = 0, clip_fraction = 0;
  auto losses = [&] {
    RolloutBuffer::Batch b = sys.buffer->sample(c.batch_size, sys.sampler);
    const auto on = [&](const at::Tensor &t) { return t.to(sys.model_device, sys.dtype); };
    const at::Tensor s = on(b.s);  // (normalized when stored: see push)
    const at::Tensor a = on(b.a), v_old = on(b.value), logp_old = on(b.log_prob), adv = on(b.advantage),
                     ret = on(b.ret);
    net.module.train();
    const auto [log_prob, entropy, value] = evaluate_actions(sys, s, a);
    const at::Tensor log_ratio = log_prob - logp_old;
    const at::Tensor ratio = at::exp(log_ratio);
    pl = -at::mean(at::minimum(adv * ratio, adv * at::clamp(ratio, 1.0 - c.epsilon, 1.0 + c.epsilon)));
    const at::Tensor v_pred = c.clip_q > 0 ? v_old + at::clamp(value - v_old, -c.clip_q, c.clip_q) : value;
    ql = at::mse_loss(v_pred, ret);
    loss = pl + c.value_loss_coefficient * ql;
    if (c.entropy_loss_coefficient != 0) loss = loss + c.entropy_loss_coefficient * -at::mean(entropy);
    {
      torch::NoGradGuard no_grad;
      if (c.target_kl_divergence > 0 || reporting || sys.ranks)
        kl = at::mean((ratio - 1.0) - log_ratio).item<double>();
      if (reporting) clip_fraction = at::mean((at::abs(ratio - 1.0) > c.epsilon).to(sys.dtype)).item<double>();
    }
    finite_loss(loss, "PPO loss", sys.train_steps);
    p_loss = static_cast<float>(pl.item<double>());
    q_loss = static_cast<float>(ql.item<double>());
  };
  if (!sys.ranks) {
    losses();
  } else {
    // Every rank's losses first: the KL divergence that decides the step and the losses reported
    // are the means over the ranks (one small all-reduce, which also tells every rank of a failure).
    std::exception_ptr error;
    try {
      losses();
    } catch (...) {
      error = std::current_exception();
    }
    const std::vector<double> total =
        sys.ranks->sum({error ? 1.0 : 0.0, error ? 0.0 : kl, error ? 0.0 : p_loss, error ? 0.0 : q_loss});
    if (error) std::rethrow_exception(error);
    if (total[0] > 0)
      throw Failure(TORCHFORT_RESULT_MPI_ERROR, std::to_string(static_cast<int64_t>(total[0])) +
                                                    " rank(s) failed to compute the PPO loss (see their errors); "
                                                    "the network was left unchanged");
    kl = total[1] / sys.ranks->size;
    p_loss = static_cast<float>(total[2] / sys.ranks->size);
    q_loss = static_cast<float>(total[3] / sys.ranks->size);
  }
  const bool skip = c.target_kl_divergence > 0 && kl > 1.5 * c.target_kl_divergence;
  if (!skip) {
    if (net.step_current % c.grad_accumulation_steps == 0) net.optim->opt->zero_grad(/*set_to_none=*/true);
    averaged({net.optim.get()}, [&] {
      loss.backward();
      return 0.0;
    });
    if ((net.step_current + 1) % c.grad_accumulation_steps == 0) {
      ftc::before_update(*net.optim);
      if (c.max_grad_norm > 0) clip_grad_norm(net.params, c.max_grad_norm);
      optimizer_step(*net.optim->opt);
      ftc::after_update(*net.optim);
      ++net.optim->steps;
      if (net.schedule) net.schedule->step();
    }
    ++net.step_train;
    ++net.step_current;
  }
  if (reporting) {
    const double lr = net.optim->opt->param_groups().at(0).options().get_lr();
    std::cout << "TORCHFORT::INFO: model: actor_critic, step_train: " << net.step_train << ", p_loss: " << p_loss
              << ", q_loss: " << q_loss << ", lr: " << lr << ", skipped: " << skip << ", kl_divergence: " << kl
              << ", clip_fraction: " << clip_fraction << std::endl;
    if (!sys.log_file.empty()) {
      write_step_metric(sys.log_file, "actor_critic", "train_loss_p", net.step_train, number_text(p_loss));
      write_step_metric(sys.log_file, "actor_critic", "train_loss_q", net.step_train, number_text(q_loss));
      write_step_metric(sys.log_file, "actor_critic", "train_lr", net.step_train, number_text(lr));
      write_step_metric(sys.log_file, "PPO", "kl_divergence", sys.train_steps, number_text(kl));
      write_step_metric(sys.log_file, "PPO", "clip_fraction", sys.train_steps, number_text(clip_fraction));
    }
  }
}

// ---------------------------------------------------------------------------- checkpoints

void save_checkpoint(System &sys, const fs::path &dir) {
  fs::create_directories(dir);
  save_net(sys.net, dir / "actor_critic");
  fs::create_directories(dir / "rollout_buffer");
  write_atomically(dir / "rollout_buffer" / "buffer.pt", [&](const std::string &f) { sys.buffer->save(f); });
  write_atomically(dir / "state.pt", [&](const std::string &f) {
    torch::serialize::OutputArchive archive;
    archive.write("algorithm", c10::IValue(std::string("ppo")));
    archive.write("train_steps", c10::IValue(sys.train_steps));
    archive.write("step_train", c10::IValue(sys.net.step_train));
    archive.write("step_current", c10::IValue(sys.net.step_current));
    archive.write("advantages_normalized", c10::IValue(sys.advantages_normalized));
    archive.write("returns_normalized", c10::IValue(sys.returns_normalized));
    {
      std::lock_guard<std::mutex> lock(sys.sampler.mutex());
      archive.write("sampler", sys.sampler.get_state());
    }
    // The default generators (the noise draws, SAC's and PPO's samples): resumed bit for bit.
    ftc::write_rng_states(archive, "rng.", ftc::rng_states());
    if (sys.state_norm) sys.state_norm->write(archive, "state_normalizer");
    if (sys.return_norm) sys.return_norm->write(archive, "return_normalizer");
    archive.save_to(f);
  });
}

void load_checkpoint(System &sys, const fs::path &dir, const std::function<void()> &checked) {
  if (!fs::is_directory(dir)) usage("the checkpoint directory " + dir.string() + " does not exist");
  const fs::path state_file = dir / "state.pt", model = dir / "actor_critic" / "model.pt";
  for (const fs::path &f : {state_file, model, dir / "actor_critic" / "optimizer.pt",
                            dir / "rollout_buffer" / "buffer.pt"})
    require_file(f);
  if (sys.net.schedule) require_file(dir / "actor_critic" / "lr.pt");
  torch::serialize::InputArchive archive;
  archive.load_from(state_file.string());
  c10::IValue algorithm, sampler, adv_norm, ret_norm;
  if (!archive.try_read("algorithm", algorithm) || algorithm.toStringRef() != "ppo" ||
      !archive.try_read("sampler", sampler) || !archive.try_read("advantages_normalized", adv_norm) ||
      !archive.try_read("returns_normalized", ret_norm))
    usage(state_file.string() + " is not the state of an on-policy (PPO) system");
  // Every file is read and checked before anything of the system changes.
  torch::jit::Module loaded = load_script(model.string(), sys.model_device, "the checkpoint's network");
  {
    torch::NoGradGuard no_grad;
    torch::jit::Module probe = sys.net.module.clone();
    copy_state(probe, loaded, model.string());
  }
  RolloutBuffer buffer = *sys.buffer;
  buffer.load((dir / "rollout_buffer" / "buffer.pt").string());
  RunningNormalizer state_norm(false), return_norm(true);
  if (sys.state_norm) state_norm.read(archive, "state_normalizer", state_file.string());
  if (sys.return_norm) return_norm.read(archive, "return_normalizer", state_file.string());
  const auto rng = ftc::read_rng_states(archive, "rng.", state_file.string());  // (none before it was kept)
  checked();
  if (rng) ftc::set_rng_states(*rng);

  copy_state(sys.net.module, loaded, model.string());
  ftc::load_optimizer_state(*sys.net.optim->opt, (dir / "actor_critic" / "optimizer.pt").string(),
                            sys.model_device);
  load_grads(sys.net.params, dir / "actor_critic" / "grads.pt");
  if (sys.net.schedule) sys.net.schedule->load((dir / "actor_critic" / "lr.pt").string());
  *sys.buffer = std::move(buffer);
  read_counter(archive, "train_steps", sys.train_steps);
  read_counter(archive, "step_train", sys.net.step_train);
  read_counter(archive, "step_current", sys.net.step_current);
  sys.advantages_normalized = adv_norm.toBool();
  sys.returns_normalized = ret_norm.toBool();
  if (sys.state_norm) *sys.state_norm = state_norm;
  if (sys.return_norm) *sys.return_norm = return_norm;
  std::lock_guard<std::mutex> lock(sys.sampler.mutex());
  sys.sampler.set_state(sampler.toTensor());
}

void load_model(System &sys, const fs::path &dir, const std::function<void()> &checked) {
  const fs::path model = dir / "actor_critic" / "model.pt";
  require_file(model);
  torch::jit::Module loaded = load_script(model.string(), sys.model_device, "the network");
  {
    torch::NoGradGuard no_grad;
    torch::jit::Module probe = sys.net.module.clone();
    copy_state(probe, loaded, model.string());
  }
  auto statistics = model_state_statistics(dir, sys.state_norm != nullptr);
  checked();
  copy_state(sys.net.module, loaded, model.string());
  if (statistics) *sys.state_norm = std::move(*statistics);
}

// ---------------------------------------------------------------------------- registry

Systems<System> systems("on-policy", "torchfort_rl_on_policy_create_system");

// ---------------------------------------------------------------------------- arrays

// The policy's actions for a batch of states (predict_arrays): a draw, or the mean.
at::Tensor action_of(System &sys, const at::Tensor &x, bool explore) {
  sys.net.module.eval();
  if (explore) return sys.action_scale(draw(sys, x));
  const at::Tensor mu = run(sys.net, x).mu;
  return sys.action_scale(sys.squashed() ? at::tanh(mu) : mu);
}

// The value of each state (evaluate_arrays: PPO's critic values states; the actions are not used).
at::Tensor value_of(System &sys, const at::Tensor &x, const at::Tensor & /*actions*/) {
  sys.net.module.eval();
  return run(sys.net, x).value;
}

torchfort_result_t update_arrays(const char *fn, const char *name, void *state, size_t state_dim, int64_t *state_shape,
                                 void *action, size_t action_dim, int64_t *action_shape, const void *reward,
                                 bool final_state, torchfort_datatype_t dtype, cudaStream_t stream, bool fortran) {
  return systems.with(fn, name, [&](System &sys) {
    const at::Tensor s = wrap(state, state_dim, state_shape, dtype, fortran, "state", true);
    const at::Tensor a = wrap(action, action_dim, action_shape, dtype, fortran, "action", true);
    if (reward == nullptr) usage("reward is a null pointer");
    const at::Tensor r = wrap(const_cast<void *>(reward), 0, nullptr, dtype, fortran, "reward", true).reshape({1});
    const at::Tensor d = at::full({1}, final_state ? 1.0 : 0.0, at::TensorOptions().dtype(sys.dtype));
    StreamScope scope(sys.model_device, stream);
    push(sys, s.unsqueeze(0), a.unsqueeze(0), r, d);
  });
}

torchfort_result_t update_multi_arrays(const char *fn, const char *name, void *state, size_t state_dim,
                                       int64_t *state_shape, void *action, size_t action_dim, int64_t *action_shape,
                                       void *reward, size_t reward_dim, int64_t *reward_shape, void *final_state,
                                       size_t final_state_dim, int64_t *final_state_shape, torchfort_datatype_t dtype,
                                       cudaStream_t stream, bool fortran) {
  return systems.with(fn, name, [&](System &sys) {
    const at::Tensor s = wrap(state, state_dim, state_shape, dtype, fortran, "state", true);
    const at::Tensor a = wrap(action, action_dim, action_shape, dtype, fortran, "action", true);
    const at::Tensor r = wrap(reward, reward_dim, reward_shape, dtype, fortran, "reward", true);
    const at::Tensor d = wrap(final_state, final_state_dim, final_state_shape, dtype, fortran, "final_state", true);
    if (s.dim() == 0 || a.dim() == 0) usage("state and action need the environment dimension");
    StreamScope scope(sys.model_device, stream);
    push(sys, s, a, r.reshape({-1}), done_flags(d, sys.dtype));
  });
}

}  // namespace on_policy
}  // namespace rl
}  // namespace tf

// ---------------------------------------------------------------------------- the C API

using namespace tf;
namespace on = tf::rl::on_policy;

TORCHFORT_RL_SHARED_ENTRY_POINTS(on_policy, tf::rl::on_policy)

TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_on_policy_update_rollout_buffer,
                          (const char *name, void *state, size_t state_dim, int64_t *state_shape, void *action,
                           size_t action_dim, int64_t *action_shape, const void *reward, bool final_state,
                           torchfort_datatype_t dtype, cudaStream_t stream),
                          on::update_arrays,
                          (name, state, state_dim, state_shape, action, action_dim, action_shape, reward, final_state,
                           dtype, stream))
TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_on_policy_update_rollout_buffer_multi,
                          (const char *name, void *state, size_t state_dim, int64_t *state_shape, void *action,
                           size_t action_dim, int64_t *action_shape, void *reward, size_t reward_dim,
                           int64_t *reward_shape, void *final_state, size_t final_state_dim,
                           int64_t *final_state_shape, torchfort_datatype_t dtype, cudaStream_t stream),
                          on::update_multi_arrays,
                          (name, state, state_dim, state_shape, action, action_dim, action_shape, reward, reward_dim,
                           reward_shape, final_state, final_state_dim, final_state_shape, dtype, stream))

torchfort_result_t torchfort_rl_on_policy_reset_rollout_buffer(const char *name) {
  return on::systems.with(__func__, name, [&](on::System &sys) {
    sys.buffer->reset();
    sys.advantages_normalized = false;
    sys.returns_normalized = false;
  });
}
