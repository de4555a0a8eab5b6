// runtime.cpp - errors, versions, device availability and live-handle count of the C layer.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>

#include <ATen/detail/XPUHooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <torch/cuda.h>

#include "internal.hpp"

namespace ftc {

// What a thread's catch scopes say when it ends (thread_state.hpp).
CatchScopes::~CatchScopes() {
  size_t open = 0;
  const CatchScope *failed = nullptr;
  for (const CatchScope &scope : *this) {
    if (scope.barrier) continue;
    ++open;
    if (failed == nullptr && scope.status != FTC_OK) failed = &scope;
  }
  if (failed == nullptr) return;
  std::fprintf(stderr, "FTorch warning: %zu catch scope%s begun by torch_catch_begin %s never ended "
               "(torch_catch_end); it kept this failure, which stopped nothing: %s\n", open,
               open == 1 ? "" : "s", open == 1 ? "was" : "were", failed->message.c_str());
  std::fflush(stderr);
}

namespace {

std::string public_version(const std::string &v) { return v.substr(0, v.find('+')); }

// The version of the LibTorch loaded in this process: found next to the shared library that
// defines a c10 symbol (torch/lib/libc10.so -> torch/version.py, or libtorch's build-version).
std::string detect_runtime_version() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&c10::GetCPUAllocator), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::string lib(info.dli_fname);
  std::string dir = lib.substr(0, lib.rfind('/'));  // .../torch/lib
  std::string root = dir.substr(0, dir.rfind('/'));  // .../torch
  {
    std::ifstream py(root + "/version.py");
    std::string line;
    std::regex re("^__version__\\s*=\\s*['\"]([^'\"]+)['\"]");
    std::smatch m;
    while (py && std::getline(py, line)) {
      if (std::regex_search(line, m, re)) return m[1];
    }
  }
  std::ifstream bv(root + "/build-version");
  std::string v;
  if (bv && std::getline(bv, v)) return v;
  return "";
}

struct RuntimeState {
  std::string runtime_version;
  std::string problem;  // empty when the runtime matches
};

const RuntimeState &runtime_state() {
  static const RuntimeState state = [] {
    RuntimeState s;
    s.runtime_version = detect_runtime_version();
    const std::string built = FTORCH_TORCH_VERSION;
    if (!s.runtime_version.empty() && public_version(s.runtime_version) != public_version(built)) {
      s.problem = "torch version mismatch: this FTorch was built against torch " + built +
                  " but the LibTorch loaded at run time is torch " + s.runtime_version +
                  "; reinstall FTorch against the installed torch (pip install --force-reinstall "
                  "--no-build-isolation ftorch) or install torch==" + public_version(built);
    }
    return s;
  }();
  return state;
}

}  // namespace

void set_last_error(std::string msg) noexcept {
  try {
    thread_state().last_error = std::move(msg);
  } catch (...) {
  }
}

std::string last_error_message() { return last_error_ref(); }

const std::string &last_error_ref() noexcept {
  static const std::string none;
  try {
    return thread_state().last_error;
  } catch (...) {
    return none;  // no memory for this thread's state: it has no error recorded either
  }
}

int report_exception() noexcept {
  try {
    throw;
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

void check_runtime() {
  const RuntimeState &s = runtime_state();
  if (!s.problem.empty()) fail(FTC_ERR_VERSION, s.problem);
  runtime_checked.store(true, std::memory_order_relaxed);
}

std::string enum_choices(const EnumTable &table, bool (*accepted)(int)) {
  std::string out;
  for (std::size_t i = 0; i < table.size; ++i) {
    const EnumName &e = table.names[i];
    if (accepted != nullptr && !accepted(e.value)) continue;
    out += (out.empty() ? "" : ", ") + std::string(e.name) + " (" + std::to_string(e.value) + ")";
  }
  return out;
}

std::string enum_name(const EnumTable &table, int value, const char *prefix) {
  for (std::size_t i = 0; i < table.size; ++i) {
    std::string name = table.names[i].name;
    if (table.names[i].value != value) continue;
    if (name.rfind(prefix, 0) == 0) name.erase(0, std::strlen(prefix));
    return name;
  }
  return std::to_string(value);
}

void fail_unknown(const EnumTable &table, int value, int status) {
  fail(status, std::string("unknown ") + table.noun + " " + std::to_string(value) + " (one of: " + enum_choices(table) + ")");
}

namespace {
// The one mapping between FTorch's dtype codes (ftorch_enums.fypp) and c10's scalar types, and
// whether tensors made from Fortran arrays (and the dtype arguments of the API) support it.
struct DtypeMapping {
  int code;
  c10::ScalarType type;
  bool supported;
};
constexpr DtypeMapping kDtypes[] = {
    {FTC_UINT8, c10::ScalarType::Byte, false},    {FTC_INT8, c10::ScalarType::Char, true},
    {FTC_INT16, c10::ScalarType::Short, true},    {FTC_INT32, c10::ScalarType::Int, true},
    {FTC_INT64, c10::ScalarType::Long, true},     {FTC_FLOAT16, c10::ScalarType::Half, false},
    {FTC_FLOAT32, c10::ScalarType::Float, true},  {FTC_FLOAT64, c10::ScalarType::Double, true},
    {FTC_BOOL, c10::ScalarType::Bool, false},     {FTC_BFLOAT16, c10::ScalarType::BFloat16, false},
};
// Every code of the table (and no other) is mapped, each once, and no c10 type twice: a dtype
// added to ftorch_enums.fypp without its c10 type here does not compile.
constexpr bool mapping_is_complete() {
  if (std::size(kDtypes) != ftc_dtype_table.size) return false;
  for (std::size_t i = 0; i < ftc_dtype_table.size; ++i) {
    int found = 0;
    for (const auto &d : kDtypes) found += d.code == ftc_dtype_table.names[i].value;
    if (found != 1) return false;
  }
  for (std::size_t i = 0; i < std::size(kDtypes); ++i) {
    for (std::size_t j = i + 1; j < std::size(kDtypes); ++j) {
      if (kDtypes[i].type == kDtypes[j].type) return false;
    }
  }
  return true;
}
static_assert(mapping_is_complete(), "kDtypes must map every FTorch dtype code once (ftorch_enums.fypp)");

bool tensor_dtype(int dtype) {
  for (const auto &d : kDtypes) {
    if (d.code == dtype) return d.supported;
  }
  return false;
}
}  // namespace

c10::ScalarType scalar_type(int dtype) {
  for (const auto &d : kDtypes) {
    if (d.code == dtype && d.supported) return d.type;
  }
  fail(FTC_ERR_DTYPE, "unsupported dtype " + std::to_string(dtype) + " (supported: " +
                          enum_choices(ftc_dtype_table, tensor_dtype) + ")");
}

int dtype_code(c10::ScalarType type) {
  for (const auto &d : kDtypes) {
    if (d.type == type) return d.code;
  }
  fail(FTC_ERR_DTYPE, std::string("a tensor of dtype ") + c10::toString(type) +
                          " has no FTorch dtype code (known: " + enum_choices(ftc_dtype_table) + ")");
}

c10::Device device(int device_type, int device_index) {
  switch (device_type) {
    case FTC_CPU:
      if (device_index > 0) {
        fail(FTC_ERR_DEVICE, "CPU device index must be -1 or 0, got " + std::to_string(device_index));
      }
      return c10::Device(c10::DeviceType::CPU);
    case FTC_CUDA: {
      const int idx = device_index < 0 ? 0 : device_index;
      if (!torch::cuda::is_available()) {
        fail(FTC_ERR_DEVICE, "CUDA/HIP device " + std::to_string(idx) +
                                 " requested but no CUDA/HIP device is available to this LibTorch");
      }
      const auto n = static_cast<int>(torch::cuda::device_count());
      if (idx >= n) {
        fail(FTC_ERR_DEVICE, "CUDA/HIP device index " + std::to_string(idx) + " out of range (" +
                                 std::to_string(n) + " devices)");
      }
      return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(idx));
    }
    case FTC_XPU: {
      const int idx = device_index < 0 ? 0 : device_index;
      if (!at::hasXPU()) fail(FTC_ERR_DEVICE, "XPU device requested but no XPU is available to this LibTorch");
      const int n = static_cast<int>(at::detail::getXPUHooks().getNumGPUs());
      if (idx >= n) {
        fail(FTC_ERR_DEVICE, "XPU device index " + std::to_string(idx) + " out of range (" + std::to_string(n) +
                                 " devices)");
      }
      return c10::Device(c10::DeviceType::XPU, static_cast<c10::DeviceIndex>(idx));
    }
    case FTC_MPS: {
      if (!at::hasMPS()) fail(FTC_ERR_DEVICE, "MPS device requested but MPS is not available to this LibTorch");
      if (device_index > 0) {
        fail(FTC_ERR_DEVICE, "MPS device index must be -1 or 0 (there is one MPS device), got " +
                                 std::to_string(device_index));
      }
      return c10::Device(c10::DeviceType::MPS, 0);
    }
    default:
      fail_unknown(ftc_device_type_table, device_type, FTC_ERR_DEVICE);
  }
}

int device_type_code(c10::DeviceType type) {
  switch (type) {
    case c10::DeviceType::CPU: return FTC_CPU;
    case c10::DeviceType::CUDA: return FTC_CUDA;
    case c10::DeviceType::HIP: return FTC_HIP;
    case c10::DeviceType::XPU: return FTC_XPU;
    case c10::DeviceType::MPS: return FTC_MPS;
    default: return static_cast<int>(type);
  }
}

std::string shape_string(c10::IntArrayRef sizes) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << ']';
  return os.str();
}

}  // namespace ftc

extern "C" {

const char *ftc_last_error(void) { return ftc::last_error_ref().c_str(); }

int64_t ftc_last_error_length(void) { return static_cast<int64_t>(ftc::last_error_ref().size()); }

void ftc_last_error_copy(char *buf, int64_t buflen) {
  if (buf == nullptr || buflen <= 0) return;
  const std::string &message = ftc::last_error_ref();
  const auto n = std::min<int64_t>(buflen, static_cast<int64_t>(message.size()));
  std::memcpy(buf, message.data(), static_cast<size_t>(n));
}

const char *ftc_version(void) { return FTORCH_VERSION; }

const char *ftc_torch_version_built(void) { return FTORCH_TORCH_VERSION; }

const char *ftc_torch_version_runtime(void) {
  // The first call detects the version; that may fail (it reads files): report "" then.
  try {
    return ftc::runtime_state().runtime_version.c_str();
  } catch (...) {
    return "";
  }
}

int ftc_check_runtime(void) {
  return ftc::guard([] {});
}

int ftc_catch_begin(void) {
  try {
    ftc::thread_state().catch_scopes.emplace_back();
    return FTC_OK;
  } catch (...) {  // (only std::bad_alloc can come here)
    ftc::set_last_error("out of memory: no catch scope could be opened");
    return FTC_ERR_INTERNAL;
  }
}

int ftc_catch_record(int status, const char *msg, int64_t msglen) {
  ftc::ThreadState *ts = ftc::existing_thread_state();  // none yet: no scope is open
  if (ts == nullptr || ts->catch_scopes.empty()) return 0;
  auto &scopes = ts->catch_scopes;
  auto &first = scopes.back();
  if (first.status == FTC_OK && status != FTC_OK) {
    first.status = status;
    try {
      if (msg != nullptr && msglen > 0) first.message.assign(msg, static_cast<size_t>(msglen));
    } catch (...) {
    }
  }
  return 1;
}

int ftc_catch_end(int *status) {
  ftc::ThreadState *ts = ftc::existing_thread_state();
  if (ts == nullptr || ts->catch_scopes.empty() || ts->catch_scopes.back().barrier) return 0;
  auto &scopes = ts->catch_scopes;
  ftc::CatchScope scope = std::move(scopes.back());
  scopes.pop_back();
  if (status != nullptr) *status = scope.status;
  if (scope.status != FTC_OK) ftc::set_last_error(std::move(scope.message));
  return 1;
}

int ftc_callback_scope_begin(void) {
  try {
    auto &scopes = ftc::thread_state().catch_scopes;
    scopes.emplace_back();
    scopes.back().barrier = true;
    return FTC_OK;
  } catch (...) {  // (only std::bad_alloc can come here)
    ftc::set_last_error("out of memory: no callback scope could be opened");
    return FTC_ERR_INTERNAL;
  }
}

int ftc_callback_scope_end(int *status) {
  try {  // (no ftc::guard: this call ends the scopes guard would report into; strings may still throw)
    ftc::ThreadState *ts = ftc::existing_thread_state();
    ftc::CatchScopes none;  // (a thread without state has no scope open)
    auto &scopes = ts != nullptr ? ts->catch_scopes : none;
    int first = FTC_OK;
    std::string message;
    int left_open = 0;
    // Unwind to the callback's own scope; the failure recorded first (outermost) wins.
    while (!scopes.empty()) {
      ftc::CatchScope scope = std::move(scopes.back());
      scopes.pop_back();
      if (scope.status != FTC_OK) {
        first = scope.status;
        message = std::move(scope.message);
      }
      if (scope.barrier) break;
      ++left_open;
    }
    if (first == FTC_OK && left_open > 0) {
      first = FTC_ERR_INVALID_ARGUMENT;
      message = "[torch_catch_begin] " + std::to_string(left_open) + " catch scope" + (left_open == 1 ? " was" : "s were") +
                " begun in the callback and not ended (torch_catch_end)";
    }
    if (status != nullptr) *status = first;
    if (first != FTC_OK) ftc::set_last_error(std::move(message));
  } catch (...) {  // (out of memory for a message)
    if (status != nullptr) *status = FTC_ERR_INTERNAL;
  }
  return 1;
}

int ftc_reject(int status, const char *msg, int64_t msglen, const ftc_tensor *handles, int64_t n) {
  const int code = status == FTC_OK ? FTC_ERR_INTERNAL : status;
  return ftc::guard([&] {
    ftc::take_temporaries(handles, n);
    ftc::fail(code, msg != nullptr && msglen > 0 ? std::string(msg, static_cast<size_t>(msglen)) : std::string());
  });
}

int ftc_manual_seed(int64_t seed) {
  return ftc::guard([&] {
    if (seed < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the seed must not be negative, got " + std::to_string(seed));
    torch::manual_seed(static_cast<uint64_t>(seed));
  });
}

int ftc_device_available(int device_type, int device_index) {
  try {
    ftc::device(device_type, device_index);
    return 1;
  } catch (...) {
    return 0;
  }
}

}  // extern "C"
