/* The C API from plain C: construction over caller memory, queries, statuses and messages, and
 * robustness: null output pointers, negative counts, stale and foreign handles, temporaries. */
#include <stdio.h>
#include <string.h>

#include "ftorch_c.h"

static int passed = 0, failed = 0;

static void check(int ok, const char *name) {
  if (ok) {
    ++passed;
    printf("ok   %s\n", name);
  } else {
    ++failed;
    printf("FAIL %s\n", name);
  }
}

/* A custom function y = 3x from C: backward returns 3 g, or a wrong number of gradients. */
static int miscount = 0;
static int triple_backward(void *data, ftc_function_ctx ctx, const ftc_tensor *grad_outputs, int n_outputs,
                           ftc_tensor *grad_inputs, int n_inputs, int *n_returned) {
  (void)data;
  (void)ctx;
  (void)n_outputs;
  (void)n_inputs;
  if (miscount) *n_returned += miscount;
  return ftc_tensor_binary_scalar(FTC_MUL, grad_outputs[0], 3, 3.0, 1, 0, FTC_NAMED, &grad_inputs[0]);
}

/* A one-rank "communicator" for the distributed C API (no MPI needed): collectives over one rank
 * leave the buffer as it is; allgather copies; `fail_collectives` makes them report an error. */
static int fail_collectives = 0, freed = 0;
static int report(char *msg, int64_t msglen) {
  if (!fail_collectives) return 0;
  snprintf(msg, (size_t)msglen, "fake failure");
  return 5;
}
static int one_allreduce(int64_t ctx, void *buf, int64_t count, int dtype, int op, char *msg, int64_t msglen) {
  (void)ctx; (void)buf; (void)count; (void)dtype; (void)op;
  return report(msg, msglen);
}
static int one_broadcast(int64_t ctx, void *buf, int64_t count, int dtype, int root, char *msg, int64_t msglen) {
  (void)ctx; (void)buf; (void)count; (void)dtype; (void)root;
  return report(msg, msglen);
}
static int one_allgather(int64_t ctx, const void *send, void *recv, int64_t count, int dtype, char *msg,
                         int64_t msglen) {
  (void)ctx;
  memcpy(recv, send, (size_t)count * (dtype == FTC_FLOAT64 || dtype == FTC_INT64 ? 8 : 4));
  return report(msg, msglen);
}
static int one_barrier(int64_t ctx, char *msg, int64_t msglen) {
  (void)ctx;
  return report(msg, msglen);
}
static void one_free(int64_t ctx) { freed += (int)ctx; }

int main(void) {
  double data[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  ftc_tensor t = NULL, u = NULL;
  const int64_t *sizes = NULL;
  int ndims = 0, status;

  check(ftc_check_runtime() == FTC_OK, "runtime matches the build");
  check(strcmp(ftc_version(), "") != 0 && strcmp(ftc_torch_version_built(), "") != 0, "versions are reported");
  status = ftc_tensor_from_blob(&t, data, 2, shape, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0);
  check(status == FTC_OK && t != NULL, "from_blob over a C array");
  check(ftc_tensor_shape(t, &sizes, &ndims) == FTC_OK && ndims == 2 && sizes[0] == 2 && sizes[1] == 3, "shape");
  {
    /* The first argument list and the first tensor share slot and generation: a handle of one
     * kind given for the other (C converts handles only by a cast, but ftc_function_ctx is a
     * void *) is refused, never the object of the same slot in the other table. */
    ftc_arglist list = NULL;
    int64_t n = -1;
    check(ftc_arglist_add_real(&list, 1.0) == FTC_OK, "an argument list");
    check(ftc_tensor_rank((ftc_tensor)list, &ndims) == FTC_ERR_NULL_HANDLE &&
              strstr(ftc_last_error(), "not a tensor handle at all") != NULL,
          "an argument list given for a tensor is refused");
    check(ftc_arglist_size((ftc_arglist)t, &n) == FTC_ERR_NULL_HANDLE && n == -1,
          "a tensor given for an argument list is refused");
    check(ftc_arglist_delete(&list) == FTC_OK && ftc_tensor_rank(t, &ndims) == FTC_OK && ndims == 2,
          "the tensor is untouched");
  }
  {
    /* A shape whose size overflows 64 bits: LibTorch would fail inside a noexcept function
     * (std::terminate); an error before it is reached. */
    int64_t huge[1] = {(int64_t)1 << 62}, wide[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
    status = ftc_tensor_from_blob(&u, data, 1, huge, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0);
    check(status == FTC_ERR_INVALID_ARGUMENT && u == NULL && strstr(ftc_last_error(), "too large") != NULL,
          "from_blob of a shape of 2^62 float64 elements is an error");
    status = ftc_tensor_from_device_blob(&u, data, 2, wide, NULL, NULL, FTC_FLOAT32, FTC_CPU, -1, 0);
    check(status == FTC_ERR_INVALID_ARGUMENT && u == NULL, "from_device_blob of 2^64 elements is an error");
    status = ftc_tensor_new(&u, FTC_FILL_ZEROS, 2, wide, FTC_FLOAT32, FTC_CPU, -1, 0);
    check(status == FTC_ERR_INVALID_ARGUMENT && u == NULL, "a new tensor of 2^64 elements is an error");
    check(ftc_tensor_remove_hook(t, (int64_t)1 << 32) == FTC_ERR_INVALID_ARGUMENT,
          "a hook id beyond 32 bits is an error, not hook 0");
  }
  {
    /* The same tensor twice in one optimizer would be updated twice a step. */
    ftc_tensor p = NULL, params[2];
    ftc_optim o = NULL;
    ftc_sgd_options opts = FTC_SGD_OPTIONS_DEFAULTS;
    int64_t one = 1;
    check(ftc_tensor_new(&p, FTC_FILL_ONES, 1, &one, FTC_FLOAT64, FTC_CPU, -1, 1) == FTC_OK, "a parameter");
    params[0] = p;
    params[1] = p;
    status = ftc_optim_sgd(&o, params, 2, &opts);
    check(status == FTC_ERR_INVALID_ARGUMENT && o == NULL &&
              strstr(ftc_last_error(), "parameter tensor 2 is parameter tensor 1 again") != NULL,
          "a parameter given twice to an optimizer is an error");
    check(ftc_optim_sgd(&o, params, 1, &opts) == FTC_OK && ftc_optim_delete(&o) == FTC_OK, "given once it is taken");
    {
      ftc_lbfgs_options lb = FTC_LBFGS_OPTIONS_DEFAULTS;
      lb.max_eval = -1;
      check(ftc_optim_lbfgs(&o, params, 1, &lb) == FTC_ERR_INVALID_ARGUMENT && o == NULL &&
                strstr(ftc_last_error(), "max_eval must be at least 1") != NULL,
            "a negative LBFGS max_eval is an error, not the default");
    }
    ftc_tensor_delete(&p);
  }
  check(ftc_tensor_zero(t) == FTC_OK && data[5] == 0.0, "zeroing the tensor zeroes the C array");
  check(ftc_live_handles() == 1, "one live handle");
  /* Without a GPU every CUDA request fails; with one, a device index past the last GPU does. */
  status = ftc_tensor_new(&u, FTC_FILL_ONES, 2, shape, FTC_FLOAT32, FTC_CUDA,
                          ftc_device_available(FTC_CUDA, -1) ? 1000 : -1, 0);
  check(status == FTC_ERR_DEVICE && strstr(ftc_last_error(), "CUDA") != NULL,
        "an unavailable CUDA device fails with a message");
  check(u == NULL, "the output handle is untouched on failure");
  /* Host memory given as CUDA device memory: without a GPU the device is unavailable, with one
   * the address is not memory of it; either way a device error and no tensor. */
  status = ftc_tensor_from_device_blob(&u, data, 2, shape, NULL, NULL, FTC_FLOAT64, FTC_CUDA, -1, 0);
  check(status == FTC_ERR_DEVICE && u == NULL && strstr(ftc_last_error(), "CUDA") != NULL,
        "host memory given as CUDA memory to from_device_blob is a device error");
  status = ftc_tensor_from_device_blob(&u, NULL, 2, shape, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0);
  check(status == FTC_ERR_INVALID_ARGUMENT && u == NULL && strstr(ftc_last_error(), "null") != NULL,
        "from_device_blob of a null address with elements is an error");
  status = ftc_tensor_rank(NULL, &ndims);
  check(status == FTC_ERR_NULL_HANDLE, "a null handle is an error, not a crash");
  check(ftc_tensor_rank(t, &ndims) == FTC_OK && strcmp(ftc_last_error(), "") == 0,
        "success clears the last error");
  check(ftc_tensor_rank(t, NULL) == FTC_ERR_INVALID_ARGUMENT && strstr(ftc_last_error(), "rank") != NULL,
        "a null output pointer is an error naming it");
  check(ftc_tensor_shape(t, NULL, &ndims) == FTC_ERR_INVALID_ARGUMENT, "a null shape pointer is an error");
  {
    ftc_tensor inputs[1] = {t}, outputs[1] = {t};
    ftc_model m = NULL;
    check(ftc_model_forward(m, inputs, -1, outputs, 1, 0) == FTC_ERR_INVALID_ARGUMENT, "a negative input count is an error");
  }
  {
    ftc_tensor copy = t, r = NULL, s = NULL;
    ftc_tensor_delete(&t);
    check(ftc_tensor_rank(copy, &ndims) == FTC_ERR_NULL_HANDLE && strstr(ftc_last_error(), "stale") != NULL,
          "a copy of a deleted handle is stale: a clear error");
    ftc_tensor_delete(&copy);
    check(ftc_tensor_new(&r, FTC_FILL_ZEROS, 2, shape, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK &&
              ftc_tensor_new(&s, FTC_FILL_ONES, 2, shape, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK && r != s,
          "after a double delete, two new tensors get distinct handles");
    ftc_tensor_delete(&r);
    ftc_tensor_delete(&s);
    check(ftc_tensor_rank((ftc_tensor)(uintptr_t)0x123456789ULL, &ndims) == FTC_ERR_NULL_HANDLE,
          "a value that was never a handle is rejected");
  }
  {
    /* Write stamps: Fortran's elemental = stamps the handle it writes; an older copy of it names
     * the same tensor everywhere except as the right-hand side of that =. */
    ftc_tensor a = NULL, b = NULL, c = NULL, old;
    double av[6] = {0}, bv[6] = {7, 7, 7, 7, 7, 7};
    int64_t before = ftc_live_handles();
    ftc_tensor_from_blob(&a, av, 2, shape, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0);
    ftc_tensor_from_blob(&b, bv, 2, shape, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0);
    old = a;
    check(ftc_tensor_assign_element(&a, b) == FTC_OK && a != old && av[3] == 7.0,
          "= as a Fortran element writes into the lhs and gives it a new stamp");
    check(ftc_tensor_rank(old, &ndims) == FTC_OK && ndims == 2, "an older copy still names the tensor");
    status = ftc_tensor_assign_element(&c, old);
    check(status == FTC_ERR_NULL_HANDLE && c == NULL && strstr(ftc_last_error(), "stale copy") != NULL &&
              strstr(ftc_last_error(), "torch_assign") != NULL,
          "an older copy as the rhs of an element = is refused, naming torch_assign");
    check(ftc_tensor_assign(&c, old) == FTC_OK && c != NULL, "C's assign ignores stamps");
    check(ftc_tensor_assign_element(&b, a) == FTC_OK && ftc_tensor_assign_element(&a, a) == FTC_OK,
          "the current handle is accepted (also t = t)");
    ftc_tensor_delete(&old);
    check(ftc_tensor_rank(a, &ndims) == FTC_ERR_NULL_HANDLE, "deleting through an older copy deletes the tensor");
    ftc_tensor_delete(&a);
    ftc_tensor_delete(&b);
    ftc_tensor_delete(&c);
    check(ftc_live_handles() == before, "no handle left by the stamp checks");
  }
  {
    ftc_tensor a = NULL, tmp = NULL, out = NULL;
    int64_t before;
    ftc_tensor_new(&a, FTC_FILL_ONES, 2, shape, FTC_FLOAT64, FTC_CPU, -1, 0);
    before = ftc_live_handles();
    check(ftc_tensor_unary(FTC_EXP, a, FTC_TEMPORARY, &tmp) == FTC_OK && ftc_live_handles() == before + 1,
          "a temporary result is a live handle");
    check(ftc_tensor_binary(FTC_ADD, tmp, a, FTC_NAMED, &out) == FTC_OK && ftc_live_handles() == before + 1,
          "the first call that reads a temporary releases it");
    check(ftc_tensor_rank(tmp, &ndims) == FTC_ERR_NULL_HANDLE, "a released temporary is stale");
    ftc_tensor_unary(FTC_EXP, a, FTC_TEMPORARY, &tmp);
    check(ftc_tensor_binary(FTC_ADD, NULL, tmp, FTC_NAMED, &out) == FTC_ERR_NULL_HANDLE &&
              ftc_live_handles() == before + 1,
          "a temporary is released even when the call reading it fails");
    ftc_tensor_delete(&out);
    ftc_tensor_delete(&a);
  }
  {
    /* Custom function from C: begin, forward by hand, finish; backward through the callback. */
    ftc_tensor x = NULL, fin[1] = {NULL}, outs[1] = {NULL}, loss = NULL, g = NULL;
    ftc_function_ctx ctx = NULL;
    int64_t id = 0, one[1] = {3};
    double gv[3] = {0, 0, 0};
    int status;
    ftc_tensor_new(&x, FTC_FILL_ONES, 1, one, FTC_FLOAT64, FTC_CPU, -1, 1);
    check(ftc_function_define("triple", 6, triple_backward, NULL, 0, &id) == FTC_OK && id > 0, "C: define");
    check(ftc_function_begin(id, &x, 1, &ctx, fin) == FTC_OK && fin[0] != NULL, "C: begin");
    ftc_tensor_binary_scalar(FTC_MUL, fin[0], 3, 3.0, 1, 0, FTC_NAMED, &outs[0]);
    check(ftc_function_finish(ctx, outs, 1) == FTC_OK, "C: finish");
    check(ftc_function_finish(ctx, outs, 1) == FTC_ERR_NULL_HANDLE, "C: a context is single-use");
    ftc_tensor_reduce(FTC_SUM, outs[0], 0, NULL, 0, FTC_NAMED, &loss);
    check(ftc_tensor_backward(loss, NULL, 1) == FTC_OK && ftc_tensor_get_gradient(x, &g) == FTC_OK &&
              ftc_tensor_copy_to_blob(g, gv, FTC_FLOAT64, 1, one) == FTC_OK && gv[0] == 3.0 && gv[2] == 3.0,
          "C: backward through the callback");
    miscount = 1;
    status = ftc_tensor_backward(loss, NULL, 1);
    check(status != FTC_OK && strstr(ftc_last_error(), "returned 2 gradients") != NULL &&
              strstr(ftc_last_error(), "'triple'") != NULL,
          "C: too many gradients is an error naming the function");
    miscount = -1;
    status = ftc_tensor_backward(loss, NULL, 1);
    check(status != FTC_OK && strstr(ftc_last_error(), "returned 0 gradients") != NULL,
          "C: too few gradients is an error naming the function");
    miscount = 0;
    ftc_tensor_delete(&x);
    ftc_tensor_delete(&outs[0]);
    ftc_tensor_delete(&loss);
    ftc_tensor_delete(&g);
  }
  {
    /* Distributed C API over caller-provided collectives (one rank, no MPI). */
    ftc_comm comm = NULL, bad = NULL;
    ftc_tensor v = NULL, gathered = NULL;
    int64_t three[1] = {3}, count = 0;
    double values[3] = {1, 2, 3}, out[3] = {0, 0, 0};
    int rank = -1, size = -1;
    check(ftc_comm_new(&bad, 7, 1, 1, 0, one_allreduce, one_broadcast, one_allgather, one_barrier, NULL, NULL, one_free) ==
                  FTC_ERR_INVALID_ARGUMENT &&
              freed == 7 && bad == NULL,
          "C: a rank outside the communicator is refused (and the caller's communicator freed)");
    check(ftc_comm_new(&comm, 1, 0, 1, 0, one_allreduce, one_broadcast, one_allgather, one_barrier, NULL, NULL, one_free) ==
              FTC_OK,
          "C: communicator over caller-provided collectives");
    check(ftc_comm_rank(comm, &rank) == FTC_OK && ftc_comm_size(comm, &size) == FTC_OK && rank == 0 && size == 1,
          "C: rank and size");
    ftc_tensor_from_blob(&v, values, 1, three, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0);
    check(ftc_allreduce(comm, v, FTC_OP_MEAN) == FTC_OK && values[0] == 1 && values[2] == 3,
          "C: mean over one rank leaves the values");
    check(ftc_comm_collective_count(comm, &count) == FTC_OK && count == 2,
          "C: an allreduce is one agreement gather plus one reduction");
    check(ftc_allgather(comm, &gathered, v) == FTC_OK && ftc_tensor_copy_to_blob(gathered, out, FTC_FLOAT64, 1, three) ==
              FTC_OK && out[1] == 2,
          "C: allgather over one rank");
    fail_collectives = 1;
    check(ftc_barrier(comm) == FTC_ERR_DISTRIBUTED && strstr(ftc_last_error(), "fake failure") != NULL &&
              strstr(ftc_last_error(), "barrier failed on rank 0") != NULL,
          "C: a failing collective is FTC_ERR_DISTRIBUTED with the caller's message");
    fail_collectives = 0;
    check(ftc_allreduce(comm, v, 42) == FTC_ERR_INVALID_ARGUMENT &&
              strstr(ftc_last_error(), "unknown reduction 42 (one of: torch_kReduceSum (0), torch_kReduceMean (1), "
                                       "torch_kReduceMax (2), torch_kReduceMin (3))") != NULL,
          "C: an unknown reduction is refused, the accepted names listed from the enumerator table");
    {
      ftc_model shared = NULL;
      check(ftc_model_load_shared(&shared, comm, "no_such_model.pt", FTC_CPU, -1, 0, 0) == FTC_ERR_INVALID_ARGUMENT &&
                strstr(ftc_last_error(), "without gatherv/scatterv") != NULL && shared == NULL,
            "C: a node-shared model needs a communicator with gatherv and scatterv");
    }
    ftc_tensor_delete(&v);
    ftc_tensor_delete(&gathered);
    freed = 0;
    ftc_comm_delete(&comm);
    check(comm == NULL && freed == 1, "C: the last handle frees the caller's communicator once");
  }
  ftc_tensor_delete(&t);
  check(t == NULL && ftc_live_handles() == 0, "delete nulls the handle and is idempotent");

  /* Argument lists and embedded Python from C: math.fsum over a list of reals, and a tensor
   * handed to Python without a copy (operator.neg returns a new tensor). */
  {
    ftc_arglist args = NULL, results = NULL, inner = NULL;
    ftc_pymodule m = NULL, op = NULL;
    ftc_tensor x = NULL, y = NULL;
    double values[3] = {0.5, 1.25, 2.0}, sum = 0, got[3] = {0, 0, 0};
    int64_t n = 0, three = 3;
    int kind = -1;
    check(ftc_python_loaded() == 0, "Python is not loaded before it is used");
    check(ftc_arglist_add_real(&inner, 0.5) == FTC_OK && ftc_arglist_add_real(&inner, 1.25) == FTC_OK &&
              ftc_arglist_add_real(&inner, 2.0) == FTC_OK && ftc_arglist_size(inner, &n) == FTC_OK && n == 3,
          "an argument list of reals");
    check(ftc_pymodule_load(&m, "statistics") == FTC_OK && ftc_python_loaded() == 1, "load a module by name");
    check(ftc_arglist_add_real(&args, 1.0) == FTC_OK && ftc_arglist_add_real(&args, 3.0) == FTC_OK, "two reals");
    check(ftc_pymodule_call(m, "mean", args, NULL, NULL, 0) == FTC_ERR_PYTHON &&
              strstr(ftc_last_error(), "TypeError") != NULL, "a Python exception is FTC_ERR_PYTHON with its type");
    check(ftc_pymodule_load(&op, "operator") == FTC_OK, "load operator");
    check(ftc_pymodule_call_grouped(op, "add", args, -2, NULL, NULL, 0) == FTC_ERR_INVALID_ARGUMENT,
          "a group of -2 arguments is an error");
    {
      char small[4] = "xyz", paths[8192];
      check(ftc_python_locate(small, 4) == FTC_ERR_INVALID_ARGUMENT && strstr(ftc_last_error(), "too small") != NULL &&
                strcmp(small, "xyz") == 0,
            "python_locate into a buffer too small is an error, not cut-off paths");
      check(ftc_python_locate(paths, (int64_t)sizeof paths) == FTC_OK && strchr(paths, '\n') != NULL,
            "python_locate into a large buffer");
    }
    check(ftc_pymodule_call(op, "add", args, &results, NULL, 0) == FTC_OK &&
              ftc_arglist_get_real(results, 0, &sum) == FTC_OK && sum == 4.0, "operator.add(1.0, 3.0) = 4.0");
    check(ftc_arglist_kind(results, 0, &kind) == FTC_OK && kind == FTC_ARG_REAL, "the result is a real");
    check(ftc_tensor_from_blob(&x, values, 1, &three, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK &&
              ftc_tensor_from_blob(&y, got, 1, &three, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK,
          "two tensors over C arrays");
    check(ftc_arglist_clear(args) == FTC_OK && ftc_arglist_add_tensor(&args, x) == FTC_OK &&
              ftc_pymodule_call(op, "neg", args, NULL, &y, 1) == FTC_OK && got[0] == -0.5 && got[2] == -2.0,
          "operator.neg(tensor) written into the output's C array");
    check(ftc_arglist_delete(&args) == FTC_OK && ftc_arglist_delete(&results) == FTC_OK &&
              ftc_arglist_delete(&inner) == FTC_OK && ftc_pymodule_delete(&m) == FTC_OK &&
              ftc_pymodule_delete(&op) == FTC_OK && ftc_tensor_delete(&x) == FTC_OK && ftc_tensor_delete(&y) == FTC_OK &&
              ftc_live_handles() == 0,
          "no live handles after the Python calls");
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
