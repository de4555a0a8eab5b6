/* ftorch_c_function.h - custom autograd functions written by the user (forward and backward are
 * user code), their context, saved-tensor hooks and activation checkpointing.
 *
 * Applying a custom function, from the language binding:
 *   ftc_function_begin(id, inputs, n, &ctx, forward_inputs)  -- a context; grad mode off
 *   ... the binding runs the user's forward on forward_inputs, through the ctx_* calls ...
 *   ftc_function_finish(ctx, outputs, m)  -- one node in the graph; grad mode restored
 * or ftc_function_abort(ctx) when the forward failed (nothing is recorded).
 * forward_inputs are new handles to the same tensors (identity kept; temporaries among the
 * caller's inputs are released as in any call); finish and abort free them.
 *
 * Backward calls the definition's backward callback on the thread that runs the node (the
 * thread that called backward for CPU graphs; LibTorch's device threads for CUDA nodes). The
 * callback returns FTC_OK or a status; ftc_set_last_error gives its message. Its failure
 * becomes FTC_ERR_CALLBACK of the call that ran backward, naming the function. */
#ifndef FTORCH_C_FUNCTION_H
#define FTORCH_C_FUNCTION_H

#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *ftc_function_ctx;

/* Backward of a custom function. grad_outputs: one handle per forward output (NULL for an
 * undefined gradient when materialize_grads is off), owned by the caller. The callback stores new
 * handles in grad_inputs (NULL: no gradient for that input), which the caller takes over;
 * *n_returned is preset to n_inputs and must be left so (a different count is an error). */
typedef int (*ftc_backward_fn)(void *data, ftc_function_ctx ctx, const ftc_tensor *grad_outputs, int n_outputs,
                               ftc_tensor *grad_inputs, int n_inputs, int *n_returned);

/* enum ftc_function_flags: see ftorch_c_enums.h. */

/* Define a custom function (definitions live as long as the process; defining the same name,
 * backward, data and flags again returns the same id). */
FTC_API int ftc_function_define(const char *name, int64_t name_len, ftc_backward_fn backward, void *data, int flags,
                                int64_t *id);
FTC_API int ftc_function_begin(int64_t id, const ftc_tensor *inputs, int n_inputs, ftc_function_ctx *ctx,
                               ftc_tensor *forward_inputs);
/* outputs[m]: the forward's results (constructed). Each handle is kept and takes the history;
 * an output marked as a dirty input's alias becomes that input's tensor. */
FTC_API int ftc_function_finish(ftc_function_ctx ctx, ftc_tensor *outputs, int n_outputs);
FTC_API int ftc_function_abort(ftc_function_ctx ctx);

/* Context, during forward. Indices are 0-based. */
FTC_API int ftc_ctx_save_for_backward(ftc_function_ctx ctx, const ftc_tensor *tensors, int n);
FTC_API int ftc_ctx_mark_non_differentiable(ftc_function_ctx ctx, int output_index);
/* Input `input_index` was modified in place by forward; output `output_index` is that input. */
FTC_API int ftc_ctx_mark_dirty(ftc_function_ctx ctx, int input_index, int output_index);
FTC_API int ftc_ctx_set_materialize_grads(ftc_function_ctx ctx, int materialize);
/* Non-tensor values under a key: kind FTC_VALUE_INTEGER (int64_t data), FTC_VALUE_REAL (double),
 * FTC_VALUE_LOGICAL (int64_t, 0 or 1); n elements. Saving again replaces. */
/* enum ftc_value_kind: see ftorch_c_enums.h. */
FTC_API int ftc_ctx_save_value(ftc_function_ctx ctx, const char *key, int64_t key_len, int kind, const void *data,
                               int64_t n);
/* Context, during forward and backward. */
FTC_API int ftc_ctx_value_size(ftc_function_ctx ctx, const char *key, int64_t key_len, int kind, int64_t *n);
FTC_API int ftc_ctx_load_value(ftc_function_ctx ctx, const char *key, int64_t key_len, int kind, void *data,
                               int64_t n);
/* In forward: whether input i requires grad (and grad mode is on); in backward: whether this
 * backward pass needs the gradient of input i. */
FTC_API int ftc_ctx_needs_input_grad(ftc_function_ctx ctx, int input_index, int *needs);
/* Context, during backward: the saved tensors (checked: one modified in place since it was saved
 * is an error), as new handles. */
FTC_API int ftc_ctx_saved_count(ftc_function_ctx ctx, int *n);
FTC_API int ftc_ctx_saved_tensor(ftc_function_ctx ctx, int index, ftc_tensor *out);

/* The message of a failure reported by a callback (read when it returns a status). */
FTC_API void ftc_set_last_error(const char *msg, int64_t msg_len);

/* Saved-tensor hooks of the calling thread (a stack): tensors saved by custom functions applied
 * while a policy is active are packed when saved and unpacked when backward needs them.
 *  FTC_PACK_CPU: tensors not on the CPU move to CPU memory;
 *  FTC_PACK_FILES: tensors of at least threshold_bytes are written to a file in directory and read
 *    back (the file is removed when the graph frees it);
 *  FTC_PACK_USER: pack(data, tensor, &packed) and unpack(data, packed, &tensor) callbacks. */
/* enum ftc_pack_policy: see ftorch_c_enums.h. */
typedef int (*ftc_pack_fn)(void *data, ftc_tensor tensor, ftc_tensor *packed);
typedef int (*ftc_unpack_fn)(void *data, ftc_tensor packed, ftc_tensor *tensor);
FTC_API int ftc_saved_tensors_hooks_push(int policy, const char *directory, int64_t directory_len,
                                         int64_t threshold_bytes, ftc_pack_fn pack, void *pack_data,
                                         ftc_unpack_fn unpack, void *unpack_data);
FTC_API int ftc_saved_tensors_hooks_pop(void);
/* Number of tensors currently packed to files by FTC_PACK_FILES (all threads). */
FTC_API int64_t ftc_saved_tensors_files(void);

/* Activation checkpointing: segment(data, inputs, n_inputs, outputs, n_outputs) computes
 * outputs (new handles it stores) from inputs. Forward runs it without recording a graph and
 * keeps only the inputs; backward runs it again with grad mode on and backpropagates through
 * the recomputed graph (into the inputs and anything else it used, such as model parameters). */
typedef int (*ftc_segment_fn)(void *data, const ftc_tensor *inputs, int n_inputs, ftc_tensor *outputs,
                              int n_outputs);
FTC_API int ftc_checkpoint(ftc_segment_fn segment, void *data, const ftc_tensor *inputs, int n_inputs,
                           ftc_tensor *outputs, int n_outputs);

#ifdef __cplusplus
}
#endif
#endif
