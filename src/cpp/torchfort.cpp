// torchfort.cpp - TorchFort's C API (torchfort.h) over LibTorch and FTorch's own boundary rules:
// models by name built from a YAML configuration (torchfort_config.cpp), trained and run on the
// caller's arrays in place, checkpoints in TorchFort's directory layout. Behaviour follows
// TorchFort 0.4 (the same trajectory for the same configuration, data and seed); where TorchFort
// would crash or silently misbehave, an error with TorchFort's result code says why.
#include "torchfort_common.hpp"
#include "captured_call.hpp"
#include "rng_state.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <unordered_map>

namespace tf {

// ---------------------------------------------------------------------------- errors

torchfort_result_t code_of_status(int status) {
  switch (status) {
    case FTC_ERR_DEVICE: return TORCHFORT_RESULT_NOT_SUPPORTED;
    case FTC_ERR_DISTRIBUTED: return TORCHFORT_RESULT_MPI_ERROR;  // a collective, or another rank, failed
    case FTC_ERR_TORCH:
    case FTC_ERR_INTERNAL: return TORCHFORT_RESULT_INTERNAL_ERROR;
    default: return TORCHFORT_RESULT_INVALID_USAGE;
  }
}

torchfort_result_t report(const char *fn, torchfort_result_t code, const std::string &what) noexcept {
  try {
    std::string msg = std::string(fn) + ": " + what;
    std::cerr << "TORCHFORT::ERROR: " << msg << std::endl;
    ftc::set_last_error(std::move(msg));
  } catch (...) {
  }
  return code;
}

void call(int status) {
  if (status != FTC_OK) throw ftc::Error(status, ftc::last_error_message());
}

// ---------------------------------------------------------------------------- arrays

c10::ScalarType scalar_type(torchfort_datatype_t dtype, bool floating_only) {
  switch (dtype) {
    case TORCHFORT_FLOAT: return torch::kFloat32;
    case TORCHFORT_DOUBLE: return torch::kFloat64;
    case TORCHFORT_INT32:
      if (!floating_only) return torch::kInt32;
      break;
    case TORCHFORT_INT64:
      if (!floating_only) return torch::kInt64;
      break;
  }
  usage("unknown or unsupported dtype " + std::to_string(static_cast<int>(dtype)) +
        (floating_only ? " (TORCHFORT_FLOAT or TORCHFORT_DOUBLE)"
                       : " (TORCHFORT_FLOAT, TORCHFORT_DOUBLE, TORCHFORT_INT32 or TORCHFORT_INT64)"));
}

// The device whose memory ptr points into (a CUDA device for device or managed memory).
torch::Device device_of_pointer(const void *ptr) {
#ifdef FTORCH_WITH_CUDA
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // host memory unknown to CUDA (older runtimes report it so)
    return torch::Device(torch::kCPU);
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(attr.device));
#else
  (void)ptr;
#endif
  return torch::Device(torch::kCPU);
}

at::Tensor wrap(void *data, size_t dim, const int64_t *shape, torchfort_datatype_t dtype, bool fortran,
                const char *what, bool floating_only) {
  const c10::ScalarType type = scalar_type(dtype, floating_only);
  if (data == nullptr) usage(std::string(what) + " is a null pointer");
  if (dim > 0 && shape == nullptr) usage(std::string(what) + ": the shape is a null pointer");
  std::vector<int64_t> sizes(dim);
  for (size_t i = 0; i < dim; ++i) {
    sizes[i] = fortran ? shape[dim - 1 - i] : shape[i];
    if (sizes[i] < 0) usage(std::string(what) + ": a negative extent in its shape");
  }
  return torch::from_blob(data, sizes, torch::TensorOptions().dtype(type).device(device_of_pointer(data)));
}

std::string shape_text(const at::Tensor &t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "] " << ftc::dtype_name(t.scalar_type());
  return os.str();
}

TensorList &list_of(torchfort_tensor_list_t l, const char *what) {
  if (l == nullptr) usage(std::string(what) + " is a null tensor list (create it with torchfort_tensor_list_create)");
  return *static_cast<TensorList *>(l);
}

// ---------------------------------------------------------------------------- models

// TorchFort's built-in MLP as a TorchScript module (so that torchfort_save_model writes a file
// torch.jit.load reads and runs): Linear layers fc0..fc{n-1} with PyTorch's default
// initialization (drawn in that order), an extra zero bias b{i} added before each hidden ReLU,
// dropout after it, and the parameters in TorchFort's order (b0.., then fc0.weight, fc0.bias, ..).
// The critic (CriticMLP) takes (state, action): a single sample gains a batch dimension, both are
// flattened beyond it and concatenated along the features.
torch::jit::Module build_mlp(const std::vector<int64_t> &sizes, double dropout, bool flatten_non_batch_dims,
                             bool critic) {
  const size_t layers = sizes.size() - 1;
  std::vector<torch::nn::Linear> linear;
  for (size_t i = 0; i < layers; ++i) linear.emplace_back(sizes[i], sizes[i + 1]);

  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module root(c10::QualifiedName(critic ? "__torch__.torchfort.CriticMLP" : "__torch__.torchfort.MLP"), cu,
                          /*shouldMangle=*/true);
  root.register_attribute("training", c10::BoolType::get(), true);
  root.register_attribute("dropout", c10::FloatType::get(), dropout);
  for (size_t i = 0; i + 1 < layers; ++i)
    root.register_parameter("b" + std::to_string(i), torch::zeros({sizes[i + 1]}).requires_grad_(true), false);
  for (size_t i = 0; i < layers; ++i) {
    torch::jit::Module fc(c10::QualifiedName("__torch__.torchfort.Linear"), cu, /*shouldMangle=*/true);
    fc.register_attribute("training", c10::BoolType::get(), true);
    fc.register_parameter("weight", linear[i]->weight.detach().requires_grad_(true), false);
    fc.register_parameter("bias", linear[i]->bias.detach().requires_grad_(true), false);
    fc.define("def forward(self, x):\n    return torch.linear(x, self.weight, self.bias)\n");
    root.register_module("fc" + std::to_string(i), fc);
  }
  std::ostringstream src;
  if (critic) {
    src << "def forward(self, state, action):\n"
        << "    if state.dim() == 1:\n        state = state.unsqueeze(0)\n"
        << "    if action.dim() == 1:\n        action = action.unsqueeze(0)\n"
        << "    x = torch.cat([state.reshape([state.size(0), -1]), action.reshape([action.size(0), -1])], 1)\n";
  } else {
    src << "def forward(self, x):\n";
    if (flatten_non_batch_dims) src << "    x = x.reshape([x.size(0), -1])\n";
  }
  for (size_t i = 0; i < layers; ++i) {
    if (i + 1 < layers) {
      src << "    x = torch.relu(self.fc" << i << ".forward(x) + self.b" << i << ")\n";
      src << "    x = torch.dropout(x, self.dropout, self.training)\n";
    } else {
      src << "    x = self.fc" << i << ".forward(x)\n";
    }
  }
  src << "    return x\n";
  root.define(src.str());
  return root;
}

torch::Device model_device(int device) {
  if (device == TORCHFORT_DEVICE_CPU) return torch::Device(torch::kCPU);
  if (device < 0) usage("device " + std::to_string(device) + " is neither TORCHFORT_DEVICE_CPU (-1) nor a GPU number");
  if (!torch::cuda::is_available())
    throw Failure(TORCHFORT_RESULT_NOT_SUPPORTED,
                  "device " + std::to_string(device) + " is a GPU, but this torch has no CUDA device available "
                  "(use TORCHFORT_DEVICE_CPU, or a CUDA build of torch on a machine with a GPU)");
  if (device >= static_cast<int>(torch::cuda::device_count()))
    usage("GPU " + std::to_string(device) + " does not exist (" + std::to_string(torch::cuda::device_count()) +
          " visible)");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device));
}

torch::jit::Module load_script(const std::string &filename, const torch::Device &device, const char *what,
                               const std::string &config) {
  if (!fs::exists(filename))
    usage(std::string(what) + " file " + filename + (config.empty() ? "" : " (named in " + config + ")") +
          " does not exist (a relative name is taken from the working directory, " + fs::current_path().string() + ")");
  try {
    return torch::jit::load(filename, device);
  } catch (const c10::Error &e) {
    usage(std::string(what) + " file " + filename + " is not a TorchScript file torch.jit.load reads: " +
          e.what_without_backtrace());
  }
}

struct Loss {
  std::string type;
  int64_t reduction = at::Reduction::Mean;
  torch::jit::Module script;

  at::Tensor operator()(const std::vector<at::Tensor> &outputs, const std::vector<at::Tensor> &labels,
                        const std::vector<at::Tensor> &extra) {
    if (type == "torchscript") {
      std::vector<c10::IValue> args(outputs.begin(), outputs.end());
      args.insert(args.end(), labels.begin(), labels.end());
      args.insert(args.end(), extra.begin(), extra.end());
      c10::IValue r;
      try {
        r = script.forward(args);
      } catch (const std::exception &e) {
        ftc::forward_failed(e, args);
      }
      if (!r.isTensor()) usage("the TorchScript loss must return one tensor (the loss)");
      return r.toTensor();
    }
    if (outputs.size() != 1 || labels.size() != 1 || !extra.empty())
      usage("the " + type + " loss takes one model output and one label (and no extra arguments); got " +
            std::to_string(outputs.size()) + " outputs, " + std::to_string(labels.size()) + " labels and " +
            std::to_string(extra.size()) + " extra arguments");
    const at::Tensor x = outputs[0].flatten(), y = labels[0].flatten();
    if (x.numel() != y.numel())
      usage("the model output (" + shape_text(outputs[0]) + ") and the label (" + shape_text(labels[0]) +
            ") have different element counts");
    require_same_batch(outputs[0], labels[0], "the model output", "the label");
    return type == "mse" ? at::mse_loss(x, y, reduction) : at::l1_loss(x, y, reduction);
  }
};

// A named model: the module and optimizer are FTorch's own objects (ftc::Model, ftc::Optim), so that
// FTorch's data-parallel wrapper (distributed.cpp) attaches to them as to any other.
struct Pack {
  std::string name;
  Config cfg;
  torch::Device device{torch::kCPU};
  std::shared_ptr<ftc::Model> model = std::make_shared<ftc::Model>();
  torch::jit::Module &module = model->module;
  std::vector<at::Tensor> params;
  std::shared_ptr<ftc::Optim> optim;  // null without an optimizer block
  torch::optim::Optimizer *opt = nullptr;  // optim->opt
  std::unique_ptr<Schedule> schedule;
  ftc_ddp ddp = nullptr;    // data-parallel (torchfort_create_distributed_model)
  ftc_comm comm = nullptr;  // its communicator
  int rank = 0;
  std::unique_ptr<Loss> loss;
  int64_t step_train = 0, step_inference = 0, step_train_current = 0;
  fs::path log_file;  // the wandb hook's metrics log (empty: off)
  // enable_cuda_graphs: training's forward, loss and backward, and inference's forward, each
  // captured as a CUDA graph after its warm-up calls (TorchFort's split: the optimizer's update and
  // the schedule stay outside)
  ftc::CapturedCall train_graph, inference_graph;
  std::mutex mutex;   // one call at a time per model
};

// c10d's default bucket size for averaging gradients.
constexpr int64_t kBucketBytes = 25 * 1024 * 1024;

Registry<Pack> packs("model", "", "torchfort_create_model");

std::vector<at::Tensor> parameters_of(const torch::jit::Module &m) {
  std::vector<at::Tensor> out;
  for (const auto &p : m.parameters()) out.push_back(p);
  return out;
}

std::shared_ptr<ftc::Optim> make_optim(const OptimizerConfig &o, const std::vector<at::Tensor> &params,
                                       const std::string &file) {
  auto optim = std::make_shared<ftc::Optim>();
  optim->kind = o.type == "sgd" ? FTC_OPTIM_SGD : FTC_OPTIM_ADAM;
  optim->params = params;
  if (o.type == "sgd") {
    auto opts = torch::optim::SGDOptions(o.learning_rate)
                    .momentum(o.momentum)
                    .dampening(o.dampening)
                    .weight_decay(o.weight_decay)
                    .nesterov(o.nesterov);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      usage(file + ": optimizer.parameters.nesterov needs a momentum > 0 and no dampening");
    optim->opt = std::make_unique<torch::optim::SGD>(params, opts);
  } else {
    auto opts = torch::optim::AdamOptions(o.learning_rate)
                    .betas(std::make_tuple(o.beta1, o.beta2))
                    .eps(o.eps)
                    .weight_decay(o.weight_decay)
                    .amsgrad(o.amsgrad);
    optim->opt = std::make_unique<torch::optim::Adam>(params, opts);
  }
  return optim;
}

std::vector<at::Tensor> run_forward(Pack &p, const std::vector<at::Tensor> &inputs) {
  return forward_tensors(p.module, std::vector<c10::IValue>(inputs.begin(), inputs.end()), "the model");
}

std::vector<at::Tensor> on_device(const std::vector<at::Tensor> &ts, const torch::Device &d) {
  std::vector<at::Tensor> out;
  for (const auto &t : ts) out.push_back(t.device() == d ? t : t.to(d));
  return out;
}


namespace {
std::mutex log_mutex;
std::map<fs::path, bool> log_failing;  // guarded by log_mutex: logs whose last write failed

// One line appended; false (with the reason in *why) when it could not be written.
bool append_metric(const fs::path &log_file, const std::string &model, const std::string &metric, int64_t step,
                   const std::string &value, std::string *why) {
  std::ofstream out(log_file, std::ios::app);
  out << "TORCHFORT::WANDB: model: " << model << ", step: " << step << ", " << metric << ": " << value << "\n";
  out.flush();
  const bool ok = static_cast<bool>(out);
  if (!ok) *why = std::strerror(errno);
  log_failing[log_file] = !ok;
  return ok;
}
}  // namespace

void write_metric(const fs::path &log_file, const std::string &model, const std::string &metric, int64_t step,
                  const std::string &value) {
  std::lock_guard<std::mutex> lock(log_mutex);
  std::string why;
  if (!append_metric(log_file, model, metric, step, value, &why))
    usage("cannot write the wandb hook's log " + log_file.string() + " (" + why + ")");
}

void write_step_metric(const fs::path &log_file, const std::string &model, const std::string &metric, int64_t step,
                       const std::string &value) {
  std::lock_guard<std::mutex> lock(log_mutex);
  const bool was_failing = log_failing[log_file];
  std::string why;
  if (!append_metric(log_file, model, metric, step, value, &why) && !was_failing) {
    std::cerr << "TORCHFORT::WARN: cannot write the wandb hook's log " << log_file.string() << " (" << why
              << "): the metrics of model " << model << " at step " << step
              << " and later are lost until it can be written again; training goes on" << std::endl;
  }
}

fs::path wandb_log_file(const std::string &name, const std::string &config_text) {
  const char *dir = std::getenv("TORCHFORT_LOGDIR");
  if (dir == nullptr || *dir == '\0') {
    std::cout << "TORCHFORT::WARN: enable_wandb_hook is true but TORCHFORT_LOGDIR is not set: no metrics are "
                 "written (set it to a writable directory)"
              << std::endl;
    return {};
  }
  std::error_code made;
  fs::create_directories(dir, made);
  if (made) usage(std::string("TORCHFORT_LOGDIR=") + dir + ": cannot make the directory (" + made.message() + ")");
  // The configuration next to the log, with the model's name (TorchFort's wandb_helper.py reads it).
  std::string file_name = name;
  for (char &ch : file_name)
    if (ch == '/') ch = '-';
  file_name.erase(std::remove(file_name.begin(), file_name.end(), ' '), file_name.end());
  const fs::path copy_path = fs::path(dir) / ("config_" + file_name + ".yaml");
  std::ofstream copy(copy_path);
  copy << config_text << (config_text.empty() || config_text.back() == '\n' ? "" : "\n") << "identifier: \"" << name
       << "\"\n";
  copy.flush();
  if (!copy) usage("TORCHFORT_LOGDIR: cannot write " + copy_path.string() + " (" + std::strerror(errno) + ")");
  const fs::path log = fs::path(dir) / "torchfort.log";
  std::ofstream probe(log, std::ios::app);  // (writable now; a later failure is write_step_metric's)
  if (!probe) usage("TORCHFORT_LOGDIR: cannot write the wandb hook's log " + log.string() + " (" + std::strerror(errno) + ")");
  return log;
}

void log_metric(Pack &p, const std::string &metric, int64_t step, const std::string &value) {
  if (p.log_file.empty() || p.rank != 0) return;
  write_metric(p.log_file, p.name, metric, step, value);
}

void log_step_metric(Pack &p, const std::string &metric, int64_t step, const std::string &value) {
  if (p.log_file.empty() || p.rank != 0) return;
  write_step_metric(p.log_file, p.name, metric, step, value);
}


// Returns the loss in double precision (TorchFort rounds it to float first; a float64 model's
// TORCHFORT_DOUBLE loss keeps its precision here).
// The loss of one forward on inputs, as a tensor of one element.
at::Tensor loss_of(Pack &p, const std::vector<at::Tensor> &inputs, const std::vector<at::Tensor> &labels,
                   const std::vector<at::Tensor> &extra) {
  const std::vector<at::Tensor> outputs = run_forward(p, inputs);
  at::Tensor loss = (*p.loss)(outputs, labels, extra);
  if (loss.numel() != 1)
    usage("the loss has " + std::to_string(loss.numel()) + " elements; training needs one value (loss "
          "parameters: reduction mean or sum, not none)");
  return loss;
}

// A loss that is not finite would make every parameter (and Adam's moments) NaN and the call would
// still succeed: an error, with the model and this accumulation cycle's gradients as they were (on
// every rank: reduced_step tells them all).
void require_finite(const Pack &p, double value) {
  if (!std::isfinite(value))
    throw Failure(TORCHFORT_RESULT_INTERNAL_ERROR,
                  "the loss is " + std::to_string(value) + " at training step " + std::to_string(p.step_train + 1) +
                      "; the model was not changed by this call (look for NaN or infinite inputs or labels, "
                      "lower the learning rate, or clip gradients with max_grad_norm)");
}

// Whether this model's steps go through CUDA graphs: enable_cuda_graphs on a GPU (or with
// FTORCH_CUDA_GRAPHS=eager, their work uncaptured on any device), not data-parallel (its averages
// move the gradients into buckets, where a replay would not find them).
bool uses_graphs(const Pack &p) {
  return p.cfg.enable_cuda_graphs && (ftc::eager_graphs() || (p.device.is_cuda() && ftc::cuda_graphs_built())) &&
         !(p.optim && p.optim->sync);
}

// Forward, loss and backward through the model's captured graph: the arguments copied into the
// graph's own tensors, the gradients accumulated into the parameters' (kept: zero_grad leaves them
// in place). A replay runs backward before the host sees the loss, so a loss that is not finite
// puts the gradients back as they were before the error.
double graph_loss_and_gradients(Pack &p, const std::vector<at::Tensor> &inputs, const std::vector<at::Tensor> &labels,
                                const std::vector<at::Tensor> &extra, bool cycle_start) {
  std::vector<at::Tensor> args = inputs;
  args.insert(args.end(), labels.begin(), labels.end());
  args.insert(args.end(), extra.begin(), extra.end());
  const auto n_in = static_cast<std::ptrdiff_t>(inputs.size()), n_labels = static_cast<std::ptrdiff_t>(labels.size());
  std::vector<at::Tensor> before;
  if (!cycle_start) {
    for (const auto &q : p.params) before.push_back(q.grad().defined() ? q.grad().clone() : at::Tensor());
  }
  bool replayed = false;
  const std::vector<at::Tensor> results = p.train_graph.run(
      // (the key: training, and how the arguments divide into inputs, labels and extra arguments)
      args, p.device, /*mode=*/1 + 2 * (n_in + 1024 * n_labels),
      [&](const std::vector<at::Tensor> &a, bool capturing) {
        at::Tensor loss = loss_of(p, {a.begin(), a.begin() + n_in}, {a.begin() + n_in, a.begin() + n_in + n_labels},
                                  {a.begin() + n_in + n_labels, a.end()});
        if (!capturing) require_finite(p, loss.item<double>());
        loss.backward();
        return std::vector<at::Tensor>{loss.detach()};
      },
      &replayed);
  const double value = results.at(0).item<double>();
  if (replayed && !std::isfinite(value)) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < p.params.size(); ++i) {
      at::Tensor g = p.params[i].grad();
      if (!g.defined()) continue;
      if (cycle_start || !before[i].defined()) {
        g.zero_();
      } else {
        g.copy_(before[i]);
      }
    }
    require_finite(p, value);
  }
  return value;
}

double train_lists(Pack &p, const std::vector<at::Tensor> &inputs_in, const std::vector<at::Tensor> &labels_in,
                  const std::vector<at::Tensor> &extra_in) {
  if (!p.opt)
    usage("model '" + p.name + "' cannot be trained: its configuration (" + p.cfg.filename + ") has no optimizer block");
  if (!p.loss)
    usage("model '" + p.name + "' cannot be trained: its configuration (" + p.cfg.filename + ") has no loss block");
  p.module.train();
  const int64_t accumulate = p.cfg.grad_accumulation_steps;
  const bool cycle_start = p.step_train_current % accumulate == 0;
  const bool graphs = uses_graphs(p);
  // (a captured backward adds into the gradients it found: they stay, zeroed in place)
  if (cycle_start) p.opt->zero_grad(/*set_to_none=*/!graphs);
  // Buffers the forward updates (BatchNorm's running statistics): put back if the step fails (a loss
  // that is not finite, say), so that the model is as it was.
  std::vector<at::Tensor> buffers, buffers_before;
  for (const auto &b : p.module.buffers()) {
    buffers.push_back(b);
    buffers_before.push_back(b.clone());
  }
  // Data-parallel: gradients and the loss averaged over the ranks (a failure here reaches them all).
  double value = 0;
  try {
    value = ftc::reduced_step(*p.optim, [&] {
      if (graphs) return graph_loss_and_gradients(p, inputs_in, labels_in, extra_in, cycle_start);
      at::Tensor loss = loss_of(p, on_device(inputs_in, p.device), on_device(labels_in, p.device),
                                on_device(extra_in, p.device));
      const double value = loss.item<double>();
      require_finite(p, value);
      loss.backward();
      return value;
    });
  } catch (...) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(buffers_before[i]);  // (in place: a graph reads them)
    throw;
  }
  if ((p.step_train_current + 1) % accumulate == 0) {
    ftc::before_update(*p.optim);
    if (p.cfg.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(p.params, p.cfg.max_grad_norm);
    p.opt->step();
    ftc::after_update(*p.optim);
    ++p.optim->steps;
    if (p.schedule) p.schedule->step();
  }
  ++p.step_train;
  ++p.step_train_current;
  if (p.cfg.report_frequency > 0 && p.step_train % p.cfg.report_frequency == 0 && p.rank == 0) {
    const double lr = p.opt->param_groups().at(0).options().get_lr();
    std::cout << "TORCHFORT::INFO: model: " << p.name << ", step_train: " << p.step_train
              << ", loss: " << static_cast<float>(value)
              << ", lr: " << lr << std::endl;
    log_step_metric(p, "train_loss", p.step_train, number_text(static_cast<float>(value)));
    log_step_metric(p, "train_lr", p.step_train, number_text(lr));
  }
  return value;
}

void inference_lists(Pack &p, const std::vector<at::Tensor> &inputs_in, std::vector<at::Tensor> &outputs) {
  torch::NoGradGuard no_grad;
  p.module.eval();
  bool replayed = false;
  const std::vector<at::Tensor> results =
      uses_graphs(p) ? p.inference_graph.run(
                           inputs_in, p.device, /*mode=*/0,
                           [&](const std::vector<at::Tensor> &a, bool) { return run_forward(p, a); }, &replayed)
                     : run_forward(p, on_device(inputs_in, p.device));
  if (results.size() != outputs.size())
    usage("the model returns " + std::to_string(results.size()) + " tensors, but " + std::to_string(outputs.size()) +
          " output arrays were given");
  for (size_t i = 0; i < results.size(); ++i) {
    const at::Tensor &r = results[i];
    if (r.numel() != outputs[i].numel())
      usage("output " + std::to_string(i + 1) + ": the model returns " + shape_text(r) + " (" +
            std::to_string(r.numel()) + " elements), the output array is " + shape_text(outputs[i]) + " (" +
            std::to_string(outputs[i].numel()) + " elements)");
    if (r.is_floating_point() && !outputs[i].is_floating_point())
      usage("output " + std::to_string(i + 1) + ": the model returns " + ftc::dtype_name(r.scalar_type()) +
            " values, which an " + ftc::dtype_name(outputs[i].scalar_type()) + " array would truncate");
    require_same_batch(r, outputs[i], "output " + std::to_string(i + 1) + ": the model's result",
                       "the output array");
    // (values the array's type would change -- int64 beyond int32, float64 beyond float32's range --
    // are an error, as for every FTorch copy into an array)
    const std::string into = "output array " + std::to_string(i + 1);
    if (r.scalar_type() != outputs[i].scalar_type()) ftc::check_lossless(r, outputs[i].scalar_type(), into.c_str());
  }
  // (every output checked before any is written: a failure leaves the arrays as they were)
  for (size_t i = 0; i < results.size(); ++i) outputs[i].copy_(results[i].reshape(outputs[i].sizes()));
  ++p.step_inference;
}

// ---------------------------------------------------------------------------- files

std::vector<at::Tensor> forward_tensors(torch::jit::Module &module, std::vector<c10::IValue> args, const char *what) {
  ftc::apply_jit_optimize();
  c10::IValue r;
  try {
    r = module.forward(args);
  } catch (const std::exception &e) {
    ftc::forward_failed(e, args);
  }
  std::vector<at::Tensor> out;
  if (r.isTensor()) {
    out.push_back(r.toTensor());
  } else if (r.isTuple()) {
    for (const auto &x : r.toTupleRef().elements()) {
      if (!x.isTensor()) usage(std::string(what) + " returns a tuple with an item that is not a tensor");
      out.push_back(x.toTensor());
    }
  } else if (r.isTensorList()) {
    out = r.toTensorVector();
  }
  if (out.empty()) usage(std::string(what) + " returns " + r.tagKind() + ", not a tensor or a tuple of tensors");
  return out;
}

// Every parameter and buffer of `to` paired with its value in `from` (names and shapes checked;
// nothing changes).
std::vector<std::pair<at::Tensor, at::Tensor>> state_pairs(const torch::jit::Module &to,
                                                           const torch::jit::Module &from, const std::string &file) {
  std::unordered_map<std::string, at::Tensor> source;
  for (const auto &p : from.named_parameters()) source[p.name] = p.value;
  for (const auto &b : from.named_buffers()) source[b.name] = b.value;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  size_t count = 0;
  auto match = [&](const std::string &name, const at::Tensor &dst) {
    auto it = source.find(name);
    if (it == source.end()) usage(file + " has no '" + name + "': it holds another model");
    if (it->second.sizes() != dst.sizes())
      usage(file + ": '" + name + "' has shape " + shape_text(it->second) + ", the model's is " + shape_text(dst));
    pairs.emplace_back(dst, it->second);
    ++count;
  };
  for (const auto &p : to.named_parameters()) match(p.name, p.value);
  for (const auto &b : to.named_buffers()) match(b.name, b.value);
  if (count != source.size()) usage(file + " holds more parameters and buffers than the model: it holds another model");
  return pairs;
}

void copy_pairs(const std::vector<std::pair<at::Tensor, at::Tensor>> &pairs) {
  torch::NoGradGuard no_grad;
  for (const auto &[dst, src] : pairs) dst.copy_(src);
}

void copy_state(torch::jit::Module &to, const torch::jit::Module &from, const std::string &file) {
  copy_pairs(state_pairs(to, from, file));
}

void save_state(const Pack &p, const std::string &path) {
  torch::serialize::OutputArchive archive;
  archive.write("step_train", c10::IValue(p.step_train));
  archive.write("step_inference", c10::IValue(p.step_inference));
  archive.write("step_train_current", c10::IValue(p.step_train_current));  // (the accumulation cycle)
  archive.write("device", c10::IValue(p.device));
  // The default generators (dropout masks): a resumed run draws on as the uninterrupted one.
  ftc::write_rng_states(archive, "rng.", ftc::rng_states());
  archive.save_to(path);
}

// The step counters of a state.pt: training, inference, and training calls (within accumulation
// cycles; a checkpoint of an earlier FTorch has none: its cycle starts again).
struct StepCounts {
  int64_t train = 0, inference = 0, current = 0;
  std::optional<ftc::RngStates> rng;  // (none in checkpoints before they kept it)
};
StepCounts load_state(const std::string &path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  c10::IValue train, inference, current;
  if (!archive.try_read("step_train", train) || !archive.try_read("step_inference", inference))
    usage(path + " is not a TorchFort model state (step_train and step_inference missing)");
  StepCounts counts{train.toInt(), inference.toInt(), 0};
  if (archive.try_read("step_train_current", current)) counts.current = current.toInt();
  counts.rng = ftc::read_rng_states(archive, "rng.", path);
  return counts;
}


void require_file(const fs::path &path) {
  if (!fs::exists(path)) usage("the checkpoint has no " + path.string());
}

}  // namespace tf

// ---------------------------------------------------------------------------- the C API

using namespace tf;

namespace {
// A model from its configuration, not yet registered.
std::shared_ptr<Pack> create_pack(const char *name, const char *config_fname, int device) {
    if (name == nullptr || *name == '\0') usage("the model name is empty");
    if (config_fname == nullptr) usage("the configuration file name is a null pointer");
    packs.require_free(name);
    auto p = std::make_shared<Pack>();
    p->name = name;
    p->cfg = read_config(config_fname);
    p->device = model_device(device);
    if (p->cfg.model_type == "mlp") {
      p->module = build_mlp(p->cfg.layer_sizes, p->cfg.dropout, p->cfg.flatten_non_batch_dims);
      p->module.to(p->device);
    } else {
      p->module = load_script(p->cfg.model_filename, p->device, "the model", p->cfg.filename);
    }
    p->params = parameters_of(p->module);
    if (p->cfg.has_loss) {
      p->loss = std::make_unique<Loss>();
      p->loss->type = p->cfg.loss_type;
      if (p->cfg.loss_type == "torchscript") {
        p->loss->script = load_script(p->cfg.loss_filename, p->device, "the loss", p->cfg.filename);
      } else if (p->cfg.reduction == "sum") {
        p->loss->reduction = at::Reduction::Sum;
      } else if (p->cfg.reduction == "none") {
        p->loss->reduction = at::Reduction::None;
      }
    }
    if (p->cfg.has_optimizer) {
      if (p->params.empty()) usage("the model has no parameters for the optimizer to train");
      p->optim = make_optim(p->cfg.optimizer, p->params, p->cfg.filename);
      p->opt = p->optim->opt.get();
    }
    if (p->cfg.has_scheduler) p->schedule = std::make_unique<Schedule>(*p->opt, p->cfg.scheduler);
    if (p->cfg.enable_wandb_hook) p->log_file = wandb_log_file(p->name, p->cfg.text);
    if (p->cfg.enable_cuda_graphs && p->device.is_cuda() && !ftc::cuda_graphs_built())
      std::cerr << "TORCHFORT::WARNING: model " << p->name << ": enable_cuda_graphs is set, but this FTorch was built "
                << "without CUDA graphs (the CUDA runtime's crt/ headers or CCCL were missing: pip install nvidia-cuda-crt "
                << "nvidia-cuda-cccl, or set CUDA_HOME to a CUDA toolkit, and rebuild); its steps run uncaptured"
                << std::endl;
    return p;
}

}  // namespace

torchfort_result_t torchfort_create_model(const char *name, const char *config_fname, int device) {
  return boundary(__func__, [&] { packs.add(create_pack(name, config_fname, device)); });
}

torchfort_result_t ftc_torchfort_create_distributed(const char *name, const char *config_fname, ftc_comm comm,
                                                    int device) {
  return boundary("torchfort_create_distributed_model", [&] {
    std::shared_ptr<Pack> p = create_pack(name, config_fname, device);
    if (comm == nullptr) usage("the communicator is null");
    call(ftc_comm_rank(comm, &p->rank));
    call(ftc_comm_share(comm, &p->comm));
    // FTorch's data-parallel wrapper over the model and its optimizer: it checks that every rank
    // has the same model, broadcasts rank 0's parameters and averages gradients at every step.
    ftc_model model = nullptr;
    ftc_optim optim = nullptr;
    ftc::replace_handle<ftc::ModelTable>(&model, p->model);
    if (p->optim) ftc::replace_handle<ftc::OptimTable>(&optim, p->optim);
    const int status = ftc_ddp_new(&p->ddp, comm, model, optim, kBucketBytes);
    ftc_model_delete(&model);
    ftc_optim_delete(&optim);
    call(status);
    packs.add(p);
  });
}

// Without torchfort_mpi.c in the program (which defines it with the program's MPI).
torchfort_result_t torchfort_create_distributed_model_F(const char *name, const char *config_fname, int mpi_comm_f,
                                                        int device) {
  (void)name, (void)config_fname, (void)mpi_comm_f, (void)device;
  return boundary("torchfort_create_distributed_model", [&] {
    throw Failure(TORCHFORT_RESULT_NOT_SUPPORTED,
                  "distributed models need MPI, which FTorch takes from your program: compile torchfort_mpi.c "
                  "with your MPI into it (CMake: target_link_libraries(... FTorch::torchfort_mpi); otherwise "
                  "mpicc -c $(python -m ftorch --torchfort-mpi-source) $(pkg-config --cflags ftorch))");
  });
}

namespace {
torchfort_result_t train_arrays(const char *fn, const char *name, void *input, size_t input_dim, int64_t *input_shape,
                                void *label, size_t label_dim, int64_t *label_shape, void *loss_val,
                                torchfort_datatype_t dtype, cudaStream_t stream, bool fortran) {
  return packs.with(fn, name, [&](Pack &p) {
    if (loss_val == nullptr) usage("loss_val is a null pointer");
    const at::Tensor x = wrap(input, input_dim, input_shape, dtype, fortran, "input", true);
    const at::Tensor y = wrap(label, label_dim, label_shape, dtype, fortran, "label", true);
    StreamScope scope(p.device, stream);
    const double value = train_lists(p, {x}, {y}, {});
    if (dtype == TORCHFORT_FLOAT) {
      *static_cast<float *>(loss_val) = static_cast<float>(value);
    } else {
      *static_cast<double *>(loss_val) = value;
    }
  });
}

torchfort_result_t inference_arrays(const char *fn, const char *name, void *input, size_t input_dim,
                                    int64_t *input_shape, void *output, size_t output_dim, int64_t *output_shape,
                                    torchfort_datatype_t dtype, cudaStream_t stream, bool fortran) {
  return packs.with(fn, name, [&](Pack &p) {
    const at::Tensor x = wrap(input, input_dim, input_shape, dtype, fortran, "input", true);
    std::vector<at::Tensor> outputs{wrap(output, output_dim, output_shape, dtype, fortran, "output", true)};
    StreamScope scope(p.device, stream);
    inference_lists(p, {x}, outputs);
  });
}
}  // namespace

torchfort_result_t torchfort_train(const char *name, void *input, size_t input_dim, int64_t *input_shape, void *label,
                                   size_t label_dim, int64_t *label_shape, void *loss_val, torchfort_datatype_t dtype,
                                   cudaStream_t stream) {
  return train_arrays(__func__, name, input, input_dim, input_shape, label, label_dim, label_shape, loss_val, dtype,
                      stream, false);
}

torchfort_result_t torchfort_train_F(const char *name, void *input, size_t input_dim, int64_t *input_shape,
                                     void *label, size_t label_dim, int64_t *label_shape, void *loss_val,
                                     torchfort_datatype_t dtype, cudaStream_t stream) {
  return train_arrays("torchfort_train", name, input, input_dim, input_shape, label, label_dim, label_shape, loss_val,
                      dtype, stream, true);
}

torchfort_result_t torchfort_train_multiarg(const char *name, torchfort_tensor_list_t inputs,
                                            torchfort_tensor_list_t labels, float *loss_val,
                                            torchfort_tensor_list_t extra_loss_args, cudaStream_t stream) {
  return packs.with("torchfort_train_multiarg", name, [&](Pack &p) {
    if (loss_val == nullptr) usage("loss_val is a null pointer");
    const TensorList &in = list_of(inputs, "inputs");
    const TensorList &lab = list_of(labels, "labels");
    const std::vector<at::Tensor> extra =
        extra_loss_args != nullptr ? list_of(extra_loss_args, "extra_loss_args").tensors : std::vector<at::Tensor>();
    StreamScope scope(p.device, stream);
    *loss_val = static_cast<float>(train_lists(p, in.tensors, lab.tensors, extra));
  });
}

torchfort_result_t torchfort_inference(const char *name, void *input, size_t input_dim, int64_t *input_shape,
                                       void *output, size_t output_dim, int64_t *output_shape,
                                       torchfort_datatype_t dtype, cudaStream_t stream) {
  return inference_arrays(__func__, name, input, input_dim, input_shape, output, output_dim, output_shape, dtype,
                          stream, false);
}

torchfort_result_t torchfort_inference_F(const char *name, void *input, size_t input_dim, int64_t *input_shape,
                                         void *output, size_t output_dim, int64_t *output_shape,
                                         torchfort_datatype_t dtype, cudaStream_t stream) {
  return inference_arrays("torchfort_inference", name, input, input_dim, input_shape, output, output_dim,
                          output_shape, dtype, stream, true);
}

torchfort_result_t torchfort_inference_multiarg(const char *name, torchfort_tensor_list_t inputs,
                                                torchfort_tensor_list_t outputs, cudaStream_t stream) {
  return packs.with(__func__, name, [&](Pack &p) {
    const TensorList &in = list_of(inputs, "inputs");
    TensorList &out = list_of(outputs, "outputs");
    StreamScope scope(p.device, stream);
    inference_lists(p, in.tensors, out.tensors);
  });
}

torchfort_result_t torchfort_save_model(const char *name, const char *fname) {
  return packs.with(__func__, name, [&](Pack &p) {
    if (fname == nullptr) usage("the file name is a null pointer");
    ftc::save_module(p.module, fname, /*as_inference=*/true);  // (as torch_model_save writes it)
  });
}

torchfort_result_t torchfort_load_model(const char *name, const char *fname) {
  return packs.with(__func__, name, [&](Pack &p) {
    if (fname == nullptr) usage("the file name is a null pointer");
    torch::jit::Module loaded = load_script(fname, p.device, "the model");
    copy_state(p.module, loaded, fname);
  });
}

torchfort_result_t torchfort_save_checkpoint(const char *name, const char *checkpoint_dir) {
  return packs.with(__func__, name, [&](Pack &p) {
    if (checkpoint_dir == nullptr) usage("the checkpoint directory is a null pointer");
    if (!p.opt) usage("model '" + p.name + "' has no optimizer: a checkpoint saves training state (use torchfort_save_model)");
    const fs::path dir(checkpoint_dir);
    // Not collective (TorchFort's programs call it on rank 0 only); should several ranks write the
    // same directory, each file is written under a name of its own and renamed into place.
    fs::create_directories(dir);
    write_atomically(dir / "model.pt", [&](const std::string &f) { p.module.save(f); });
    write_atomically(dir / "optimizer.pt", [&](const std::string &f) { torch::save(*p.opt, f); });
    if (p.schedule) write_atomically(dir / "lr.pt", [&](const std::string &f) { p.schedule->save(f); });
    write_atomically(dir / "grads.pt", [&](const std::string &f) { save_grads(p.params, f); });
    write_atomically(dir / "state.pt", [&](const std::string &f) { save_state(p, f); });
  });
}

torchfort_result_t torchfort_load_checkpoint(const char *name, const char *checkpoint_dir, int64_t *step_train,
                                             int64_t *step_inference) {
  return packs.with(__func__, name, [&](Pack &p) {
    if (checkpoint_dir == nullptr) usage("the checkpoint directory is a null pointer");
    if (!p.opt) usage("model '" + p.name + "' has no optimizer to resume");
    const fs::path dir(checkpoint_dir);
    if (!fs::is_directory(dir)) usage("the checkpoint directory " + dir.string() + " does not exist");
    for (const char *f : {"state.pt", "model.pt", "optimizer.pt"}) require_file(dir / f);
    if (p.schedule) require_file(dir / "lr.pt");
    // Read and check everything first; the model changes only once every file has been read (a
    // file that fails leaves it as it was).
    torch::jit::Module loaded = load_script((dir / "model.pt").string(), p.device, "the checkpoint's model");
    const StepCounts counts = load_state((dir / "state.pt").string());
    const auto pairs = state_pairs(p.module, loaded, (dir / "model.pt").string());
    const std::string optimizer_file = (dir / "optimizer.pt").string();
    {
      // (the optimizer's state read into a copy of it over copies of the parameters first: a load
      // that fails clears the state it was loading into)
      std::vector<at::Tensor> copies;
      for (const auto &q : p.params) copies.push_back(q.detach().clone().requires_grad_(q.requires_grad()));
      ftc::load_optimizer_state(*make_optim(p.cfg.optimizer, copies, p.cfg.filename)->opt, optimizer_file, p.device);
    }
    std::optional<Schedule::State> schedule;
    if (p.schedule) schedule = p.schedule->read((dir / "lr.pt").string());
    const auto grads = read_grads(p.params, dir / "grads.pt");  // (gradients accumulated within the cycle)
    copy_pairs(pairs);
    ftc::load_optimizer_state(*p.opt, optimizer_file, p.device);
    if (schedule) p.schedule->apply(*schedule);
    assign_grads(p.params, grads);
    // The captured backward adds into the gradients it found, which load_grads replaced.
    p.train_graph.reset();
    p.inference_graph.reset();
    p.step_train = counts.train;
    p.step_inference = counts.inference;
    p.step_train_current = counts.current;
    // (The generators are rank 0's, which wrote the file: a distributed model's other ranks keep
    // their own rather than draw rank 0's dropout masks.)
    if (counts.rng && (p.comm == nullptr || p.rank == 0)) ftc::set_rng_states(*counts.rng);
    if (step_train != nullptr) *step_train = p.step_train;
    if (step_inference != nullptr) *step_inference = p.step_inference;
  });
}

torchfort_result_t torchfort_set_cudnn_benchmark(const bool flag) {
  return boundary(__func__, [&] { at::globalContext().setBenchmarkCuDNN(flag); });
}

torchfort_result_t torchfort_set_cuda_allow_tf32(const bool flag) {
  return boundary(__func__, [&] {
    at::globalContext().setAllowTF32CuBLAS(flag);
    at::globalContext().setAllowTF32CuDNN(flag);
  });
}

torchfort_result_t torchfort_set_manual_seed(const int seed) {
  return boundary(__func__, [&] { torch::manual_seed(static_cast<uint64_t>(seed)); });
}

torchfort_result_t torchfort_set_cuda_manual_seed(const int seed) {
  return boundary(__func__, [&] { torch::cuda::manual_seed(static_cast<uint64_t>(seed)); });
}

namespace {
template <class T>
torchfort_result_t wandb_log(const char *fn, const char *name, const char *metric_name, int64_t step, T value) {
  return packs.with(fn, name, [&](Pack &p) {
    if (metric_name == nullptr) usage("the metric name is a null pointer");
    log_metric(p, metric_name, step, number_text(value));
  });
}
}  // namespace

torchfort_result_t torchfort_wandb_log_int(const char *name, const char *metric_name, int64_t step, int value) {
  return wandb_log(__func__, name, metric_name, step, value);
}
torchfort_result_t torchfort_wandb_log_float(const char *name, const char *metric_name, int64_t step, float value) {
  return wandb_log(__func__, name, metric_name, step, value);
}
torchfort_result_t torchfort_wandb_log_double(const char *name, const char *metric_name, int64_t step, double value) {
  return wandb_log(__func__, name, metric_name, step, value);
}

torchfort_result_t torchfort_tensor_list_create(torchfort_tensor_list_t *tensor_list) {
  return boundary(__func__, [&] {
    if (tensor_list == nullptr) usage("tensor_list is a null pointer");
    *tensor_list = new TensorList;
  });
}

torchfort_result_t torchfort_tensor_list_destroy(torchfort_tensor_list_t tensor_list) {
  return boundary(__func__, [&] { delete static_cast<TensorList *>(tensor_list); });
}

namespace {
torchfort_result_t add_tensor(const char *fn, torchfort_tensor_list_t tensor_list, void *data_ptr, size_t dim,
                              int64_t *shape, torchfort_datatype_t dtype, bool fortran) {
  return boundary(fn, [&] {
    TensorList &l = list_of(tensor_list, "tensor_list");
    l.tensors.push_back(wrap(data_ptr, dim, shape, dtype, fortran, "data_ptr", false));
  });
}
}  // namespace

torchfort_result_t torchfort_tensor_list_add_tensor(torchfort_tensor_list_t tensor_list, void *data_ptr, size_t dim,
                                                    int64_t *shape, torchfort_datatype_t dtype) {
  return add_tensor(__func__, tensor_list, data_ptr, dim, shape, dtype, false);
}

torchfort_result_t torchfort_tensor_list_add_tensor_F(torchfort_tensor_list_t tensor_list, void *data_ptr, size_t dim,
                                                      int64_t *shape, torchfort_datatype_t dtype) {
  return add_tensor("torchfort_tensor_list_add_tensor", tensor_list, data_ptr, dim, shape, dtype, true);
}
