// torchfort_config.hpp - TorchFort's YAML configuration of a supervised model, read and checked:
// every block, key and value that TorchFort's config.rst defines, and an error naming the file,
// the line, the key and what is allowed for anything else. Parsed by libyaml (no LibTorch here).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tf {

// A configuration that cannot be used: "<file>:<line>: <what>, <what is allowed>".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// TorchFort's names: lower case, spaces removed ("MSE" and "mse", "T_max" and "t_max" are one).
std::string sanitize(const std::string &s);

// What every configuration file has (supervised, off- and on-policy): its name and text, and the
// general block.
struct GeneralConfig {
  std::string filename;
  std::string text;  // the file as read (copied next to the wandb log)
  int64_t report_frequency = 0;
  bool enable_wandb_hook = false, verbose = false, enable_cuda_graphs = false;
};

struct OptimizerConfig {
  std::string type;  // "sgd" or "adam"
  double learning_rate = 1e-3;
  // sgd
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  // adam
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool amsgrad = false;
  double weight_decay = 0;
};

struct SchedulerConfig {
  std::string type;  // "step", "multistep", "polynomial", "cosine_annealing", "linear"
  int64_t step_size = 0;
  double gamma = 0.1;
  std::vector<int64_t> milestones;
  int64_t total_iters = 0;
  double power = 1.0;
  int64_t t_max = 0;
  double eta_min = 0;
  double start_factor = 0.3333333;  // TorchFort's default (not exactly 1/3)
  double end_factor = 1.0;
};

struct Config : GeneralConfig {
  // model
  std::string model_type;      // "mlp" or "torchscript"
  std::string model_filename;  // torchscript
  std::vector<int64_t> layer_sizes;
  double dropout = 0;
  bool flatten_non_batch_dims = true;
  // loss (absent: training is refused, inference works)
  bool has_loss = false;
  std::string loss_type;  // "mse", "l1" or "torchscript"
  std::string reduction = "mean";
  std::string loss_filename;
  // optimizer
  bool has_optimizer = false;
  OptimizerConfig optimizer;
  int64_t grad_accumulation_steps = 1;
  double max_grad_norm = 0;
  // lr_scheduler
  bool has_scheduler = false;
  SchedulerConfig scheduler;
};

// Reads and checks a supervised model's configuration file; throws ConfigError.
Config read_config(const std::string &filename);

}  // namespace tf
