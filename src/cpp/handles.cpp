// handles.cpp - handle tables, per-thread live counts and the release of temporaries
// (see handles.hpp for the rules).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "internal.hpp"

namespace ftc {

namespace {

// Every thread's state, for the live-handle total; a thread that ends hands its balance to
// `retired`. Reading the total locks; counting never does.
struct StateRegistry {
  std::mutex mutex;
  std::vector<ThreadState *> states;
  int64_t retired = 0;
  TableFreeList *tables[ThreadState::kMaxTables] = {};
  size_t n_tables = 0;
};

StateRegistry &registry() {
  static StateRegistry *r = new StateRegistry();  // never destroyed (threads may outlive main)
  return *r;
}

// Owns the calling thread's state; its destructor runs at thread exit.
struct StateOwner {
  ThreadState *state = nullptr;
  ~StateOwner() {
    if (state == nullptr) return;
    release_held(*state);
    auto &r = registry();
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      r.retired += state->live.load(std::memory_order_relaxed);
      r.states.erase(std::remove(r.states.begin(), r.states.end(), state), r.states.end());
      for (size_t t = 0; t < r.n_tables; ++t) {
        if (state->free[t].n > 0) r.tables[t]->take_back(state->free[t].index, state->free[t].n);
      }
    }
    current_thread_state = nullptr;
    delete state;  // outside the registry's lock: its scopes' destructors run here
  }
};

thread_local StateOwner state_owner;

// A count from the environment: `fallback` when unset or empty, "never" (the largest value) when 0.
int64_t env_count(const char *name, int64_t fallback) {
  const char *env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  const long long v = std::atoll(env);
  return v <= 0 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

// The run-time signal of a leak: when this thread's live handles pass a threshold, one warning on
// standard error, and the threshold doubles (FTORCH_LIVE_HANDLES_WARN sets the first, 0 disables).
int64_t first_warning_threshold() { return env_count("FTORCH_LIVE_HANDLES_WARN", 100000); }

// What both leak warnings say after their first sentence.
constexpr const char *kLeakAdvice =
    "If that is not intended, something is not freed: with gfortran <= 12, function results are never finalized "
    "(end a function returning a tensor with `r = torch_result(expr)`), and arrays of tensors need torch_delete.";

int64_t doubled(int64_t n) {
  return n > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max() : 2 * n;
}

// Steps of growth that print the step warning: FTORCH_STEP_GROWTH_WARN (default 100); 0, or
// FTORCH_LIVE_HANDLES_WARN=0 (which silences both warnings), never.
int64_t first_step_growth_warning() {
  if (first_warning_threshold() == std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
  return env_count("FTORCH_STEP_GROWTH_WARN", 100);
}

}  // namespace

ThreadState &new_thread_state() {
  auto *state = new ThreadState();
  {
    auto &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.states.push_back(state);
  }
  state_owner.state = state;
  current_thread_state = state;
  return *state;
}

size_t register_table(TableFreeList *table) {
  auto &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.n_tables >= ThreadState::kMaxTables) std::abort();  // a table type added without raising kMaxTables
  r.tables[r.n_tables] = table;
  return r.n_tables++;
}

void warn_growth(ThreadState &ts, int64_t live) noexcept {
  if (ts.warn_at < 0) {
    ts.warn_at = first_warning_threshold();
    if (live <= ts.warn_at) return;
  }
  std::fprintf(stderr,
               "FTorch warning: %lld tensor/model handles created on this thread are alive and the number keeps "
               "growing. %s (FTORCH_LIVE_HANDLES_WARN=N sets this threshold, 0 silences it.)\n",
               static_cast<long long>(live), kLeakAdvice);
  std::fflush(stderr);
  ts.warn_at = doubled(live);
}

void step_grew(ThreadState &ts) noexcept {
  const int64_t global = live_handle_count();
  const int64_t last = ts.step_global;
  ts.step_global = global;
  if (ts.warn_growth_steps == 0) {  // the first sample is the baseline
    ts.warn_growth_steps = first_step_growth_warning();
    return;
  }
  if (global < last) {
    ts.growth_steps = 0;
    return;
  }
  if (global == last || ++ts.growth_steps < ts.warn_growth_steps) return;
  std::fprintf(stderr,
               "FTorch warning: the tensor/model handles alive grew from step to step %lld times without falling "
               "(steps: forwards, optimizer and training steps, Python calls), to %lld now. %s "
               "(FTORCH_STEP_GROWTH_WARN=N sets the number of steps, 0 silences this warning.)\n",
               static_cast<long long>(ts.growth_steps), static_cast<long long>(global), kLeakAdvice);
  std::fflush(stderr);
  ts.warn_growth_steps = doubled(ts.growth_steps);
}

int64_t live_handle_count() noexcept {
  release_held(thread_state());  // (and register this thread, so that the sum below includes it)
  auto &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  int64_t total = r.retired;
  for (const auto *s : r.states) total += s->live.load(std::memory_order_relaxed);
  return total;
}

void release_consumed(ThreadState &ts, size_t from) noexcept {
  auto &list = ts.consumed;
  while (list.size() > from) {
    void *h = list.back();
    list.pop_back();
    TensorTable::instance().release(h);
  }
}

void hold_rhs(ThreadState &ts, void *h) noexcept {
  ts.held_rhs = h;
  count_handles(ts, -1);  // the program no longer holds it: not a live handle while kept
}

void release_held(ThreadState &ts) noexcept {
  void *h = ts.held_rhs;
  ts.held_rhs = nullptr;
  if (h == nullptr) return;
  count_handles(ts, 1);  // (the release counts it off)
  TensorTable::instance().release(h);
}

void bad_handle(const void *handle, const char *kind, const char *what) {
  if (handle == unconstructed_handle()) {
    fail(FTC_ERR_NULL_HANDLE, std::string("the ") + what + " passed is not " +
                                  (std::string(kind) == "model" ? "loaded" : "constructed") +
                                  "; leave an optional object out rather than passing an unconstructed one");
  }
  if (handle == nullptr) {
    fail(FTC_ERR_NULL_HANDLE, std::string(what) + " is not " + (std::string(kind) == "model" || std::string(kind) == "Python module" ? "loaded" : "constructed") +
                                  " (null handle)");
  }
  fail(FTC_ERR_NULL_HANDLE, std::string(what) + " is not a live " + kind +
                                ": it was deleted, or is a copy of a " + kind +
                                " that has since been deleted (stale handle), or is not a " + kind +
                                " handle at all");
}

TensorTable::Slot &tensor_slot(ftc_tensor h, const char *what) {
  auto *s = find_scheduled(h);
  if (s == nullptr) bad_handle(h, "tensor", what);
  return *s;
}

TensorTable::Slot &tensor_slot(ftc_tensor h, const char *what, int64_t number) {
  auto *s = find_scheduled(h);
  if (s == nullptr) bad_handle(h, "tensor", (std::string(what) + " " + std::to_string(number)).c_str());
  return *s;
}

namespace {

// The slots of n handles, one lookup each: every temporary among them is scheduled for release
// before any handle is checked (a bad one is then reported as "<what> <number>").
c10::SmallVector<TensorTable::Slot *, 8> slots_of(const ftc_tensor *handles, int64_t n, const char *what) {
  if (n < 0) fail(FTC_ERR_INVALID_ARGUMENT, std::string("negative number of ") + what + "s (" + std::to_string(n) + ")");
  if (n > 0 && handles == nullptr) fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " array pointer is null");
  c10::SmallVector<TensorTable::Slot *, 8> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = find_scheduled(handles[i]);
  for (int64_t i = 0; i < n; ++i) {
    if (slots[static_cast<size_t>(i)] == nullptr) {
      bad_handle(handles[i], "tensor", (std::string(what) + " " + std::to_string(i + 1)).c_str());
    }
  }
  return slots;
}

}  // namespace

std::vector<at::Tensor> tensors_of(const ftc_tensor *handles, int64_t n, const char *what) {
  const auto slots = slots_of(handles, n, what);
  std::vector<at::Tensor> out;
  out.reserve(slots.size());
  for (auto *s : slots) out.push_back(s->value);
  return out;
}

void check_tensors(const ftc_tensor *handles, int64_t n, const char *what) { slots_of(handles, n, what); }

void take_temporaries(const ftc_tensor *handles, int64_t n) {
  if (handles == nullptr) return;
  for (int64_t i = 0; i < n; ++i) find_scheduled(handles[i]);
}

void take_temporaries(std::initializer_list<ftc_tensor> handles) {
  take_temporaries(handles.begin(), static_cast<int64_t>(handles.size()));
}

void check_not_parameter(ftc_tensor *out, const at::Tensor &t, Lifetime life) {
  if (out == nullptr || life.is_parameter()) return;
  const auto *slot = TensorTable::instance().find(*out);
  if (slot == nullptr || !slot->life.is_parameter() || slot->value.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
    return;
  }
  fail(FTC_ERR_INVALID_ARGUMENT,
       "the output tensor is a parameter (of an optimizer, or of a model): a new tensor in its place would leave "
       "the optimizer updating the old one, out of reach of everything computed from this tensor, and the "
       "model's parameter unchanged; give it new values with = (which writes into the parameter), or "
       "torch_tensor_delete it first to make an unrelated tensor");
}

bool delete_tensor(ftc_tensor h) noexcept { return TensorTable::instance().release(h); }

Model &any_model_of(ftc_model h) {
  auto *s = ModelTable::instance().find(h);
  if (s == nullptr || !s->value) bad_handle(h, "model", "model");
  return *s->value;
}

torch::jit::Module &model_of(ftc_model h) { return module_of(any_model_of(h)); }

torch::jit::Module &module_of(Model &model) {
  require_model_here(model);
  if (model.compiled) {
    fail(FTC_ERR_INVALID_ARGUMENT,
         "the model is a compiled AOTInductor package (.pt2), which can only run forward (no gradients, training, "
         "parameters or save); load the TorchScript export of the model for that");
  }
  return model.module;
}

std::shared_ptr<torch::jit::Module> module_ptr(ftc_model h) {
  auto &module = model_of(h);
  return {ModelTable::instance().find(h)->value, &module};  // shares the handle's ownership
}

std::shared_ptr<Optim> &optim_ptr(ftc_optim h) {
  auto *s = OptimTable::instance().find(h);
  if (s == nullptr || !s->value) bad_handle(h, "optimizer", "optimizer");
  return s->value;
}

std::shared_ptr<Scheduler> &scheduler_ptr(ftc_scheduler h) {
  auto *s = SchedulerTable::instance().find(h);
  if (s == nullptr || !s->value) bad_handle(h, "scheduler", "scheduler");
  return s->value;
}

// ---------------------------------------------------------------------------- exposed memory

namespace {

// Storages a pointer into whose memory was handed out, held weakly: a StorageImpl's address
// cannot be reused while a weak reference to it lives, and expired entries are dropped as the
// set grows. `any` lets every `=` skip the lock until the first pointer is handed out.
struct ExposedStorages {
  std::mutex mutex;
  std::unordered_map<const c10::StorageImpl *, c10::weak_intrusive_ptr<c10::StorageImpl>> set;
  size_t prune_at = 64;
  std::atomic<bool> any{false};
};

ExposedStorages &exposed_storages() {
  static auto *e = new ExposedStorages();  // never destroyed (threads may outlive main)
  return *e;
}

}  // namespace

void expose_memory(TensorTable::Slot &slot) {
  if (!slot.life.expose()) return;  // this handle's storage is registered already
  if (!slot.value.has_storage()) return;
  const c10::Storage &storage = slot.value.storage();
  auto &e = exposed_storages();
  std::lock_guard<std::mutex> lock(e.mutex);
  e.set.emplace(storage.unsafeGetStorageImpl(), c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl()));
  e.any.store(true, std::memory_order_release);
  if (e.set.size() >= e.prune_at) {
    for (auto it = e.set.begin(); it != e.set.end();) it = it->second.expired() ? e.set.erase(it) : std::next(it);
    e.prune_at = std::max<size_t>(64, 2 * e.set.size());
  }
}

bool memory_exposed(const at::Tensor &t) {
  auto &e = exposed_storages();
  if (!e.any.load(std::memory_order_acquire) || !t.has_storage()) return false;
  std::lock_guard<std::mutex> lock(e.mutex);
  const auto it = e.set.find(t.storage().unsafeGetStorageImpl());
  return it != e.set.end() && !it->second.expired();
}

}  // namespace ftc

extern "C" {

int64_t ftc_live_handles(void) { return ftc::live_handle_count(); }

int ftc_tensor_delete(ftc_tensor *t) { return ftc::delete_handle<ftc::TensorTable>(t); }

int ftc_model_delete(ftc_model *m) { return ftc::delete_handle<ftc::ModelTable>(m); }

void ftc_tensor_release(ftc_tensor t) { ftc::TensorTable::instance().release(t); }

void ftc_model_release(ftc_model m) { ftc::ModelTable::instance().release(m); }

void ftc_optim_release(ftc_optim o) { ftc::OptimTable::instance().release(o); }

void ftc_scheduler_release(ftc_scheduler s) { ftc::SchedulerTable::instance().release(s); }

int ftc_optim_delete(ftc_optim *o) { return ftc::delete_handle<ftc::OptimTable>(o); }

int ftc_scheduler_delete(ftc_scheduler *s) { return ftc::delete_handle<ftc::SchedulerTable>(s); }

int ftc_model_share(ftc_model src, ftc_model *dst) { return ftc::share<ftc::ModelTable>(src, dst, "model"); }

int ftc_optim_share(ftc_optim src, ftc_optim *dst) { return ftc::share<ftc::OptimTable>(src, dst, "optimizer"); }

int ftc_scheduler_share(ftc_scheduler src, ftc_scheduler *dst) {
  return ftc::share<ftc::SchedulerTable>(src, dst, "scheduler");
}

}  // extern "C"
