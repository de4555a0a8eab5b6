/* ftorch_c_autograd.h - gradients, backward, and grad-mode scopes. */
#ifndef FTORCH_C_AUTOGRAD_H
#define FTORCH_C_AUTOGRAD_H

#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backpropagate from t. gradient may be NULL for a one-element t (implicit unit gradient). */
FTC_API int ftc_tensor_backward(ftc_tensor t, ftc_tensor gradient, int retain_graph);
/* t.grad into *gradient: copied into its storage when constructed (same shape), else a new copy. */
FTC_API int ftc_tensor_get_gradient(ftc_tensor t, ftc_tensor *gradient);
/* Zero t.grad in place; a no-op when t has no gradient yet. */
FTC_API int ftc_tensor_zero_grad(ftc_tensor t);
/* t.grad = a copy of gradient (same shape; dtype and device converted to t's). */
FTC_API int ftc_tensor_set_gradient(ftc_tensor t, ftc_tensor gradient);
FTC_API int ftc_tensor_set_requires_grad(ftc_tensor t, int requires_grad);
FTC_API int ftc_tensor_is_leaf(ftc_tensor t, int *is_leaf);

/* Grad-mode scopes of the calling thread (LibTorch's modes are thread-local). push enters a
 * scope, pop leaves the innermost one; scopes nest. */
/* enum ftc_grad_scope: see ftorch_c_enums.h. */
FTC_API int ftc_grad_scope_push(int scope);
FTC_API int ftc_grad_scope_pop(int scope);
FTC_API int ftc_grad_enabled(void);
FTC_API int ftc_inference_mode_enabled(void);

/* Gradient hooks: hook(data, grad, &new_grad) runs when the gradient of t is computed, before
 * it is accumulated or passed on; it may store a replacement (same shape, dtype and device) in
 * new_grad (left NULL: unchanged). A failing hook fails the backward with FTC_ERR_CALLBACK.
 * *hook_id identifies it for removal. */
typedef int (*ftc_grad_hook_fn)(void *data, ftc_tensor grad, ftc_tensor *new_grad);
FTC_API int ftc_tensor_register_hook(ftc_tensor t, ftc_grad_hook_fn hook, void *data, int64_t *hook_id);
FTC_API int ftc_tensor_remove_hook(ftc_tensor t, int64_t hook_id);

/* Anomaly detection (process-wide, as torch.autograd.set_detect_anomaly): backward checks every
 * node's results for NaN and fails naming the node, i.e. the forward operation that made it. */
FTC_API int ftc_set_detect_anomaly(int enabled, int check_nan);
FTC_API int ftc_detect_anomaly_enabled(void);

#ifdef __cplusplus
}
#endif
#endif
