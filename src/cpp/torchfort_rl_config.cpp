// torchfort_rl_config.cpp - an off-policy reinforcement-learning system's configuration:
// libyaml's document read through the strict Block reader (torchfort_yaml.hpp).
#include "torchfort_rl_config.hpp"

#include "torchfort_yaml.hpp"

namespace tf {
namespace {

void read_net(Block &b, NetConfig &n, const std::vector<std::string> &types, const std::string &where,
              const std::string &file) {
  n.type = b.choice("type", types, "", true);
  Block p = b.block("parameters");
  if (n.type == "torchscript") {
    n.filename = p.string("filename", "", true);
  } else {
    n.layer_sizes = p.integers("layer_sizes", true);
    if (n.layer_sizes.size() < 2)
      throw ConfigError(file + ": " + where + ".parameters.layer_sizes needs at least two sizes (input and output)");
    for (int64_t s : n.layer_sizes)
      if (s < 1) throw ConfigError(file + ": " + where + ".parameters.layer_sizes must be >= 1");
    n.dropout = p.real("dropout", 0);
    if (n.dropout < 0 || n.dropout > 1) throw ConfigError(file + ": " + where + ".parameters.dropout must be in [0, 1]");
    if (n.type == "mlp") n.flatten_non_batch_dims = p.boolean("flatten_non_batch_dims", true);
    if (n.type == "sacmlp") {
      n.state_dependent_sigma = p.boolean("state_dependent_sigma", true);
      n.log_sigma_init = p.real("log_sigma_init", 0);
      if (n.layer_sizes.size() < 3)
        throw ConfigError(file + ": " + where + ".parameters.layer_sizes needs at least three sizes for sacmlp (input, "
                          "hidden, action)");
    }
    if (n.type == "criticmlp" && n.layer_sizes.back() != 1)
      throw ConfigError(file + ": " + where + ".parameters.layer_sizes must end with 1 (the critic returns one value "
                        "per sample); its first size is the state size plus the action size");
  }
  p.done();
  b.done();
}

// A block the configuration needs: its absence names the block and what it holds.
Block required(Block &top, const std::string &key, const std::string &what) {
  if (!top.has(key)) top.missing(key, " (" + what + ")");
  return top.block(key);
}

}  // namespace

RLConfig read_rl_config(const std::string &filename) {
  RLConfig c;
  Node root = open_config(filename, c);
  Block top(&root, "", filename);
  read_general(top, c);

  Block algorithm = required(top, "algorithm", "a block with type: ddpg, td3 or sac, and its parameters");
  const std::string type = algorithm.choice("type", {"ddpg", "td3", "sac", "ppo"}, "", true);
  if (type == "ppo")
    throw ConfigError(filename + ": algorithm.type ppo is an on-policy algorithm: create the system with "
                      "torchfort_rl_on_policy_create_system");
  c.algorithm = type;
  const bool td3 = type == "td3", sac = type == "sac";
  {
    Block p = algorithm.block("parameters");
    c.batch_size = p.integer("batch_size", 0, true, 1);
    c.gamma = p.real("gamma", 0);
    if (!p.has("gamma")) p.missing("gamma");
    c.rho = p.real("rho", 0);
    if (!p.has("rho")) p.missing("rho", " (the weight of the target networks in their Polyak averaging)");
    if (c.gamma < 0 || c.gamma > 1) throw ConfigError(filename + ": algorithm.parameters.gamma must be in [0, 1]");
    if (c.rho < 0 || c.rho > 1) throw ConfigError(filename + ": algorithm.parameters.rho must be in [0, 1]");
    c.nstep = p.integer("nstep", 1, false, 1);
    c.nstep_reward_reduction = p.choice(
        "nstep_reward_reduction", {"sum", "mean", "weighted_mean", "sum_no_skip", "mean_no_skip", "weighted_mean_no_skip"},
        "sum");
    if (td3) {
      c.num_critics = p.integer("num_critics", 2, false, 1);
      c.policy_lag = p.integer("policy_lag", 1, true, 1);
    }
    if (sac) {
      if (c.nstep_reward_reduction.find("_no_skip") != std::string::npos)
        throw ConfigError(filename + ": algorithm.parameters.nstep_reward_reduction " + c.nstep_reward_reduction +
                          " is not available for sac (sum, mean or weighted_mean)");
      c.num_critics = p.integer("num_critics", 2, false, 1);
      c.alpha = p.real("alpha", 0);
      if (c.alpha < 0) throw ConfigError(filename + ": algorithm.parameters.alpha must be >= 0");
      c.target_entropy = p.real("target_entropy", 1.0);
    }
    c.normalize_states = p.boolean("normalize_states", false);
    c.normalize_rewards = p.boolean("normalize_rewards", false);
    p.done();
  }
  algorithm.done();

  {
    Block actor = required(top, "actor", "a block with type: space_noise, space_noise_ou, parameter_noise or "
                                          "parameter_noise_ou");
    ActorConfig &a = c.actor;
    // SAC's actor is always its squashed Gaussian policy: the type is read (TorchFort's files give
    // one) and only the action bounds are used.
    a.type = actor.choice("type", {"space_noise", "space_noise_ou", "parameter_noise", "parameter_noise_ou",
                                   "gaussian", "squashed_gaussian"},
                          "", true);
    if (!sac && (a.type == "gaussian" || a.type == "squashed_gaussian"))
      throw ConfigError(filename + ": actor.type " + a.type + " is SAC's; " + type + " takes space_noise, "
                        "space_noise_ou, parameter_noise or parameter_noise_ou");
    Block p = actor.block("parameters");
    auto real_required = [&](const char *key) {
      if (!p.has(key)) p.missing(key);
      return p.real(key, 0);
    };
    a.a_low = real_required("a_low");
    a.a_high = real_required("a_high");
    if (!(a.a_low < a.a_high)) throw ConfigError(filename + ": actor.parameters.a_low must be below a_high");
    if (!sac) {
      a.sigma_explore = real_required("sigma_explore");
      // DDPG has no target policy smoothing: sigma_train and clip are read (TorchFort's files give
      // them) but unused.
      a.sigma_train = td3 ? real_required("sigma_train") : p.real("sigma_train", 0);
      a.clip = td3 ? real_required("clip") : p.real("clip", 0);
      if (a.sigma_train < 0 || a.sigma_explore < 0)
        throw ConfigError(filename + ": actor.parameters.sigma_train and sigma_explore must be >= 0");
      if (!(a.clip >= 0))  // (0: no clipping, as TorchFort)
        throw ConfigError(filename + ": actor.parameters.clip must be >= 0 (0: the noise is not clipped)");
      if (a.type.size() > 3 && a.type.compare(a.type.size() - 3, 3, "_ou") == 0) {
        a.dt = real_required("dt");
        a.xi = p.real("xi", 0);
        if (a.dt <= 0) throw ConfigError(filename + ": actor.parameters.dt must be > 0");
      }
      a.adaptive = p.boolean("adaptive", false);
    }
    p.done();
    actor.done();
  }

  {
    Block rb = required(top, "replay_buffer", "a block with type: uniform and its max_size and min_size");
    ReplayBufferConfig &r = c.replay_buffer;
    r.type = rb.choice("type", {"uniform", "prioritized"}, "", true);
    Block p = rb.block("parameters");
    r.max_size = p.integer("max_size", 0, true, 1);
    r.min_size = p.integer("min_size", 0, true, 1);
    r.n_envs = p.integer("n_envs", 1, false, 1);
    if (r.type == "prioritized") {
      r.alpha = p.real("alpha", r.alpha);
      r.beta0 = p.real("beta0", r.beta0);
      r.beta_max = p.real("beta_max", r.beta_max);
      r.beta_steps = p.integer("beta_steps", r.beta_steps, false, 0);
      if (r.alpha < 0 || r.beta0 < 0 || r.beta_max < 0)
        throw ConfigError(filename + ": replay_buffer.parameters alpha, beta0 and beta_max must be >= 0");
      // beta anneals from beta0 up to beta_max (at most 1: full correction of the sampling's bias)
      // over beta_steps batches (0: a constant beta0 = beta_max).
      if (r.beta_max > 1 || r.beta0 > r.beta_max)
        throw ConfigError(filename + ": replay_buffer.parameters must have 0 <= beta0 <= beta_max <= 1 (beta0 " +
                          std::to_string(r.beta0) + ", beta_max " + std::to_string(r.beta_max) + ")");
      if (r.beta_steps == 0 && r.beta0 != r.beta_max)
        throw ConfigError(filename + ": replay_buffer.parameters.beta_steps is 0, so beta would stay beta0 (" +
                          std::to_string(r.beta0) + ") and never reach beta_max (" + std::to_string(r.beta_max) +
                          "): give the number of batches over which it grows, or beta_max equal to beta0");
    }
    if (r.max_size < r.n_envs || r.min_size < r.n_envs)
      throw ConfigError(filename + ": replay_buffer.parameters max_size and min_size must be at least n_envs (" +
                        std::to_string(r.n_envs) + "): each environment keeps max_size/n_envs steps");
    if (r.min_size > r.max_size)
      throw ConfigError(filename + ": replay_buffer.parameters.min_size must not exceed max_size");
    if (r.max_size / r.n_envs < c.nstep)
      throw ConfigError(filename + ": replay_buffer.parameters.max_size/n_envs must be at least nstep (" +
                        std::to_string(c.nstep) + ")");
    p.done();
    rb.done();
  }

  {
    Block b = required(top, "policy_model", sac ? "a block with type: sacmlp or torchscript"
                                                : "a block with type: mlp or torchscript");
    read_net(b, c.policy, {sac ? "sacmlp" : "mlp", "torchscript"}, "policy_model", filename);
  }
  {
    Block b = required(top, "critic_model", "a block with type: criticmlp or torchscript");
    read_net(b, c.critic, {"criticmlp", "torchscript"}, "critic_model", filename);
  }
  {
    Block b = required(top, "optimizer", "a block with type: adam or sgd, and its parameters");
    read_optimizer(b, c.optimizer, c.grad_accumulation_steps, c.max_grad_norm);
  }
  if (top.has("policy_lr_scheduler")) {
    Block b = top.block("policy_lr_scheduler");
    c.has_policy_scheduler = true;
    read_scheduler(b, c.policy_scheduler, filename, "policy_lr_scheduler");
  } else {
    top.find("policy_lr_scheduler");
  }
  if (top.has("critic_lr_scheduler")) {
    Block b = top.block("critic_lr_scheduler");
    c.has_critic_scheduler = true;
    read_scheduler(b, c.critic_scheduler, filename, "critic_lr_scheduler");
  } else {
    top.find("critic_lr_scheduler");
  }
  if (sac && top.has("alpha_optimizer")) {
    Block b = top.block("alpha_optimizer");
    c.has_alpha_optimizer = true;
    int64_t accumulate = 1;
    double clip = 0;
    read_optimizer(b, c.alpha_optimizer, accumulate, clip);
    if (accumulate != 1 || clip != 0)  // (read, so that a value is an error rather than ignored)
      throw ConfigError(filename + ": alpha_optimizer.general is not used: alpha steps on the policy's "
                        "accumulation cycle (optimizer.general.grad_accumulation_steps), unclipped");
  } else if (sac) {
    top.find("alpha_optimizer");
  }
  if (sac && top.has("alpha_lr_scheduler")) {
    if (!c.has_alpha_optimizer)
      throw ConfigError(filename + ": an alpha_lr_scheduler block needs an alpha_optimizer block to schedule");
    Block b = top.block("alpha_lr_scheduler");
    c.has_alpha_scheduler = true;
    read_scheduler(b, c.alpha_scheduler, filename, "alpha_lr_scheduler");
  } else if (sac) {
    top.find("alpha_lr_scheduler");
  }
  top.find("identifier");  // written by TorchFort into the copy it keeps for the wandb hook
  top.done();
  return c;
}

PPOConfig read_ppo_config(const std::string &filename) {
  PPOConfig c;
  Node root = open_config(filename, c);
  Block top(&root, "", filename);
  read_general(top, c);

  {
    Block algorithm = required(top, "algorithm", "a block with type: ppo and its parameters");
    const std::string type = algorithm.choice("type", {"ppo", "ddpg", "td3", "sac"}, "", true);
    if (type != "ppo")
      throw ConfigError(filename + ": algorithm.type " + type + " is an off-policy algorithm: create the system with "
                        "torchfort_rl_off_policy_create_system");
    Block p = algorithm.block("parameters");
    c.batch_size = p.integer("batch_size", 0, true, 1);
    if (!p.has("gamma")) p.missing("gamma");
    c.gamma = p.real("gamma", 0);
    if (!p.has("gae_lambda")) p.missing("gae_lambda");
    c.gae_lambda = p.real("gae_lambda", 0);
    if (!p.has("target_kl_divergence")) p.missing("target_kl_divergence", " (0 turns the early stop off)");
    c.target_kl_divergence = p.real("target_kl_divergence", 0);
    c.epsilon = p.real("epsilon", c.epsilon);
    c.clip_q = p.real("clip_q", c.clip_q);
    c.entropy_loss_coefficient = p.real("entropy_loss_coefficient", c.entropy_loss_coefficient);
    c.value_loss_coefficient = p.real("value_loss_coefficient", c.value_loss_coefficient);
    c.normalize_advantage = p.boolean("normalize_advantage", true);
    c.normalize_returns = p.boolean("normalize_returns", false);
    c.normalize_states = p.boolean("normalize_states", false);
    if (c.gamma < 0 || c.gamma > 1 || c.gae_lambda < 0 || c.gae_lambda > 1)
      throw ConfigError(filename + ": algorithm.parameters gamma and gae_lambda must be in [0, 1]");
    if (c.epsilon < 0 || c.clip_q < 0)
      throw ConfigError(filename + ": algorithm.parameters epsilon and clip_q must be >= 0");
    if (!(c.target_kl_divergence >= 0))
      throw ConfigError(filename + ": algorithm.parameters.target_kl_divergence must be >= 0 (0 turns the early "
                        "stop off)");
    if (!(c.value_loss_coefficient >= 0))  // (a negative one would maximise the value error)
      throw ConfigError(filename + ": algorithm.parameters.value_loss_coefficient must be >= 0");
    p.done();
    algorithm.done();
  }
  {
    Block actor = required(top, "actor", "a block with type: gaussian_ac or squashed_gaussian_ac");
    c.actor = actor.choice("type", {"gaussian_ac", "squashed_gaussian_ac"}, "", true);
    Block p = actor.block("parameters");
    if (!p.has("a_low")) p.missing("a_low");
    if (!p.has("a_high")) p.missing("a_high");
    c.a_low = p.real("a_low", 0);
    c.a_high = p.real("a_high", 0);
    if (!(c.a_low < c.a_high)) throw ConfigError(filename + ": actor.parameters.a_low must be below a_high");
    p.done();
    actor.done();
  }
  {
    Block rb = required(top, "rollout_buffer", "a block with type: gae_lambda and its size");
    rb.choice("type", {"gae_lambda"}, "", true);
    Block p = rb.block("parameters");
    c.size = p.integer("size", 0, true, 1);
    c.n_envs = p.integer("n_envs", 1, false, 1);
    if (c.size < c.n_envs)
      throw ConfigError(filename + ": rollout_buffer.parameters.size must be at least n_envs (" +
                        std::to_string(c.n_envs) + "): each environment keeps size/n_envs steps");
    p.done();
    rb.done();
  }
  {
    Block b = required(top, "actor_critic_model", "a block with type: actorcriticmlp or torchscript");
    ActorCriticConfig &m = c.model;
    m.type = b.choice("type", {"actorcriticmlp", "torchscript"}, "", true);
    Block p = b.block("parameters");
    if (m.type == "torchscript") {
      m.filename = p.string("filename", "", true);
    } else {
      m.encoder_layer_sizes = p.integers("encoder_layer_sizes", true);
      m.actor_layer_sizes = p.integers("actor_layer_sizes", true);
      m.value_layer_sizes = p.integers("value_layer_sizes", true);
      const auto positive = [&](const std::vector<int64_t> &v, const char *key, size_t least) {
        if (v.size() < least)
          throw ConfigError(filename + ": actor_critic_model.parameters." + key + " needs at least " +
                            std::to_string(least) + " sizes");
        for (int64_t x : v)
          if (x < 1) throw ConfigError(filename + ": actor_critic_model.parameters." + key + " must be >= 1");
      };
      positive(m.encoder_layer_sizes, "encoder_layer_sizes", 2);
      positive(m.actor_layer_sizes, "actor_layer_sizes", 2);
      positive(m.value_layer_sizes, "value_layer_sizes", 2);
      if (m.value_layer_sizes.back() != 1)
        throw ConfigError(filename + ": actor_critic_model.parameters.value_layer_sizes must end with 1");
      m.dropout = p.real("dropout", 0);
      if (m.dropout < 0 || m.dropout > 1)
        throw ConfigError(filename + ": actor_critic_model.parameters.dropout must be in [0, 1]");
      m.state_dependent_sigma = p.boolean("state_dependent_sigma", true);
      m.log_sigma_init = p.real("log_sigma_init", 0);
    }
    p.done();
    b.done();
  }
  {
    Block b = required(top, "optimizer", "a block with type: adam or sgd, and its parameters");
    read_optimizer(b, c.optimizer, c.grad_accumulation_steps, c.max_grad_norm);
  }
  if (top.has("lr_scheduler")) {
    Block b = top.block("lr_scheduler");
    c.has_scheduler = true;
    read_scheduler(b, c.scheduler, filename, "lr_scheduler");
  } else {
    top.find("lr_scheduler");
  }
  top.find("identifier");
  top.done();
  return c;
}

}  // namespace tf
