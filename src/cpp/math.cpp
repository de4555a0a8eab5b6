// math.cpp - C API for tensor arithmetic: assignment, operators, elementwise functions,
// reductions and views, with the release protocol for temporaries (see ftorch_c_math.h).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <utility>
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
    default: ftc::fail_unknown(ftc::ftc_binary_op_table, op);
  }
}

// The result of an operation into *out: a new handle, flagged as the kind of temporary the
// caller asks for (Fortran does for every operator and function result).
void finish(at::Tensor &&result, int temporary, ftc_tensor *out, bool marked_as_result = false) {
  const std::optional<ftc::Lifetime> life = ftc::Lifetime::of_result(temporary);
  if (!life) ftc::fail_unknown(ftc::ftc_result_kind_table, temporary);
  ftc::out_arg(out, "out") = ftc::new_tensor_handle(std::move(result), marked_as_result ? life->marked_as_result() : *life);
}

// The operands of binary operator op on one device (its name made only for the message).
void require_same_device(const at::Tensor &a, const at::Tensor &b, int op) {
  if (a.device() != b.device()) {
    ftc::fail(FTC_ERR_DEVICE, std::string("operands of ") + binary_name(op) + " are on different devices (" +
                                  a.device().str() + " and " + b.device().str() + ")");
  }
}

std::vector<int64_t> dims_of(int ndims, const int64_t *dims) {
  if (ndims < 0 || (ndims > 0 && dims == nullptr)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "invalid dimension list");
  return std::vector<int64_t>(dims, dims + ndims);
}

// A dimension of t named by the caller: 0-based in the C API, never counted from the end as
// LibTorch would (Fortran passes its 1-based dim minus one, so a dim of 0 or -1 there must fail,
// not reduce or swap another dimension).
int64_t checked_dim(const at::Tensor &t, int64_t dim) {
  const int64_t rank = t.dim();
  if (dim < 0 || dim >= rank) {
    if (rank == 0) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "dimension " + std::to_string(dim + 1) +
                                              " of a tensor of rank 0: it has no dimensions (reduce over all elements)");
    }
    ftc::fail(FTC_ERR_INVALID_ARGUMENT,
              "dimension " + std::to_string(dim + 1) + " is out of range for a tensor of rank " + std::to_string(rank) +
                  ": dimensions are numbered 1 to " + std::to_string(rank) + " from Fortran (0 to " +
                  std::to_string(rank - 1) + " in the C API, which got " + std::to_string(dim) + ")");
  }
  return dim;
}

// Every dimension of a list, checked.
std::vector<int64_t> checked_dims(const at::Tensor &t, int ndims, const int64_t *dims) {
  std::vector<int64_t> d = dims_of(ndims, dims);
  for (const int64_t x : d) checked_dim(t, x);
  return d;
}

// Whether anything but this handle refers to t's memory: a graph that saved it for backward,
// a view, another tensor over the same storage.
bool is_shared(const at::Tensor &t) { return t.use_count() > 1 || t.storage().use_count() > 1; }

// Give whatever else refers to t's storage a private copy of its current bytes, and return a
// tensor that is the only owner of the original memory (same sizes, strides and offset). The
// memory itself (a Fortran array, say) stays where it is.
at::Tensor relocate(const at::Tensor &t) {
  c10::StorageImpl *impl = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = impl->nbytes();
  c10::Allocator *allocator = c10::GetAllocator(t.device().type());
  c10::DataPtr copy = allocator->allocate(nbytes);
  if (nbytes > 0) {
    const auto bytes = at::TensorOptions().dtype(at::kByte).device(t.device());
    const auto n = static_cast<int64_t>(nbytes);
    at::from_blob(copy.get(), {n}, bytes).copy_(at::from_blob(const_cast<void *>(impl->data()), {n}, bytes));
  }
  c10::DataPtr original = impl->set_data_ptr(std::move(copy));
  c10::Storage mine(c10::Storage::use_byte_size_t(), nbytes, std::move(original), nullptr, false);
  at::Tensor fresh = at::empty({0}, t.options().requires_grad(false));
  fresh.set_(mine, t.storage_offset(), t.sizes(), t.strides());
  return fresh;
}

// Whether `=` into t, which something else refers to, first parts t from those others rather
// than writing in place. Not for a view: its memory is its base's, which must stay where it is
// (a Fortran array), and the base and the other views see the write, as in PyTorch. Not for a
// leaf with autograd state (requires grad, or keeps a gradient or hooks) that stays a leaf (no
// history to carry): it is written in place and keeps its TensorImpl, its gradient and hooks, and
// the graphs that accumulate into it; a graph that saved it reports the in-place change at
// backward, as PyTorch does. Not for memory a Fortran pointer points into: every tensor over it
// sees the write, and the pointer stays valid while any of them lives.
bool parts_from_others(const at::Tensor &t, bool carries_history) {
  if (t.is_view()) return false;
  if (!carries_history && t.is_leaf() && t.unsafeGetTensorImpl()->autograd_meta() != nullptr) return false;
  return !ftc::memory_exposed(t);
}

}  // namespace

namespace ftc {

// What `=` into a tensor that something else refers to does with the others, so that they keep
// the old values and only the tensor gets the new ones (Fortran's value semantics): a tensor over
// memory FTorch was given (a Fortran array, device memory) keeps that memory, the others get a
// private copy of its old bytes (relocate); any other tensor gets new memory of its own, and the
// others keep the old memory and values (nothing to copy). Either way no pointer or other tensor
// is left over memory that one side frees: a detached copy of a wrapped tensor never takes the
// Fortran array over, and a view's memory stays with the view.
static at::Tensor part_from_others(const TensorTable::Slot &slot) {
  const at::Tensor &t = slot.value;
  if (slot.life.is_wrapped()) return relocate(t);
  return at::empty_strided(t.sizes(), t.strides(), t.options().requires_grad(false));
}

// Whether t's memory is its device allocator's own allocation, rather than memory given to
// LibTorch (a Fortran array, device memory the caller wrapped) or from elsewhere.
static bool allocator_owns_memory(const at::Tensor &t) {
  const c10::Allocator *allocator = nullptr;
  try {
    allocator = c10::GetAllocator(t.device().type());  // throws for a device type without one
  } catch (const std::exception &) {
    return false;
  }
  return allocator != nullptr && allocator->raw_deleter() != nullptr &&
         t.storage().data_ptr().get_deleter() == allocator->raw_deleter();
}

// Whether t, a tensor without history receiving a copy of r's values, may take r's own place in the
// graph (r's gradient edge) instead of recording the copy: the gradient that reaches t then goes
// where r's would go, unchanged, as CopyBackwards passes it on when the two have one dtype and one
// device (it converts otherwise). r has a grad_fn (a leaf's edge is its gradient accumulator, which
// no tensor with history may have as grad_fn), and either r's shape or a single value (a 0-d loss
// into a one-element tensor: the engine sums the gradient down to r's shape, one value as it is).
// Saves the CopyBackwards node of FTorch's training idiom (forward into a tensor over a Fortran
// array, a loss into a tensor over a Fortran scalar): built at the copy, run at backward.
static bool continues_graph(const at::Tensor &r, const at::Tensor &t) {
  return r.scalar_type() == t.scalar_type() && r.device() == t.device() &&
         (r.sizes() == t.sizes() || (r.dim() == 0 && t.numel() == 1)) && r.grad_fn() != nullptr;
}

// A model's or optimizer's parameter must stay the leaf they update: a value with history would
// make the handle a new tensor recording the copy, and the parameter would silently stop being
// what the handle names (PyTorch refuses the in-place copy into a leaf that requires grad).
[[noreturn]] __attribute__((cold, noinline)) static void parameter_takes_history() {
  fail(FTC_ERR_INVALID_ARGUMENT,
       "the left-hand side is a model or optimizer parameter and the right-hand side has autograd history "
       "(it requires grad): the parameter would stop being the leaf the model and optimizer update. Assign "
       "between torch_no_grad_begin() and torch_no_grad_end(), or assign torch_detach(value)");
}

void assign_into(TensorTable::Slot &slot, const at::Tensor &rhs) {
  at::Tensor &l = slot.value;
  if (rhs.scalar_type() != l.scalar_type()) check_lossless(rhs, l.scalar_type(), "the left-hand side");
  // (broadcast as copy_ does; a shape it cannot broadcast is a shape error before anything changes)
  if (rhs.sizes() != l.sizes() && !at::is_expandable_to(rhs.sizes(), l.sizes())) {
    fail(FTC_ERR_SHAPE, "the right-hand side has shape " + shape_string(rhs.sizes()) +
                            ", which does not broadcast to the left-hand side's " + shape_string(l.sizes()));
  }
  // Across devices too: the lhs keeps its device and memory and receives a copy (FTorch's idiom:
  // a model on the GPU writes into outputs that wrap CPU arrays).
  const bool grad_mode = at::GradMode::is_enabled();
  const bool carries_history = grad_mode && rhs.requires_grad();
  // Into a view (torch_reshape, a slice) whose base or right-hand side is part of a graph: the
  // values land in the base's memory, so autograd must record the write on the base, as PyTorch's
  // in-place copy into a view does (CopySlices): the base's later uses then take their gradients
  // through the new values, to the right-hand side, and none through the overwritten ones. (A
  // view of a leaf that requires grad is refused, as in PyTorch.)
  if (grad_mode && l.is_view() && !slot.life.is_parameter() && (carries_history || l.requires_grad())) {
    l.copy_(memory_overlaps(l, rhs) ? rhs.clone() : rhs);
    return;
  }
  if (slot.life.is_parameter()) {
    if (carries_history) parameter_takes_history();
  } else if (is_shared(l) && (check_not_saved_for_backward(l), parts_from_others(l, carries_history))) {
    at::NoGradGuard no_grad;
    l = part_from_others(slot);  // (a leaf requiring grad gets here only to take rhs's history below)
  }
  // Right-hand memory that overlaps the left-hand side's is read before any of it is written
  // (copy_values sees to it; the recorded copy below is given a clone).
  if (!carries_history) {
    // No history to carry: a plain copy. A leaf stays a leaf (and keeps requires_grad); a
    // result of earlier operations drops that history. Autograd records nothing when neither
    // side requires grad, so grad mode is switched off (two calls into LibTorch) only for a
    // leaf that requires grad, whose in-place copy it would otherwise refuse.
    bool requires_grad = l.requires_grad();
    if (requires_grad && !l.is_leaf()) {  // (a tensor with history requires grad; detached, it does not)
      l = l.detach();
      requires_grad = false;
    }
    if (grad_mode && requires_grad) {
      at::NoGradGuard no_grad;
      copy_values(l, rhs);
    } else {
      copy_values(l, rhs);
    }
    return;
  }
  const at::Tensor r = memory_overlaps(l, rhs) ? rhs.clone() : rhs;  // (a clone keeps requires_grad)
  // lhs takes rhs's history: a fresh tensor over the same memory (the old TensorImpl, which a model
  // or an optimizer may hold as a leaf, is left untouched) receives the values, and with them
  // rhs's own place in the graph (continues_graph) or else a recorded copy.
  at::Tensor fresh = l.detach();
  if (continues_graph(r, fresh)) {
    {
      at::NoGradGuard no_grad;
      copy_values(fresh, r);
    }
    torch::autograd::impl::set_gradient_edge(fresh, torch::autograd::impl::gradient_edge(r));
  } else {
    fresh.copy_(r);
  }
  l = std::move(fresh);
}

void store_result(ftc_tensor *out, const at::Tensor &value, const std::string &what) {
  if (out == nullptr) fail(FTC_ERR_INVALID_ARGUMENT, what + ": output handle pointer is null");
  auto *slot = TensorTable::instance().find(*out);
  if (slot == nullptr) {
    if (*out != nullptr) bad_handle(*out, "tensor", what.c_str());
    *out = new_tensor_handle(value);
    return;
  }
  if (slot->value.sizes() != value.sizes()) {
    fail(FTC_ERR_INVALID_ARGUMENT, what + " tensor has shape " + shape_string(slot->value.sizes()) +
                                       " but the result has shape " + shape_string(value.sizes()));
  }
  assign_into(*slot, value);
}

// A copy of the handle taken before an `=` wrote its tensor, as the right-hand side of an element
// `=`: what it stood for is gone (out of line: the hot path only tests).
[[noreturn]] __attribute__((cold, noinline)) void stale_right_hand_side() {
  fail(FTC_ERR_NULL_HANDLE,
       "the right-hand side is a stale copy of a tensor that = has written since the copy was taken: the two "
       "sides of an array = overlap and the compiler assigns element by element (gfortran 11 and 12); "
       "use call torch_assign(lhs, rhs), which reads the right-hand side as it was");
}

// Fortran's `x = x` (element `=` with one handle on both sides) does nothing, and is what
// gfortran 11/12 (and flang where only the type is imported) run for an allocating assignment
// that a defined assignment cannot perform: `hist = [hist, t]` assigns each old element to itself
// and drops t; `arr = [s1, s2]` or `arr2 = arr` allocating an array of a type with tensor
// components copies the handles bitwise first (the new elements share the tensors) and then
// assigns each copied component to itself. Said once per process on standard error
// (FTORCH_SELF_ASSIGNMENT_WARN=0 silences it).
__attribute__((cold, noinline)) void note_self_assignment() noexcept {
  static std::atomic<bool> said{false};
  if (said.exchange(true, std::memory_order_relaxed)) return;
  const char *env = std::getenv("FTORCH_SELF_ASSIGNMENT_WARN");
  if (env != nullptr && std::strcmp(env, "0") == 0) return;
  std::fprintf(stderr,
               "FTorch warning: `x = x` with the same tensor on both sides (it does nothing). If it comes from "
               "an array assignment that should allocate or enlarge the left-hand side, the compiler did not do "
               "what Fortran says: `hist = [hist, t]` of tensors keeps the old size (a type with a defined `=` "
               "is never reallocated by `=`: gfortran 11/12, and flang where only the type is imported, assign "
               "each old element to itself); `arr = [s1, s2]` or `arr2 = arr` allocating an array of a type "
               "with tensor components gives elements that share their tensors with the originals (gfortran "
               "11/12 copy the handles, then assign each to itself). Allocate the array first, then assign. "
               "(FTORCH_SELF_ASSIGNMENT_WARN=0 silences this.)\n");
  std::fflush(stderr);
}

// What `=` does with write stamps (handles.hpp): C's assignment ignores them; Fortran's array
// assignment (ftc_tensor_assign_many) bumps the stamp of each constructed lhs it writes; Fortran's
// elemental `=` also refuses an rhs whose stamp is older than its tensor's (a copy taken before an
// earlier element of the same statement wrote that tensor).
enum class Stamping { none, bump, check };

// Whether `left = right` may make left refer to right's tensor instead of copying right's values
// into left's memory, because nothing could tell the difference: right is an expression's result
// that the statement releases, which nothing else refers to (not a view, its memory its own);
// left's memory is LibTorch's own allocation (not a Fortran array or other memory FTorch wraps),
// which nothing else refers to (no other handle, list, view, graph, model or optimizer) and whose
// address was never handed out (exposed); both have the same dtype, device, sizes and strides.
// For autograd: with history to carry, the copy would replace left's tensor anyway (a fresh one
// recording the copy: see assign_into); without, see below. Saves the copy, and for a result with
// history the CopyBackwards node that backward would run.
bool can_take_over(const TensorTable::Slot &left, const TensorTable::Slot &right) {
  if (!Lifetime::may_take_over(left.life, right.life)) return false;
  const at::Tensor &l = left.value;
  const at::Tensor &r = right.value;
  if (!allocator_owns_memory(l)) return false;
  if (is_shared(l) || is_shared(r) || l.is_view() || r.is_view()) return false;
  if (l.scalar_type() != r.scalar_type() || l.device() != r.device() || l.sizes() != r.sizes() ||
      l.strides() != r.strides() || l.storage_offset() != r.storage_offset() || l.is_inference() != r.is_inference()) {
    return false;
  }
  if (at::GradMode::is_enabled() && r.requires_grad()) return true;
  // Without history to carry, a tensor with history would be detached (a new tensor over the
  // same memory) and then receive the values: the same as taking r over. A leaf keeps its
  // TensorImpl when it has autograd state (requires grad, or a gradient or hooks from before).
  if (r.requires_grad()) return false;
  return !l.is_leaf() || l.unsafeGetTensorImpl()->autograd_meta() == nullptr;
}

// `*lhs = rhs` with Fortran's value semantics (see ftc_tensor_assign); value_before, when given,
// is the value rhs had before the statement began (overlapping array assignment). A template on
// the stamping, so that the hot element `=` carries no test for the others.
template <Stamping stamping>
void assign_handle(ftc_tensor *lhs, ftc_tensor rhs, const at::Tensor *value_before) {
  auto &table = TensorTable::instance();
  // The right-hand side first: a temporary is scheduled for release whatever fails next.
  TensorTable::Slot *right = nullptr;
  if (rhs != nullptr) right = &tensor_slot(rhs, "right-hand side tensor");
  if (lhs == nullptr) fail(FTC_ERR_INVALID_ARGUMENT, "left-hand side handle pointer is null");
  if (*lhs == rhs && value_before == nullptr) {  // t = t
    if constexpr (stamping == Stamping::check) {
      if (rhs != nullptr) note_self_assignment();
    }
    return;
  }
  if constexpr (stamping == Stamping::check) {
    if (right != nullptr && TensorTable::stamp_of(rhs) != right->stamp) stale_right_hand_side();
  }
  auto *left = table.find(*lhs);
  if (right == nullptr) {
    // A copy of an unconstructed tensor is unconstructed (tensor components of user types);
    // assigning nothing to a live tensor is a mistake, not a way to delete it.
    if (left != nullptr) fail(FTC_ERR_NULL_HANDLE, "right-hand side tensor is not constructed (null handle)");
    *lhs = nullptr;
    return;
  }
  const at::Tensor &value = value_before != nullptr ? *value_before : right->value;
  if (left == nullptr) {
    // Unconstructed (or stale: a compiler finalized it just before assigning) lhs: it becomes
    // the value; a temporary is taken over without copying. `r = torch_result(expr)` makes r a
    // result, released by the first call that reads it.
    // (Not a tensor another handle holds too: an earlier element of the same statement took it,
    // flang's `ts = x + 1` or `ts = spread(x + 1, 1, 3)`, or an operation returned its input.)
    const bool take = value_before != nullptr ||
                      (right->life.taken_by_unconstructed() && right->value.use_count() == 1);
    *lhs = new_tensor_handle(take ? value : value.clone(), right->life.adopted());
    return;
  }
  if (value_before == nullptr && can_take_over(*left, *right)) {
    left->value = right->value;  // the expression's handle lets go of it when the statement ends
  } else {
    assign_into(*left, value);
  }
  if constexpr (stamping != Stamping::none) *lhs = static_cast<ftc_tensor>(TensorTable::restamp(*lhs, *left));
}

}  // namespace ftc

extern "C" {

int ftc_tensor_assign(ftc_tensor *lhs, ftc_tensor rhs) {
  return ftc::guard([&] { ftc::assign_handle<ftc::Stamping::none>(lhs, rhs, nullptr); });
}

int ftc_tensor_assign_element(ftc_tensor *lhs, ftc_tensor rhs) {
  // gfortran assigns a scalar expression to an array of tensors (`ts = x + 1`) by calling the
  // elemental `=` once per element with the one result: a temporary this `=` reads is kept until
  // the thread's next C call, and read again if that call is the next element's `=` (an earlier
  // element that took it over shares it: assign_handle then copies, as for any shared tensor).
  ftc::ThreadState *state = ftc::existing_thread_state();
  void *held = nullptr;
  if (state != nullptr) std::swap(held, state->held_rhs);  // (guard would release it first)
  return ftc::guard([&] {
    auto &ts = ftc::thread_state();
    const bool again = held != nullptr && held == static_cast<void *>(rhs);
    if (again) {
      ftc::count_handles(ts, 1);  // live again while this call reads it
    } else if (held != nullptr) {
      ts.held_rhs = held;
      ftc::release_held(ts);
    }
    const size_t mark = ts.consumed.size();
    ftc::assign_handle<ftc::Stamping::check>(lhs, rhs, nullptr);
    if (ts.consumed.size() > mark && ts.consumed.back() == static_cast<void *>(rhs)) {
      ts.consumed.pop_back();
      ftc::hold_rhs(ts, rhs);
    }
  });
}

int ftc_tensor_assign_many(ftc_tensor *lhs, const ftc_tensor *rhs, int64_t n) {
  return ftc::guard([&] {
    ftc::take_temporaries(rhs, n);
    if (n < 0 || (n > 0 && (lhs == nullptr || rhs == nullptr))) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "invalid array of handles for assignment");
    }
    // Fortran evaluates the right-hand side before assigning any element: a right-hand element
    // that is also a left-hand element written earlier (ts(2:3) = ts(1:2)) is read as it was.
    // Handles are compared without their write stamps (copies of one handle taken at different
    // times name the same tensor).
    using Table = ftc::TensorTable;
    std::unordered_map<const void *, int64_t> written;  // lhs handle -> its position
    for (int64_t i = 0; i < n; ++i) {
      if (lhs[i] != nullptr) written.emplace(Table::unstamped(lhs[i]), i);
    }
    std::vector<at::Tensor> before(static_cast<size_t>(n));
    auto &table = Table::instance();
    for (int64_t i = 0; i < n; ++i) {
      const auto it = written.find(Table::unstamped(rhs[i]));
      if (it == written.end() || it->second >= i) continue;
      if (auto *slot = table.find(rhs[i])) before[static_cast<size_t>(i)] = slot->value.clone();
    }
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor &old = before[static_cast<size_t>(i)];
      ftc::assign_handle<ftc::Stamping::bump>(&lhs[i], rhs[i], old.defined() ? &old : nullptr);
    }
  });
}

int ftc_tensor_mark_result(ftc_tensor t, int temporary, ftc_tensor *out) {
  return ftc::guard([&] {
    auto &slot = ftc::tensor_slot(t, "result");
    finish(slot.life.is_expression() ? slot.value : slot.value.clone(), temporary, out, true);
  });
}

int ftc_tensor_fill(ftc_tensor t, int64_t int_value, double real_value, int is_integer) {
  return ftc::guard([&] {
    auto &slot = ftc::tensor_slot(t);
    const c10::Scalar s = is_integer ? c10::Scalar(int_value) : c10::Scalar(real_value);
    ftc::check_lossless(s, slot.value.scalar_type(), "the left-hand side");
    ftc::assign_into(slot, at::scalar_tensor(s, slot.value.options().requires_grad(false)));
  });
}

int ftc_tensor_binary(int op, ftc_tensor a, ftc_tensor b, int temporary, ftc_tensor *out) {
  return ftc::guard([&] {
    const auto operand = ftc::operands({a, b}, {"left operand", "right operand"});
    const at::Tensor &x = operand[0]->value;
    const at::Tensor &y = operand[1]->value;
    require_same_device(x, y, op);
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
    finish(std::move(r), temporary, out);
  });
}

int ftc_tensor_binary_scalar(int op, ftc_tensor a, int64_t int_value, double real_value, int is_integer,
                             int scalar_first, int temporary, ftc_tensor *out) {
  return ftc::guard([&] {
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
    finish(std::move(r), temporary, out);
  });
}

int ftc_tensor_unary(int op, ftc_tensor a, int temporary, ftc_tensor *out) {
  return ftc::guard([&] {
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
      default: ftc::fail_unknown(ftc::ftc_unary_op_table, op);
    }
    finish(std::move(r), temporary, out);
  });
}

int ftc_tensor_reduce(int op, ftc_tensor a, int ndims, const int64_t *dims, int keepdim, int temporary,
                      ftc_tensor *out) {
  return ftc::guard([&] {
    const at::Tensor &x = ftc::tensor_of(a);
    const auto d = checked_dims(x, ndims, dims);
    at::Tensor r;
    if (op == FTC_SUM) {
      r = d.empty() ? x.sum() : x.sum(d, keepdim != 0);
    } else if (op == FTC_MEAN) {
      r = d.empty() ? x.mean() : x.mean(d, keepdim != 0);
    } else {
      ftc::fail_unknown(ftc::ftc_reduce_op_table, op);
    }
    finish(std::move(r), temporary, out);
  });
}

int ftc_tensor_reshape(ftc_tensor a, int ndims, const int64_t *shape, int temporary, ftc_tensor *out) {
  return ftc::guard([&] { finish(ftc::tensor_of(a).reshape(dims_of(ndims, shape)), temporary, out); });
}

int ftc_tensor_permute(ftc_tensor a, int ndims, const int64_t *dims, int temporary, ftc_tensor *out) {
  return ftc::guard([&] {
    const at::Tensor &x = ftc::tensor_of(a);
    finish(x.permute(checked_dims(x, ndims, dims)), temporary, out);
  });
}

int ftc_tensor_transpose(ftc_tensor a, int64_t dim0, int64_t dim1, int temporary, ftc_tensor *out) {
  return ftc::guard([&] {
    const at::Tensor &x = ftc::tensor_of(a);
    finish(x.transpose(checked_dim(x, dim0), checked_dim(x, dim1)), temporary, out);
  });
}

}  // extern "C"
