/* ftorch_c_model.h - TorchScript models: load, forward, save, parameters. */
#ifndef FTORCH_C_MODEL_H
#define FTORCH_C_MODEL_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_arglist.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ftc_model_s *ftc_model;

/* Load a TorchScript file onto a device; is_training selects train() (1) or eval() (0), or keeps
 * the mode the model was saved in (-1).
 * If *out is not null it is deleted first. */
FTC_API int ftc_model_load(ftc_model *out, const char *filename, int device_type, int device_index,
                   int requires_grad, int is_training);
/* Free *m and set it to NULL (null and stale handles are left alone). */
FTC_API int ftc_model_delete(ftc_model *m);
FTC_API void ftc_model_release(ftc_model m);  /* see ftc_tensor_release */
/* *dst = a second handle to the model of src (both run the same module; either may be deleted
 * first). A null src makes *dst null. */
FTC_API int ftc_model_share(ftc_model src, ftc_model *dst);

/* Run forward(inputs...). A Tensor result fills outputs[0]; a tuple fills outputs[0..n_out).
 * Results are stored as ftc_tensor_assign does: copied into the outputs' memory (aliased Fortran
 * arrays receive them); with requires_grad the graph back to inputs and parameters is recorded
 * and each output carries it. */
FTC_API int ftc_model_forward(ftc_model m, const ftc_tensor *inputs, int n_inputs, const ftc_tensor *outputs,
                      int n_outputs, int requires_grad);

/* forward with the items of an argument list: tensors, and the integers, reals, logicals and
 * strings of models whose forward takes them (int, float, bool, str in TorchScript). */
FTC_API int ftc_model_forward_args(ftc_model m, ftc_arglist args, const ftc_tensor *outputs, int n_outputs,
                                   int requires_grad);

/* forward with the items of args; the returned tensors (one, or a tuple/list of them) become
 * the items of *results (made new when null, else overwritten), sharing the model's result memory
 * (no copy). */
FTC_API int ftc_model_forward_list(ftc_model m, ftc_arglist args, ftc_arglist *results, int requires_grad);

FTC_API int ftc_model_save(ftc_model m, const char *filename);
FTC_API int ftc_model_is_training(ftc_model m, int *is_training);
FTC_API int ftc_model_print_parameters(ftc_model m);
FTC_API int ftc_model_parameter_count(ftc_model m, int64_t *count);
/* New handles sharing storage with the model's parameters, in parameters() order; n must equal
 * the parameter count and every outputs[i] must be null. */
FTC_API int ftc_model_parameters(ftc_model m, ftc_tensor *outputs, int64_t n);

/* TorchScript graph-executor optimization for the models this library runs (default off: each
 * call runs the same operators, so results do not depend on how many calls came before). */
FTC_API void ftc_set_jit_optimize(int enabled);
FTC_API int ftc_jit_optimize(void);

/* Handle sharing storage with one parameter, chosen by name (if name is not NULL/empty) or by
 * 0-based index in parameters() order. */
FTC_API int ftc_model_parameter(ftc_model m, const char *name, int64_t index, ftc_tensor *out);
/* Name of parameter `index` (0-based): copied into buf (not NUL-terminated), *length its length. */
FTC_API int ftc_model_parameter_name(ftc_model m, int64_t index, char *buf, int64_t buflen, int64_t *length);
/* requires_grad of every parameter whose name equals `name` or starts with `name` + "."
 * (all parameters for an empty name); *matched counts them. A name that matches nothing is an error. */
FTC_API int ftc_model_set_requires_grad(ftc_model m, const char *name, int requires_grad, int64_t *matched);
/* Total number of parameter elements (only those requiring grad if trainable_only). */
FTC_API int ftc_model_numel(ftc_model m, int trainable_only, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
