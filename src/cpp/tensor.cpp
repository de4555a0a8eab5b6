// tensor.cpp - C API for tensors: construction, wrapping foreign memory, queries and copies.
#include <cmath>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <vector>

#include "internal.hpp"

namespace {

constexpr int kMaxRank = 64;

// Shapes and strides live on the stack for the usual ranks: wrapping an array allocates nothing
// but the tensor itself and its handle.
using Dims = c10::SmallVector<int64_t, 8>;

int64_t shape_bytes(const Dims &shape, int64_t itemsize);

Dims checked_shape(int ndims, const int64_t *shape) {
  if (ndims < 0 || ndims > kMaxRank) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "rank must be between 0 and 64, got " + std::to_string(ndims));
  }
  if (ndims > 0 && shape == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "shape is missing");
  Dims s(shape, shape + ndims);
  for (int i = 0; i < ndims; ++i) {
    if (s[i] < 0) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "extent " + std::to_string(i + 1) + " of the shape is negative (" +
                                              std::to_string(s[i]) + ")");
    }
  }
  shape_bytes(s, 1);
  return s;
}

// Bytes that the nonzero extents of a shape span at `itemsize` bytes an element, or an error when
// that does not fit in int64 (LibTorch would overflow computing strides or the storage's size,
// in places where its error cannot be caught). Every partial product of the extents (a stride of
// any layout) is at most this.
int64_t shape_bytes(const Dims &shape, int64_t itemsize) {
  int64_t bytes = itemsize;
  for (const auto extent : shape) {
    if (extent > 0 && __builtin_mul_overflow(bytes, extent, &bytes)) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "shape " + ftc::shape_string(shape) + " is too large: " +
                                              (itemsize == 1 ? std::string("its element count")
                                                             : "its size in bytes") +
                                              " does not fit in a 64-bit integer");
    }
  }
  return bytes;
}

// 1-based permutation of 1..n, or an error naming the argument.
Dims checked_permutation(const int32_t *perm, int n, const char *what) {
  Dims p(static_cast<size_t>(n));
  c10::SmallVector<bool, 8> seen(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    const int v = perm[i];
    if (v < 1 || v > n || seen[v - 1]) {
      std::string list;
      for (int j = 0; j < n; ++j) list += (j ? "," : "") + std::to_string(perm[j]);
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " = [" + list +
                                              "] is not a permutation of 1.." + std::to_string(n));
    }
    seen[v - 1] = true;
    p[i] = v - 1;
  }
  return p;
}

// Strides (in elements) of memory where dimensions layout[0], layout[1], ... vary fastest first.
Dims layout_strides(const Dims &shape, const int32_t *layout) {
  const int n = static_cast<int>(shape.size());
  Dims strides(shape.size(), 1);
  if (layout == nullptr) {  // column-major: dimension 1 fastest
    for (int i = 1; i < n; ++i) strides[i] = strides[i - 1] * shape[i - 1];
    return strides;
  }
  const auto order = checked_permutation(layout, n, "layout");
  for (int i = 1; i < n; ++i) strides[order[i]] = strides[order[i - 1]] * shape[order[i - 1]];
  return strides;
}

bool is_column_major(const at::Tensor &t) {
  int64_t expected = 1;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) != 1 && t.stride(i) != expected) return false;
    expected *= t.size(i);
  }
  return true;
}

void require_shape(const at::Tensor &t, const Dims &shape, const char *what) {
  if (t.sizes() != c10::IntArrayRef(shape)) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string(what) + " has shape " + ftc::shape_string(shape) +
                                            " but the tensor has shape " + ftc::shape_string(t.sizes()));
  }
}

// A tensor whose memory or metadata the caller will keep pointing into after the call: an
// expression's result (an operator's, or a function's `torch_result`) is released when the call
// or the statement ends, so that would dangle; a named one is marked exposed (`=` then always
// writes into its memory, and into the memory of every tensor sharing it when the pointer is
// into the memory itself).
ftc::TensorTable::Slot &lasting_slot(ftc_tensor h, const char *purpose, bool into_memory) {
  auto &slot = ftc::tensor_slot(h);
  if (slot.life.is_expression()) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, std::string("a pointer to the ") + purpose +
                                            " of an expression's result (an operator's, or a function's that "
                                            "returns torch_result) would dangle: assign the expression to a "
                                            "tensor first");
  }
  if (into_memory) {
    ftc::expose_memory(slot);
  } else {
    slot.life.expose();
  }
  return slot;
}
const at::Tensor &lasting_tensor(ftc_tensor h, const char *purpose, bool into_memory) {
  return lasting_slot(h, purpose, into_memory).value;
}

// The address and shape of a tensor's memory for a no-copy view: this dtype and rank, laid out
// column-major (Fortran order); on the CPU only unless any_device.
void view_address(ftc_tensor t, int dtype, int ndims, int64_t *shape, void **data, bool any_device) {
  const auto &x = lasting_tensor(t, "data", true);
  if (!any_device && !x.device().is_cpu()) {
    ftc::fail(FTC_ERR_DEVICE, "a no-copy view needs a CPU tensor (the tensor is on " + x.device().str() +
                                "); copy it to a Fortran array instead");
  }
  if (x.scalar_type() != ftc::scalar_type(dtype)) {
    ftc::fail(FTC_ERR_DTYPE, std::string("tensor dtype ") + c10::toString(x.scalar_type()) +
                                 " does not match the pointer's kind (" + c10::toString(ftc::scalar_type(dtype)) + ")");
  }
  if (x.dim() != ndims) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "tensor has rank " + std::to_string(x.dim()) + ", pointer has rank " +
                                            std::to_string(ndims));
  }
  if (!is_column_major(x)) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT, "tensor with shape " + ftc::shape_string(x.sizes()) + " and strides " +
                                            ftc::shape_string(x.strides()) +
                                            " is not laid out in Fortran (column-major) order; copy it with "
                                            "torch_tensor_to_array instead");
  }
  if (ndims > 0 && shape == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "output argument 'shape' is a null pointer");
  ftc::out_arg(data, "data");
  for (int i = 0; i < ndims; ++i) shape[i] = x.size(i);
  // A tensor without elements may have no memory at all: a valid address of nothing, so that
  // the Fortran pointer is associated (with zero extents) as for any other tensor.
  alignas(64) static char nothing[64];
  *data = x.numel() == 0 ? static_cast<void *>(nothing) : x.data_ptr();
}

// The device of memory at `data` that the caller says is on `dev`: checked, since host memory
// or another GPU's would be read by kernels of the wrong device; device_index < 0 takes the
// device the memory is on.
c10::Device memory_device(void *data, c10::Device dev, int device_index) {
  c10::Device owner(c10::kCPU);
  try {
    owner = at::globalContext().getDeviceFromPtr(data, dev.type());
  } catch (const c10::Error &e) {
    ftc::fail(FTC_ERR_DEVICE, "data is not memory of a " + c10::DeviceTypeName(dev.type()) +
                                  " device: " + e.what_without_backtrace());
  }
  if (device_index >= 0 && owner != dev) {
    ftc::fail(FTC_ERR_DEVICE, "data is memory of " + owner.str() + ", not of " + dev.str());
  }
  return owner;
}

// A tensor over caller-owned memory (a Fortran array, a C buffer, device memory), never copied
// there: no deleter, LibTorch never frees it. layout: dimensions from fastest to slowest varying
// (NULL: column-major); permute: then reorders the dimensions, applied to the sizes and strides
// directly (not as a view of another tensor), so that the tensor is the only owner of its
// storage. Host memory (device_memory false) is copied to a device other than the CPU; device
// memory is wrapped where it is. Arguments are checked in the order shape, layout, dtype,
// device, data.
at::Tensor wrap_memory(void *data, int ndims, const int64_t *shape, const int32_t *layout, const int32_t *permute,
                       int dtype, int device_type, int device_index, bool device_memory) {
  const auto sizes = checked_shape(ndims, shape);
  const auto strides = layout_strides(sizes, layout);
  const auto type = ftc::scalar_type(dtype);
  shape_bytes(sizes, static_cast<int64_t>(c10::elementSize(type)));
  const auto dev = ftc::device(device_type, device_index);
  const auto numel = c10::multiply_integers(sizes);
  if (data == nullptr && numel > 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "data pointer is null");
  // The tensor's sizes and strides: those of the memory, or permuted (no copy when not).
  c10::IntArrayRef psizes = sizes, pstrides = strides;
  Dims permuted_sizes, permuted_strides;
  if (permute != nullptr) {
    const auto order = checked_permutation(permute, ndims, "permute_dims");
    permuted_sizes.resize(order.size());
    permuted_strides.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      permuted_sizes[i] = sizes[static_cast<size_t>(order[i])];
      permuted_strides[i] = strides[static_cast<size_t>(order[i])];
    }
    psizes = permuted_sizes;
    pstrides = permuted_strides;
  }
  const auto options = at::TensorOptions().dtype(type);
  // at::from_blob, not torch::from_blob: the latter passes its result to make_variable by copy,
  // which then makes a second TensorImpl (shallow_copy_and_detach) and frees the first, about a
  // third of the cost of wrapping. Both give a tensor without autograd metadata; requires_grad is
  // set by the caller.
  if (!device_memory || dev.is_cpu()) {
    auto t = at::from_blob(data, psizes, pstrides, options);
    if (dev.is_cpu()) return t;
    at::Tensor copy = at::empty_strided(psizes, pstrides, options.device(dev));
    ftc::copy_values(copy, t);  // FTorch's GPU idiom: at the bus's speed
    return copy;
  }
  // Nothing to wrap without elements (the address may be any placeholder).
  if (numel == 0) return at::empty_strided(psizes, pstrides, options.device(dev));
  return at::from_blob(data, psizes, pstrides, options.device(memory_device(data, dev, device_index)));
}

}  // namespace

namespace ftc {

std::string dtype_name(c10::ScalarType t) { return std::string(c10::getDtypeNames(t).first); }

namespace {

[[noreturn]] void lossy(const std::string &values, c10::ScalarType from, c10::ScalarType to, const char *into,
                        const std::string &why) {
  fail(FTC_ERR_DTYPE, std::string("converting ") + values + " (" + dtype_name(from) + ") into " + into + " (" +
                          dtype_name(to) + ") would " + why +
                          ": give it the values' dtype, or convert explicitly with torch_tensor_to(source, target), "
                          "which rounds toward zero and wraps around as C does");
}

bool integral(c10::ScalarType t, bool include_bool) { return c10::isIntegralType(t, include_bool); }

bool is_unsigned(c10::ScalarType t) {
  return t == c10::kByte || t == c10::kUInt16 || t == c10::kUInt32 || t == c10::kUInt64;
}

// Whether every value of an integer dtype `from` fits `to` (a wider or equal width of the same
// signedness, or a wider signed one for unsigned values).
bool always_fits(c10::ScalarType from, c10::ScalarType to) {
  const auto wf = c10::elementSize(from), wt = c10::elementSize(to);
  if (is_unsigned(from) == is_unsigned(to)) return wt >= wf;
  return is_unsigned(from) && wt > wf;
}

// The largest finite value of a floating-point dtype.
double largest(c10::ScalarType t) {
  double max = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(c10::kHalf, c10::kBFloat16, t, "largest", [&] {
    max = static_cast<double>(std::numeric_limits<scalar_t>::max());
  });
  return max;
}

// The values an integer dtype holds (bool: 0 and 1).
std::pair<int64_t, int64_t> integer_range(c10::ScalarType t) {
  int64_t min = 0, max = 1;
  if (t != c10::kBool) {
    AT_DISPATCH_INTEGRAL_TYPES(t, "integer_range", [&] {
      min = static_cast<int64_t>(std::numeric_limits<scalar_t>::lowest());
      max = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
    });
  }
  return {min, max};
}

}  // namespace

void check_lossless(const at::Tensor &values, c10::ScalarType to, const char *into) {
  const c10::ScalarType from = values.scalar_type();
  if (from == to || from == c10::kBool) return;
  if (c10::isComplexType(from) && !c10::isComplexType(to)) lossy("complex values", from, to, into, "drop their imaginary parts");
  if (!integral(to, true)) {  // into floating point: rounding, unless a finite value exceeds its range
    if (c10::isFloatingType(from) && c10::isFloatingType(to) && largest(to) < largest(from) && values.numel() > 0) {
      at::NoGradGuard no_grad;
      const double max = largest(to);
      const at::Tensor finite = at::isfinite(values);
      if (at::any(finite & (values.abs() > max)).item<bool>()) {
        const double worst = at::where(finite, values.abs(), at::zeros_like(values)).max().item<double>();
        std::ostringstream text, bound;
        text << "values up to " << worst;
        bound << max;
        lossy(text.str(), from, to, into, "turn them into infinities (the largest " + dtype_name(to) + " is " +
                                              bound.str() + ")");
      }
    }
    return;
  }
  if (to == c10::kBool) lossy("values", from, to, into, "turn every nonzero value into true");
  if (!integral(from, false)) lossy("floating-point values", from, to, into, "truncate or overflow them");
  if (always_fits(from, to)) return;
  if (values.numel() == 0) return;
  // A narrower integer dtype: the values must fit (one pass over them, only in this case).
  at::NoGradGuard no_grad;
  const auto range = at::aminmax(values);
  const int64_t lo = std::get<0>(range).item<int64_t>(), hi = std::get<1>(range).item<int64_t>();
  const auto [min, max] = integer_range(to);
  if (lo < min || hi > max) {
    lossy("integers from " + std::to_string(lo) + " to " + std::to_string(hi), from, to, into,
          "overflow them (the range is " + std::to_string(min) + " to " + std::to_string(max) + ")");
  }
}

void check_lossless(const c10::Scalar &value, c10::ScalarType to, const char *into) {
  if (c10::isFloatingType(to) && value.isFloatingPoint()) {  // (a finite number beyond the range: an infinity)
    const double v = value.toDouble();
    if (std::isfinite(v) && std::abs(v) > largest(to)) {
      std::ostringstream text;
      text << "the number " << v;
      lossy(text.str(), c10::kDouble, to, into, "turn it into an infinity");
    }
  }
  if (!integral(to, true) || value.isBoolean()) return;
  const auto [min, max] = integer_range(to);
  std::ostringstream text;
  if (value.isIntegral(false)) {
    const int64_t v = value.toLong();
    if (v >= min && v <= max) return;
    text << "the number " << v;
  } else {
    // A whole floating-point number within the range converts exactly.
    const double v = value.isFloatingPoint() ? value.toDouble() : std::nan("");
    if (std::trunc(v) == v && v >= static_cast<double>(min) && v <= static_cast<double>(max)) return;
    text << "the number " << value;
  }
  lossy(text.str(), value.type(), to, into, "change it");
}

}  // namespace ftc

extern "C" {

int ftc_tensor_new(ftc_tensor *out, int fill, int ndims, const int64_t *shape, int dtype, int device_type,
                   int device_index, int requires_grad) {
  return ftc::guard([&] {
    const auto sizes = checked_shape(ndims, shape);
    const auto opts = at::TensorOptions()
                          .dtype(ftc::scalar_type(dtype))
                          .device(ftc::device(device_type, device_index))
                          .requires_grad(requires_grad != 0);
    at::Tensor t;
    switch (fill) {
      case FTC_FILL_EMPTY: t = torch::empty(sizes, opts); break;
      case FTC_FILL_ZEROS: t = torch::zeros(sizes, opts); break;
      case FTC_FILL_ONES: t = torch::ones(sizes, opts); break;
      default: ftc::fail_unknown(ftc::ftc_fill_table, fill);
    }
    ftc::install(out, std::move(t));
  });
}

int ftc_tensor_from_blob(ftc_tensor *out, void *data, int ndims, const int64_t *shape, const int32_t *layout,
                         const int32_t *permute, int dtype, int device_type, int device_index,
                         int requires_grad) {
  return ftc::guard([&] {
    auto t = wrap_memory(data, ndims, shape, layout, permute, dtype, device_type, device_index, false);
    if (requires_grad != 0) t.requires_grad_(true);
    ftc::install(out, std::move(t), ftc::Lifetime::wrapping());
  });
}

int ftc_tensor_from_device_blob(ftc_tensor *out, void *data, int ndims, const int64_t *shape, const int32_t *layout,
                                const int32_t *permute, int dtype, int device_type, int device_index,
                                int requires_grad) {
  return ftc::guard([&] {
    auto t = wrap_memory(data, ndims, shape, layout, permute, dtype, device_type, device_index, true);
    if (requires_grad != 0) t.requires_grad_(true);
    ftc::install(out, std::move(t), ftc::Lifetime::wrapping());
  });
}

int ftc_tensor_rank(ftc_tensor t, int *rank) {
  return ftc::guard([&] { ftc::out_arg(rank, "rank") = static_cast<int>(ftc::tensor_of(t).dim()); });
}

// The extents or strides a Fortran pointer (get_shape, get_stride) is pointed to: a copy kept in
// the tensor's slot, never LibTorch's own description, which a write through the pointer (reusing
// it to build another shape) would change under the tensor's memory. The copy is rewritten only
// where it differs, so threads asking about one tensor write nothing; it moves only when the rank
// outgrows it (after an `=` into the tensor, the documented end of an earlier pointer's validity).
// Never a null address, also for a 0-d tensor: Fortran's pointer is then associated, of size 0.
// Threads may ask about one tensor at once (two readers): its copies are written under one of a
// few locks, chosen by the slot (uncontended but for such threads).
static const int64_t *described_copy(std::vector<int64_t> &copy, c10::IntArrayRef values) {
  static std::mutex locks[16];
  const std::lock_guard<std::mutex> lock(locks[(reinterpret_cast<uintptr_t>(&copy) / 64) % 16]);
  if (copy.empty() || copy.size() < values.size()) {
    copy.reserve(std::max<size_t>(values.size(), 8));
    copy.resize(std::max<size_t>(values.size(), 1));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (copy[i] != values[i]) copy[i] = values[i];
  }
  return copy.data();
}

int ftc_tensor_shape(ftc_tensor t, const int64_t **sizes, int *ndims) {
  return ftc::guard([&] {
    auto &slot = lasting_slot(t, "shape", false);
    const auto &x = slot.value;
    ftc::out_arg(sizes, "sizes") = described_copy(slot.sizes_copy, x.sizes());
    ftc::out_arg(ndims, "ndims") = static_cast<int>(x.dim());
  });
}

int ftc_tensor_strides(ftc_tensor t, const int64_t **strides, int *ndims) {
  return ftc::guard([&] {
    auto &slot = lasting_slot(t, "strides", false);
    const auto &x = slot.value;
    ftc::out_arg(strides, "strides") = described_copy(slot.strides_copy, x.strides());
    ftc::out_arg(ndims, "ndims") = static_cast<int>(x.dim());
  });
}

int ftc_tensor_dtype(ftc_tensor t, int *dtype) {
  return ftc::guard([&] { ftc::out_arg(dtype, "dtype") = ftc::dtype_code(ftc::tensor_of(t).scalar_type()); });
}

int ftc_tensor_device(ftc_tensor t, int *device_type, int *device_index) {
  return ftc::guard([&] {
    const auto dev = ftc::tensor_of(t).device();
    ftc::out_arg(device_type, "device_type") = ftc::device_type_code(dev.type());
    ftc::out_arg(device_index, "device_index") = dev.is_cpu() ? -1 : static_cast<int>(dev.index());
  });
}

int ftc_tensor_requires_grad(ftc_tensor t, int *requires_grad) {
  return ftc::guard([&] { ftc::out_arg(requires_grad, "requires_grad") = ftc::tensor_of(t).requires_grad() ? 1 : 0; });
}

int ftc_tensor_print(ftc_tensor t) {
  return ftc::guard([&] { std::cout << ftc::tensor_of(t) << std::endl; });
}

int ftc_tensor_zero(ftc_tensor t) {
  return ftc::guard([&] {
    torch::NoGradGuard no_grad;
    ftc::tensor_of(t).zero_();
  });
}

int ftc_tensor_copy_into(ftc_tensor src, ftc_tensor dst, int non_blocking) {
  return ftc::guard([&] {
    ftc::take_temporaries({src, dst});
    const auto &s = ftc::tensor_of(src, "source tensor");
    auto &d = ftc::tensor_of(dst, "target tensor");
    if (s.sizes() != d.sizes()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "source shape " + ftc::shape_string(s.sizes()) +
                                              " differs from target shape " + ftc::shape_string(d.sizes()));
    }
    torch::NoGradGuard no_grad;
    // (source memory the target overlaps is read whole first: sections of one Fortran array)
    d.copy_(ftc::memory_overlaps(d, s) ? s.clone() : s, non_blocking != 0);
  });
}

int ftc_tensor_data_view(ftc_tensor t, int dtype, int ndims, int64_t *shape, void **data) {
  return ftc::guard([&] { view_address(t, dtype, ndims, shape, data, false); });
}

int ftc_tensor_device_view(ftc_tensor t, int dtype, int ndims, int64_t *shape, void **data) {
  return ftc::guard([&] { view_address(t, dtype, ndims, shape, data, true); });
}

int ftc_tensor_copy_to_blob(ftc_tensor t, void *data, int dtype, int ndims, const int64_t *shape) {
  return ftc::guard([&] {
    const auto &x = ftc::tensor_of(t);
    const auto sizes = checked_shape(ndims, shape);
    require_shape(x, sizes, "the Fortran array");
    if (data == nullptr && x.numel() > 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "data pointer is null");
    const auto type = ftc::scalar_type(dtype);
    if (type != x.scalar_type()) ftc::check_lossless(x, type, "the Fortran array");
    at::Tensor dst = at::from_blob(data, sizes, layout_strides(sizes, nullptr), at::TensorOptions().dtype(type));
    torch::NoGradGuard no_grad;
    ftc::copy_values(dst, x);
  });
}

}  // extern "C"
