// saved_tensors.cpp - where autograd keeps the tensors a backward needs: saved-tensor hooks (CPU
// offload, file offload, the user's pack and unpack callbacks; a per-thread stack of policies) and
// activation checkpointing (a segment's activations not kept but recomputed in backward).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "saved_tensors.hpp"
#include "torch_compat.hpp"

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::SavedVariableHooks;
using torch::autograd::variable_list;
using ftc::compat::NodePtr;

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
    // A new file of its own (mkstemp: created exclusively), never one another process made: ranks
    // on several hosts, or in containers with the same process ids, may share the directory.
    std::string name = directory_ + "/ftorch-saved-" + std::to_string(files_made.fetch_add(1)) + "-XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0) ftc::fail(FTC_ERR_IO, "cannot create a saved-tensor file in '" + directory_ + "' (file offload)");
    const char *bytes = static_cast<const char *>(c.data_ptr());
    size_t left = c.nbytes();
    bool written = true;
    while (left > 0 && written) {
      const ssize_t n = ::write(fd, bytes, left);
      if (n < 0 && errno == EINTR) continue;
      written = n > 0;
      if (written) {
        bytes += n;
        left -= static_cast<size_t>(n);
      }
    }
    if (::close(fd) != 0) written = false;
    if (!written) {
      std::remove(name.c_str());  // (no partial file left behind)
      ftc::fail(FTC_ERR_IO, "cannot write a saved tensor to '" + directory_ + "' (file offload)");
    }
    path_ = std::move(name);
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
  // (results are held by a CallbackHandles: a hook that fails after making its result must not
  // leak that handle)
  void call_pack_hook(const at::Tensor &t) override {
    ftc::CallbackHandles handles, result;
    result.handles.assign(1, nullptr);
    ftc::check_callback(policy_.pack(policy_.pack_data, handles.add(t), &result.handles[0]), "the pack hook");
    packed_ = ftc::take_callback_result(result.handles[0], "the pack hook's result");
    if (!packed_.defined()) ftc::fail(FTC_ERR_CALLBACK, "the pack hook did not produce a tensor");
  }
  at::Tensor call_unpack_hook() override {
    ftc::CallbackHandles handles, result;
    result.handles.assign(1, nullptr);
    ftc::check_callback(policy_.unpack(policy_.unpack_data, handles.add(packed_), &result.handles[0]),
                        "the unpack hook");
    at::Tensor t = ftc::take_callback_result(result.handles[0], "the unpack hook's result");
    if (!t.defined()) ftc::fail(FTC_ERR_CALLBACK, "the unpack hook did not produce a tensor");
    return t;
  }

 private:
  PackPolicy policy_;
  at::Tensor packed_;
};

// Every policy's hooks run inside this: LibTorch checks that a saved tensor was not modified in
// place since it was saved only for tensors saved without hooks, and CPU offload keeps a CPU
// tensor itself (a later write would reach backward unnoticed), so the check is made here.
class VersionChecked : public SavedVariableHooks {
 public:
  explicit VersionChecked(std::unique_ptr<SavedVariableHooks> inner) : inner_(std::move(inner)) {}
  void call_pack_hook(const at::Tensor &t) override {
    counter_ = torch::autograd::impl::version_counter(t);
    version_ = counter_.current_version();
    inner_->call_pack_hook(t);
  }
  at::Tensor call_unpack_hook() override {
    const uint32_t now = counter_.current_version();
    if (now != version_) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "a tensor saved for backward was modified in place after it was saved (its version went from " +
                    std::to_string(version_) + " to " + std::to_string(now) +
                    "): backward would use the new values; assign to a copy instead, or save a clone");
    }
    return inner_->call_unpack_hook();
  }

 private:
  std::unique_ptr<SavedVariableHooks> inner_;
  c10::VariableVersion counter_{0};
  uint32_t version_ = 0;
};

// The hooks of one policy for t, or none (small tensors under file offload).
std::unique_ptr<SavedVariableHooks> policy_hooks(const ftc::PackPolicy &p, const at::Tensor &t) {
  switch (p.policy) {
    case FTC_PACK_CPU: return std::make_unique<CpuHooks>();
    case FTC_PACK_FILES:
      if (static_cast<int64_t>(t.nbytes()) < p.threshold) return nullptr;
      return std::make_unique<FileHooks>(p.directory);
    default: return std::make_unique<UserHooks>(p);
  }
}

}  // namespace

// Hooks of the innermost policy of this thread for t, or none.
std::unique_ptr<SavedVariableHooks> ftc::saved_tensor_hooks_for(const at::Tensor &t) {
  const ftc::ThreadState *ts = ftc::existing_thread_state();
  if (ts == nullptr || ts->pack_policies.empty()) return nullptr;
  auto hooks = policy_hooks(ts->pack_policies.back(), t);
  if (!hooks) return nullptr;
  return std::make_unique<VersionChecked>(std::move(hooks));
}

namespace {

// A checkpointed segment: keeps its inputs (and the CPU random state), runs the segment again
// in backward with grad mode on, and backpropagates through the recomputed graph.
std::atomic<int64_t> segments_live{0};  // CheckpointNodes alive (refuse_checkpointed_segments)

// How differentiating through a checkpointed segment without .grad fails.
[[noreturn]] void fail_checkpoint_without_grad(const std::string &what) {
  ftc::fail(FTC_ERR_INVALID_ARGUMENT,
            what + " cannot differentiate through a checkpointed segment (torch_checkpoint_segment): its backward "
                   "recomputes the segment and backpropagates into the .grad of what the segment uses, so a "
                   "gradient computed without .grad would miss those parts (as PyTorch's reentrant checkpoint "
                   "refuses .grad()); use torch_tensor_backward, or do not checkpoint this segment");
}

struct CheckpointNode : Node {
  CheckpointNode() { segments_live.fetch_add(1); }
  ~CheckpointNode() override { segments_live.fetch_sub(1); }
  ftc_segment_fn segment = nullptr;
  void *data = nullptr;
  int n_outputs = 0;
  std::vector<SavedVariable> inputs;
  at::Tensor rng_state;
  // The random state of each GPU an input is on, as PyTorch's checkpoint keeps (a segment drawing
  // random numbers there, dropout, recomputes with the same ones).
  std::vector<std::pair<c10::Device, at::Tensor>> device_rng_states;
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
    // A backward that computes gradients of given inputs only (torch::autograd::grad, backward
    // with inputs) would not see what the recomputation backpropagates into .grad.
    if (!torch::autograd::Engine::get_default_engine().is_checkpoint_valid()) {
      fail_checkpoint_without_grad("a backward of given inputs only");
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
      std::vector<std::pair<at::Generator, at::Tensor>> devices_now;
      struct RestoreDevices {
        std::vector<std::pair<at::Generator, at::Tensor>> &saved;
        ~RestoreDevices() {
          for (auto &[g, state] : saved) {
            std::lock_guard<std::mutex> lock(g.mutex());
            g.set_state(state);
          }
        }
      } restore_devices{devices_now};
      for (const auto &[device, state] : device_rng_states) {
        at::Generator g = at::globalContext().defaultGenerator(device);
        std::lock_guard<std::mutex> lock(g.mutex());
        devices_now.emplace_back(g, g.get_state());
        g.set_state(state);
      }
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

}  // namespace

void ftc::refuse_checkpointed_segments(const std::vector<at::Tensor> &outputs, const char *what) {
  if (segments_live.load() == 0) return;  // (no segment anywhere: nothing to walk)
  std::vector<Node *> stack;
  std::unordered_set<Node *> seen;
  for (const auto &t : outputs) {
    if (t.defined() && t.grad_fn()) stack.push_back(t.grad_fn().get());
  }
  while (!stack.empty()) {
    Node *n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (dynamic_cast<CheckpointNode *>(n) != nullptr) fail_checkpoint_without_grad(what);
    for (const auto &e : n->next_edges()) {
      if (e.function) stack.push_back(e.function.get());
    }
  }
}

extern "C" {

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
    for (const auto &x : xs) {
      if (!x.is_cuda()) continue;
      const bool seen = std::any_of(node->device_rng_states.begin(), node->device_rng_states.end(),
                                    [&](const auto &d) { return d.first == x.device(); });
      if (!seen) {
        node->device_rng_states.emplace_back(x.device(), at::globalContext().defaultGenerator(x.device()).get_state());
      }
    }
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
      for (const auto &x : xs) {
        node->inputs.emplace_back(x, false);
        // (the innermost saved-tensor policy applies to what the segment keeps: its inputs)
        if (auto hooks = ftc::saved_tensor_hooks_for(x)) node->inputs.back().register_hooks(std::move(hooks));
      }
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
