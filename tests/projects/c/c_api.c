/* The C API from plain C: construction over caller memory, queries, statuses and messages. */
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

int main(void) {
  double data[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  ftc_tensor t = NULL, u = NULL;
  const int64_t *sizes = NULL;
  int ndims = 0, status;

  check(ftc_check_runtime() == FTC_OK, "runtime matches the build");
  check(strcmp(ftc_version(), "") != 0 && strcmp(ftc_torch_version_built(), "") != 0, "versions are reported");
  status = ftc_tensor_from_blob(&t, data, 2, shape, NULL, NULL, 7, 0, -1, 0);
  check(status == FTC_OK && t != NULL, "from_blob over a C array");
  check(ftc_tensor_shape(t, &sizes, &ndims) == FTC_OK && ndims == 2 && sizes[0] == 2 && sizes[1] == 3, "shape");
  check(ftc_tensor_zero(t) == FTC_OK && data[5] == 0.0, "zeroing the tensor zeroes the C array");
  check(ftc_live_handles() == 1, "one live handle");
  status = ftc_tensor_new(&u, FTC_FILL_ONES, 2, shape, 6, 1, -1, 0);
  check(status == FTC_ERR_DEVICE && strstr(ftc_last_error(), "CUDA") != NULL, "CUDA request fails with a message");
  check(u == NULL, "the output handle is untouched on failure");
  status = ftc_tensor_rank(NULL, &ndims);
  check(status == FTC_ERR_NULL_HANDLE, "a null handle is an error, not a crash");
  check(ftc_tensor_rank(t, &ndims) == FTC_OK && strcmp(ftc_last_error(), "") == 0,
        "success clears the last error");
  ftc_tensor_delete(&t);
  ftc_tensor_delete(&t);
  check(t == NULL && ftc_live_handles() == 0, "delete nulls the handle and is idempotent");
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
