// transfer.cpp - copies between pageable host memory (a Fortran array) and a GPU at the bus's
// speed: through page-locked staging buffers, in chunks, the host-side memcpy of one chunk
// overlapping the DMA of another (see copy_values in internal.hpp).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "internal.hpp"

namespace {

// Below this many bytes a plain copy_ costs less than setting up the pipeline.
constexpr int64_t kMinStagedBytes = int64_t{1} << 20;

// Bytes per chunk: FTORCH_STAGING_CHUNK_MIB (default 16, the fastest of 4 and 16 on an H200: each
// chunk's memcpy is split over the threads, and smaller parts cost more to hand out than they
// save). 0 turns staging off (every copy is LibTorch's copy_).
int64_t chunk_bytes() {
  static const int64_t bytes = [] {
    const char *env = std::getenv("FTORCH_STAGING_CHUNK_MIB");
    const long mib = env != nullptr ? std::strtol(env, nullptr, 10) : 16;
    return static_cast<int64_t>(std::max(0L, mib)) << 20;
  }();
  return bytes;
}

// Whether copying src into dst goes through staging: one side pageable host memory, the other a
// CUDA device; the same dtype, both contiguous, large enough.
bool staged(const at::Tensor &dst, const at::Tensor &src) {
  if (dst.device().type() == src.device().type()) return false;  // (every `=` on one device: first)
  if (chunk_bytes() == 0) return false;
  const bool up = src.device().is_cpu() && dst.device().is_cuda();
  const bool down = src.device().is_cuda() && dst.device().is_cpu();
  if (!up && !down) return false;
  if (src.scalar_type() != dst.scalar_type() || src.sizes() != dst.sizes()) return false;
  if (src.nbytes() < static_cast<size_t>(kMinStagedBytes)) return false;
  if (!src.is_contiguous() || !dst.is_contiguous()) return false;
  const at::Tensor &host = up ? src : dst;
  return !host.is_pinned();  // page-locked memory is copied at full speed as it is
}

// memcpy in parts over LibTorch's inter-op thread pool (at::launch), the calling thread doing
// the first: one thread cannot keep up with the bus. (Not at::parallel_for: with LibTorch's OpenMP
// backend its body is an inline `omp parallel` region, serial in code compiled without OpenMP.)
void parallel_memcpy(char *to, const char *from, int64_t n) {
  constexpr int64_t kMinPart = int64_t{256} << 10;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n / kMinPart, at::get_num_threads()));
  const int64_t step = (n + parts - 1) / parts;
  std::vector<std::future<void>> others;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t begin = p * step, len = std::min(step, n - begin);
    if (len <= 0) break;
    auto task = std::make_shared<std::packaged_task<void()>>([=] { std::memcpy(to + begin, from + begin, len); });
    others.push_back(task->get_future());
    at::launch([task] { (*task)(); });
  }
  std::memcpy(to, from, std::min(step, n));
  for (auto &f : others) f.get();
}

at::Tensor bytes_of(const at::Tensor &t) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())},
                       at::TensorOptions().dtype(at::kByte).device(t.device()));
}

// Two page-locked buffers of one chunk per device, allocated at the first staged copy and kept
// (allocating page-locked memory costs more than the copy), each with the event of the last DMA
// queued from or into it: a buffer is written only once that DMA has run. Copies to or from one
// device take turns.
struct Staging {
  std::mutex mutex;
  at::Tensor buffer[2];
  std::unique_ptr<c10::Event> done[2];
};

Staging &staging_for(const c10::Device &device) {
  static std::mutex mutex;
  static auto *all = new std::map<std::pair<int, int>, std::unique_ptr<Staging>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  auto &s = (*all)[{static_cast<int>(device.type()), static_cast<int>(device.index())}];
  if (!s) {
    s = std::make_unique<Staging>();
    const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
    for (int k = 0; k < 2; ++k) {
      s->buffer[k] = at::empty({chunk_bytes()}, pinned);
      s->done[k] = std::make_unique<c10::Event>(device.type());
    }
  }
  return *s;
}

// Host to device: chunk i is copied into buffer i % 2 (once that buffer's previous DMA has run),
// then its DMA is queued on the device's current stream. The host memory is read completely when
// this returns; the device memory is written in stream order (kernels queued after this see it),
// as after LibTorch's own copy.
void upload(const at::Tensor &dst, const at::Tensor &src) {
  const int64_t n = static_cast<int64_t>(src.nbytes()), chunk = chunk_bytes();
  const char *from = static_cast<const char *>(src.const_data_ptr());
  at::Tensor to = bytes_of(dst);
  c10::impl::VirtualGuardImpl guard_impl(dst.device().type());
  const c10::Stream stream = guard_impl.getStream(dst.device());
  Staging &s = staging_for(dst.device());
  std::lock_guard<std::mutex> lock(s.mutex);
  for (int64_t offset = 0, i = 0; offset < n; offset += chunk, ++i) {
    const int64_t len = std::min(chunk, n - offset);
    const auto k = static_cast<size_t>(i % 2);
    s.done[k]->synchronize();
    parallel_memcpy(static_cast<char *>(s.buffer[k].data_ptr()), from + offset, len);
    to.narrow(0, offset, len).copy_(s.buffer[k].narrow(0, 0, len), /*non_blocking=*/true);
    s.done[k]->record(stream);
  }
}

// Device to host: the DMA of chunk i into buffer i % 2 is queued, then chunk i - 1 (queued before)
// is waited for and copied out; the host memory holds every value when this returns, as after
// LibTorch's own copy.
void download(const at::Tensor &dst, const at::Tensor &src) {
  const int64_t n = static_cast<int64_t>(src.nbytes()), chunk = chunk_bytes();
  char *to = static_cast<char *>(dst.data_ptr());
  at::Tensor from = bytes_of(src);
  c10::impl::VirtualGuardImpl guard_impl(src.device().type());
  const c10::Stream stream = guard_impl.getStream(src.device());
  Staging &s = staging_for(src.device());
  std::lock_guard<std::mutex> lock(s.mutex);
  const int64_t chunks = (n + chunk - 1) / chunk;
  auto drain = [&](int64_t i) {  // chunk i, whose DMA was queued: wait for it, copy it out
    const auto k = static_cast<size_t>(i % 2);
    const int64_t offset = i * chunk, len = std::min(chunk, n - offset);
    s.done[k]->synchronize();
    parallel_memcpy(to + offset, static_cast<const char *>(s.buffer[k].const_data_ptr()), len);
  };
  for (int64_t i = 0; i < chunks; ++i) {
    const auto k = static_cast<size_t>(i % 2);
    const int64_t offset = i * chunk, len = std::min(chunk, n - offset);
    s.done[k]->synchronize();  // (an upload's DMA from this buffer)
    s.buffer[k].narrow(0, 0, len).copy_(from.narrow(0, offset, len), /*non_blocking=*/true);
    s.done[k]->record(stream);
    if (i >= 1) drain(i - 1);
  }
  drain(chunks - 1);
}

// Whether copying src into dst is one memmove: both on the CPU, of one dtype, densely packed, with
// the elements in the same places (the same sizes, and the same strides where a size exceeds 1; or
// a 0-d src into a one-element dst, as copy_ broadcasts it), no lazy conjugate or negative bit, and
// fewer elements than LibTorch hands to several threads (at::internal::GRAIN_SIZE): a result into
// a tensor over a Fortran array of its layout, where TensorIterator's set-up costs more than the
// copy itself.
bool one_memmove(const at::Tensor &dst, const at::Tensor &src) {
  if (!dst.device().is_cpu() || !src.device().is_cpu() || dst.scalar_type() != src.scalar_type()) return false;
  const int64_t n = dst.numel();
  if (n == 0 || n >= at::internal::GRAIN_SIZE || src.numel() != n) return false;
  if (src.is_conj() || src.is_neg() || dst.is_conj() || dst.is_neg() || src._is_zerotensor()) return false;
  if (!dst.has_storage() || !src.has_storage()) return false;
  if (n > 1) {
    if (dst.sizes() != src.sizes()) return false;
    for (int64_t d = 0; d < dst.dim(); ++d) {
      if (dst.size(d) > 1 && dst.stride(d) != src.stride(d)) return false;
    }
    if (!dst.is_non_overlapping_and_dense() || !src.is_non_overlapping_and_dense()) return false;
  } else if (dst.sizes() != src.sizes() && src.dim() != 0) {
    return false;
  }
  return true;
}

// The bytes [first, last) that t's elements occupy (first == last without elements).
std::pair<const char *, const char *> byte_range(const at::Tensor &t) {
  if (t.numel() == 0 || !t.has_storage()) return {nullptr, nullptr};
  const char *base = static_cast<const char *>(t.const_data_ptr());
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto item = static_cast<int64_t>(t.element_size());
  return {base + lo * item, base + (hi + 1) * item};
}

}  // namespace

// Tensors over overlapping sections of one Fortran array (a(1:4) and a(2:5)) are separate
// storages, which LibTorch's own overlap check does not compare; same elements in the same places
// are no overlap (copy_ handles them).
bool ftc::memory_overlaps(const at::Tensor &l, const at::Tensor &r) {
  // First the whole storages (a few loads): disjoint for nearly every `=`.
  const c10::TensorImpl *li = l.unsafeGetTensorImpl(), *ri = r.unsafeGetTensorImpl();
  if (!li->has_storage() || !ri->has_storage()) return false;
  const c10::StorageImpl *ls = li->storage().unsafeGetStorageImpl(), *rs = ri->storage().unsafeGetStorageImpl();
  const char *l0 = static_cast<const char *>(ls->data()), *r0 = static_cast<const char *>(rs->data());
  if (ls != rs && (l0 >= r0 + rs->nbytes() || r0 >= l0 + ls->nbytes())) return false;
  if (l.device() != r.device()) return false;
  const auto a = byte_range(l), b = byte_range(r);
  if (a.first == a.second || b.first == b.second || a.first >= b.second || b.first >= a.second) return false;
  return !(a.first == b.first && l.sizes() == r.sizes() && l.strides() == r.strides() &&
           l.scalar_type() == r.scalar_type());
}

namespace ftc {

void copy_values(at::Tensor &dst, const at::Tensor &src) {
  // Source memory that the destination overlaps (two tensors over overlapping sections of one
  // Fortran array, a transposed view copied into its own array) is read whole before any of it
  // is written.
  if (memory_overlaps(dst, src)) {
    const at::Tensor whole = src.clone();
    copy_values(dst, whole);
    return;
  }
  if (one_memmove(dst, src)) {
    // The elements' bytes are one block in each (dense, no negative strides), from data_ptr on;
    // the version goes up as copy_'s would (a graph that saved dst reports the change at backward).
    std::memmove(dst.data_ptr(), src.const_data_ptr(), static_cast<size_t>(dst.numel()) * dst.element_size());
    dst.unsafeGetTensorImpl()->bump_version();
    return;
  }
  if (!staged(dst, src)) {
    dst.copy_(src);
    return;
  }
  at::NoGradGuard no_grad;  // (callers copy values without history only)
  if (src.device().is_cpu()) {
    upload(dst, src);
  } else {
    download(dst, src);
  }
  dst.unsafeGetTensorImpl()->bump_version();  // (as copy_ would: see above)
}

}  // namespace ftc
