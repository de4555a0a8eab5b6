// functional.cpp - the functional gradient API (gradients as new tensors, Jacobians, JVPs) and
// the gradient check (ftorch_c_functional.h).
#include <cmath>
#include <limits>

#include "internal.hpp"
#include "saved_tensors.hpp"

namespace {

using torch::autograd::variable_list;

// Handles that may be null (an undefined tensor each); the caller has scheduled their temporaries.
std::vector<at::Tensor> optional_tensors(const ftc_tensor *handles, int n, const char *what) {
  std::vector<at::Tensor> out(static_cast<size_t>(std::max(n, 0)));
  if (handles == nullptr) return {};
  for (int i = 0; i < n; ++i) {
    if (handles[i] != nullptr) out[static_cast<size_t>(i)] = ftc::tensor_of(handles[i], (std::string(what) + " " + std::to_string(i + 1)).c_str());
  }
  return out;
}

// Zeros shaped like y with a one at element k (row-major): one row of a Jacobian by backward.
at::Tensor unit_like(const at::Tensor &y, int64_t k) {
  at::Tensor unit = at::zeros_like(y, at::MemoryFormat::Contiguous);
  unit.view(-1)[k].fill_(1);
  return unit;
}

// Element `flat` (row-major) of t as a 0-d view of the same memory, whatever t's strides.
at::Tensor element(const at::Tensor &t, int64_t flat) {
  int64_t offset = t.storage_offset();
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.size(d);
    offset += (flat % size) * t.stride(d);
    flat /= size;
  }
  return t.as_strided({}, {}, offset);
}

// Puts a perturbed input element back to its value when the scope ends, also by an exception.
struct RestoreElement {
  at::Tensor element;
  double value;
  ~RestoreElement() {
    try {
      at::NoGradGuard no_grad;
      element.fill_(value);
    } catch (...) {
    }
  }
};

}  // namespace

extern "C" {

int ftc_autograd_grad(const ftc_tensor *outputs, int n_outputs, const ftc_tensor *inputs, int n_inputs,
                      const ftc_tensor *grad_outputs, int retain_graph, int create_graph, int allow_unused,
                      ftc_tensor *grads) {
  return ftc::guard([&] {
    ftc::take_temporaries(outputs, n_outputs);
    ftc::take_temporaries(inputs, n_inputs);
    if (grad_outputs != nullptr) ftc::take_temporaries(grad_outputs, n_outputs);
    const auto outs = ftc::tensors_of(outputs, n_outputs, "output");
    const auto ins = ftc::tensors_of(inputs, n_inputs, "input");
    const auto gos = optional_tensors(grad_outputs, n_outputs, "grad_output");
    if (n_outputs < 1 || n_inputs < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "need at least one output and one input");
    if (grads == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "gradient array pointer is null");
    for (size_t i = 0; i < gos.size(); ++i) {
      if (gos[i].defined() && gos[i].sizes() != outs[i].sizes()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "grad_output " + std::to_string(i + 1) + " has shape " +
                                                ftc::shape_string(gos[i].sizes()) + " but output " + std::to_string(i + 1) +
                                                " has shape " + ftc::shape_string(outs[i].sizes()));
      }
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].requires_grad()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "output " + std::to_string(i + 1) + " does not require grad (no graph)");
      }
    }
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i].requires_grad()) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "input " + std::to_string(i + 1) + " does not require grad");
      }
    }
    ftc::refuse_checkpointed_segments(outs, "torch_autograd_grad");
    const bool retain = retain_graph < 0 ? create_graph != 0 : retain_graph != 0;
    const variable_list result = torch::autograd::grad(outs, ins, gos, retain, create_graph != 0, allow_unused != 0);
    for (size_t i = 0; i < ins.size(); ++i) {
      const std::string what = "gradient " + std::to_string(i + 1);
      // An input the outputs do not use (allow_unused): zeros of its shape, where PyTorch gives None.
      ftc::store_result(&grads[i], result[i].defined() ? result[i] : at::zeros_like(ins[i], at::MemoryFormat::Contiguous), what);
    }
  });
}

int ftc_autograd_jacobian(ftc_tensor output, ftc_tensor input, int create_graph, ftc_tensor *jacobian) {
  return ftc::guard([&] {
    ftc::take_temporaries({output, input});
    const at::Tensor y = ftc::tensor_of(output, "output");
    const at::Tensor x = ftc::tensor_of(input, "input");
    if (!y.requires_grad()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the output does not require grad (no graph)");
    if (!x.requires_grad()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the input does not require grad");
    ftc::refuse_checkpointed_segments({y}, "torch_autograd_jacobian");
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<size_t>(y.numel()));
    for (int64_t k = 0; k < y.numel(); ++k) {
      auto g = torch::autograd::grad({y}, {x}, {unit_like(y, k)}, true, create_graph != 0, true)[0];
      rows.push_back(g.defined() ? g : at::zeros_like(x));
    }
    std::vector<int64_t> shape = y.sizes().vec();
    for (auto s : x.sizes()) shape.push_back(s);
    at::Tensor j = rows.empty() ? at::zeros(shape, x.options()) : at::stack(rows).reshape(shape);
    ftc::store_result(jacobian, j, "jacobian");
  });
}

int ftc_autograd_jvp(ftc_tensor output, ftc_tensor input, ftc_tensor v, int create_graph, ftc_tensor *result) {
  return ftc::guard([&] {
    ftc::take_temporaries({output, input, v});
    const at::Tensor y = ftc::tensor_of(output, "output");
    const at::Tensor x = ftc::tensor_of(input, "input");
    const at::Tensor w = ftc::tensor_of(v, "vector");
    if (!y.requires_grad()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the output does not require grad (no graph)");
    if (!x.requires_grad()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the input does not require grad");
    if (w.sizes() != x.sizes()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the vector has shape " + ftc::shape_string(w.sizes()) +
                                              " but the input has shape " + ftc::shape_string(x.sizes()));
    }
    ftc::refuse_checkpointed_segments({y}, "torch_autograd_jvp");
    // J v = d/du (J^T u) . v: the vector-Jacobian product is linear in u.
    at::Tensor u = at::zeros_like(y).requires_grad_(true);
    at::Tensor vjp = torch::autograd::grad({y}, {x}, {u}, true, true, true)[0];
    at::Tensor jv;
    if (vjp.defined() && vjp.requires_grad()) {
      jv = torch::autograd::grad({vjp}, {u}, {w.to(vjp.options())}, create_graph != 0, create_graph != 0, true)[0];
    }
    if (!jv.defined()) jv = at::zeros_like(y);
    ftc::store_result(result, jv, "result");
  });
}

int ftc_gradcheck(ftc_segment_fn fn, void *data, const ftc_tensor *inputs, int n_inputs, int n_outputs, double eps,
                  double atol, double rtol, int *passed, double *worst_error, double *analytic, double *numeric,
                  int64_t *where) {
  return ftc::guard([&] {
    if (fn == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the function is null");
    const auto xs = ftc::tensors_of(inputs, n_inputs, "input");
    if (n_outputs < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the function needs at least one output");
    if (!(eps > 0) || atol < 0 || rtol < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "eps must be > 0, atol and rtol >= 0");
    ftc::out_arg(passed, "passed");
    ftc::out_arg(worst_error, "worst_error");
    ftc::out_arg(analytic, "analytic");
    ftc::out_arg(numeric, "numeric");
    ftc::out_arg(where, "where");
    std::vector<size_t> checked;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!xs[i].requires_grad()) continue;
      if (xs[i].scalar_type() != at::kDouble) {
        ftc::fail(FTC_ERR_DTYPE, "gradcheck needs float64 inputs (finite differences in lower precision are "
                                 "meaningless): input " + std::to_string(i + 1) + " is " +
                                     c10::toString(xs[i].scalar_type()));
      }
      checked.push_back(i);
    }
    if (checked.empty()) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "no input requires grad: nothing to check");
    at::AutoGradMode grad_on(true);
    // Analytic Jacobians, one output element at a time.
    const variable_list ys = ftc::run_segment(fn, data, xs, n_outputs, "the function");
    ftc::refuse_checkpointed_segments(ys, "torch_gradcheck");
    std::vector<at::Tensor> ana(xs.size() * ys.size());  // [input][output]: (numel out, numel in)
    variable_list diff_inputs;
    for (auto i : checked) diff_inputs.push_back(xs[i]);
    for (size_t j = 0; j < ys.size(); ++j) {
      const at::Tensor &y = ys[j];
      for (auto i : checked) ana[i * ys.size() + j] = at::zeros({y.numel(), xs[i].numel()}, xs[i].options().requires_grad(false));
      if (!y.requires_grad() || !at::isFloatingType(y.scalar_type())) continue;
      for (int64_t k = 0; k < y.numel(); ++k) {
        const auto g = torch::autograd::grad({y}, diff_inputs, {unit_like(y, k)}, true, false, true);
        for (size_t c = 0; c < checked.size(); ++c) {
          if (g[c].defined()) ana[checked[c] * ys.size() + j][k].copy_(g[c].contiguous().view(-1));
        }
      }
    }
    // Central differences, one input element at a time, on the inputs' own memory.
    at::NoGradGuard no_grad;
    double worst_ratio = -1;
    *worst_error = 0;
    *analytic = 0;
    *numeric = 0;
    for (int q = 0; q < 4; ++q) where[q] = 0;
    for (auto i : checked) {
      // (`.data`, as PyTorch's gradcheck: the same memory, not the version counter, so a graph recorded
      // before the check that saved the input still runs its backward afterwards)
      const at::Tensor x = xs[i].variable_data();
      for (int64_t e = 0; e < x.numel(); ++e) {
        at::Tensor xe = element(x, e);
        const double original = xe.item<double>();
        variable_list plus, minus;
        {
          // The input element gets its value back however the function returns (or fails).
          const RestoreElement restore{xe, original};
          xe.fill_(original + eps);
          plus = ftc::run_segment(fn, data, xs, n_outputs, "the function");
          xe.fill_(original - eps);
          minus = ftc::run_segment(fn, data, xs, n_outputs, "the function");
        }
        for (size_t j = 0; j < ys.size(); ++j) {
          if (!at::isFloatingType(ys[j].scalar_type())) continue;
          const at::Tensor d = ((plus[j].to(at::kDouble) - minus[j].to(at::kDouble)) / (2 * eps)).contiguous().view(-1);
          const at::Tensor a = ana[i * ys.size() + j].select(1, e);
          const auto *dn = d.data_ptr<double>();
          const at::Tensor ac = a.contiguous();
          const auto *da = ac.data_ptr<double>();
          for (int64_t k = 0; k < d.numel(); ++k) {
            const double err = std::abs(da[k] - dn[k]);
            const double ratio = err / (atol + rtol * std::abs(dn[k]) + std::numeric_limits<double>::min());
            if (ratio > worst_ratio || std::isnan(err)) {
              worst_ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : ratio;
              *worst_error = err;
              *analytic = da[k];
              *numeric = dn[k];
              where[0] = static_cast<int64_t>(i);
              where[1] = e;
              where[2] = static_cast<int64_t>(j);
              where[3] = k;
            }
          }
        }
      }
    }
    *passed = worst_ratio <= 1 ? 1 : 0;
  });
}

}  // extern "C"
