// graph_step.cpp - the training step as a CUDA graph (ftc_train_step_cuda_graph): after a few
// eager warm-up steps, forward, loss, backward, clipping and the optimizer's update are captured
// once and then replayed on the same device buffers, one launch per step instead of hundreds.
//
// A replayed graph repeats its kernels with the arguments they were captured with, so nothing
// that changes from step to step may be a host number inside it: the update reads the learning
// rate and Adam's bias corrections from a small device tensor that the host fills before each
// replay (graph_update). LibTorch's own optimizers compute those on the host, which is why the
// update here is FTorch's, written to give the same values (tested against them on the CPU with
// FTORCH_CUDA_GRAPHS=eager, which runs these same steps without capturing them).
#include "internal.hpp"
#include "captured_call.hpp"
#include "optim_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#ifdef FTORCH_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ftc {

struct TrainGraph {
  std::vector<int64_t> key;   // what the capture depends on (see key_of): another key starts over
  int64_t calls = 0;          // steps taken with this key
  std::vector<size_t> updated;  // parameters the update changes (those with a gradient)
  at::Tensor scalars;         // [parameters, 3] float64 where the parameters are: read by the update
  at::Tensor host_scalars;    // the same on the host (pinned for a CUDA device), filled each step
  at::Tensor loss;            // the loss of the captured step, where the parameters are
  std::string capture_error;   // why capturing this key failed (later steps fail at once with it)
#ifdef FTORCH_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> side;  // warm-up and capture: one stream for both
#endif
};

namespace {

void check_graphable(const TrainStep &step, bool eager) {
  const Optim &opt = *step.opt;
  if (opt.sync) {
    fail(FTC_ERR_INVALID_ARGUMENT, "a data-parallel optimizer cannot be captured in a CUDA graph (its all-reduces "
                                   "are calls into MPI): take data-parallel steps without cuda_graph");
  }
  if (opt.kind != FTC_OPTIM_SGD && opt.kind != FTC_OPTIM_ADAM && opt.kind != FTC_OPTIM_ADAMW) {
    fail(FTC_ERR_INVALID_ARGUMENT, "CUDA graph steps support the SGD, Adam and AdamW optimizers, not " +
                                       enum_name(ftc_optim_kind_table, opt.kind, "FTC_OPTIM_"));
  }
  if (opt.opt->param_groups().size() != 1) {
    fail(FTC_ERR_INVALID_ARGUMENT, "CUDA graph steps need an optimizer with one parameter group");
  }
  if (eager) return;
  auto require_cuda = [](const at::Tensor &t, const std::string &what) {
    if (!t.is_cuda()) {
      fail(FTC_ERR_DEVICE, "CUDA graphs need every tensor of the step on a CUDA device, but the " + what + " is on " +
                               t.device().str());
    }
  };
  for (size_t i = 0; i < opt.params.size(); ++i) require_cuda(opt.params[i], "parameter " + std::to_string(i + 1));
  for (size_t i = 0; i < step.inputs.size(); ++i) require_cuda(step.inputs[i], "input " + std::to_string(i + 1));
  require_cuda(step.target, "target");
  // A capture runs on one device.
  const c10::Device device = opt.params.front().device();
  auto require_device = [&](const at::Tensor &t, const std::string &what) {
    if (t.device() != device) {
      fail(FTC_ERR_DEVICE, "a CUDA graph runs on one device, but the " + what + " is on " + t.device().str() +
                               " and the parameters on " + device.str());
    }
  };
  for (size_t i = 0; i < opt.params.size(); ++i) require_device(opt.params[i], "parameter " + std::to_string(i + 1));
  for (size_t i = 0; i < step.inputs.size(); ++i) require_device(step.inputs[i], "input " + std::to_string(i + 1));
  require_device(step.target, "target");
#if defined(FTORCH_CUDA_GRAPHS_MISSING)
  fail(FTC_ERR_DEVICE, "this FTorch was built against torch " FTORCH_TORCH_VERSION " without the CUDA runtime's "
                       "crt/ headers or CCCL's nv/target (no CUDA toolkit of torch's CUDA release was found, and "
                       "NVIDIA's nvidia-cuda-crt and nvidia-cuda-cccl packages were not installed), so CUDA graphs "
                       "were left out: pip install \"nvidia-cuda-crt==" FTORCH_CUDA_GRAPHS_MISSING ".*\" \"nvidia-cuda-cccl=="
                       FTORCH_CUDA_GRAPHS_MISSING ".*\" (or set CUDA_HOME to such a toolkit) and rebuild FTorch");
#elif !defined(FTORCH_WITH_CUDA)
  fail(FTC_ERR_DEVICE, "this FTorch was built against a torch without CUDA (" FTORCH_TORCH_VERSION
                       "): CUDA graphs need a CUDA build of torch");
#endif
}

// Whether the update reads optimizer state (SGD with momentum, Adam, AdamW).
bool needs_state(const Optim &opt) { return opt.kind != FTC_OPTIM_SGD || settings_of(opt).momentum != 0; }

// The state tensors of p the update reads and writes.
std::vector<at::Tensor> state_tensors(const Optim &opt, const at::Tensor &p) {
  auto *s = state_of(opt, p);
  if (s == nullptr) return {};
  if (opt.kind == FTC_OPTIM_SGD) return {static_cast<torch::optim::SGDParamState &>(*s).momentum_buffer()};
  const AdamState a = adam_state(opt, *s);
  return {a.exp_avg, a.exp_avg_sq, a.max_exp_avg_sq};
}

void push_tensor(std::vector<int64_t> &key, const at::Tensor &t) {
  key.push_back(t.defined() ? reinterpret_cast<int64_t>(t.data_ptr()) : 0);
  if (!t.defined()) return;
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  key.insert(key.end(), t.sizes().begin(), t.sizes().end());
  key.insert(key.end(), t.strides().begin(), t.strides().end());
}

// Everything the captured kernels read or write by address, and the settings baked into them:
// a step whose key differs (other input buffers, a checkpoint that replaced the optimizer's state,
// another loss) warms up and captures again.
std::vector<int64_t> key_of(const TrainStep &step) {
  std::vector<int64_t> key{reinterpret_cast<int64_t>(step.module->_ivalue().get()),
                           reinterpret_cast<int64_t>(step.opt->opt.get()), step.loss_kind, step.reduction};
  auto push_number = [&key](double v) {
    int64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    key.push_back(bits);
  };
  push_number(step.max_grad_norm);
  key.push_back(jit_optimize().load() ? 1 : 0);
  // The optimizer's settings baked into the update (the learning rate is read at each step).
  const Settings st = settings_of(*step.opt);
  for (const double v : {st.weight_decay, st.momentum, st.dampening, st.beta1, st.beta2, st.eps,
                         st.nesterov ? 1.0 : 0.0, st.amsgrad ? 1.0 : 0.0}) {
    push_number(v);
  }
  for (const auto &t : step.inputs) push_tensor(key, t);
  push_tensor(key, step.target);
  // Which parameters require gradients: the captured backward computes theirs and the captured
  // update changes them, so a freeze or unfreeze after the capture warms up and captures again.
  for (const auto &p : step.opt->params) {
    push_tensor(key, p);
    key.push_back(p.requires_grad() ? 1 : 0);
    for (const auto &t : state_tensors(*step.opt, p)) push_tensor(key, t);
  }
  return key;
}

// clip_grad_norm_ without reading the norm on the host (LibTorch's returns it, a device sync):
// the same operations, the coefficient left on the device.
void clip_on_device(const std::vector<at::Tensor> &params, double max_norm) {
  std::vector<at::Tensor> norms;
  for (const auto &p : params) {
    if (p.grad().defined()) norms.push_back(p.grad().norm(2));
  }
  if (norms.empty()) return;
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  const at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  for (const auto &p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

// The host's part of an update: this step's numbers for every updated parameter, row i of
// g.host_scalars: SGD [-lr, 0, 0]; Adam and AdamW [-lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t),
// 1 - lr * weight_decay (AdamW; 1 for Adam)], t the parameter's step count, advanced here as
// LibTorch's step advances it.
void fill_scalars(Optim &opt, TrainGraph &g) {
  const Settings st = settings_of(opt);
  double *row = g.host_scalars.data_ptr<double>();
  for (const size_t i : g.updated) {
    double *r = row + 3 * i;
    r[0] = -st.lr;
    if (opt.kind == FTC_OPTIM_SGD) continue;
    const auto t = static_cast<double>(advance_step(opt, *state_of(opt, opt.params[i])));
    r[0] = -st.lr / (1 - std::pow(st.beta1, t));
    r[1] = 1 / std::sqrt(1 - std::pow(st.beta2, t));
    r[2] = opt.kind == FTC_OPTIM_ADAMW ? 1 - st.lr * st.weight_decay : 1;
  }
}

// The updated parameters in groups that share a dtype and their per-step numbers (Adam's step
// count: every step advances all of them alike, so the groups of the capture hold for its
// replays). A group is updated by multi-tensor (_foreach_) operations: a few kernels for all its
// parameters, where one per parameter and operation would make most of a small model's graph.
std::vector<std::vector<size_t>> update_groups(const Optim &opt, const TrainGraph &g) {
  std::vector<std::pair<std::pair<at::ScalarType, int64_t>, std::vector<size_t>>> groups;
  for (const size_t i : g.updated) {
    const at::Tensor &p = opt.params[i];
    const int64_t t = opt.kind == FTC_OPTIM_SGD ? 0 : adam_state(opt, *state_of(opt, p)).step;
    const auto key = std::make_pair(p.scalar_type(), t);
    const auto it = std::find_if(groups.begin(), groups.end(), [&](const auto &grp) { return grp.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  std::vector<std::vector<size_t>> members;
  for (auto &grp : groups) members.push_back(std::move(grp.second));
  return members;
}

// The device's part of an update: LibTorch's SGD, Adam and AdamW step with every per-step number
// read from g.scalars (tensor operations only: nothing the host reads, nothing it decides per step).
void graph_update(Optim &opt, TrainGraph &g) {
  at::NoGradGuard no_grad;
  const Settings st = settings_of(opt);
  for (const auto &group : update_groups(opt, g)) {
    std::vector<at::Tensor> params, grads;
    for (const size_t i : group) {
      params.push_back(opt.params[i]);
      grads.push_back(opt.params[i].grad());
    }
    const at::Tensor s = g.scalars.select(0, static_cast<int64_t>(group.front())).to(params.front().scalar_type());
    const at::Tensor a = s.select(0, 0), b = s.select(0, 1), c = s.select(0, 2);
    if (opt.kind == FTC_OPTIM_SGD) {
      if (st.weight_decay != 0) grads = at::_foreach_add(grads, params, st.weight_decay);
      if (st.momentum != 0) {
        std::vector<at::Tensor> bufs;
        for (const auto &p : params) {
          bufs.push_back(static_cast<torch::optim::SGDParamState &>(*state_of(opt, p)).momentum_buffer());
        }
        at::_foreach_mul_(bufs, st.momentum);
        at::_foreach_add_(bufs, grads, 1 - st.dampening);
        grads = st.nesterov ? at::_foreach_add(grads, bufs, st.momentum) : bufs;
      }
      at::_foreach_add_(params, at::_foreach_mul(grads, a));
      continue;
    }
    if (st.weight_decay != 0) {
      if (opt.kind == FTC_OPTIM_ADAM) {
        grads = at::_foreach_add(grads, params, st.weight_decay);
      } else {
        at::_foreach_mul_(params, c);  // AdamW: decoupled decay, 1 - lr * weight_decay
      }
    }
    std::vector<at::Tensor> exp_avg, exp_avg_sq, max_exp_avg_sq;
    for (const auto &p : params) {
      AdamState m = adam_state(opt, *state_of(opt, p));
      exp_avg.push_back(m.exp_avg);
      exp_avg_sq.push_back(m.exp_avg_sq);
      max_exp_avg_sq.push_back(m.max_exp_avg_sq);
    }
    at::_foreach_mul_(exp_avg, st.beta1);
    at::_foreach_add_(exp_avg, grads, 1 - st.beta1);
    at::_foreach_mul_(exp_avg_sq, st.beta2);
    at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - st.beta2);
    if (st.amsgrad) at::_foreach_maximum_(max_exp_avg_sq, exp_avg_sq);
    std::vector<at::Tensor> denom = at::_foreach_sqrt(st.amsgrad ? max_exp_avg_sq : exp_avg_sq);
    at::_foreach_mul_(denom, b);
    at::_foreach_add_(denom, st.eps);
    std::vector<at::Tensor> update = at::_foreach_div(exp_avg, denom);
    at::_foreach_mul_(update, a);
    at::_foreach_add_(params, update);
  }
}

// Forward, loss, backward and clipping of a step whose gradients were set to none before. When
// capturing, which parameters the update then changes (g.updated); a replay updates those, so a
// step run uncaptured after the capture (FTORCH_CUDA_GRAPHS=eager) checks that they are still the
// ones with gradients. The loss value stays on the device.
at::Tensor loss_and_gradients(TrainStep &step, TrainGraph &g, bool capturing) {
  Optim &opt = *step.opt;
  at::Tensor loss = step_loss(step);
  if (step.max_grad_norm > 0) clip_on_device(opt.params, step.max_grad_norm);
  std::vector<size_t> updated;
  const bool stateful = needs_state(opt);
  for (size_t i = 0; i < opt.params.size(); ++i) {
    if (!opt.params[i].grad().defined()) continue;
    if (stateful && state_of(opt, opt.params[i]) == nullptr) {
      fail(FTC_ERR_INVALID_ARGUMENT, "parameter " + std::to_string(i + 1) +
                                         " had no gradient during the warm-up steps, so the optimizer has no state "
                                         "for it yet");
    }
    updated.push_back(i);
  }
  if (!capturing && updated != g.updated) {
    fail(FTC_ERR_INVALID_ARGUMENT, "the parameters with a gradient are not those of the captured step (" +
                                       std::to_string(updated.size()) + " against " +
                                       std::to_string(g.updated.size()) +
                                       "): a CUDA graph replays the captured backward and update, so which "
                                       "parameters get gradients must not depend on the data");
  }
  g.updated = std::move(updated);
  return loss;
}

// Whether the optimizer has its state for every parameter that requires a gradient (or needs
// none): then the warm-up steps do the graph's arithmetic too, as the steps after the capture do;
// LibTorch's own step (which rounds differently in the last bit) only makes missing state. So a
// run resumed from a checkpoint, or continued after a freeze, takes the steps it would have taken.
bool has_state(const Optim &opt) {
  if (!needs_state(opt)) return true;
  for (const auto &p : opt.params) {
    if (p.requires_grad() && state_of(opt, p) == nullptr) return false;
  }
  return true;
}

// Scalars for every parameter, where they are and (pinned) on the host.
void make_scalars(const Optim &opt, TrainGraph &g) {
  const auto n = static_cast<int64_t>(opt.params.size());
  const c10::Device device = opt.params.empty() ? c10::Device(c10::kCPU) : opt.params.front().device();
  g.scalars = at::zeros({n, 3}, at::TensorOptions().dtype(at::kDouble).device(device));
  g.host_scalars = device.is_cpu() ? g.scalars
                                   : at::zeros({n, 3}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
}

// What a replay does, run as it is: warm-up steps (capturing: the set of updated parameters made
// anew) and FTORCH_CUDA_GRAPHS=eager after the warm-up.
double eager_graph_step(TrainStep &step, TrainGraph &g, bool capturing) {
  Optim &opt = *step.opt;
  if (!g.scalars.defined()) make_scalars(opt, g);
  opt.opt->zero_grad(true);
  const at::Tensor loss = loss_and_gradients(step, g, capturing);
  fill_scalars(opt, g);
  if (!g.host_scalars.is_same(g.scalars)) g.scalars.copy_(g.host_scalars);
  graph_update(opt, g);
  return loss.item<double>();
}

// A step before the capture: LibTorch's (which makes the optimizer's state) while some parameter
// has none, until the last warm-up, else the captured work run uncaptured (see has_state).
double warmup_step(TrainStep &step, TrainGraph &g) {
  if (g.calls + 1 < warmup_steps() && !has_state(*step.opt)) return eager_train_step(step);
  return eager_graph_step(step, g, true);
}

#ifdef FTORCH_WITH_CUDA
// One step on the CUDA device of the parameters: warm-up, capture, replay.
double cuda_graph_step(TrainStep &step, TrainGraph &g) {
  Optim &opt = *step.opt;
  const c10::Device device = opt.params.front().device();
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
  if (!g.capture_error.empty()) fail(FTC_ERR_TORCH, g.capture_error);
  if (!g.graph) {
    // Warm-up and capture run on one side stream of the graph's (capture cannot use the default
    // stream; per-stream resources, cuBLAS's workspace say, are made during the warm-up), ordered
    // after the work already queued on the caller's stream and before what it queues next.
    if (!g.side) g.side = c10::cuda::getStreamFromPool(false, device.index());
    const c10::cuda::CUDAStream side = *g.side;
    join(main, side);
    if (g.calls < warmup_steps()) {
      double value = 0;
      try {
        c10::cuda::CUDAStreamGuard on_side(side);
        // The warm-up runs the work the capture records, uncaptured (its kernels loaded, its
        // allocations made once), or LibTorch's step while the optimizer's state is missing.
        value = warmup_step(step, g);
      } catch (...) {
        join(side, main);
        throw;
      }
      join(side, main);
      return value;
    }
    if (!g.scalars.defined()) make_scalars(opt, g);
    opt.opt->zero_grad(true);  // backward in the capture then writes gradients of the graph's own
    try {
      c10::cuda::CUDAStreamGuard on_side(side);
      g.graph = capture_graph(
          [&] {
            g.loss = loss_and_gradients(step, g, true);
            graph_update(opt, g);
          },
          "the training step", g.capture_error);
    } catch (...) {
      join(side, main);
      throw;
    }
    join(side, main);
  }
  // The capture ran nothing: every step, the first included, is a replay.
  fill_scalars(opt, g);
  g.scalars.copy_(g.host_scalars, /*non_blocking=*/true);
  g.graph->replay();
  return g.loss.item<double>();  // waits for the step (and so for the copy of the scalars above)
}
#endif

}  // namespace

}  // namespace ftc

extern "C" {

int ftc_train_step_cuda_graph(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs,
                              ftc_tensor target, int loss_kind, int reduction, double max_grad_norm, double *loss,
                              double *seconds) {
  return ftc::guard([&] {
    ftc::note_step();
    const auto start = std::chrono::steady_clock::now();
    ftc::TrainStep step = ftc::train_step_of(m, o, s, inputs, n_inputs, target, loss_kind, reduction, max_grad_norm);
    // A capture reads the inputs and the target by address: `=` keeps writing into their memory.
    for (int i = 0; i < n_inputs; ++i) ftc::expose_memory(ftc::tensor_slot(inputs[i], "input tensor", i + 1));
    ftc::expose_memory(ftc::tensor_slot(target, "target tensor"));
    const bool eager = ftc::eager_graphs();
    ftc::check_graphable(step, eager);
    ftc::Optim &opt = *step.opt;
    if (!opt.graph) opt.graph = std::make_shared<ftc::TrainGraph>();
    ftc::TrainGraph &g = *opt.graph;
    auto key = ftc::key_of(step);
    if (key != g.key) {
      g = ftc::TrainGraph();  // releases a previous capture and its memory
      g.key = std::move(key);
    }
    const int64_t warmup = ftc::warmup_steps();
    double value;
    if (eager) {
      // As on a GPU: the warm-up steps, then the captured work.
      value = g.calls < warmup ? ftc::warmup_step(step, g) : ftc::eager_graph_step(step, g, false);
    } else {
#ifdef FTORCH_WITH_CUDA
      value = ftc::cuda_graph_step(step, g);
#else
      value = 0;  // check_graphable failed already
#endif
    }
    ++g.calls;
    // The warm-up steps create the optimizer's state, which the key of the captured step includes.
    if (g.calls <= warmup) g.key = ftc::key_of(step);
    ftc::finish_train_step(step, value, start, loss, seconds);
  });
}

}  // extern "C"
