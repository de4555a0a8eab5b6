// compiled.cpp - AOTInductor packages (.pt2): the models torch.export + AOTInductor compile ahead
// of time. They run forward only; model.cpp routes a model handle here when it holds one.
#include "compiled.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

namespace ftc {

class CompiledModel {
 public:
  CompiledModel(const std::string &file, const std::string &name, const c10::Device &device)
      : loader(file, name, /*run_single_threaded=*/false, /*num_runners=*/1,
               device.is_cuda() ? device.index() : c10::DeviceIndex{-1}),
        device(device) {}
  torch::inductor::AOTIModelPackageLoader loader;
  c10::Device device;
  // Sizes and dtypes of the inputs of the calls that passed the package's input checks: calls
  // with the same ones run without capturing standard error (see run_compiled). The last one
  // used is published through an atomic pointer (read without a lock on every call); each stays
  // in the deque (one per distinct signature), so a pointer read by another thread stays valid.
  std::atomic<const std::vector<int64_t> *> checked_signature{nullptr};
  std::deque<std::vector<int64_t>> signatures;  // guarded by signature_mutex
  std::mutex signature_mutex;
  // The package's inputs as its exporter recorded them, if it did (see DimRule): checked here.
  std::optional<std::vector<InputRule>> rules;
  // Whether the package's own input checks run (AOTI_RUNTIME_CHECK_INPUTS as its code read it at
  // its first run; -1 before that run): they compare every stride, so inputs get the exported
  // strides along size-1 dimensions too.
  std::atomic<int> generated_checks{-1};
};

namespace {

constexpr const char *kModelPrefix = "data/aotinductor/";

// Standard error (file descriptor 2) redirected to a temporary file while it lives: AOTInductor's
// runtime prints its errors there ("Error: ...") besides throwing them, which a caller that asked
// for `stat` must not see. What was captured is given back by finish(); the caller prints it again
// when nothing failed (warnings are kept). Output of other threads during that time is captured too.
class StderrCapture {
 public:
  // Captures nothing when not active (finish then gives ""). One capture at a time in the process
  // (nested ones on one thread end in the reverse order they began): two threads' captures ending
  // in the order they began would leave file descriptor 2 on the first one's deleted file.
  explicit StderrCapture(bool active = true) {
    if (!active) return;
    lock_ = std::unique_lock<std::recursive_mutex>(capture_mutex());
    std::fflush(stderr);
    file_ = std::tmpfile();
    if (file_ == nullptr) return;
    saved_ = dup(2);
    if (saved_ < 0 || dup2(fileno(file_), 2) < 0) {
      if (saved_ >= 0) close(saved_);
      saved_ = -1;
      std::fclose(file_);
      file_ = nullptr;
    }
  }
  ~StderrCapture() { finish(); }
  StderrCapture(const StderrCapture &) = delete;
  StderrCapture &operator=(const StderrCapture &) = delete;

  std::string finish() {
    std::string text;
    if (saved_ < 0) {
      if (lock_.owns_lock()) lock_.unlock();
      return text;
    }
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
    std::rewind(file_);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) text.append(buf, n);
    std::fclose(file_);
    file_ = nullptr;
    lock_.unlock();
    return text;
  }

 private:
  static std::recursive_mutex &capture_mutex() {
    static std::recursive_mutex m;
    return m;
  }
  std::unique_lock<std::recursive_mutex> lock_;
  std::FILE *file_ = nullptr;
  int saved_ = -1;
};

// Captured standard error printed again (nothing failed: it was a warning).
void pass_on(const std::string &text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

// msg with the captured lines that it does not already contain.
std::string with_captured(std::string msg, const std::string &captured) {
  std::istringstream lines(captured);
  std::string line;
  while (std::getline(lines, line)) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    std::string text = line.rfind("Error: ", 0) == 0 ? line.substr(7) : line;
    if (!text.empty() && msg.find(text) == std::string::npos) msg += "; " + text;
  }
  return msg;
}

// Dtype, rank and sizes of each input, one after the other.
std::vector<int64_t> signature_of(const std::vector<at::Tensor> &inputs) {
  std::vector<int64_t> signature;
  for (const auto &t : inputs) {
    signature.push_back(static_cast<int64_t>(t.scalar_type()));
    signature.push_back(t.dim());
    signature.insert(signature.end(), t.sizes().begin(), t.sizes().end());
  }
  return signature;
}

// Whether signature == signature_of(inputs).
bool has_signature(const std::vector<int64_t> &signature, const std::vector<at::Tensor> &inputs) {
  size_t k = 0;
  for (const auto &t : inputs) {
    if (k + 2 + static_cast<size_t>(t.dim()) > signature.size()) return false;
    if (signature[k++] != static_cast<int64_t>(t.scalar_type()) || signature[k++] != t.dim()) return false;
    for (const int64_t n : t.sizes()) {
      if (signature[k++] != n) return false;
    }
  }
  return k == signature.size();
}

// The message of a LibTorch or AOTInductor exception, without a C++ backtrace or trailing blanks.
std::string message_of(const std::exception &e) {
  const auto *c10_error = dynamic_cast<const c10::Error *>(&e);
  std::string msg = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  const auto raised = msg.find("\nException raised from");
  if (raised != std::string::npos) msg.erase(raised);
  while (!msg.empty() && std::isspace(static_cast<unsigned char>(msg.back()))) msg.pop_back();
  return msg;
}

}  // namespace

std::vector<std::string> archive_records(const std::string &file, std::string *archive_format) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(file);
    if (archive_format != nullptr && reader.hasRecord("archive_format")) {
      auto [data, size] = reader.getRecord("archive_format");
      *archive_format = std::string(static_cast<const char *>(data.get()), size);
    }
    return reader.getAllRecords();
  } catch (const std::exception &) {
    return {};
  }
}

namespace {

// The model of the package to run: "model" (what aoti_compile_and_package writes), else the only one.
std::string model_name(const std::string &file, const std::vector<std::string> &records) {
  std::set<std::string> names;
  const std::string prefix = kModelPrefix;
  for (const auto &r : records) {
    if (r.rfind(prefix, 0) != 0) continue;
    const auto end = r.find('/', prefix.size());
    if (end != std::string::npos) names.insert(r.substr(prefix.size(), end - prefix.size()));
  }
  if (names.empty()) {
    fail(FTC_ERR_IO, "'" + file + "' is a .pt2 archive without AOTInductor-compiled code (a torch.export.save'd "
                     "program?): compile it with torch._inductor.aoti_compile_and_package, or export the model "
                     "with `python -m ftorch export --pt2`");
  }
  if (names.count("model") != 0 || names.size() == 1) return names.count("model") != 0 ? "model" : *names.begin();
  std::string list;
  for (const auto &n : names) list += (list.empty() ? "" : ", ") + n;
  fail(FTC_ERR_IO, "'" + file + "' holds several compiled models (" + list + ") and none is named 'model'");
}

#if defined(__x86_64__) || defined(__i386__)
// CPUID leaf 7 (subleaf `sub`) register `reg` (0 EAX .. 3 EDX), bit `bit`.
bool cpuid7_bit(unsigned sub, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_count(7, sub, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  return ((r[reg] >> bit) & 1u) != 0;
}
#endif

// The instruction sets the package's code was compiled for that this CPU lacks (running it would
// crash with an illegal instruction). Names we do not know are not checked. torch records AMX_TILE
// for code it compiled with AMX (tile, bf16 and int8) and AVX512-BF16 too.
std::string missing_cpu_features(const std::string &isa) {
  std::string missing;
#if defined(__x86_64__) || defined(__i386__)
  const bool avx512_bf16 = cpuid7_bit(1, 0, 5);
  const bool amx = cpuid7_bit(0, 3, 22) && cpuid7_bit(0, 3, 24) && cpuid7_bit(0, 3, 25);  // bf16, tile, int8
  std::istringstream words(isa);
  std::string word;
  while (words >> word) {
    bool present = true;
    if (word == "AVX2") present = __builtin_cpu_supports("avx2");
    else if (word == "AVX512") present = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    else if (word == "AVX512_VNNI") present = __builtin_cpu_supports("avx512vnni");
    else if (word == "AVX512_BF16") present = avx512_bf16;
    else if (word == "AMX_TILE") present = amx && avx512_bf16;
    if (!present) missing += (missing.empty() ? "" : " ") + word;
  }
#else
  static_cast<void>(isa);  // (torch records x86 instruction sets only)
#endif
  return missing;
}

// The dtype PyTorch calls `name` ("float64", "bfloat16": what str(torch.float64) says after
// "torch."), Undefined if none: torch's own table (c10::getDtypeNames), never a copy of it.
c10::ScalarType dtype_named(std::string_view name) {
  for (int k = 0; k < static_cast<int>(c10::ScalarType::NumOptions); ++k) {
    const auto type = static_cast<c10::ScalarType>(k);
    try {
      const auto names = c10::getDtypeNames(type);
      if (std::string_view(names.first) == name) return type;
    } catch (const std::exception &) {
      // a scalar type Python has no dtype for
    }
  }
  return c10::ScalarType::Undefined;
}

}  // namespace

std::optional<std::vector<InputRule>> parse_rules(const std::string &rules_text) {
  std::istringstream text(rules_text);
  std::string item;
  if (!std::getline(text, item, ';') || item != "v1") return std::nullopt;
  std::vector<InputRule> rules;
  auto to_int = [](const std::string &word, int64_t &value) {
    if (word.empty()) return false;
    size_t used = 0;
    try {
      value = std::stoll(word, &used);
    } catch (const std::exception &) {
      return false;
    }
    return used == word.size();
  };
  while (std::getline(text, item, ';')) {
    const auto open = item.find('[');
    if (open == std::string::npos || item.back() != ']') return std::nullopt;
    InputRule rule{dtype_named(std::string_view(item).substr(0, open)), {}};
    if (rule.dtype == c10::ScalarType::Undefined) return std::nullopt;
    std::istringstream dims(item.substr(open + 1, item.size() - open - 2));
    std::string dim;
    while (std::getline(dims, dim, ',')) {
      DimRule d;
      const auto colon = dim.find(':');
      if (colon == std::string::npos) {
        if (!to_int(dim, d.lo) || d.lo < 0) return std::nullopt;
        d.hi = d.lo;
      } else {
        const auto second = dim.find(':', colon + 1);
        d.name = dim.substr(0, colon);
        if (d.name.empty() || second == std::string::npos || !to_int(dim.substr(colon + 1, second - colon - 1), d.lo) ||
            !to_int(dim.substr(second + 1), d.hi) || d.lo < 0 || (d.hi != -1 && d.hi < d.lo)) {
          return std::nullopt;
        }
      }
      rule.dims.push_back(std::move(d));
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

namespace {

// What a rule allows, for messages: [batch (1..4096), 5].
std::string rule_string(const InputRule &rule) {
  std::string text = "[";
  for (size_t k = 0; k < rule.dims.size(); ++k) {
    const auto &d = rule.dims[k];
    if (k > 0) text += ", ";
    if (d.name.empty()) {
      text += std::to_string(d.lo);
    } else {
      text += d.name + " (" + std::to_string(d.lo) + ".." + (d.hi < 0 ? std::string("any") : std::to_string(d.hi)) + ")";
    }
  }
  return text + "]";
}

}  // namespace

void check_inputs(const std::vector<InputRule> &rules, const std::vector<at::Tensor> &inputs) {
  if (inputs.size() != rules.size()) {
    fail(FTC_ERR_INVALID_ARGUMENT, "the compiled model takes " + std::to_string(rules.size()) + " input" +
                                       (rules.size() == 1 ? "" : "s") + ", got " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto &rule = rules[i];
    const auto &t = inputs[i];
    if (t.scalar_type() != rule.dtype) {
      fail(FTC_ERR_DTYPE, "input " + std::to_string(i + 1) + " has dtype " + dtype_name(t.scalar_type()) +
                              " but the compiled model was exported for " + dtype_name(rule.dtype));
    }
    const auto sizes = t.sizes();
    bool fits = sizes.size() == rule.dims.size();
    for (size_t k = 0; fits && k < sizes.size(); ++k) {
      const auto &d = rule.dims[k];
      fits = sizes[k] >= d.lo && (d.hi < 0 || sizes[k] <= d.hi);
    }
    if (!fits) {
      fail(FTC_ERR_SHAPE, "input " + std::to_string(i + 1) + " has shape " + shape_string(sizes) +
                                         " but the compiled model was exported for " + rule_string(rule));
    }
  }
  // A named size must be the same wherever it appears (the compiled code reads it from one place).
  for (size_t i = 0; i < rules.size(); ++i) {
    for (size_t k = 0; k < rules[i].dims.size(); ++k) {
      const auto &name = rules[i].dims[k].name;
      if (name.empty()) continue;
      for (size_t j = 0; j <= i; ++j) {
        for (size_t l = 0; l < (j == i ? k : rules[j].dims.size()); ++l) {
          if (rules[j].dims[l].name == name && inputs[j].size(l) != inputs[i].size(k)) {
            fail(FTC_ERR_SHAPE, "input " + std::to_string(i + 1) + " has " + name + " = " +
                                               std::to_string(inputs[i].size(k)) + " (dim " + std::to_string(k + 1) +
                                               ") but input " + std::to_string(j + 1) + " has " + name + " = " +
                                               std::to_string(inputs[j].size(l)) + " (dim " + std::to_string(l + 1) +
                                               "): the compiled model takes one " + name);
          }
        }
      }
    }
  }
}

namespace {

// Guards AOTI_RUNTIME_CHECK_INPUTS: set while loading, read at a package's first run.
std::mutex &environment_mutex() {
  static std::mutex m;
  return m;
}

// The compiled code checks the sizes, strides, dtypes and devices of its inputs only when
// AOTI_RUNTIME_CHECK_INPUTS is set (read at its first run); without the check an input of another
// batch size than a static one exported is read out of bounds. Turned on, unless the user set it,
// when a package without FTorch's rules (one not written by `python -m ftorch export`) is loaded.
void enable_input_checks() {
  std::lock_guard<std::mutex> lock(environment_mutex());
  setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/0);
}

// Whether the compiled code's checks run: what it reads at its first run (under the same lock).
bool generated_checks_on() {
  const char *value = std::getenv("AOTI_RUNTIME_CHECK_INPUTS");
  return value != nullptr && value[0] != '0';
}

// `t` in the row-major layout the compiled code was exported with (its input checks compare
// every stride). A copy only when the layout differs: a Fortran array with one non-unit dimension
// is already row-major in memory, and only its strides along size-1 dimensions are rewritten.
at::Tensor exported_layout(const at::Tensor &t) {
  at::Tensor c = t.contiguous();
  const auto sizes = c.sizes();
  c10::SmallVector<int64_t, 8> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  if (c.strides() == c10::IntArrayRef(strides)) return c;
  // c is contiguous, so only strides of size-1 dimensions differ: the same memory described by a
  // new TensorImpl with the exported strides, made directly as LibTorch's as_strided kernel makes
  // one (through the dispatcher, as_strided cost about as much as the rest of a batch-1 forward's
  // overhead). The package only reads it, under no_grad: no view tracking is needed.
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(c.storage()), c.key_set(),
                                                   c.dtype());
  impl->set_sizes_and_strides(sizes, strides, c.storage_offset());
  return at::Tensor(std::move(impl));
}

}  // namespace

bool is_pt2_archive(const std::string &file) {
  std::string format;
  archive_records(file, &format);
  return format.rfind("pt2", 0) == 0;
}

std::shared_ptr<CompiledModel> load_compiled(const std::string &file, const c10::Device &device,
                                             const std::string &wanted) {
  const std::string name = wanted.empty() ? model_name(file, archive_records(file, nullptr)) : wanted;
  // torch's package readers are not safe for threads loading packages at once (seen under load: a
  // metadata read beside another thread's load failed with "type must be string, but is null"):
  // the metadata read and the load take turns across threads.
  static std::mutex loading;
  const std::lock_guard<std::mutex> one_load(loading);
  std::unordered_map<std::string, std::string> metadata;
  try {
    metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(file, name);
  } catch (const std::exception &e) {
    fail(FTC_ERR_IO, "cannot read the metadata of the AOTInductor package '" + file + "': " + message_of(e));
  }
  const std::string key = metadata.count("AOTI_DEVICE_KEY") != 0 ? metadata["AOTI_DEVICE_KEY"] : "cpu";
  if (c10::Device(key).type() != device.type()) {
    fail(FTC_ERR_INVALID_ARGUMENT, "'" + file + "' was compiled for " + key + " but the model is loaded on " +
                                       c10::DeviceTypeName(device.type(), true) +
                                       ": export it again for that device (a package runs on the device it was "
                                       "compiled for)");
  }
  if (device.is_cpu() && metadata.count("AOTI_CPU_ISA") != 0) {
    const std::string missing = missing_cpu_features(metadata["AOTI_CPU_ISA"]);
    if (!missing.empty()) {
      fail(FTC_ERR_INVALID_ARGUMENT, "'" + file + "' was compiled for a CPU with " + metadata["AOTI_CPU_ISA"] +
                                         " but this CPU lacks " + missing +
                                         ": compile the package on (or for) this machine");
    }
  }
  std::optional<std::vector<InputRule>> rules;
  if (metadata.count("ftorch_inputs") != 0) rules = parse_rules(metadata["ftorch_inputs"]);
  if (!rules) enable_input_checks();
  StderrCapture capture;
  try {
    auto model = std::make_shared<CompiledModel>(file, name, device);
    model->rules = std::move(rules);
    pass_on(capture.finish());
    return model;
  } catch (const std::exception &e) {
    const std::string captured = capture.finish();
    fail(FTC_ERR_IO, with_captured("cannot load the AOTInductor package '" + file + "': " + message_of(e), captured));
  }
}

void bind_constants(CompiledModel &model, const std::vector<std::string> &names, std::vector<at::Tensor> &tensors) {
  auto *runner = model.loader.get_runner();
  if (runner == nullptr) fail(FTC_ERR_INTERNAL, "the compiled model has no runner to bind constants to");
  try {
    std::unordered_map<std::string, std::string> internal;  // exported name -> the compiled code's name
    for (const auto &[name, exported] : runner->getConstantNamesToOriginalFQNs()) internal[exported] = name;
    torch::inductor::TensorConstantMap constants;
    for (size_t k = 0; k < names.size() && k < tensors.size(); ++k) {
      const auto it = internal.find(names[k]);
      if (it != internal.end()) constants.emplace(it->second, &tensors[k]);
    }
    // Not through the loader's load_constants: it passes the runner a map of its own, whose
    // elements' addresses the model would keep after that map is gone.
    runner->update_constant_buffer(constants, /*use_inactive=*/false, /*check_full_update=*/false,
                                   /*user_managed=*/true);
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    fail(FTC_ERR_IO, std::string("cannot bind the state to the compiled model: ") + message_of(e));
  }
}

const std::vector<InputRule> *input_rules(const CompiledModel &model) {
  return model.rules ? &*model.rules : nullptr;
}

std::vector<at::Tensor> run_compiled(CompiledModel &model, std::vector<at::Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].device() != model.device) {
      fail(FTC_ERR_INVALID_ARGUMENT, "input " + std::to_string(i + 1) + " is on " + inputs[i].device().str() +
                                         " but the compiled model runs on " + model.device.str());
    }
  }
  if (model.rules) check_inputs(*model.rules, inputs);
  // The package's first run reads AOTI_RUNTIME_CHECK_INPUTS: under the lock that loads set it with.
  // Decided for good only once a run succeeded (the package has read the variable by then); a
  // run that failed first decides again (the variable only ever goes from unset to set, and
  // assuming the checks run costs only a TensorImpl for a Fortran (1, n) array).
  std::unique_lock<std::mutex> first_run;
  int generated_checks = model.generated_checks.load(std::memory_order_acquire);
  if (generated_checks < 0) {
    first_run = std::unique_lock<std::mutex>(environment_mutex());
    generated_checks = model.generated_checks.load(std::memory_order_acquire);
    if (generated_checks < 0) generated_checks = generated_checks_on() ? 1 : 0;
  }
  // Row-major memory, as exported (a copy only when the layout differs); the exported strides
  // along size-1 dimensions too only where the generated checks compare them (the compiled code
  // never steps along a dimension of size 1).
  for (auto &t : inputs) {
    if (generated_checks != 0) {
      t = exported_layout(t);
    } else if (!t.is_contiguous()) {
      t = t.contiguous();
    }
  }
  torch::NoGradGuard no_grad;
  // Whether the inputs pass depends only on their sizes and dtypes (the layout is made what the
  // package expects above): a signature that passed once runs without capturing standard error.
  // Compared in place: nothing is allocated on the calls of a known signature.
  const std::vector<int64_t> *checked = model.checked_signature.load(std::memory_order_acquire);
  bool known = checked != nullptr && has_signature(*checked, inputs);
  if (!known) {
    std::lock_guard<std::mutex> lock(model.signature_mutex);
    for (const auto &seen : model.signatures) {
      if (has_signature(seen, inputs)) {
        known = true;
        model.checked_signature.store(&seen, std::memory_order_release);
        break;
      }
    }
  }
  std::vector<int64_t> signature;
  if (!known) signature = signature_of(inputs);
  StderrCapture capture(!known);
  try {
    auto outputs = model.loader.boxed_run(std::move(inputs));  // hands the inputs over, no copy
    if (first_run.owns_lock()) model.generated_checks.store(generated_checks, std::memory_order_release);
    if (!known) {
      pass_on(capture.finish());
      std::lock_guard<std::mutex> lock(model.signature_mutex);
      model.signatures.push_back(std::move(signature));
      model.checked_signature.store(&model.signatures.back(), std::memory_order_release);
    }
    return outputs;
  } catch (const std::exception &e) {
    const std::string captured = capture.finish();
    fail(FTC_ERR_TORCH, with_captured(std::string("the compiled model failed: ") + message_of(e), captured));
  }
}

}  // namespace ftc
