/* ftorch_c_math.h - tensor arithmetic: assignment, operators, elementwise functions, reductions,
 * views. Every operation writes its result to *out (a new handle) and follows PyTorch's
 * broadcasting, type promotion and autograd rules.
 *
 * `temporary` says what the result is (enum ftc_result_kind): FTC_NAMED (C callers: delete it
 * yourself); FTC_TEMPORARY: the first API call that reads it (any call taking a tensor) releases
 * it when it returns, whether it succeeds or fails -- Fortran uses this where the compiler does
 * not finalize function results, so expressions never leak whatever procedure they are passed
 * to; FTC_TEMPORARY_FINALIZED: a result the binding deletes itself (Fortran's finalizer, at the
 * end of the statement), which assignment to an unconstructed tensor takes over without a copy. */
#ifndef FTORCH_C_MATH_H
#define FTORCH_C_MATH_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* enum ftc_result_kind, ftc_binary_op, ftc_unary_op, ftc_reduce_op: see ftorch_c_enums.h. */

/* lhs = rhs. A constructed lhs keeps its memory (an aliased Fortran array receives the values,
 * broadcast and converted to its dtype) and takes rhs's autograd history in place of its own.
 * If something else still refers to that memory (a graph that saved it for backward, a view),
 * its old contents are first moved to new memory that those keep, so `x = f(x)` never changes a
 * value saved for backward. Written in place instead: tensors bound to model or optimizer
 * parameters, views (the base keeps its memory and sees the values), and a leaf with autograd
 * state (requires grad, a gradient or hooks) given a value without history (it keeps its gradient
 * and hooks; a graph that saved it reports the change at backward, as in PyTorch).
 * An unconstructed lhs takes a temporary rhs itself, a copy of a named one otherwise; an
 * unconstructed rhs makes lhs unconstructed. */
FTC_API int ftc_tensor_assign(ftc_tensor *lhs, ftc_tensor rhs);
/* One element of a Fortran elemental `=`: ftc_tensor_assign, and a constructed *lhs gets a new
 * write stamp (a value that names the same tensor for every call). An rhs whose stamp is older
 * than its tensor's -- a copy of the handle taken before an `=` wrote that tensor, as in the
 * element-by-element assignment of overlapping array sections by gfortran <= 12 -- is refused
 * (FTC_ERR_NULL_HANDLE) instead of silently reading the new values. The same handle on both sides
 * does nothing and prints a warning once per process (what compilers run for `hist = [hist, t]`,
 * which a defined assignment cannot enlarge; FTORCH_SELF_ASSIGNMENT_WARN=0 silences it). */
FTC_API int ftc_tensor_assign_element(ftc_tensor *lhs, ftc_tensor rhs);
/* lhs[i] = rhs[i] for i = 0..n-1 in order, as one Fortran array assignment: every rhs element is
 * read as it was before the first element was assigned, also where rhs elements are lhs elements
 * (overlapping sections, permutations). Constructed lhs[i] get new write stamps, as with
 * ftc_tensor_assign_element. */
FTC_API int ftc_tensor_assign_many(ftc_tensor *lhs, const ftc_tensor *rhs, int64_t n);
/* *out = t marked as a user function's result (Fortran's torch_result): an unconstructed tensor
 * that takes it over with `=` is released by the first call that reads it. `temporary` as for
 * operators (FTC_TEMPORARY or FTC_TEMPORARY_FINALIZED). */
FTC_API int ftc_tensor_mark_result(ftc_tensor t, int temporary, ftc_tensor *out);
/* t = s (every element), with the memory rules of ftc_tensor_assign. */
FTC_API int ftc_tensor_fill(ftc_tensor t, int64_t int_value, double real_value, int is_integer);

/* a op b. Devices must match. */
FTC_API int ftc_tensor_binary(int op, ftc_tensor a, ftc_tensor b, int temporary, ftc_tensor *out);

/* a op s (or s op a when scalar_first), s an integer (is_integer) or a real scalar, which
 * promotes like a Python number: tensor(float32) * 2.0 stays float32. */
FTC_API int ftc_tensor_binary_scalar(int op, ftc_tensor a, int64_t int_value, double real_value, int is_integer,
                                     int scalar_first, int temporary, ftc_tensor *out);

FTC_API int ftc_tensor_unary(int op, ftc_tensor a, int temporary, ftc_tensor *out);

/* Sum or mean over the listed dims (0-based; ndims = 0: over all elements). */
FTC_API int ftc_tensor_reduce(int op, ftc_tensor a, int ndims, const int64_t *dims, int keepdim, int temporary,
                              ftc_tensor *out);

/* Views: reshape (a copy only when the layout requires it), permute (0-based), transpose. */
FTC_API int ftc_tensor_reshape(ftc_tensor a, int ndims, const int64_t *shape, int temporary, ftc_tensor *out);
FTC_API int ftc_tensor_permute(ftc_tensor a, int ndims, const int64_t *dims, int temporary, ftc_tensor *out);
FTC_API int ftc_tensor_transpose(ftc_tensor a, int64_t dim0, int64_t dim1, int temporary, ftc_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
