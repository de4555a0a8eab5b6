// model.cpp - C API for models: load, forward, save, parameters. TorchScript modules, and
// AOTInductor packages (compiled.cpp) for load and forward.
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <sstream>
#include <vector>

#include "arglist.hpp"
#include "compiled.hpp"
#include "train_package.hpp"

namespace {

std::string checked_filename(const char *filename) {
  if (filename == nullptr || filename[0] == '\0') ftc::fail(FTC_ERR_INVALID_ARGUMENT, "file name is empty");
  return filename;
}

// A model result that is not a tensor is an error naming it.
// The model's results written into the outputs (every one checked before any is written).
void store_outputs(const ftc_tensor *outputs, const std::vector<c10::IValue> &items) {
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].isTensor()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "model output " + std::to_string(i + 1) + " is a " + items[i].tagKind() +
                                              ", not a Tensor");
    }
    tensors.push_back(items[i].toTensor());
  }
  ftc::store_results(outputs, tensors, "the model returned");
}

// The tensors of a call's arguments (a compiled model takes tensors only).
std::vector<at::Tensor> tensor_args(const std::vector<c10::IValue> &args) {
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "argument " + std::to_string(i + 1) + " is a " + args[i].tagKind() +
                                              ": a compiled model takes tensors only (other values were fixed "
                                              "when it was exported)");
    }
    inputs.push_back(args[i].toTensor());
  }
  return inputs;
}

// forward of a compiled model on its input tensors.
std::vector<at::Tensor> compiled_forward(ftc::CompiledModel &compiled, std::vector<at::Tensor> inputs,
                                         int requires_grad) {
  if (requires_grad != 0) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a compiled AOTInductor model (.pt2) cannot record a graph for gradients: "
                                        "run it with requires_grad off, or use the TorchScript export of the model");
  }
  return ftc::run_compiled(compiled, std::move(inputs));
}

// forward of a compiled model: values in (tensors only), a tuple of tensors out.
c10::IValue call_compiled(ftc::CompiledModel &compiled, const std::vector<c10::IValue> &args, int requires_grad) {
  const auto results = compiled_forward(compiled, tensor_args(args), requires_grad);
  return c10::ivalue::Tuple::create(std::vector<c10::IValue>(results.begin(), results.end()));
}

// forward of a training package (its operator, without the TorchScript interpreter); a failure
// reported as a forward's (forward_failed).
std::vector<at::Tensor> package_results(ftc::Model &model, std::vector<at::Tensor> inputs, int requires_grad) {
  try {
    return ftc::package_forward(model, inputs, requires_grad != 0);
  } catch (const std::exception &e) {
    ftc::forward_failed(e, std::vector<c10::IValue>(inputs.begin(), inputs.end()));
  }
}

// A forward's result tensors written into its output tensors (as many as it returned).
void store_results(const std::vector<at::Tensor> &results, const ftc_tensor *outputs, int n_outputs);

}  // namespace

namespace ftc {

c10::IValue forward_here(Model &model, std::vector<c10::IValue> args, int requires_grad) {
  if (model.compiled) return call_compiled(*model.compiled, args, requires_grad);
  if (model.package) {
    const auto results = package_results(model, tensor_args(args), requires_grad);
    if (results.size() == 1) return results[0];
    return c10::ivalue::Tuple::create(std::vector<c10::IValue>(results.begin(), results.end()));
  }
  auto &module = model.module;
  torch::AutoGradMode grad_mode(requires_grad != 0);
  ftc::apply_jit_optimize();
  try {
    return module.forward(args);
  } catch (const std::exception &e) {
    ftc::forward_failed(e, args);
  }
}

}  // namespace ftc

namespace {

// The tensors a forward returned: one Tensor, or the items of a tuple or list.
std::vector<c10::IValue> result_items(const c10::IValue &result) {
  if (result.isTensor()) return {result};
  std::vector<c10::IValue> items;
  if (result.isTuple()) {
    const auto &elems = result.toTupleRef().elements();
    items.assign(elems.begin(), elems.end());
  } else if (result.isList()) {
    const auto list = result.toListRef();
    items.assign(list.begin(), list.end());
  } else {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string("the model returned a ") + result.tagKind() +
                                            "; only a Tensor, a tuple or a list of Tensors is supported");
  }
  return items;
}

// The output tensors of a forward, checked before it runs: the model of m, at least one output,
// no two of them one tensor or over the same memory (each would receive its result and keep only
// the last one written: `[ty, ty]` for `[ty, tz]`).
ftc::Model &checked_forward(ftc_model m, const ftc_tensor *outputs, int n_outputs) {
  ftc::check_tensors(outputs, n_outputs, "output tensor");
  auto &model = ftc::any_model_of(m);
  if (n_outputs < 1) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "need at least one output tensor (got " + std::to_string(n_outputs) + ")");
  }
  for (int j = 1; j < n_outputs; ++j) {
    const auto &b = ftc::tensor_slot(outputs[j]);
    for (int i = 0; i < j; ++i) {
      const auto &a = ftc::tensor_slot(outputs[i]);
      const bool same = &a == &b;
      const bool shared = !same && a.value.defined() && b.value.defined() && a.value.numel() > 0 &&
                          b.value.numel() > 0 && a.value.has_storage() && b.value.has_storage() &&
                          (a.value.data_ptr() == b.value.data_ptr() || ftc::memory_overlaps(a.value, b.value));
      if (same || shared) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "output tensor " + std::to_string(j + 1) +
                                                (same ? " is output tensor " : " shares its memory with output tensor ") +
                                                std::to_string(i + 1) + (same ? " again" : "") +
                                                ": each result needs its own output");
      }
    }
  }
  return model;
}

// A forward that returned n results for n_outputs output tensors.
void check_result_count(size_t n, int n_outputs) {
  if (static_cast<int>(n) != n_outputs) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the model returned " + std::to_string(n) + " tensor" + (n == 1 ? "" : "s") +
                                            " but " + std::to_string(n_outputs) + " output tensors were given");
  }
}

// forward(args...) of a model, its results written into outputs already checked by checked_forward.
void forward_into(ftc::Model &model, std::vector<c10::IValue> args, const ftc_tensor *outputs, int n_outputs,
                  int requires_grad) {
  const auto items = result_items(ftc::forward_here(model, std::move(args), requires_grad));
  check_result_count(items.size(), n_outputs);
  store_outputs(outputs, items);
}

// forward(args...) of model m, its results written into the outputs (see ftc_model_forward).
void run_forward(ftc_model m, std::vector<c10::IValue> args, const ftc_tensor *outputs, int n_outputs,
                 int requires_grad) {
  forward_into(checked_forward(m, outputs, n_outputs), std::move(args), outputs, n_outputs, requires_grad);
}

// The same for tensor inputs: a compiled model runs on them directly (no boxing into values and a
// tuple and back), a TorchScript module as above.
void run_forward(ftc_model m, std::vector<at::Tensor> inputs, const ftc_tensor *outputs, int n_outputs,
                 int requires_grad) {
  auto &model = checked_forward(m, outputs, n_outputs);
  if (model.package) {
    if (auto *inference = ftc::package_inference(model, requires_grad)) {
      store_results(compiled_forward(*inference, std::move(inputs), 0), outputs, n_outputs);
    } else {
      store_results(package_results(model, std::move(inputs), requires_grad), outputs, n_outputs);
    }
  } else if (model.compiled) {
    store_results(compiled_forward(*model.compiled, std::move(inputs), requires_grad), outputs, n_outputs);
  } else {
    forward_into(model, std::vector<c10::IValue>(inputs.begin(), inputs.end()), outputs, n_outputs, requires_grad);
  }
}

// forward of a node-shared model (collective): this rank's arguments resolved by `resolve` within
// it, after its outputs are checked; its rows of the results written into the outputs.
void shared_forward_into(ftc::Model &model, ftc_model m, const ftc_tensor *outputs, int n_outputs, int requires_grad,
                         const std::function<std::vector<c10::IValue>()> &resolve) {
  const auto items = result_items(ftc::shared_forward(model, [&] {
    checked_forward(m, outputs, n_outputs);
    return resolve();
  }, requires_grad));
  check_result_count(items.size(), n_outputs);
  store_outputs(outputs, items);
}

void store_results(const std::vector<at::Tensor> &results, const ftc_tensor *outputs, int n_outputs) {
  check_result_count(results.size(), n_outputs);
  ftc::store_results(outputs, results, "the model returned");
}

// Named parameter `index` (0-based, parameters() order), or an error naming the valid range.
torch::jit::Named<at::Tensor> parameter_at(const torch::jit::Module &module, int64_t index) {
  const auto named = module.named_parameters();
  const auto count = static_cast<int64_t>(named.size());
  if (index < 0 || index >= count) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "parameter index " + std::to_string(index + 1) + " out of range 1.." +
                                            std::to_string(count));
  }
  int64_t i = 0;
  for (const auto &p : named) {
    if (i++ == index) return p;
  }
  ftc::fail(FTC_ERR_INTERNAL, "parameter list changed while reading it");
}

}  // namespace

namespace ftc {

void forward_failed(const std::exception &e, const std::vector<c10::IValue> &args) {
  if (const auto *own = dynamic_cast<const Error *>(&e)) throw *own;  // ours (a callback's): as it is
  const auto *c10_error = dynamic_cast<const c10::Error *>(&e);
  const std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  // The reason is the last line of the text (the TorchScript interpreter puts its traceback first).
  std::string reason;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) reason = line;
  }
  for (const char *prefix : {"RuntimeError: ", "ValueError: ", "TypeError: ", "IndexError: ", "Exception: "}) {
    if (reason.rfind(prefix, 0) == 0) reason.erase(0, std::strlen(prefix));
  }
  reason.erase(0, reason.find_first_not_of(' '));
  auto mentions = [&](std::initializer_list<const char *> words) {
    for (const char *w : words) {
      if (reason.find(w) != std::string::npos) return true;
    }
    return false;
  };
  int status = FTC_ERR_TORCH;
  if (mentions({"same device", "device type", "Expected all tensors to be on", "cuda", "CUDA"})) {
    status = FTC_ERR_DEVICE;
  } else if (mentions({"dtype", "scalar type", "Float but found", "Double but found", "must have the same dtype"})) {
    status = FTC_ERR_DTYPE;
  } else if (mentions({"shape", "size of tensor", "sizes", "dimension", "must match the size", "cannot be multiplied",
                       "Expected input", "expected input"})) {
    status = FTC_ERR_SHAPE;
  }
  std::string msg = "forward failed: " + reason;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor &t = args[i].toTensor();
    msg += "\n  input " + std::to_string(i + 1) + ": shape " + shape_string(t.sizes()) + ", " +
           dtype_name(t.scalar_type()) + ", on " + t.device().str();
  }
  if (text != reason) msg += "\n" + text;
  fail(status, msg);
}

namespace {
// Output `index` can receive result: its shape, and values its dtype keeps.
TensorTable::Slot &checked_output(ftc_tensor out, int index, const at::Tensor &result, const char *source) {
  auto &slot = tensor_slot(out, "output tensor", index + 1);
  if (slot.value.sizes() != result.sizes()) {
    fail(FTC_ERR_INVALID_ARGUMENT, "output tensor " + std::to_string(index + 1) + " has shape " +
                                       shape_string(slot.value.sizes()) + " but " + source + " shape " +
                                       shape_string(result.sizes()));
  }
  if (result.scalar_type() != slot.value.scalar_type()) {
    const std::string into = "output tensor " + std::to_string(index + 1);
    check_lossless(result, slot.value.scalar_type(), into.c_str());
  }
  return slot;
}
}  // namespace

void store_result(ftc_tensor out, int index, const at::Tensor &result, const char *source) {
  assign_into(checked_output(out, index, result, source), result);
}

void store_results(const ftc_tensor *outputs, const std::vector<at::Tensor> &results, const char *source) {
  for (size_t i = 0; i < results.size(); ++i) checked_output(outputs[i], static_cast<int>(i), results[i], source);
  for (size_t i = 0; i < results.size(); ++i) store_result(outputs[i], static_cast<int>(i), results[i], source);
}

std::atomic<bool> &jit_optimize() {
  static std::atomic<bool> enabled{false};
  return enabled;
}

void apply_jit_optimize() {
  const bool wanted = jit_optimize().load(std::memory_order_relaxed);
  if (torch::jit::getGraphExecutorOptimize() != wanted) torch::jit::setGraphExecutorOptimize(wanted);
}

}  // namespace ftc

namespace {

// torch_model_save: written in eval() mode (as_inference), as a model for inference; or in the
// mode it is in (save_module).
int save_model(ftc_model m, const char *filename, bool as_inference) {
  return ftc::guard([&] {
    auto &module = ftc::model_of(m);
    const std::string file = checked_filename(filename);
    const auto &model = ftc::any_model_of(m);
    if (model.package) {
      ftc::save_training_package(model, file);
      return;
    }
    ftc::save_module(module, file, as_inference);
  });
}

}  // namespace

namespace ftc {

void save_module(torch::jit::Module &module, const std::string &file, bool as_inference) {
  std::vector<std::pair<torch::jit::Module, bool>> modes;
  for (const auto &sub : module.modules()) modes.emplace_back(sub, sub.is_training());
  auto restore = [&] {
    for (auto &[sub, training] : modes) sub.train(training);
  };
  if (as_inference) module.eval();
  try {
    module.save(file);
  } catch (const c10::Error &e) {
    restore();
    fail(FTC_ERR_IO, "cannot write model to '" + file + "': " + e.what_without_backtrace());
  }
  restore();
}

}  // namespace ftc

extern "C" {

void ftc_set_jit_optimize(int enabled) { ftc::jit_optimize() = enabled != 0; }

int ftc_jit_optimize(void) { return ftc::jit_optimize() ? 1 : 0; }

}  // extern "C"

namespace ftc {

std::shared_ptr<Model> load_model(const char *filename, int device_type, int device_index, int requires_grad,
                                  int is_training) {
  const std::string file = checked_filename(filename);
  const auto dev = ftc::device(device_type, device_index);
  if (!std::ifstream(file).good()) {
    ftc::fail(FTC_ERR_IO, "cannot open model file '" + file + "' (missing or unreadable)");
  }
  if (ftc::is_training_package(file)) return ftc::load_training_package(file, dev, requires_grad != 0, is_training);
  if (ftc::is_pt2_archive(file)) {
    if (requires_grad != 0 || is_training > 0) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "'" + file + "' is a compiled AOTInductor package (.pt2), which runs "
                "forward only: it cannot be loaded for training or with parameters requiring grad: export a training package "
                "(`python -m ftorch export MODEL --train FILE.pt2`) to train it");
    }
    auto model = std::make_shared<ftc::Model>();
    model->compiled = ftc::load_compiled(file, dev);
    return model;
  }
  torch::AutoGradMode grad_mode(requires_grad != 0);
  torch::jit::Module module;
  try {
    module = torch::jit::load(file, dev);
  } catch (const c10::Error &e) {
    ftc::fail(FTC_ERR_IO, "'" + file + "' is not a loadable TorchScript model: " + e.what_without_backtrace());
  }
  // A checkpoint is an archive LibTorch loads as a module too (with no forward): say what it is.
  if (module.hasattr("format") && module.attr("format").isString() &&
      module.attr("format").toStringRef() == ftc::kCheckpointFormat) {
    ftc::fail(FTC_ERR_IO, "'" + file + "' is an FTorch checkpoint (torch_checkpoint_save), not a model: load the "
                          "model from its TorchScript file, then the checkpoint into it with torch_checkpoint_load");
  }
  if (is_training > 0) {
    module.train();
  } else if (is_training == 0) {
    module.eval();
  }  // < 0: the mode the model was saved in
  auto model = std::make_shared<ftc::Model>();
  model->module = std::move(module);
  return model;
}

}  // namespace ftc

extern "C" {

int ftc_model_load(ftc_model *out, const char *filename, int device_type, int device_index, int requires_grad,
                   int is_training) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    ftc::replace_handle<ftc::ModelTable>(out, ftc::load_model(filename, device_type, device_index, requires_grad,
                                                              is_training));
  });
}

int ftc_model_forward(ftc_model m, const ftc_tensor *inputs, int n_inputs, const ftc_tensor *outputs, int n_outputs,
                      int requires_grad) {
  return ftc::guard([&] {
    ftc::note_step();
    ftc::take_temporaries(outputs, n_outputs);  // the inputs' are taken by tensors_of
    if (auto *model = ftc::shared_model(m)) {
      ftc::take_temporaries(inputs, n_inputs);
      shared_forward_into(*model, m, outputs, n_outputs, requires_grad, [&] {
        const auto tensors = ftc::tensors_of(inputs, n_inputs, "input tensor");
        return std::vector<c10::IValue>(tensors.begin(), tensors.end());
      });
      return;
    }
    run_forward(m, ftc::tensors_of(inputs, n_inputs, "input tensor"), outputs, n_outputs, requires_grad);
  });
}

int ftc_model_forward_args(ftc_model m, ftc_arglist args, const ftc_tensor *outputs, int n_outputs,
                           int requires_grad) {
  return ftc::guard([&] {
    ftc::note_step();
    ftc::take_temporaries(outputs, n_outputs);
    if (auto *model = ftc::shared_model(m)) {
      shared_forward_into(*model, m, outputs, n_outputs, requires_grad,
                          [&] { return ftc::ivalues_of(ftc::arglist_of(args)); });
      return;
    }
    run_forward(m, ftc::ivalues_of(ftc::arglist_of(args)), outputs, n_outputs, requires_grad);
  });
}

int ftc_model_forward_list(ftc_model m, ftc_arglist args, ftc_arglist *results, int requires_grad) {
  return ftc::guard([&] {
    ftc::note_step();
    std::vector<c10::IValue> items;
    if (auto *model = ftc::shared_model(m)) {
      items = result_items(ftc::shared_forward(*model, [&] {
        ftc::out_arg(results, "results");
        return ftc::ivalues_of(ftc::arglist_of(args));
      }, requires_grad));
    } else {
      ftc::out_arg(results, "results");
      auto values = ftc::ivalues_of(ftc::arglist_of(args));
      items = result_items(ftc::forward_here(ftc::any_model_of(m), std::move(values), requires_grad));
    }
    ftc::ArgList list;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].isTensor()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "model output " + std::to_string(i + 1) + " is a " + items[i].tagKind() +
                                                ", not a Tensor");
      }
      ftc::ArgItem item;
      item.kind = FTC_ARG_TENSOR;
      item.value = items[i].toTensor();
      list.push_back(std::move(item));
    }
    ftc::set_results(results, std::move(list));
  });
}

int ftc_model_save(ftc_model m, const char *filename) { return save_model(m, filename, true); }

int ftc_model_save_as_is(ftc_model m, const char *filename) { return save_model(m, filename, false); }

int ftc_model_is_training(ftc_model m, int *is_training) {
  return ftc::guard([&] {
    const auto &model = ftc::any_model_of(m);
    ftc::out_arg(is_training, "is_training") = !model.compiled && model.module.is_training() ? 1 : 0;
  });
}

int ftc_model_print_parameters(ftc_model m) {
  return ftc::guard([&] {
    for (const auto &p : ftc::model_of(m).named_parameters()) {
      std::cout << p.name << ":\n" << p.value << "\n";
    }
    std::cout << std::flush;
  });
}

int ftc_model_parameter_count(ftc_model m, int64_t *count) {
  return ftc::guard([&] { ftc::out_arg(count, "count") = static_cast<int64_t>(ftc::model_of(m).parameters().size()); });
}

int ftc_model_parameters(ftc_model m, ftc_tensor *outputs, int64_t n) {
  return ftc::guard([&] {
    const auto params = ftc::model_of(m).parameters();
    const auto count = static_cast<int64_t>(params.size());
    if (n > 0 && outputs == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "output handle array is null");
    if (n != count) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the model has " + std::to_string(count) + " parameters but " +
                                              std::to_string(n) + " tensors were given");
    }
    for (int64_t i = 0; i < n; ++i) {
      if (ftc::TensorTable::instance().find(outputs[i]) != nullptr) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "parameter tensor " + std::to_string(i + 1) +
                                                " is already constructed; pass unconstructed tensors");
      }
    }
    int64_t i = 0;
    for (const auto &p : params) outputs[i++] = ftc::new_tensor_handle(p, ftc::Lifetime::parameter());
  });
}

int ftc_model_parameter(ftc_model m, const char *name, int64_t index, ftc_tensor *out) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    const auto &module = ftc::model_of(m);
    at::Tensor found;
    if (name != nullptr && name[0] != '\0') {
      for (const auto &p : module.named_parameters()) {
        if (p.name == name) found = p.value;
      }
      if (!found.defined()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string("the model has no parameter named '") + name + "'");
    } else {
      found = parameter_at(module, index).value;
    }
    ftc::install(out, found, ftc::Lifetime::parameter());
  });
}

int ftc_model_parameter_name(ftc_model m, int64_t index, char *buf, int64_t buflen, int64_t *length) {
  return ftc::guard([&] {
    const std::string name = parameter_at(ftc::model_of(m), index).name;
    ftc::out_arg(length, "length") = static_cast<int64_t>(name.size());
    if (buf != nullptr && buflen > 0) std::memcpy(buf, name.data(), static_cast<size_t>(std::min(buflen, *length)));
  });
}

int ftc_model_set_requires_grad(ftc_model m, const char *name, int requires_grad, int64_t *matched) {
  return ftc::guard([&] {
    const std::string prefix = name != nullptr ? name : "";
    int64_t n = 0;
    for (const auto &p : ftc::model_of(m).named_parameters()) {
      if (prefix.empty() || p.name == prefix || p.name.rfind(prefix + ".", 0) == 0) {
        p.value.requires_grad_(requires_grad != 0);
        ++n;
      }
    }
    if (n == 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "no parameter is named '" + prefix + "' or starts with '" + prefix + ".'");
    if (matched != nullptr) *matched = n;
  });
}

int ftc_model_numel(ftc_model m, int trainable_only, int64_t *count) {
  return ftc::guard([&] {
    int64_t n = 0;
    for (const auto &p : ftc::model_of(m).parameters()) {
      if (!trainable_only || p.requires_grad()) n += p.numel();
    }
    ftc::out_arg(count, "count") = n;
  });
}

}  // extern "C"
