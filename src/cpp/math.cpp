// math.cpp - C API for tensor arithmetic: assignment, operators, elementwise functions,
// reductions and views, with the release protocol for temporaries (see ftorch_c_math.h).
#include <vector>

#include "internal.hpp"

namespace {

const char *binary_name(int op) {
  switch (op) {
    case FTC_ADD: return "+";
    case FTC_SUB: return "-";
    case FTC_MUL: return "*";
    case FTC_DIV: return "/";
    case FTC_POW: return "**";
    case FTC_MATMUL: return "matmul";
    default: ftc::fail(FTC_ERR_INVALID_ARGUMENT, "unknown binary operation " + std::to_string(op));
  }
}

// Result into *out: the handle of a consumed operand is reused; other consumed ones are freed.
void finish(at::Tensor result, ftc_tensor a, ftc_tensor b, int release, ftc_tensor *out) {
  ftc_tensor reuse = (release & 1) ? a : ((release & 2) ? b : nullptr);
  if (reuse != nullptr) {
    reuse->t = std::move(result);
  } else {
    reuse = ftc::new_tensor_handle(std::move(result));
  }
  if ((release & 1) && a != reuse) ftc::delete_handle(a);
  if ((release & 2) && b != reuse && b != a) ftc::delete_handle(b);
  *out = reuse;
}

// Consumed operands are released whether the operation succeeds or fails.
template <class Body>
int op_guard(ftc_tensor a, ftc_tensor b, int release, Body &&body) {
  const int status = ftc::guard(body);
  if (status != FTC_OK) {
    if (release & 1) ftc::delete_handle(a);
    if ((release & 2) && b != a) ftc::delete_handle(b);
  }
  return status;
}

void require_same_device(const at::Tensor &a, const at::Tensor &b, const char *what) {
  if (a.device() != b.device()) {
    ftc::fail(FTC_ERR_DEVICE, std::string("operands of ") + what + " are on different devices (" +
                                  a.device().str() + " and " + b.device().str() + ")");
  }
}

std::vector<int64_t> dims_of(int ndims, const int64_t *dims) {
  if (ndims < 0 || (ndims > 0 && dims == nullptr)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "invalid dimension list");
  return std::vector<int64_t>(dims, dims + ndims);
}

}  // namespace

extern "C" {

int ftc_tensor_assign(ftc_tensor *lhs, ftc_tensor rhs, int release) {
  return op_guard(rhs, nullptr, release & 1, [&] {
    if (lhs == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "left-hand side handle pointer is null");
    const at::Tensor &r = ftc::tensor_of(rhs, "right-hand side tensor");
    if (*lhs == rhs) return;  // t = t
    if (*lhs == nullptr) {
      if (release & 1) {
        *lhs = rhs;  // take the temporary itself: no copy
      } else {
        *lhs = ftc::new_tensor_handle(r.clone());
      }
      return;
    }
    at::Tensor &l = (*lhs)->t;
    require_same_device(l, r, "assignment");
    if (!r.requires_grad() && !l.requires_grad()) {
      // No history on either side: a plain copy into the left-hand side's storage.
      at::NoGradGuard no_grad;
      l.copy_(r);
      if (release & 1) ftc::delete_handle(rhs);
      return;
    }
    // A fresh tensor over the same storage, without the old history: the copy records only the
    // new one (re-assigning after backward works, loops of y = f(x) do not grow a graph).
    at::Tensor fresh = l.detach();
    if (r.requires_grad() && at::GradMode::is_enabled()) {
      fresh.copy_(r);
    } else {
      at::NoGradGuard no_grad;
      fresh.copy_(r);
    }
    l = std::move(fresh);
    if (release & 1) ftc::delete_handle(rhs);
  });
}

int ftc_tensor_binary(int op, ftc_tensor a, ftc_tensor b, int release, ftc_tensor *out) {
  return op_guard(a, b, release, [&] {
    const at::Tensor &x = ftc::tensor_of(a, "left operand");
    const at::Tensor &y = ftc::tensor_of(b, "right operand");
    require_same_device(x, y, binary_name(op));
    at::Tensor r;
    switch (op) {
      case FTC_ADD: r = at::add(x, y); break;
      case FTC_SUB: r = at::sub(x, y); break;
      case FTC_MUL: r = at::mul(x, y); break;
      case FTC_DIV: r = at::div(x, y); break;
      case FTC_POW: r = at::pow(x, y); break;
      case FTC_MATMUL: r = at::matmul(x, y); break;
      default: binary_name(op);
    }
    finish(std::move(r), a, b, release, out);
  });
}

int ftc_tensor_binary_scalar(int op, ftc_tensor a, int64_t int_value, double real_value, int is_integer,
                             int scalar_first, int release, ftc_tensor *out) {
  return op_guard(a, nullptr, release & 1, [&] {
    const at::Tensor &x = ftc::tensor_of(a, "tensor operand");
    const c10::Scalar s = is_integer ? c10::Scalar(int_value) : c10::Scalar(real_value);
    at::Tensor r;
    // The same kernels Python's number-on-either-side operators use.
    switch (op) {
      case FTC_ADD: r = at::add(x, s); break;
      case FTC_SUB: r = scalar_first ? at::rsub(x, s) : at::sub(x, s); break;
      case FTC_MUL: r = at::mul(x, s); break;
      case FTC_DIV: r = scalar_first ? at::mul(at::reciprocal(x), s) : at::div(x, s); break;
      case FTC_POW: r = scalar_first ? at::pow(s, x) : at::pow(x, s); break;
      default: ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(binary_name(op)) + " does not take a scalar");
    }
    finish(std::move(r), a, nullptr, release & 1, out);
  });
}

int ftc_tensor_unary(int op, ftc_tensor a, int release, ftc_tensor *out) {
  return op_guard(a, nullptr, release & 1, [&] {
    const at::Tensor &x = ftc::tensor_of(a);
    at::Tensor r;
    switch (op) {
      case FTC_NEG: r = at::neg(x); break;
      case FTC_EXP: r = at::exp(x); break;
      case FTC_LOG: r = at::log(x); break;
      case FTC_SQRT: r = at::sqrt(x); break;
      case FTC_ABS: r = at::abs(x); break;
      case FTC_SIN: r = at::sin(x); break;
      case FTC_COS: r = at::cos(x); break;
      case FTC_TANH: r = at::tanh(x); break;
      case FTC_SIGMOID: r = at::sigmoid(x); break;
      case FTC_RELU: r = at::relu(x); break;
      case FTC_CLONE: r = x.clone(); break;
      case FTC_DETACH: r = x.detach(); break;
      default: ftc::fail(FTC_ERR_INVALID_ARGUMENT, "unknown unary operation " + std::to_string(op));
    }
    finish(std::move(r), a, nullptr, release & 1, out);
  });
}

int ftc_tensor_reduce(int op, ftc_tensor a, int ndims, const int64_t *dims, int keepdim, int release,
                      ftc_tensor *out) {
  return op_guard(a, nullptr, release & 1, [&] {
    const at::Tensor &x = ftc::tensor_of(a);
    const auto d = dims_of(ndims, dims);
    at::Tensor r;
    if (op == FTC_SUM) {
      r = d.empty() ? x.sum() : x.sum(d, keepdim != 0);
    } else if (op == FTC_MEAN) {
      r = d.empty() ? x.mean() : x.mean(d, keepdim != 0);
    } else {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "unknown reduction " + std::to_string(op));
    }
    finish(std::move(r), a, nullptr, release & 1, out);
  });
}

int ftc_tensor_reshape(ftc_tensor a, int ndims, const int64_t *shape, int release, ftc_tensor *out) {
  return op_guard(a, nullptr, release & 1, [&] {
    finish(ftc::tensor_of(a).reshape(dims_of(ndims, shape)), a, nullptr, release & 1, out);
  });
}

int ftc_tensor_permute(ftc_tensor a, int ndims, const int64_t *dims, int release, ftc_tensor *out) {
  return op_guard(a, nullptr, release & 1, [&] {
    finish(ftc::tensor_of(a).permute(dims_of(ndims, dims)), a, nullptr, release & 1, out);
  });
}

int ftc_tensor_transpose(ftc_tensor a, int64_t dim0, int64_t dim1, int release, ftc_tensor *out) {
  return op_guard(a, nullptr, release & 1, [&] {
    finish(ftc::tensor_of(a).transpose(dim0, dim1), a, nullptr, release & 1, out);
  });
}

}  // extern "C"
