// Unit tests of the C++ core (GoogleTest): the handle tables, the exception boundary, catch
// scopes, the dtype mapping, the lifetime rules of `=` one transition at a time, and the checks of
// named options. Built with the library's own objects (FTORCH_UNIT_TESTS=ON) and run by
// tests/test_unit.py before the end-to-end suite.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "internal.hpp"
#include "compiled.hpp"  // after internal.hpp, which brings in LibTorch
#include "rng_state.hpp"
#include "saved_tensors.hpp"

#include <stdlib.h>
#include <unistd.h>

namespace {

// A tensor over a Fortran-like array (column-major, 1-D here), as torch_tensor_from_array makes.
ftc_tensor wrap(std::vector<double> &values) {
  ftc_tensor t = nullptr;
  const int64_t shape[] = {static_cast<int64_t>(values.size())};
  EXPECT_EQ(ftc_tensor_from_blob(&t, values.data(), 1, shape, nullptr, nullptr, FTC_FLOAT64, FTC_CPU, -1, 0), FTC_OK);
  return t;
}

std::vector<double> values_of(ftc_tensor t, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  const int64_t shape[] = {n};
  EXPECT_EQ(ftc_tensor_copy_to_blob(t, out.data(), FTC_FLOAT64, 1, shape), FTC_OK);
  return out;
}

std::string last_error() { return ftc_last_error(); }

}  // namespace

// ------------------------------------------------------------------------------ handle tables

TEST(HandleTable, AcquireFindRelease) {
  auto &table = ftc::HandleTable<int>::instance();
  const int64_t before = ftc::live_handle_count();
  void *h = table.acquire(42);
  ASSERT_NE(table.find(h), nullptr);
  EXPECT_EQ(table.find(h)->value, 42);
  EXPECT_EQ(ftc::live_handle_count(), before + 1);
  EXPECT_TRUE(table.release(h));
  EXPECT_EQ(table.find(h), nullptr) << "a released handle is stale";
  EXPECT_FALSE(table.release(h)) << "releasing twice does nothing";
  EXPECT_EQ(ftc::live_handle_count(), before);
}

TEST(HandleTable, AReusedSlotIsNotReachedThroughAnOldHandle) {
  auto &table = ftc::HandleTable<int>::instance();
  void *old = table.acquire(1);
  ASSERT_TRUE(table.release(old));
  void *reused = table.acquire(2);  // this thread's cache gives the slot back first
  EXPECT_EQ(reinterpret_cast<uintptr_t>(reused) & 0xfffffff, reinterpret_cast<uintptr_t>(old) & 0xfffffff);
  EXPECT_NE(reused, old) << "the generation differs";
  EXPECT_EQ(table.find(old), nullptr);
  ASSERT_NE(table.find(reused), nullptr);
  EXPECT_EQ(table.find(reused)->value, 2);
  table.release(reused);
}

TEST(HandleTable, ForeignValuesAreRejected) {
  auto &table = ftc::HandleTable<int>::instance();
  EXPECT_EQ(table.find(nullptr), nullptr);
  EXPECT_EQ(table.find(reinterpret_cast<void *>(0x12345678)), nullptr);
  EXPECT_EQ(table.find(reinterpret_cast<void *>(~uintptr_t{0})), nullptr);
}

TEST(HandleTable, AStampedCopyNamesTheSameSlot) {
  auto &table = ftc::HandleTable<int>::instance();
  void *h = table.acquire(7);
  auto *slot = table.find(h);
  ASSERT_NE(slot, nullptr);
  void *stamped = ftc::HandleTable<int>::restamp(h, *slot);
  EXPECT_NE(stamped, h);
  EXPECT_EQ(table.find(stamped), slot);
  EXPECT_EQ(ftc::HandleTable<int>::unstamped(stamped), ftc::HandleTable<int>::unstamped(h));
  EXPECT_EQ(ftc::HandleTable<int>::stamp_of(stamped), 1);
  table.release(h);
}

TEST(HandleTable, StampsTellApartCopiesUpTo255WritesOld) {
  auto &table = ftc::HandleTable<int>::instance();
  void *h = table.acquire(7);
  auto *slot = table.find(h);
  ASSERT_NE(slot, nullptr);
  void *current = h;
  for (int writes = 1; writes <= 256; ++writes) {
    current = ftc::HandleTable<int>::restamp(current, *slot);
    const bool same = ftc::HandleTable<int>::stamp_of(current) == ftc::HandleTable<int>::stamp_of(h);
    EXPECT_EQ(same, writes == 256) << "a copy " << writes << " writes old";
  }
  EXPECT_EQ(table.find(current), slot) << "the stamp never reaches the index bits";
  table.release(h);
}

// ------------------------------------------------------------------------------ the exception boundary

TEST(Guard, AnErrorBecomesItsStatusAndTheLastError) {
  EXPECT_EQ(ftc::guard([] { ftc::fail(FTC_ERR_DTYPE, "a reason"); }), FTC_ERR_DTYPE);
  EXPECT_EQ(last_error(), "a reason");
  EXPECT_EQ(ftc_last_error_length(), 8);
  EXPECT_EQ(ftc::guard([] {}), FTC_OK);
  EXPECT_EQ(last_error(), "") << "a call that succeeds clears the last error";
}

TEST(Guard, OutOfMemoryAndForeignExceptionsAreReported) {
  EXPECT_NE(ftc::guard([] { throw std::bad_alloc(); }), FTC_OK);
  EXPECT_EQ(last_error(), "out of memory");
  EXPECT_NE(ftc::guard([] { throw 3; }), FTC_OK);
  EXPECT_EQ(last_error(), "unknown C++ exception");
  EXPECT_EQ(ftc::guard([] { (void)at::ones({2}).view({3}); }), FTC_ERR_TORCH);
  EXPECT_EQ(last_error().find("Exception raised from"), std::string::npos) << "no C++ backtrace in messages";
}

// ------------------------------------------------------------------------------ catch scopes

TEST(CatchScopes, TheFirstFailureIsKept) {
  int status = -1;
  EXPECT_EQ(ftc_catch_end(&status), 0) << "no scope open";
  ASSERT_EQ(ftc_catch_begin(), FTC_OK);
  EXPECT_EQ(ftc_catch_record(FTC_ERR_IO, "first", 5), 1);
  EXPECT_EQ(ftc_catch_record(FTC_ERR_DTYPE, "second", 6), 1);
  EXPECT_EQ(ftc_catch_end(&status), 1);
  EXPECT_EQ(status, FTC_ERR_IO);
  EXPECT_EQ(last_error(), "first");
  EXPECT_EQ(ftc_catch_record(FTC_ERR_IO, "outside", 7), 0) << "no scope: the binding stops instead";
}

TEST(CatchScopes, ACallbackScopeIsABarrier) {
  int status = -1;
  ASSERT_EQ(ftc_catch_begin(), FTC_OK);        // the caller's scope
  ASSERT_EQ(ftc_callback_scope_begin(), FTC_OK);
  ASSERT_EQ(ftc_catch_begin(), FTC_OK);        // opened by the callback, never closed
  EXPECT_EQ(ftc_catch_end(&status), 1);
  EXPECT_EQ(ftc_catch_end(&status), 0) << "the callback cannot close its barrier";
  ASSERT_EQ(ftc_catch_begin(), FTC_OK);
  EXPECT_EQ(ftc_callback_scope_end(&status), 1);
  EXPECT_EQ(status, FTC_ERR_INVALID_ARGUMENT) << "a scope left open is the callback's failure";
  EXPECT_EQ(ftc_catch_end(&status), 1) << "the caller's scope is still there";
  EXPECT_EQ(status, FTC_OK);
}

// ------------------------------------------------------------------------------ dtypes

TEST(ThreadState, EveryScopeIsPerThreadInTheThreadsOneState) {
  ASSERT_EQ(ftc_catch_begin(), FTC_OK);
  ftc::ThreadState &mine = ftc::thread_state();
  EXPECT_EQ(mine.catch_scopes.size(), 1u);
  std::string said;
  std::thread other([&] {
    EXPECT_EQ(ftc::existing_thread_state(), nullptr) << "a thread's state is made by its first call";
    EXPECT_EQ(ftc_catch_record(FTC_ERR_SHAPE, "x", 1), 0) << "the main thread's scope is not this thread's";
    ASSERT_EQ(ftc_grad_scope_push(FTC_SCOPE_NO_GRAD), FTC_OK);
    EXPECT_FALSE(at::GradMode::is_enabled());
    ftc::ThreadState &ts = ftc::thread_state();
    EXPECT_NE(&ts, &mine);
    EXPECT_EQ(ts.grad_scopes.size(), 1u);
    EXPECT_TRUE(ts.catch_scopes.empty());
    ASSERT_EQ(ftc_catch_begin(), FTC_OK);
    EXPECT_EQ(ftc_catch_record(FTC_ERR_SHAPE, "kept by a scope never ended", 27), 1);
    testing::internal::CaptureStderr();
    // The thread ends with both scopes open: its state goes, and says what the catch scope kept.
  });
  other.join();
  said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("never ended"), std::string::npos) << said;
  EXPECT_NE(said.find("kept by a scope never ended"), std::string::npos) << said;
  EXPECT_TRUE(at::GradMode::is_enabled()) << "the other thread's no-grad scope was its own";
  EXPECT_EQ(mine.catch_scopes.size(), 1u);
  int status = -1;
  EXPECT_EQ(ftc_catch_end(&status), 1);
  EXPECT_EQ(status, FTC_OK);
  EXPECT_TRUE(mine.catch_scopes.empty());
}

TEST(Dtypes, OneMappingBothWays) {
  for (int code : {FTC_INT8, FTC_INT16, FTC_INT32, FTC_INT64, FTC_FLOAT32, FTC_FLOAT64}) {
    EXPECT_EQ(ftc::dtype_code(ftc::scalar_type(code)), code);
  }
  EXPECT_EQ(ftc::dtype_code(c10::ScalarType::Bool), FTC_BOOL);
  EXPECT_EQ(ftc::dtype_code(c10::ScalarType::BFloat16), FTC_BFLOAT16);
  EXPECT_EQ(ftc::dtype_code(c10::ScalarType::Byte), FTC_UINT8);
  EXPECT_EQ(ftc::guard([] { ftc::dtype_code(c10::ScalarType::ComplexFloat); }), FTC_ERR_DTYPE);
  EXPECT_NE(last_error().find("ComplexFloat"), std::string::npos);
  EXPECT_EQ(ftc::guard([] { ftc::scalar_type(FTC_BOOL); }), FTC_ERR_DTYPE) << "no Fortran array is bool";
  EXPECT_EQ(ftc::guard([] { ftc::scalar_type(99); }), FTC_ERR_DTYPE);
}

// ------------------------------------------------------------------------------ lifetime of `=`

TEST(Assign, IntoAWrappedArrayWritesTheArray) {
  std::vector<double> a{1, 2, 3}, b{4, 5, 6};
  ftc_tensor ta = wrap(a), tb = wrap(b);
  ftc_tensor before = ta;
  ASSERT_EQ(ftc_tensor_assign(&ta, tb), FTC_OK);
  EXPECT_EQ(a, (std::vector<double>{4, 5, 6}));
  EXPECT_EQ(ftc::HandleTable<int>::unstamped(ta), ftc::HandleTable<int>::unstamped(before)) << "same tensor";
  b[0] = 9;
  EXPECT_EQ(a[0], 4) << "a copy of the values, not of the memory";
  ftc_tensor_delete(&ta);
  ftc_tensor_delete(&tb);
}

TEST(Assign, AnUnconstructedLeftHandSideTakesACopyOfANamedTensor) {
  std::vector<double> b{1, 2};
  ftc_tensor tb = wrap(b), lhs = nullptr;
  const int64_t before = ftc_live_handles();
  ASSERT_EQ(ftc_tensor_assign(&lhs, tb), FTC_OK);
  ASSERT_NE(lhs, nullptr);
  EXPECT_EQ(ftc_live_handles(), before + 1);
  b[1] = 7;
  EXPECT_EQ(values_of(lhs, 2), (std::vector<double>{1, 2})) << "its own memory";
  ftc_tensor_delete(&lhs);
  ftc_tensor_delete(&tb);
}

TEST(Assign, AnUnconstructedLeftHandSideTakesATemporaryOver) {
  std::vector<double> a{1, 2};
  ftc_tensor ta = wrap(a), tmp = nullptr, lhs = nullptr;
  ASSERT_EQ(ftc_tensor_binary(FTC_ADD, ta, ta, FTC_TEMPORARY, &tmp), FTC_OK);
  const int64_t before = ftc_live_handles();
  ASSERT_EQ(ftc_tensor_assign(&lhs, tmp), FTC_OK);
  EXPECT_EQ(ftc_live_handles(), before) << "taken over, no new handle";
  EXPECT_EQ(values_of(lhs, 2), (std::vector<double>{2, 4}));
  int rank = 0;
  EXPECT_EQ(ftc_tensor_rank(lhs, &rank), FTC_OK) << "no longer a temporary";
  EXPECT_EQ(ftc_tensor_rank(lhs, &rank), FTC_OK);
  ftc_tensor_delete(&lhs);
  ftc_tensor_delete(&ta);
}

TEST(Assign, AnUnconstructedRightHandSide) {
  ftc_tensor none = nullptr;
  EXPECT_EQ(ftc_tensor_assign(&none, nullptr), FTC_OK) << "unconstructed = unconstructed: nothing";
  EXPECT_EQ(none, nullptr);
  std::vector<double> a{1};
  ftc_tensor lhs = wrap(a), before = lhs;
  EXPECT_EQ(ftc_tensor_assign(&lhs, nullptr), FTC_ERR_NULL_HANDLE) << "a constructed tensor keeps its value";
  EXPECT_EQ(lhs, before);
  EXPECT_NE(last_error().find("not constructed"), std::string::npos);
  ftc_tensor_delete(&lhs);
}

TEST(Assign, ACopyTakenBeforeAWriteIsRefusedAsARightHandSide) {
  std::vector<double> a{1, 2}, b{3, 4}, c{0, 0};
  ftc_tensor ta = wrap(a), tb = wrap(b), tc = wrap(c);
  ftc_tensor old_copy = ta;  // what gfortran <= 12 reads an overlapping array section through
  ASSERT_EQ(ftc_tensor_assign_element(&ta, tb), FTC_OK);
  EXPECT_NE(ta, old_copy) << "a new write stamp";
  EXPECT_EQ(ftc_tensor_assign_element(&tc, old_copy), FTC_ERR_NULL_HANDLE);
  EXPECT_EQ(c, (std::vector<double>{0, 0})) << "nothing written";
  EXPECT_EQ(ftc_tensor_assign_element(&tc, ta), FTC_OK);
  EXPECT_EQ(c, (std::vector<double>{3, 4}));
  int rank = 0;
  EXPECT_EQ(ftc_tensor_rank(old_copy, &rank), FTC_OK) << "elsewhere the copy still names the tensor";
  for (ftc_tensor *t : {&ta, &tb, &tc}) ftc_tensor_delete(t);
}

TEST(Lifetime, ATemporaryIsReleasedByTheFirstCallThatReadsIt) {
  std::vector<double> a{1, 2};
  ftc_tensor ta = wrap(a), tmp = nullptr;
  const int64_t before = ftc_live_handles();
  ASSERT_EQ(ftc_tensor_unary(FTC_NEG, ta, FTC_TEMPORARY, &tmp), FTC_OK);
  EXPECT_EQ(ftc_live_handles(), before + 1);
  int rank = 0;
  EXPECT_EQ(ftc_tensor_rank(tmp, &rank), FTC_OK);
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(ftc_live_handles(), before);
  EXPECT_EQ(ftc_tensor_rank(tmp, &rank), FTC_ERR_NULL_HANDLE) << "stale after its one read";
  ftc_tensor_delete(&ta);
}

TEST(Lifetime, DeletingMakesEveryCopyStaleAndDeletingAgainIsHarmless) {
  std::vector<double> a{1};
  ftc_tensor t = wrap(a), copy = t;
  ASSERT_EQ(ftc_tensor_delete(&t), FTC_OK);
  EXPECT_EQ(t, nullptr);
  int rank = 0;
  EXPECT_EQ(ftc_tensor_rank(copy, &rank), FTC_ERR_NULL_HANDLE);
  EXPECT_NE(last_error().find("stale"), std::string::npos) << last_error();
  EXPECT_EQ(ftc_tensor_delete(&copy), FTC_OK);
  ftc_tensor_release(copy);  // a finalizer's release of a stale value: nothing
}

// ------------------------------------------------------------------------------ the Lifetime state machine
// One test per state a handle starts in and per transition (lifetime.hpp): first the states and
// rules alone, then what the C entry points do with a handle in that state.

namespace {
using ftc::Lifetime;

Lifetime life_of(ftc_tensor h) {
  auto *slot = ftc::TensorTable::instance().find(h);
  EXPECT_NE(slot, nullptr);
  return slot != nullptr ? slot->life : Lifetime::named();
}

const void *data_of(ftc_tensor h) { return ftc::TensorTable::instance().find(h)->value.const_data_ptr(); }

// A result of kind `kind` (FTC_NAMED, FTC_TEMPORARY, FTC_TEMPORARY_FINALIZED): -x.
ftc_tensor result_of(ftc_tensor x, int kind) {
  ftc_tensor r = nullptr;
  EXPECT_EQ(ftc_tensor_unary(FTC_NEG, x, kind, &r), FTC_OK);
  return r;
}

// A tensor of LibTorch's own memory (a constructor's), which `=` may take an expression over into.
ftc_tensor owned(int64_t n) {
  ftc_tensor t = nullptr;
  const int64_t shape[] = {n};
  EXPECT_EQ(ftc_tensor_new(&t, FTC_FILL_ZEROS, 1, shape, FTC_FLOAT64, FTC_CPU, -1, 0), FTC_OK);
  return t;
}
}  // namespace

TEST(LifetimeStates, EachResultKindStartsInItsOwnState) {
  static_assert(Lifetime::of_result(FTC_NAMED) == Lifetime::named());
  static_assert(!Lifetime::of_result(99).has_value());
  constexpr Lifetime temporary = *Lifetime::of_result(FTC_TEMPORARY);
  constexpr Lifetime finalized = *Lifetime::of_result(FTC_TEMPORARY_FINALIZED);
  static_assert(temporary.is_expression() && temporary.released_by_first_read());
  static_assert(finalized.is_expression() && !finalized.released_by_first_read());
  static_assert(!Lifetime::named().is_expression() && !Lifetime::named().released_by_first_read());
  static_assert(Lifetime::wrapping().is_wrapped() && !Lifetime::wrapping().is_expression());
  static_assert(Lifetime::parameter().is_parameter() && !Lifetime::parameter().is_expression());
  static_assert(Lifetime() == Lifetime::named());
  std::vector<double> a{1, 2};
  ftc_tensor x = wrap(a);
  EXPECT_EQ(life_of(x), Lifetime::wrapping());
  for (int kind : {FTC_NAMED, FTC_TEMPORARY, FTC_TEMPORARY_FINALIZED}) {
    ftc_tensor r = result_of(x, kind);
    EXPECT_EQ(life_of(r), *Lifetime::of_result(kind)) << "kind " << kind;
    ftc_tensor_delete(&r);
  }
  ftc_tensor r = nullptr;
  EXPECT_EQ(ftc_tensor_unary(FTC_NEG, x, 99, &r), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(r, nullptr);
  ftc_tensor_delete(&x);
}

TEST(LifetimeStates, AFinalizedResultIsLeftAloneByItsReadersUntilTheFinalizerDeletesIt) {
  std::vector<double> a{1, 2};
  ftc_tensor x = wrap(a);
  ftc_tensor r = result_of(x, FTC_TEMPORARY_FINALIZED);
  const int64_t live = ftc_live_handles();
  int rank = 0;
  EXPECT_EQ(ftc_tensor_rank(r, &rank), FTC_OK);
  EXPECT_EQ(ftc_tensor_rank(r, &rank), FTC_OK) << "read twice: a finalized result is not released by reading";
  EXPECT_EQ(ftc_live_handles(), live);
  ftc_tensor_release(r);  // the binding's finalizer at the end of the statement
  EXPECT_EQ(ftc_live_handles(), live - 1);
  ftc_tensor_delete(&x);
}

TEST(LifetimeStates, TorchResultMakesTheVariableThatTakesItOverAResult) {
  constexpr Lifetime marked = Lifetime::of_result(FTC_TEMPORARY)->marked_as_result();
  static_assert(marked.is_expression() && marked.taken_by_unconstructed());
  static_assert(marked.adopted().released_by_first_read() && marked.adopted().is_expression());
  static_assert(Lifetime::of_result(FTC_TEMPORARY)->adopted() == Lifetime::named());
  static_assert(Lifetime::wrapping().adopted() == Lifetime::named());
  std::vector<double> a{1, 2};
  ftc_tensor x = wrap(a);
  ftc_tensor marked_handle = nullptr, r = nullptr;
  ASSERT_EQ(ftc_tensor_mark_result(result_of(x, FTC_TEMPORARY), FTC_TEMPORARY_FINALIZED, &marked_handle), FTC_OK);
  EXPECT_EQ(life_of(marked_handle), Lifetime::of_result(FTC_TEMPORARY_FINALIZED)->marked_as_result());
  ASSERT_EQ(ftc_tensor_assign(&r, marked_handle), FTC_OK);  // `r = torch_result(-x)` in a user function
  EXPECT_TRUE(life_of(r).released_by_first_read());
  ftc_tensor_release(marked_handle);                        // its finalizer
  const int64_t live = ftc_live_handles();
  int rank = 0;
  EXPECT_EQ(ftc_tensor_rank(r, &rank), FTC_OK);             // the caller reads the function's result
  EXPECT_EQ(ftc_live_handles(), live - 1) << "a function result is released by its first read";
  ftc_tensor_delete(&x);
}

TEST(LifetimeStates, OnlyAnExpressionIsTakenOverAndNeverIntoWrappedParameterOrExposedMemory) {
  const Lifetime temporary = *Lifetime::of_result(FTC_TEMPORARY);
  const Lifetime finalized = *Lifetime::of_result(FTC_TEMPORARY_FINALIZED);
  Lifetime exposed;
  EXPECT_TRUE(exposed.expose());
  for (Lifetime right : {temporary, finalized, temporary.marked_as_result()}) {
    EXPECT_TRUE(Lifetime::may_take_over(Lifetime::named(), right));
    for (Lifetime left : {Lifetime::wrapping(), Lifetime::parameter(), exposed}) {
      EXPECT_FALSE(Lifetime::may_take_over(left, right));
    }
  }
  for (Lifetime right : {Lifetime::named(), Lifetime::wrapping(), Lifetime::parameter(), exposed}) {
    EXPECT_FALSE(Lifetime::may_take_over(Lifetime::named(), right));
    EXPECT_FALSE(right.taken_by_unconstructed());
  }
  // Through `=`: an owned left-hand side takes the expression's memory; a wrapped one keeps its own.
  std::vector<double> a{1, 2}, b{0, 0};
  ftc_tensor x = wrap(a), w = wrap(b), l = owned(2);
  ftc_tensor r = result_of(x, FTC_TEMPORARY_FINALIZED);
  const void *memory = data_of(r);
  ASSERT_EQ(ftc_tensor_assign(&l, r), FTC_OK);
  EXPECT_EQ(data_of(l), memory) << "taken over";
  ftc_tensor_release(r);
  r = result_of(x, FTC_TEMPORARY_FINALIZED);
  ASSERT_EQ(ftc_tensor_assign(&w, r), FTC_OK);
  EXPECT_EQ(data_of(w), static_cast<const void *>(b.data())) << "a wrapped array keeps its memory";
  EXPECT_EQ(b, (std::vector<double>{-1, -2}));
  ftc_tensor_release(r);
  // An unconstructed left-hand side takes an expression's tensor itself, a named one's a copy.
  ftc_tensor u = nullptr, v = nullptr;
  r = result_of(x, FTC_TEMPORARY_FINALIZED);
  memory = data_of(r);
  ASSERT_EQ(ftc_tensor_assign(&u, r), FTC_OK);
  EXPECT_EQ(data_of(u), memory);
  ftc_tensor_release(r);
  ASSERT_EQ(ftc_tensor_assign(&v, x), FTC_OK);
  EXPECT_NE(data_of(v), static_cast<const void *>(a.data())) << "a copy of a named tensor";
  EXPECT_EQ(life_of(v), Lifetime::named());
  for (ftc_tensor *t : {&x, &w, &l, &u, &v}) ftc_tensor_delete(t);
}

TEST(LifetimeStates, ExposingHappensOnceAndStopsTakeOver) {
  Lifetime life;
  EXPECT_TRUE(life.expose());
  EXPECT_FALSE(life.expose()) << "the second time: registered already";
  EXPECT_TRUE(life.is_exposed());
  std::vector<double> a{1, 2};
  ftc_tensor x = wrap(a), l = owned(2);
  const int64_t *sizes = nullptr;
  int ndims = 0;
  ASSERT_EQ(ftc_tensor_shape(l, &sizes, &ndims), FTC_OK);  // a pointer into its metadata handed out
  EXPECT_TRUE(life_of(l).is_exposed());
  const void *memory = data_of(l);
  ftc_tensor r = result_of(x, FTC_TEMPORARY_FINALIZED);
  ASSERT_EQ(ftc_tensor_assign(&l, r), FTC_OK);
  EXPECT_EQ(data_of(l), memory) << "an exposed tensor is written, never replaced";
  EXPECT_EQ(values_of(l, 2), (std::vector<double>{-1, -2}));
  ftc_tensor_release(r);
  r = result_of(x, FTC_TEMPORARY);
  EXPECT_EQ(ftc_tensor_shape(r, &sizes, &ndims), FTC_ERR_INVALID_ARGUMENT) << "an expression is never exposed";
  EXPECT_NE(last_error().find("dangle"), std::string::npos) << last_error();
  for (ftc_tensor *t : {&x, &l}) ftc_tensor_delete(t);
}

TEST(LifetimeStates, BindingToAnOptimizerMakesAParameter) {
  Lifetime life;
  life.bind_to_parameter();
  EXPECT_EQ(life, Lifetime::parameter());
  EXPECT_FALSE(Lifetime::may_take_over(life, *Lifetime::of_result(FTC_TEMPORARY)));
  ftc_tensor p = owned(2);
  const ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  ftc_optim o = nullptr;
  ASSERT_EQ(ftc_optim_sgd(&o, &p, 1, &sgd), FTC_OK);
  EXPECT_TRUE(life_of(p).is_parameter());
  const void *memory = data_of(p);
  std::vector<double> a{1, 2};
  ftc_tensor x = wrap(a);
  ftc_tensor r = result_of(x, FTC_TEMPORARY_FINALIZED);
  ASSERT_EQ(ftc_tensor_assign(&p, r), FTC_OK);
  EXPECT_EQ(data_of(p), memory) << "a parameter is written in place: it stays the optimizer's leaf";
  ftc_tensor_release(r);
  ftc_optim_delete(&o);
  for (ftc_tensor *t : {&x, &p}) ftc_tensor_delete(t);
}

TEST(LifetimeStates, AFunctionOutputIsTheCallersFromThenOn) {
  for (int kind : {FTC_TEMPORARY, FTC_TEMPORARY_FINALIZED}) {
    Lifetime life = *Lifetime::of_result(kind);
    life.become_function_output();
    EXPECT_EQ(life, Lifetime::named()) << "kind " << kind;
    Lifetime marked = Lifetime::of_result(kind)->marked_as_result();
    marked.become_function_output();
    EXPECT_FALSE(marked.is_expression());
    EXPECT_TRUE(marked.adopted().released_by_first_read()) << "the torch_result mark stays";
  }
}

// `out = loss(x, y)` (reduction none, else mean) into `out`: the grad_fn names how the history went
// (the loss's own node, or a recorded copy's).
std::string loss_into(ftc_tensor x, ftc_tensor y, ftc_tensor *out, int reduction = FTC_REDUCTION_NONE) {
  ftc_loss_options options = FTC_LOSS_OPTIONS_DEFAULTS;
  options.reduction = reduction;
  EXPECT_EQ(ftc_loss(FTC_LOSS_MSE, x, y, nullptr, nullptr, &options, out), FTC_OK) << last_error();
  const at::Tensor &t = ftc::TensorTable::instance().find(*out)->value;
  return t.grad_fn() ? t.grad_fn()->name() : "";
}

std::vector<double> gradient_of(ftc_tensor x) {
  ftc_tensor g = nullptr;
  EXPECT_EQ(ftc_tensor_get_gradient(x, &g), FTC_OK) << last_error();
  auto values = values_of(g, 2);
  ftc_tensor_delete(&g);
  EXPECT_EQ(ftc_tensor_zero_grad(x), FTC_OK);
  return values;
}

TEST(Assign, AResultWithHistoryContinuesItsGraphInTheLeftHandSideWithoutARecordedCopy) {
  std::vector<double> a{1, 2}, b{0.5, 0.5}, o{0, 0}, s{0};
  ftc_tensor x = wrap(a), y = wrap(b), out = wrap(o), own = owned(2), scalar = wrap(s);
  ASSERT_EQ(ftc_tensor_set_requires_grad(x, 1), FTC_OK);
  // A Fortran array receives the values and stays where it is; the tensor over it takes the
  // loss's own place in the graph (no CopyBackwards).
  EXPECT_EQ(loss_into(x, y, &out), "MseLossBackward0");
  EXPECT_EQ(data_of(out), static_cast<const void *>(o.data()));
  EXPECT_EQ(o, (std::vector<double>{0.25, 2.25}));
  EXPECT_EQ(life_of(out), Lifetime::wrapping());
  const int64_t two[] = {2};
  ftc_tensor ones = nullptr;
  ASSERT_EQ(ftc_tensor_new(&ones, FTC_FILL_ONES, 1, two, FTC_FLOAT64, FTC_CPU, -1, 0), FTC_OK);
  ASSERT_EQ(ftc_tensor_backward(out, ones, 0), FTC_OK) << last_error();
  EXPECT_EQ(gradient_of(x), (std::vector<double>{1, 3})) << "2 (x - y)";
  // The array is the loss's value, not the graph's: what Fortran writes there changes no gradient.
  EXPECT_EQ(loss_into(x, y, &out), "MseLossBackward0");
  o = {100, 100};
  EXPECT_EQ(values_of(out, 2), (std::vector<double>{100, 100}));
  ASSERT_EQ(ftc_tensor_backward(out, ones, 0), FTC_OK) << last_error();
  EXPECT_EQ(gradient_of(x), (std::vector<double>{1, 3}));
  // A 0-d loss into a one-element array: the gradient is summed down to the loss's shape.
  EXPECT_EQ(loss_into(x, y, &scalar, FTC_REDUCTION_MEAN), "MseLossBackward0");
  EXPECT_EQ(s[0], 1.25);
  ASSERT_EQ(ftc_tensor_backward(scalar, nullptr, 0), FTC_OK) << last_error();
  EXPECT_EQ(gradient_of(x), (std::vector<double>{0.5, 1.5})) << "(x - y) for the mean of two";
  // LibTorch's own memory: the same.
  EXPECT_EQ(loss_into(x, y, &own), "MseLossBackward0");
  EXPECT_EQ(values_of(own, 2), (std::vector<double>{0.25, 2.25}));
  // Another dtype or shape than the result's, or a leaf (its edge is its gradient accumulator):
  // the copy is recorded, and converts the gradient as PyTorch's does.
  ftc_tensor one = nullptr, copy = nullptr;
  const int64_t single[] = {1};
  ASSERT_EQ(ftc_tensor_new(&one, FTC_FILL_ZEROS, 1, single, FTC_FLOAT32, FTC_CPU, -1, 0), FTC_OK);
  EXPECT_EQ(loss_into(x, y, &one, FTC_REDUCTION_MEAN), "torch::autograd::CopyBackwards");
  ASSERT_EQ(ftc_tensor_backward(one, nullptr, 0), FTC_OK) << last_error();
  EXPECT_EQ(gradient_of(x), (std::vector<double>{0.5, 1.5}));
  copy = owned(2);
  ASSERT_EQ(ftc_tensor_assign(&copy, x), FTC_OK);
  const at::Tensor &c = ftc::TensorTable::instance().find(copy)->value;
  ASSERT_NE(c.grad_fn(), nullptr);
  EXPECT_EQ(c.grad_fn()->name(), "torch::autograd::CopyBackwards") << "x is a leaf";
  // A named tensor with history: `=` gives a tensor of its own, over its own memory, in the graph.
  ftc_tensor named = nullptr;
  std::vector<double> p{0, 0};
  ftc_tensor w = wrap(p);
  loss_into(x, y, &named);  // a new handle (unconstructed out)
  ASSERT_EQ(ftc_tensor_assign(&w, named), FTC_OK);
  EXPECT_EQ(data_of(w), static_cast<const void *>(p.data()));
  EXPECT_NE(data_of(w), data_of(named));
  EXPECT_EQ(p, (std::vector<double>{0.25, 2.25}));
  for (ftc_tensor *t : {&x, &y, &out, &own, &scalar, &ones, &one, &copy, &named, &w}) ftc_tensor_delete(t);
}

TEST(Assign, ASmallCopyIsOneMemmoveThatStillBumpsTheVersion) {
  std::vector<double> a{1, 2}, b{3, 4};
  ftc_tensor ta = wrap(a), tb = wrap(b);
  const auto version = [](ftc_tensor t) { return ftc::TensorTable::instance().find(t)->value._version(); };
  const auto before = version(ta);
  ASSERT_EQ(ftc_tensor_assign(&ta, tb), FTC_OK);
  EXPECT_EQ(a, b);
  EXPECT_EQ(data_of(ta), static_cast<const void *>(a.data()));
  EXPECT_EQ(version(ta), before + 1) << "as copy_ counts an in-place write";
  // A leaf that a graph saved, then written: backward reports it, as PyTorch does.
  std::vector<double> xv{1, 2};
  ftc_tensor x = wrap(xv), y = nullptr;
  ASSERT_EQ(ftc_tensor_set_requires_grad(x, 1), FTC_OK);
  ASSERT_EQ(ftc_tensor_binary(FTC_MUL, x, x, FTC_NAMED, &y), FTC_OK);
  ASSERT_EQ(ftc_tensor_assign(&x, tb), FTC_OK);
  const int64_t two[] = {2};
  ftc_tensor ones = nullptr;
  ASSERT_EQ(ftc_tensor_new(&ones, FTC_FILL_ONES, 1, two, FTC_FLOAT64, FTC_CPU, -1, 0), FTC_OK);
  EXPECT_NE(ftc_tensor_backward(y, ones, 0), FTC_OK);
  EXPECT_NE(last_error().find("inplace"), std::string::npos) << last_error();
  // Other layouts take copy_: a row-major result into a column-major (Fortran) array of 2 x 3.
  std::vector<double> f(6, 0);
  const int64_t shape[] = {2, 3};
  ftc_tensor tf = nullptr, rows = nullptr;
  ASSERT_EQ(ftc_tensor_from_blob(&tf, f.data(), 2, shape, nullptr, nullptr, FTC_FLOAT64, FTC_CPU, -1, 0), FTC_OK);
  ASSERT_EQ(ftc_tensor_new(&rows, FTC_FILL_ONES, 2, shape, FTC_FLOAT64, FTC_CPU, -1, 0), FTC_OK);
  at::Tensor &r = ftc::TensorTable::instance().find(rows)->value;
  r.copy_(at::arange(6, r.options()).view({2, 3}));  // element (i, j) = 3 i + j
  ASSERT_EQ(ftc_tensor_assign(&tf, rows), FTC_OK);
  EXPECT_EQ(f, (std::vector<double>{0, 3, 1, 4, 2, 5})) << "column-major order";
  for (ftc_tensor *t : {&ta, &tb, &x, &y, &ones, &tf, &rows}) ftc_tensor_delete(t);
}

// ------------------------------------------------------------------------------ named options

TEST(Options, DefaultsAreTorchs) {
  const ftc_adamw_options adamw = FTC_ADAMW_OPTIONS_DEFAULTS;
  EXPECT_EQ(adamw.weight_decay, 1e-2);
  const ftc_adam_options adam = FTC_ADAM_OPTIONS_DEFAULTS;
  EXPECT_EQ(adam.weight_decay, 0.0);
  EXPECT_EQ(adam.beta2, 0.999);
  const ftc_linear_lr_options linear = FTC_LINEAR_LR_OPTIONS_DEFAULTS;
  EXPECT_EQ(linear.start_factor, 1.0 / 3.0);
  const ftc_loss_options loss = FTC_LOSS_OPTIONS_DEFAULTS;
  EXPECT_EQ(loss.ignore_index, -100);
  EXPECT_EQ(loss.reduction, FTC_REDUCTION_MEAN);
}

TEST(Options, BadOrMissingOptionsAreErrors) {
  ftc_tensor p = nullptr;
  const int64_t shape[] = {3};
  ASSERT_EQ(ftc_tensor_new(&p, FTC_FILL_ZEROS, 1, shape, FTC_FLOAT64, FTC_CPU, -1, 1), FTC_OK);
  ftc_optim o = nullptr;
  EXPECT_EQ(ftc_optim_adam(&o, &p, 1, nullptr), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("options"), std::string::npos);
  ftc_adam_options adam = FTC_ADAM_OPTIONS_DEFAULTS;
  adam.beta1 = 1.0;
  EXPECT_EQ(ftc_optim_adam(&o, &p, 1, &adam), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("betas"), std::string::npos);
  EXPECT_EQ(o, nullptr);
  ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  sgd.nesterov = 1;  // without momentum
  EXPECT_EQ(ftc_optim_sgd(&o, &p, 1, &sgd), FTC_ERR_INVALID_ARGUMENT);
  sgd.momentum = 0.9;
  ASSERT_EQ(ftc_optim_sgd(&o, &p, 1, &sgd), FTC_OK);
  ftc_scheduler s = nullptr;
  const ftc_step_lr_options step = FTC_STEP_LR_OPTIONS_DEFAULTS;  // step_size left unset
  EXPECT_EQ(ftc_scheduler_step_lr(&s, o, &step), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("step_size"), std::string::npos);
  ftc_plateau_options plateau = FTC_PLATEAU_OPTIONS_DEFAULTS;
  plateau.factor = 1.5;
  EXPECT_EQ(ftc_scheduler_reduce_on_plateau(&s, o, &plateau), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  ftc_tensor loss = nullptr;
  EXPECT_EQ(ftc_loss(FTC_LOSS_MSE, p, p, nullptr, nullptr, nullptr, &loss), FTC_ERR_INVALID_ARGUMENT);
  ftc_loss_options huber = FTC_LOSS_OPTIONS_DEFAULTS;
  huber.delta = 0;
  EXPECT_EQ(ftc_loss(FTC_LOSS_HUBER, p, p, nullptr, nullptr, &huber, &loss), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("delta"), std::string::npos);
  ftc_optim_delete(&o);
  ftc_tensor_delete(&p);
}

TEST(Optimizers, TheTrainTimeWindowIsPerOptimizer) {
  ftc_tensor p = nullptr;
  const int64_t shape[] = {2};
  ASSERT_EQ(ftc_tensor_new(&p, FTC_FILL_ZEROS, 1, shape, FTC_FLOAT64, FTC_CPU, -1, 1), FTC_OK);
  const ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  ftc_optim a = nullptr, b = nullptr;
  ASSERT_EQ(ftc_optim_sgd(&a, &p, 1, &sgd), FTC_OK);
  ASSERT_EQ(ftc_optim_sgd(&b, &p, 1, &sgd), FTC_OK);
  ftc::optim_of(a).window_steps = 3;  // as three train steps of `a` leave it
  ftc::optim_of(a).window_seconds = 0.5;
  int64_t steps = -1;
  double seconds = -1;
  ASSERT_EQ(ftc_optim_train_time(b, 0, &steps, &seconds), FTC_OK);
  EXPECT_EQ(steps, 0) << "another optimizer's steps are not counted";
  ASSERT_EQ(ftc_optim_train_time(a, 1, &steps, &seconds), FTC_OK);
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(seconds, 0.5);
  ASSERT_EQ(ftc_optim_train_time(a, 0, &steps, &seconds), FTC_OK);
  EXPECT_EQ(steps, 0) << "reset by the reading before";
  EXPECT_EQ(ftc_optim_train_time(a, 0, nullptr, &seconds), FTC_ERR_INVALID_ARGUMENT);
  ftc_optim_delete(&a);
  ftc_optim_delete(&b);
  ftc_tensor_delete(&p);
}

// ------------------------------------------------------------------------------ .pt2 input rules

TEST(InputRules, DtypesAreNamedAsTorchNamesThem) {
  const auto rules = ftc::parse_rules("v1;float64[batch:1:-1,5];bfloat16[3];bool[2,2];complex64[1];uint8[4]");
  ASSERT_TRUE(rules.has_value());
  ASSERT_EQ(rules->size(), 5u);
  EXPECT_EQ((*rules)[0].dtype, c10::kDouble);
  EXPECT_EQ((*rules)[0].dims[0].name, "batch");
  EXPECT_EQ((*rules)[0].dims[0].hi, -1);
  EXPECT_EQ((*rules)[1].dtype, c10::kBFloat16);
  EXPECT_EQ((*rules)[2].dtype, c10::kBool);
  EXPECT_EQ((*rules)[3].dtype, c10::kComplexFloat);
  EXPECT_EQ((*rules)[4].dtype, c10::kByte);
}

TEST(InputRules, WhatIsNotARuleIsRefused) {
  EXPECT_FALSE(ftc::parse_rules("v1;double[3]").has_value()) << "a legacy name is not torch's dtype name";
  EXPECT_FALSE(ftc::parse_rules("v1;float6[3]").has_value());
  EXPECT_FALSE(ftc::parse_rules("v2;float64[3]").has_value());
  EXPECT_FALSE(ftc::parse_rules("v1;float64[batch:4:2]").has_value());
}

// ------------------------------------------------------------------------------ checkpoints

TEST(Checkpoint, ResumingRestoresTheRandomGenerators) {
  const std::string file = testing::TempDir() + "ftorch_unit_rng.ckpt";
  ASSERT_EQ(ftc_manual_seed(7), FTC_OK);
  (void)at::rand({3});
  ASSERT_EQ(ftc_checkpoint_save(file.c_str(), nullptr, nullptr, nullptr, 4), FTC_OK) << last_error();
  const at::Tensor next = at::rand({5});  // what an uninterrupted run draws next (dropout masks, noise)
  ASSERT_EQ(ftc_manual_seed(99), FTC_OK);
  (void)at::rand({2});
  int64_t step = 0;
  ASSERT_EQ(ftc_checkpoint_load(file.c_str(), nullptr, nullptr, nullptr, &step), FTC_OK) << last_error();
  EXPECT_EQ(step, 4);
  EXPECT_TRUE(at::equal(at::rand({5}), next)) << "the draws after the load are those after the save";
  std::remove(file.c_str());
}

TEST(Checkpoint, ASchedulerIsCheckpointedWithItsOwnOptimizer) {
  const std::string file = testing::TempDir() + "ftorch_unit_sched.ckpt";
  ftc_tensor p = owned(2), q = owned(2);
  const ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  ftc_optim a = nullptr, b = nullptr;
  ASSERT_EQ(ftc_optim_sgd(&a, &p, 1, &sgd), FTC_OK);
  ASSERT_EQ(ftc_optim_sgd(&b, &q, 1, &sgd), FTC_OK);
  ftc_scheduler sa = nullptr;
  ASSERT_EQ(ftc_scheduler_exponential_lr(&sa, a, 0.5), FTC_OK);
  EXPECT_EQ(ftc_checkpoint_save(file.c_str(), nullptr, b, sa, 1), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("the scheduler drives another optimizer"), std::string::npos) << last_error();
  ASSERT_EQ(ftc_checkpoint_save(file.c_str(), nullptr, a, sa, 1), FTC_OK) << last_error();
  EXPECT_EQ(ftc_checkpoint_load(file.c_str(), nullptr, b, sa, nullptr), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("the scheduler drives another optimizer"), std::string::npos) << last_error();
  EXPECT_EQ(ftc_checkpoint_load(file.c_str(), nullptr, a, sa, nullptr), FTC_OK) << last_error();
  // Without its optimizer: the schedule would resume from whatever rate the optimizer has now.
  EXPECT_EQ(ftc_checkpoint_load(file.c_str(), nullptr, nullptr, sa, nullptr), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("pass that optimizer too"), std::string::npos) << last_error();
  EXPECT_EQ(ftc_checkpoint_save(file.c_str(), nullptr, nullptr, sa, 1), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("pass that optimizer too"), std::string::npos) << last_error();
  ftc_scheduler_delete(&sa);
  ftc_optim_delete(&a);
  ftc_optim_delete(&b);
  ftc_tensor_delete(&p);
  ftc_tensor_delete(&q);
  std::remove(file.c_str());
}

TEST(Checkpoint, ADamagedRandomStateIsAnError) {
  const auto status_of = [](auto &&body) -> int {
    try {
      body();
    } catch (const ftc::Error &e) {
      return e.status();
    }
    return FTC_OK;
  };
  EXPECT_EQ(status_of([] { ftc::rng_from_bytes(ftc::bytes_tensor("not an archive"), "f.ckpt"); }), FTC_ERR_IO);
  ftc::RngStates s = ftc::rng_states();
  s.cpu = s.cpu.slice(0, 0, 16).clone();
  EXPECT_EQ(status_of([&] { ftc::check_rng_states(s, "f.ckpt"); }), FTC_ERR_IO);
  s = ftc::rng_states();
  EXPECT_EQ(status_of([&] { ftc::rng_from_bytes(ftc::bytes_tensor(ftc::rng_bytes(s)), "f.ckpt"); }), FTC_OK);
}

TEST(Schedulers, APlateauScheduleLeavesTheInitialRateToLaterSchedules) {
  // PyTorch: ReduceLROnPlateau does not set a group's initial_lr, so a CosineAnnealingLR made
  // after a plateau phase starts from the rate the plateau reached.
  ftc_tensor p = owned(2);
  const ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  ftc_optim o = nullptr;
  ASSERT_EQ(ftc_optim_sgd(&o, &p, 1, &sgd), FTC_OK);
  ASSERT_EQ(ftc_optim_set_lr(o, 0.1), FTC_OK);
  ftc_scheduler plateau = nullptr, cosine = nullptr;
  const ftc_plateau_options po = FTC_PLATEAU_OPTIONS_DEFAULTS;
  ASSERT_EQ(ftc_scheduler_reduce_on_plateau(&plateau, o, &po), FTC_OK) << last_error();
  ASSERT_EQ(ftc_optim_set_lr(o, 0.01), FTC_OK);  // (where the plateau phase left it)
  ftc_cosine_lr_options co = FTC_COSINE_LR_OPTIONS_DEFAULTS;
  co.t_max = 10;
  ASSERT_EQ(ftc_scheduler_cosine_annealing_lr(&cosine, o, &co), FTC_OK) << last_error();
  EXPECT_EQ(ftc::scheduler_of(cosine).base_lr, 0.01);
  ftc_scheduler_delete(&cosine);
  ftc_scheduler_delete(&plateau);
  ftc_optim_delete(&o);
  ftc_tensor_delete(&p);
}

TEST(Checkpoint, AScheduleResumesOnlyWithItsOwnSettings) {
  const std::string file = testing::TempDir() + "ftorch_unit_settings.ckpt";
  ftc_tensor p = owned(2);
  const ftc_sgd_options sgd = FTC_SGD_OPTIONS_DEFAULTS;
  ftc_optim o = nullptr;
  ASSERT_EQ(ftc_optim_sgd(&o, &p, 1, &sgd), FTC_OK);
  ftc_cosine_lr_options co = FTC_COSINE_LR_OPTIONS_DEFAULTS;
  co.t_max = 100;
  ftc_scheduler saved = nullptr, other = nullptr, same = nullptr;
  ASSERT_EQ(ftc_scheduler_cosine_annealing_lr(&saved, o, &co), FTC_OK) << last_error();
  ASSERT_EQ(ftc_checkpoint_save(file.c_str(), nullptr, o, saved, 1), FTC_OK) << last_error();
  co.t_max = 200;
  ASSERT_EQ(ftc_scheduler_cosine_annealing_lr(&other, o, &co), FTC_OK) << last_error();
  EXPECT_EQ(ftc_checkpoint_load(file.c_str(), nullptr, o, other, nullptr), FTC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("T_max = 100, the one given to resume into 200"), std::string::npos) << last_error();
  co.t_max = 100;
  ASSERT_EQ(ftc_scheduler_cosine_annealing_lr(&same, o, &co), FTC_OK) << last_error();
  EXPECT_EQ(ftc_checkpoint_load(file.c_str(), nullptr, o, same, nullptr), FTC_OK) << last_error();
  for (ftc_scheduler *s : {&saved, &other, &same}) ftc_scheduler_delete(s);
  ftc_optim_delete(&o);
  ftc_tensor_delete(&p);
  std::remove(file.c_str());
}

namespace {
// The collectives of a communicator of one process (rank 0 of 1): nothing to exchange.
int one_allreduce(int64_t, void *, int64_t, int, int, char *, int64_t) { return 0; }
int one_broadcast(int64_t, void *, int64_t, int, int, char *, int64_t) { return 0; }
int one_allgather(int64_t, const void *send, void *recv, int64_t count, int dtype, char *, int64_t) {
  const size_t size = dtype == FTC_INT64 || dtype == FTC_FLOAT64 ? 8 : (dtype == FTC_UINT8 || dtype == FTC_INT8 ? 1 : 4);
  std::memcpy(recv, send, static_cast<size_t>(count) * size);
  return 0;
}
int one_barrier(int64_t, char *, int64_t) { return 0; }
}  // namespace

TEST(Checkpoint, RanksRestoreTheirOwnRandomGenerators) {
  const std::string file = testing::TempDir() + "ftorch_unit_comm_rng.ckpt";
  ftc_comm comm = nullptr;
  ASSERT_EQ(ftc_comm_new(&comm, 0, 0, 1, 0, one_allreduce, one_broadcast, one_allgather, one_barrier, nullptr,
                         nullptr, nullptr),
            FTC_OK)
      << last_error();
  ASSERT_EQ(ftc_manual_seed(11), FTC_OK);
  ASSERT_EQ(ftc_comm_checkpoint_save(comm, file.c_str(), nullptr, nullptr, nullptr, 2), FTC_OK) << last_error();
  const at::Tensor next = at::rand({4});
  ASSERT_EQ(ftc_manual_seed(12), FTC_OK);
  int64_t step = 0;
  ASSERT_EQ(ftc_comm_checkpoint_load(comm, file.c_str(), nullptr, nullptr, nullptr, &step), FTC_OK) << last_error();
  EXPECT_EQ(step, 2);
  EXPECT_TRUE(at::equal(at::rand({4}), next)) << "rank 0 of 1 draws on as after the save";
  // A single process's checkpoint resumes one rank too (the same layout).
  ASSERT_EQ(ftc_checkpoint_save(file.c_str(), nullptr, nullptr, nullptr, 3), FTC_OK) << last_error();
  const at::Tensor after = at::rand({4});
  ASSERT_EQ(ftc_comm_checkpoint_load(comm, file.c_str(), nullptr, nullptr, nullptr, &step), FTC_OK) << last_error();
  EXPECT_TRUE(at::equal(at::rand({4}), after));
  ftc_comm_delete(&comm);
  std::remove(file.c_str());
}

namespace {
// Two ranks played by one process: ctx 0 is rank 0, whose allgather receives rank 1's part from
// `rank1_parts` (one per call, in order); ctx 1 is rank 1, whose allgather sees every rank send
// what it sends (the ranks agree).
std::vector<std::vector<int64_t>> rank1_parts;
size_t rank1_next = 0;
int two_allgather(int64_t ctx, const void *send, void *recv, int64_t count, int dtype, char *, int64_t) {
  if (dtype != FTC_INT64) return 1;
  auto *out = static_cast<int64_t *>(recv);
  std::memcpy(out, send, static_cast<size_t>(count) * 8);
  if (ctx == 0) {
    if (rank1_next >= rank1_parts.size() || rank1_parts[rank1_next].size() != static_cast<size_t>(count)) return 1;
    std::memcpy(out + count, rank1_parts[rank1_next++].data(), static_cast<size_t>(count) * 8);
  } else {
    std::memcpy(out + count, send, static_cast<size_t>(count) * 8);
  }
  return 0;
}
}  // namespace

TEST(Checkpoint, EachRankRestoresItsOwnGenerators) {
  const std::string file = testing::TempDir() + "ftorch_unit_two_ranks.ckpt";
  // Rank 1's generators: those after seed 55.
  ASSERT_EQ(ftc_manual_seed(55), FTC_OK);
  const std::string theirs = ftc::rng_bytes(ftc::rng_states());
  const at::Tensor their_draws = at::rand({4});
  std::vector<int64_t> padded((theirs.size() + 7) / 8, 0);
  std::memcpy(padded.data(), theirs.data(), theirs.size());
  rank1_parts = {{FTC_OK, static_cast<int64_t>(theirs.size())}, padded};
  rank1_next = 0;
  ftc_comm rank0 = nullptr, rank1 = nullptr;
  ASSERT_EQ(ftc_comm_new(&rank0, 0, 0, 2, 0, one_allreduce, one_broadcast, two_allgather, one_barrier, nullptr,
                         nullptr, nullptr),
            FTC_OK);
  ASSERT_EQ(ftc_comm_new(&rank1, 1, 1, 2, 0, one_allreduce, one_broadcast, two_allgather, one_barrier, nullptr,
                         nullptr, nullptr),
            FTC_OK);
  ASSERT_EQ(ftc_manual_seed(7), FTC_OK);
  ASSERT_EQ(ftc_comm_checkpoint_save(rank0, file.c_str(), nullptr, nullptr, nullptr, 1), FTC_OK) << last_error();
  EXPECT_EQ(rank1_next, 2u) << "the lengths, then the states";
  const at::Tensor my_draws = at::rand({4});
  // Rank 1 resumes on its own generators, not rank 0's.
  ASSERT_EQ(ftc_comm_checkpoint_load(rank1, file.c_str(), nullptr, nullptr, nullptr, nullptr), FTC_OK) << last_error();
  EXPECT_TRUE(at::equal(at::rand({4}), their_draws));
  EXPECT_FALSE(at::equal(their_draws, my_draws));
  // Rank 0 on its own (rank 1 agreeing: its status, step and digest, of no tensors; then applied).
  rank1_parts = {{FTC_OK, 1, static_cast<int64_t>(std::hash<std::string>{}(std::string()))}, {FTC_OK}};
  rank1_next = 0;
  ASSERT_EQ(ftc_comm_checkpoint_load(rank0, file.c_str(), nullptr, nullptr, nullptr, nullptr), FTC_OK) << last_error();
  EXPECT_EQ(rank1_next, 2u);
  EXPECT_TRUE(at::equal(at::rand({4}), my_draws));
  ftc_comm_delete(&rank0);
  ftc_comm_delete(&rank1);
  std::remove(file.c_str());
}

// File offload writes only files it created itself: ranks on several hosts (or in containers, where
// process ids repeat) may share the directory. Files named as another process with this process id
// once named its files are left as they are, and the saved tensor comes back bitwise.
TEST(SavedTensorFiles, NeverWriteAnotherProcesssFiles) {
  char dir_template[] = "/tmp/ftorch-unit-offload-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const auto foreign = [&](int k) {
    return dir + "/ftorch-saved-" + std::to_string(::getpid()) + "-" + std::to_string(k) + ".bin";
  };
  const auto read = [](const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  for (int k = 0; k < 256; ++k) std::ofstream(foreign(k), std::ios::binary) << "another process's tensor " << k;
  const int64_t files_before = ftc_saved_tensors_files();
  ASSERT_EQ(ftc_saved_tensors_hooks_push(FTC_PACK_FILES, dir.c_str(), static_cast<int64_t>(dir.size()), 0, nullptr,
                                         nullptr, nullptr, nullptr),
            FTC_OK)
      << last_error();
  const at::Tensor t = at::arange(1000, at::kDouble);
  std::vector<std::unique_ptr<torch::autograd::SavedVariableHooks>> hooks;
  for (int i = 0; i < 4; ++i) {
    hooks.push_back(ftc::saved_tensor_hooks_for(t));
    ASSERT_TRUE(hooks.back());
    hooks.back()->call_pack_hook(t);
  }
  ASSERT_EQ(ftc_saved_tensors_hooks_pop(), FTC_OK);
  EXPECT_EQ(ftc_saved_tensors_files(), files_before + 4);
  for (auto &h : hooks) EXPECT_TRUE(at::equal(h->call_unpack_hook(), t));
  hooks.clear();
  EXPECT_EQ(ftc_saved_tensors_files(), files_before);
  for (int k = 0; k < 256; ++k) {
    EXPECT_EQ(read(foreign(k)), "another process's tensor " + std::to_string(k)) << foreign(k);
    std::remove(foreign(k).c_str());
  }
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "the offload's own files were all removed";
}
