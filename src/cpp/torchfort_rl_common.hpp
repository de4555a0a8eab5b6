// torchfort_rl_common.hpp - what TorchFort's off-policy (torchfort_rl.cpp) and on-policy
// (torchfort_rl_on_policy.cpp) systems share: a trained network, running normalization, the
// caller's state and action arrays as batches.
#pragma once

#include "torchfort_common.hpp"
#include "rng_state.hpp"

#include <exception>

namespace tf {
namespace rl {

// A network of the system with what trains it (targets have no optimizer).
struct Net {
  torch::jit::Module module;
  std::vector<at::Tensor> params;
  std::shared_ptr<ftc::Optim> optim;
  std::unique_ptr<Schedule> schedule;
  int64_t step_train = 0, step_current = 0;  // optimizer steps, and calls within the accumulation

  void set(torch::jit::Module m) {
    module = std::move(m);
    params = parameters_of(module);
  }
};

// The tensors a network returns (a tensor, or the items of a tuple or list).
inline std::vector<at::Tensor> forward_all(Net &net, std::vector<c10::IValue> args) {
  return forward_tensors(net.module, std::move(args), "a network");
}

// The first tensor a network returns.
inline at::Tensor forward(Net &net, std::vector<c10::IValue> args) { return forward_all(net, std::move(args))[0]; }

inline void set_requires_grad(Net &net, bool flag) {
  for (auto &p : net.params) p.requires_grad_(flag);
}

// Per-feature running mean and spread of what the buffer receives (Chan et al.'s parallel update
// of Welford's sums), and values scaled by them: (x - mean) / sqrt(var + eps), or x / sqrt(var + eps)
// (scale only, for rewards), var the unbiased variance; unchanged before two samples are seen.
class RunningNormalizer {
 public:
  explicit RunningNormalizer(bool scale_only) : scale_only_(scale_only) {}

  void update(const at::Tensor &x) {
    torch::NoGradGuard no_grad;
    const int64_t n = x.size(0);
    // Accumulated in float64 whatever the system's dtype: a float32 mean stops moving once each
    // batch's contribution falls below half its ulp (a feature of 300 +- 0.01 after ~10^3 samples).
    const at::Tensor flat = x.reshape({n, -1}).cpu().to(at::kDouble);
    const at::Tensor mean = flat.mean(0);
    const at::Tensor m2 = at::sum(at::square(flat - mean.unsqueeze(0)), 0);
    if (count_ == 0) {
      mean_ = mean;
      m2_ = m2;
      count_ = n;
      return;
    }
    const int64_t total = count_ + n;
    const at::Tensor delta = mean - mean_;
    mean_ = mean_ + delta * (static_cast<double>(n) / static_cast<double>(total));
    m2_ = m2_ + m2 + at::square(delta) * (static_cast<double>(count_) * static_cast<double>(n) / static_cast<double>(total));
    count_ = total;
  }

  at::Tensor operator()(const at::Tensor &x) const {
    if (count_ < 2) return x;
    torch::NoGradGuard no_grad;
    const at::Tensor flat = x.reshape({x.size(0), -1});
    const auto options = x.options().requires_grad(false);
    const at::Tensor spread = at::sqrt(m2_ / static_cast<double>(count_ - 1) + kEps).to(options);
    if (flat.size(1) != spread.size(0))
      usage("the normalizer has seen " + std::to_string(spread.size(0)) + " features per sample, this input has " +
            std::to_string(flat.size(1)));
    const at::Tensor y = scale_only_ ? flat / spread : (flat - mean_.to(options)) / spread;
    return y.reshape(x.sizes());
  }

  bool initialized() const { return count_ > 0; }

  void write(torch::serialize::OutputArchive &archive, const std::string &key) const {
    archive.write(key + "_count", c10::IValue(count_));
    if (count_ > 0) {
      archive.write(key + "_mean", mean_);
      archive.write(key + "_m2", m2_);
    }
  }
  void read(torch::serialize::InputArchive &archive, const std::string &key, const std::string &file) {
    c10::IValue count;
    if (!archive.try_read(key + "_count", count)) usage(file + " has no " + key + " statistics");
    count_ = count.toInt();
    if (count_ > 0 && (!archive.try_read(key + "_mean", mean_) || !archive.try_read(key + "_m2", m2_)))
      usage(file + " has no " + key + " statistics");
    if (count_ > 0) {  // (float32 in checkpoints of systems before the statistics were float64)
      mean_ = mean_.to(at::kDouble);
      m2_ = m2_.to(at::kDouble);
    }
  }

 private:
  static constexpr double kEps = 1e-8;
  bool scale_only_;
  int64_t count_ = 0;
  at::Tensor mean_, m2_;
};

// load_model's state statistics: the networks of a checkpoint saved by a system that normalizes
// states were trained on states normalized with the statistics in its state.pt, and predict the
// same only with them. A system that normalizes reads them (an error when the checkpoint has
// none); one that does not refuses a checkpoint whose networks saw normalized states.
inline std::optional<RunningNormalizer> model_state_statistics(const fs::path &dir, bool normalizes) {
  const fs::path file = dir / "state.pt";
  if (!normalizes && !fs::is_regular_file(file)) return std::nullopt;
  require_file(file);
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  if (!normalizes) {
    c10::IValue count;
    if (archive.try_read("state_normalizer_count", count) && count.toInt() > 0)
      usage("the networks in " + dir.string() + " were trained on normalized states (normalize_states: true) and "
            "this system does not normalize them: its predictions would be of other inputs");
    return std::nullopt;
  }
  RunningNormalizer statistics(false);
  statistics.read(archive, "state_normalizer", file.string());
  return statistics;
}

// A state array as a batch: a state of rank 1 is one sample, and so is a state of any rank whose
// action (an action array of rank 1) is one sample (a 2-D field as the state of one environment).
inline at::Tensor batch_of(const at::Tensor &state, const at::Tensor &action) {
  return state.dim() == 1 || action.dim() == 1 ? state.unsqueeze(0) : state;
}

// result into the caller's array out (same number of elements).
inline void deliver(const at::Tensor &result, at::Tensor &out, const char *what) {
  if (result.numel() != out.numel())
    usage(std::string("the ") + what + " array is " + shape_text(out) + " (" + std::to_string(out.numel()) +
          " elements); the system computes " + shape_text(result) + " (" + std::to_string(result.numel()) +
          " elements)");
  require_same_batch(result, out, std::string("what the system computes"), std::string("the ") + what + " array");
  out.copy_(result.reshape(out.sizes()));
}

// A transition's values in the system's dtype; a NaN or an infinity (given, or a real64 beyond the
// range of a float32 system) is an error before anything is stored: in the buffer it would poison
// every batch that samples it, and in a running normalizer every later prediction.
inline at::Tensor finite_values(const at::Tensor &t, c10::ScalarType dtype, const char *what) {
  at::Tensor v = t.to(dtype);
  if (!at::isfinite(v).all().item<bool>()) {
    const bool narrowed = t.scalar_type() != dtype && at::isfinite(t).all().item<bool>();
    usage(std::string(what) + " holds a NaN or an infinity" +
          (narrowed ? std::string(" (a value beyond the range of the system's ") + c10::toString(dtype) + ")" : "") +
          "; nothing was stored");
  }
  return v;
}

// final_state as the buffer's done flags (1 where the episode ended, 0 elsewhere): a value that is
// not finite is an error, as for the other values of a transition (NaN != 0 would end the episode).
inline at::Tensor done_flags(const at::Tensor &final_state, c10::ScalarType dtype) {
  return (finite_values(final_state, dtype, "final_state").reshape({-1}) != 0).to(dtype);
}

// A loss about to be backpropagated: a value that is not finite stops the step before the networks
// it would update change, with what to try; `changed` says what the step did update before it (the
// critics before the policy's loss; SAC's alpha before the critics'), "" for nothing.
inline double finite_loss(const at::Tensor &loss, const char *what, int64_t step, const char *changed = "") {
  const double value = loss.item<double>();
  if (!std::isfinite(value))
    throw Failure(TORCHFORT_RESULT_INTERNAL_ERROR,
                  std::string("the ") + what + " is " + std::to_string(value) + " at training step " +
                      std::to_string(step) + "; " +
                      (*changed != '\0' ? std::string("this step had already updated ") + changed + " and changed no other network"
                                        : std::string("no network was changed by this step")) +
                      " (lower the learning rate, clip gradients with max_grad_norm, or bound the actions: a "
                      "squashed actor, smaller sigma)");
  return value;
}

// An optimizer's step. Adam's runs as multi-tensor (_foreach_) operations over each parameter group
// (a few kernels instead of a handful per parameter: the small networks of reinforcement learning
// have many small tensors), with exactly the arithmetic of LibTorch's Adam::step and its state
// (AdamParamState: checkpoints and torch::optim::Adam read it unchanged). Other optimizers, and a
// group whose parameters have taken different numbers of steps, use the optimizer's own step.
inline void optimizer_step(torch::optim::Optimizer &opt) {
  auto *adam = dynamic_cast<torch::optim::Adam *>(&opt);
  if (adam == nullptr) {
    opt.step();
    return;
  }
  torch::NoGradGuard no_grad;
  auto &states = adam->state();
  // every group first checked, so that a fallback happens before anything changed
  for (auto &group : adam->param_groups())
    for (auto &p : group.params()) {
      if (!p.grad().defined()) continue;
      auto it = states.find(p.unsafeGetTensorImpl());
      const int64_t step = it == states.end() ? 0 : static_cast<torch::optim::AdamParamState &>(*it->second).step();
      const auto first = group.params().front();
      auto f = states.find(first.unsafeGetTensorImpl());
      const int64_t step0 = f == states.end() ? 0 : static_cast<torch::optim::AdamParamState &>(*f->second).step();
      if (step != step0 || p.grad().is_sparse()) {
        opt.step();
        return;
      }
    }
  for (auto &group : adam->param_groups()) {
    const auto &o = static_cast<const torch::optim::AdamOptions &>(group.options());
    std::vector<at::Tensor> params, grads, m, v, vmax;
    int64_t step = 0;
    for (auto &p : group.params()) {
      if (!p.grad().defined()) continue;
      auto &slot = states[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto st = std::make_unique<torch::optim::AdamParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) st->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto &st = static_cast<torch::optim::AdamParamState &>(*slot);
      st.step(st.step() + 1);
      step = st.step();
      params.push_back(p);
      grads.push_back(p.grad());
      m.push_back(st.exp_avg());
      v.push_back(st.exp_avg_sq());
      if (o.amsgrad()) vmax.push_back(st.max_exp_avg_sq());
    }
    if (params.empty()) continue;
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    const double correction1 = 1 - std::pow(beta1, step), correction2 = 1 - std::pow(beta2, step);
    if (o.weight_decay() != 0) grads = at::_foreach_add(grads, params, o.weight_decay());
    at::_foreach_mul_(m, beta1);
    at::_foreach_add_(m, grads, 1 - beta1);
    at::_foreach_mul_(v, beta2);
    at::_foreach_addcmul_(v, grads, grads, 1 - beta2);
    std::vector<at::Tensor> denom;
    if (o.amsgrad()) {
      at::_foreach_maximum_(vmax, v);
      denom = at::_foreach_sqrt(vmax);
    } else {
      denom = at::_foreach_sqrt(v);
    }
    at::_foreach_div_(denom, std::sqrt(correction2));
    at::_foreach_add_(denom, o.eps());
    at::_foreach_addcdiv_(params, m, denom, -(o.lr() / correction1));
  }
}

// torch.nn.utils.clip_grad_norm_ with multi-tensor (_foreach_) kernels: the same norms and scaling
// as LibTorch's per-parameter loop, in a few operations for all of a network's gradients.
inline void clip_grad_norm(const std::vector<at::Tensor> &params, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto &p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  const at::Tensor total = at::stack(at::_foreach_norm(grads, 2)).norm(2);
  const at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  at::_foreach_mul_(grads, coef);
}

// log N(value; mu, sigma) elementwise.
inline at::Tensor normal_log_prob(const at::Tensor &value, const at::Tensor &mu, const at::Tensor &sigma) {
  return -at::square(value - mu) / (2 * at::square(sigma)) - sigma.log() - std::log(std::sqrt(2.0 * M_PI));
}

// Summed over each sample's elements: [batch, ...] -> [batch].
inline at::Tensor per_sample_sum(const at::Tensor &t) { return at::sum(at::flatten(t, 1), 1); }

// log(1 - tanh(u)^2) written stably, 2 (log 2 - u - softplus(-2 u)), summed per sample.
inline at::Tensor tanh_log_det(const at::Tensor &u) {
  return per_sample_sum(2.0 * (std::log(2.0) - u - at::softplus(-2.0 * u)));
}

// The step counters of a checkpoint's state.pt (the key's value, or none).
inline void read_counter(torch::serialize::InputArchive &archive, const std::string &key, int64_t &value) {
  c10::IValue v;
  if (archive.try_read(key, v)) value = v.toInt();
}

// A network's files in a checkpoint directory: model.pt, and optimizer.pt, lr.pt and grads.pt when
// trained.
inline void save_net(const Net &net, const fs::path &dir) {
  fs::create_directories(dir);
  write_atomically(dir / "model.pt", [&](const std::string &f) { net.module.save(f); });
  if (net.optim) write_atomically(dir / "optimizer.pt", [&](const std::string &f) { torch::save(*net.optim->opt, f); });
  if (net.schedule) write_atomically(dir / "lr.pt", [&](const std::string &f) { net.schedule->save(f); });
  if (net.optim) write_atomically(dir / "grads.pt", [&](const std::string &f) { save_grads(net.params, f); });
}


// ---------------------------------------------------------------------------- distributed systems

// The ranks of a distributed system (torchfort_rl_*_create_distributed_system). Each rank keeps its
// own buffer, fed by its own environments, and samples it with its own generator; the networks
// train as one: each trained network has FTorch's data-parallel wrapper (as
// torchfort_create_distributed_model: rank 0's parameters broadcast when the system is made, the
// gradients and the losses averaged over the ranks at every update). Every collective of a step
// runs on every rank in the same order; a rank that fails takes part in the next one with a
// failure flag, so that the others fail too instead of waiting.
struct Ranks {
  ftc_comm comm = nullptr;
  int rank = 0, size = 1;
  std::vector<ftc_ddp> ddps;

  explicit Ranks(ftc_comm c) {
    if (c == nullptr) usage("the communicator is null");
    call(ftc_comm_share(c, &comm));
    call(ftc_comm_rank(comm, &rank));
    call(ftc_comm_size(comm, &size));
  }
  Ranks(const Ranks &) = delete;
  Ranks &operator=(const Ranks &) = delete;
  ~Ranks() {
    for (ftc_ddp &d : ddps) ftc_ddp_delete(&d);
    ftc_comm_delete(&comm);
  }

  // The parameters of module (trained by optim) become rank 0's; from now on its gradients are
  // averaged over the ranks before each update (ftc::before_update) or where averaged() says.
  void attach(const torch::jit::Module &module, const std::shared_ptr<ftc::Optim> &optim) {
    auto model = std::make_shared<ftc::Model>();
    model->module = module;  // (the same module: a jit::Module is a reference)
    ftc_model m = nullptr;
    ftc_optim o = nullptr;
    ftc::replace_handle<ftc::ModelTable>(&m, model);
    ftc::replace_handle<ftc::OptimTable>(&o, optim);
    ftc_ddp d = nullptr;
    const int status = ftc_ddp_new(&d, comm, m, o, 25 * 1024 * 1024);  // c10d's default bucket size
    ftc_model_delete(&m);
    ftc_optim_delete(&o);
    call(status);
    ddps.push_back(d);
  }

  // The sum over the ranks of a few values (one small all-reduce).
  std::vector<double> sum(std::vector<double> values) {
    ftc_tensor t = ftc::new_tensor_handle(at::from_blob(values.data(), {static_cast<int64_t>(values.size())},
                                                         at::TensorOptions().dtype(at::kDouble)));
    const int status = ftc_allreduce(comm, t, FTC_OP_SUM);
    ftc_tensor_delete(&t);
    call(status);
    return values;
  }

  // Runs body on every rank; then every rank learns whether any failed. A rank whose body failed
  // rethrows its own error; the others fail with TORCHFORT_RESULT_MPI_ERROR.
  template <class Body>
  void together(const std::string &what, Body &&body) {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    const double failed = sum({error ? 1.0 : 0.0})[0];
    if (error) std::rethrow_exception(error);
    if (failed > 0)
      throw Failure(TORCHFORT_RESULT_MPI_ERROR, std::to_string(static_cast<int64_t>(failed)) + " of " +
                                                    std::to_string(size) + " ranks failed " + what +
                                                    " (see their errors); this rank stopped too");
  }
};

// A distributed system's creation in a program built without torchfort_mpi.c.
[[noreturn]] inline void mpi_missing() {
  throw Failure(TORCHFORT_RESULT_NOT_SUPPORTED,
                "distributed systems need MPI, which FTorch takes from your program: compile torchfort_mpi.c with "
                "your MPI into it (CMake: target_link_libraries(... FTorch::torchfort_mpi); otherwise mpicc -c "
                "$(python -m ftorch --torchfort-mpi-source) $(pkg-config --cflags ftorch))");
}

// Runs body on every rank, or as it is without ranks.
template <class Body>
void together(Ranks *ranks, const std::string &what, Body &&body) {
  if (ranks == nullptr) {
    body();
  } else {
    ranks->together(what, std::forward<Body>(body));
  }
}

// body computes the losses of networks trained by optims and their gradients (returning the loss
// reported); in a distributed system, the gradients of each are then averaged over the ranks, and
// the loss returned is the mean over the ranks. A failure in body reaches the other ranks, which
// are waiting in the first average, and no rank keeps the step's gradients (ftc::reduced_step).
template <class Body>
double averaged(const std::vector<ftc::Optim *> &optims, Body &&body) {
  return ftc::reduced_step(optims, std::forward<Body>(body));
}

// A load on every rank: load(checked) reads and checks everything and calls checked() before it
// changes anything. On ranks, checked() waits until every rank has checked its files: a rank that
// failed before tells the others, and then no rank changes anything.
template <class Load>
void load_together(Ranks *ranks, const std::string &what, Load &&load) {
  if (ranks == nullptr) {
    load([] {});
    return;
  }
  bool reached = false;
  try {
    load([&] {
      reached = true;
      const double failed = ranks->sum({0.0})[0];
      if (failed > 0)
        throw Failure(TORCHFORT_RESULT_MPI_ERROR, std::to_string(static_cast<int64_t>(failed)) + " of " +
                                                      std::to_string(ranks->size) + " ranks failed to read " + what +
                                                      " (see their errors); nothing changed on any rank");
    });
  } catch (...) {
    if (!reached) {
      try {
        ranks->sum({1.0});
      } catch (...) {
        // the error being reported is the one that propagates
      }
    }
    throw;
  }
}

// The directory of this rank's checkpoint: dir on rank 0 (a complete checkpoint, which a single
// process can load too), dir/rank_<r> on the others (each rank has its own buffer and generators).
inline fs::path rank_dir(const fs::path &dir, const Ranks *ranks) {
  return ranks == nullptr || ranks->rank == 0 ? dir : dir / ("rank_" + std::to_string(ranks->rank));
}

// ---------------------------------------------------------------------------- systems by name

// The systems of one kind (off-policy, on-policy) by name, and the entry points that both kinds
// have, written once. Each entry point looks its system up under the registry's lock, then runs
// under the system's own lock. What a System has for them: name, mutex, ranks, buffer (ready()),
// log_file, rank; and the free functions distribute, save_checkpoint, load_checkpoint and
// load_model of its namespace (found by argument-dependent lookup).
template <class System>
class Systems : public Registry<System> {
 public:
  // kind: "off-policy"; create_fn: the C function that makes one (named when a name is unknown).
  Systems(const char *kind, const char *create_fn) : Registry<System>("system", kind, create_fn) {}
  using Registry<System>::with;

  // torchfort_rl_*_create_system: make() builds the system called name (a name in use fails first).
  template <class Make>
  torchfort_result_t create(const char *fn, const char *name, Make &&make) {
    return boundary(fn, [&] { this->add(made(name, make)); });
  }

  // torchfort_rl_*_create_distributed_system: the same on every rank of comm, which then train as one.
  template <class Make>
  torchfort_result_t create_distributed(const char *fn, const char *name, ftc_comm comm, Make &&make) {
    return boundary(fn, [&] {
      auto ranks = std::make_unique<Ranks>(comm);
      std::shared_ptr<System> sys;
      ranks->together("to create the system", [&] { sys = made(name, make); });
      distribute(*sys, std::move(ranks));
      this->add(sys);
    });
  }

  torchfort_result_t save(const char *fn, const char *name, const char *checkpoint_dir) {
    return with(fn, name, [&](System &sys) {
      together(sys.ranks.get(), "to write the checkpoint", [&] {
        if (checkpoint_dir == nullptr) usage("the checkpoint directory is a null pointer");
        save_checkpoint(sys, rank_dir(checkpoint_dir, sys.ranks.get()));
      });
    });
  }

  torchfort_result_t load(const char *fn, const char *name, const char *checkpoint_dir) {
    return with(fn, name, [&](System &sys) {
      load_together(sys.ranks.get(), "the checkpoint", [&](const std::function<void()> &checked) {
        if (checkpoint_dir == nullptr) usage("the checkpoint directory is a null pointer");
        load_checkpoint(sys, rank_dir(checkpoint_dir, sys.ranks.get()), checked);
      });
    });
  }

  torchfort_result_t load_models(const char *fn, const char *name, const char *checkpoint_dir) {
    return with(fn, name, [&](System &sys) {
      load_together(sys.ranks.get(), "the model", [&](const std::function<void()> &checked) {
        if (checkpoint_dir == nullptr) usage("the checkpoint directory is a null pointer");
        load_model(sys, checkpoint_dir, checked);
      });
    });
  }

  torchfort_result_t is_ready(const char *fn, const char *name, bool *ready) {
    return with(fn, name, [&](System &sys) {
      if (ready == nullptr) usage("ready is a null pointer");
      *ready = sys.buffer->ready();
    });
  }

  // torchfort_rl_*_wandb_log_int/float/double: a line of the metrics log (rank 0, when configured).
  template <class T>
  torchfort_result_t wandb_log(const char *fn, const char *name, const char *metric_name, int64_t step, T value) {
    return with(fn, name, [&](System &sys) {
      if (metric_name == nullptr) usage("the metric name is a null pointer");
      if (!sys.log_file.empty() && sys.rank == 0) write_metric(sys.log_file, sys.name, metric_name, step, number_text(value));
    });
  }


 private:
  template <class Make>
  std::shared_ptr<System> made(const char *name, Make &make) {
    if (name != nullptr) this->require_free(name);
    return make();
  }
};

// ---------------------------------------------------------------------------- arrays in, arrays out

// torchfort_rl_*_predict(_explore): the policy's actions for the states, into the action array.
// What a kind adds is action_of(sys, states, explore) (found by argument-dependent lookup in the
// kind's namespace): the actions of a batch of states as the caller receives them.
template <class System>
torchfort_result_t predict_arrays(const char *fn, Systems<System> &systems, const char *name, void *state,
                                  size_t state_dim, int64_t *state_shape, void *action, size_t action_dim,
                                  int64_t *action_shape, torchfort_datatype_t dtype, cudaStream_t stream, bool explore,
                                  bool fortran) {
  return systems.with(fn, name, [&](System &sys) {
    const at::Tensor s = wrap(state, state_dim, state_shape, dtype, fortran, "state", true);
    at::Tensor out = wrap(action, action_dim, action_shape, dtype, fortran, "action", true);
    StreamScope scope(sys.model_device, stream);
    torch::NoGradGuard no_grad;
    deliver(action_of(sys, sys.state_in(batch_of(s, out)), explore), out, "action");
  });
}

// torchfort_rl_*_evaluate: the critic's value of the states and actions, into the reward array.
// What a kind adds is value_of(sys, states, actions): one value per sample.
template <class System>
torchfort_result_t evaluate_arrays(const char *fn, Systems<System> &systems, const char *name, void *state,
                                   size_t state_dim, int64_t *state_shape, void *action, size_t action_dim,
                                   int64_t *action_shape, void *reward, size_t reward_dim, int64_t *reward_shape,
                                   torchfort_datatype_t dtype, cudaStream_t stream, bool fortran) {
  return systems.with(fn, name, [&](System &sys) {
    const at::Tensor s = wrap(state, state_dim, state_shape, dtype, fortran, "state", true);
    const at::Tensor a = wrap(action, action_dim, action_shape, dtype, fortran, "action", true);
    at::Tensor out = wrap(reward, reward_dim, reward_shape, dtype, fortran, "reward", true);
    StreamScope scope(sys.model_device, stream);
    torch::NoGradGuard no_grad;
    deliver(value_of(sys, sys.state_in(batch_of(s, a)), a.dim() == 1 ? a.unsqueeze(0) : a), out, "reward");
  });
}

}  // namespace rl
}  // namespace tf


// ---------------------------------------------------------------------------- the shared C API

// Each torchfort_rl_* call on arrays comes twice: FN reads C-ordered arrays, FN_F the Fortran
// module's (column-major, shapes as Fortran declares them). One definition makes both; messages name
// FN. PARAMS is the parenthesised parameter list, IMPL(fn, ARGS..., fortran) the implementation.
#define TORCHFORT_RL_UNPAREN(...) __VA_ARGS__
#define TORCHFORT_RL_ARRAYS_ENTRY(FN, PARAMS, IMPL, ARGS)                               \
  torchfort_result_t FN PARAMS { return IMPL(#FN, TORCHFORT_RL_UNPAREN ARGS, false); } \
  torchfort_result_t FN##_F PARAMS { return IMPL(#FN, TORCHFORT_RL_UNPAREN ARGS, true); }

// The entry points that off-policy and on-policy systems share (all but their buffer updates and
// on-policy's reset), defined once for a kind: KIND is off_policy or on_policy, NS the namespace
// holding its System, its systems registry, create_system, train_step, action_of and value_of.
// The definitions are checked against torchfort_rl.h (from src/capi/torchfort_rl.capi): an
// extern "C" function cannot be defined with another signature than the one declared.
#define TORCHFORT_RL_SHARED_ENTRY_POINTS(KIND, NS)                                                                   \
  torchfort_result_t torchfort_rl_##KIND##_create_system(const char *name, const char *config_fname,                \
                                                         int model_device, int rb_device) {                          \
    return NS::systems.create(__func__, name,                                                                        \
                              [&] { return NS::create_system(name, config_fname, model_device, rb_device); });      \
  }                                                                                                                  \
  torchfort_result_t ftc_torchfort_rl_##KIND##_create_distributed(const char *name, const char *config_fname,        \
                                                                  ftc_comm comm, int model_device, int rb_device) {  \
    return NS::systems.create_distributed("torchfort_rl_" #KIND "_create_distributed_system", name, comm, [&] {      \
      return NS::create_system(name, config_fname, model_device, rb_device);                                         \
    });                                                                                                              \
  }                                                                                                                  \
  /* Without torchfort_mpi.c in the program (which defines it with the program's MPI). */                          \
  torchfort_result_t torchfort_rl_##KIND##_create_distributed_system_F(const char *name, const char *config_fname,  \
                                                                       int mpi_comm_f, int model_device,             \
                                                                       int rb_device) {                              \
    (void)name, (void)config_fname, (void)mpi_comm_f, (void)model_device, (void)rb_device;                           \
    return ::tf::boundary("torchfort_rl_" #KIND "_create_distributed_system", [] { ::tf::rl::mpi_missing(); });     \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_train_step(const char *name, float *p_loss_val, float *q_loss_val,       \
                                                      cudaStream_t stream) {                                         \
    return NS::systems.with(__func__, name, [&](NS::System &sys) {                                                   \
      if (p_loss_val == nullptr || q_loss_val == nullptr)                                                            \
        ::tf::usage("p_loss_val and q_loss_val must not be null pointers");                                          \
      ::tf::StreamScope scope(sys.model_device, stream);                                                             \
      NS::train_step(sys, *p_loss_val, *q_loss_val);                                                                 \
    });                                                                                                              \
  }                                                                                                                  \
  TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_##KIND##_predict_explore,                                                  \
                            (const char *name, void *state, size_t state_dim, int64_t *state_shape, void *action,    \
                             size_t action_dim, int64_t *action_shape, torchfort_datatype_t dtype,                   \
                             cudaStream_t stream),                                                                   \
                            ::tf::rl::predict_arrays,                                                                \
                            (NS::systems, name, state, state_dim, state_shape, action, action_dim, action_shape,     \
                             dtype, stream, true))                                                                   \
  TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_##KIND##_predict,                                                          \
                            (const char *name, void *state, size_t state_dim, int64_t *state_shape, void *action,    \
                             size_t action_dim, int64_t *action_shape, torchfort_datatype_t dtype,                   \
                             cudaStream_t stream),                                                                   \
                            ::tf::rl::predict_arrays,                                                                \
                            (NS::systems, name, state, state_dim, state_shape, action, action_dim, action_shape,     \
                             dtype, stream, false))                                                                  \
  TORCHFORT_RL_ARRAYS_ENTRY(torchfort_rl_##KIND##_evaluate,                                                         \
                            (const char *name, void *state, size_t state_dim, int64_t *state_shape, void *action,    \
                             size_t action_dim, int64_t *action_shape, void *reward, size_t reward_dim,              \
                             int64_t *reward_shape, torchfort_datatype_t dtype, cudaStream_t stream),                \
                            ::tf::rl::evaluate_arrays,                                                               \
                            (NS::systems, name, state, state_dim, state_shape, action, action_dim, action_shape,     \
                             reward, reward_dim, reward_shape, dtype, stream))                                       \
  torchfort_result_t torchfort_rl_##KIND##_save_checkpoint(const char *name, const char *checkpoint_dir) {           \
    return NS::systems.save(__func__, name, checkpoint_dir);                                                         \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_load_checkpoint(const char *name, const char *checkpoint_dir) {           \
    return NS::systems.load(__func__, name, checkpoint_dir);                                                         \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_load_model(const char *name, const char *checkpoint_dir) {                \
    return NS::systems.load_models(__func__, name, checkpoint_dir);                                                  \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_is_ready(const char *name, bool *ready) {                                 \
    return NS::systems.is_ready(__func__, name, ready);                                                              \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_wandb_log_int(const char *name, const char *metric_name, int64_t step,    \
                                                         int value) {                                                \
    return NS::systems.wandb_log(__func__, name, metric_name, step, value);                                          \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_wandb_log_float(const char *name, const char *metric_name, int64_t step,  \
                                                           float value) {                                            \
    return NS::systems.wandb_log(__func__, name, metric_name, step, value);                                          \
  }                                                                                                                  \
  torchfort_result_t torchfort_rl_##KIND##_wandb_log_double(const char *name, const char *metric_name,               \
                                                            int64_t step, double value) {                            \
    return NS::systems.wandb_log(__func__, name, metric_name, step, value);                                          \
  }
