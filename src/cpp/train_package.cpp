// train_package.cpp - training packages: load one as a TorchScript module whose forward runs the
// compiled forward and records one autograd node running the compiled backward; save its state.
#include "train_package.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "compiled.hpp"
#include "once_differentiable.hpp"
#include "optim_state.hpp"

namespace ftc {

namespace {

// Records of a training package (python/ftorch/_train_package.py writes them).
constexpr const char *kMetaRecord = "extra/ftorch_train.txt";
constexpr const char *kStateRecord = "ftorch/state.pt";
constexpr const char *kFormat = "ftorch-train-1";

}  // namespace

struct TrainingPackage {
  std::string file;
  c10::Device device{c10::kCPU};
  std::shared_ptr<CompiledModel> forward, backward, eval;  // eval null: forward serves eval mode too
  std::shared_ptr<CompiledModel> step;  // the compiled training step (MSE, Adam/AdamW), if the package has one
  std::shared_ptr<CompiledModel> eval_backward;  // the gradients of the eval forward (null: none, or eval is null)
  // The eval-mode forward without gradients, the state bound to its constants (null: an older
  // package). `bound` holds the params, then the buffers, detached (the same memory; views of
  // them, which the compiled code makes, cost no autograd bookkeeping), its elements never
  // resized away (the compiled model keeps their addresses); `bound_at` their memory when bound.
  std::shared_ptr<CompiledModel> infer;
  std::vector<std::string> infer_state;
  std::vector<at::Tensor> bound;
  std::vector<const void *> bound_at;
  std::mutex bind_mutex;
  std::vector<std::string> param_names, buffer_names;
  // The state_dict's keys, in its order, each with the parameter or buffer it holds (another name
  // for tied weights: the state_dict keeps every name, named_parameters only the first).
  std::vector<std::pair<std::string, std::string>> state_dict;
  std::vector<at::Tensor> params, buffers;  // the module's own tensors
  std::optional<std::vector<InputRule>> input_rules;
  size_t n_inputs = 0, n_outputs = 0, n_random = 0;
  std::vector<bool> input_gradient;  // per input: the backward returns its gradient
  std::vector<bool> unused;          // per parameter: the forward does not use it (gradient stays none)
  int64_t id = 0;
  ~TrainingPackage();
};

namespace {

// Packages by the id their module's forward passes to the operator (a TorchScript attribute holds
// an integer, not a C++ object). Entries go when their package does.
struct Registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::weak_ptr<TrainingPackage>> packages;
  int64_t next = 1;
  static Registry &instance() {
    static auto *r = new Registry;  // never destroyed: packages may outlive static destruction order
    return *r;
  }
};

std::shared_ptr<TrainingPackage> package_of(int64_t id) {
  auto &r = Registry::instance();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.packages.find(id);
  auto p = it != r.packages.end() ? it->second.lock() : nullptr;
  if (!p) fail(FTC_ERR_INVALID_ARGUMENT, "the training package of this model has been deleted");
  return p;
}

// key=value lines of the package's training record.
std::unordered_map<std::string, std::string> read_meta(caffe2::serialize::PyTorchStreamReader &reader,
                                                       const std::string &file) {
  if (!reader.hasRecord(kMetaRecord)) fail(FTC_ERR_IO, "'" + file + "' is not a training package");
  auto [data, size] = reader.getRecord(kMetaRecord);
  std::istringstream text(std::string(static_cast<const char *>(data.get()), size));
  std::unordered_map<std::string, std::string> meta;
  for (std::string line; std::getline(text, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) meta[line.substr(0, eq)] = line.substr(eq + 1);
  }
  if (meta["format"] != kFormat) {
    fail(FTC_ERR_IO, "'" + file + "' is a training package of format '" + meta["format"] + "', this FTorch reads '" +
                         kFormat + "': export it again with this FTorch's `python -m ftorch export --train`");
  }
  return meta;
}

std::vector<std::string> split(const std::string &text, char sep) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, sep);) items.push_back(item);
  return items;
}

size_t count_of(std::unordered_map<std::string, std::string> &meta, const char *key, const std::string &file) {
  try {
    return static_cast<size_t>(std::stoul(meta.at(key)));
  } catch (const std::exception &) {
    fail(FTC_ERR_IO, "'" + file + "': the training record has no valid '" + key + "'");
  }
}

// The tensors of list `key` of the package's state.
std::vector<at::Tensor> state_list(const c10::IValue &state, const char *key, size_t expected, const std::string &file) {
  std::vector<at::Tensor> out;
  if (state.isGenericDict()) {
    const auto dict = state.toGenericDict();
    const auto it = dict.find(c10::IValue(std::string(key)));
    if (it != dict.end() && it->value().isList()) {
      for (const auto &v : it->value().toListRef()) {
        if (v.isTensor()) out.push_back(v.toTensor());
      }
    }
  }
  if (out.size() != expected) {
    fail(FTC_ERR_IO, "'" + file + "': the package's state holds " + std::to_string(out.size()) + " " + key +
                         ", its training record names " + std::to_string(expected));
  }
  return out;
}

// params, then buffers, then `more`: the leading inputs of every compiled model of a package.
std::vector<at::Tensor> with_state(const std::vector<at::Tensor> &params,
                                   const std::vector<at::Tensor> &buffers, std::initializer_list<const std::vector<at::Tensor> *> more) {
  std::vector<at::Tensor> flat;
  size_t n = params.size() + buffers.size();
  for (const auto *m : more) n += m->size();
  flat.reserve(n);
  flat.insert(flat.end(), params.begin(), params.end());
  flat.insert(flat.end(), buffers.begin(), buffers.end());
  for (const auto *m : more) flat.insert(flat.end(), m->begin(), m->end());
  return flat;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The compiled forward as one node of the autograd graph: its backward runs the compiled backward
// (which recomputes the forward, given the random values the forward drew).
struct PackageNode : public torch::autograd::Function<PackageNode> {
  // The tensors come as TensorLists: the form whose items autograd takes as the node's inputs.
  static variable_list forward(AutogradContext *ctx, int64_t id, bool training, at::TensorList params,
                               at::TensorList inputs) {
    const auto p = package_of(id);
    const std::vector<at::Tensor> params_vec = params.vec(), inputs_vec = inputs.vec();
    // Eval mode of a package whose eval forward is another: that one, which draws nothing and
    // updates no buffer.
    const bool own_eval = !training && p->eval;
    auto results = run_compiled(own_eval ? *p->eval : *p->forward, with_state(params_vec, p->buffers, {&inputs_vec}));
    const size_t n_out = p->n_outputs, n_buf = own_eval ? 0 : p->buffers.size();
    const size_t n_random = own_eval ? 0 : p->n_random;
    if (results.size() != n_out + n_buf + n_random) {
      fail(FTC_ERR_INTERNAL, "the compiled forward returned " + std::to_string(results.size()) + " tensors, expected " +
                                 std::to_string(n_out + n_buf + n_random));
    }
    // Buffers as the forward read them, for the backward (a copy: a later training forward updates
    // them); a training forward then updates them (batch-norm running statistics) in place, where
    // every holder of the buffer sees them.
    std::vector<at::Tensor> buffers_read;
    buffers_read.reserve(p->buffers.size());
    for (size_t k = 0; k < p->buffers.size(); ++k) {
      buffers_read.push_back(p->buffers[k].clone());
      if (training) p->buffers[k].copy_(results[n_out + k]);
    }
    std::vector<at::Tensor> saved(params.begin(), params.end());
    saved.insert(saved.end(), inputs.begin(), inputs.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["id"] = id;
    ctx->saved_data["eval"] = own_eval;
    ctx->saved_data["buffers"] = c10::List<at::Tensor>(buffers_read);
    ctx->saved_data["random"] = c10::List<at::Tensor>(
        std::vector<at::Tensor>(results.begin() + static_cast<std::ptrdiff_t>(n_out + n_buf), results.end()));
    std::vector<at::Tensor> outputs(results.begin(), results.begin() + static_cast<std::ptrdiff_t>(n_out));
    // What an unused output's gradient is made of: its shape and options.
    c10::List<at::Tensor> like;
    for (const auto &o : outputs) like.push_back(at::empty({0}, o.options()));
    ctx->saved_data["like"] = like;
    for (size_t k = 0; k < outputs.size(); ++k) ctx->saved_data["shape" + std::to_string(k)] = outputs[k].sizes().vec();
    return outputs;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grad_outputs) {
    const auto p = package_of(ctx->saved_data["id"].toInt());
    const auto saved = ctx->get_saved_variables();
    const size_t n_params = p->params.size();
    const std::vector<at::Tensor> params(saved.begin(), saved.begin() + static_cast<std::ptrdiff_t>(n_params));
    const std::vector<at::Tensor> inputs(saved.begin() + static_cast<std::ptrdiff_t>(n_params), saved.end());
    const auto buffers = ctx->saved_data["buffers"].toTensorVector();
    const auto random = ctx->saved_data["random"].toTensorVector();
    const auto like = ctx->saved_data["like"].toTensorVector();
    std::vector<at::Tensor> grads;
    for (size_t k = 0; k < grad_outputs.size(); ++k) {
      grads.push_back(grad_outputs[k].defined()
                          ? grad_outputs[k]
                          : at::zeros(ctx->saved_data["shape" + std::to_string(k)].toIntVector(), like[k].options()));
    }
    auto results = ctx->saved_data["eval"].toBool()
                       ? run_compiled(*p->eval_backward, with_state(params, buffers, {&inputs, &grads}))
                       : run_compiled(*p->backward, with_state(params, buffers, {&inputs, &random, &grads}));
    variable_list out;
    out.reserve(2 + n_params + inputs.size());
    out.emplace_back();  // id
    out.emplace_back();  // training
    size_t r = 0;
    // A parameter the forward does not use keeps no gradient, as in PyTorch (the compiled
    // backward returns zeros for it).
    for (size_t k = 0; k < n_params; ++k, ++r) out.push_back(p->unused[k] ? at::Tensor() : results.at(r));
    for (size_t k = 0; k < inputs.size(); ++k) out.push_back(p->input_gradient[k] ? results.at(r++) : at::Tensor());
    // (the compiled backward records no graph: under create_graph its gradients fail when
    // differentiated, rather than count as constants and drop the second derivative)
    return ftc::once_differentiable(std::move(out), grad_outputs,
                                    "differentiating the backward of a training package (second derivatives, "
                                    "create_graph, torch_autograd_jvp): its compiled backward is once differentiable");
  }
};

// Where a tensor's memory is (its storage's allocation; a parameter or buffer has one).
const void *memory_of(const at::Tensor &t) {
  return t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl()->data();
}

// The state bound to the infer model's constants (again, when a tensor's memory moved since).
void bind_state(TrainingPackage &p) {
  std::lock_guard<std::mutex> lock(p.bind_mutex);
  const size_t n_params = p.params.size();
  for (size_t k = 0; k < p.bound.size(); ++k) {
    const at::Tensor &t = k < n_params ? p.params[k] : p.buffers[k - n_params];
    p.bound[k] = t.detach();  // assigned into the element: its address stays
    p.bound_at[k] = memory_of(t);
  }
  bind_constants(*p.infer, p.infer_state, p.bound);
}

// The infer model, its state current: the state is read where it is (bound constants), only the
// inputs are passed. FTorch writes parameters and buffers in place (optimizers, `=`,
// checkpoints), so their memory stays; should a tensor's memory have moved all the same, it is
// bound again first (a compare per tensor), rather than the compiled code reading the old memory.
CompiledModel &infer_model(TrainingPackage &p) {
  const void *const *at = p.bound_at.data();
  bool moved = false;
  for (const auto &t : p.params) moved |= memory_of(t) != *at++;
  for (const auto &t : p.buffers) moved |= memory_of(t) != *at++;
  if (moved) bind_state(p);
  return *p.infer;
}

// forward of package p on inputs: one autograd node when a graph is to be recorded, else the
// compiled forward alone.
std::vector<at::Tensor> run_package_on(TrainingPackage *p, bool training, std::vector<at::Tensor> inputs) {
  const int64_t id = p->id;
  if (inputs.size() != p->n_inputs) {
    fail(FTC_ERR_INVALID_ARGUMENT, "the training package takes " + std::to_string(p->n_inputs) + " input" +
                                       (p->n_inputs == 1 ? "" : "s") + ", got " + std::to_string(inputs.size()));
  }
  bool wants_graph = false;
  if (at::GradMode::is_enabled()) {
    for (const auto &t : p->params) wants_graph = wants_graph || t.requires_grad();
    for (const auto &t : inputs) wants_graph = wants_graph || t.requires_grad();
  }
  // No graph, and a forward that changes nothing (eval mode, or a training mode that computes the
  // same): the infer model, which checks the inputs against the same rules itself.
  if (!wants_graph && p->infer && (!training || !p->eval)) return run_compiled(infer_model(*p), std::move(inputs));
  if (p->input_rules) check_inputs(*p->input_rules, inputs);
  if (wants_graph && !training && p->eval && !p->eval_backward) {
    fail(FTC_ERR_INVALID_ARGUMENT,
         "this training package computes something else in eval mode than in training mode (dropout, batch "
         "norm) and has no eval-mode backward (it was exported by an earlier FTorch: export it again for one): "
         "run the eval-mode forward without recording a graph (requires_grad=.false.), or switch the model to "
         "training mode for gradients");
  }
  if (wants_graph) return PackageNode::apply(id, training, at::TensorList(p->params), at::TensorList(inputs));
  // No graph to record: the compiled forward alone (a training one still updates the buffers).
  if (!training && p->eval) return run_compiled(*p->eval, with_state(p->params, p->buffers, {&inputs}));
  auto results = run_compiled(*p->forward, with_state(p->params, p->buffers, {&inputs}));
  if (training) {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < p->buffers.size(); ++k) p->buffers[k].copy_(results.at(p->n_outputs + k));
  }
  results.resize(p->n_outputs);
  return results;
}

// torch.ops.ftorch.package_forward(package, training, inputs): what a training package's module
// forward calls.
std::vector<at::Tensor> run_package(int64_t id, bool training, std::vector<at::Tensor> inputs) {
  const auto p = package_of(id);  // held for the call
  return run_package_on(p.get(), training, std::move(inputs));
}

TORCH_LIBRARY(ftorch, m) { m.def("package_forward(int package, bool training, Tensor[] inputs) -> Tensor[]"); }

// Above autograd: the kernel records the node itself.
TORCH_LIBRARY_IMPL(ftorch, CompositeImplicitAutograd, m) { m.impl("package_forward", &run_package); }

// `value` as torch.save writes it (a zip of a pickle and the tensors' bytes), without the
// TorchScript type tags torch::pickle_save adds (torch.load(weights_only=True) refuses those).
std::vector<char> pickled(const c10::IValue &value) {
  std::vector<char> data;
  torch::jit::Pickler pickler([&](const char *bytes, size_t n) { data.insert(data.end(), bytes, bytes + n); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void *bytes, size_t n) {
    const auto *b = static_cast<const char *>(bytes);
    archive.insert(archive.end(), b, b + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", data.data(), data.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

// Names in the module's TorchScript source: `ftorch` is this library's operator namespace.
struct PackageResolver : public torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string &name, torch::jit::GraphFunction &m,
                                                         const torch::jit::SourceRange &loc) override {
    if (name == "ftorch") return std::make_shared<torch::jit::BuiltinModule>("ftorch");
    return torch::jit::nativeResolver()->resolveValue(name, m, loc);
  }
  c10::TypePtr resolveType(const std::string &, const torch::jit::SourceRange &) override { return nullptr; }
};

// The module that owns the parameter or buffer `dotted` ("encoder.0.weight"): submodules made on
// the way, each with the "training" attribute that train()/eval() set.
torch::jit::Module owner_of(torch::jit::Module root, const std::string &dotted, std::string &leaf,
                            const std::shared_ptr<torch::jit::CompilationUnit> &cu) {
  auto parts = split(dotted, '.');
  leaf = parts.back();
  parts.pop_back();
  torch::jit::Module cur = std::move(root);
  std::string path = "__torch__.ftorch.TrainingPackage";
  for (const auto &part : parts) {
    path += "_" + part;
    if (cur.hasattr(part) && cur.attr(part).isModule()) {
      cur = cur.attr(part).toModule();
      continue;
    }
    torch::jit::Module child(c10::QualifiedName(path), cu, /*shouldMangle=*/true);
    child.register_attribute("training", c10::BoolType::get(), true);
    cur.register_module(part, child);
    cur = child;
  }
  return cur;
}

}  // namespace

std::vector<at::Tensor> package_forward(const Model &model, std::vector<at::Tensor> inputs, bool requires_grad) {
  at::AutoGradMode grad_mode(requires_grad);
  return run_package_on(model.package.get(), model.module.is_training(), std::move(inputs));
}

CompiledModel *package_inference(const Model &model, int requires_grad) {
  TrainingPackage *p = model.package.get();
  if (requires_grad != 0 || !p->infer || (p->eval && model.module.is_training())) return nullptr;
  return &infer_model(*p);
}

TrainingPackage::~TrainingPackage() {
  auto &r = Registry::instance();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.packages.erase(id);
}

bool is_training_package(const std::string &file) {
  for (const auto &record : archive_records(file)) {
    if (record == kMetaRecord) return true;
  }
  return false;
}

std::shared_ptr<Model> load_training_package(const std::string &file, const c10::Device &device, bool requires_grad,
                                             int is_training) {
  (void)requires_grad;  // parameters keep the trainability they were exported with, as TorchScript's do
  auto p = std::make_shared<TrainingPackage>();
  p->file = file;
  p->device = device;
  c10::IValue state;
  std::unordered_map<std::string, std::string> meta;
  try {
    caffe2::serialize::PyTorchStreamReader reader(file);
    meta = read_meta(reader, file);
    if (!reader.hasRecord(kStateRecord)) fail(FTC_ERR_IO, "'" + file + "' holds no parameters (" + kStateRecord + ")");
    auto [data, size] = reader.getRecord(kStateRecord);
    const auto *bytes = static_cast<const char *>(data.get());
    state = torch::pickle_load(std::vector<char>(bytes, bytes + size));
  } catch (const Error &) {
    throw;
  } catch (const c10::Error &e) {
    fail(FTC_ERR_IO, "cannot read the training package '" + file + "': " + e.what_without_backtrace());
  }
  p->param_names = split(meta["parameters"], ',');
  p->buffer_names = split(meta["buffers"], ',');
  // "key" or, for a tensor held under another name too, "key:name" (packages before tied weights
  // were recorded list their keys only). A plain key that is no parameter or buffer (a module's
  // extra state; a tied weight's second name in packages of before) is left out of what
  // torch_model_save writes, as before; a name after ':' must be one.
  const auto held = [&](const std::string &name) {
    return std::find(p->param_names.begin(), p->param_names.end(), name) != p->param_names.end() ||
           std::find(p->buffer_names.begin(), p->buffer_names.end(), name) != p->buffer_names.end();
  };
  for (const auto &entry : split(meta["state_dict"], ',')) {
    const auto colon = entry.find(':');
    if (colon == std::string::npos) {
      if (held(entry)) p->state_dict.emplace_back(entry, entry);
      continue;
    }
    const std::string name = entry.substr(colon + 1);
    if (!held(name)) {
      fail(FTC_ERR_IO, "'" + file + "': the training record's state_dict names '" + name +
                           "', which is neither a parameter nor a buffer of the package");
    }
    p->state_dict.emplace_back(entry.substr(0, colon), name);
  }
  const auto trainable = split(meta["requires_grad"], ',');
  p->n_inputs = count_of(meta, "inputs", file);
  p->n_outputs = count_of(meta, "outputs", file);
  p->n_random = count_of(meta, "random_values", file);
  p->input_gradient.assign(p->n_inputs, false);
  for (const auto &k : split(meta["input_gradients"], ',')) {
    const auto i = static_cast<size_t>(std::stoul(k));
    if (i >= 1 && i <= p->n_inputs) p->input_gradient[i - 1] = true;
  }
  if (!meta["input_rules"].empty()) p->input_rules = parse_rules(meta["input_rules"]);
  p->unused.assign(p->param_names.size(), false);
  for (const auto &k : split(meta["unused_parameters"], ',')) {
    const auto i = static_cast<size_t>(std::stoul(k));
    if (i >= 1 && i <= p->unused.size()) p->unused[i - 1] = true;
  }
  const auto params = state_list(state, "parameters", p->param_names.size(), file);
  const auto buffers = state_list(state, "buffers", p->buffer_names.size(), file);

  p->forward = load_compiled(file, device, "forward");
  p->backward = load_compiled(file, device, "backward");
  if (meta["eval"] == "eval") p->eval = load_compiled(file, device, "eval");
  if (!meta["step"].empty()) p->step = load_compiled(file, device, meta["step"]);
  if (p->eval && !meta["eval_backward"].empty()) p->eval_backward = load_compiled(file, device, meta["eval_backward"]);
  if (!meta["infer"].empty()) {
    p->infer = load_compiled(file, device, meta["infer"]);
    p->infer_state = split(meta["infer_state"], ',');
    if (p->infer_state.size() != params.size() + buffers.size()) {
      fail(FTC_ERR_IO, "'" + file + "': the training record names " + std::to_string(p->infer_state.size()) +
                           " constants of the inference model for " + std::to_string(params.size() + buffers.size()) +
                           " parameters and buffers");
    }
  }

  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module module(c10::QualifiedName("__torch__.ftorch.TrainingPackage"), cu, /*shouldMangle=*/true);
  module.register_attribute("training", c10::BoolType::get(), true);
  for (size_t k = 0; k < params.size(); ++k) {
    std::string leaf;
    auto owner = owner_of(module, p->param_names[k], leaf, cu);
    at::Tensor t = params[k].to(device).detach().clone();
    t.requires_grad_(k >= trainable.size() || trainable[k] != "0");
    owner.register_parameter(leaf, t, /*is_buffer=*/false);
    p->params.push_back(t);
  }
  for (size_t k = 0; k < buffers.size(); ++k) {
    std::string leaf;
    auto owner = owner_of(module, p->buffer_names[k], leaf, cu);
    at::Tensor t = buffers[k].to(device).detach().clone();
    owner.register_buffer(leaf, t);
    p->buffers.push_back(t);
  }
  if (p->infer) {  // sized once, here: the compiled model keeps the addresses of its elements
    p->bound.resize(p->params.size() + p->buffers.size());
    p->bound_at.assign(p->bound.size(), nullptr);
    bind_state(*p);
  }
  {
    auto &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    p->id = r.next++;
    r.packages[p->id] = p;
  }
  module.register_attribute("_ftorch_package", c10::IntType::get(), p->id);
  std::string args, list, result;
  for (size_t i = 1; i <= p->n_inputs; ++i) {
    args += ", x" + std::to_string(i) + ": Tensor";
    list += (i > 1 ? ", x" : "x") + std::to_string(i);
  }
  if (p->n_outputs == 1) {
    result = "r[0]";
  } else {
    for (size_t k = 0; k < p->n_outputs; ++k) result += (k > 0 ? ", r[" : "(r[") + std::to_string(k) + "]";
    result += ")";
  }
  module.define("def forward(self" + args + "):\n    r = ftorch.package_forward(self._ftorch_package, "
                "self.training, [" + list + "])\n    return " + result + "\n",
                std::make_shared<PackageResolver>());
  module.train(is_training != 0);
  auto model = std::make_shared<Model>();
  model->module = std::move(module);
  model->package = std::move(p);
  return model;
}

void save_training_package(const Model &model, const std::string &file) {
  const auto &p = *model.package;
  // The state_dict as the model's own: its keys in its order (parameters and persistent buffers).
  std::unordered_map<std::string, at::Tensor> by_name;
  for (size_t k = 0; k < p.params.size(); ++k) by_name[p.param_names[k]] = p.params[k];
  for (size_t k = 0; k < p.buffers.size(); ++k) by_name[p.buffer_names[k]] = p.buffers[k];
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto &[key, name] : p.state_dict) {
    dict.insert(key, by_name.at(name).detach().cpu());  // (every name checked when loaded)
  }
  const bool package = file.size() >= 4 && file.compare(file.size() - 4, 4, ".pt2") == 0;
  const std::string tmp = temporary_name(file);
  try {
    if (!package) {
      const auto bytes = pickled(c10::IValue(dict));
      std::FILE *f = std::fopen(tmp.c_str(), "wb");
      if (f == nullptr) fail(FTC_ERR_IO, "cannot write the state_dict to '" + file + "'");
      const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
      if (std::fclose(f) != 0 || !ok) fail(FTC_ERR_IO, "cannot write the state_dict to '" + file + "'");
    } else {
      // Lists of Any: a tensor-typed list is pickled with a TorchScript constructor that
      // torch.load(weights_only=True) refuses.
      c10::impl::GenericList params(c10::AnyType::get()), buffers(c10::AnyType::get());
      for (const auto &t : p.params) params.push_back(t.detach().cpu());
      for (const auto &t : p.buffers) buffers.push_back(t.detach().cpu());
      c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
      state.insert("parameters", params);
      state.insert("buffers", buffers);
      const auto bytes = pickled(c10::IValue(state));
      caffe2::serialize::PyTorchStreamReader reader(p.file);
      // Written through a function: a writer given a file name would name the archive's folder
      // after the temporary file (its host and process); this one names it "archive", as torch's.
      std::unique_ptr<std::FILE, int (*)(std::FILE *)> out(std::fopen(tmp.c_str(), "wb"), &std::fclose);
      if (!out) fail(FTC_ERR_IO, "cannot write the package to '" + file + "'");
      bool written = true;
      caffe2::serialize::PyTorchStreamWriter writer([&](const void *bytes, size_t n) {
        written = written && std::fwrite(bytes, 1, n, out.get()) == n;
        return n;
      });
      for (const auto &name : reader.getAllRecords()) {
        if (name == kStateRecord) {
          writer.writeRecord(name, bytes.data(), bytes.size());
        } else if (name == kMetaRecord) {
          // Which parameters train as they are now (frozen or unfrozen since the export), as a
          // TorchScript file keeps its parameters' requires_grad.
          auto [data, size] = reader.getRecord(name);
          std::istringstream text(std::string(static_cast<const char *>(data.get()), size));
          std::string out;
          for (std::string line; std::getline(text, line);) {
            if (line.rfind("requires_grad=", 0) == 0) {
              line = "requires_grad=";
              for (size_t k = 0; k < p.params.size(); ++k) line += (k > 0 ? "," : "") + std::string(p.params[k].requires_grad() ? "1" : "0");
            }
            out += line + "\n";
          }
          writer.writeRecord(name, out.data(), out.size());
        } else {
          auto [data, size] = reader.getRecord(name);
          writer.writeRecord(name, data.get(), size);
        }
      }
      writer.writeEndOfFile();
      if (std::fclose(out.release()) != 0 || !written) fail(FTC_ERR_IO, "cannot write the package to '" + file + "'");
    }
  } catch (const Error &) {
    std::remove(tmp.c_str());
    throw;
  } catch (const std::exception &e) {
    std::remove(tmp.c_str());
    fail(FTC_ERR_IO, "cannot write '" + file + "': " + e.what());
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(FTC_ERR_IO, "cannot rename the written file into place at '" + file + "'");
  }
}

namespace {

// Whether `inputs` fit `rules` (what check_inputs accepts).
bool fits(const std::vector<InputRule> &rules, const std::vector<at::Tensor> &inputs) {
  try {
    check_inputs(rules, inputs);
    return true;
  } catch (const Error &) {
    return false;
  }
}

// What keeps the step from the compiled one ("" when nothing does).
// Whether a gradient hook is registered on t and not removed since (torch_tensor_register_hook:
// LibTorch keeps a removed hook's slot, emptied).
bool has_gradient_hook(const at::Tensor &t) {
  const auto *meta = torch::autograd::impl::get_autograd_meta(t);
  if (meta == nullptr || !meta->cpp_hooks_list_) return false;
  for (const auto &hook : *meta->cpp_hooks_list_) {
    if (hook) return true;
  }
  return false;
}

std::string not_compiled_because(const TrainStep &step, const std::vector<at::Tensor> &data) {
  const TrainingPackage *p = step.package;
  if (p == nullptr) return "the model is not a training package";
  if (!p->step) return "the package has no compiled training step (export it again with this FTorch)";
  if (!step.module->is_training()) return "the model is in eval mode";
  if (step.loss_kind != FTC_LOSS_MSE) return "the loss is not MSE";
  if (step.reduction != FTC_REDUCTION_MEAN && step.reduction != FTC_REDUCTION_SUM) return "the reduction is not mean or sum";
  const Optim &opt = *step.opt;
  if (opt.kind != FTC_OPTIM_ADAM && opt.kind != FTC_OPTIM_ADAMW) return "the optimizer is not Adam or AdamW";
  if (opt.sync) return "the optimizer is data-parallel";
  if (opt.opt->param_groups().size() != 1) return "the optimizer has several parameter groups";
  if (settings_of(opt).amsgrad) return "the optimizer uses amsgrad";
  if (opt.params.size() != p->params.size()) return "the optimizer does not update exactly the model's parameters";
  for (size_t k = 0; k < p->params.size(); ++k) {
    if (!opt.params[k].is_same(p->params[k])) return "the optimizer does not update the model's parameters in order";
    if (!p->params[k].requires_grad()) return "a parameter is frozen";
    if (p->unused[k]) return "parameter " + p->param_names[k] + " is not used by the forward (its gradient stays none)";
    // (the compiled step writes gradients directly: hooks would not run)
    if (has_gradient_hook(p->params[k])) return "parameter " + p->param_names[k] + " has a gradient hook";
  }
  for (const auto &t : data) {
    // (its gradient, and the graph it came from, need autograd's backward)
    if (t.requires_grad()) return "an input or the target requires grad";
  }
  const auto *rules = input_rules(*p->step);
  if (rules == nullptr || rules->size() < p->n_inputs + 1) return "the package records no input rules";
  if (!fits(std::vector<InputRule>(rules->end() - static_cast<std::ptrdiff_t>(data.size()), rules->end()), data)) {
    return "the inputs or the target do not have the exported shapes and dtypes";
  }
  for (const auto &t : data) {
    if (t.device() != p->device) return "an input or the target is on another device than the model";
  }
  int64_t t = -1;
  for (const auto &param : p->params) {
    auto *s = state_of(opt, param);
    const int64_t count = s != nullptr ? adam_state(opt, *s).step : 0;
    if (t >= 0 && count != t) return "the parameters have different step counts";
    t = count;
  }
  // The compiled step writes these in place: one held in another memory layout would be handed
  // over as a row-major copy whose update is then lost. (The packages this FTorch writes hold
  // their state row-major whatever the module's layout; this guards packages written otherwise.)
  const auto row_major = [](const at::Tensor &x) { return !x.defined() || x.is_contiguous(); };
  for (const auto &param : p->params) {
    auto *s = state_of(opt, param);
    const AdamState a = s != nullptr ? adam_state(opt, *s) : AdamState{};
    if (!row_major(param) || !row_major(param.grad()) || !row_major(a.exp_avg) || !row_major(a.exp_avg_sq)) {
      return "parameter " + p->param_names[&param - p->params.data()] +
             " (or its gradient or optimizer state) is not in row-major memory";
    }
  }
  for (const auto &b : p->buffers) {
    if (!row_major(b)) return "a buffer is not in row-major memory";
  }
  return "";
}

// FTORCH_COMPILED_STEP: unset or 1, the compiled step where it applies; 0, never; "require",
// an error saying why when it does not apply.
int compiled_step_setting() {
  static const int setting = [] {
    const char *v = std::getenv("FTORCH_COMPILED_STEP");
    if (v == nullptr || std::string(v).empty() || std::string(v) == "1") return 1;
    if (std::string(v) == "require") return 2;
    return 0;
  }();
  return setting;
}

}  // namespace

std::optional<double> compiled_train_step(TrainStep &step) {
  const int setting = compiled_step_setting();
  if (setting == 0 || (step.package == nullptr && setting != 2)) return std::nullopt;
  // The inputs and the target, as the compiled step takes them after the model's state.
  std::vector<at::Tensor> data(step.inputs);
  data.push_back(step.target);
  const std::string why = not_compiled_because(step, data);
  if (!why.empty()) {
    if (setting == 2) {
      fail(FTC_ERR_INVALID_ARGUMENT, "FTORCH_COMPILED_STEP=require, but this step is not the compiled one: " + why);
    }
    return std::nullopt;
  }
  TrainingPackage *p = step.package;
  Optim &opt = *step.opt;
  const Settings settings = settings_of(opt);
  // One step count for every parameter (as after steps that updated all of them).
  std::vector<torch::optim::OptimizerParamState *> states;
  int64_t t = -1;
  for (const auto &param : p->params) {
    auto &s = adam_state_made(opt, param, false);
    t = adam_state(opt, s).step;  // the same for all (not_compiled_because)
    states.push_back(&s);
  }
  ++t;
  const double bias_correction1 = 1 - std::pow(settings.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(settings.beta2, static_cast<double>(t));
  const bool decoupled = opt.kind == FTC_OPTIM_ADAMW;
  // The numbers the compiled update reads, in _train_package.py's order (each computed in double
  // as LibTorch's Adam, AdamW and clip_grad_norm_ compute them).
  const std::vector<double> numbers{settings.beta1,
                                    1 - settings.beta1,
                                    settings.beta2,
                                    1 - settings.beta2,
                                    settings.eps,
                                    decoupled ? 0.0 : settings.weight_decay,
                                    decoupled ? 1 - settings.lr * settings.weight_decay : 1.0,
                                    settings.lr / bias_correction1,
                                    std::sqrt(bias_correction2),
                                    step.max_grad_norm > 0 ? step.max_grad_norm : 0.0,
                                    step.reduction == FTC_REDUCTION_MEAN ? 1.0 : 0.0};
  at::Tensor settings_tensor =
      at::tensor(numbers, at::TensorOptions().dtype(at::kDouble)).to(p->device, /*non_blocking=*/false);
  std::vector<at::Tensor> flat;
  flat.reserve(4 * p->params.size() + p->buffers.size() + 2 + step.inputs.size());
  flat.insert(flat.end(), p->params.begin(), p->params.end());
  flat.insert(flat.end(), p->buffers.begin(), p->buffers.end());
  for (auto &param : p->params) {
    // The gradients are written as the eager step leaves them (readable after the step).
    if (!param.grad().defined()) param.mutable_grad() = at::zeros_like(param, at::MemoryFormat::Contiguous);
    flat.push_back(param.grad());
  }
  for (auto *s : states) flat.push_back(adam_state(opt, *s).exp_avg);
  for (auto *s : states) flat.push_back(adam_state(opt, *s).exp_avg_sq);
  flat.push_back(settings_tensor);
  flat.insert(flat.end(), data.begin(), data.end());
  const auto results = run_compiled(*p->step, std::move(flat));
  // Written in place by the compiled code: what autograd's version checks must see as changed.
  for (auto &param : p->params) param.unsafeGetTensorImpl()->bump_version();
  for (auto &b : p->buffers) b.unsafeGetTensorImpl()->bump_version();
  for (auto *s : states) advance_step(opt, *s);
  return results.at(0).item<double>();
}

}  // namespace ftc
