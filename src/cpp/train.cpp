// train.cpp - C API for the one-call training step (checkpoints: checkpoint.cpp).
#include <chrono>
#include <functional>
#include <sstream>

#include "internal.hpp"
#include "train_package.hpp"

namespace ftc {

TrainStep train_step_of(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs,
                        ftc_tensor target, int loss_kind, int reduction, double max_grad_norm) {
  take_temporaries({target});
  auto values = tensors_of(inputs, n_inputs, "input tensor");
  if (any_model_of(m).shared) {
    fail(FTC_ERR_INVALID_ARGUMENT, "a node-shared model trains with torch_train_step without cuda_graph (the leader "
                                   "steps on every rank's batch); a CUDA-graph step needs a model of this process");
  }
  return train_step_for(any_model_of(m), o, s, std::move(values), tensor_of(target, "target tensor"), loss_kind,
                        reduction, max_grad_norm);
}

// A training step whose optimizer updates none of the model's parameters would compute the loss and
// the gradients and change nothing, every step, with a success status: an error instead. (An
// optimizer over several models' parameters, stepped with each model in turn, is allowed.) The
// parameters of an optimizer are fixed when it is made, so one check per model suffices.
void check_trains_model(Optim &opt, const torch::jit::Module &module) {
  const auto object = module._ivalue();
  if (opt.trains && !opt.trains->expired() && opt.trains->_unsafe_get_target() == object.get()) return;
  const auto params = module.parameters();
  for (const auto &p : opt.params) {
    const auto *impl = p.unsafeGetTensorImpl();
    for (const auto &q : params) {
      if (q.unsafeGetTensorImpl() == impl) {
        opt.trains = c10::weak_intrusive_ptr<c10::ivalue::Object>(object);
        return;
      }
    }
  }
  fail(FTC_ERR_INVALID_ARGUMENT,
       "the optimizer updates none of the model's parameters (it was made over other tensors, or another "
       "model's): the training step would change nothing; make the optimizer over this model's parameters "
       "(torch_model_parameters)");
}

TrainStep train_step_for(Model &model, ftc_optim o, ftc_scheduler s, std::vector<at::Tensor> inputs,
                         at::Tensor target, int loss_kind, int reduction, double max_grad_norm) {
  TrainStep step;
  step.inputs = std::move(inputs);
  step.module = &module_of(model);
  step.package = model.package.get();
  step.opt = &optim_of(o);
  check_trains_model(*step.opt, *step.module);
  step.sched = s != nullptr ? &scheduler_of(s) : nullptr;
  if (step.sched != nullptr && step.sched->optim.get() != step.opt) {
    fail(FTC_ERR_INVALID_ARGUMENT, "the scheduler drives another optimizer than the one this step updates (it would "
                                   "change that optimizer's rate, and this one's never)");
  }
  step.target = std::move(target);
  if (reduction == 0) fail(FTC_ERR_INVALID_ARGUMENT, "a training step needs a reduced loss (mean or sum)");
  step.loss_kind = loss_kind;
  step.reduction = reduction;
  // (0 means no clipping; a negative or NaN bound would silently mean the same)
  if (!(max_grad_norm >= 0)) {
    std::ostringstream text;
    text << max_grad_norm;
    fail(FTC_ERR_INVALID_ARGUMENT,
         "max_grad_norm must be >= 0 (a gradient norm bound; leave it out for no clipping), not " + text.str());
  }
  step.max_grad_norm = max_grad_norm;
  return step;
}

void report_failure_to_ranks(ftc_optim o) noexcept {
  try {
    if (o == nullptr) return;
    Optim &opt = optim_of(o);
    if (opt.sync) opt.sync->report_failure();
  } catch (...) {
    // Not an optimizer of this process: there is no one to tell.
  }
}

double run_train_step(TrainStep &step) {
  const auto compiled = compiled_train_step(step);
  return compiled ? *compiled : eager_train_step(step);
}

at::Tensor step_loss(TrainStep &step) {
  apply_jit_optimize();
  at::AutoGradMode grad(true);
  std::vector<c10::IValue> args(step.inputs.begin(), step.inputs.end());
  c10::IValue result;
  try {
    result = step.module->forward(args);
  } catch (const std::exception &e) {
    forward_failed(e, args);
  }
  at::Tensor output;
  if (result.isTensor()) {
    output = result.toTensor();
  } else if (result.isTuple() && !result.toTupleRef().elements().empty() &&
             result.toTupleRef().elements()[0].isTensor()) {
    output = result.toTupleRef().elements()[0].toTensor();  // the first output is the prediction
  } else {
    fail(FTC_ERR_INVALID_ARGUMENT, std::string("the model returned a ") + result.tagKind() +
                                       "; a training step needs a Tensor (or a tuple starting with one)");
  }
  ftc_loss_options options = FTC_LOSS_OPTIONS_DEFAULTS;
  options.reduction = step.reduction;
  at::Tensor l = compute_loss(step.loss_kind, output, step.target, {}, {}, options);
  l.backward();
  return l.detach();
}

double eager_train_step(TrainStep &step) {
  Optim &opt = *step.opt;
  // Data-parallel: gradients and the loss are averaged across ranks before clipping and the
  // update, and the (global) loss feeds the scheduler, so every rank takes the same step.
  opt.opt->zero_grad();  // (before reduced_step: no gradient to keep for a failure)
  const double value = reduced_step(opt, [&] { return step_loss(step).item<double>(); });
  if (step.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(opt.params, step.max_grad_norm);
  opt.opt->step();
  after_update(opt);
  return value;
}

void finish_train_step(TrainStep &step, double value, std::chrono::steady_clock::time_point start, double *loss,
                       double *seconds) {
  ++step.opt->steps;
  if (step.sched != nullptr) step.sched->step(true, value);
  if (loss != nullptr) *loss = value;  // optional outputs: null means "not wanted"
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  step.opt->window_steps += 1;
  step.opt->window_seconds += elapsed;
  if (seconds != nullptr) *seconds = elapsed;
}

}  // namespace ftc

extern "C" {

int ftc_train_step(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs, ftc_tensor target,
                   int loss_kind, int reduction, double max_grad_norm, double *loss, double *seconds) {
  return ftc::guard([&] {
    ftc::note_step();
    const auto start = std::chrono::steady_clock::now();
    ftc::take_temporaries({target});
    ftc::take_temporaries(inputs, n_inputs);
    if (auto *model = ftc::shared_model(m)) {
      const double value = ftc::shared_train_step(*model, o, s, [&] {
        auto tensors = ftc::tensors_of(inputs, n_inputs, "input tensor");
        tensors.push_back(ftc::tensor_of(target, "target tensor"));
        return tensors;
      }, loss_kind, reduction, max_grad_norm);
      if (loss != nullptr) *loss = value;
      if (seconds != nullptr) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return;
    }
    ftc::TrainStep step = ftc::before_reduced_step(
        o, [&] { return ftc::train_step_of(m, o, s, inputs, n_inputs, target, loss_kind, reduction, max_grad_norm); });
    ftc::finish_train_step(step, ftc::run_train_step(step), start, loss, seconds);
  });
}

}  // extern "C"
