/* Device paths of the C API, on the device named on the command line:
 *
 *   device_paths <cpu|cuda> <dir>
 *
 * <dir> holds what the test wrote with torch: mlp.pt (a float64 TorchScript MLP, 4 -> 8 -> 3,
 * Linear/tanh/Linear) and mlp_io.txt ("N NIN NOUT", then N*NIN inputs and N*NOUT outputs of the
 * model, row-major, as computed by torch in Python). The program writes its checkpoint there.
 *
 * Tensors made on the device, memory wrapped without a copy, a model on the device against the
 * same model on the CPU, training steps on the device, and a checkpoint written on the device read
 * into a model on the CPU. With "cpu" every path runs on the CPU (the program's own logic is
 * checked on any machine); with "cuda" it is the GPU check. Prints one "ok   ..." / "FAIL ..." line
 * per check and "N passed, M failed"; the exit status is non-zero when a check failed.
 *
 * Everything is float64: no TF32 or reduced-precision GPU matmul path applies, so the only
 * CPU/GPU differences are the rounding of differently ordered sums (see TOL below). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ftorch_c.h"

#define MAXN 64
#define NIN 4
#define NOUT 3

static int passed = 0, failed = 0, number = 0;

static int check(int ok, const char *name) {
  ++number;
  if (ok) {
    ++passed;
    printf("ok   %2d. %s\n", number, name);
  } else {
    ++failed;
    printf("FAIL %2d. %s\n", number, name);
    if (strcmp(ftc_last_error(), "") != 0) printf("       last error: %s\n", ftc_last_error());
  }
  fflush(stdout);
  return ok;
}

/* Largest |a - b| / (1 + |b|) over n values (relative for large values, absolute near zero). */
static double max_diff(const double *a, const double *b, int64_t n) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = fabs(a[i] - b[i]) / (1.0 + fabs(b[i]));
    if (d > worst || d != d) worst = d != d ? INFINITY : d;
  }
  return worst;
}

static int all_equal_to(const double *a, int64_t n, double v) {
  for (int64_t i = 0; i < n; ++i)
    if (a[i] != v) return 0;
  return 1;
}

/* 1 when tensor t lives on a device of type `dev` (index 0 for a GPU, -1 for the CPU). */
static int on_device(ftc_tensor t, int dev) {
  int type = -99, index = -99;
  if (ftc_tensor_device(t, &type, &index) != FTC_OK) return 0;
  return type == dev && index == (dev == FTC_CPU ? -1 : 0);
}

static int64_t numel(ftc_tensor t) {
  const int64_t *sizes = NULL;
  int nd = 0;
  int64_t n = 1;
  if (ftc_tensor_shape(t, &sizes, &nd) != FTC_OK) return -1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  return n;
}

/* Copy a tensor of any device back to host memory (float64, its elements in column-major order). */
static int to_host(ftc_tensor t, double *buf) {
  const int64_t *sizes = NULL;
  int nd = 0;
  if (ftc_tensor_shape(t, &sizes, &nd) != FTC_OK) return FTC_ERR_INVALID_ARGUMENT;
  return ftc_tensor_copy_to_blob(t, buf, FTC_FLOAT64, nd, sizes);
}

/* Host values into a new LibTorch-owned tensor on `dev` (host -> device copy through copy_into).
 * The values are read row-major when row_major is set, column-major otherwise. */
static int new_on(ftc_tensor *out, double *values, int ndims, const int64_t *shape, int dev, int row_major) {
  static const int32_t rows[2] = {2, 1};
  ftc_tensor host = NULL;
  int status = ftc_tensor_from_blob(&host, values, ndims, shape, row_major ? rows : NULL, NULL, FTC_FLOAT64,
                                    FTC_CPU, -1, 0);
  if (status == FTC_OK) status = ftc_tensor_new(out, FTC_FILL_EMPTY, ndims, shape, FTC_FLOAT64, dev, -1, 0);
  if (status == FTC_OK) status = ftc_tensor_copy_into(host, *out, 0);
  ftc_tensor_delete(&host);
  return status;
}

/* The parameters of a model as new handles (*n of them), and all their values on the host. */
static int params_of(ftc_model m, ftc_tensor *params, int64_t *n, double *values, int64_t *nvalues) {
  int status = ftc_model_parameter_count(m, n);
  if (status != FTC_OK || *n > 16) return status != FTC_OK ? status : FTC_ERR_INVALID_ARGUMENT;
  for (int64_t i = 0; i < *n; ++i) params[i] = NULL;
  status = ftc_model_parameters(m, params, *n);
  *nvalues = 0;
  for (int64_t i = 0; status == FTC_OK && i < *n; ++i) {
    status = to_host(params[i], values + *nvalues);
    *nvalues += numel(params[i]);
  }
  return status;
}

static void delete_all(ftc_tensor *t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) ftc_tensor_delete(&t[i]);
}

int main(int argc, char **argv) {
  char model_file[4096], io_file[4096], ckpt_file[4096], name[256];
  int dev;
  if (argc != 3 || (strcmp(argv[1], "cpu") != 0 && strcmp(argv[1], "cuda") != 0)) {
    fprintf(stderr, "usage: device_paths <cpu|cuda> <dir>\n");
    return 2;
  }
  dev = strcmp(argv[1], "cpu") == 0 ? FTC_CPU : FTC_CUDA;
  snprintf(model_file, sizeof model_file, "%s/mlp.pt", argv[2]);
  snprintf(io_file, sizeof io_file, "%s/mlp_io.txt", argv[2]);
  snprintf(ckpt_file, sizeof ckpt_file, "%s/checkpoint_%s.pt", argv[2], argv[1]);
  if (!ftc_device_available(dev, -1)) {
    fprintf(stderr, "device_paths: no %s device is available here\n", argv[1]);
    return 2;
  }
  /* Tolerance of device results against CPU results. On the CPU both sides run the same kernels
   * on identically shaped, LibTorch-allocated (equally aligned) inputs, so they are bit for bit
   * equal: 0. On a GPU, cuBLAS and CUDA's tanh round differently from the CPU's BLAS and libm:
   * float64 dot products of length <= 8 over O(1) values differ by a few ulps (~1e-16 relative),
   * which 1e-12 bounds with a wide margin while still catching any real error. */
  const double TOL = dev == FTC_CPU ? 0.0 : 1e-12;
  const int64_t baseline = ftc_live_handles();
  printf("device_paths on %s (live handles at start: %lld)\n", argv[1], (long long)baseline);

  /* ---------------------------------------------------------------- tensors made on the device */
  {
    ftc_tensor t = NULL, z = NULL, back = NULL;
    int64_t shape[2] = {2, 3};
    double got[6] = {0}, vals[6] = {1.5, -2.0, 3.25, 0.0, 1e-3, -7.0};
    float got32[6] = {0};
    int dtype = -1;
    check(ftc_tensor_new(&t, FTC_FILL_ONES, 2, shape, FTC_FLOAT64, dev, -1, 0) == FTC_OK,
          "ftc_tensor_new: a tensor of ones on the device");
    check(on_device(t, dev), "ftc_tensor_device reports the device (and index) it was made on");
    check(to_host(t, got) == FTC_OK && all_equal_to(got, 6, 1.0),
          "its values copied back to host memory (copy_to_blob) are all 1");
    /* host -> device (copy_into a device tensor) -> host (copy_into a CPU tensor, then read). */
    check(new_on(&z, vals, 2, shape, dev, 0) == FTC_OK && on_device(z, dev) &&
              ftc_tensor_new(&back, FTC_FILL_ZEROS, 2, shape, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK &&
              ftc_tensor_copy_into(z, back, 0) == FTC_OK && on_device(back, FTC_CPU) && to_host(back, got) == FTC_OK &&
              memcmp(got, vals, sizeof vals) == 0,
          "values copied host -> device -> host (copy_into both ways) come back bit for bit");
    check(ftc_tensor_copy_to_blob(z, got32, FTC_FLOAT32, 2, shape) == FTC_OK && got32[0] == 1.5f &&
              got32[2] == 3.25f && got32[5] == -7.0f && got32[4] == (float)1e-3 && ftc_tensor_dtype(z, &dtype) == FTC_OK &&
              dtype == FTC_FLOAT64,
          "copy_to_blob converts the device tensor to float32 host memory, the tensor stays float64");
    ftc_tensor_delete(&t);
    ftc_tensor_delete(&z);
    ftc_tensor_delete(&back);
  }

  /* ---------------------------------------------------------------- memory wrapped without a copy */
  {
    ftc_tensor owner = NULL, alias = NULL, wrap = NULL, bad = NULL;
    /* the views want column-major memory and ftc_tensor_new makes row-major tensors: rank 1. */
    int64_t shape[2] = {2, 3}, flat[1] = {6}, vshape[1] = {0};
    double got[6] = {0};
    void *ptr = NULL, *ptr2 = NULL, *cpu_ptr = NULL;
    double *a = malloc(6 * sizeof(double));
    for (int i = 0; i < 6; ++i) a[i] = i + 1;
    /* Memory LibTorch allocated on the device (device memory for a GPU), wrapped by a second tensor. */
    check(ftc_tensor_new(&owner, FTC_FILL_ONES, 1, flat, FTC_FLOAT64, dev, -1, 0) == FTC_OK &&
              ftc_tensor_device_view(owner, FTC_FLOAT64, 1, vshape, &ptr) == FTC_OK && ptr != NULL && vshape[0] == 6,
          "ftc_tensor_device_view gives the address of the device tensor's memory");
    check(ftc_tensor_from_device_blob(&alias, ptr, 1, flat, NULL, NULL, FTC_FLOAT64, dev, -1, 0) == FTC_OK &&
              on_device(alias, dev) && ftc_tensor_device_view(alias, FTC_FLOAT64, 1, vshape, &ptr2) == FTC_OK &&
              ptr2 == ptr,
          "ftc_tensor_from_device_blob over that address: a second tensor on the same memory (same address)");
    check(ftc_tensor_fill(alias, 0, 7.5, 0) == FTC_OK && to_host(owner, got) == FTC_OK && all_equal_to(got, 6, 7.5),
          "a fill through the wrapper is seen through the owner (no copy was made)");
    check(ftc_tensor_zero(owner) == FTC_OK && to_host(alias, got) == FTC_OK && all_equal_to(got, 6, 0.0),
          "zeroing the owner is seen through the wrapper");
    if (dev == FTC_CPU) {
      check(ftc_tensor_data_view(owner, FTC_FLOAT64, 1, vshape, &cpu_ptr) == FTC_OK && cpu_ptr == ptr,
            "on the CPU, ftc_tensor_data_view gives the same address");
      /* Caller-owned (malloc) memory, written directly from C. */
      check(ftc_tensor_from_blob(&wrap, a, 2, shape, NULL, NULL, FTC_FLOAT64, dev, -1, 0) == FTC_OK &&
                on_device(wrap, dev),
            "ftc_tensor_from_blob over a malloc'd C array");
      a[4] = 42.0;
      check(to_host(wrap, got) == FTC_OK && got[4] == 42.0 && got[0] == 1.0,
            "a store into the C array is seen through the tensor (no copy was made)");
      check(ftc_tensor_zero(wrap) == FTC_OK && all_equal_to(a, 6, 0.0), "zeroing the tensor zeroes the C array");
    } else {
      check(ftc_tensor_data_view(owner, FTC_FLOAT64, 1, vshape, &cpu_ptr) == FTC_ERR_DEVICE && cpu_ptr == NULL,
            "ftc_tensor_data_view (host views) refuses a device tensor with FTC_ERR_DEVICE");
      check(ftc_tensor_from_device_blob(&bad, a, 2, shape, NULL, NULL, FTC_FLOAT64, dev, -1, 0) == FTC_ERR_DEVICE &&
                bad == NULL,
            "host memory given as device memory: FTC_ERR_DEVICE, no tensor");
      /* ftc_tensor_from_blob reads host memory and copies it to the device. */
      check(ftc_tensor_from_blob(&wrap, a, 2, shape, NULL, NULL, FTC_FLOAT64, dev, -1, 0) == FTC_OK &&
                on_device(wrap, dev) && to_host(wrap, got) == FTC_OK && memcmp(got, a, 6 * sizeof(double)) == 0,
            "ftc_tensor_from_blob of host memory for the device: a device tensor with those values");
      a[2] = 99.0;
      check(to_host(wrap, got) == FTC_OK && got[2] == 3.0 && ftc_tensor_zero(wrap) == FTC_OK && a[0] == 1.0,
            "that device tensor is a copy: C stores and tensor writes do not cross");
    }
    ftc_tensor_delete(&wrap);
    ftc_tensor_delete(&alias);
    ftc_tensor_delete(&owner);
    free(a);
  }

  /* ---------------------------------------------------------------- a model on the device */
  int n = 0, nin = 0, nout = 0;
  double xin[MAXN * NIN], yref[MAXN * NOUT], target[MAXN * NOUT];
  {
    FILE *f = fopen(io_file, "r");
    int ok = f != NULL && fscanf(f, "%d %d %d", &n, &nin, &nout) == 3 && n > 0 && n <= MAXN && nin == NIN &&
             nout == NOUT;
    for (int i = 0; ok && i < n * NIN; ++i) ok = fscanf(f, "%lf", &xin[i]) == 1;
    for (int i = 0; ok && i < n * NOUT; ++i) ok = fscanf(f, "%lf", &yref[i]) == 1;
    if (f != NULL) fclose(f);
    if (!check(ok, "the reference inputs and outputs written by torch are read")) {
      printf("%d passed, %d failed\n", passed, failed);
      return 1;
    }
    /* A target the model can move towards (row-major like the rest). */
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < NOUT; ++k) target[i * NOUT + k] = 0.25 * sin(1.0 + i + 2.0 * k);
  }
  const int64_t xshape[2] = {n, NIN}, yshape[2] = {n, NOUT};
  ftc_model mdev = NULL, mcpu = NULL;
  ftc_tensor xdev = NULL, ydev = NULL, xcpu = NULL, ycpu = NULL, tdev = NULL, tcpu = NULL;
  double ygpu_host[MAXN * NOUT], ycpu_host[MAXN * NOUT], yref_cm[MAXN * NOUT];
  /* mlp_io.txt is row-major; to_host gives column-major: element (i, k) at i + n*k. */
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < NOUT; ++k) yref_cm[i + n * k] = yref[i * NOUT + k];
  {
    ftc_tensor p0 = NULL;
    check(ftc_model_load(&mdev, model_file, dev, -1, 0, 1) == FTC_OK && mdev != NULL,
          "ftc_model_load onto the device");
    check(ftc_model_parameter(mdev, NULL, 0, &p0) == FTC_OK && on_device(p0, dev),
          "the loaded model's parameters live on the device");
    ftc_tensor_delete(&p0);
    check(new_on(&xdev, xin, 2, xshape, dev, 1) == FTC_OK &&
              ftc_tensor_new(&ydev, FTC_FILL_ZEROS, 2, yshape, FTC_FLOAT64, dev, -1, 0) == FTC_OK &&
              ftc_model_forward(mdev, &xdev, 1, &ydev, 1, 0) == FTC_OK && on_device(ydev, dev),
          "forward on device tensors runs and leaves its result on the device");
    check(ftc_model_load(&mcpu, model_file, FTC_CPU, -1, 0, 1) == FTC_OK && new_on(&xcpu, xin, 2, xshape, FTC_CPU, 1) ==
              FTC_OK && ftc_tensor_new(&ycpu, FTC_FILL_ZEROS, 2, yshape, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK &&
              ftc_model_forward(mcpu, &xcpu, 1, &ycpu, 1, 0) == FTC_OK,
          "the same model on the CPU, same inputs");
    const int got = to_host(ydev, ygpu_host) == FTC_OK && to_host(ycpu, ycpu_host) == FTC_OK;
    const double d = got ? max_diff(ygpu_host, ycpu_host, n * NOUT) : INFINITY;
    snprintf(name, sizeof name, "device forward equals the CPU forward (max diff %.3g, tolerance %g)", d, TOL);
    check(got && d <= TOL, name);
    /* Against torch in Python (another process: its BLAS may split the work differently). */
    const double dref = got ? max_diff(ycpu_host, yref_cm, n * NOUT) : INFINITY;
    snprintf(name, sizeof name, "the CPU forward equals torch's in Python (max diff %.3g, tolerance 1e-12)", dref);
    check(dref <= 1e-12, name);
    /* FTorch's GPU idiom: model and inputs on the device, the output wrapping host memory. */
    {
      ftc_tensor yhost = NULL, back = NULL;
      double *ymem = calloc((size_t)(n * NOUT), sizeof(double));
      check(ymem != NULL && ftc_tensor_from_blob(&yhost, ymem, 2, yshape, NULL, NULL, FTC_FLOAT64, FTC_CPU, -1, 0) == FTC_OK &&
                ftc_model_forward(mdev, &xdev, 1, &yhost, 1, 0) == FTC_OK && on_device(yhost, FTC_CPU) &&
                max_diff(ymem, ygpu_host, n * NOUT) == 0.0,
            "forward of a device model writes its result into an output wrapping host memory (FTorch's idiom)");
      /* `=` across devices: the left-hand side keeps its device and memory and receives a copy. */
      check(ftc_tensor_new(&back, FTC_FILL_ZEROS, 2, yshape, FTC_FLOAT64, dev, -1, 0) == FTC_OK &&
                ftc_tensor_assign(&back, yhost) == FTC_OK && on_device(back, dev) && to_host(back, ygpu_host) == FTC_OK &&
                max_diff(ymem, ygpu_host, n * NOUT) == 0.0,
            "= from a host tensor into a device tensor copies onto the device");
      ftc_tensor_delete(&yhost);
      ftc_tensor_delete(&back);
      free(ymem);
    }
  }

  /* ---------------------------------------------------------------- training on the device */
  ftc_tensor pdev[16] = {NULL}, pcpu[16] = {NULL};
  int64_t np = 0, npc = 0, nv = 0, nvc = 0;
  double before[512], after[512], cpu_values[512];
  ftc_optim odev = NULL, ocpu = NULL;
  /* SGD: lr 0.05, momentum 0.5 (so the optimizer has state on the device for the checkpoint),
   * dampening 0, weight decay 0, no Nesterov. */
  ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  sgd.lr = 0.05;
  sgd.momentum = 0.5;
  {
    double loss[6] = {0};
    int steps_ok = 1, decreasing = 1, all_on_dev = 1;
    check(params_of(mdev, pdev, &np, before, &nv) == FTC_OK && np == 4 && nv <= 512,
          "ftc_model_parameters: 4 parameter tensors (2 weights, 2 biases), copied to the host");
    for (int64_t i = 0; i < np; ++i) all_on_dev = all_on_dev && on_device(pdev[i], dev);
    check(all_on_dev, "the parameter handles are on the device");
    check(ftc_optim_sgd(&odev, pdev, np, &sgd) == FTC_OK, "ftc_optim_sgd: SGD over them");
    check(new_on(&tdev, target, 2, yshape, dev, 1) == FTC_OK && on_device(tdev, dev), "a target on the device");
    for (int s = 0; s < 6; ++s) {
      steps_ok = steps_ok && ftc_train_step(mdev, odev, NULL, &xdev, 1, tdev, FTC_LOSS_MSE, FTC_REDUCTION_MEAN, 0.0,
                                            &loss[s], NULL) == FTC_OK;
      if (s > 0) decreasing = decreasing && loss[s] < loss[s - 1];
    }
    check(steps_ok, "six ftc_train_step calls (MSE, mean) on the device");
    snprintf(name, sizeof name, "the loss decreases at every step (%.6g -> %.6g)", loss[0], loss[5]);
    check(steps_ok && decreasing && isfinite(loss[5]), name);
    all_on_dev = 1;
    for (int64_t i = 0; i < np; ++i) all_on_dev = all_on_dev && on_device(pdev[i], dev);
    int64_t k = 0;
    int status = FTC_OK;
    for (int64_t i = 0; status == FTC_OK && i < np; ++i) {
      status = to_host(pdev[i], after + k);
      k += numel(pdev[i]);
    }
    check(status == FTC_OK && all_on_dev && max_diff(after, before, nv) > 1e-6,
          "the parameters changed, in place on the device (seen through the parameter handles)");
  }

  /* ---------------------------------------------------------------- checkpoint: device -> CPU */
  {
    int64_t step = -1;
    int all_cpu = 1;
    check(ftc_checkpoint_save(ckpt_file, mdev, odev, NULL, 6) == FTC_OK,
          "ftc_checkpoint_save of the device model and its optimizer");
    /* mcpu was loaded from the same file: it still holds the untrained values. */
    check(params_of(mcpu, pcpu, &npc, cpu_values, &nvc) == FTC_OK && npc == np && nvc == nv &&
              max_diff(cpu_values, after, nv) > 1e-6,
          "before loading, the CPU model's parameters differ from the trained ones");
    check(ftc_optim_sgd(&ocpu, pcpu, npc, &sgd) == FTC_OK, "an SGD optimizer on the CPU model");
    check(ftc_checkpoint_load(ckpt_file, mcpu, ocpu, NULL, &step) == FTC_OK && step == 6,
          "ftc_checkpoint_load into the model loaded on the CPU (and its optimizer)");
    int64_t k = 0;
    int status = FTC_OK;
    for (int64_t i = 0; status == FTC_OK && i < npc; ++i) {
      all_cpu = all_cpu && on_device(pcpu[i], FTC_CPU);
      status = to_host(pcpu[i], cpu_values + k);
      k += numel(pcpu[i]);
    }
    /* Saving and loading copy the values: bit for bit, whatever the devices. */
    check(status == FTC_OK && all_cpu && memcmp(cpu_values, after, (size_t)nv * sizeof(double)) == 0,
          "its parameters are now the device ones bit for bit, and stay on the CPU");
    /* One more step on each: equal only if the optimizer state (momentum buffers, written on the
     * device) was mapped onto the CPU too. Same tolerance as the forward (0 on the CPU). */
    double l1 = 0, l2 = 0;
    check(new_on(&tcpu, target, 2, yshape, FTC_CPU, 1) == FTC_OK &&
              ftc_train_step(mdev, odev, NULL, &xdev, 1, tdev, FTC_LOSS_MSE, FTC_REDUCTION_MEAN, 0.0, &l1, NULL) ==
                  FTC_OK &&
              ftc_train_step(mcpu, ocpu, NULL, &xcpu, 1, tcpu, FTC_LOSS_MSE, FTC_REDUCTION_MEAN, 0.0, &l2, NULL) ==
                  FTC_OK,
          "one more training step on each");
    k = 0;
    status = FTC_OK;
    for (int64_t i = 0; status == FTC_OK && i < np; ++i) {
      status = to_host(pdev[i], after + k) == FTC_OK ? to_host(pcpu[i], cpu_values + k) : FTC_ERR_INVALID_ARGUMENT;
      k += numel(pdev[i]);
    }
    const double d = status == FTC_OK ? max_diff(cpu_values, after, nv) : INFINITY;
    snprintf(name, sizeof name,
             "the restored momentum makes the CPU step the device step (max diff %.3g, tolerance %g)", d, TOL);
    check(d <= TOL && fabs(l1 - l2) <= TOL * (1.0 + fabs(l1)), name);
  }

  /* ---------------------------------------------------------------- cleanup */
  ftc_optim_delete(&odev);
  ftc_optim_delete(&ocpu);
  delete_all(pdev, np);
  delete_all(pcpu, npc);
  ftc_tensor_delete(&xdev);
  ftc_tensor_delete(&ydev);
  ftc_tensor_delete(&xcpu);
  ftc_tensor_delete(&ycpu);
  ftc_tensor_delete(&tdev);
  ftc_tensor_delete(&tcpu);
  ftc_model_delete(&mdev);
  ftc_model_delete(&mcpu);
  snprintf(name, sizeof name, "live handles back to the starting value (%lld now, %lld at start)",
           (long long)ftc_live_handles(), (long long)baseline);
  check(ftc_live_handles() == baseline, name);

  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
