/* ftorch_c_python.h - embedded Python: load Python modules and call their functions on tensors
 * (shared with Python without copies, through DLPack), numbers, logicals and strings.
 *
 * The interpreter is the one of the environment FTorch is installed in. It is loaded the first
 * time it is needed (libftorch_c itself links no libpython), started once per process, and the
 * global interpreter lock is held only while a call runs, so threads that do not call Python
 * are never blocked and any thread may call. A program that is itself Python (a Fortran library
 * called from Python) reuses the running interpreter. Python exceptions become FTC_ERR_PYTHON with
 * the exception type, message and traceback as the error message. */
#ifndef FTORCH_C_PYTHON_H
#define FTORCH_C_PYTHON_H

#include <stdint.h>
#include "ftorch_c_arglist.h"
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ftc_pymodule_s *ftc_pymodule;

/* Load a Python module: a file path (ending in .py, or containing '/') is executed as a new
 * module whose directory is put first on sys.path; anything else is imported by dotted name
 * (importlib.import_module). A module in *out is freed first. */
FTC_API int ftc_pymodule_load(ftc_pymodule *out, const char *name);
FTC_API int ftc_pymodule_delete(ftc_pymodule *m);
FTC_API void ftc_pymodule_release(ftc_pymodule m); /* see ftc_tensor_release */
FTC_API int ftc_pymodule_share(ftc_pymodule src, ftc_pymodule *dst);
/* Call function `name` of the module with the items of args (a null list: no arguments).
 * Tensors arrive as torch.Tensor sharing memory with the caller's tensors (requires_grad
 * carried; the autograd graph does not cross: a tensor arrives as a leaf). The result: None (no
 * items), one value or a tuple/list of values (tensors, int, float, bool, str). If results is not
 * NULL, the list *results (made new when null) gets them as its items (tensors share Python's
 * memory); if n_outputs > 0,
 * the tensor results are also written into outputs[0..n_outputs) as ftc_tensor_assign does (their
 * number and shapes must match). */
FTC_API int ftc_pymodule_call(ftc_pymodule m, const char *name, ftc_arglist args, ftc_arglist *results,
                              const ftc_tensor *outputs, int n_outputs);
/* ftc_pymodule_call with the first n_grouped items of args passed as one Python list (the first
 * positional argument), the others after it: pytorch-fortran's `ftn_pytorch_forward(inputs)` and
 * `ftn_pytorch_train(inputs, target)` convention. */
FTC_API int ftc_pymodule_call_grouped(ftc_pymodule m, const char *name, ftc_arglist args, int64_t n_grouped,
                                      ftc_arglist *results, const ftc_tensor *outputs, int n_outputs);
/* Whether the Python interpreter is loaded in this process (1/0): by FTorch or by the program. */
FTC_API int ftc_python_loaded(void);
/* Start the embedded interpreter now (FTC_OK) or say why it cannot be (FTC_ERR_PYTHON): what
 * the first ftc_pymodule_load would do. */
FTC_API int ftc_python_initialize(void);
/* Which libpython and Python executable FTorch would use (or uses), found without loading them;
 * written NUL-terminated into buf (at most buflen bytes) as "libpython\nexecutable". */
FTC_API int ftc_python_locate(char *buf, int64_t buflen);

#ifdef __cplusplus
}
#endif
#endif
