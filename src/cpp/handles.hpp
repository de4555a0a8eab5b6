// handles.hpp - the lifetime of every handle the C API gives out (tensors, models, optimizers,
// schedulers), in one place.
//
// A handle is not a pointer but a (table, slot, generation) triple packed into a pointer-sized
// value (the slot's index + 1 in bits 0-23; a write stamp in bits 24-31; the generation in bits
// 32-59; the number of the table that gave it out in bits 60-63):
//  - deleting a handle frees its slot and bumps the slot's generation, so every copy of the old
//    value (Fortran's intrinsic assignment, sourced allocation, a compiler that finalizes a copy)
//    becomes *stale*: using it is a clear error, deleting it again is a no-op, and it can never
//    reach whatever object later reuses the slot;
//  - a value that was never a handle (an uninitialised c_ptr) is rejected the same way, and so is
//    a handle of another kind (a C program's function context or argument list given for a tensor:
//    C converts `void *` handles silently) -- it never reaches the object of the same slot there;
//  - Fortran's `=` into a tensor bumps the slot's write stamp and stores it in the handle it was
//    given (the left-hand side), so a copy of the handle taken before that write (the bitwise
//    temporary through which gfortran reads the right-hand side of an array `=` between
//    overlapping sections) is told apart from the current one as the right-hand side of a later
//    `=` (see stamped_assign). Every other lookup ignores the stamp: such a copy still names the
//    same tensor everywhere else (argument lists, deletes);
//  - results of expressions are temporaries. Where the Fortran compiler finalizes every function
//    result (flang) the finalizer deletes them at the end of the statement; where it does not
//    (gfortran: 11 and 12 none, 13 and 14 none inside array constructors), they are released by
//    the first C call that reads them,
//    through `tensor_of` and `guard`, whatever that call is and whether it succeeds or fails.
// What a tensor handle is and what each call may do with it (release it on reading, take it over
// in `=`, write into its memory) is its Lifetime, one state machine (lifetime.hpp) kept in its slot.
// Slots live in chunks that are never freed or moved, so a lookup is two loads and a compare.
// Free slots are cached per thread; the live count is kept per thread and summed when read.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lifetime.hpp"
#include "thread_state.hpp"

namespace ftc {

// Handle-count bookkeeping of the calling thread (no shared counter on the hot path).
void warn_growth(ThreadState &ts, int64_t live) noexcept;
inline void count_handles(ThreadState &ts, int64_t delta) noexcept {
  // Only this thread writes its counter: a relaxed load and store, no read-modify-write.
  const int64_t live = ts.live.load(std::memory_order_relaxed) + delta;
  ts.live.store(live, std::memory_order_relaxed);
  if (live > ts.warn_at) warn_growth(ts, live);
}
// A step of the caller's time loop: a forward, an optimizer or training step, a Python call. The
// run-time signal of a leak that runs out of the threshold's reach: when the live handles (of all
// threads) have grown between this thread's steps 100 times (FTORCH_STEP_GROWTH_WARN) without
// falling, one warning, then again after twice as many. A loop that frees what it makes, however
// many handles it keeps, never warns. Only when this thread's own count grew since its last step
// are all threads' counts read (step_grew): handles another thread frees are seen there.
void step_grew(ThreadState &ts) noexcept;
inline void note_step() noexcept {
  ThreadState &ts = thread_state();
  const int64_t live = ts.live.load(std::memory_order_relaxed);
  if (live > ts.step_live) {
    step_grew(ts);
  } else if (live < ts.step_live) {
    ts.growth_steps = 0;
  }
  ts.step_live = live;
}
// Live handles of every kind, over all threads (past and present).
int64_t live_handle_count() noexcept;

// A handle table's shared free list, for the slots a thread caches when it exits.
struct TableFreeList {
  virtual void take_back(const uint32_t *index, uint32_t n) noexcept = 0;
};
// A number for a new table (its FreeSlots in every ThreadState), and the table to return them to.
size_t register_table(TableFreeList *table);
template <class T>
class HandleTable final : public TableFreeList {
 public:
  struct Slot {
    T value{};
    uint32_t generation = 1;
    bool live = false;
    Lifetime life;      // the tensor rules' state (lifetime.hpp); named() for other kinds
    uint8_t stamp = 0;  // write stamp (bits 24-31 of the current handle)
    // Tensors: the copies of the sizes and strides that get_shape and get_stride point Fortran to
    // (tensor.cpp described_copy). Kept when the slot is freed and reused (a pointer kept past its
    // tensor reads memory that is still there) unless a later tensor of the slot has more
    // dimensions than the copy holds (8 at least).
    std::vector<int64_t> sizes_copy, strides_copy;
  };

  static constexpr uint32_t kStampShift = 24;
  static constexpr uintptr_t kStampMask = uintptr_t{0xff} << kStampShift;
  static uint8_t stamp_of(const void *handle) noexcept {
    return static_cast<uint8_t>((reinterpret_cast<uintptr_t>(handle) & kStampMask) >> kStampShift);
  }
  // The same handle without its write stamp: equal for every copy of a handle to one slot.
  static const void *unstamped(const void *handle) noexcept {
    return reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(handle) & ~kStampMask);
  }
  // The handle of slot `s` after a write: the next stamp, stored in the slot and returned.
  static void *restamp(const void *handle, Slot &s) noexcept {
    s.stamp = static_cast<uint8_t>(s.stamp + 1);  // 256 stamps: a copy 256 writes old looks current
    return reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(handle) & ~kStampMask) |
                                    (static_cast<uintptr_t>(s.stamp) << kStampShift));
  }

  static HandleTable &instance() { return *instance_; }

  // The value is moved (or copied, for an lvalue) straight into the slot: no intermediate copy.
  template <class V>
  void *acquire(V &&value, Lifetime life = Lifetime::named()) {
    ThreadState &ts = thread_state();
    const uint32_t index = take_index(ts);
    Slot &s = slot(index);
    s.value = std::forward<V>(value);
    s.life = life;
    s.stamp = 0;
    s.live = true;
    count_handles(ts, 1);
    return reinterpret_cast<void *>(tag_ | (static_cast<uintptr_t>(s.generation) << kGenerationShift) |
                                    (uintptr_t{index} + 1));
  }

  // The live slot of `handle`, or nullptr for null, stale or foreign values.
  Slot *find(const void *handle) const noexcept {
    const auto bits = reinterpret_cast<uintptr_t>(handle);
    const auto low = static_cast<uint32_t>(bits & kIndexMask);
    if (low == 0 || low > kCapacity) return nullptr;
    const uint32_t index = low - 1;
    Slot *chunk = chunks_[index >> kChunkBits].load(std::memory_order_acquire);
    if (chunk == nullptr) return nullptr;
    Slot &s = chunk[index & (kChunkSize - 1)];
    if (!s.live || (bits & kTagMask) != tag_ ||
        s.generation != static_cast<uint32_t>((bits >> kGenerationShift) & kGenerationMask)) {
      return nullptr;
    }
    return &s;
  }

  // Free the slot of a live handle; false (and nothing done) for null, stale or foreign values.
  bool release(const void *handle) noexcept {
    Slot *s = find(handle);
    if (s == nullptr) return false;
    s->live = false;
    s->life = Lifetime::named();
    s->generation = (s->generation + 1) & kGenerationMask;  // 2^28 - 1 reuses before one repeats
    if (s->generation == 0) s->generation = 1;
    T old = std::move(s->value);  // leaves the slot's value empty (tensors, shared and intrusive pointers)
    ThreadState &ts = thread_state();
    give_back(ts, static_cast<uint32_t>(reinterpret_cast<uintptr_t>(handle) & kIndexMask) - 1);
    count_handles(ts, -1);
    return true;  // `old` (a tensor, a model...) is destroyed here, after the slot is consistent
  }

 private:
  static constexpr uint32_t kChunkBits = 12;
  static constexpr uint32_t kChunkSize = 1u << kChunkBits;
  // index + 1 < 2^24 (bits 24-31 are the stamp): 16.7 million live handles of a kind at most.
  static constexpr uint32_t kMaxChunks = (1u << 12) - 1;
  static constexpr uint32_t kCapacity = kChunkSize * kMaxChunks;
  static constexpr uintptr_t kIndexMask = (uintptr_t{1} << kStampShift) - 1;
  static constexpr uint32_t kGenerationShift = 32;
  static constexpr uint32_t kGenerationMask = (1u << 28) - 1;
  static constexpr uint32_t kTagShift = 60;  // 16 tables at most (ThreadState::kMaxTables)
  static constexpr uintptr_t kTagMask = uintptr_t{0xf} << kTagShift;
  static_assert(sizeof(uintptr_t) == 8, "handles pack 64 bits");
  static_assert(ThreadState::kMaxTables <= 16, "the table's number must fit in the handle's 4 tag bits");
  HandleTable() : id_(register_table(this)), tag_(static_cast<uintptr_t>(id_) << kTagShift) {}

  void take_back(const uint32_t *index, uint32_t n) noexcept override {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.insert(free_.end(), index, index + n);
    } catch (...) {
      // Out of memory for the free list: the slots are not reused (never unsafe).
    }
  }

  Slot &slot(uint32_t index) const {
    return chunks_[index >> kChunkBits].load(std::memory_order_acquire)[index & (kChunkSize - 1)];
  }

  uint32_t take_index(ThreadState &ts) {
    ThreadState::FreeSlots &c = ts.free[id_];
    if (c.n > 0) return c.index[--c.n];
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      const uint32_t i = free_.back();
      free_.pop_back();
      return i;
    }
    if (next_ >= kCapacity) throw std::bad_alloc();
    if ((next_ & (kChunkSize - 1)) == 0) {
      chunks_[next_ >> kChunkBits].store(new Slot[kChunkSize], std::memory_order_release);
    }
    return next_++;
  }

  void give_back(ThreadState &ts, uint32_t index) noexcept {
    ThreadState::FreeSlots &c = ts.free[id_];
    if (c.n < ThreadState::kCacheSize) {
      c.index[c.n++] = index;
      return;
    }
    take_back(&index, 1);
  }

  const size_t id_;
  const uintptr_t tag_;  // id_ in the tag bits of every handle this table gives out
  // Created when the library is loaded (before any call can need it: a plain load on every use,
  // no initialization guard); never destroyed: threads may outlive main.
  static inline HandleTable *const instance_ = new HandleTable();
  std::atomic<Slot *> chunks_[kMaxChunks] = {};
  std::mutex mutex_;
  std::vector<uint32_t> free_;  // guarded by mutex_
  uint32_t next_ = 0;           // guarded by mutex_
};

class CompiledModel;  // compiled.hpp

// A model handle holds a TorchScript module, or an AOTInductor package (compiled is set).
struct TrainingPackage;  // train_package.cpp

struct NodeShared;       // node_shared.cpp

struct Model {
  torch::jit::Module module;
  std::shared_ptr<CompiledModel> compiled;
  std::shared_ptr<TrainingPackage> package;  // set for a training package (module calls its code)
  // Set for a node-shared model (ftc_model_load_shared): its communicator; on ranks other than
  // the leader the handle holds no module (module, compiled and package are empty).
  std::shared_ptr<NodeShared> shared;
};

using TensorTable = HandleTable<at::Tensor>;
using ModelTable = HandleTable<std::shared_ptr<Model>>;
using OptimTable = HandleTable<std::shared_ptr<Optim>>;
using SchedulerTable = HandleTable<std::shared_ptr<Scheduler>>;

// ---------------------------------------------------------------------------- temporaries

// Temporaries read during the current C calls of this thread (ThreadState::consumed) are
// released when the call that read them returns: release_consumed(ts, mark) frees those after
// `mark` (calls nest: an LBFGS closure runs Fortran code that calls back into the C API).
void release_consumed(ThreadState &ts, size_t from) noexcept;
// Keep temporary h, which the element `=` just read, for the thread's next C call (ThreadState::
// held_rhs; nothing else may be held): not counted among the live handles meanwhile.
void hold_rhs(ThreadState &ts, void *h) noexcept;
// Release the temporary the last element `=` kept for a next element: every C call but that `=`
// does it first (guard), as do the live-handle count and thread exit.
void release_held(ThreadState &ts) noexcept;

// ---------------------------------------------------------------------------- access

// Error for a handle that does not resolve: null (never constructed) or stale/foreign.
[[noreturn]] void bad_handle(const void *handle, const char *kind, const char *what);

// The slot of a tensor handle; a temporary is scheduled for release at the end of the call.
TensorTable::Slot &tensor_slot(ftc_tensor h, const char *what = "tensor");
// The same for item `number` of a list: "<what> <number>" in the message, made only on failure.
TensorTable::Slot &tensor_slot(ftc_tensor h, const char *what, int64_t number);
inline at::Tensor &tensor_of(ftc_tensor h, const char *what = "tensor") { return tensor_slot(h, what).value; }
// Schedule temporary h for release when the calls in progress on this thread return. Listed once,
// by the outermost call that reads it: a nested call (user code run by a callback) reading the
// same temporary must not free it under the outer call (the lists are a few entries long).
inline void consume(ThreadState &ts, ftc_tensor h) {
  auto &list = ts.consumed;
  for (const void *c : list) {
    if (c == h) return;
  }
  list.push_back(h);
}

// The slots of a call's tensor operands, one lookup each: every temporary among them is scheduled
// for release first, then the first that does not resolve fails, named by `what`.
// The live slot of a tensor handle (nullptr if it does not resolve), a temporary scheduled for
// release: the one lookup every way of reading tensor arguments goes through.
inline TensorTable::Slot *find_scheduled(ftc_tensor h) {
  auto *s = TensorTable::instance().find(h);
  if (s != nullptr && s->life.released_by_first_read()) consume(thread_state(), h);
  return s;
}

template <size_t N>
__attribute__((always_inline)) inline std::array<TensorTable::Slot *, N> operands(const ftc_tensor (&handles)[N], const char *const (&what)[N]) {
  std::array<TensorTable::Slot *, N> slots;
  for (size_t i = 0; i < N; ++i) slots[i] = find_scheduled(handles[i]);
  for (size_t i = 0; i < N; ++i) {
    if (slots[i] == nullptr) bad_handle(handles[i], "tensor", what[i]);
  }
  return slots;
}

// Schedule the temporaries among an array of tensor arguments (call it for every array argument
// before checking any of them, so that each temporary is released whatever fails first).
void take_temporaries(const ftc_tensor *handles, int64_t n);
// Every handle of an array, resolved (its temporaries scheduled first).
std::vector<at::Tensor> tensors_of(const ftc_tensor *handles, int64_t n, const char *what);
// The same checks and scheduling of temporaries, for handles the caller resolves later itself.
void check_tensors(const ftc_tensor *handles, int64_t n, const char *what);

// The value C callers of optional objects (checkpoints, the train step's scheduler) pass for an
// object that is given but not constructed: an error, never "absent".
inline const void *unconstructed_handle() { return reinterpret_cast<const void *>(~uintptr_t{0}); }

// Schedule the temporaries among several tensor arguments first, so that each is released even
// when checking an earlier argument fails.
void take_temporaries(std::initializer_list<ftc_tensor> handles);

// A new handle holding a tensor (moved in from an rvalue, shared from an lvalue).
inline ftc_tensor new_tensor_handle(at::Tensor &&t, Lifetime life = Lifetime::named()) {
  return static_cast<ftc_tensor>(TensorTable::instance().acquire(std::move(t), life));
}
inline ftc_tensor new_tensor_handle(const at::Tensor &t, Lifetime life = Lifetime::named()) {
  return static_cast<ftc_tensor>(TensorTable::instance().acquire(t, life));
}
bool delete_tensor(ftc_tensor h) noexcept;

// The model of a handle, either kind.
Model &any_model_of(ftc_model h);
// The TorchScript module of a model held by this process (an error for AOTInductor packages and on
// the ranks that do not hold a node-shared model).
torch::jit::Module &module_of(Model &model);
// The TorchScript module of a handle; a compiled model fails: it can only run forward.
torch::jit::Module &model_of(ftc_model h);
std::shared_ptr<torch::jit::Module> module_ptr(ftc_model h);
std::shared_ptr<Optim> &optim_ptr(ftc_optim h);
inline Optim &optim_of(ftc_optim h) { return *optim_ptr(h); }
std::shared_ptr<Scheduler> &scheduler_ptr(ftc_scheduler h);
inline Scheduler &scheduler_of(ftc_scheduler h) { return *scheduler_ptr(h); }

// *out = a new handle holding value; the previous handle of *out (if live) is freed only after.
template <class Table, class Handle, class Value>
void replace_handle(Handle *out, Value &&value, Lifetime life = Lifetime::named()) {
  if (out == nullptr) fail(FTC_ERR_INVALID_ARGUMENT, "output handle pointer is null");
  auto &table = Table::instance();
  Handle fresh = static_cast<Handle>(table.acquire(std::forward<Value>(value), life));
  Handle old = *out;
  *out = fresh;
  table.release(old);
}

// A handle bound to a parameter (an optimizer's, or a model's from ftc_model_parameter) may not be
// made anew over another tensor: the optimizer would go on updating the old leaf, which nothing
// computed from the handle reaches any more, and a model's parameter would keep its values, both
// silently. Only another parameter handle (the model's parameter fetched again) may replace it.
void check_not_parameter(ftc_tensor *out, const at::Tensor &t, Lifetime life);

// *out = a new tensor handle holding t (replace_handle for tensors).
inline void install(ftc_tensor *out, at::Tensor &&t, Lifetime life = Lifetime::named()) {
  check_not_parameter(out, t, life);
  replace_handle<TensorTable>(out, std::move(t), life);
}
inline void install(ftc_tensor *out, const at::Tensor &t, Lifetime life = Lifetime::named()) {
  check_not_parameter(out, t, life);
  replace_handle<TensorTable>(out, t, life);
}

template <class Table, class Handle>
int delete_handle(Handle *h) noexcept {
  if (h != nullptr) {
    Table::instance().release(*h);
    *h = nullptr;
  }
  return FTC_OK;
}

}  // namespace ftc
