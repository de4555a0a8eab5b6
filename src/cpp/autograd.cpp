// autograd.cpp - C API for gradients: backward, reading and zeroing gradients, grad-mode scopes.
#include <limits>
#include <memory>
#include <vector>

#include "internal.hpp"

namespace {

const char *scope_name(int kind) {
  switch (kind) {
    case FTC_SCOPE_NO_GRAD: return "no-grad";
    case FTC_SCOPE_ENABLE_GRAD: return "enable-grad";
    case FTC_SCOPE_INFERENCE: return "inference-mode";
    default: return "unknown";
  }
}

}  // namespace

extern "C" {

int ftc_tensor_backward(ftc_tensor t, ftc_tensor gradient, int retain_graph) {
  return ftc::guard([&] {
    ftc::take_temporaries({t, gradient});
    const at::Tensor &x = ftc::tensor_of(t);
    if (!x.requires_grad()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "the tensor does not require grad: no graph was recorded for it. Mark what it depends on before "
                "computing it: requires_grad=.true. in torch_tensor_from_array for an input, in torch_model_load "
                "for a model's parameters, and in torch_model_forward to record the forward");
    }
    at::Tensor g;
    if (gradient != nullptr) {
      g = ftc::tensor_of(gradient, "external gradient");
      if (g.sizes() != x.sizes()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "external gradient has shape " + ftc::shape_string(g.sizes()) +
                                                " but the tensor has shape " + ftc::shape_string(x.sizes()));
      }
    } else if (x.numel() != 1) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "an implicit (unit) gradient needs a one-element tensor, this one has shape " +
                                              ftc::shape_string(x.sizes()) + "; pass external_gradient");
    } else {
      g = at::ones_like(x);
    }
    x.backward(g, retain_graph != 0);
  });
}

int ftc_tensor_get_gradient(ftc_tensor t, ftc_tensor *gradient) {
  return ftc::guard([&] {
    // By value: the assignment below may replace the tensor of *gradient, which can be t itself.
    const at::Tensor x = ftc::tensor_of(t);
    ftc::out_arg(gradient, "gradient");
    if (!x.is_leaf()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the tensor is not a leaf: gradients are kept for leaf tensors only");
    }
    const at::Tensor g = x.grad();
    if (!g.defined() && !x.requires_grad()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "the tensor does not require grad, so backward never gives it a gradient: make it with "
                "requires_grad=.true. (torch_tensor_from_array, torch_model_load for parameters) or call "
                "torch_tensor_set_requires_grad before computing what depends on it");
    }
    if (!g.defined()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the tensor has no gradient yet (call torch_tensor_backward first, "
                                          "on a result that depends on it)");
    }
    auto *dst = ftc::TensorTable::instance().find(*gradient);
    if (dst == nullptr) {
      at::NoGradGuard no_grad;
      ftc::install(gradient, g.clone());
      return;
    }
    if (dst->value.sizes() != g.sizes()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "gradient tensor has shape " + ftc::shape_string(dst->value.sizes()) +
                                              " but the gradient has shape " + ftc::shape_string(g.sizes()));
    }
    at::NoGradGuard no_grad;
    ftc::assign_into(*dst, g);
  });
}

int ftc_tensor_zero_grad(ftc_tensor t) {
  return ftc::guard([&] {
    at::Tensor &x = ftc::tensor_of(t);
    if (x.grad().defined()) {
      at::NoGradGuard no_grad;
      x.mutable_grad().zero_();
    }
  });
}

int ftc_tensor_set_gradient(ftc_tensor t, ftc_tensor gradient) {
  return ftc::guard([&] {
    ftc::take_temporaries({t, gradient});
    at::Tensor &x = ftc::tensor_of(t);
    const at::Tensor &g = ftc::tensor_of(gradient, "gradient");
    if (g.sizes() != x.sizes()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "gradient has shape " + ftc::shape_string(g.sizes()) +
                                              " but the tensor has shape " + ftc::shape_string(x.sizes()));
    }
    at::NoGradGuard no_grad;
    x.mutable_grad() = g.to(x.options()).clone();
  });
}

int ftc_tensor_set_requires_grad(ftc_tensor t, int requires_grad) {
  return ftc::guard([&] { ftc::tensor_of(t).requires_grad_(requires_grad != 0); });
}

int ftc_tensor_is_leaf(ftc_tensor t, int *is_leaf) {
  return ftc::guard([&] { ftc::out_arg(is_leaf, "is_leaf") = ftc::tensor_of(t).is_leaf() ? 1 : 0; });
}

int ftc_grad_scope_push(int scope) {
  return ftc::guard([&] {
    ftc::GradScope s{scope, nullptr, nullptr, nullptr};
    switch (scope) {
      case FTC_SCOPE_NO_GRAD: s.no_grad = std::make_unique<at::NoGradGuard>(); break;
      case FTC_SCOPE_ENABLE_GRAD: s.enable_grad = std::make_unique<at::AutoGradMode>(true); break;
      case FTC_SCOPE_INFERENCE: s.inference = std::make_unique<c10::InferenceMode>(); break;
      default: ftc::fail_unknown(ftc::ftc_grad_scope_table, scope);
    }
    ftc::thread_state().grad_scopes.push_back(std::move(s));
  });
}

int ftc_grad_scope_pop(int scope) {
  return ftc::guard([&] {
    auto &scopes = ftc::thread_state().grad_scopes;
    if (scopes.empty()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string("no open scope to end (ending a ") + scope_name(scope) +
                                              " scope on this thread)");
    }
    if (scopes.back().kind != scope) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string("the innermost open scope is ") +
                                              scope_name(scopes.back().kind) + ", not " + scope_name(scope));
    }
    scopes.pop_back();
  });
}

int ftc_grad_enabled(void) { return at::GradMode::is_enabled() ? 1 : 0; }

int ftc_inference_mode_enabled(void) { return c10::InferenceMode::is_enabled() ? 1 : 0; }

int ftc_tensor_register_hook(ftc_tensor t, ftc_grad_hook_fn hook, void *data, int64_t *hook_id) {
  return ftc::guard([&] {
    const at::Tensor &x = ftc::tensor_of(t);
    ftc::out_arg(hook_id, "hook_id");
    if (hook == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the hook is null");
    if (!x.requires_grad()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the tensor does not require grad: no gradient will reach a hook on it");
    }
    std::function<at::Tensor(const at::Tensor &)> run = [hook, data](const at::Tensor &grad) -> at::Tensor {
      ftc::CallbackHandles handles, replacement;  // the replacement is freed if not taken
      replacement.handles.assign(1, nullptr);
      ftc::check_callback(hook(data, handles.add(grad), &replacement.handles[0]), "a gradient hook");
      at::Tensor r = ftc::take_callback_result(replacement.handles[0], "the gradient returned by a hook");
      if (r.defined() && (r.sizes() != grad.sizes() || r.scalar_type() != grad.scalar_type() ||
                          r.device() != grad.device())) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a gradient hook returned " + ftc::shape_string(r.sizes()) + ", " +
                                                c10::toString(r.scalar_type()) + " for a gradient of " +
                                                ftc::shape_string(grad.sizes()) + ", " + c10::toString(grad.scalar_type()));
      }
      return r;
    };
    *hook_id = static_cast<int64_t>(x.register_hook(std::move(run)));
  });
}

int ftc_tensor_remove_hook(ftc_tensor t, int64_t hook_id) {
  return ftc::guard([&] {
    const at::Tensor &x = ftc::tensor_of(t);
    if (hook_id < 0 || hook_id > std::numeric_limits<unsigned>::max()) {  // never another hook's id cut short
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "invalid hook id " + std::to_string(hook_id));
    }
    x.remove_hook(static_cast<unsigned>(hook_id));
  });
}

int ftc_set_detect_anomaly(int enabled, int check_nan) {
  return ftc::guard([&] { torch::autograd::AnomalyMode::set_enabled(enabled != 0, check_nan != 0); });
}

int ftc_detect_anomaly_enabled(void) { return torch::autograd::AnomalyMode::is_enabled() ? 1 : 0; }

}  // extern "C"
