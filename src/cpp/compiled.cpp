// compiled.cpp - AOTInductor packages (.pt2): the models torch.export + AOTInductor compile ahead
// of time. They run forward only; model.cpp routes a model handle here when it holds one.
#include "compiled.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

namespace ftc {

class CompiledModel {
 public:
  CompiledModel(const std::string &file, const std::string &name, const c10::Device &device)
      : loader(file, name, /*run_single_threaded=*/false, /*num_runners=*/1,
               device.is_cuda() ? device.index() : c10::DeviceIndex{-1}),
        device(device) {}
  torch::inductor::AOTIModelPackageLoader loader;
  c10::Device device;
  // Sizes and dtypes of the inputs of the last call that passed the package's input checks: calls
  // with the same ones run without capturing standard error (see run_compiled).
  std::vector<int64_t> checked_signature;
  std::mutex signature_mutex;
};

namespace {

constexpr const char *kModelPrefix = "data/aotinductor/";

// Standard error (file descriptor 2) redirected to a temporary file while it lives: AOTInductor's
// runtime prints its errors there ("Error: ...") besides throwing them, which a caller that asked
// for `stat` must not see. What was captured is given back by finish(); the caller prints it again
// when nothing failed (warnings are kept). Output of other threads during that time is captured too.
class StderrCapture {
 public:
  // Captures nothing when not active (finish then gives "").
  explicit StderrCapture(bool active = true) {
    if (!active) return;
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
    if (saved_ < 0) return text;
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
    return text;
  }

 private:
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

// The records of a zip archive written by PyTorch (the top directory dropped), or nothing when
// the file is not one.
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

// The instruction sets the package's code was compiled for that this CPU lacks (running it would
// crash with an illegal instruction). Names we do not know are not checked.
std::string missing_cpu_features(const std::string &isa) {
  std::istringstream words(isa);
  std::string word, missing;
  while (words >> word) {
    bool present = true;
    if (word == "AVX2") present = __builtin_cpu_supports("avx2");
    else if (word == "AVX512") present = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    else if (word == "AVX512_VNNI") present = __builtin_cpu_supports("avx512vnni");
    else if (word == "AVX512_BF16") present = __builtin_cpu_supports("avx512bf16");
    if (!present) missing += (missing.empty() ? "" : " ") + word;
  }
  return missing;
}

// The compiled code checks the sizes, strides, dtypes and devices of its inputs only when
// AOTI_RUNTIME_CHECK_INPUTS is set (read once per package); without the check an input of another
// batch size than a static one exported is read out of bounds. Turned on unless the user set it.
void enable_input_checks() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/0); });
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

std::shared_ptr<CompiledModel> load_compiled(const std::string &file, const c10::Device &device) {
  const std::string name = model_name(file, archive_records(file, nullptr));
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
  enable_input_checks();
  StderrCapture capture;
  try {
    auto model = std::make_shared<CompiledModel>(file, name, device);
    pass_on(capture.finish());
    return model;
  } catch (const std::exception &e) {
    const std::string captured = capture.finish();
    fail(FTC_ERR_IO, with_captured("cannot load the AOTInductor package '" + file + "': " + message_of(e), captured));
  }
}

std::vector<at::Tensor> run_compiled(CompiledModel &model, const std::vector<at::Tensor> &inputs) {
  std::vector<at::Tensor> prepared;
  prepared.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].device() != model.device) {
      fail(FTC_ERR_INVALID_ARGUMENT, "input " + std::to_string(i + 1) + " is on " + inputs[i].device().str() +
                                         " but the compiled model runs on " + model.device.str());
    }
    prepared.push_back(exported_layout(inputs[i]));
  }
  torch::NoGradGuard no_grad;
  // The package's input checks depend only on the inputs' sizes and dtypes (the layout is made
  // what it expects above): a signature that passed once runs without capturing standard error.
  // Compared in place: nothing is allocated on the calls of a known signature.
  bool known;
  {
    std::lock_guard<std::mutex> lock(model.signature_mutex);
    known = has_signature(model.checked_signature, prepared);
  }
  std::vector<int64_t> signature;
  if (!known) signature = signature_of(prepared);
  StderrCapture capture(!known);
  try {
    auto outputs = model.loader.boxed_run(std::move(prepared));  // hands the prepared inputs over, no copy
    if (!known) {
      pass_on(capture.finish());
      std::lock_guard<std::mutex> lock(model.signature_mutex);
      model.checked_signature = std::move(signature);
    }
    return outputs;
  } catch (const std::exception &e) {
    const std::string captured = capture.finish();
    fail(FTC_ERR_TORCH, with_captured(std::string("the compiled model failed: ") + message_of(e), captured));
  }
}

}  // namespace ftc
