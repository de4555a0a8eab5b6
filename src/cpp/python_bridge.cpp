// python_bridge.cpp - libftorch_python: the Python side of embedded calls, written against
// Python's stable C API only (no torch headers, no libtorch_python), so one build serves every
// Python version >= 3.9. It is loaded by libftorch_c on first use; libpython is already in the
// process then (loaded by libftorch_c, or the program is Python itself).
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "ftorch_c_enums.h"
#include "python_bridge.h"

namespace {

thread_local std::string last_error;

// Set once by initialize (under libftorch_c's lock), read-only afterwards (but the last function
// name, which calls change holding the GIL).
struct State {
  bool started_here = false;      // we called Py_Initialize (and finalize at exit)
  std::atomic<bool> finalized{false};  // (read by any thread, set at exit)
  PyThreadState *main_state = nullptr;
  std::thread::id init_thread;
  void (*dlpack_delete)(void *) = nullptr;
  void *(*make_dlpack)(const void *) = nullptr;
  PyObject *from_dlpack = nullptr;  // torch.utils.dlpack.from_dlpack
  PyObject *to_dlpack = nullptr;    // torch.utils.dlpack.to_dlpack
  PyObject *tensor_type = nullptr;  // torch.Tensor
  PyObject *load = nullptr;         // ftorch._embed.load
  PyObject *describe = nullptr;     // ftorch._embed.describe
  // The name of the function called last, and its Python string (changed under the GIL).
  std::string last_function_text;
  PyObject *last_function = nullptr;
} state;

const char kCapsuleName[] = "dltensor";
const char kUsedCapsuleName[] = "used_dltensor";

// Runs with the GIL held for as long as it lives (any thread, any number of times).
class Gil {
 public:
  Gil() : s_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(s_); }
  Gil(const Gil &) = delete;
  Gil &operator=(const Gil &) = delete;

 private:
  PyGILState_STATE s_;
};

// An owned reference, released at scope exit.
class Ref {
 public:
  explicit Ref(PyObject *p = nullptr) : p_(p) {}
  ~Ref() { Py_XDECREF(p_); }
  Ref(const Ref &) = delete;
  Ref &operator=(const Ref &) = delete;
  PyObject *get() const { return p_; }
  PyObject *release() {
    PyObject *p = p_;
    p_ = nullptr;
    return p;
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject *p_;
};

// A Python string as UTF-8 into out; false (the Python error pending) when UTF-8 cannot hold it.
bool utf8_into(PyObject *o, std::string &out) {
  Ref bytes(PyUnicode_AsUTF8String(o));
  char *data = nullptr;
  Py_ssize_t n = 0;
  if (!bytes || PyBytes_AsStringAndSize(bytes.get(), &data, &n) != 0) return false;
  out.assign(data, static_cast<size_t>(n));
  return true;
}

// The same for messages: a stand-in when it cannot be converted.
std::string utf8(PyObject *o) {
  std::string text;
  if (o == nullptr || !utf8_into(o, text)) {
    PyErr_Clear();
    return "<unprintable>";
  }
  return text;
}

// The pending Python exception as "Type: message" + traceback (it is cleared); returns 1.
int python_failure(const std::string &context) {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if (type == nullptr) {
    last_error = context + ": failed without a Python exception";
    return 1;
  }
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
  Ref t(type), v(value), b(tb);
  std::string text;
  if (state.describe != nullptr) {
    Ref d(PyObject_CallFunctionObjArgs(state.describe, t.get(), v.get() ? v.get() : Py_None,
                                       b.get() ? b.get() : Py_None, nullptr));
    if (d) {
      text = utf8(d.get());
    } else {
      PyErr_Clear();
    }
  }
  if (text.empty()) {
    Ref name(PyObject_GetAttrString(t.get(), "__name__"));
    Ref str(v ? PyObject_Str(v.get()) : nullptr);
    PyErr_Clear();
    text = (name ? utf8(name.get()) : std::string("exception")) + ": " + (str ? utf8(str.get()) : std::string());
  }
  last_error = context + ": " + text;
  return 1;
}

int fail(const std::string &message) {
  last_error = message;
  return 1;
}

void capsule_destructor(PyObject *capsule) {
  // A capsule nobody consumed still owns its tensor. The exception that made it unconsumed (a
  // failed _from_dlpack) is pending: it is kept for the caller's message.
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if (PyCapsule_IsValid(capsule, kCapsuleName)) {
    void *p = PyCapsule_GetPointer(capsule, kCapsuleName);
    if (p != nullptr && state.dlpack_delete != nullptr) state.dlpack_delete(p);
  }
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

PyObject *import_attr(const char *module, const char *name) {
  Ref m(PyImport_ImportModule(module));
  if (!m) return nullptr;
  return PyObject_GetAttrString(m.get(), name);
}

// Python tensors made for reusable arguments (memory the caller owns), kept per position of the
// call's arguments and passed again while they still match -- as a Python caller passes the same
// tensor object each step. Making a tensor from DLPack and freeing it is most of a call's cost
// (both touch code the Python function's work has pushed out of the caches). Changed under the GIL.
struct KeptTensor {
  PyObject *tensor = nullptr;  // the tensor Python got (a strong reference)
  long long version = 0;       // its version counter then (every in-place operation bumps it)
  ftc_bridge_layout layout{};  // what it was made for (sizes and strides below)
  int64_t sizes[8] = {0};
  int64_t strides[8] = {0};
};
constexpr Py_ssize_t kKeptPositions = 8;
KeptTensor kept[kKeptPositions];
PyObject *name_requires_grad = nullptr;  // interned attribute names
PyObject *name_grad = nullptr;
PyObject *name_backward_hooks = nullptr;
PyObject *name_version = nullptr;

void forget(KeptTensor &k) { Py_CLEAR(k.tensor); }

// A tensor's version counter, or -1 with no Python error left.
long long version_of(PyObject *tensor) {
  Ref v(PyObject_GetAttr(tensor, name_version));
  const long long n = v ? PyLong_AsLongLong(v.get()) : -1;
  if (n < 0) PyErr_Clear();
  return n;
}

// Whether k was made for the same memory and layout as t.
bool describes(const KeptTensor &k, const ftc_bridge_layout &t) {
  const ftc_bridge_layout &m = k.layout;
  if (m.data != t.data || m.device_type != t.device_type || m.device_index != t.device_index || m.dtype != t.dtype ||
      m.ndim != t.ndim || m.offset != t.offset) {
    return false;
  }
  return std::equal(t.sizes, t.sizes + t.ndim, k.sizes) && std::equal(t.strides, t.strides + t.ndim, k.strides);
}

// Whether a kept tensor is as it was made: nothing in Python refers to it, no in-place operation
// ran on it (on values, or on sizes and strides: resize_, t_, unsqueeze_, set_ ... all bump the
// version counter), it does not require grad and has neither a gradient nor hooks (which a call
// that switched requires_grad on and off again leaves). Clears a Python error.
bool unchanged(const KeptTensor &k) {
  if (Py_REFCNT(k.tensor) != 1 || version_of(k.tensor) != k.version) return false;
  Ref requires_grad(PyObject_GetAttr(k.tensor, name_requires_grad));
  Ref grad(requires_grad.get() == Py_False ? PyObject_GetAttr(k.tensor, name_grad) : nullptr);
  Ref hooks(grad.get() == Py_None ? PyObject_GetAttr(k.tensor, name_backward_hooks) : nullptr);
  PyErr_Clear();
  return hooks.get() == Py_None;
}

PyObject *to_python(const ftc_bridge_value &v);

// Argument `position` of a call as a Python object: the tensor kept for that position when it
// still stands for v, else a new one, kept if v is reusable.
PyObject *argument_to_python(const ftc_bridge_value &v, Py_ssize_t position) {
  if (v.kind != FTC_ARG_TENSOR || v.reusable == 0 || position >= kKeptPositions) return to_python(v);
  const ftc_bridge_layout &t = v.layout;
  KeptTensor &k = kept[position];
  if (k.tensor != nullptr) {
    if (describes(k, t) && unchanged(k)) {
      Py_INCREF(k.tensor);
      return k.tensor;
    }
    forget(k);
  }
  PyObject *tensor = to_python(v);
  if (tensor == nullptr || t.ndim > 8) return tensor;
  KeptTensor fresh;
  fresh.version = version_of(tensor);
  if (fresh.version < 0) return tensor;  // passed, not kept
  fresh.layout = t;
  std::copy(t.sizes, t.sizes + t.ndim, fresh.sizes);
  std::copy(t.strides, t.strides + t.ndim, fresh.strides);
  fresh.layout.sizes = fresh.layout.strides = nullptr;  // (the arrays above hold them)
  Py_INCREF(tensor);
  fresh.tensor = tensor;
  forget(k);  // (what another thread kept here while to_python ran Python code)
  k = fresh;
  return tensor;
}

// One argument as a Python object (a new reference), or nullptr with a Python error set.
PyObject *to_python(const ftc_bridge_value &v) {
  switch (v.kind) {
    case FTC_ARG_TENSOR: {
      void *dlpack = v.dlpack != nullptr ? v.dlpack : state.make_dlpack(v.source);
      if (dlpack == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "cannot hand the tensor to Python (DLPack)");
        return nullptr;
      }
      PyObject *capsule = PyCapsule_New(dlpack, kCapsuleName, capsule_destructor);
      if (capsule == nullptr) {
        state.dlpack_delete(dlpack);
        return nullptr;
      }
      Ref cap(capsule);
      Ref tensor(PyObject_CallFunctionObjArgs(state.from_dlpack, cap.get(), nullptr));
      if (!tensor) return nullptr;
      if (v.requires_grad != 0) {
        Ref r(PyObject_CallMethod(tensor.get(), "requires_grad_", nullptr));
        if (!r) return nullptr;
      }
      return tensor.release();
    }
    case FTC_ARG_INT: return PyLong_FromLongLong(v.integer);
    case FTC_ARG_REAL: return PyFloat_FromDouble(v.real);
    case FTC_ARG_LOGICAL: return PyBool_FromLong(static_cast<long>(v.integer));
    case FTC_ARG_STRING: return PyUnicode_FromStringAndSize(v.text, static_cast<Py_ssize_t>(v.length));
    default: PyErr_SetString(PyExc_ValueError, "unknown argument kind"); return nullptr;
  }
}

// One result to the sink; 0, or 1 with last_error set (the Python error, if any, cleared).
int from_python(PyObject *item, Py_ssize_t index, const char *function, ftc_bridge_sink sink, void *ctx) {
  ftc_bridge_value v{};
  std::string text;
  // Named only in messages: made on failure (this runs for every result of every call).
  auto where = [&] { return std::string("result ") + std::to_string(index + 1) + " of " + function + "()"; };
  if (PyBool_Check(item)) {
    v.kind = FTC_ARG_LOGICAL;
    v.integer = item == Py_True ? 1 : 0;
  } else if (PyLong_Check(item)) {
    v.kind = FTC_ARG_INT;
    v.integer = PyLong_AsLongLong(item);
    if (v.integer == -1 && PyErr_Occurred() != nullptr) return python_failure(where());
  } else if (PyFloat_Check(item)) {
    v.kind = FTC_ARG_REAL;
    v.real = PyFloat_AsDouble(item);
  } else if (PyUnicode_Check(item)) {
    v.kind = FTC_ARG_STRING;
    if (!utf8_into(item, text)) return python_failure(where());  // (an error, not a stand-in)
    v.text = text.data();
    v.length = static_cast<int64_t>(text.size());
  } else {
    const int is_tensor = PyObject_IsInstance(item, state.tensor_type);
    if (is_tensor < 0) return python_failure(where());
    if (is_tensor == 0) {
      Ref type(PyObject_Type(item));
      Ref name(type ? PyObject_GetAttrString(type.get(), "__name__") : nullptr);
      PyErr_Clear();
      return fail(where() + " is a " + (name ? utf8(name.get()) : std::string("?")) +
                  "; return tensors, integers, floats, bools or strings (or a tuple or list of them)");
    }
    Ref detached(PyObject_CallMethod(item, "detach", nullptr));
    if (!detached) return python_failure(where());
    // DLPack carries memory, not torch's lazy conjugate and negative bits (z.conj().imag): the
    // values they stand for are made real first (no copy where neither is set).
    Ref conj_resolved(PyObject_CallMethod(detached.get(), "resolve_conj", nullptr));
    if (!conj_resolved) return python_failure(where());
    Ref resolved(PyObject_CallMethod(conj_resolved.get(), "resolve_neg", nullptr));
    if (!resolved) return python_failure(where());
    Ref cap(PyObject_CallFunctionObjArgs(state.to_dlpack, resolved.get(), nullptr));
    if (!cap) return python_failure(where());
    void *p = PyCapsule_GetPointer(cap.get(), kCapsuleName);
    if (p == nullptr) return python_failure(where());
    if (PyCapsule_SetName(cap.get(), kUsedCapsuleName) != 0) return python_failure(where());
    v.kind = FTC_ARG_TENSOR;
    v.dlpack = p;  // ours now: the renamed capsule no longer frees it
  }
  if (sink(ctx, &v) != 0) return fail(where() + ": out of memory");
  return 0;
}

int bridge_initialize(const char *program, const char *site_dir, const char *torch_version, const char *torch_dir,
                      void (*dlpack_delete)(void *), void *(*make_dlpack)(const void *)) {
  state.dlpack_delete = dlpack_delete;
  state.make_dlpack = make_dlpack;
  if (Py_IsInitialized() == 0) {
    // Py_SetProgramName makes sys.prefix (and a virtual environment's site-packages) follow the
    // environment's interpreter rather than the Fortran executable; it is deprecated, so it is
    // looked up rather than linked.
    using SetProgramName = void (*)(const wchar_t *);
    auto set_name = reinterpret_cast<SetProgramName>(dlsym(RTLD_DEFAULT, "Py_SetProgramName"));
    if (set_name != nullptr && program != nullptr && program[0] != '\0') {
      static wchar_t *name = Py_DecodeLocale(program, nullptr);  // must outlive the interpreter
      if (name != nullptr) set_name(name);
    }
    // Python stops the whole program when it cannot start (no standard library where PYTHONHOME
    // points, a module system's setting for another Python): that case is refused here instead.
    const char *home = std::getenv("PYTHONHOME");
    if (home != nullptr && home[0] != '\0') {
      std::string prefix(home);
      prefix = prefix.substr(0, prefix.find(':'));  // PYTHONHOME=prefix:exec_prefix
      // The version of the libpython loaded (this bridge serves several): "3.12.1 (main, ...".
      std::string version(Py_GetVersion());
      const size_t first_dot = version.find('.');
      version = version.substr(0, version.find_first_not_of("0123456789", first_dot + 1));
      // Where Python looks for its standard library: lib/ or lib64/ (PLATLIBDIR), as a folder or
      // a zip file (python312.zip).
      std::string zipped = version;
      zipped.erase(std::remove(zipped.begin(), zipped.end(), '.'), zipped.end());
      bool found = false;
      for (const char *lib : {"/lib", "/lib64"}) {
        struct stat info {};
        const std::string folder = prefix + lib + "/python" + version + "/encodings";
        const std::string zip = prefix + lib + "/python" + zipped + ".zip";
        found = found || (stat(folder.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) ||
                (stat(zip.c_str(), &info) == 0 && S_ISREG(info.st_mode));
      }
      if (!found) {
        return fail("PYTHONHOME=" + std::string(home) + " has no standard library of Python " + version + " (no " +
                    prefix + "/lib/python" + version + "/encodings, nor lib64/ or a python" + zipped +
                    ".zip there): Python would stop the program at start-up. Unset PYTHONHOME, or point it at "
                    "the Python that FTorch was installed with (its prefix)");
      }
    }
    Py_InitializeEx(0);  // 0: leave the program's signal handlers alone
    if (Py_IsInitialized() == 0) return fail("Py_InitializeEx failed");
    state.started_here = true;
    state.init_thread = std::this_thread::get_id();
  }
  int status = 0;
  {
    Gil gil;
    // The environment's site-packages first (it holds torch and ftorch), with its .pth files.
    Ref addsitedir(import_attr("site", "addsitedir"));
    Ref sys_path(import_attr("sys", "path"));
    if (!addsitedir || !sys_path) {
      status = python_failure("cannot set up sys.path");
    } else {
      Ref site(PyUnicode_DecodeFSDefault(site_dir));
      const int present = site ? PySequence_Contains(sys_path.get(), site.get()) : -1;
      if (present < 0) {
        status = python_failure("cannot set up sys.path");
      } else if (present == 0) {
        Ref r(PyObject_CallFunctionObjArgs(addsitedir.get(), site.get(), nullptr));
        // addsitedir appends: move the environment's directory to the front.
        if (!r || PySequence_DelItem(sys_path.get(), PySequence_Index(sys_path.get(), site.get())) != 0 ||
            PyList_Insert(sys_path.get(), 0, site.get()) != 0) {
          status = python_failure("cannot add " + std::string(site_dir) + " to sys.path");
        }
      }
    }
    if (status == 0) {
      Ref embed(PyImport_ImportModule("ftorch._embed"));
      if (!embed) {
        status = python_failure("cannot import ftorch._embed from " + std::string(site_dir));
      } else {
        state.describe = PyObject_GetAttrString(embed.get(), "describe");
        Ref check(PyObject_GetAttrString(embed.get(), "check_torch"));
        Ref ok(check ? PyObject_CallFunction(check.get(), "ss", torch_version, torch_dir) : nullptr);
        if (!ok) {
          status = python_failure("the embedded Python cannot use the torch FTorch was built with");
        } else {
          state.load = PyObject_GetAttrString(embed.get(), "load");
          // The converter itself for capsules (torch.utils.dlpack.from_dlpack is a Python function
          // that inspects its argument first and then calls it).
          state.from_dlpack = import_attr("torch._C", "_from_dlpack");
          if (state.from_dlpack == nullptr) {
            PyErr_Clear();
            state.from_dlpack = import_attr("torch.utils.dlpack", "from_dlpack");
          }
          state.to_dlpack = import_attr("torch.utils.dlpack", "to_dlpack");
          state.tensor_type = import_attr("torch", "Tensor");
          name_requires_grad = PyUnicode_InternFromString("requires_grad");
          name_grad = PyUnicode_InternFromString("grad");
          name_backward_hooks = PyUnicode_InternFromString("_backward_hooks");
          name_version = PyUnicode_InternFromString("_version");
          if (state.load == nullptr || state.from_dlpack == nullptr || state.to_dlpack == nullptr ||
              state.tensor_type == nullptr || name_requires_grad == nullptr || name_grad == nullptr ||
              name_backward_hooks == nullptr || name_version == nullptr) {
            status = python_failure("cannot find torch's DLPack functions");
          }
        }
      }
    }
  }
  // Control goes back to Fortran without the GIL: other threads may call Python, and the
  // autograd engine (PyTorch's Python engine, now that torch is imported) may run.
  if (state.started_here && state.main_state == nullptr) state.main_state = PyEval_SaveThread();
  return status;
}

int bridge_load(const char *name, void **module) {
  Gil gil;
  Ref arg(PyUnicode_DecodeFSDefault(name));
  Ref m(arg ? PyObject_CallFunctionObjArgs(state.load, arg.get(), nullptr) : nullptr);
  if (!m) return python_failure("cannot load Python module '" + std::string(name) + "'");
  *module = m.release();
  return 0;
}

void bridge_release(void *module) {
  if (module == nullptr || state.finalized || Py_IsInitialized() == 0) return;
  Gil gil;
  Py_DECREF(static_cast<PyObject *>(module));
}

// The function's name as a Python string (a new reference), kept for the next call (the GIL
// guards it): a loop calling one function looks the attribute up by an interned, hashed name
// instead of making and hashing a new string each call.
PyObject *function_name(const char *function) {
  if (state.last_function == nullptr || state.last_function_text != function) {
    PyObject *fresh = PyUnicode_InternFromString(function);
    if (fresh == nullptr) return nullptr;
    Py_XDECREF(state.last_function);
    state.last_function = fresh;
    state.last_function_text = function;
  }
  Py_INCREF(state.last_function);
  return state.last_function;
}

// How many of the values after a FTC_BRIDGE_LIST value at `at` it groups (clipped to those there).
int64_t group_size(const ftc_bridge_value &v, int64_t at, int64_t n_args) {
  return std::max<int64_t>(0, std::min<int64_t>(v.integer, n_args - at - 1));
}

int bridge_call(void *module, const char *function, const ftc_bridge_value *args, int64_t n_args,
                ftc_bridge_sink sink, void *ctx) {
  if (state.finalized) {  // (before taking the GIL, which a finalized interpreter no longer has)
    // Arguments handed over must still be freed.
    for (int64_t i = 0; i < n_args; ++i) {
      if (args[i].kind == FTC_ARG_TENSOR && args[i].dlpack != nullptr) state.dlpack_delete(args[i].dlpack);
    }
    return fail("the Python interpreter has been finalized");
  }
  Gil gil;
  // Every tensor argument is handed to a capsule (which frees it if the call never takes it).
  // Positional arguments: the values, where a FTC_BRIDGE_LIST value makes the next n one list;
  // built in place in the call's tuple (no intermediate list).
  Py_ssize_t n_positional = 0;
  for (int64_t i = 0; i < n_args; ++i, ++n_positional) {
    if (args[i].kind == FTC_BRIDGE_LIST) i += group_size(args[i], i, n_args);
  }
  Ref tuple(PyTuple_New(n_positional));
  int64_t converted = 0;
  bool ok = tuple.get() != nullptr;
  for (Py_ssize_t k = 0; ok && k < n_positional; ++k) {
    const ftc_bridge_value &v = args[converted];
    PyObject *item = nullptr;
    if (v.kind == FTC_BRIDGE_LIST) {
      const int64_t n = group_size(v, converted, n_args);
      ++converted;
      item = PyList_New(static_cast<Py_ssize_t>(n));
      for (int64_t j = 0; item != nullptr && j < n; ++j, ++converted) {
        PyObject *o = to_python(args[converted]);
        if (o == nullptr) {
          ++converted;  // handed to to_python, which freed it
          Py_CLEAR(item);
          break;
        }
        PyList_SetItem(item, static_cast<Py_ssize_t>(j), o);  // steals o (the index is in range)
      }
    } else {
      item = argument_to_python(v, k);
      ++converted;
    }
    // PyTuple_SetItem steals item (the index is in range).
    ok = item != nullptr && PyTuple_SetItem(tuple.get(), k, item) == 0;
  }
  if (!ok) {
    for (int64_t i = converted; i < n_args; ++i) {
      if (args[i].kind == FTC_ARG_TENSOR) state.dlpack_delete(args[i].dlpack);
    }
    return python_failure(std::string("cannot pass argument ") + std::to_string(converted) + " to " + function + "()");
  }
  // (a reference of our own: the lookup may run Python code, and another thread replace the name)
  Ref name(function_name(function));
  Ref fn(name ? PyObject_GetAttr(static_cast<PyObject *>(module), name.get()) : nullptr);
  if (!fn) return python_failure(std::string("no function ") + function);
  Ref result(PyObject_CallObject(fn.get(), tuple.get()));
  if (!result) return python_failure(std::string(function) + "() raised");
  if (result.get() == Py_None) return 0;
  if (PyTuple_Check(result.get()) || PyList_Check(result.get())) {
    const Py_ssize_t n = PySequence_Size(result.get());
    for (Py_ssize_t i = 0; i < n; ++i) {
      Ref item(PySequence_GetItem(result.get(), i));
      if (!item) return python_failure(std::string("cannot read the results of ") + function + "()");
      if (from_python(item.get(), i, function, sink, ctx) != 0) return 1;
    }
    return 0;
  }
  return from_python(result.get(), 0, function, sink, ctx);
}

const char *bridge_last_error() { return last_error.c_str(); }

void bridge_finalize() {
  // Only an interpreter we started, and only from its thread (Python requires it).
  if (!state.started_here || state.finalized || std::this_thread::get_id() != state.init_thread) return;
  if (state.main_state != nullptr) PyEval_RestoreThread(state.main_state);
  state.finalized = true;
  Py_CLEAR(state.from_dlpack);
  Py_CLEAR(state.to_dlpack);
  Py_CLEAR(state.tensor_type);
  Py_CLEAR(state.load);
  Py_CLEAR(state.describe);
  Py_CLEAR(state.last_function);
  for (auto &k : kept) forget(k);
  Py_CLEAR(name_requires_grad);
  Py_CLEAR(name_grad);
  Py_CLEAR(name_backward_hooks);
  Py_CLEAR(name_version);
  Py_FinalizeEx();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int ftorch_python_bridge(int version, ftc_bridge *out) {
  if (version != FTC_BRIDGE_VERSION || out == nullptr) return 1;
  out->initialize = bridge_initialize;
  out->load = bridge_load;
  out->release = bridge_release;
  out->call = bridge_call;
  out->last_error = bridge_last_error;
  out->finalize = bridge_finalize;
  return 0;
}
