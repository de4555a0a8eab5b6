// torch_compat.hpp - the LibTorch interfaces that differ between the torch releases the C layer
// builds against (2.11 to 2.14), behind one spelling each. Everything else uses LibTorch directly.
#pragma once

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/version.h>

#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ftc::compat {

// Who owns an autograd node: std::shared_ptr in torch 2.11, c10::intrusive_ptr in 2.13 and later.
inline constexpr bool kIntrusiveNodes = std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;

template <class T>
using NodePtr = std::conditional_t<kIntrusiveNodes, c10::intrusive_ptr<T>, std::shared_ptr<T>>;

// A new node of type T, owned as the graph owns its nodes.
template <class T, class... Args>
NodePtr<T> make_node(Args &&...args) {
  if constexpr (kIntrusiveNodes) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    return std::make_shared<T>(std::forward<Args>(args)...);
  }
}

// Another owning pointer to a node that is already owned (one made by make_node).
template <class T>
NodePtr<T> node_ptr(T &node) {
  if constexpr (kIntrusiveNodes) {
    return c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(&node);
  } else {
    return std::static_pointer_cast<T>(node.shared_from_this());
  }
}

// torch::autograd::_wrap_outputs with no inputs saved for setup_context and pure_view false. From
// torch 2.14 on it also reports the node it attached to the outputs, for torch's node-creation hooks
// (a Python-engine feature): not used here, as with the releases before.
inline std::vector<std::optional<at::Tensor>> wrap_outputs(
    const torch::autograd::variable_list &inputs, const std::unordered_set<at::TensorImpl *> &non_differentiable,
    const std::unordered_set<at::TensorImpl *> &dirty_inputs, at::ArrayRef<std::optional<at::Tensor>> raw_outputs,
    const NodePtr<torch::autograd::Node> &node, const torch::autograd::_jvp_fn_t &jvp,
    const torch::autograd::_view_as_self_fn_t &view_as_self) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
  NodePtr<torch::autograd::Node> attached;
  return torch::autograd::_wrap_outputs(inputs, non_differentiable, dirty_inputs, raw_outputs, node, jvp, {},
                                        view_as_self, false, attached);
#else
  return torch::autograd::_wrap_outputs(inputs, non_differentiable, dirty_inputs, raw_outputs, node, jvp, {},
                                        view_as_self, false);
#endif
}

}  // namespace ftc::compat
