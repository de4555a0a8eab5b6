// comm.hpp - a communicator over the caller’s collectives (ftorch_c_distributed.h), shared by the
// collectives (distributed.cpp), data parallelism (data_parallel.cpp), checkpoints of data-parallel
// runs (checkpoint.cpp) and node-shared models (node_shared.cpp).
#pragma once

#include <ATen/DeviceAccelerator.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "internal.hpp"
#include "ftorch_c_distributed.h"

namespace ftc {

struct Comm {
  int64_t ctx = 0;
  int rank = 0;
  int size = 1;
  bool device_aware = false;
  ftc_allreduce_fn allreduce_fn = nullptr;
  ftc_broadcast_fn broadcast_fn = nullptr;
  ftc_allgather_fn allgather_fn = nullptr;
  ftc_barrier_fn barrier_fn = nullptr;
  ftc_gatherv_fn gatherv_fn = nullptr;    // optional (node-shared models need them)
  ftc_scatterv_fn scatterv_fn = nullptr;
  ftc_comm_free_fn free_fn = nullptr;
  std::atomic<int64_t> calls{0};

  Comm() = default;
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;
  ~Comm() {
    if (free_fn != nullptr) free_fn(ctx);
  }

  // Every call of a caller's function goes through here: counted, its failure an Error.
  template <class Call>
  void call(const char *what, Call &&fn) {
    char msg[1024] = {0};
    ++calls;
    const int status = fn(msg, static_cast<int64_t>(sizeof(msg) - 1));
    if (status != 0) {
      msg[sizeof(msg) - 1] = '\0';
      fail(FTC_ERR_DISTRIBUTED, std::string(what) + " failed on rank " + std::to_string(rank) + ": " +
                                    (msg[0] != '\0' ? msg : "error " + std::to_string(status)));
    }
  }

  // Raw collectives on contiguous buffers; counts above INT32_MAX go in several calls.
  void allreduce(void *buf, int64_t count, int dtype, size_t elsize, int op) {
    for_chunks(buf, count, elsize, [&](char *p, int64_t n) {
      call("allreduce", [&](char *msg, int64_t len) { return allreduce_fn(ctx, p, n, dtype, op, msg, len); });
    });
  }
  void broadcast(void *buf, int64_t count, int dtype, size_t elsize, int root) {
    for_chunks(buf, count, elsize, [&](char *p, int64_t n) {
      call("broadcast", [&](char *msg, int64_t len) { return broadcast_fn(ctx, p, n, dtype, root, msg, len); });
    });
  }
  void allgather(const void *send, void *recv, int64_t count, int dtype, size_t elsize) {
    if (count > INT_MAX) fail(FTC_ERR_INVALID_ARGUMENT, "allgather of more than 2^31-1 elements per rank");
    if (count == 0) return;
    call("allgather", [&](char *msg, int64_t len) { return allgather_fn(ctx, send, recv, count, dtype, msg, len); });
  }
  // Rooted gather/scatter of different counts per rank (counts[r] elements of rank r, packed in
  // rank order at root); the total must fit MPI's int displacements.
  void gatherv(const void *send, int64_t count, void *recv, const std::vector<int64_t> &counts, int dtype, int root) {
    require_rooted("gatherv");
    require_int_total(counts, "gatherv");
    call("gatherv", [&](char *msg, int64_t len) {
      return gatherv_fn(ctx, send, count, recv, counts.data(), dtype, root, msg, len);
    });
  }
  void scatterv(const void *send, const std::vector<int64_t> &counts, void *recv, int64_t count, int dtype, int root) {
    require_rooted("scatterv");
    require_int_total(counts, "scatterv");
    call("scatterv", [&](char *msg, int64_t len) {
      return scatterv_fn(ctx, send, counts.data(), recv, count, dtype, root, msg, len);
    });
  }
  bool rooted() const { return gatherv_fn != nullptr && scatterv_fn != nullptr; }
  void barrier() {
    call("barrier", [&](char *msg, int64_t len) { return barrier_fn(ctx, msg, len); });
  }

  // Every rank's values of a few integers (for agreement checks): result[r * n + i].
  std::vector<int64_t> gather_values(const std::vector<int64_t> &mine) {
    std::vector<int64_t> all(mine.size() * static_cast<size_t>(size));
    allgather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), FTC_INT64, sizeof(int64_t));
    return all;
  }

 private:
  // counts are the same on every rank: so is the verdict.
  static void require_int_total(const std::vector<int64_t> &counts, const char *what) {
    int64_t total = 0;
    for (const int64_t c : counts) total += c;
    if (total > INT_MAX) {
      fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " of " + std::to_string(total) +
                                         " elements: at most 2^31-1 in one call (MPI's int counts)");
    }
  }
  void require_rooted(const char *what) const {
    if (!rooted()) {
      fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + ": this communicator was made without gatherv/scatterv functions "
                                  "(make it with torch_comm_init of module ftorch_mpi, or pass them to ftc_comm_new)");
    }
  }
  template <class Fn>
  static void for_chunks(void *buf, int64_t count, size_t elsize, Fn &&fn) {
    auto *p = static_cast<char *>(buf);
    while (count > 0) {
      const int64_t n = std::min<int64_t>(count, INT_MAX);
      fn(p, n);
      p += n * static_cast<int64_t>(elsize);
      count -= n;
    }
  }
};

using CommTable = HandleTable<std::shared_ptr<Comm>>;

inline std::shared_ptr<Comm> &comm_of(ftc_comm h) {
  auto *s = CommTable::instance().find(h);
  if (s == nullptr || !s->value) bad_handle(h, "communicator", "communicator");
  return s->value;
}

// The caller's dtype code for a tensor's elements (bool travels as its bytes, uint8).
inline int wire_dtype(c10::ScalarType t) {
  if (t == c10::ScalarType::Bool) return FTC_UINT8;
  if (!c10::isIntegralType(t, false) && t != c10::ScalarType::Float && t != c10::ScalarType::Double) {
    fail(FTC_ERR_DTYPE, std::string("collectives support int8/16/32/64, uint8, bool, float32 and float64 tensors, "
                                    "not ") + c10::toString(t));
  }
  return dtype_code(t);  // (an integer type FTorch has no code for, uint16 say, fails here)
}

// Device work that wrote t must be finished before the caller's library reads its memory.
inline void settle(const at::Tensor &t) {
  if (!t.is_cpu()) at::accelerator::synchronizeDevice(t.device().index());
}

// Where the collectives of a tensor's values happen: its own memory when it is contiguous and
// reachable by the caller's collectives, else a contiguous copy (in host memory unless the
// communicator is device-aware).
inline at::Tensor wire_buffer(const Comm &c, const at::Tensor &t) {
  const bool reachable = t.is_cpu() || c.device_aware;
  if (reachable && t.is_contiguous()) return t;
  const auto device = reachable ? t.device() : c10::Device(c10::kCPU);
  return t.to(device, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true, c10::MemoryFormat::Contiguous);
}

// buf summed over the ranks, in place (buf: a wire_buffer).
inline void sum_across(Comm &c, const at::Tensor &buf) {
  settle(buf);
  c.allreduce(buf.data_ptr(), buf.numel(), wire_dtype(buf.scalar_type()), buf.element_size(), FTC_OP_SUM);
}

// The values of `buffer` into t (nothing to do when the buffer is t's own memory). Tensors
// changed behind autograd's back get a new version, so that a graph that saved them notices.
inline void land(const at::Tensor &t, const at::Tensor &buffer) {
  at::NoGradGuard no_grad;
  if (buffer.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
    t.unsafeGetTensorImpl()->bump_version();
  } else {
    t.copy_(buffer);
  }
}

// A digest of a string, the same on every rank (agreement checks compare digests, not strings).
inline int64_t digest_of(const std::string &s) { return static_cast<int64_t>(std::hash<std::string>{}(s)); }

// "1, 3": the ranks of comm for which pred(rank) holds.
template <class Pred>
std::string ranks_where(const Comm &comm, Pred &&pred) {
  std::string list;
  for (int r = 0; r < comm.size; ++r) {
    if (pred(r)) list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  return list;
}

// What one rank's local phase of a collective call ended with: its status and message (FTC_OK
// and empty on success). The local checks of a collective call (its handles, its arguments) run in
// such a phase, so that a rank whose checks fail still takes part in the call's agreement: it then
// fails on every rank (see fail_if_any_rank_failed), where failing alone would leave the others
// waiting in a collective, or pair their call with this rank's next one.
template <class Fn>
int local(std::string &message, Fn &&fn) {
  const int status = guard(std::forward<Fn>(fn));
  if (status != FTC_OK) message = last_error_message();
  return status;
}

// After the agreement gather: this rank's own error if its local phase failed, else
// FTC_ERR_DISTRIBUTED naming the ranks whose status (status_of(r)) is not FTC_OK.
template <class StatusOf>
void fail_if_any_rank_failed(const Comm &comm, int status, const std::string &message, StatusOf &&status_of,
                             const char *what) {
  if (status != FTC_OK) fail(status, message + " (the other ranks were told)");
  const std::string failed = ranks_where(comm, [&](int r) { return status_of(r) != FTC_OK; });
  if (!failed.empty()) {
    fail(FTC_ERR_DISTRIBUTED, std::string(what) + ": rank(s) " + failed + " failed before it ran (see their "
                              "errors); nothing was exchanged");
  }
}

}  // namespace ftc
