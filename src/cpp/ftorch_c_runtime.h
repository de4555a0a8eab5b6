/* ftorch_c_runtime.h - status codes, the thread-local last error, versions, devices, handle count.
 *
 * Conventions for the whole C API (prefix ftc_):
 *  - every fallible function returns an int status, FTC_OK (0) on success;
 *  - on failure the reason is kept in a thread-local buffer read with ftc_last_error();
 *  - no C++ exception ever leaves a function of this API;
 *  - handles are opaque; *_delete(&h) frees and nulls h, and deleting a null handle is a no-op.
 */
#ifndef FTORCH_C_RUNTIME_H
#define FTORCH_C_RUNTIME_H

#include <stdint.h>
#include "ftorch_c_enums.h"

#if defined(__GNUC__)
#define FTC_API __attribute__((visibility("default")))
#else
#define FTC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (enum ftc_status), dtypes, devices and reductions: see ftorch_c_enums.h. */

/* Message of the last failure on this thread ("" when the last call succeeded). */
FTC_API const char *ftc_last_error(void);
/* Length in bytes of ftc_last_error(), and a copy of it (not NUL-terminated) into buf. */
FTC_API int64_t ftc_last_error_length(void);
FTC_API void ftc_last_error_copy(char *buf, int64_t buflen);

/* Version of this library, and of the torch release it was compiled against. */
FTC_API const char *ftc_version(void);
FTC_API const char *ftc_torch_version_built(void);
/* Version of the LibTorch actually loaded ("" if it cannot be determined). */
FTC_API const char *ftc_torch_version_runtime(void);
/* FTC_OK when the loaded LibTorch is the one we were built with, FTC_ERR_VERSION otherwise.
 * Every other entry point runs this check once per process before doing anything. */
FTC_API int ftc_check_runtime(void);

/* 1 if a device of that type (FTorch enumerator) and index can be used, else 0. */
FTC_API int ftc_device_available(int device_type, int device_index);

/* Catch scopes of the calling thread, for language bindings whose functions cannot return a
 * status (Fortran's operators): inside a scope the binding records failures with
 * ftc_catch_record (the first one is kept; returns 1 when a scope is open, 0 otherwise) instead
 * of stopping; ftc_catch_end closes the innermost scope, gives its first status (FTC_OK if none)
 * and makes its message the last error. It returns 0 when no scope was open. */
FTC_API void ftc_catch_begin(void);
FTC_API int ftc_catch_record(int status, const char *msg, int64_t msglen);
FTC_API int ftc_catch_end(int *status);
/* Around a user procedure called back from the C layer: ftc_callback_scope_begin opens a catch
 * scope that is also a barrier (ftc_catch_end inside the callback cannot close it);
 * ftc_callback_scope_end closes it together with every scope the callback left open, giving the
 * first failure recorded (FTC_ERR_INVALID_ARGUMENT for scopes left open, if nothing failed). */
FTC_API void ftc_callback_scope_begin(void);
FTC_API int ftc_callback_scope_end(int *status);

/* Seed every random-number generator LibTorch draws from (the CPU's and each GPU's), as
 * torch.manual_seed does: dropout and random initial values, in compiled packages too. */
FTC_API int ftc_manual_seed(int64_t seed); /* seed >= 0 */

/* Number of live handles (tensors, models, optimizers, schedulers) over all threads. */
FTC_API int64_t ftc_live_handles(void);

/* A process-wide lock around the Fortran modules' registry of user procedures (callbacks);
 * not for other uses. */
FTC_API void ftc_callback_registry_lock(void);
FTC_API void ftc_callback_registry_unlock(void);

#ifdef __cplusplus
}
#endif
#endif
