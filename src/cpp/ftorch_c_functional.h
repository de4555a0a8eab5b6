/* ftorch_c_functional.h - the functional gradient API (torch.autograd.grad and friends) and the
 * gradient check. Results are written into the given handles: into a constructed tensor's memory
 * (same shape; an aliased array receives them), else as a new tensor. */
#ifndef FTORCH_C_FUNCTIONAL_H
#define FTORCH_C_FUNCTIONAL_H

#include "ftorch_c_function.h"
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gradients of outputs w.r.t. inputs, without touching .grad. grad_outputs: NULL, or n_outputs
 * handles (NULL entries: implicit unit gradient of a one-element output). retain_graph: 0, 1, or
 * -1 for "as create_graph". An input the outputs do not depend on is an error unless
 * allow_unused; its gradient is then zeros (constructed grads[i]) or left unconstructed. */
FTC_API int ftc_autograd_grad(const ftc_tensor *outputs, int n_outputs, const ftc_tensor *inputs, int n_inputs,
                              const ftc_tensor *grad_outputs, int retain_graph, int create_graph, int allow_unused,
                              ftc_tensor *grads);
/* d output / d input, shape output.shape ++ input.shape, from output's graph (kept). */
FTC_API int ftc_autograd_jacobian(ftc_tensor output, ftc_tensor input, int create_graph, ftc_tensor *jacobian);
/* Jacobian-vector product (d output / d input) . v, v of input's shape, from output's graph
 * (kept); needs the graph to be twice differentiable. */
FTC_API int ftc_autograd_jvp(ftc_tensor output, ftc_tensor input, ftc_tensor v, int create_graph, ftc_tensor *result);

/* Gradient check of fn (inputs -> n_outputs outputs): analytic Jacobians by backward against
 * central finite differences (step eps) for every float64 input that requires grad, elementwise
 * |analytic - numeric| <= atol + rtol |numeric|. *passed: 1 or 0; the worst entry (largest
 * error relative to its tolerance): error, analytic and numeric values, and where[4] = input,
 * input element, output, output element (0-based, row-major). Inputs are perturbed in place and
 * restored. */
FTC_API int ftc_gradcheck(ftc_segment_fn fn, void *data, const ftc_tensor *inputs, int n_inputs, int n_outputs,
                          double eps, double atol, double rtol, int *passed, double *worst_error, double *analytic,
                          double *numeric, int64_t *where);

#ifdef __cplusplus
}
#endif
#endif
