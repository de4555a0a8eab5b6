/* ftorch_c_arglist.h - ordered argument lists of tensors, integers, reals, logicals and strings:
 * arguments of model forward calls that take non-tensor values, and of Python calls (and their
 * results). */
#ifndef FTORCH_C_ARGLIST_H
#define FTORCH_C_ARGLIST_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ftc_arglist_s *ftc_arglist;

/* *out = a new empty list (a list in *out is freed first). */
FTC_API int ftc_arglist_new(ftc_arglist *out);
FTC_API int ftc_arglist_delete(ftc_arglist *l);
FTC_API void ftc_arglist_release(ftc_arglist l); /* see ftc_tensor_release */
/* *dst = a second handle to the list of src (a null src makes *dst null). */
FTC_API int ftc_arglist_share(ftc_arglist src, ftc_arglist *dst);
/* Append an item. A null *l is first made a new empty list. A tensor item refers to the tensor
 * (its memory, not a copy of its values): later changes to the tensor are seen by later calls. */
FTC_API int ftc_arglist_add_tensor(ftc_arglist *l, ftc_tensor t);
/* Append n tensors (every temporary among them is released, whatever fails). */
FTC_API int ftc_arglist_add_tensors(ftc_arglist *l, const ftc_tensor *tensors, int64_t n);
/* Append the items of another list (tensor items refer to the same tensors). */
FTC_API int ftc_arglist_extend(ftc_arglist *l, ftc_arglist other);
FTC_API int ftc_arglist_add_int(ftc_arglist *l, int64_t value);
FTC_API int ftc_arglist_add_real(ftc_arglist *l, double value);
FTC_API int ftc_arglist_add_logical(ftc_arglist *l, int value);
FTC_API int ftc_arglist_add_string(ftc_arglist *l, const char *value, int64_t length);
/* Remove every item (a null list is left alone). */
FTC_API int ftc_arglist_clear(ftc_arglist l);
/* Number of items (0 for a null list). */
FTC_API int ftc_arglist_size(ftc_arglist l, int64_t *n);
/* Kind (enum ftc_arg_kind) of item `index` (0-based). */
FTC_API int ftc_arglist_kind(ftc_arglist l, int64_t index, int *kind);
/* Item `index` (0-based). A tensor item gives a new handle to the same tensor in *out (an old
 * handle there is freed). Numbers convert as Python does: get_real accepts an integer item;
 * get_int, get_real and get_logical accept a tensor of one element; get_logical accepts an
 * integer (nonzero = true). Anything else is FTC_ERR_DTYPE naming the item's kind. */
FTC_API int ftc_arglist_get_tensor(ftc_arglist l, int64_t index, ftc_tensor *out);
FTC_API int ftc_arglist_get_int(ftc_arglist l, int64_t index, int64_t *value);
FTC_API int ftc_arglist_get_real(ftc_arglist l, int64_t index, double *value);
FTC_API int ftc_arglist_get_logical(ftc_arglist l, int64_t index, int *value);
/* A string item: its length in *length, and up to buflen bytes copied into buf (may be NULL). */
FTC_API int ftc_arglist_get_string(ftc_arglist l, int64_t index, char *buf, int64_t buflen, int64_t *length);

#ifdef __cplusplus
}
#endif
#endif
