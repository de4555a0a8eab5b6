// torchfort_rl_config.hpp - TorchFort's YAML configuration of a reinforcement-learning system
// (config.rst, "Reinforcement Learning"), read and checked like the supervised one: every block,
// key and value it defines, and an error naming the file, the line, the key and what is allowed
// for anything else. Parsed by libyaml (no LibTorch here).
#pragma once

#include "torchfort_config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tf {

// A network of the system: the built-in MLPs or a TorchScript file.
struct NetConfig {
  std::string type;  // "mlp", "criticmlp", "sacmlp" or "torchscript"
  std::string filename;
  std::vector<int64_t> layer_sizes;
  double dropout = 0;
  bool flatten_non_batch_dims = true;
  // sacmlp: the log standard deviation a function of the state, or one parameter per action
  bool state_dependent_sigma = true;
  double log_sigma_init = 0;
};

// How actions are perturbed: noise on the action ("space") or on the policy's parameters
// ("parameter"), independent Gaussian draws or an Ornstein-Uhlenbeck process ("_ou").
struct ActorConfig {
  std::string type;  // space_noise, space_noise_ou, parameter_noise, parameter_noise_ou
  double a_low = 0, a_high = 0;
  double clip = 0, sigma_train = 0, sigma_explore = 0;
  double xi = 0, dt = 0;
  bool adaptive = false;
};

struct ReplayBufferConfig {
  std::string type;  // "uniform" or "prioritized"
  int64_t max_size = 0, min_size = 0, n_envs = 1;
  // prioritized (Schaul et al. 2016): P(i) ~ p_i^alpha, importance weights (P_min / P_i)^beta with
  // beta annealed from beta0 to beta_max over beta_steps samplings
  double alpha = 0.6, beta0 = 0.4, beta_max = 1.0;
  int64_t beta_steps = 100000;
};

struct RLConfig : GeneralConfig {
  // algorithm
  std::string algorithm;  // "ddpg", "td3" or "sac"
  int64_t batch_size = 0, nstep = 1, num_critics = 1, policy_lag = 1;
  std::string nstep_reward_reduction = "sum";  // sum, mean, weighted_mean (+ "_no_skip")
  double gamma = 0, rho = 0;
  // sac: the entropy coefficient (0: none, unless tuned) and the entropy target (> 0: -action size)
  double alpha = 0, target_entropy = 1;
  // running normalization of the states (mean and spread) and of the rewards (spread only)
  bool normalize_states = false, normalize_rewards = false;
  ActorConfig actor;
  ReplayBufferConfig replay_buffer;
  NetConfig policy, critic;
  OptimizerConfig optimizer;
  int64_t grad_accumulation_steps = 1;
  double max_grad_norm = 0;
  bool has_policy_scheduler = false, has_critic_scheduler = false;
  SchedulerConfig policy_scheduler, critic_scheduler;
  // sac: alpha tuned by its own optimizer (and schedule) when given
  bool has_alpha_optimizer = false, has_alpha_scheduler = false;
  OptimizerConfig alpha_optimizer;
  SchedulerConfig alpha_scheduler;
};

// Reads and checks an off-policy system's configuration file; throws ConfigError.
RLConfig read_rl_config(const std::string &filename);

// TorchFort's ActorCriticMLP: a shared encoder, then the action means and log standard deviations,
// and the value.
struct ActorCriticConfig {
  std::string type;  // "actorcriticmlp" or "torchscript"
  std::string filename;
  std::vector<int64_t> encoder_layer_sizes, actor_layer_sizes, value_layer_sizes;
  double dropout = 0;
  bool state_dependent_sigma = true;
  double log_sigma_init = 0;
};

// An on-policy (PPO) system's configuration.
struct PPOConfig : GeneralConfig {
  int64_t batch_size = 0;
  double gamma = 0, gae_lambda = 0, epsilon = 0.2, clip_q = 0, target_kl_divergence = 0;
  double entropy_loss_coefficient = 0, value_loss_coefficient = 0.5;
  bool normalize_advantage = true, normalize_returns = false, normalize_states = false;
  std::string actor;  // "gaussian_ac" or "squashed_gaussian_ac"
  double a_low = 0, a_high = 0;
  int64_t size = 0, n_envs = 1;  // rollout_buffer (gae_lambda)
  ActorCriticConfig model;
  OptimizerConfig optimizer;
  int64_t grad_accumulation_steps = 1;
  double max_grad_norm = 0;
  bool has_scheduler = false;
  SchedulerConfig scheduler;
};

PPOConfig read_ppo_config(const std::string &filename);

}  // namespace tf
