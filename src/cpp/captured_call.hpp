// captured_call.hpp - work on a fixed set of tensors (a forward, or a forward, loss and backward)
// run eagerly for a few warm-up calls, then captured once as a CUDA graph on tensors of its own and
// replayed: each call copies its arguments into those tensors (from host or device memory alike,
// so the caller's arrays may move between calls) and launches the graph. TorchFort's
// enable_cuda_graphs (torchfort.cpp) goes through it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#ifdef FTORCH_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ftc {

// Eager calls before a capture: PyTorch's recipe warms up 3; TorchScript's profiling executor must
// also have settled (it optimizes forward after its profiled runs and backward one call later).
int64_t warmup_steps();

// FTORCH_CUDA_GRAPHS=eager: the work a graph would replay runs without being captured (any device),
// so that the CPU shows what a GPU does.
bool eager_graphs();

// Whether this FTorch can capture CUDA graphs (built against a CUDA torch with the CUDA runtime's
// headers).
bool cuda_graphs_built();

#ifdef FTORCH_WITH_CUDA
// Work queued on stream `from` before this point comes before what `to` queues next.
void join(const c10::cuda::CUDAStream &from, const c10::cuda::CUDAStream &to);

// body() captured as a CUDA graph on the current stream (not the default one). A capture that fails
// leaves its graph registered with LibTorch's allocator, which keeps a pointer to it: the graph
// object is then kept (never deleted), `error` says why ("<what> cannot be captured as a CUDA
// graph: ..."), so that later calls can fail at once with it, and the failure is thrown (FTorch's
// own errors as they are, LibTorch's as FTC_ERR_TORCH with that message).
std::unique_ptr<at::cuda::CUDAGraph> capture_graph(const std::function<void()> &body, const std::string &what,
                                                   std::string &error);
#endif

struct CapturedCallState;

class CapturedCall {
 public:
  // work(args, capturing) returns the call's results (tensors on the device). When capturing is
  // true it runs inside a capture (or, with FTORCH_CUDA_GRAPHS=eager, in a call a replay stands
  // for): it must not read values on the host (no item(), no data-dependent checks).
  using Work = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor> &args, bool capturing)>;

  CapturedCall();
  ~CapturedCall();
  CapturedCall(const CapturedCall &) = delete;
  CapturedCall &operator=(const CapturedCall &) = delete;

  // Runs work on args (all on `device`, or moved there): the first warmup_steps() calls with these
  // shapes, dtypes and `mode` eagerly (capturing=false), then one capture, then replays. Other
  // shapes, dtypes or mode start over (the old graph and its memory released). *replayed tells
  // whether the results came from the graph (or its eager stand-in): then they are the same tensors
  // at every call, to be read before the next one. A capture that fails is reported, and later
  // calls with the same key fail with the same reason.
  std::vector<at::Tensor> run(const std::vector<at::Tensor> &args, const c10::Device &device, int64_t mode,
                              const Work &work, bool *replayed);

  // Forgets the capture (and its memory): the next call warms up again. For when the tensors the
  // work reads by address, other than its arguments, were replaced (gradients loaded, say).
  void reset();

 private:
  std::unique_ptr<CapturedCallState> s_;
};

}  // namespace ftc
