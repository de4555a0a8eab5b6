// tools/torchfort_compare.cpp - one program, compiled once against TorchFort's own library and once
// against this package's torchfort.h (tools/compare_torchfort.sh): trains a configuration for 8 steps
// on fixed data through TorchFort's C API and prints the losses and the final inference output.
// Usage: torchfort_compare CONFIG float|double
#include <cstdio>
#include <cstring>
#include <vector>

#include "torchfort.h"

template <class T>
int run(const char *config, torchfort_datatype_t dtype) {
  const int batch = 6;
  std::vector<T> x(batch * 4), y(batch * 3), out(batch * 3);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < 4; ++i) x[b * 4 + i] = T(((i + 1) * 7 + (b + 1) * 3) % 11 - 5) / T(8);
    for (int j = 0; j < 3; ++j) y[b * 3 + j] = T(((j + 1) * 5 + (b + 1) * 2) % 7 - 3) / T(4);
  }
  int64_t xs[2] = {batch, 4}, ys[2] = {batch, 3};
  if (torchfort_set_manual_seed(1234) != TORCHFORT_RESULT_SUCCESS) return 1;
  if (torchfort_create_model("m", config, TORCHFORT_DEVICE_CPU) != TORCHFORT_RESULT_SUCCESS) return 2;
  for (int step = 0; step < 8; ++step) {
    T loss = 0;
    if (torchfort_train("m", x.data(), 2, xs, y.data(), 2, ys, &loss, dtype, nullptr) != TORCHFORT_RESULT_SUCCESS)
      return 3;
    std::printf("%.17e\n", double(loss));
  }
  if (torchfort_inference("m", x.data(), 2, xs, out.data(), 2, ys, dtype, nullptr) != TORCHFORT_RESULT_SUCCESS)
    return 4;
  for (T v : out) std::printf("%.17e\n", double(v));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return 9;
  return std::strcmp(argv[2], "double") == 0 ? run<double>(argv[1], TORCHFORT_DOUBLE)
                                             : run<float>(argv[1], TORCHFORT_FLOAT);
}
