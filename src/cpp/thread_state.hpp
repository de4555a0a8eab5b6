// thread_state.hpp - everything the C layer keeps per thread, in one place: live-handle counts,
// temporaries being released, the last error, cached free slots, and the scopes a thread opens
// (catch scopes, grad-mode scopes, saved-tensor hook policies). One thread-local pointer reaches
// it; it is created on the thread's first call and destroyed at thread exit (handles.cpp).
// (libftorch_python, a separate library, keeps its own last error.)
#pragma once

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ftorch_c.h"

namespace ftc {

// A catch scope (torch_catch_begin/end) with the first failure recorded in it; a callback's scope
// is a barrier that only the callback's end closes (with whatever the callback left open above it).
struct CatchScope {
  int status = FTC_OK;
  std::string message;
  bool barrier = false;
};

// The catch scopes of a thread. A scope begun by torch_catch_begin and still open when the thread
// ends (the main thread: at exit, also after `stop`), holding a failure, kept that failure without
// anything saying so (its torch_catch_end never ran): the destructor says so on standard error
// (runtime.cpp). A callback's own scope (a barrier) is not the user's to end: not counted.
struct CatchScopes : std::vector<CatchScope> {
  CatchScopes() = default;
  CatchScopes(const CatchScopes &) = delete;
  CatchScopes &operator=(const CatchScopes &) = delete;
  ~CatchScopes();
};

// An open grad-mode scope (torch_no_grad_begin, ...): ending it destroys the guard, restoring the mode.
struct GradScope {
  int kind;
  std::unique_ptr<at::NoGradGuard> no_grad;
  std::unique_ptr<at::AutoGradMode> enable_grad;
  std::unique_ptr<c10::InferenceMode> inference;
};

// A saved-tensor hook policy (torch_saved_tensors_begin, ...): where tensors saved for backward go.
struct PackPolicy {
  int policy = 0;
  std::string directory;
  int64_t threshold = 0;
  ftc_pack_fn pack = nullptr;
  void *pack_data = nullptr;
  ftc_unpack_fn unpack = nullptr;
  void *unpack_data = nullptr;
};

// Everything the C layer keeps per thread, in one place, reached through one thread-local pointer
// (initial-exec: one load from the thread pointer, no __tls_get_addr and no lazy-construction guard
// on the hot path). Created on a thread's first call; at thread exit its live-handle balance goes
// to the retired total and its cached free slots back to their tables.
struct ThreadState {
  static constexpr size_t kMaxTables = 16;  // handle tables (tensors, models, ...)
  static constexpr uint32_t kCacheSize = 64;
  struct FreeSlots {
    uint32_t n = 0;
    uint32_t index[kCacheSize];
  };
  std::atomic<int64_t> live{0};   // handles this thread created minus those it freed (read by others)
  int64_t warn_at = -1;           // next live count that prints the leak warning (-1: not read yet)
  int64_t step_live = 0;          // this thread's live count at its last step (see note_step)
  int64_t step_global = 0;        // all threads' live count when this thread's last grew at a step
  int64_t growth_steps = 0;       // steps since the count last fell at which it had grown
  int64_t warn_growth_steps = 0;  // growth_steps that print the step warning (0: no sample taken yet)
  std::vector<void *> consumed;   // temporaries read by the calls in progress, released as they return
  void *held_rhs = nullptr;       // a temporary the last element `=` read, kept to its next call (math.cpp)
  std::string last_error;         // message of this thread's last failed call
  FreeSlots free[kMaxTables];     // per table: slots this thread freed, reused first
  CatchScopes catch_scopes;       // open catch scopes (runtime.cpp), innermost last
  std::vector<GradScope> grad_scopes;      // open grad-mode scopes (autograd.cpp), innermost last
  std::vector<PackPolicy> pack_policies;   // saved-tensor hook policies (function.cpp), innermost last
};

ThreadState &new_thread_state();
// An inline variable with a constant initializer: every translation unit sees that it needs no
// dynamic initialization, so reading it is one load (an `extern thread_local` would be read through
// a call to its TLS wrapper function).
inline thread_local ThreadState *current_thread_state __attribute__((tls_model("initial-exec"))) = nullptr;

inline ThreadState &thread_state() {
  ThreadState *s = current_thread_state;
  return s != nullptr ? *s : new_thread_state();
}
// The calling thread's state if it has one yet (never allocates: for calls that must not fail).
inline ThreadState *existing_thread_state() noexcept { return current_thread_state; }

}  // namespace ftc
