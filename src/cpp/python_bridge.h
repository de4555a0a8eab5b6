/* python_bridge.h - between libftorch_c (which knows torch, not Python) and libftorch_python
 * (which knows only Python's stable C API, not torch): tensors cross as DLPack capsules, so one
 * bridge serves every Python version. Internal: not installed. */
#ifndef FTORCH_PYTHON_BRIDGE_H
#define FTORCH_PYTHON_BRIDGE_H

#include <stdint.h>

#define FTC_BRIDGE_VERSION 3

#ifdef __cplusplus
extern "C" {
#endif

/* Where a tensor argument's elements are and how they are laid out (any encoding of the dtype and
 * device: equal layouts give equal values). sizes and strides (ndim each) are valid during the call. */
struct ftc_bridge_layout {
  const void *data;
  int32_t device_type, device_index, dtype, ndim;
  const int64_t *sizes, *strides;
  int64_t offset;
};

/* One argument or result. kind is an enum ftc_arg_kind value. A tensor is a DLManagedTensor*
 * whose ownership moves with the value. An argument can be reusable instead: its memory is the
 * caller's (a Fortran array) and it does not require grad, so the Python tensor made for it may be
 * kept and passed again while `layout` stays the same; its dlpack is then null, and
 * make_dlpack(source) makes one when a new Python tensor is needed. */
struct ftc_bridge_value {
  int kind;
  void *dlpack;
  int requires_grad;
  int reusable;
  const void *source;
  struct ftc_bridge_layout layout;
  int64_t integer; /* integers, and logicals (0/1) */
  double real;
  const char *text; /* strings: not NUL-terminated; valid during the call that passes it */
  int64_t length;
};

/* A value of this kind among the arguments of a call (integer = n) makes the n values after it
 * one Python list argument (pytorch-fortran's `ftn_pytorch_forward(inputs)` convention). */
#define FTC_BRIDGE_LIST (-1)

/* Receives the results of a call, one by one; returns 0, or nonzero (out of memory) to stop. */
typedef int (*ftc_bridge_sink)(void *ctx, const struct ftc_bridge_value *value);

struct ftc_bridge {
  /* Start (or join) the interpreter: program is the Python executable of the environment
   * (sys.prefix follows from it), site_dir its site-packages, which holds torch at torch_dir,
   * of version torch_version; dlpack_delete frees a DLManagedTensor nobody took (nothing for
   * null), make_dlpack makes one for a reusable argument's source (null when it cannot). 0 or
   * nonzero. */
  int (*initialize)(const char *program, const char *site_dir, const char *torch_version, const char *torch_dir,
                    void (*dlpack_delete)(void *), void *(*make_dlpack)(const void *source));
  /* Load a module by file path or dotted name into *module (a new reference). */
  int (*load)(const char *name, void **module);
  /* Drop a module reference (nothing once the interpreter is finalized). */
  void (*release)(void *module);
  /* module.function(*args) (FTC_BRIDGE_LIST values group the following ones into a list);
   * results (None: none, a tuple/list: its items, else one) to sink. */
  int (*call)(void *module, const char *function, const struct ftc_bridge_value *args, int64_t n_args,
              ftc_bridge_sink sink, void *ctx);
  /* Message of the calling thread's last failure. */
  const char *(*last_error)(void);
  /* At process exit: finalize an interpreter this bridge started (on the thread that started it). */
  void (*finalize)(void);
};

/* The one symbol libftorch_python exports: fills *out; 0, or nonzero for a version mismatch. */
int ftorch_python_bridge(int version, struct ftc_bridge *out);

#ifdef __cplusplus
}
#endif
#endif
