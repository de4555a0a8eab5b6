/* ftorch_c_optim.h - optimizers (torch.optim equivalents), learning-rate schedulers, and
 * gradient clipping over an optimizer's parameters. */
#ifndef FTORCH_C_OPTIM_H
#define FTORCH_C_OPTIM_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ftc_optim_s *ftc_optim;
typedef struct ftc_scheduler_s *ftc_scheduler;

/* enum ftc_optim_kind: see ftorch_c_enums.h. */

/* New optimizer over params (leaf tensors; they share storage with what they were made from).
 * hyper holds the hyper-parameters of the kind, in this order:
 *   SGD:     lr, momentum, dampening, weight_decay, nesterov (0/1)
 *   Adam(W): lr, beta1, beta2, eps, weight_decay, amsgrad (0/1)
 *   RMSprop: lr, alpha, eps, weight_decay, momentum, centered (0/1)
 *   Adagrad: lr, lr_decay, weight_decay, initial_accumulator_value, eps
 *   LBFGS:   lr, max_iter, max_eval, tolerance_grad, tolerance_change, history_size, strong_wolfe (0/1)
 * If *out is not null it is deleted first. */
FTC_API int ftc_optim_new(ftc_optim *out, int kind, const ftc_tensor *params, int64_t n_params, const double *hyper,
                          int n_hyper);
FTC_API int ftc_optim_delete(ftc_optim *o);
FTC_API void ftc_optim_release(ftc_optim o);  /* see ftc_tensor_release */
/* *dst = a second handle to the optimizer of src (a null src makes *dst null). */
FTC_API int ftc_optim_share(ftc_optim src, ftc_optim *dst);
FTC_API int ftc_optim_step(ftc_optim o);
/* A closure for optimizers that re-evaluate the loss (LBFGS): sets *loss to a new tensor handle
 * holding the loss (ownership passes to the caller) and returns FTC_OK, or returns a nonzero
 * status after ftc_set_last_error (the step then fails with FTC_ERR_CALLBACK and that message). */
typedef int (*ftc_closure)(void *context, ftc_tensor *loss);
/* zero_grad, loss = closure(), loss.backward(), as many times as the optimizer needs, then the
 * update; *loss receives the first loss value. */
FTC_API int ftc_optim_step_closure(ftc_optim o, ftc_closure closure, void *context, double *loss);
/* Gradients to undefined (set_to_none, PyTorch's default) or to zero. */
FTC_API int ftc_optim_zero_grad(ftc_optim o, int set_to_none);
FTC_API int ftc_optim_get_lr(ftc_optim o, double *lr);
FTC_API int ftc_optim_set_lr(ftc_optim o, double lr);
FTC_API int ftc_optim_step_count(ftc_optim o, int64_t *steps);
/* torch.nn.utils.clip_grad_norm_ / clip_grad_value_ over the optimizer's parameters. */
FTC_API int ftc_optim_clip_grad_norm(ftc_optim o, double max_norm, double norm_type, double *total_norm);
FTC_API int ftc_optim_clip_grad_value(ftc_optim o, double clip_value);

/* enum ftc_scheduler_kind: see ftorch_c_enums.h. */

/* New scheduler of an optimizer (which it keeps alive); params by kind:
 *   step: step_size, gamma          multistep: gamma (+ milestones)     exponential: gamma
 *   cosine: T_max, eta_min           linear: start_factor, end_factor, total_iters
 *   plateau: mode (0 min, 1 max), factor, patience, threshold, threshold_mode (0 rel, 1 abs),
 *            cooldown, min_lr, eps
 * As in PyTorch, creating it applies the schedule's initial value to the learning rate. */
FTC_API int ftc_scheduler_new(ftc_scheduler *out, ftc_optim o, int kind, const double *params, int n_params,
                              const int64_t *milestones, int n_milestones);
FTC_API int ftc_scheduler_delete(ftc_scheduler *s);
FTC_API void ftc_scheduler_release(ftc_scheduler s);  /* see ftc_tensor_release */
/* *dst = a second handle to the scheduler of src (a null src makes *dst null). */
FTC_API int ftc_scheduler_share(ftc_scheduler src, ftc_scheduler *dst);
/* One scheduler step; reduce-on-plateau needs the metric (has_metric = 1). */
FTC_API int ftc_scheduler_step(ftc_scheduler s, int has_metric, double metric);
FTC_API int ftc_scheduler_last_lr(ftc_scheduler s, double *lr);

#ifdef __cplusplus
}
#endif
#endif
