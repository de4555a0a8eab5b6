// torchfort_common.hpp - what TorchFort's supervised API (torchfort.cpp) and its reinforcement-
// learning API (torchfort_rl.cpp) share: the boundary that turns every failure into a TorchFort
// result code, the caller's arrays as tensors, the built-in MLPs, TorchFort's learning-rate
// schedules, optimizers from a configuration, and checkpoint file helpers.
#pragma once

#include "internal.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unistd.h>
#include <vector>

#ifdef FTORCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "torchfort.h"
#include "torchfort_config.hpp"

namespace tf {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------- errors

// An error with TorchFort's result code.
class Failure : public std::runtime_error {
 public:
  Failure(torchfort_result_t code, const std::string &msg) : std::runtime_error(msg), code_(code) {}
  torchfort_result_t code() const { return code_; }

 private:
  torchfort_result_t code_;
};
[[noreturn]] inline void usage(const std::string &msg) { throw Failure(TORCHFORT_RESULT_INVALID_USAGE, msg); }

torchfort_result_t code_of_status(int status);
torchfort_result_t report(const char *fn, torchfort_result_t code, const std::string &what) noexcept;

// The boundary of every torchfort_* function: no exception crosses it; each failure is a result
// code and a message (standard error, as TorchFort prints it, and ftc_last_error()).
template <class Body>
torchfort_result_t boundary(const char *fn, Body &&body) noexcept {
  try {
    ftc::require_runtime();
    body();
    ftc::set_last_error(std::string());
    return TORCHFORT_RESULT_SUCCESS;
  } catch (const Failure &e) {
    return report(fn, e.code(), e.what());
  } catch (const ConfigError &e) {
    return report(fn, TORCHFORT_RESULT_INVALID_USAGE, e.what());
  } catch (const ftc::Error &e) {
    return report(fn, code_of_status(e.status()), e.what());
  } catch (const std::bad_alloc &) {
    return report(fn, TORCHFORT_RESULT_INTERNAL_ERROR, "out of memory");
  } catch (const c10::Error &e) {
    const std::string text = e.what_without_backtrace();
    const bool cuda = text.find("CUDA error") != std::string::npos;
    return report(fn, cuda ? TORCHFORT_RESULT_CUDA_ERROR : TORCHFORT_RESULT_INTERNAL_ERROR, text);
  } catch (const std::exception &e) {
    return report(fn, TORCHFORT_RESULT_INTERNAL_ERROR, e.what());
  } catch (...) {
    return report(fn, TORCHFORT_RESULT_INTERNAL_ERROR, "unknown exception");
  }
}

// An FTorch C call made from here: its failure as an exception (status and message kept).
void call(int status);

// ---------------------------------------------------------------------------- arrays

c10::ScalarType scalar_type(torchfort_datatype_t dtype, bool floating_only);
// A tensor over the caller's array (no copy). Fortran order: the shape reversed, so that the
// tensor's first dimension is the array's last (the batch, in TorchFort's convention).
at::Tensor wrap(void *data, size_t dim, const int64_t *shape, torchfort_datatype_t dtype, bool fortran,
                const char *what, bool floating_only);
std::string shape_text(const at::Tensor &t);
// Arrays that meet element for element (a model's result and the caller's output array, an output
// and its label) with the same number of elements must also agree on the batch when both have one
// (rank 2 or more: the first C dimension, Fortran's last): y(batch, 3) where y(3, batch) was meant
// would otherwise pair the wrong elements without a word. [B, n*n] against [B, n, n] still meets.
inline void require_same_batch(const at::Tensor &a, const at::Tensor &b, const std::string &a_text,
                               const std::string &b_text) {
  if (a.dim() >= 2 && b.dim() >= 2 && a.size(0) != b.size(0))
    throw Failure(TORCHFORT_RESULT_INVALID_USAGE,
                  a_text + " (" + shape_text(a) + ") and " + b_text + " (" + shape_text(b) + ") have the same number "
                  "of elements but not the same batch (the first C dimension, the last Fortran one): a transposed "
                  "array?");
}

struct TensorList {
  std::vector<at::Tensor> tensors;
};

// The stream (and device) a call runs on: the caller's CUDA stream for a model on a GPU.
struct StreamScope {
#ifdef FTORCH_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> device;
  std::optional<c10::cuda::CUDAStreamGuard> stream;
  StreamScope(const torch::Device &d, cudaStream_t s) {
    if (!d.is_cuda()) return;
    device.emplace(d.index());
    if (s != nullptr) stream.emplace(c10::cuda::getStreamFromExternal(s, d.index()));
  }
#else
  StreamScope(const torch::Device &, cudaStream_t) {}
#endif
};

template <class T>
std::string number_text(T value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// ---------------------------------------------------------------------------- schedules

// TorchFort's learning-rate schedules, with LibTorch's LRScheduler semantics: step() computes the
// new rates from the number of earlier steps (an unsigned count), then counts this one. So each
// schedule is PyTorch's one step later (the first step keeps the initial rate).
class Schedule {
 public:
  Schedule(torch::optim::Optimizer &opt, const SchedulerConfig &cfg) : opt_(opt), cfg_(cfg) { base_ = rates(); }

  void step() {
    std::vector<double> lrs = rates();
    const unsigned n = count_;
    for (size_t i = 0; i < lrs.size(); ++i) lrs[i] = next(lrs[i], base_[i], n);
    for (size_t i = 0; i < lrs.size(); ++i) opt_.param_groups()[i].options().set_lr(lrs[i]);
    ++count_;
  }

  // lr.pt as TorchFort writes it: the step count and the current rates.
  void save(const std::string &path) const {
    torch::serialize::OutputArchive archive;
    archive.write("step_count", c10::IValue(static_cast<int64_t>(count_)));
    archive.write("lrs", c10::IValue(rates()));
    archive.save_to(path);
  }
  // lr.pt read and checked (nothing changes), then applied.
  struct State {
    unsigned count = 0;
    std::vector<double> lrs;
  };
  State read(const std::string &path) const {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    c10::IValue count, lrs;
    if (!archive.try_read("step_count", count) || !archive.try_read("lrs", lrs))
      usage(path + " is not a learning-rate schedule's state (step_count and lrs missing)");
    State state{static_cast<unsigned>(count.toInt()), lrs.toDoubleVector()};
    if (state.lrs.size() != opt_.param_groups().size())
      usage(path + " holds " + std::to_string(state.lrs.size()) + " rates for an optimizer of " +
            std::to_string(opt_.param_groups().size()) + " parameter groups");
    return state;
  }
  void apply(const State &state) {
    count_ = state.count;
    for (size_t i = 0; i < state.lrs.size(); ++i) opt_.param_groups()[i].options().set_lr(state.lrs[i]);
  }
  void load(const std::string &path) { apply(read(path)); }

 private:
  std::vector<double> rates() const {
    std::vector<double> out;
    for (const auto &g : opt_.param_groups()) out.push_back(g.options().get_lr());
    return out;
  }

  double next(double lr, double base, unsigned n) const {
    const SchedulerConfig &c = cfg_;
    if (c.type == "step") {
      const unsigned size = static_cast<unsigned>(c.step_size);
      return (n != 0 && n % size == 0) ? c.gamma * lr : lr;
    }
    if (c.type == "multistep") {
      if (n == 0 || c.milestones.empty()) return lr;
      auto passed = [&](int64_t upto) {
        return std::count_if(c.milestones.begin(), c.milestones.end(), [&](int64_t m) { return m <= upto; });
      };
      return passed(n) != passed(static_cast<int64_t>(n) - 1) ? c.gamma * lr : lr;  // once per step
    }
    if (c.type == "polynomial") {
      const unsigned total = static_cast<unsigned>(c.total_iters);
      if (n == 0 || n > total) return lr;
      const double factor = (1.0 - double(n) / double(total)) / (1.0 - double(n - 1) / double(total));
      return std::pow(factor, c.power) * lr;
    }
    if (c.type == "cosine_annealing") {
      const unsigned t = static_cast<unsigned>(c.t_max);
      if (n == 0 || t == 0) return lr;
      if ((n - 1 - t) % (2 * t) == 0)  // unsigned arithmetic, as LibTorch's count
        return c.eta_min + 0.5 * (base - c.eta_min) * (1.0 + std::cos(double(n) * M_PI / double(t)));
      return (1.0 + std::cos(M_PI * double(n) / double(t))) / (1.0 + std::cos(M_PI * double(n - 1) / double(t))) *
                 (lr - c.eta_min) +
             c.eta_min;
    }
    // linear
    const unsigned total = static_cast<unsigned>(c.total_iters);
    double factor;
    if (n == 0) {
      factor = c.start_factor;
    } else if (n > total) {
      factor = 1.0;
    } else {
      factor = 1.0 + (c.end_factor - c.start_factor) /
                         (double(total) * c.start_factor + double(n - 1) * (c.end_factor - c.start_factor));
    }
    return factor * lr;
  }

  torch::optim::Optimizer &opt_;
  SchedulerConfig cfg_;
  std::vector<double> base_;
  unsigned count_ = 0;
};

// ---------------------------------------------------------------------------- models

// TorchFort's built-in MLP as a TorchScript module (see torchfort.cpp). critic: TorchFort's
// CriticMLP, whose forward takes (state, action), flattens both and concatenates them.
torch::jit::Module build_mlp(const std::vector<int64_t> &layer_sizes, double dropout, bool flatten_non_batch_dims,
                             bool critic = false);
torch::Device model_device(int device);
torch::jit::Module load_script(const std::string &filename, const torch::Device &device, const char *what,
                               const std::string &config = "");
// An optimizer of the configuration over params (FTorch's own object, so that data-parallel
// wrappers attach to it). file: the configuration, for messages.
std::shared_ptr<ftc::Optim> make_optim(const OptimizerConfig &o, const std::vector<at::Tensor> &params,
                                       const std::string &file);
std::vector<at::Tensor> parameters_of(const torch::jit::Module &m);

// ---------------------------------------------------------------------------- files

// The gradients accumulated but not yet applied (grad_accumulation_steps > 1): grads.pt in a
// checkpoint directory, so that a checkpoint taken within an accumulation cycle resumes it exactly
// (a file without a parameter's entry: that gradient is undefined; no file: nothing changes).
inline void save_grads(const std::vector<at::Tensor> &params, const std::string &file) {
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].grad().defined()) archive.write("g" + std::to_string(i), params[i].grad());
  archive.save_to(file);
}

// grads.pt read and checked (nothing changes; none when the file is missing: nullopt), then given to
// the parameters.
inline std::optional<std::vector<at::Tensor>> read_grads(const std::vector<at::Tensor> &params, const fs::path &file) {
  if (!fs::exists(file)) return std::nullopt;
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  std::vector<at::Tensor> grads(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor g;
    if (archive.try_read("g" + std::to_string(i), g)) {
      if (g.sizes() != params[i].sizes()) usage(file.string() + " holds gradients of another network");
      grads[i] = g.to(params[i].device(), params[i].scalar_type());
    }
  }
  return grads;
}
inline void assign_grads(std::vector<at::Tensor> &params, const std::optional<std::vector<at::Tensor>> &grads) {
  if (!grads) return;
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = (*grads)[i];
}
inline void load_grads(std::vector<at::Tensor> &params, const fs::path &file) {
  assign_grads(params, read_grads(params, file));
}

// The parameters and buffers of `from` into the same-named ones of `to`, after checking that every
// name and shape agrees (nothing changes otherwise).
// What a TorchScript module returns for args (a tensor, or the items of a tuple or list of
// tensors); what names the module in errors ("the model").
std::vector<at::Tensor> forward_tensors(torch::jit::Module &module, std::vector<c10::IValue> args, const char *what);
void copy_state(torch::jit::Module &to, const torch::jit::Module &from, const std::string &file);
// path written by write(temporary name), then renamed into place: readers and other writers
// never see a partly written file.
template <class Write>
void write_atomically(const fs::path &path, Write &&write) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  try {
    write(tmp.string());
    fs::rename(tmp, path);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

void require_file(const fs::path &path);

// The wandb hook: a metric line appended to log_file. write_metric is the program's own metric
// (torchfort_*wandb_log_*): a line that cannot be written fails that call. write_step_metric is a
// line a training step writes after it has updated the model: a failure there must not fail a call
// whose work is done (a caller retrying it would train twice), so it is a TORCHFORT::WARN line on
// standard error instead, once each time the log goes from writable to failing.
void write_metric(const fs::path &log_file, const std::string &model, const std::string &metric, int64_t step,
                  const std::string &value);
void write_step_metric(const fs::path &log_file, const std::string &model, const std::string &metric, int64_t step,
                       const std::string &value);
// The log of a model named `name` (its configuration copied next to it), checked writable (an
// error otherwise), or an empty path when TORCHFORT_LOGDIR is not set.
fs::path wandb_log_file(const std::string &name, const std::string &config_text);

// The objects of one kind (supervised models, off- and on-policy systems) by name, as every
// torchfort_* call reaches them: looked up under the registry's lock, used under the object's own
// (T has `name` and `mutex`).
template <class T>
class Registry {
 public:
  // noun: "model"; kind: "off-policy" (or ""); create_fn: the C function that makes one (named
  // when a name is unknown).
  Registry(const char *noun, const char *kind, const char *create_fn) : noun_(noun), kind_(kind), create_fn_(create_fn) {}

  std::shared_ptr<T> find(const char *name) {
    if (name == nullptr) usage(std::string("the ") + noun_ + " name is a null pointer");
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(name);
    if (it == objects_.end()) {
      std::string known;
      for (const auto &entry : objects_) known += (known.empty() ? "" : ", ") + entry.first;
      usage(std::string("no ") + kind_ + (*kind_ != '\0' ? " " : "") + noun_ + " named '" + name +
            "' (create it with " + create_fn_ + "; " + noun_ + "s: " + (known.empty() ? "none" : known) + ")");
    }
    return it->second;
  }

  // body(object) for a call of C function fn on the object called name.
  template <class Body>
  torchfort_result_t with(const char *fn, const char *name, Body &&body) {
    return boundary(fn, [&] {
      std::shared_ptr<T> object = find(name);
      std::lock_guard<std::mutex> lock(object->mutex);
      body(*object);
    });
  }

  // Before the work of making one: a name in use fails.
  void require_free(const char *name) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (objects_.count(name)) taken(name);
  }

  void add(const std::shared_ptr<T> &object) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!objects_.emplace(object->name, object).second) taken(object->name);
  }

 private:
  [[noreturn]] void taken(const std::string &name) const {
    usage(std::string("a ") + noun_ + " named '" + name + "' exists already (each " + noun_ + " needs its own name)");
  }

  const char *noun_;
  const char *kind_;
  const char *create_fn_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<T>> objects_;
};

}  // namespace tf
