// optim_state.hpp - what FTorch's own updates (the CUDA-graph step, graph_step.cpp; the compiled
// step of a training package, train_package.cpp) read of a LibTorch optimizer: the settings of
// its parameter group and each parameter's state, read and advanced in one place.
#pragma once

#include <tuple>

#include "internal.hpp"

namespace ftc {

// The optimizer's state of parameter p (null if it has none yet).
inline torch::optim::OptimizerParamState *state_of(const Optim &opt, const at::Tensor &p) {
  auto &state = opt.opt->state();
  const auto it = state.find(p.unsafeGetTensorImpl());
  return it == state.end() ? nullptr : it->second.get();
}

// Adam's and AdamW's state (two classes with the same members).
struct AdamState {
  at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  int64_t step = 0;
};
template <class State>
AdamState adam_state_as(torch::optim::OptimizerParamState &s) {
  auto &st = static_cast<State &>(s);
  return {st.exp_avg(), st.exp_avg_sq(), st.max_exp_avg_sq(), st.step()};
}
inline AdamState adam_state(const Optim &opt, torch::optim::OptimizerParamState &s) {
  return opt.kind == FTC_OPTIM_ADAM ? adam_state_as<torch::optim::AdamParamState>(s)
                                    : adam_state_as<torch::optim::AdamWParamState>(s);
}
template <class State>
int64_t advance_as(torch::optim::OptimizerParamState &s) {
  auto &st = static_cast<State &>(s);
  st.step(st.step() + 1);
  return st.step();
}

// Adam's step count t of a parameter, advanced as LibTorch's step advances it; the new value.
inline int64_t advance_step(const Optim &opt, torch::optim::OptimizerParamState &s) {
  return opt.kind == FTC_OPTIM_ADAM ? advance_as<torch::optim::AdamParamState>(s)
                                    : advance_as<torch::optim::AdamWParamState>(s);
}

// The settings of the optimizer's one parameter group that the update uses, read in one place
// (SGDOptions, AdamOptions and AdamWOptions are unrelated classes). Unused ones are 0.
struct Settings {
  double lr = 0, weight_decay = 0, momentum = 0, dampening = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool nesterov = false, amsgrad = false;
};
template <class Options>
Settings adam_settings(Options &o) {
  Settings st;
  st.lr = o.lr();
  std::tie(st.beta1, st.beta2) = o.betas();
  st.eps = o.eps();
  st.weight_decay = o.weight_decay();
  st.amsgrad = o.amsgrad();
  return st;
}
inline Settings settings_of(const Optim &opt) {
  auto &options = opt.opt->param_groups().at(0).options();
  if (opt.kind == FTC_OPTIM_ADAM) return adam_settings(static_cast<torch::optim::AdamOptions &>(options));
  if (opt.kind == FTC_OPTIM_ADAMW) return adam_settings(static_cast<torch::optim::AdamWOptions &>(options));
  auto &o = static_cast<torch::optim::SGDOptions &>(options);
  Settings st;
  st.lr = o.lr();
  st.weight_decay = o.weight_decay();
  st.momentum = o.momentum();
  st.dampening = o.dampening();
  st.nesterov = o.nesterov();
  return st;
}

// Adam's or AdamW's state of p, made as LibTorch's step makes it on a parameter's first update
// (step 0, zero moments; the max moment too with amsgrad) when p has none yet.
inline torch::optim::OptimizerParamState &adam_state_made(const Optim &opt, const at::Tensor &p, bool amsgrad) {
  if (auto *s = state_of(opt, p)) return *s;
  auto make = [&](auto state) -> torch::optim::OptimizerParamState & {
    state->step(0);
    state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    if (amsgrad) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    auto &slot = opt.opt->state()[p.unsafeGetTensorImpl()];
    slot = std::move(state);
    return *slot;
  };
  if (opt.kind == FTC_OPTIM_ADAM) return make(std::make_unique<torch::optim::AdamParamState>());
  return make(std::make_unique<torch::optim::AdamWParamState>());
}

}  // namespace ftc
