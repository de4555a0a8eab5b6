/* ftorch_c_tensor.h - tensors: construction, wrapping foreign memory, queries, copies. */
#ifndef FTORCH_C_TENSOR_H
#define FTORCH_C_TENSOR_H

#include <stdint.h>
#include "ftorch_c_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ftc_tensor_s *ftc_tensor;

/* Report a failure found before any work (an argument the Fortran layer rejects): the
 * temporaries among handles[0..n-1] are released, msg becomes the last error; returns status. */
FTC_API int ftc_reject(int status, const char *msg, int64_t msglen, const ftc_tensor *handles, int64_t n);

/* Fill of ftc_tensor_new. */
/* enum ftc_fill: see ftorch_c_enums.h. */

/* New row-major tensor owned by LibTorch. device_index < 0 means the default for the type.
 * If *out is not null it is deleted first (constructing into a live tensor frees it). */
FTC_API int ftc_tensor_new(ftc_tensor *out, int fill, int ndims, const int64_t *shape, int dtype,
                   int device_type, int device_index, int requires_grad);

/* Tensor over caller-owned memory, never copied on the CPU (the memory must outlive it).
 * layout (1-based, may be NULL = 1..ndims) lists dimensions from fastest to slowest varying.
 * permute (1-based, may be NULL) then reorders the dimensions as torch.permute does.
 * On a device other than the CPU the data are copied there (memory already on the device:
 * ftc_tensor_from_device_blob). */
FTC_API int ftc_tensor_from_blob(ftc_tensor *out, void *data, int ndims, const int64_t *shape,
                         const int32_t *layout, const int32_t *permute, int dtype,
                         int device_type, int device_index, int requires_grad);

/* Tensor over memory already on the device (a CUDA pointer from cudaMalloc, OpenACC host_data
 * use_device or ftc_tensor_device_view), wrapped without a copy; the memory must outlive the
 * tensor. The address must be memory of that device (checked: host memory or another GPU's is
 * FTC_ERR_DEVICE); device_index < 0 takes the device the memory is on. On the CPU it is
 * ftc_tensor_from_blob. Arguments as for ftc_tensor_from_blob. */
FTC_API int ftc_tensor_from_device_blob(ftc_tensor *out, void *data, int ndims, const int64_t *shape,
                                        const int32_t *layout, const int32_t *permute, int dtype,
                                        int device_type, int device_index, int requires_grad);

/* Free *t and set it to NULL. A null handle, or a stale one (a copy of a handle deleted before),
 * is left alone: deleting twice is harmless. */
FTC_API int ftc_tensor_delete(ftc_tensor *t);
/* Free the tensor of handle t, writing nothing (a null, stale or foreign value is ignored). For
 * finalizers: gfortran 12 passes wrong addresses for elements of array components it finalizes,
 * so a finalizer must not write to its argument. The same for models, optimizers, schedulers. */
FTC_API void ftc_tensor_release(ftc_tensor t);

FTC_API int ftc_tensor_rank(ftc_tensor t, int *rank);
/* Pointers into the tensor's own size/stride storage, valid while the tensor lives (an error
 * for a temporary, which the call itself releases). */
FTC_API int ftc_tensor_shape(ftc_tensor t, const int64_t **sizes, int *ndims);
FTC_API int ftc_tensor_strides(ftc_tensor t, const int64_t **strides, int *ndims);
FTC_API int ftc_tensor_dtype(ftc_tensor t, int *dtype);
FTC_API int ftc_tensor_device(ftc_tensor t, int *device_type, int *device_index);
FTC_API int ftc_tensor_requires_grad(ftc_tensor t, int *requires_grad);
FTC_API int ftc_tensor_print(ftc_tensor t);
FTC_API int ftc_tensor_zero(ftc_tensor t);

/* Copy src into the existing storage of dst (same shape), converting dtype and device. */
FTC_API int ftc_tensor_copy_into(ftc_tensor src, ftc_tensor dst, int non_blocking);

/* Address and shape (out) of the data of a CPU tensor of this dtype and rank laid out column-major
 * (Fortran order), for a no-copy view; an error otherwise. */
FTC_API int ftc_tensor_data_view(ftc_tensor t, int dtype, int ndims, int64_t *shape, void **data);
/* The same for a tensor on any device: for a GPU tensor the address is device memory (for CUDA
 * kernels, OpenACC deviceptr, ftc_tensor_from_device_blob). */
FTC_API int ftc_tensor_device_view(ftc_tensor t, int dtype, int ndims, int64_t *shape, void **data);

/* Copy the tensor (any layout, device or dtype) into column-major memory of this dtype/shape. */
FTC_API int ftc_tensor_copy_to_blob(ftc_tensor t, void *data, int dtype, int ndims, const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif
