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
enum ftc_grad_scope { FTC_SCOPE_NO_GRAD = 0, FTC_SCOPE_ENABLE_GRAD = 1, FTC_SCOPE_INFERENCE = 2 };
FTC_API int ftc_grad_scope_push(int scope);
FTC_API int ftc_grad_scope_pop(int scope);
FTC_API int ftc_grad_enabled(void);
FTC_API int ftc_inference_mode_enabled(void);

#ifdef __cplusplus
}
#endif
#endif
