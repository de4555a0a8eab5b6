// callbacks.cpp - what every kind of user callback (gradient hooks, custom functions' backward,
// saved-tensor hooks, checkpointed segments, gradcheck functions, LBFGS closures) shares on the C
// side: handles lent to the callback, results taken back from it, its status turned into an
// error, and the lock of the Fortran modules' callback registry.
#include <mutex>

#include "internal.hpp"

namespace ftc {

void check_callback(int status, const std::string &what) {
  if (status != FTC_OK) callback_failed(status, what);
}

void callback_failed(int status, const std::string &what) {
  const std::string reason = last_error_message();
  fail(FTC_ERR_CALLBACK, what + " failed (status " + std::to_string(status) + ")" +
                             (reason.empty() ? std::string() : ": " + reason));
}

CallbackHandles::~CallbackHandles() {
  for (auto h : handles) delete_tensor(h);
}

ftc_tensor CallbackHandles::add(const at::Tensor &t) {
  handles.push_back(nullptr);
  handles.back() = new_tensor_handle(t);
  return handles.back();
}

std::vector<at::Tensor> run_segment(ftc_segment_fn fn, void *data, const std::vector<at::Tensor> &inputs,
                                    int n_outputs, const std::string &what) {
  CallbackHandles handles;
  for (const auto &t : inputs) handles.add(t);
  CallbackHandles results;  // the callback's outputs, freed if not taken
  results.handles.assign(static_cast<size_t>(n_outputs), nullptr);
  check_callback(fn(data, handles.handles.data(), static_cast<int>(inputs.size()), results.handles.data(), n_outputs),
                 what);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < results.handles.size(); ++i) {
    out.push_back(take_callback_result_lazy(results.handles[i],
                                            [&] { return "output " + std::to_string(i + 1) + " of " + what; }));
    if (!out.back().defined()) fail(FTC_ERR_CALLBACK, what + " did not construct output " + std::to_string(i + 1));
  }
  return out;
}

}  // namespace ftc

extern "C" {

void ftc_set_last_error(const char *msg, int64_t msg_len) {
  try {
    ftc::set_last_error(msg == nullptr || msg_len <= 0 ? std::string() : std::string(msg, static_cast<size_t>(msg_len)));
  } catch (...) {
  }
}

// The Fortran modules' callback registry (ftorch_callbacks) is changed under this lock.
static std::mutex callback_registry_mutex;
void ftc_callback_registry_lock(void) { callback_registry_mutex.lock(); }
void ftc_callback_registry_unlock(void) { callback_registry_mutex.unlock(); }

}  // extern "C"
