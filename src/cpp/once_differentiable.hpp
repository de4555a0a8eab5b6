// once_differentiable.hpp - the gradients of a backward that is not itself differentiable (a
// custom function's ordinary backward, a training package's compiled one), made safe under
// create_graph: a later backward through them fails with a message instead of treating them as
// constants and silently missing the second derivative.
#pragma once

#include <torch/csrc/autograd/functions/basic_ops.h>

#include <string>

#include "internal.hpp"
#include "torch_compat.hpp"

namespace ftc {

// The gradients as they are, or, when the running backward records a graph (create_graph), the
// same values behind a node that fails with `why` if differentiated. That node also depends on the
// incoming gradients that require grad (grad_outputs), so that differentiating with respect to
// them (a Jacobian-vector product by double backward) reaches it and fails, rather than finding
// no path and giving zeros.
inline torch::autograd::variable_list once_differentiable(torch::autograd::variable_list grads,
                                                          const torch::autograd::variable_list &grad_outputs,
                                                          const std::string &why) {
  if (!at::GradMode::is_enabled()) return grads;
  torch::autograd::variable_list inputs;
  for (auto &g : grads) {
    at::Tensor a;
    if (g.defined()) {
      a = g.detach();
      a.requires_grad_(true);
    }
    inputs.push_back(a);
  }
  const size_t n = inputs.size();
  for (const auto &g : grad_outputs) {
    if (g.defined() && g.requires_grad()) inputs.push_back(g);
  }
  auto error = compat::make_node<torch::autograd::DelayedError>(why, static_cast<int64_t>(inputs.size()));
  auto outputs = (*error)(std::move(inputs));
  outputs.resize(n);
  return outputs;
}

}  // namespace ftc
