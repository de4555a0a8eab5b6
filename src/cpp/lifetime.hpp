// lifetime.hpp - the lifetime rules of a tensor handle as one state machine.
//
// Every tensor handle has a Lifetime: where it came from (a named tensor, an expression's result
// of one of three kinds, memory FTorch was given, a parameter) and what has happened to it since
// (bound to an optimizer, an address into it handed out, returned by a custom function). The
// states are the values of this type; the transitions are its named operations, and the rules
// that C entry points apply to a handle (is it released when read? may `=` take it over? must `=`
// write into its memory?) are its queries. Nothing else reads or writes the bits. Each transition
// and rule has a unit test (tests/unit/test_core.cpp, "Lifetime*").
//
// Which kind of expression result a call makes is chosen by the Fortran binding, from a probe of
// what the compiler finalizes (ftorch_result_kind): FTC_TEMPORARY where function results are not
// finalized (released by the first call that reads them), FTC_TEMPORARY_FINALIZED where they are
// (deleted by the finalizer at the end of the statement; readers leave them alone).
// The write stamps of Fortran's element `=` are the handle table's (handles.hpp), not part of
// the state: they tell copies of one handle apart, not what the handle is.
#pragma once

#include <cstdint>
#include <optional>

#include "ftorch_c.h"

namespace ftc {

class Lifetime {
 public:
  // ---------------------------------------------------------------- states a handle starts in

  // A slot not holding a handle, or a named tensor.
  constexpr Lifetime() noexcept : bits_(0) {}
  // A tensor the caller holds in a variable: made by a constructor, or a call's named output.
  static constexpr Lifetime named() noexcept { return Lifetime(0); }
  // A tensor over memory FTorch was given (a Fortran array, device memory): `=` writes into that
  // memory, always, and whatever else shares it is given a private copy first.
  static constexpr Lifetime wrapping() noexcept { return Lifetime(kWrapped); }
  // A model's or optimizer's parameter: `=` writes in place, always (the leaf they update).
  static constexpr Lifetime parameter() noexcept { return Lifetime(kShared); }
  // The result of an operator or tensor function, of the kind the binding asks for (FTC_NAMED,
  // FTC_TEMPORARY, FTC_TEMPORARY_FINALIZED); no value for an unknown kind.
  static constexpr std::optional<Lifetime> of_result(int kind) noexcept {
    switch (kind) {
      case FTC_NAMED: return named();
      case FTC_TEMPORARY: return Lifetime(kTemporary);
      case FTC_TEMPORARY_FINALIZED: return Lifetime(kFinalized);
      default: return std::nullopt;
    }
  }
  // `torch_result(expr)`: the same, marked so that an unconstructed left-hand side taking it over
  // becomes a function result (see adopted).
  constexpr Lifetime marked_as_result() const noexcept { return Lifetime(bits_ | kMarkResult); }

  // ---------------------------------------------------------------- rules

  // An expression's result (any kind, torch_result's included): the statement or the first read
  // releases it, so it is never referred to (argument lists keep its value, not its handle), a
  // pointer into it would dangle, and `=` may take its tensor over instead of copying.
  constexpr bool is_expression() const noexcept { return (bits_ & kExpression) != 0; }
  // Released by the first C call that reads it (when that call returns), whatever the call does.
  constexpr bool released_by_first_read() const noexcept { return (bits_ & (kTemporary | kResult)) != 0; }
  // Over memory FTorch was given: `=` keeps that memory (see wrapping).
  constexpr bool is_wrapped() const noexcept { return (bits_ & kWrapped) != 0; }
  // A parameter (see parameter and bind_to_parameter).
  constexpr bool is_parameter() const noexcept { return (bits_ & kShared) != 0; }
  // An address into its memory or metadata was handed out (see expose).
  constexpr bool is_exposed() const noexcept { return (bits_ & kExposed) != 0; }
  // `left = right` with left constructed: whether left may refer to right's tensor instead of
  // receiving a copy of its values, as far as the states tell (the tensors' own checks follow:
  // math.cpp can_take_over). Only an expression's result is taken; never into wrapped memory, a
  // parameter, or memory whose address was handed out.
  static constexpr bool may_take_over(Lifetime left, Lifetime right) noexcept {
    return right.is_expression() && (left.bits_ & (kWrapped | kShared | kExposed)) == 0;
  }
  // `left = right` with left unconstructed (or stale): whether left takes right's tensor itself
  // (an expression's result, nothing else refers to it) rather than a copy.
  constexpr bool taken_by_unconstructed() const noexcept { return is_expression(); }
  // ... and the state left starts in: a function result when right was marked by torch_result
  // (released by its first read, on every compiler), else named.
  constexpr Lifetime adopted() const noexcept { return (bits_ & kMarkResult) != 0 ? Lifetime(kResult) : named(); }

  // ---------------------------------------------------------------- transitions

  // An optimizer was given this tensor as a parameter.
  constexpr void bind_to_parameter() noexcept { bits_ |= kShared; }
  // A pointer into its memory or metadata was handed out (a Fortran pointer from a no-copy view or
  // get_shape, a captured CUDA graph's input). True the first time (the caller registers the
  // memory then), false when it was exposed already.
  constexpr bool expose() noexcept {
    if (is_exposed()) return false;
    bits_ |= kExposed;
    return true;
  }
  // A custom function returned it as an output: from now on it is the caller's (neither its
  // first read nor the statement's end releases it); a torch_result mark stays.
  constexpr void become_function_output() noexcept { bits_ &= static_cast<uint8_t>(~(kTemporary | kFinalized)); }

  constexpr bool operator==(Lifetime other) const noexcept { return bits_ == other.bits_; }
  constexpr bool operator!=(Lifetime other) const noexcept { return bits_ != other.bits_; }

 private:
  enum : uint8_t {
    kTemporary = 1,   // FTC_TEMPORARY result: released by the first call that reads it
    kShared = 2,      // a parameter
    kFinalized = 4,   // FTC_TEMPORARY_FINALIZED result: the binding's finalizer deletes it
    kMarkResult = 8,  // torch_result(expr)
    kResult = 16,     // a user function's result (`r = torch_result(expr)`), released by its first read
    kExposed = 32,    // an address into it was handed out
    kWrapped = 64,    // over memory FTorch was given
  };
  static constexpr uint8_t kExpression = kTemporary | kFinalized | kResult;
  constexpr explicit Lifetime(uint8_t bits) noexcept : bits_(bits) {}
  uint8_t bits_;
};

}  // namespace ftc
