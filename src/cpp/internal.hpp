// internal.hpp - what every translation unit of the C layer shares: handle types, the error
// boundary, argument checks and the mapping of FTorch enumerators to c10 types.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <utility>

#include "ftorch_c.h"

struct ftc_tensor_s {
  at::Tensor t;
};

struct ftc_model_s {
  torch::jit::Module m;
};

namespace ftc {

// An error we raise ourselves, with the status it maps to.
class Error : public std::runtime_error {
 public:
  Error(int status, const std::string &msg) : std::runtime_error(msg), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

[[noreturn]] inline void fail(int status, const std::string &msg) { throw Error(status, msg); }

void set_last_error(std::string msg) noexcept;
void clear_last_error() noexcept;
// Throws Error(FTC_ERR_VERSION) when the loaded LibTorch is not the one we were built with.
void require_runtime();

std::atomic<int64_t> &live_handles();

// The C boundary: run body, translate every exception into a status and a thread-local message.
template <class Body>
int guard(Body &&body) noexcept {
  try {
    require_runtime();
    body();
    clear_last_error();
    return FTC_OK;
  } catch (const Error &e) {
    set_last_error(e.what());
    return e.status();
  } catch (const c10::Error &e) {
    set_last_error(e.what_without_backtrace());
    return FTC_ERR_TORCH;
  } catch (const std::bad_alloc &) {
    set_last_error("out of memory");
    return FTC_ERR_INTERNAL;
  } catch (const std::exception &e) {
    set_last_error(e.what());
    return FTC_ERR_TORCH;
  } catch (...) {
    set_last_error("unknown C++ exception");
    return FTC_ERR_INTERNAL;
  }
}

inline at::Tensor &tensor_of(ftc_tensor h, const char *what = "tensor") {
  if (h == nullptr) {
    fail(FTC_ERR_NULL_HANDLE, std::string(what) + " is not constructed (null handle)");
  }
  return h->t;
}

inline torch::jit::Module &model_of(ftc_model h) {
  if (h == nullptr) fail(FTC_ERR_NULL_HANDLE, "model is not loaded (null handle)");
  return h->m;
}

template <class T>
T *new_handle(T *h) {
  ++live_handles();
  return h;
}

template <class T>
void delete_handle(T *&h) noexcept {
  if (h != nullptr) {
    delete h;
    h = nullptr;
    --live_handles();
  }
}

// FTorch dtype enumerator -> c10 scalar type (int8/16/32/64, float32/64 only).
c10::ScalarType scalar_type(int dtype);
// FTorch device enumerator + index -> a device that is available, or Error(FTC_ERR_DEVICE).
c10::Device device(int device_type, int device_index);
// c10 device type -> FTorch enumerator.
int device_type_code(c10::DeviceType type);

std::string shape_string(c10::IntArrayRef sizes);

}  // namespace ftc
