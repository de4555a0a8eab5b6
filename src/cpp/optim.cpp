// optim.cpp - C API for optimizers, learning-rate schedulers and gradient clipping.
#include <cmath>
#include <limits>

#include "internal.hpp"

namespace {

void require_nonnegative(double value, const char *name) {
  if (!(value >= 0.0)) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(name) + " must be non-negative, got " + std::to_string(value));
  }
}

// The options structure of an optimizer or scheduler: a null pointer is an error naming it.
template <class Options>
const Options &options_of(const Options *options) {
  if (options == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "options is a null pointer (start from the _DEFAULTS)");
  return *options;
}

void require_betas(double b1, double b2) {
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "betas must be in [0, 1)");
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor> &params,
                                                        const ftc_sgd_options &h) {
  auto o = torch::optim::SGDOptions(h.lr).momentum(h.momentum).dampening(h.dampening).weight_decay(h.weight_decay)
               .nesterov(h.nesterov != 0);
  require_nonnegative(o.momentum(), "momentum");
  require_nonnegative(o.weight_decay(), "weight_decay");
  if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0)) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "nesterov momentum requires a momentum and zero dampening");
  }
  return std::make_unique<torch::optim::SGD>(params, o);
}

// Adam and AdamW: the same options (their defaults differ), two LibTorch optimizers.
template <class Optimizer, class TorchOptions, class Options>
std::unique_ptr<torch::optim::Optimizer> make_adam(const std::vector<at::Tensor> &params, const Options &h) {
  require_betas(h.beta1, h.beta2);
  require_nonnegative(h.eps, "eps");
  require_nonnegative(h.weight_decay, "weight_decay");
  return std::make_unique<Optimizer>(
      params, TorchOptions(h.lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(h.weight_decay).amsgrad(h.amsgrad != 0));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor> &params,
                                                        const ftc_adam_options &h) {
  return make_adam<torch::optim::Adam, torch::optim::AdamOptions>(params, h);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor> &params,
                                                        const ftc_adamw_options &h) {
  return make_adam<torch::optim::AdamW, torch::optim::AdamWOptions>(params, h);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor> &params,
                                                        const ftc_rmsprop_options &h) {
  auto o = torch::optim::RMSpropOptions(h.lr).alpha(h.alpha).eps(h.eps).weight_decay(h.weight_decay)
               .momentum(h.momentum).centered(h.centered != 0);
  require_nonnegative(o.alpha(), "alpha");
  require_nonnegative(o.eps(), "eps");
  require_nonnegative(o.weight_decay(), "weight_decay");
  require_nonnegative(o.momentum(), "momentum");
  return std::make_unique<torch::optim::RMSprop>(params, o);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor> &params,
                                                        const ftc_adagrad_options &h) {
  auto o = torch::optim::AdagradOptions(h.lr).lr_decay(h.lr_decay).weight_decay(h.weight_decay)
               .initial_accumulator_value(h.initial_accumulator_value).eps(h.eps);
  require_nonnegative(o.lr_decay(), "lr_decay");
  require_nonnegative(o.weight_decay(), "weight_decay");
  require_nonnegative(o.initial_accumulator_value(), "initial_accumulator_value");
  return std::make_unique<torch::optim::Adagrad>(params, o);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor> &params,
                                                        const ftc_lbfgs_options &h) {
  auto o = torch::optim::LBFGSOptions(h.lr).max_iter(h.max_iter).tolerance_grad(h.tolerance_grad)
               .tolerance_change(h.tolerance_change).history_size(h.history_size);
  if (h.max_eval < 0) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "max_eval must be at least 1, or 0 for the default max_iter * 5 / 4 (got " +
                                            std::to_string(h.max_eval) + ")");
  }
  if (h.max_eval > 0) o.max_eval(h.max_eval);
  if (h.strong_wolfe != 0) o.line_search_fn("strong_wolfe");
  if (o.max_iter() < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "max_iter must be at least 1");
  if (h.history_size < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "history_size must be at least 1");
  return std::make_unique<torch::optim::LBFGS>(params, o);
}

// Every optimizer's constructor: the parameters checked and flagged, the options by kind.
template <class Options>
int new_optimizer(ftc_optim *out, int kind, const ftc_tensor *params, int64_t n_params, const Options *options) {
  return ftc::guard([&] {
    const auto values = ftc::tensors_of(params, n_params, "parameter tensor");
    ftc::out_arg(out, "out");
    if (n_params < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "an optimizer needs at least one parameter tensor");
    const Options &h = options_of(options);
    require_nonnegative(h.lr, "learning rate");
    auto state = std::make_shared<ftc::Optim>();
    state->kind = kind;
    for (int64_t i = 0; i < n_params; ++i) {
      const at::Tensor &p = values[static_cast<size_t>(i)];
      if (!p.is_leaf()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "parameter tensor " + std::to_string(i + 1) +
                                                " is not a leaf (it was computed from other tensors)");
      }
      if (!p.is_floating_point()) {
        ftc::fail(FTC_ERR_DTYPE, "parameter tensor " + std::to_string(i + 1) + " is not floating point");
      }
      for (int64_t j = 0; j < i; ++j) {  // it would be updated twice a step
        if (values[static_cast<size_t>(j)].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "parameter tensor " + std::to_string(i + 1) + " is parameter tensor " +
                                                  std::to_string(j + 1) + " again: give each parameter once");
        }
      }
      state->params.push_back(p);
    }
    state->opt = make_optimizer(state->params, h);
    // The optimizer updates these tensors in place: `=` on their handles must write in place too.
    for (int64_t i = 0; i < n_params; ++i) ftc::tensor_slot(params[i]).life.bind_to_parameter();
    ftc::replace_handle<ftc::OptimTable>(out, std::move(state));
  });
}

bool is_better(const ftc_plateau_options &o, double a, double best) {
  const bool max_mode = o.mode != 0, abs_mode = o.threshold_mode != 0;
  if (!max_mode && !abs_mode) return a < best * (1.0 - o.threshold);
  if (!max_mode && abs_mode) return a < best - o.threshold;
  if (max_mode && !abs_mode) return a > best * (o.threshold + 1.0);
  return a > best + o.threshold;
}

// Every scheduler's constructor: the kind's settings checked and stored by set(s).
template <class Set>
int new_scheduler(ftc_scheduler *out, ftc_optim o, int kind, Set &&set) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    auto &opt = ftc::optim_of(o);
    ftc::Scheduler s;
    s.kind = kind;
    s.optim = ftc::optim_ptr(o);
    set(s);
    // The optimizer's initial rate, which later schedules start from: set by the first schedule
    // (as PyTorch's LRScheduler sets a group's initial_lr), but not by reduce-on-plateau, which
    // PyTorch does not derive from it (a cosine schedule after a plateau phase starts from the
    // rate the plateau reached).
    if (!opt.initial_lr && kind != FTC_SCHED_PLATEAU) opt.initial_lr = ftc::get_lr(opt);
    s.base_lr = opt.initial_lr ? *opt.initial_lr : ftc::get_lr(opt);
    s.step(false, 0.0);  // PyTorch's initial step
    ftc::replace_handle<ftc::SchedulerTable>(out, std::make_shared<ftc::Scheduler>(std::move(s)));
  });
}

}  // namespace

namespace ftc {

double get_lr(const Optim &o) { return o.opt->param_groups().at(0).options().get_lr(); }

void set_lr(Optim &o, double lr) {
  for (auto &group : o.opt->param_groups()) group.options().set_lr(lr);
}

// One scheduler step: the next learning rate from the current one, as torch.optim.lr_scheduler
// computes it (chainable forms, so that other changes to the rate compose as in PyTorch).
void Scheduler::step(bool has_metric, double metric) {
  advance(has_metric, metric);
  last_lr = get_lr(*optim);
}

void Scheduler::advance(bool has_metric, double metric) {
  ++step_count;
  const double lr = get_lr(*optim);
  const bool initial = last_epoch < 0;
  if (kind == FTC_SCHED_PLATEAU) {
    if (initial) {
      last_epoch = 0;
      return;
    }
    if (!has_metric) fail(FTC_ERR_INVALID_ARGUMENT, "reduce-on-plateau needs the metric (the loss) at each step");
    last_epoch += 1;
    if (is_better(plateau, metric, best)) {
      best = metric;
      num_bad_epochs = 0;
    } else {
      num_bad_epochs += 1;
    }
    if (cooldown_counter > 0) {
      cooldown_counter -= 1;
      num_bad_epochs = 0;
    }
    if (num_bad_epochs > plateau.patience) {
      const double new_lr = std::max(lr * plateau.factor, plateau.min_lr);
      if (lr - new_lr > plateau.eps) set_lr(*optim, new_lr);
      cooldown_counter = plateau.cooldown;
      num_bad_epochs = 0;
    }
    return;
  }
  last_epoch += 1;
  double next = lr;
  switch (kind) {
    case FTC_SCHED_STEP: {
      if (last_epoch != 0 && last_epoch % step_lr.step_size == 0) next = lr * step_lr.gamma;
      break;
    }
    case FTC_SCHED_MULTISTEP: {
      const auto hits = std::count(milestones.begin(), milestones.end(), last_epoch);
      if (hits > 0) next = lr * std::pow(multistep.gamma, static_cast<double>(hits));
      break;
    }
    case FTC_SCHED_EXPONENTIAL:
      if (!initial) next = lr * exponential_gamma;
      break;
    case FTC_SCHED_COSINE: {
      const double t_max = static_cast<double>(cosine.t_max), eta_min = cosine.eta_min;
      const double e = static_cast<double>(last_epoch);
      if (initial) break;
      const auto period = static_cast<int64_t>(2 * t_max);
      if (((last_epoch - 1 - static_cast<int64_t>(t_max)) % period + period) % period == 0) {
        next = lr + (base_lr - eta_min) * (1 - std::cos(M_PI / t_max)) / 2;
      } else {
        next = (1 + std::cos(M_PI * e / t_max)) / (1 + std::cos(M_PI * (e - 1) / t_max)) * (lr - eta_min) + eta_min;
      }
      break;
    }
    case FTC_SCHED_LINEAR: {
      const double start = linear.start_factor, end = linear.end_factor;
      const double total = static_cast<double>(linear.total_iters);
      if (last_epoch == 0) {
        next = lr * start;
      } else if (last_epoch <= static_cast<int64_t>(total)) {
        next = lr * (1.0 + (end - start) / (total * start + (static_cast<double>(last_epoch) - 1) * (end - start)));
      }
      break;
    }
    default:
      fail_unknown(ftc_scheduler_kind_table, kind);
  }
  set_lr(*optim, next);
}

std::vector<double> Scheduler::state() const {
  return {static_cast<double>(kind), base_lr, static_cast<double>(last_epoch), static_cast<double>(step_count), best,
          static_cast<double>(num_bad_epochs), static_cast<double>(cooldown_counter)};
}

void Scheduler::set_state(const std::vector<double> &v) {
  if (v.size() != 7 || static_cast<int>(v[0]) != kind) {
    fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint's scheduler is of another kind");
  }
  base_lr = v[1];
  last_epoch = static_cast<int64_t>(v[2]);
  step_count = static_cast<int64_t>(v[3]);
  best = v[4];
  num_bad_epochs = static_cast<int64_t>(v[5]);
  cooldown_counter = static_cast<int64_t>(v[6]);
  last_lr = get_lr(*optim);  // (a checkpoint restores the optimizer's rate first)
}

}  // namespace ftc

extern "C" {

int ftc_optim_sgd(ftc_optim *out, const ftc_tensor *params, int64_t n_params, const ftc_sgd_options *options) {
  return new_optimizer(out, FTC_OPTIM_SGD, params, n_params, options);
}
int ftc_optim_adam(ftc_optim *out, const ftc_tensor *params, int64_t n_params, const ftc_adam_options *options) {
  return new_optimizer(out, FTC_OPTIM_ADAM, params, n_params, options);
}
int ftc_optim_adamw(ftc_optim *out, const ftc_tensor *params, int64_t n_params, const ftc_adamw_options *options) {
  return new_optimizer(out, FTC_OPTIM_ADAMW, params, n_params, options);
}
int ftc_optim_rmsprop(ftc_optim *out, const ftc_tensor *params, int64_t n_params,
                      const ftc_rmsprop_options *options) {
  return new_optimizer(out, FTC_OPTIM_RMSPROP, params, n_params, options);
}
int ftc_optim_adagrad(ftc_optim *out, const ftc_tensor *params, int64_t n_params,
                      const ftc_adagrad_options *options) {
  return new_optimizer(out, FTC_OPTIM_ADAGRAD, params, n_params, options);
}
int ftc_optim_lbfgs(ftc_optim *out, const ftc_tensor *params, int64_t n_params, const ftc_lbfgs_options *options) {
  return new_optimizer(out, FTC_OPTIM_LBFGS, params, n_params, options);
}

int ftc_optim_step(ftc_optim o) {
  return ftc::guard([&] {
    ftc::note_step();
    auto &state = ftc::optim_of(o);
    if (state.kind == FTC_OPTIM_LBFGS) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "LBFGS re-evaluates the loss: use the closure form of step");
    }
    ftc::before_update(state);
    state.opt->step();
    ftc::after_update(state);
    ++state.steps;
  });
}

int ftc_optim_step_closure(ftc_optim o, ftc_closure closure, void *context, double *loss) {
  return ftc::guard([&] {
    ftc::note_step();
    // The closure runs user code, which may delete (a copy of) the optimizer's handle: hold it.
    const std::shared_ptr<ftc::Optim> keep = ftc::optim_ptr(o);
    auto &state = *keep;
    if (closure == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "closure is null");
    // Data-parallel: every evaluation's gradients and loss are averaged across ranks, so that
    // every rank's LBFGS takes the same decisions.
    auto evaluate = [&]() -> at::Tensor {
      at::Tensor l;
      state.opt->zero_grad();  // (before reduced_step: no gradient to keep for a failure)
      const double value = ftc::reduced_step(state, [&] {
        at::AutoGradMode grad(true);
        ftc::CallbackHandles result;  // the closure's loss, freed if not taken
        result.handles.assign(1, nullptr);
        ftc::check_callback(closure(context, result.handles.data()), "the closure");
        l = ftc::take_callback_result(result.handles[0], "the closure's loss");
        if (!l.defined()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the closure did not produce a loss tensor");
        if (l.numel() != 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the closure's loss must have one element");
        l.backward();
        l = l.detach();
        return state.sync ? l.item<double>() : 0.0;
      });
      return state.sync ? at::full_like(l, value) : l;
    };
    at::Tensor first = state.opt->step(evaluate);
    ftc::after_update(state);
    ++state.steps;
    if (loss != nullptr) *loss = first.defined() ? first.item<double>() : std::nan("");
  });
}

int ftc_optim_zero_grad(ftc_optim o, int set_to_none) {
  return ftc::guard([&] {
    auto &opt = ftc::optim_of(o);
    opt.opt->zero_grad(set_to_none != 0);
    ftc::after_update(opt);  // (data-parallel: the gradients to come are not averaged yet)
  });
}

int ftc_optim_get_lr(ftc_optim o, double *lr) {
  return ftc::guard([&] { ftc::out_arg(lr, "lr") = ftc::get_lr(ftc::optim_of(o)); });
}

int ftc_optim_set_lr(ftc_optim o, double lr) {
  return ftc::guard([&] {
    require_nonnegative(lr, "learning rate");
    ftc::set_lr(ftc::optim_of(o), lr);
  });
}

int ftc_optim_step_count(ftc_optim o, int64_t *steps) {
  return ftc::guard([&] { ftc::out_arg(steps, "steps") = ftc::optim_of(o).steps; });
}

int ftc_optim_train_time(ftc_optim o, int reset, int64_t *steps, double *seconds) {
  return ftc::guard([&] {
    auto &state = ftc::optim_of(o);
    ftc::out_arg(steps, "steps") = state.window_steps;
    ftc::out_arg(seconds, "seconds") = state.window_seconds;
    if (reset != 0) {
      state.window_steps = 0;
      state.window_seconds = 0;
    }
  });
}

int ftc_optim_clip_grad_norm(ftc_optim o, double max_norm, double norm_type, double *total_norm) {
  return ftc::guard([&] {
    require_nonnegative(max_norm, "max_norm");
    ftc::before_update(ftc::optim_of(o));
    const double norm = torch::nn::utils::clip_grad_norm_(ftc::optim_of(o).params, max_norm, norm_type);
    if (total_norm != nullptr) *total_norm = norm;
  });
}

int ftc_optim_clip_grad_value(ftc_optim o, double clip_value) {
  return ftc::guard([&] {
    require_nonnegative(clip_value, "clip_value");
    ftc::before_update(ftc::optim_of(o));
    torch::nn::utils::clip_grad_value_(ftc::optim_of(o).params, clip_value);
  });
}

int ftc_scheduler_step_lr(ftc_scheduler *out, ftc_optim o, const ftc_step_lr_options *options) {
  return new_scheduler(out, o, FTC_SCHED_STEP, [&](ftc::Scheduler &s) {
    s.step_lr = options_of(options);
    if (s.step_lr.step_size < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "step_size must be >= 1");
  });
}

int ftc_scheduler_multistep_lr(ftc_scheduler *out, ftc_optim o, const int64_t *milestones, int n_milestones,
                               const ftc_multistep_lr_options *options) {
  return new_scheduler(out, o, FTC_SCHED_MULTISTEP, [&](ftc::Scheduler &s) {
    s.multistep = options_of(options);
    if (n_milestones < 0 || (n_milestones > 0 && milestones == nullptr)) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "invalid list of milestones (n_milestones = " + std::to_string(n_milestones) + ")");
    }
    s.milestones.assign(milestones, milestones + n_milestones);
  });
}

int ftc_scheduler_exponential_lr(ftc_scheduler *out, ftc_optim o, double gamma) {
  return new_scheduler(out, o, FTC_SCHED_EXPONENTIAL, [&](ftc::Scheduler &s) { s.exponential_gamma = gamma; });
}

int ftc_scheduler_cosine_annealing_lr(ftc_scheduler *out, ftc_optim o, const ftc_cosine_lr_options *options) {
  return new_scheduler(out, o, FTC_SCHED_COSINE, [&](ftc::Scheduler &s) {
    s.cosine = options_of(options);
    if (s.cosine.t_max < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "T_max must be >= 1");
  });
}

int ftc_scheduler_linear_lr(ftc_scheduler *out, ftc_optim o, const ftc_linear_lr_options *options) {
  return new_scheduler(out, o, FTC_SCHED_LINEAR, [&](ftc::Scheduler &s) {
    s.linear = options_of(options);
    const auto &l = s.linear;
    if (l.start_factor <= 0 || l.start_factor > 1 || l.end_factor < 0 || l.end_factor > 1) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "start_factor must be in (0, 1] and end_factor in [0, 1]");
    }
  });
}

int ftc_scheduler_reduce_on_plateau(ftc_scheduler *out, ftc_optim o, const ftc_plateau_options *options) {
  return new_scheduler(out, o, FTC_SCHED_PLATEAU, [&](ftc::Scheduler &s) {
    s.plateau = options_of(options);
    if (s.plateau.factor >= 1.0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "factor must be < 1");
    s.best = s.plateau.mode != 0 ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  });
}

int ftc_scheduler_step(ftc_scheduler s, int has_metric, double metric) {
  return ftc::guard([&] { ftc::scheduler_of(s).step(has_metric != 0, metric); });
}

int ftc_scheduler_last_lr(ftc_scheduler s, double *lr) {
  return ftc::guard([&] { ftc::out_arg(lr, "lr") = ftc::scheduler_of(s).last_lr; });
}

}  // extern "C"
