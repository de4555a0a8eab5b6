// captured_call.cpp - work warmed up, captured once as a CUDA graph and replayed (captured_call.hpp).
#include "internal.hpp"

#include "captured_call.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifdef FTORCH_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ftc {

int64_t warmup_steps() {
  return std::max<int64_t>(3, static_cast<int64_t>(torch::jit::getNumProfiledRuns().load()) + 2);
}

bool eager_graphs() {
  const char *v = std::getenv("FTORCH_CUDA_GRAPHS");
  return v != nullptr && std::strcmp(v, "eager") == 0;
}

bool cuda_graphs_built() {
#ifdef FTORCH_WITH_CUDA
  return true;
#else
  return false;
#endif
}

struct CapturedCallState {
  std::vector<int64_t> key;         // what the capture depends on: another key starts over
  int64_t calls = 0;                // calls with this key
  std::vector<at::Tensor> statics;  // the arguments' copies, at the addresses the capture reads
  std::vector<at::Tensor> results;  // what the capture wrote
  std::string error;                // why capturing this key failed
#ifdef FTORCH_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> side;  // warm-up and capture: one stream for both
#endif
};

namespace {

std::vector<int64_t> key_of(const std::vector<at::Tensor> &args, const c10::Device &device, int64_t mode) {
  std::vector<int64_t> key{mode, static_cast<int64_t>(device.type()), device.index(),
                           static_cast<int64_t>(args.size())};
  for (const auto &a : args) {
    key.push_back(static_cast<int64_t>(a.scalar_type()));
    key.push_back(a.dim());
    key.insert(key.end(), a.sizes().begin(), a.sizes().end());
  }
  return key;
}

// The arguments' values into the tensors the work reads (made on the first call of a key).
void copy_into_statics(CapturedCallState &s, const std::vector<at::Tensor> &args, const c10::Device &device) {
  if (s.statics.empty()) {
    for (const auto &a : args) s.statics.push_back(at::empty(a.sizes(), a.options().device(device)));
  }
  for (size_t i = 0; i < args.size(); ++i) s.statics[i].copy_(args[i]);
}

}  // namespace

#ifdef FTORCH_WITH_CUDA
void join(const c10::cuda::CUDAStream &from, const c10::cuda::CUDAStream &to) {
  at::cuda::CUDAEvent event;
  event.record(from);
  event.block(to);
}

std::unique_ptr<at::cuda::CUDAGraph> capture_graph(const std::function<void()> &body, const std::string &what,
                                                   std::string &error) {
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  try {
    graph->capture_begin();
  } catch (const std::exception &e) {
    // (the allocator may hold the graph already: kept, as below)
    static_cast<void>(graph.release());
    error = what + " cannot be captured as a CUDA graph: " + e.what();
    fail(FTC_ERR_TORCH, error);
  }
  auto abandon = [&](const std::string &reason) {
    try {
      graph->capture_end();
    } catch (...) {
      // The capture is invalid already; the first reason is the one to report.
    }
    static_cast<void>(graph.release());
    error = what + " cannot be captured as a CUDA graph: " + reason;
  };
  try {
    body();
  } catch (const Error &e) {
    abandon(e.what());
    throw;  // FTorch's own error (a parameter without state, say), as it is
  } catch (const std::exception &e) {
    abandon(e.what());
    fail(FTC_ERR_TORCH, error);
  }
  try {
    graph->capture_end();
  } catch (const std::exception &e) {
    static_cast<void>(graph.release());
    error = what + " cannot be captured as a CUDA graph (an operation of the model or loss synchronizes with the "
                   "host?): " + e.what();
    fail(FTC_ERR_TORCH, error);
  }
  return graph;
}
#endif

CapturedCall::CapturedCall() : s_(std::make_unique<CapturedCallState>()) {}
CapturedCall::~CapturedCall() = default;

void CapturedCall::reset() { s_ = std::make_unique<CapturedCallState>(); }

std::vector<at::Tensor> CapturedCall::run(const std::vector<at::Tensor> &args, const c10::Device &device,
                                          int64_t mode, const Work &work, bool *replayed) {
  *replayed = false;
  std::vector<int64_t> key = key_of(args, device, mode);
  if (key != s_->key) {
    s_ = std::make_unique<CapturedCallState>();  // releases a previous capture and its memory
    s_->key = std::move(key);
  }
  CapturedCallState &s = *s_;
  if (!s.error.empty()) fail(FTC_ERR_TORCH, s.error);
  const int64_t warmup = warmup_steps();
  if (eager_graphs() || !device.is_cuda()) {
    // What a replay does, run as it is: the work on the copies of the arguments.
    copy_into_statics(s, args, device);
    const bool stand_in = s.calls >= warmup;
    std::vector<at::Tensor> results = work(s.statics, stand_in);
    ++s.calls;
    *replayed = stand_in;
    return results;
  }
#ifdef FTORCH_WITH_CUDA
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
  if (!s.graph) {
    // Warm-up and capture on one side stream (a capture cannot use the default stream; per-stream
    // resources, cuBLAS's workspace say, are made during the warm-up), after the work already
    // queued on the caller's stream and before what it queues next.
    if (!s.side) s.side = c10::cuda::getStreamFromPool(false, device.index());
    const c10::cuda::CUDAStream side = *s.side;
    join(main, side);
    if (s.calls < warmup) {
      std::vector<at::Tensor> results;
      try {
        c10::cuda::CUDAStreamGuard on_side(side);
        copy_into_statics(s, args, device);
        results = work(s.statics, false);
      } catch (...) {
        join(side, main);
        throw;
      }
      join(side, main);
      ++s.calls;
      return results;
    }
    try {
      c10::cuda::CUDAStreamGuard on_side(side);
      s.graph = capture_graph([&] { s.results = work(s.statics, true); }, "the call", s.error);
    } catch (...) {
      join(side, main);
      throw;
    }
    join(side, main);
  }
  // The capture ran nothing: every call, the capturing one included, is a replay.
  copy_into_statics(s, args, device);
  s.graph->replay();
  ++s.calls;
  *replayed = true;
  return s.results;
#else
  fail(FTC_ERR_DEVICE, "CUDA graphs need a CUDA build of torch (this FTorch was built against " FTORCH_TORCH_VERSION
                       ")");
#endif
}

}  // namespace ftc
