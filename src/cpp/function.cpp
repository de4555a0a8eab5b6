// function.cpp - custom autograd functions (user code for forward and backward, one node in the
// graph), their context, saved-tensor hooks and activation checkpointing (ftorch_c_function.h).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "internal.hpp"
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

// ------------------------------------------------------------------------ saved-tensor hooks

using ftc::PackPolicy;  // (per thread: thread_state.hpp)
std::atomic<int64_t> files_live{0};
std::atomic<int64_t> files_made{0};

// CPU offload: the packed tensor lives in CPU memory, back on its device when unpacked.
class CpuHooks : public SavedVariableHooks {
 public:
  void call_pack_hook(const at::Tensor &t) override {
    device_ = t.device();
    packed_ = t.device().is_cpu() ? t : t.to(at::kCPU);
  }
  at::Tensor call_unpack_hook() override { return packed_.to(device_); }

 private:
  at::Tensor packed_;
  c10::Device device_ = at::kCPU;
};

// File offload: the bytes go to a file (removed with the hooks), read back when unpacked.
class FileHooks : public SavedVariableHooks {
 public:
  explicit FileHooks(std::string directory) : directory_(std::move(directory)) {}
  ~FileHooks() override {
    if (!path_.empty()) {
      std::remove(path_.c_str());
      files_live.fetch_sub(1);
    }
  }
  void call_pack_hook(const at::Tensor &t) override {
    const at::Tensor c = t.contiguous().to(at::kCPU);
    sizes_ = t.sizes().vec();
    dtype_ = t.scalar_type();
    device_ = t.device();
    path_ = directory_ + "/ftorch-saved-" + std::to_string(::getpid()) + "-" + std::to_string(files_made.fetch_add(1)) +
            ".bin";
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    if (out) out.write(static_cast<const char *>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    if (!out) {
      path_.clear();
      ftc::fail(FTC_ERR_IO, "cannot write a saved tensor to '" + directory_ + "' (file offload)");
    }
    files_live.fetch_add(1);
  }
  at::Tensor call_unpack_hook() override {
    at::Tensor t = at::empty(sizes_, at::TensorOptions().dtype(dtype_));
    std::ifstream in(path_, std::ios::binary);
    if (in) in.read(static_cast<char *>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!in) ftc::fail(FTC_ERR_IO, "cannot read back the saved tensor in '" + path_ + "' (file offload)");
    return t.to(device_);
  }

 private:
  std::string directory_, path_;
  std::vector<int64_t> sizes_;
  at::ScalarType dtype_ = at::kFloat;
  c10::Device device_ = at::kCPU;
};

// User callbacks: pack gives a tensor (any tensor: a copy, a compressed form...), unpack gives
// the saved tensor back from it.
class UserHooks : public SavedVariableHooks {
 public:
  explicit UserHooks(const PackPolicy &p) : policy_(p) {}
  void call_pack_hook(const at::Tensor &t) override {
    ftc::CallbackHandles handles;
    ftc_tensor packed = nullptr;
    ftc::check_callback(policy_.pack(policy_.pack_data, handles.add(t), &packed), "the pack hook");
    packed_ = ftc::take_callback_result(packed, "the pack hook's result");
    if (!packed_.defined()) ftc::fail(FTC_ERR_CALLBACK, "the pack hook did not produce a tensor");
  }
  at::Tensor call_unpack_hook() override {
    ftc::CallbackHandles handles;
    ftc_tensor unpacked = nullptr;
    ftc::check_callback(policy_.unpack(policy_.unpack_data, handles.add(packed_), &unpacked), "the unpack hook");
    at::Tensor t = ftc::take_callback_result(unpacked, "the unpack hook's result");
    if (!t.defined()) ftc::fail(FTC_ERR_CALLBACK, "the unpack hook did not produce a tensor");
    return t;
  }

 private:
  PackPolicy policy_;
  at::Tensor packed_;
};

// Hooks of the innermost policy of this thread for t, or none (small tensors under file offload).
std::unique_ptr<SavedVariableHooks> hooks_for(const at::Tensor &t) {
  const ftc::ThreadState *ts = ftc::existing_thread_state();
  if (ts == nullptr || ts->pack_policies.empty()) return nullptr;
  const ftc::PackPolicy &p = ts->pack_policies.back();
  switch (p.policy) {
    case FTC_PACK_CPU: return std::make_unique<CpuHooks>();
    case FTC_PACK_FILES:
      if (static_cast<int64_t>(t.nbytes()) < p.threshold) return nullptr;
      return std::make_unique<FileHooks>(p.directory);
    default: return std::make_unique<UserHooks>(p);
  }
}

// ------------------------------------------------------------------------ the node

struct FunctionNode : Node {
  const Definition *def = nullptr;
  // Forward only: the inputs, the handles the forward sees, what it asked for.
  std::vector<at::Tensor> inputs;
  std::vector<ftc_tensor> forward_handles;
  std::vector<at::Tensor> to_save;
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
    variable_list aliases;
    for (auto &g : result) {
      at::Tensor a;
      if (g.defined()) {
        a = g.detach();
        a.requires_grad_(true);
      }
      aliases.push_back(a);
    }
    auto error = ftc::compat::make_node<torch::autograd::DelayedError>(
        "differentiating the backward of " + label() +
            ", which is once differentiable (define it with double_backward=.true. if its backward is made of "
            "differentiable tensor operations)",
        static_cast<int64_t>(aliases.size()));
    result = (*error)(std::move(aliases));
  }
  return result;
}

// A checkpointed segment: keeps its inputs (and the CPU random state), runs the segment again
// in backward with grad mode on, and backpropagates through the recomputed graph.
struct CheckpointNode : Node {
  ftc_segment_fn segment = nullptr;
  void *data = nullptr;
  int n_outputs = 0;
  std::vector<SavedVariable> inputs;
  at::Tensor rng_state;
  bool freed = false;
  std::mutex mutex;

  std::string name() const override { return "CheckpointedSegment"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex);
    inputs.clear();
    freed = true;
  }
  variable_list apply(variable_list &&grads) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (freed) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "backward through a checkpointed segment a second time: its inputs were "
                                          "freed by the first backward (pass retain_graph=.true. to the first)");
    }
    if (at::GradMode::is_enabled()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a checkpointed segment cannot be differentiated with create_graph "
                                          "(its backward recomputes and backpropagates)");
    }
    variable_list detached;
    for (const auto &s : inputs) {
      const at::Tensor x = s.unpack(getptr());
      detached.push_back(x.detach().requires_grad_(x.requires_grad()));
    }
    variable_list outs;
    {
      // The recomputation draws the same random numbers as the forward did (dropout...).
      auto gen = at::detail::getDefaultCPUGenerator();
      at::Tensor now;
      {
        std::lock_guard<std::mutex> g(gen.mutex());
        now = gen.get_state();
        gen.set_state(rng_state);
      }
      struct Restore {
        at::Generator &gen;
        at::Tensor &state;
        ~Restore() {
          std::lock_guard<std::mutex> g(gen.mutex());
          gen.set_state(state);
        }
      } restore{gen, now};
      at::AutoGradMode on(true);
      outs = ftc::run_segment(segment, data, detached, n_outputs, "the checkpointed segment");
    }
    variable_list ys, gs;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].requires_grad() && grads[i].defined()) {
        ys.push_back(outs[i]);
        gs.push_back(grads[i]);
      }
    }
    if (!ys.empty()) torch::autograd::backward(ys, gs, false, false);
    variable_list result;
    for (auto &d : detached) result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    return result;
  }
};

// Ends the forward of a node: grad mode restored, forward handles freed, context released.
void end_forward(ftc_function_ctx ctx, FunctionNode &node) {
  for (auto h : node.forward_handles) ftc::delete_tensor(h);
  node.forward_handles.clear();
  node.forward_mode.reset();
  node.in_forward = false;
  node.inputs.clear();
  node.to_save.clear();
  CtxTable::instance().release(ctx);
}

}  // namespace


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
      if (auto hooks = hooks_for(v)) node->saved.back().register_hooks(std::move(hooks));
    }
  });
}

int ftc_ctx_save_for_backward(ftc_function_ctx ctx, const ftc_tensor *tensors, int n) {
  return ftc::guard([&] {
    FunctionNode &node = forward_node(ctx, "save_for_backward");
    auto ts = ftc::tensors_of(tensors, n, "tensor to save");
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
    if (it == node.values.end()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "no value saved under '" + k + "' in " + node.label());
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
    if (have != n) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the value saved under '" + std::string(key, static_cast<size_t>(key_len)) +
                                              "' has " + std::to_string(have) + " elements, not " + std::to_string(n));
    }
    if (n == 0) return;
    if (data == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "value buffer is null");
    const Value &v = node_of(ctx).values.at(std::string(key, static_cast<size_t>(key_len)));
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

int ftc_saved_tensors_hooks_push(int policy, const char *directory, int64_t directory_len, int64_t threshold_bytes,
                                 ftc_pack_fn pack, void *pack_data, ftc_unpack_fn unpack, void *unpack_data) {
  return ftc::guard([&] {
    PackPolicy p;
    p.policy = policy;
    switch (policy) {
      case FTC_PACK_CPU: break;
      case FTC_PACK_FILES: {
        if (directory == nullptr || directory_len <= 0) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "file offload needs a directory");
        }
        p.directory.assign(directory, static_cast<size_t>(directory_len));
        if (::access(p.directory.c_str(), W_OK) != 0) {
          ftc::fail(FTC_ERR_IO, "directory '" + p.directory + "' for saved tensors is not writable");
        }
        if (threshold_bytes < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "negative size threshold");
        p.threshold = threshold_bytes;
        break;
      }
      case FTC_PACK_USER:
        if (pack == nullptr || unpack == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "pack and unpack hooks are both needed");
        p.pack = pack;
        p.pack_data = pack_data;
        p.unpack = unpack;
        p.unpack_data = unpack_data;
        break;
      default: ftc::fail_unknown(ftc::ftc_pack_policy_table, policy);
    }
    ftc::thread_state().pack_policies.push_back(std::move(p));
  });
}

int ftc_saved_tensors_hooks_pop(void) {
  return ftc::guard([&] {
    auto &policies = ftc::thread_state().pack_policies;
    if (policies.empty()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "no saved-tensor hooks are active on this thread");
    policies.pop_back();
  });
}

int64_t ftc_saved_tensors_files(void) { return files_live.load(); }

int ftc_checkpoint(ftc_segment_fn segment, void *data, const ftc_tensor *inputs, int n_inputs, ftc_tensor *outputs,
                   int n_outputs) {
  return ftc::guard([&] {
    if (segment == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the segment is null");
    const auto xs = ftc::tensors_of(inputs, n_inputs, "input");
    if (n_outputs < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a segment needs at least one output");
    if (outputs == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "outputs array pointer is null");
    auto node = ftc::compat::make_node<CheckpointNode>();
    node->segment = segment;
    node->data = data;
    node->n_outputs = n_outputs;
    node->rng_state = at::detail::getDefaultCPUGenerator().get_state();
    std::vector<at::Tensor> ys;
    {
      at::AutoGradMode off(false);
      ys = ftc::run_segment(segment, data, xs, n_outputs, "the checkpointed segment");
    }
    // Recorded whenever grad mode is on, even when no input requires grad: the segment may use
    // parameters that do (a model's weights), which backward reaches by recomputing it.
    const bool executable = at::GradMode::is_enabled();
    if (executable) {
      node->set_next_edges(torch::autograd::collect_next_edges(xs));
      for (const auto &x : xs) node->inputs.emplace_back(x, false);
    }
    std::vector<std::optional<at::Tensor>> raw(ys.begin(), ys.end());
    auto jvp = [](const variable_list &, const variable_list &) -> variable_list {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "forward-mode AD is not supported for checkpointed segments");
    };
    auto view_as_self = [](const at::Tensor &x) { return x.view_as(x); };
    auto wrapped = ftc::compat::wrap_outputs(xs, {}, {}, raw, executable ? NodePtr<Node>(node) : NodePtr<Node>(), jvp,
                                             view_as_self);
    for (size_t i = 0; i < wrapped.size(); ++i) {
      ftc::store_result(&outputs[i], *wrapped[i], "output " + std::to_string(i + 1));
    }
  });
}

}  // extern "C"
