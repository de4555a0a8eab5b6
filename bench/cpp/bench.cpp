// Benchmark, C++ side: the same work as bench_fortran, calling LibTorch directly (the floor).
// Same command line and output as bench_fortran.
#include <torch/script.h>
#include <torch/torch.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

long status_kib(const std::string &key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(key.size()));
  }
  return -1;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void model_case(const std::string &mode, const std::string &path, int batch, int n_in, int n_out, int iters) {
  // Fortran arrays are column-major: the inputs the Fortran program passes have strides [1, batch].
  std::vector<double> x(static_cast<size_t>(batch) * n_in), y(static_cast<size_t>(batch) * n_out),
      pred(static_cast<size_t>(batch) * n_out);
  for (auto &v : x) v = static_cast<double>(std::rand()) / RAND_MAX;
  for (auto &v : y) v = static_cast<double>(std::rand()) / RAND_MAX;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor tx = torch::from_blob(x.data(), {batch, n_in}, {1, batch}, opts);
  torch::Tensor ty = torch::from_blob(y.data(), {batch, n_out}, {1, batch}, opts);
  torch::Tensor tp = torch::from_blob(pred.data(), {batch, n_out}, {1, batch}, opts);
  torch::jit::Module model = torch::jit::load(path);
  if (mode == "infer") model.eval(); else model.train();
  std::vector<torch::Tensor> params;
  for (const auto &p : model.parameters()) params.push_back(p);
  torch::optim::Adam optim(params, torch::optim::AdamOptions(1e-4));
  // (LibTorch's defaults, as a C++ user runs TorchScript: the profiling executor with its graph
  // optimizations. FTorch runs without them by default, for bit-reproducible resumes: the
  // ratio to this program is the cost of that default.)
  const int warm = std::max(10, iters / 10);
  Clock::time_point t0;
  for (int i = 1; i <= warm + iters; ++i) {
    if (i == warm + 1) t0 = Clock::now();
    if (mode == "infer") {
      torch::NoGradGuard no_grad;
      tp.copy_(model.forward({tx}).toTensor());
    } else {
      optim.zero_grad();
      torch::Tensor out = model.forward({tx}).toTensor();
      torch::Tensor loss = torch::mse_loss(out, ty);
      loss.backward();
      optim.step();
      volatile double value = loss.item<double>();
      (void)value;
    }
    if (mode == "rss" && i == warm + 1000) std::printf("rss_at_1000 %ld\n", status_kib("VmRSS:"));
  }
  std::printf("seconds %.8e\n", seconds_since(t0));
  if (mode == "rss") std::printf("rss_at_end %ld\n", status_kib("VmRSS:"));
}

// An AOTInductor package (.pt2) run as a C++ user runs one: the package loader, inputs made
// contiguous (the compiled code expects the exported layout), the result copied into the output.
void compiled_case(const std::string &path, int batch, int n_in, int n_out, int iters) {
  std::vector<double> x(static_cast<size_t>(batch) * n_in), pred(static_cast<size_t>(batch) * n_out);
  for (auto &v : x) v = static_cast<double>(std::rand()) / RAND_MAX;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor tx = torch::from_blob(x.data(), {batch, n_in}, {1, batch}, opts);
  torch::Tensor tp = torch::from_blob(pred.data(), {batch, n_out}, {1, batch}, opts);
  torch::inductor::AOTIModelPackageLoader loader(path);
  const int warm = std::max(10, iters / 10);
  Clock::time_point t0;
  for (int i = 1; i <= warm + iters; ++i) {
    if (i == warm + 1) t0 = Clock::now();
    torch::NoGradGuard no_grad;
    tp.copy_(loader.run({tx.contiguous()})[0]);
  }
  std::printf("seconds %.8e\n", seconds_since(t0));
}

void ops_case(int n, int iters) {
  std::vector<double> a(n), b(n), c(n);
  for (auto &v : a) v = static_cast<double>(std::rand()) / RAND_MAX;
  for (auto &v : b) v = static_cast<double>(std::rand()) / RAND_MAX;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor ta = torch::from_blob(a.data(), {n}, opts), tb = torch::from_blob(b.data(), {n}, opts),
                tc = torch::from_blob(c.data(), {n}, opts);
  const int warm = std::max(10, iters / 10);
  Clock::time_point t0;
  for (int i = 1; i <= warm + iters; ++i) {
    if (i == warm + 1) t0 = Clock::now();
    tc.copy_(ta * tb + ta - tb / 2);  // the result lands in c's memory, as Fortran's c = ... does
  }
  std::printf("seconds %.8e\n", seconds_since(t0));
}

void from_array_case(int n, int iters) {
  std::vector<double> a(static_cast<size_t>(n), 1.0);
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const int warm = std::max(10, iters / 10);
  Clock::time_point t0;
  for (int i = 1; i <= warm + iters; ++i) {
    if (i == warm + 1) t0 = Clock::now();
    torch::Tensor t = torch::from_blob(a.data(), {n}, {1}, opts);
  }
  std::printf("seconds %.8e\n", seconds_since(t0));
}

// y = x*x as a custom function (torch::autograd::Function), as a C++ user writes one.
struct Square : public torch::autograd::Function<Square> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const auto x = ctx->get_saved_variables()[0];
    return {grads[0] * 2 * x};
  }
};

void autograd_case(bool custom, int n, int iters) {
  std::vector<double> a(static_cast<size_t>(n));
  for (auto &v : a) v = static_cast<double>(std::rand()) / RAND_MAX;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor x = torch::from_blob(a.data(), {n}, opts).requires_grad_(true);
  const int warm = std::max(10, iters / 10);
  Clock::time_point t0;
  for (int i = 1; i <= warm + iters; ++i) {
    if (i == warm + 1) t0 = Clock::now();
    torch::Tensor y = custom ? Square::apply(x) : x * x;
    y.sum().backward();
    x.mutable_grad().zero_();
  }
  std::printf("seconds %.8e\n", seconds_since(t0));
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "train" || mode == "infer" || mode == "rss" || mode == "idiom") {
    // (idiom: FTorch's explicit step from Fortran is the same work as a C++ user's training step)
    model_case(mode == "idiom" ? "train" : mode, argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]));
  } else if (mode == "compiled") {
    compiled_case(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]));
  } else if (mode == "ops") {
    ops_case(std::stoi(argv[2]), std::stoi(argv[3]));
  } else if (mode == "from_array") {
    from_array_case(std::stoi(argv[2]), std::stoi(argv[3]));
  } else if (mode == "custom" || mode == "builtin") {
    autograd_case(mode == "custom", std::stoi(argv[2]), std::stoi(argv[3]));
  } else {
    return 2;
  }
  std::printf("peak_rss_kib %ld\n", status_kib("VmHWM:"));
  return 0;
}
