// function.cpp - custom autograd functions (user code for forward and backward, one node in the
// graph) and their context (ftorch_c_function.h; saved-tensor hooks and activation checkpointing:
// saved_tensors.cpp).
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "once_differentiable.hpp"
#include "saved_tensors.hpp"
#include "torch_compat.hpp"

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::SavedVariableHooks;
using torch::autograd::variable_list;
using torch::autograd::VariableInfo;
using ftc::compat::NodePtr;

struct Definition {
  std::string name;
  ftc_backward_fn backward = nullptr;
  void *data = nullptr;
  int flags = 0;
};

// Definitions live as long as the process (a deque: references stay valid as it grows).
std::mutex definitions_mutex;
std::deque<Definition> definitions;

const Definition &definition(int64_t id) {
  std::lock_guard<std::mutex> lock(definitions_mutex);
  if (id < 1 || id > static_cast<int64_t>(definitions.size())) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "custom function id " + std::to_string(id) +
                                            " is not defined (define it with torch_function_define first)");
  }
  return definitions[static_cast<size_t>(id - 1)];
}

struct Value {
  int kind = FTC_VALUE_INTEGER;
  std::vector<int64_t> ints;
  std::vector<double> reals;
};

const char *value_kind_name(int kind) {
  switch (kind) {
    case FTC_VALUE_INTEGER: return "integer";
    case FTC_VALUE_REAL: return "real";
    case FTC_VALUE_LOGICAL: return "logical";
    default: ftc::fail_unknown(ftc::ftc_value_kind_table, kind);
  }
}

// ------------------------------------------------------------------------ the node

struct FunctionNode : Node {
  const Definition *def = nullptr;
  // Forward only: the inputs, the handles the forward sees, what it asked for.
  std::vector<at::Tensor> inputs;
  std::vector<ftc_tensor> forward_handles;
  std::vector<at::Tensor> to_save;
  // The handles save_for_backward was given and their tensors' versions then: a handle given new
  // values by `=` before forward returns is an error (see check_saved_unchanged).
  std::vector<ftc_tensor> to_save_handles;
  std::vector<uint32_t> to_save_versions;
  std::vector<int> non_differentiable;
  std::vector<std::pair<int, int>> dirty;  // (input, output)
  std::unique_ptr<at::AutoGradMode> forward_mode;
  bool in_forward = true;
  // Both.
  std::map<std::string, Value> values;
  bool materialize = true;
  std::vector<VariableInfo> input_info, output_info;
  // Backward.
  std::vector<SavedVariable> saved;
  bool freed = false;
  bool in_backward = false;
  std::mutex mutex;

  std::string name() const override { return def->name; }
  variable_list apply(variable_list &&grads) override;
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex);
    saved.clear();
    freed = true;
  }
  std::string label() const { return "custom function '" + def->name + "'"; }
};

using CtxTable = ftc::HandleTable<NodePtr<FunctionNode>>;

FunctionNode &node_of(ftc_function_ctx ctx) {
  auto *s = CtxTable::instance().find(ctx);
  if (s == nullptr || !s->value) {
    ftc::fail(FTC_ERR_NULL_HANDLE, "the custom-function context is not live: contexts are valid only inside the "
                                   "forward and backward procedures they are given to");
  }
  return *s->value;
}

FunctionNode &forward_node(ftc_function_ctx ctx, const char *what) {
  FunctionNode &n = node_of(ctx);
  if (!n.in_forward) ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " is for forward, not backward");
  return n;
}

FunctionNode &backward_node(ftc_function_ctx ctx, const char *what) {
  FunctionNode &n = node_of(ctx);
  if (!n.in_backward) ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " is for backward, not forward");
  return n;
}

int checked_index(int i, size_t n, const char *what) {
  if (i < 0 || static_cast<size_t>(i) >= n) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " index " + std::to_string(i + 1) + " is out of range 1.." +
                                            std::to_string(n));
  }
  return i;
}

std::string info_string(const VariableInfo &info) {
  return ftc::shape_string(c10::asIntArrayRefUnchecked(info.size)) + ", " + c10::toString(info.scalar_type) + ", " +
         info.device.str();
}

// The user's backward, with grad mode as LibTorch set it (on under create_graph) for functions
// whose backward is differentiable, off otherwise.
variable_list run_backward(FunctionNode &node, const variable_list &grads) {
  ftc::CallbackHandles handles;
  std::vector<ftc_tensor> grad_handles(grads.size(), nullptr);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) grad_handles[i] = handles.add(grads[i]);
  }
  const size_t n_in = node.input_info.size();
  ftc::CallbackHandles results;  // the callback's gradients, freed if not taken
  results.handles.assign(n_in, nullptr);
  int n_returned = static_cast<int>(n_in);
  ftc_function_ctx ctx = CtxTable::instance().acquire(ftc::compat::node_ptr(node));
  struct Ctx {
    ftc_function_ctx ctx;
    FunctionNode &node;
    ~Ctx() {
      node.in_backward = false;
      CtxTable::instance().release(ctx);
    }
  } release_ctx{ctx, node};
  node.in_backward = true;
  const int status = node.def->backward(node.def->data, ctx, grad_handles.data(), static_cast<int>(grads.size()),
                                        results.handles.data(), static_cast<int>(n_in), &n_returned);
  ftc::check_callback_lazy(status, [&] { return "the backward of " + node.label(); });
  if (n_returned != static_cast<int>(n_in)) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the backward of " + node.label() + " returned " + std::to_string(n_returned) +
                                            " gradients, but the function has " + std::to_string(n_in) + " inputs");
  }
  variable_list out(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    out[i] = ftc::take_callback_result_lazy(results.handles[i], [&] {
      return "gradient " + std::to_string(i + 1) + " returned by the backward of " + node.label();
    });
  }
  return out;
}

variable_list FunctionNode::apply(variable_list &&grads) {
  std::lock_guard<std::mutex> lock(mutex);
  if (freed) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "backward through " + label() +
                                            " a second time: its saved tensors were freed by the first backward "
                                            "(pass retain_graph=.true. to the first)");
  }
  at::OptionalDeviceGuard device_guard;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() && materialize) grads[i] = output_info[i].zeros(device_guard);
  }
  const bool twice = (def->flags & FTC_FUNCTION_DOUBLE_BACKWARD) != 0;
  const bool create_graph = at::GradMode::is_enabled();
  variable_list result;
  {
    at::AutoGradMode mode(twice && create_graph);
    result = run_backward(*this, grads);
  }
  for (size_t i = 0; i < result.size(); ++i) {
    if (!result[i].defined()) continue;
    if (!next_edges()[i].is_valid()) {
      result[i] = at::Tensor();  // a gradient for an input that does not require one: dropped
      continue;
    }
    const VariableInfo &want = input_info[i];
    const at::Tensor &g = result[i];
    if (g.sizes() != c10::asIntArrayRefUnchecked(want.size) || g.scalar_type() != want.scalar_type ||
        g.device() != want.device) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the backward of " + label() + " returned gradient " + std::to_string(i + 1) +
                                              " with " + ftc::shape_string(g.sizes()) + ", " +
                                              c10::toString(g.scalar_type()) + ", " + g.device().str() +
                                              " but input " + std::to_string(i + 1) + " has " + info_string(want));
    }
  }
  if (create_graph && !twice) {
    // Once differentiable: the gradients are constants to a later backward, which must fail
    // rather than silently miss this function's second derivative.
    result = ftc::once_differentiable(std::move(result), grads,
                                      "differentiating the backward of " + label() +
                                          ", which is once differentiable (define it with double_backward=.true. if "
                                          "its backward is made of differentiable tensor operations)");
  }
  return result;
}

// The nodes whose forward runs on this thread (nested custom functions: several).
thread_local std::vector<const FunctionNode *> forwards_in_progress;

// What save_for_backward saved is what backward gets. A handle given new values by `=` after it was
// saved, before forward returned, would leave backward with the old values where `=` gave the
// handle new memory and with the new ones where it wrote in place: an error either way, as PyTorch
// refuses a saved tensor modified in place (inputs marked dirty are modified on purpose).
void check_saved_unchanged(const FunctionNode &node) {
  std::unordered_set<at::TensorImpl *> dirty;
  for (const auto &d : node.dirty) dirty.insert(node.inputs[static_cast<size_t>(d.first)].unsafeGetTensorImpl());
  for (size_t k = 0; k < node.to_save.size(); ++k) {
    const at::Tensor &saved = node.to_save[k];
    const auto *slot = ftc::TensorTable::instance().find(node.to_save_handles[k]);
    const bool replaced = slot != nullptr && slot->value.unsafeGetTensorImpl() != saved.unsafeGetTensorImpl();
    const bool written = saved._version() != node.to_save_versions[k] && dirty.count(saved.unsafeGetTensorImpl()) == 0;
    if (replaced || written) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "the forward of " + node.label() + " gave tensor " + std::to_string(k + 1) +
                    " of save_for_backward new values after saving it: call save_for_backward after the last "
                    "assignment to the tensors it saves (or save a copy, torch_clone)");
    }
  }
}

// Ends the forward of a node: grad mode restored, forward handles freed, context released.
void end_forward(ftc_function_ctx ctx, FunctionNode &node) {
  for (auto h : node.forward_handles) ftc::delete_tensor(h);
  node.forward_handles.clear();
  node.forward_mode.reset();
  node.in_forward = false;
  node.inputs.clear();
  node.to_save.clear();
  node.to_save_handles.clear();
  node.to_save_versions.clear();
  forwards_in_progress.erase(std::remove(forwards_in_progress.begin(), forwards_in_progress.end(), &node),
                             forwards_in_progress.end());
  CtxTable::instance().release(ctx);
}

}  // namespace

void ftc::check_not_saved_for_backward(const at::Tensor &t) {
  for (const FunctionNode *node : forwards_in_progress) {
    for (const auto &saved : node->to_save) {
      if (saved.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                  "the left-hand side was saved for backward by the forward of " + node->label() +
                      " (save_for_backward), so = would give it new values that backward would not see: call "
                      "save_for_backward after the last assignment to the tensors it saves (or save a copy, "
                      "torch_clone)");
      }
    }
  }
}


extern "C" {

int ftc_function_define(const char *name, int64_t name_len, ftc_backward_fn backward, void *data, int flags,
                        int64_t *id) {
  return ftc::guard([&] {
    ftc::out_arg(id, "id");
    if (backward == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the backward callback is null");
    if (name == nullptr || name_len <= 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a custom function needs a name");
    if ((flags & ~FTC_FUNCTION_DOUBLE_BACKWARD) != 0) {
      ftc::fail_unknown(ftc::ftc_function_flags_table, flags);
    }
    Definition def{std::string(name, static_cast<size_t>(name_len)), backward, data, flags};
    std::lock_guard<std::mutex> lock(definitions_mutex);
    // Defining the same function again (a define inside the time loop) reuses its definition.
    auto same = std::find_if(definitions.begin(), definitions.end(), [&](const Definition &d) {
      return d.name == def.name && d.backward == def.backward && d.data == def.data && d.flags == def.flags;
    });
    if (same == definitions.end()) same = definitions.insert(definitions.end(), std::move(def));
    *id = static_cast<int64_t>(same - definitions.begin()) + 1;
  });
}

int ftc_function_begin(int64_t id, const ftc_tensor *inputs, int n_inputs, ftc_function_ctx *ctx,
                       ftc_tensor *forward_inputs) {
  return ftc::guard([&] {
    const Definition &def = definition(id);
    auto tensors = ftc::tensors_of(inputs, n_inputs, "input");
    ftc::out_arg(ctx, "ctx");
    if (n_inputs > 0) ftc::out_arg(forward_inputs, "forward_inputs");
    auto node = ftc::compat::make_node<FunctionNode>();
    node->def = &def;
    const bool executable = at::GradMode::is_enabled() &&
                            std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor &t) { return t.requires_grad(); });
    node->set_next_edges(executable ? torch::autograd::collect_next_edges(tensors) : torch::autograd::edge_list(tensors.size()));
    for (const auto &t : tensors) node->input_info.emplace_back(t);
    for (const auto &t : tensors) node->forward_handles.push_back(ftc::new_tensor_handle(t));
    node->inputs = std::move(tensors);
    node->forward_mode = std::make_unique<at::AutoGradMode>(false);
    for (size_t i = 0; i < node->forward_handles.size(); ++i) forward_inputs[i] = node->forward_handles[i];
    forwards_in_progress.push_back(node.get());
    *ctx = CtxTable::instance().acquire(std::move(node));
  });
}

int ftc_function_abort(ftc_function_ctx ctx) {
  return ftc::guard([&] {
    FunctionNode &node = forward_node(ctx, "ftc_function_abort");
    end_forward(ctx, node);
  });
}

int ftc_function_finish(ftc_function_ctx ctx, ftc_tensor *outputs, int n_outputs) {
  return ftc::guard([&] {
    auto *slot = CtxTable::instance().find(ctx);
    if (slot == nullptr || !slot->value || !slot->value->in_forward) {
      ftc::fail(FTC_ERR_NULL_HANDLE, "the custom-function context is not live (finish called twice?)");
    }
    const NodePtr<FunctionNode> node = slot->value;
    struct End {
      ftc_function_ctx ctx;
      FunctionNode &node;
      ~End() { end_forward(ctx, node); }
    } end{ctx, *node};
    if (n_outputs < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a custom function needs at least one output");
    if (outputs == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "outputs array pointer is null");
    check_saved_unchanged(*node);
    const auto n_out = static_cast<size_t>(n_outputs);
    // Dirty inputs: the output is the input tensor itself.
    for (const auto &[in, out] : node->dirty) {
      checked_index(out, n_out, "mark_dirty output");
      ftc::install(&outputs[out], node->inputs[static_cast<size_t>(in)]);
    }
    std::vector<std::optional<at::Tensor>> raw(n_out);
    for (size_t i = 0; i < n_out; ++i) {
      auto *s = ftc::TensorTable::instance().find(outputs[i]);
      if (s == nullptr) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the forward of " + node->label() + " did not construct output " +
                                                std::to_string(i + 1));
      }
      raw[i] = s->value;
    }
    std::unordered_set<at::TensorImpl *> non_differentiable, dirty;
    for (int i : node->non_differentiable) {
      non_differentiable.insert(raw[static_cast<size_t>(checked_index(i, n_out, "mark_non_differentiable"))]->unsafeGetTensorImpl());
    }
    for (const auto &[in, out] : node->dirty) {
      at::TensorImpl *impl = node->inputs[static_cast<size_t>(in)].unsafeGetTensorImpl();
      impl->bump_version();
      dirty.insert(impl);
    }
    const bool executable = std::any_of(node->next_edges().begin(), node->next_edges().end(),
                                        [](const torch::autograd::Edge &e) { return e.is_valid(); });
    node->forward_mode.reset();  // outputs are wrapped with the caller's grad mode
    auto jvp = [](const variable_list &, const variable_list &) -> variable_list {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "forward-mode AD is not supported for custom functions");
    };
    auto view_as_self = [](const at::Tensor &x) { return x.view_as(x); };
    auto wrapped = ftc::compat::wrap_outputs(node->inputs, non_differentiable, dirty, raw,
                                             executable ? NodePtr<Node>(node) : NodePtr<Node>(), jvp, view_as_self);
    for (size_t i = 0; i < n_out; ++i) {
      auto *s = ftc::TensorTable::instance().find(outputs[i]);
      s->value = *wrapped[i];
      s->life.become_function_output();
      if (executable) node->output_info.emplace_back(*wrapped[i]);
    }
    if (!executable) return;
    // Saved tensors: outputs are saved as outputs (no reference cycle through the node).
    for (const auto &t : node->to_save) {
      at::Tensor v = t;
      bool is_output = false;
      for (const auto &w : wrapped) {
        if (w->unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          v = *w;
          is_output = w->grad_fn().get() == node.get();
        }
      }
      node->saved.emplace_back(v, is_output);
      if (auto hooks = ftc::saved_tensor_hooks_for(v)) node->saved.back().register_hooks(std::move(hooks));
    }
  });
}

int ftc_ctx_save_for_backward(ftc_function_ctx ctx, const ftc_tensor *tensors, int n) {
  return ftc::guard([&] {
    if (tensors != nullptr && n > 0) ftc::take_temporaries(tensors, n);  // (released even outside a forward)
    FunctionNode &node = forward_node(ctx, "save_for_backward");
    auto ts = ftc::tensors_of(tensors, n, "tensor to save");
    node.to_save_handles.assign(tensors, tensors + n);
    node.to_save_versions.clear();
    for (const auto &t : ts) node.to_save_versions.push_back(t._version());
    node.to_save = std::move(ts);
  });
}

int ftc_ctx_mark_non_differentiable(ftc_function_ctx ctx, int output_index) {
  return ftc::guard([&] {
    FunctionNode &node = forward_node(ctx, "mark_non_differentiable");
    if (output_index < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "output index must be at least 1");
    node.non_differentiable.push_back(output_index);
  });
}

int ftc_ctx_mark_dirty(ftc_function_ctx ctx, int input_index, int output_index) {
  return ftc::guard([&] {
    FunctionNode &node = forward_node(ctx, "mark_dirty");
    checked_index(input_index, node.inputs.size(), "mark_dirty input");
    if (output_index < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "output index must be at least 1");
    node.dirty.emplace_back(input_index, output_index);
  });
}

int ftc_ctx_set_materialize_grads(ftc_function_ctx ctx, int materialize) {
  return ftc::guard([&] { forward_node(ctx, "set_materialize_grads").materialize = materialize != 0; });
}

int ftc_ctx_save_value(ftc_function_ctx ctx, const char *key, int64_t key_len, int kind, const void *data, int64_t n) {
  return ftc::guard([&] {
    FunctionNode &node = node_of(ctx);
    if (key == nullptr || key_len <= 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a saved value needs a key");
    value_kind_name(kind);
    if (n < 0 || (n > 0 && data == nullptr)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "invalid value array");
    Value v;
    v.kind = kind;
    if (kind == FTC_VALUE_REAL) {
      const auto *d = static_cast<const double *>(data);
      v.reals.assign(d, d + n);
    } else {
      const auto *d = static_cast<const int64_t *>(data);
      v.ints.assign(d, d + n);
    }
    node.values[std::string(key, static_cast<size_t>(key_len))] = std::move(v);
  });
}

int ftc_ctx_value_size(ftc_function_ctx ctx, const char *key, int64_t key_len, int kind, int64_t *n) {
  return ftc::guard([&] {
    FunctionNode &node = node_of(ctx);
    const std::string k(key == nullptr ? "" : std::string(key, static_cast<size_t>(std::max<int64_t>(key_len, 0))));
    auto it = node.values.find(k);
    if (it == node.values.end()) {  // (not an error here: the caller may accept a missing key)
      ftc::out_arg(n, "n") = -1;
      return;
    }
    if (it->second.kind != kind) {
      ftc::fail(FTC_ERR_DTYPE, "the value saved under '" + k + "' is " + value_kind_name(it->second.kind) + ", not " +
                                   value_kind_name(kind));
    }
    ftc::out_arg(n, "n") = static_cast<int64_t>(kind == FTC_VALUE_REAL ? it->second.reals.size() : it->second.ints.size());
  });
}

int ftc_ctx_load_value(ftc_function_ctx ctx, const char *key, int64_t key_len, int kind, void *data, int64_t n) {
  int64_t have = 0;
  const int status = ftc_ctx_value_size(ctx, key, key_len, kind, &have);
  if (status != FTC_OK) return status;
  return ftc::guard([&] {
    const std::string k(key == nullptr ? "" : std::string(key, static_cast<size_t>(std::max<int64_t>(key_len, 0))));
    if (have < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "no value saved under '" + k + "' in " + node_of(ctx).label());
    if (have != n) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "the value saved under '" + k + "' has " + std::to_string(have) + " elements, not " + std::to_string(n));
    }
    if (n == 0) return;
    if (data == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "value buffer is null");
    const Value &v = node_of(ctx).values.at(k);
    if (kind == FTC_VALUE_REAL) {
      std::copy(v.reals.begin(), v.reals.end(), static_cast<double *>(data));
    } else {
      std::copy(v.ints.begin(), v.ints.end(), static_cast<int64_t *>(data));
    }
  });
}

int ftc_ctx_needs_input_grad(ftc_function_ctx ctx, int input_index, int *needs) {
  return ftc::guard([&] {
    FunctionNode &node = node_of(ctx);
    const auto i = static_cast<size_t>(checked_index(input_index, node.input_info.size(), "needs_input_grad input"));
    bool value = false;
    if (node.in_backward) {
      value = node.task_should_compute_output(i);
    } else {
      value = node.next_edges()[i].is_valid();
    }
    ftc::out_arg(needs, "needs") = value ? 1 : 0;
  });
}

int ftc_ctx_saved_count(ftc_function_ctx ctx, int *n) {
  return ftc::guard([&] {
    ftc::out_arg(n, "n") = static_cast<int>(backward_node(ctx, "saved tensors").saved.size());
  });
}

int ftc_ctx_saved_tensor(ftc_function_ctx ctx, int index, ftc_tensor *out) {
  return ftc::guard([&] {
    FunctionNode &node = backward_node(ctx, "saved tensors");
    const auto i = static_cast<size_t>(checked_index(index, node.saved.size(), "saved tensor"));
    ftc::out_arg(out, "out");
    at::Tensor t;
    try {
      t = node.saved[i].unpack(node.getptr());
    } catch (const c10::Error &e) {
      ftc::fail(FTC_ERR_TORCH, "saved tensor " + std::to_string(i + 1) + " of " + node.label() + ": " +
                                   e.what_without_backtrace());
    }
    ftc::install(out, std::move(t));
  });
}

}  // extern "C"
