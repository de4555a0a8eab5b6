/* ftorch_c_math.h - tensor arithmetic: assignment, operators, elementwise functions, reductions,
 * views. Every operation writes its result to *out (a new handle, or the handle of an operand
 * the call consumes) and follows PyTorch's broadcasting, type promotion and autograd rules.
 *
 * `release` is a bit mask of operands the call consumes (bit 0: first operand, bit 1: second):
 * a consumed operand's handle is freed, or reused for the result. Fortran marks the results of
 * expressions as temporaries and releases them this way, without relying on finalization. */
#ifndef FTORCH_C_MATH_H
#define FTORCH_C_MATH_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ftc_binary_op { FTC_ADD = 0, FTC_SUB = 1, FTC_MUL = 2, FTC_DIV = 3, FTC_POW = 4, FTC_MATMUL = 5 };

enum ftc_unary_op {
  FTC_NEG = 0, FTC_EXP = 1, FTC_LOG = 2, FTC_SQRT = 3, FTC_ABS = 4, FTC_SIN = 5, FTC_COS = 6,
  FTC_TANH = 7, FTC_SIGMOID = 8, FTC_RELU = 9, FTC_CLONE = 10, FTC_DETACH = 11
};

enum ftc_reduce_op { FTC_SUM = 0, FTC_MEAN = 1 };

/* lhs = rhs. A constructed lhs keeps its storage (an aliased Fortran array receives the values,
 * broadcast and converted to its dtype) and takes rhs's autograd history in place of its own.
 * An unconstructed lhs takes rhs itself when rhs is released, a copy otherwise. */
FTC_API int ftc_tensor_assign(ftc_tensor *lhs, ftc_tensor rhs, int release);

/* a op b. Devices must match. */
FTC_API int ftc_tensor_binary(int op, ftc_tensor a, ftc_tensor b, int release, ftc_tensor *out);

/* a op s (or s op a when scalar_first), s an integer (is_integer) or a real scalar, which
 * promotes like a Python number: tensor(float32) * 2.0 stays float32. */
FTC_API int ftc_tensor_binary_scalar(int op, ftc_tensor a, int64_t int_value, double real_value, int is_integer,
                                     int scalar_first, int release, ftc_tensor *out);

FTC_API int ftc_tensor_unary(int op, ftc_tensor a, int release, ftc_tensor *out);

/* Sum or mean over the listed dims (0-based; ndims = 0: over all elements). */
FTC_API int ftc_tensor_reduce(int op, ftc_tensor a, int ndims, const int64_t *dims, int keepdim, int release,
                              ftc_tensor *out);

/* Views: reshape (a copy only when the layout requires it), permute (0-based), transpose. */
FTC_API int ftc_tensor_reshape(ftc_tensor a, int ndims, const int64_t *shape, int release, ftc_tensor *out);
FTC_API int ftc_tensor_permute(ftc_tensor a, int ndims, const int64_t *dims, int release, ftc_tensor *out);
FTC_API int ftc_tensor_transpose(ftc_tensor a, int64_t dim0, int64_t dim1, int release, ftc_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
