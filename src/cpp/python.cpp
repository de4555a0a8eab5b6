// python.cpp - C API for embedded Python (ftorch_c_python.h): finds the interpreter of the
// environment our torch belongs to, loads libpython and the stable-ABI bridge libftorch_python
// on first use (this library links neither), and hands tensors over as DLPack capsules.
#include <ATen/DLConvertor.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>

#include <c10/util/SmallVector.h>

#include "arglist.hpp"
#include "ftorch_c_python.h"
#include "python_bridge.h"

namespace ftc {
namespace {

bool is_file(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent(const std::string &path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::string real_path(const std::string &path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

// The file of the shared library that holds `symbol`.
std::string library_of(const void *symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return real_path(info.dli_fname);
}

std::string env(const char *name) {
  const char *v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The interpreter the embedded calls use: that of the environment holding the torch we run on.
struct Location {
  std::string torch_dir;   // .../site-packages/torch
  std::string site_dir;    // .../site-packages
  std::string executable;  // the environment's python (sys.prefix follows from it)
  std::string libpython;   // empty when the process already has Python
};

Location locate(bool need_libpython) {
  Location loc;
  const std::string c10 = library_of(reinterpret_cast<const void *>(&c10::GetAllocator));
  if (c10.empty()) fail(FTC_ERR_PYTHON, "cannot tell where the loaded LibTorch lives (dladdr failed)");
  loc.torch_dir = parent(parent(c10));
  loc.site_dir = parent(loc.torch_dir);

  std::smatch m;
  static const std::regex layout(R"((.*)/lib(?:64)?/python(\d+)\.(\d+)t?/(?:site|dist)-packages)");
  const bool known = std::regex_match(loc.site_dir, m, layout);
  const std::string prefix = known ? m[1].str() : "";
  const std::string version = known ? m[2].str() + "." + m[3].str() : "";

  loc.executable = env("FTORCH_PYTHON");
  if (loc.executable.empty() && known) {
    for (const auto &name : {"python" + version, std::string("python3"), std::string("python")}) {
      if (is_file(prefix + "/bin/" + name)) {
        loc.executable = prefix + "/bin/" + name;
        break;
      }
    }
  }

  loc.libpython = env("FTORCH_LIBPYTHON");
  if (!need_libpython) return loc;
  if (!loc.libpython.empty()) {
    if (!is_file(loc.libpython)) fail(FTC_ERR_PYTHON, "FTORCH_LIBPYTHON=" + loc.libpython + " is not a file");
    return loc;
  }
  if (!known) {
    fail(FTC_ERR_PYTHON, "cannot tell which Python environment the torch at " + loc.torch_dir +
                             " belongs to; set FTORCH_LIBPYTHON to its libpython3.X.so and FTORCH_PYTHON to its "
                             "python executable");
  }
  // The environment's own prefix, and for a virtual environment the interpreter it was made from.
  std::vector<std::string> prefixes{prefix};
  std::ifstream cfg(prefix + "/pyvenv.cfg");
  for (std::string line; std::getline(cfg, line);) {
    static const std::regex home(R"(\s*home\s*=\s*(.*?)\s*)");
    std::smatch h;
    if (std::regex_match(line, h, home)) prefixes.push_back(parent(h[1].str()));
  }
  const std::string name = "libpython" + version + ".so";
  std::vector<std::string> tried;
  for (const auto &p : prefixes) {
    for (const auto &dir : {p + "/lib", p + "/lib64", p + "/lib/x86_64-linux-gnu", p + "/lib/aarch64-linux-gnu",
                            p + "/lib/powerpc64le-linux-gnu"}) {
      for (const auto &file : {dir + "/" + name + ".1.0", dir + "/" + name}) {
        tried.push_back(file);
        if (is_file(file)) {
          loc.libpython = file;
          return loc;
        }
      }
    }
  }
  // The system's library search path (e.g. Debian's /usr/lib/x86_64-linux-gnu).
  void *h = dlopen((name + ".1.0").c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen((name + ".1.0").c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (h != nullptr) {
    loc.libpython = library_of(dlsym(h, "Py_IsInitialized"));
    dlclose(h);
    if (!loc.libpython.empty()) return loc;
  }
  std::string list;
  for (const auto &t : tried) list += "\n  " + t;
  fail(FTC_ERR_PYTHON, "cannot find " + name + " of the Python environment at " + prefix +
                           " (the one holding the torch FTorch runs on); is its Python built with --enable-shared? "
                           "Install the shared library (Debian: apt-get install libpython" + version +
                           ") or set FTORCH_LIBPYTHON. Looked for:" + list);
}

bool python_in_process() { return dlsym(RTLD_DEFAULT, "Py_IsInitialized") != nullptr; }

void dlpack_delete(void *p) {
  auto *m = static_cast<DLManagedTensor *>(p);
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

// Whether an argument is a plain tensor over memory FTorch was given (a Fortran array, device
// memory: the handle's Lifetime is_wrapped), which nothing in LibTorch owns: the bridge may keep a Python
// tensor over it between calls (see make_dlpack).
bool over_callers_memory(const ArgItem &item, const at::Tensor &t) {
  if (item.handle == nullptr || t.layout() != c10::kStrided || t.is_conj() || t.is_neg()) return false;
  const auto *slot = TensorTable::instance().find(item.handle);
  return slot != nullptr && slot->life.is_wrapped();
}

// A DLPack structure for a reusable argument (the at::Tensor of an argument list), or null. It
// holds a tensor of its own over the same memory, not the argument's storage: a Python tensor the
// bridge keeps does not make the Fortran tensor look shared (which would make `=` move its
// contents) and keeps nothing alive (the memory is the caller's).
void *make_dlpack(const void *source) noexcept {
  try {
    const auto &t = *static_cast<const at::Tensor *>(source);
    return at::toDLPack(at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options()));
  } catch (...) {
    return nullptr;
  }
}

// The bridge, started once per process (the first caller does it; a failure is kept and reported
// to every later caller).
struct Runtime {
  std::mutex mutex;
  std::atomic<bool> ready{false};
  bool tried = false;
  std::string error;
  ftc_bridge api{};
};

Runtime &runtime() {
  static Runtime *r = new Runtime();  // never destroyed: finalization runs from atexit
  return *r;
}

void finalize_at_exit() { runtime().api.finalize(); }

void start(Runtime &rt) {
  const bool hosted = python_in_process();  // the program is Python, or loaded it itself
  const Location loc = locate(!hosted);
  if (!hosted) {
    if (dlopen(loc.libpython.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      fail(FTC_ERR_PYTHON, "cannot load " + loc.libpython + ": " + dlerror());
    }
  }
  const std::string bridge = parent(library_of(reinterpret_cast<const void *>(&ftc_pymodule_load))) +
                             "/libftorch_python.so";
  void *h = dlopen(bridge.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const std::string reason = dlerror();
    fail(FTC_ERR_PYTHON, "cannot load FTorch's Python bridge " + bridge + ": " + reason +
                             (is_file(bridge) ? std::string()
                                              : " (FTorch was built without Python's C headers: install them, e.g. "
                                                "apt-get install python3-dev, and reinstall FTorch)"));
  }
  using Entry = int (*)(int, ftc_bridge *);
  auto entry = reinterpret_cast<Entry>(dlsym(h, "ftorch_python_bridge"));
  if (entry == nullptr || entry(FTC_BRIDGE_VERSION, &rt.api) != 0) {
    fail(FTC_ERR_PYTHON, bridge + " is not the Python bridge of this FTorch version");
  }
  if (rt.api.initialize(loc.executable.c_str(), loc.site_dir.c_str(), FTORCH_TORCH_VERSION, loc.torch_dir.c_str(),
                        dlpack_delete, make_dlpack) != 0) {
    fail(FTC_ERR_PYTHON, std::string("cannot start the embedded Python (") +
                             (loc.libpython.empty() ? std::string("the program's own interpreter") : loc.libpython) +
                             "): " + rt.api.last_error());
  }
  std::atexit(finalize_at_exit);
}

const ftc_bridge &bridge() {
  Runtime &rt = runtime();
  if (!rt.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(rt.mutex);
    if (!rt.tried) {
      rt.tried = true;
      try {
        start(rt);
        rt.ready.store(true, std::memory_order_release);
      } catch (const Error &e) {
        rt.error = e.what();
      } catch (const std::exception &e) {
        rt.error = std::string("starting the embedded interpreter failed: ") + e.what();
      } catch (...) {
        rt.error = "starting the embedded interpreter failed (unknown exception)";
      }
    }
    if (!rt.ready.load(std::memory_order_relaxed)) fail(FTC_ERR_PYTHON, rt.error);
  }
  return rt.api;
}

// A loaded module: a reference into the interpreter, dropped with the last handle.
struct PyModule {
  void *object = nullptr;
  std::string name;
  PyModule() = default;
  PyModule(const PyModule &) = delete;
  PyModule &operator=(const PyModule &) = delete;
  ~PyModule() {
    if (object != nullptr) runtime().api.release(object);
  }
};

using PyModuleTable = HandleTable<std::shared_ptr<PyModule>>;

std::shared_ptr<PyModule> pymodule_of(ftc_pymodule h) {
  auto *s = PyModuleTable::instance().find(h);
  if (s == nullptr || !s->value) bad_handle(h, "Python module", "Python module");
  return s->value;
}

// The results of a call, as the bridge hands them over (under the GIL: nothing here may throw).
struct Results {
  ArgList items;
  std::string error;
};

int collect(void *ctx, const ftc_bridge_value *v) {
  auto &r = *static_cast<Results *>(ctx);
  try {
    ArgItem item;
    item.kind = v->kind;
    switch (v->kind) {
      case FTC_ARG_TENSOR: {
        void *p = v->dlpack;
        try {
          item.value = at::fromDLPack(static_cast<DLManagedTensor *>(p));
        } catch (...) {
          dlpack_delete(p);
          throw;
        }
        break;
      }
      case FTC_ARG_STRING: item.text.assign(v->text, static_cast<size_t>(v->length)); break;
      case FTC_ARG_REAL: item.real = v->real; break;
      default: item.integer = v->integer; break;
    }
    r.items.push_back(std::move(item));
    return 0;
  } catch (const c10::Error &e) {
    r.error = e.what_without_backtrace();
  } catch (const std::exception &e) {
    r.error = e.what();
  }
  return 1;
}

// The arguments as bridge values; the tensors' DLPack structures are freed unless handed over.
class Arguments {
 public:
  // The first n_grouped items (none when negative) go as one Python list.
  explicit Arguments(const ArgList &list, int64_t n_grouped = -1) {
    if (n_grouped < -1) fail(FTC_ERR_INVALID_ARGUMENT, "n_grouped must be -1 (no group) or at least 0, got " +
                                                        std::to_string(n_grouped));
    if (n_grouped > static_cast<int64_t>(list.size())) {
      fail(FTC_ERR_INVALID_ARGUMENT, "cannot group " + std::to_string(n_grouped) + " arguments: the list has " +
                                         std::to_string(list.size()));
    }
    values_.reserve(list.size() + 1);
    if (n_grouped >= 0) {
      ftc_bridge_value group{};
      group.kind = FTC_BRIDGE_LIST;
      group.integer = n_grouped;
      values_.push_back(group);
    }
    try {
      add(list);
    } catch (...) {  // the tensors handed to DLPack so far are freed: the destructor will not run
      release();
      throw;
    }
  }
  ~Arguments() {
    if (owned_) release();
  }
  Arguments(const Arguments &) = delete;
  Arguments &operator=(const Arguments &) = delete;
  // The bridge takes every tensor, whatever happens in the call.
  const ftc_bridge_value *hand_over() {
    owned_ = false;
    return values_.data();
  }
  int64_t size() const { return static_cast<int64_t>(values_.size()); }

 private:
  void add(const ArgList &list) {
    int64_t position = 0;
    for (const auto &item : list) {
      ++position;
      ftc_bridge_value v{};
      v.kind = item.kind;
      switch (item.kind) {
        case FTC_ARG_TENSOR: {
          const at::Tensor &t = item_tensor(item);
          v.requires_grad = t.requires_grad() ? 1 : 0;
          if (v.requires_grad == 0 && over_callers_memory(item, t)) {
            v.reusable = 1;
            v.source = &t;
            v.layout = {t.data_ptr(), static_cast<int32_t>(t.device().type()), t.device().index(),
                        static_cast<int32_t>(t.scalar_type()), static_cast<int32_t>(t.dim()), t.sizes().data(),
                        t.strides().data(), t.storage_offset()};
          } else {
            try {
              // DLPack carries memory, not the lazy conjugate and negative bits: resolved first.
              v.dlpack = at::toDLPack(t.resolve_conj().resolve_neg());
            } catch (const c10::Error &e) {
              fail(FTC_ERR_INVALID_ARGUMENT, "argument " + std::to_string(position) +
                                                 " cannot be passed to Python: " + e.what_without_backtrace());
            }
          }
          break;
        }
        case FTC_ARG_REAL: v.real = item.real; break;
        case FTC_ARG_STRING:
          v.text = item.text.data();
          v.length = static_cast<int64_t>(item.text.size());
          break;
        default: v.integer = item.integer; break;
      }
      values_.push_back(v);
    }
  }
  void release() {
    for (const auto &v : values_) {
      if (v.kind == FTC_ARG_TENSOR && v.dlpack != nullptr) dlpack_delete(v.dlpack);
    }
    values_.clear();
  }

  c10::SmallVector<ftc_bridge_value, 8> values_;  // (no allocation for a call of up to 8 arguments)
  bool owned_ = true;
};

}  // namespace
}  // namespace ftc

extern "C" {

int ftc_pymodule_load(ftc_pymodule *out, const char *name) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    if (name == nullptr || name[0] == '\0') ftc::fail(FTC_ERR_INVALID_ARGUMENT, "Python module name is empty");
    const auto &api = ftc::bridge();
    auto module = std::make_shared<ftc::PyModule>();
    module->name = name;
    if (api.load(name, &module->object) != 0) ftc::fail(FTC_ERR_PYTHON, api.last_error());
    ftc::replace_handle<ftc::PyModuleTable>(out, std::move(module));
  });
}

int ftc_pymodule_delete(ftc_pymodule *m) { return ftc::delete_handle<ftc::PyModuleTable>(m); }

void ftc_pymodule_release(ftc_pymodule m) { ftc::PyModuleTable::instance().release(m); }

int ftc_pymodule_share(ftc_pymodule src, ftc_pymodule *dst) {
  return ftc::share<ftc::PyModuleTable>(src, dst, "Python module");
}

int ftc_pymodule_call(ftc_pymodule m, const char *name, ftc_arglist args, ftc_arglist *results,
                      const ftc_tensor *outputs, int n_outputs) {
  return ftc_pymodule_call_grouped(m, name, args, -1, results, outputs, n_outputs);
}

int ftc_pymodule_call_grouped(ftc_pymodule m, const char *name, ftc_arglist args, int64_t n_grouped,
                              ftc_arglist *results, const ftc_tensor *outputs, int n_outputs) {
  return ftc::guard([&] {
    ftc::note_step();
    ftc::take_temporaries(outputs, n_outputs);
    const auto module = ftc::pymodule_of(m);
    if (name == nullptr || name[0] == '\0') ftc::fail(FTC_ERR_INVALID_ARGUMENT, "Python function name is empty");
    if (n_outputs < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "negative number of output tensors");
    ftc::check_tensors(outputs, n_outputs, "output tensor");
    if (results != nullptr && *results != nullptr) ftc::arglist_of(*results, false);  // a bad results handle fails before Python runs
    const auto &api = ftc::bridge();
    ftc::Arguments arguments(ftc::arglist_of(args), n_grouped);
    ftc::Results r;
    const int64_t n = arguments.size();
    if (api.call(module->object, name, arguments.hand_over(), n, ftc::collect, &r) != 0) {
      ftc::fail(FTC_ERR_PYTHON, r.error.empty() ? std::string(api.last_error())
                                                : std::string("result of ") + name + "(): " + r.error);
    }
    if (n_outputs > 0) {
      std::vector<const at::Tensor *> tensors;
      for (const auto &item : r.items) {
        if (item.kind == FTC_ARG_TENSOR) tensors.push_back(&item.value);
      }
      if (static_cast<int>(tensors.size()) != n_outputs) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(name) + "() returned " + std::to_string(tensors.size()) +
                                                " tensor" + (tensors.size() == 1 ? "" : "s") + " but " +
                                                std::to_string(n_outputs) + " output tensors were given");
      }
      const std::string source = std::string(name) + "() returned";
      std::vector<at::Tensor> values;
      for (const at::Tensor *t : tensors) values.push_back(*t);
      ftc::store_results(outputs, values, source.c_str());
    }
    if (results != nullptr) ftc::set_results(results, std::move(r.items));
  });
}

int ftc_python_loaded(void) { return ftc::python_in_process() ? 1 : 0; }

int ftc_python_initialize(void) {
  return ftc::guard([] { ftc::bridge(); });
}

int ftc_python_locate(char *buf, int64_t buflen) {
  return ftc::guard([&] {
    if (buf == nullptr || buflen <= 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "buffer is null or empty");
    const auto loc = ftc::locate(true);
    const std::string text = loc.libpython + "\n" + loc.executable;
    const auto n = static_cast<int64_t>(text.size());
    if (n >= buflen) {  // never cut short: a truncated path would name another file
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "buffer of " + std::to_string(buflen) + " bytes is too small for the " +
                                              std::to_string(n + 1) + " bytes of the paths (with the terminating NUL)");
    }
    std::memcpy(buf, text.data(), static_cast<size_t>(n));
    buf[n] = '\0';
  });
}

}  // extern "C"
