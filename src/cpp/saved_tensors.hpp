// saved_tensors.hpp - the saved-tensor hooks of this thread’s innermost policy (saved_tensors.cpp),
// for the tensors a custom function saves for backward (function.cpp).
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>

#include "internal.hpp"

namespace ftc {

// Hooks for t under the innermost saved-tensor policy of this thread, or none (no policy, or a
// tensor below the size threshold of file offload).
std::unique_ptr<torch::autograd::SavedVariableHooks> saved_tensor_hooks_for(const at::Tensor &t);

// Fails (naming `what`) if the graph behind outputs holds a checkpointed segment: gradients
// computed without .grad (torch::autograd::grad) cannot pass through one. Walks the graph only
// while a segment exists anywhere.
void refuse_checkpointed_segments(const std::vector<at::Tensor> &outputs, const char *what);

}  // namespace ftc
