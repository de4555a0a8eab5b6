!> Value semantics of `=` and handle lifetime as a user meets them (issue 20), run with every
!> supported compiler (gfortran 11 to 14, flang 19 and 22): overlapping array assignment, argument
!> lists that keep seeing their arrays, user functions returning tensors, arrays of user types,
!> unbalanced catch scopes in callbacks, temporaries rejected before reaching C, gradcheck's
!> restore, allow_unused zeros; and (one per process, --<form>) the forms of = that allocate their
!> left-hand side, whose outcome differs by compiler.
module lifetime_helpers
  use, intrinsic :: iso_c_binding, only: c_associated, c_int64_t
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none
  private
  public :: state_t, owning_t, tendency, leaky_hook, grad_fails, tendency_plain, set_from, bundle_t, &
            doubled_plain, doubled, ignores, mixed_t, assign_whole, assign_components, refill
  type :: state_t
    type(torch_tensor) :: t
  end type state_t
  !> A type whose tensor wraps its own allocatable array.
  type :: owning_t
    real(real64), allocatable :: a(:)
    type(torch_tensor) :: t
  end type owning_t
  !> A type with an allocatable component and a tensor component.
  type :: mixed_t
    real(real64), allocatable :: a(:)
    type(torch_tensor) :: t
  end type mixed_t
  !> A type with an allocatable array of tensors.
  type :: bundle_t
    type(torch_tensor), allocatable :: ts(:)
  end type bundle_t
contains

  !> An impure elemental function returning a tensor, without and with torch_result.
  impure elemental function doubled_plain(x) result(r)
    type(torch_tensor), intent(in) :: x
    type(torch_tensor) :: r
    r = x * 2d0
  end function doubled_plain

  impure elemental function doubled(x) result(r)
    type(torch_tensor), intent(in) :: x
    type(torch_tensor) :: r
    r = torch_result(x * 2d0)
  end function doubled

  !> `dst = src` where dst is a dummy argument, and the safe form the guide gives for gfortran 11/12.
  subroutine assign_whole(dst, src)
    type(mixed_t), intent(inout) :: dst
    type(mixed_t), intent(in) :: src
    dst = src
  end subroutine assign_whole

  subroutine assign_components(dst, src)
    type(mixed_t), intent(inout) :: dst
    type(mixed_t), intent(in) :: src
    dst%a = src%a
    dst%t = src%t
  end subroutine assign_components

  !> An intent(out) array of tensors, constructed anew; `entered` tells whether the elements arrived
  !> constructed.
  subroutine refill(ts, entered)
    type(torch_tensor), intent(out) :: ts(:)
    logical, intent(out) :: entered
    integer :: i
    entered = c_associated(ts(1)%p)
    do i = 1, size(ts)
      call torch_tensor_zeros(ts(i), 1, [1_c_int64_t], torch_kFloat64, torch_kCPU)
    end do
  end subroutine refill

  !> A procedure that never reads its tensor argument.
  subroutine ignores(x)
    type(torch_tensor), intent(in) :: x
    if (.false.) print *, c_associated(x%p)
  end subroutine ignores

  !> `=` into the component of an INTENT(OUT) dummy (finalized and default-initialized on entry).
  subroutine set_from(s, x)
    type(state_t), intent(out) :: s
    type(torch_tensor), intent(in) :: x
    s%t = x
  end subroutine set_from

  !> The idiom the guide recommends (docs/guide/tensors.md) for a function returning a tensor.
  function tendency(u) result(r)
    type(torch_tensor), intent(in) :: u
    type(torch_tensor) :: r
    r = torch_result(-0.5d0 * u)
  end function tendency

  !> The same without the marker: leaks one handle per call where the compiler does not
  !> finalize function results (gfortran <= 12); counted, not asserted, by the test.
  function tendency_plain(u) result(r)
    type(torch_tensor), intent(in) :: u
    type(torch_tensor) :: r
    r = -0.5d0 * u
  end function tendency_plain

  !> A hook that opens a catch scope and never ends it.
  subroutine leaky_hook(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call torch_catch_begin()
    if (.false.) new_grad = grad
    if (stat /= 0) errmsg = ""
  end subroutine leaky_hook

  !> A function that fails on its second call, the first with a perturbed input (gradcheck must
  !> still restore that input).
  subroutine grad_fails(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    integer, save :: calls = 0
    calls = calls + 1
    outputs(1) = inputs(1) * 2.0d0
    if (calls >= 2) then
      stat = 3
      errmsg = "deliberate failure"
    end if
  end subroutine grad_fails
end module lifetime_helpers

!> The allocating forms of `=` in a scope that imports the type but not `assignment(=)`.
module only_type_scope
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch, only: torch_tensor, torch_tensor_from_array, torch_kCPU, torch_delete, torch_catch_begin, &
                    torch_catch_end
  implicit none
  private
  public :: grow_history, copy_into_unallocated, shift_sections
contains
  include "allocating_forms.inc"
end module only_type_scope

program test_lifetime
  use, intrinsic :: iso_c_binding, only: c_int64_t, c_associated
  use, intrinsic :: iso_fortran_env, only: int32, int64, real64
  use ftorch
  use lifetime_helpers
  use only_type_scope, only: grow_history_only_type => grow_history, &
                             copy_into_unallocated_only_type => copy_into_unallocated, &
                             shift_sections_only_type => shift_sections
  use testing, only: check, check_close, summary
  implicit none
  integer(c_int64_t) :: base
  character(len=64) :: arg

  if (command_argument_count() > 0) then
    ! One form per process: some of them end in error stop on some compilers.
    call get_command_argument(1, arg)
    select case (trim(arg))
    case ("--plain-function-results")
      call plain_function_results()
    case ("--growing-steps")
      call steps_of_a_loop("keep")
    case ("--flat-steps")
      call steps_of_a_loop("overwrite")
    case ("--plain-function-results-with-steps")
      call steps_of_a_loop("plain function")
    case ("--constructor-of-user-types")
      call allocating_user_arrays("constructor")
    case ("--copy-user-array-into-unallocated")
      call allocating_user_arrays("copy")
    case ("--constructor-into-allocated")
      call allocating_user_arrays("constructor into allocated")
    case ("--structure-constructor")
      call structure_constructor_copy()
    case ("--leak-patterns")
      call leak_patterns()
    case ("--assignment-to-a-dummy")
      call assignment_to_a_dummy()
    case ("--self-assignment-of-a-type")
      call self_assignment_of_a_type()
    case ("--intent-out-array")
      call intent_out_array()
    case ("--unended-catch-scope")
      call unended_catch_scope()
    case ("--shift-sections-only-type")
      call shift_sections_only_type()
    case ("--shift-user-types")
      call shift_user_types()
    case ("--grow-history")
      call grow_history()
    case ("--grow-history-only-type")
      call grow_history_only_type()
    case ("--copy-into-unallocated")
      call copy_into_unallocated()
    case ("--copy-into-unallocated-only-type")
      call copy_into_unallocated_only_type()
    case ("--torch-assign-other-shape")
      call torch_assign_other_shape()
    case ("--assign-into-view-of-leaf")
      call assign_into_view_of_leaf()
    case default
      error stop "unknown argument"
    end select
    call summary()
    stop
  end if
  base = ftorch_live_handles()
  call overlapping_sections()
  call whole_array_copies()
  call arrays_of_user_types()
  call function_results()
  call arglist_sees_later_writes()
  call catch_scope_in_callback()
  call rejected_arguments_release_temporaries()
  call gradcheck_restores_input()
  call allow_unused_gives_zeros()
  call check(ftorch_live_handles() == base, "no handle left alive at the end")
  call summary()
contains

  !> torch_assign between arrays of tensors of one size and different shapes: stops with an
  !> error (nothing pairs a(2,3) with b(3,2)), never an assignment in array element order.
  subroutine torch_assign_other_shape()
    type(torch_tensor) :: a(2, 3), b(3, 2)
    real(real64), target :: x(1)
    integer :: i, j
    x = 1
    do j = 1, 2
      do i = 1, 3
        call torch_tensor_from_array(b(i, j), x, torch_kCPU)
      end do
    end do
    call torch_assign(a, b)
    print '(a)', "assigned"
  end subroutine torch_assign_other_shape

  ! `=` into a view of a leaf that requires grad: refused (PyTorch refuses the in-place write),
  ! never the leaf overwritten behind autograd.
  subroutine assign_into_view_of_leaf()
    type(torch_tensor) :: x0, v
    real(real64), target :: x(6)
    x = 1
    call torch_tensor_from_array(x0, x, torch_kCPU, requires_grad=.true.)
    v = torch_reshape(x0, [2, 3])
    v = 7d0
    print '(a)', "assigned"
  end subroutine assign_into_view_of_leaf

  ! Whether this compiler finalizes the left-hand side of an intrinsic assignment of a derived type,
  ! as Fortran says: flang, gfortran from 13; not gfortran 11 and 12.
  logical function finalizes_assignment()
    use, intrinsic :: iso_fortran_env, only: compiler_version
    character(len=:), allocatable :: v
    integer :: k, major, ios
    v = compiler_version()
    k = index(v, "GCC version ")
    finalizes_assignment = .true.
    if (k == 0) return
    read(v(k + 12:k + 13), '(i2)', iostat=ios) major
    if (ios == 0) finalizes_assignment = major >= 13
  end function finalizes_assignment

  ! The value a one-element tensor holds ("stale" or "none" where it cannot be read).
  function held(t) result(text)
    type(torch_tensor), intent(in) :: t
    character(len=8) :: text
    real(real64) :: one(1)
    integer :: stat
    if (.not. c_associated(t%p)) then
      text = "none"
      return
    end if
    call torch_tensor_to_array(t, one, stat=stat)
    if (stat /= 0) then
      text = "stale"
    else
      write(text, '(f0.0)') one(1)
    end if
  end function held

  function values_of(ts) result(v)
    type(torch_tensor), intent(in) :: ts(:)
    real(real64) :: v(size(ts)), one(1)
    integer :: i
    do i = 1, size(ts)
      call torch_tensor_to_array(ts(i), one)
      v(i) = one(1)
    end do
  end function values_of

  subroutine make(ts, mem)
    type(torch_tensor), intent(inout) :: ts(:)
    real(real64), intent(inout), target :: mem(1, size(ts))
    integer :: i
    do i = 1, size(ts)
      mem(1, i) = real(i, real64)
      call torch_tensor_from_array(ts(i), mem(:, i), torch_kCPU)
    end do
  end subroutine make

  ! Fortran semantics: the right-hand side is evaluated before any element is assigned. With
  ! torch_assign on every compiler; with `=` where the compiler resolves it to the array procedure
  ! (flang). gfortran <= 12 prefers the type-bound elemental `=`, element by element from a bitwise
  ! copy of the right-hand side's handles: the write stamps make an element read from a copy taken
  ! before an earlier element wrote that tensor an error (it would have read the new values), as
  ! docs/guide/tensors.md documents.
  subroutine overlapping_sections()
    use, intrinsic :: iso_fortran_env, only: compiler_version
    type(torch_tensor) :: ts(3), t2(2, 2)
    real(real64), target :: mem(1, 3), mem2(1, 4)
    logical :: elementwise
    integer :: i, stat
    character(len=400) :: errmsg
    elementwise = index(compiler_version(), "GCC") > 0
    call make(ts, mem)
    call torch_assign(ts(2:3), ts(1:2))
    call check(all(values_of(ts) == [1d0, 1d0, 2d0]), "torch_assign(ts(2:3), ts(1:2)) shifts forward [1,1,2]")
    call check(all(mem(1, :) == [1d0, 1d0, 2d0]), "... into the wrapped arrays")
    call make(ts, mem)
    call torch_assign(ts, ts(3:1:-1))
    call check(all(values_of(ts) == [3d0, 2d0, 1d0]), "torch_assign(ts, ts(3:1:-1)) reverses [3,2,1]")
    call torch_assign(ts, ts(3:1:-1))
    call check(all(values_of(ts) == [1d0, 2d0, 3d0]), "torch_assign twice (stamped handles written back) [1,2,3]")
    call make(ts, mem)
    errmsg = ""
    call torch_catch_begin()
    ts(2:3) = ts(1:2)
    call torch_catch_end(stat, errmsg)
    if (elementwise) then
      call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(errmsg, "stale copy") > 0 .and. &
                 index(errmsg, "torch_assign") > 0, "gfortran: ts(2:3) = ts(1:2) is refused, naming torch_assign")
      call check(all(values_of(ts) == [1d0, 1d0, 3d0]), "... after the first element, never with the new values")
    else
      call check(stat == 0 .and. all(values_of(ts) == [1d0, 1d0, 2d0]), "ts(2:3) = ts(1:2) shifts forward [1,1,2]")
    end if
    call make(ts, mem)
    ts(1:2) = ts(2:3)
    call check(all(values_of(ts) == [2d0, 3d0, 3d0]), "ts(1:2) = ts(2:3) shifts back [2,3,3]")
    ts(3) = ts(1)
    ts(1) = ts(3)
    call check(all(values_of(ts) == [2d0, 3d0, 2d0]), "scalar = between stamped handles")
    call make(ts, mem)
    call torch_catch_begin()
    ts = ts(3:1:-1)
    call torch_catch_end(stat, errmsg)
    if (elementwise) then
      call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(errmsg, "torch_assign") > 0, &
                 "gfortran: ts = ts(3:1:-1) is refused, naming torch_assign")
    else
      call check(stat == 0 .and. all(values_of(ts) == [3d0, 2d0, 1d0]), "ts = ts(3:1:-1) reverses [3,2,1]")
    end if
    do i = 1, 4
      mem2(1, i) = real(i, real64)
      call torch_tensor_from_array(t2(mod(i - 1, 2) + 1, (i - 1) / 2 + 1), mem2(:, i), torch_kCPU)
    end do
    call torch_assign(t2, transpose(t2))
    call check(all(mem2(1, :) == [1d0, 3d0, 2d0, 4d0]), "torch_assign(t2, transpose(t2)) on a rank-2 array")
    call torch_delete(ts)
    call torch_delete(t2)
  end subroutine overlapping_sections

  ! `ts2 = ts1` copies values; no handle is shared.
  subroutine whole_array_copies()
    type(torch_tensor) :: ts(3), copies(3)
    real(real64), target :: mem(1, 3)
    integer(c_int64_t) :: before
    call make(ts, mem)
    before = ftorch_live_handles()
    copies = ts
    call check(ftorch_live_handles() == before + 3, "copies = ts makes three new tensors")
    mem(1, 1) = 42
    call check(all(values_of(copies) == [1d0, 2d0, 3d0]), "the copies own their values")
    call torch_delete(ts)
    call check(all(values_of(copies) == [1d0, 2d0, 3d0]), "the copies survive deleting the originals")
    call torch_delete(copies)
  end subroutine whole_array_copies

  ! Components of user types: `=` of the derived type applies the tensor's `=` to the component
  ! (fixed-size arrays, and allocatable ones already allocated with the same shape).
  subroutine arrays_of_user_types()
    type(state_t) :: s1, s2, pair(2), pair2(2), w
    type(state_t), allocatable :: arr(:), arr2(:)
    type(owning_t), target :: o1, o2
    real(real64), target :: a(1), b(1), wv(1)
    real(real64) :: pair_values(2)
    integer(c_int64_t) :: before
    integer :: stat, i
    a = 1
    b = 2
    call torch_tensor_from_array(s1%t, a, torch_kCPU)
    call torch_tensor_from_array(s2%t, b, torch_kCPU)
    before = ftorch_live_handles()
    pair(1) = s1
    pair(2) = s2
    pair2 = pair
    call check(ftorch_live_handles() == before + 4, "component copies make new tensors")
    call torch_delete(pair(1)%t)
    call torch_delete(pair(2)%t)
    call check(all(values_of([pair2(1)%t, pair2(2)%t]) == [1d0, 2d0]), "copied components keep their values")
    call check(torch_tensor_get_rank(s1%t, stat=stat) == 1 .and. stat == 0, "the originals are still live")
    call torch_delete(pair2(1)%t)
    call torch_delete(pair2(2)%t)
    ! `w = s1` for a type whose component wraps an array: gfortran 11 and 12 apply the component's
    ! `=`, which writes into the array; flang first finalizes `w`, as Fortran says, which deletes
    ! that tensor, and the component's `=` then makes a new one (the array is no longer written).
    wv = 0
    call torch_tensor_from_array(w%t, wv, torch_kCPU)
    before = ftorch_live_handles()
    w = s1
    call check(all(values_of([w%t]) == [1d0]), "w = s1 gives w%t the values of s1%t")
    if (finalizes_assignment()) then
      call check(all(wv == [0d0]), "... in a new tensor (flang finalizes w first): the array is not written")
    else
      call check(all(wv == [1d0]), "... written into the array w%t wraps (gfortran <= 12: no finalization)")
    end if
    call check(ftorch_live_handles() == before, "... and no tensor is left behind")
    ! An INTENT(OUT) dummy is undefined on entry: every compiler finalizes it (deleting the
    ! tensor) and default-initializes its component (an unconstructed tensor), so `=` into it makes
    ! a new tensor and the caller's array is not written.
    call torch_delete(w%t)
    wv = 0
    call torch_tensor_from_array(w%t, wv, torch_kCPU)
    before = ftorch_live_handles()
    call set_from(w, s2%t)
    call check(all(values_of([w%t]) == [2d0]) .and. all(wv == [0d0]), &
               "= into the component of an INTENT(OUT) dummy makes a new tensor")
    call check(ftorch_live_handles() == before, "... and none is left behind")
    call torch_delete(w%t)
    ! A type whose tensor wraps its own allocatable component: `o2 = o1` gives o2%a a new
    ! allocation, and o2%t a new tensor with o1's values (every compiler: no compiler applies the
    ! tensor's `=` into the old o2%a); writes through o2%t no longer reach o2%a.
    allocate(o1%a(2), o2%a(2))
    o1%a = [1d0, 2d0]
    o2%a = 0
    call torch_tensor_from_array(o1%t, o1%a, torch_kCPU)
    call torch_tensor_from_array(o2%t, o2%a, torch_kCPU)
    before = ftorch_live_handles()
    o2 = o1
    call torch_tensor_to_array(o2%t, pair_values)
    call check(all(o2%a == [1d0, 2d0]) .and. all(pair_values == [1d0, 2d0]), "o2 = o1 copies the array and the values")
    o2%t = 3d0 * o1%t
    call torch_tensor_to_array(o2%t, pair_values)
    call check(all(pair_values == [3d0, 6d0]) .and. all(o2%a == [1d0, 2d0]), &
               "... and o2%t is a tensor of its own, no longer over o2%a")
    call check(ftorch_live_handles() == before, "... with no tensor left behind")
    call torch_delete(o1%t)
    call torch_delete(o2%t)
    ! The same with allocatable arrays, both allocated with the same shape.
    allocate(arr(2), arr2(2))
    arr(1) = s1
    arr(2) = s2
    before = ftorch_live_handles()
    arr2 = arr
    call check(ftorch_live_handles() == before + 2, "allocated arr2 = arr copies the components")
    arr2(1)%t = 10d0 * arr2(1)%t
    call check(all(values_of([arr(1)%t, arr2(1)%t, s1%t]) == [1d0, 10d0, 1d0]), "... which are independent")
    do i = 1, 2
      call torch_delete(arr(i)%t)
      call torch_delete(arr2(i)%t)
    end do
    call torch_delete(s1%t)
    call torch_delete(s2%t)
  end subroutine arrays_of_user_types

  ! u = u + 0.01 * tendency(u): no handle grows over 1000 steps with the recommended form.
  subroutine function_results()
    integer(c_int64_t) :: leaked
    leaked = time_loop(.true.)
    call check(leaked == 0, "r = torch_result(...) in a function: no handle leaks")
  end subroutine function_results

  ! 1000 steps of u = u + 0.01 * f(u), f returning -0.5 u with torch_result (marked) or without;
  ! returns how many handles the loop left alive.
  integer(c_int64_t) function time_loop(marked) result(leaked)
    logical, intent(in) :: marked
    type(torch_tensor) :: u
    real(real64), target :: uv(4)
    integer(c_int64_t) :: before
    integer :: i
    uv = 1
    call torch_tensor_from_array(u, uv, torch_kCPU)
    before = ftorch_live_handles()
    do i = 1, 1000
      if (marked) then
        u = u + 0.01d0 * tendency(u)
      else
        u = u + 0.01d0 * tendency_plain(u)
      end if
    end do
    leaked = ftorch_live_handles() - before
    ! Each step rounds three times (the product by 0.01 and the sum; -0.5 u is exact), so 1000
    ! steps stay within ~3e-13 relative of 0.995**1000 on any CPU (elementwise IEEE operations).
    call check_close(uv, [(0.995d0**1000, i = 1, 4)], 1d-12, "... and the values are right")
    if (marked) then
      u = tendency(u)
      call check(ftorch_live_handles() == before, "assigning a function result: no handle leaks")
    end if
    call torch_tensor_delete(u)
  end function time_loop

  ! An argument list refers to the named tensors added to it (what `torch_model_forward(m, args)`
  ! and Python calls receive); expressions are added by value.
  subroutine arglist_sees_later_writes()
    type(torch_arglist) :: list
    type(torch_tensor) :: t, got
    real(real64), target :: a(3), v(3)
    integer :: stat
    a = [1d0, 2d0, 3d0]
    call torch_tensor_from_array(t, a, torch_kCPU)
    call torch_arglist_add(list, t)
    call torch_arglist_add(list, t * 10d0)
    t = t * 2d0
    call torch_arglist_get(list, 1, got)
    call torch_tensor_to_array(got, v)
    call check(all(v == [2d0, 4d0, 6d0]), "the list sees t = t * 2")
    a(1) = 100
    call torch_arglist_get(list, 1, got)
    call torch_tensor_to_array(got, v)
    call check(all(v == [100d0, 4d0, 6d0]), "... and writes to the wrapped array")
    t = 0
    call torch_arglist_get(list, 1, got)
    call torch_tensor_to_array(got, v)
    call check(all(v == 0), "... and t = 0")
    call torch_arglist_get(list, 2, got)
    call torch_tensor_to_array(got, v)
    call check(all(v == [10d0, 20d0, 30d0]), "an expression added is a value of its own")
    a = [7d0, 8d0, 9d0]
    call torch_tensor_delete(t)
    call torch_arglist_get(list, 1, got, stat=stat)
    call torch_tensor_to_array(got, v)
    call check(stat == 0 .and. all(v == [7d0, 8d0, 9d0]), &
               "after deleting the tensor the list keeps it (still over the wrapped array)")
    call torch_tensor_delete(got)
    call torch_arglist_delete(list)
  end subroutine arglist_sees_later_writes

  ! A hook that leaves a catch scope open: the scope ends with the hook, and later failures
  ! without stat still stop or are caught as usual (here: caught by our own scope).
  subroutine catch_scope_in_callback()
    type(torch_tensor) :: x, y, loss, bad
    real(real64), target :: xv(6)
    integer :: stat
    character(len=256) :: msg
    xv = 1
    call torch_tensor_from_array(x, xv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_register_hook(x, leaky_hook)
    y = x * 2d0
    loss = torch_sum(y)
    call torch_tensor_backward(loss, stat=stat, errmsg=msg)
    call check(stat /= 0, "a hook leaving a catch scope open fails the backward")
    call check(index(msg, "catch scope") > 0, "... naming the open catch scope: " // trim(msg))
    call torch_catch_begin()
    bad = torch_reshape(x, [7])
    call torch_catch_end(stat, msg)
    call check(stat /= 0, "after it, a failure without stat is still reported (innermost scope)")
    call torch_catch_end(stat)
    call check(stat /= 0, "and no scope is left open on this thread")
    call torch_delete(x)
    call torch_delete(y)
    call torch_delete(loss)
    call torch_delete(bad)
  end subroutine catch_scope_in_callback

  ! Arguments rejected by the Fortran layer before any C call still release their temporaries.
  subroutine rejected_arguments_release_temporaries()
    type(torch_tensor) :: x, grads(2)
    type(torch_function) :: undefined
    type(torch_tensor) :: outs(1)
    type(torch_arglist) :: list
    real(real64), target :: xv(3)
    real(real64) :: gv(3)
    integer(c_int64_t) :: before
    integer :: i, stat
    integer(int32) :: small
    xv = 1
    call torch_tensor_from_array(x, xv, torch_kCPU, requires_grad=.true.)
    before = ftorch_live_handles()
    do i = 1, 100
      call torch_autograd_grad(grads, [torch_sum(x * 2d0)], [x], stat=stat)
      call torch_function_apply(undefined, [x * 2d0], outs, stat=stat)
    end do
    call check(stat /= 0, "the rejected calls fail")
    call check(ftorch_live_handles() == before, "... and release the temporaries they were given")
    ! Accepted calls too: expressions inside array constructors, nested ones included (gfortran 13
    ! and 14 finalize no function result there).
    do i = 1, 100
      call torch_autograd_grad(grads(1:1), [torch_sum(x * 2d0)], [x])
    end do
    call torch_tensor_to_array(grads(1), gv)
    call check(ftorch_live_handles() == before + 1 .and. all(gv == 2d0), &
               "expressions in array constructors of accepted calls are released")
    call torch_delete(grads)
    ! A failure found by the Fortran layer itself (no C call involved) also becomes the thread's
    ! last error, as every failure does.
    call torch_arglist_add(list, 2_int64**40)
    call torch_arglist_get(list, 1, small, stat=stat)
    call check(stat /= 0 .and. index(ftorch_last_error(), "out of the range of integer(int32)") > 0, &
               "a failure found in Fortran is the thread's last error too")
    call torch_arglist_delete(list)
    call torch_delete(x)
  end subroutine rejected_arguments_release_temporaries

  ! The forms of = that allocate their left-hand side (README, per compiler): what each compiler
  ! does is printed and checked by tests/test_lifetime.py. `arr = [s1, s2]` ("constructor") or
  ! `arr = src` ("copy") into an unallocated array of a type with a tensor component.
  subroutine allocating_user_arrays(form)
    character(len=*), intent(in) :: form
    type(state_t), allocatable :: src(:), arr(:)
    real(real64), target :: a(1), b(1)
    integer(c_int64_t) :: before
    integer :: stat
    a = 1
    b = 2
    allocate(src(2))
    call torch_tensor_from_array(src(1)%t, a, torch_kCPU)
    call torch_tensor_from_array(src(2)%t, b, torch_kCPU)
    if (form == "constructor into allocated") allocate(arr(2))
    before = ftorch_live_handles()
    if (form /= "copy") then
      arr = [src(1), src(2)]
    else
      arr = src
    end if
    print '(a,i0)', "new tensors ", ftorch_live_handles() - before
    call check(size(arr) == 2, "the array is allocated with two elements")
    print '(a,2(1x,a))', "elements hold", held(arr(1)%t), held(arr(2)%t)
    print '(a,2(1x,a))', "originals hold", held(src(1)%t), held(src(2)%t)
    call torch_delete(src(1)%t)
    print '(a,l1)', "element usable after deleting the original ", torch_tensor_get_rank(arr(1)%t, stat=stat) == 1 &
                                                                     .and. stat == 0
    call torch_delete(arr(1)%t)  ! a no-op where it was stale
    call torch_delete(arr(2)%t)
    call torch_delete(src(2)%t)
    call check(ftorch_live_handles() == before - 2, "every tensor deleted exactly once")
  end subroutine allocating_user_arrays

  include "allocating_forms.inc"

  ! `s2 = state_t(s1%t)`: the constructor holds a bitwise copy of s1’s handle. Prints what each
  ! side holds afterwards (tests/test_lifetime.py checks it per compiler).
  subroutine structure_constructor_copy()
    type(state_t) :: s1, s2
    real(real64), target :: a(1)
    integer(c_int64_t) :: before
    a = 5
    call torch_tensor_from_array(s1%t, a, torch_kCPU)
    before = ftorch_live_handles()
    s2 = state_t(s1%t)
    print '(a,i0)', "new tensors ", ftorch_live_handles() - before
    print '(a,2(1x,a))', "copy and original hold", held(s2%t), held(s1%t)
    call torch_delete(s2%t)
    call torch_delete(s1%t)
    call check(ftorch_live_handles() == before - 1, "every tensor deleted exactly once")
  end subroutine structure_constructor_copy

  ! `dst = src` of a type with an allocatable and a tensor component, dst a dummy argument; then
  ! the components one by one. Prints what dst%t holds after each.
  subroutine assignment_to_a_dummy()
    type(mixed_t) :: s1, s2
    real(real64), target :: v(1), w(1)
    v = 3
    w = 0
    s1%a = [1d0]
    s2%a = [2d0]
    call torch_tensor_from_array(s1%t, v, torch_kCPU)
    call torch_tensor_from_array(s2%t, w, torch_kCPU)
    call assign_whole(s2, s1)
    print '(a,1x,a)', "whole:", held(s2%t)
    call torch_delete(s2%t)
    call torch_tensor_from_array(s2%t, w, torch_kCPU)
    call assign_components(s2, s1)
    print '(a,1x,a,1x,f0.0)', "components:", held(s2%t), w(1)
    call torch_delete(s1%t)
    call torch_delete(s2%t)
  end subroutine assignment_to_a_dummy

  ! `s = s` of a variable of a type with a tensor component: prints the status and what s%t holds.
  subroutine self_assignment_of_a_type()
    type(state_t) :: s
    real(real64), target :: v(1)
    integer :: stat
    character(len=300) :: msg
    v = 4
    call torch_tensor_from_array(s%t, v, torch_kCPU)
    msg = ""
    call torch_catch_begin()
    s = s
    call torch_catch_end(stat, msg)
    print '(a,i0,1x,a)', "direct stat ", stat, trim(msg)
    print '(a,1x,a)', "direct holds", held(s%t)
    call torch_delete(s%t)
    call torch_tensor_from_array(s%t, v, torch_kCPU)
    msg = ""
    call torch_catch_begin()
    call self_assign(s)
    call torch_catch_end(stat, msg)
    print '(a,i0,1x,a)', "through dummies stat ", stat, trim(msg)
    print '(a,1x,a)', "through dummies holds", held(s%t)
    call torch_delete(s%t)
  end subroutine self_assignment_of_a_type

  ! (through a procedure, so that the compiler does not see the two sides are one variable)
  subroutine self_assign(s)
    type(state_t), intent(inout) :: s
    call copy_state(s, s)
  end subroutine self_assign

  subroutine copy_state(a, b)
    type(state_t), intent(inout) :: a
    type(state_t), intent(in) :: b
    a = b
  end subroutine copy_state

  ! An intent(out) array of tensors, 10 calls: prints the tensors left alive and whether the
  ! elements arrived constructed.
  subroutine intent_out_array()
    type(torch_tensor) :: ts(2)
    integer(c_int64_t) :: before
    logical :: entered
    integer :: i
    call torch_tensor_zeros(ts(1), 1, [1_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_tensor_zeros(ts(2), 1, [1_c_int64_t], torch_kFloat64, torch_kCPU)
    before = ftorch_live_handles()
    do i = 1, 10
      call refill(ts, entered)
    end do
    print '(a,i0)', "intent(out) array leaked ", ftorch_live_handles() - before
    print '(a,l1)', "elements arrived constructed ", entered
    call torch_delete(ts)
  end subroutine intent_out_array

  ! Forms whose leaks depend on the compiler (tests/test_lifetime.py checks the counts per
  ! compiler; the guide lists them): tensors left alive by 10 repetitions of each.
  subroutine leak_patterns()
    type(bundle_t) :: b1, b2
    type(torch_tensor) :: xs(3), ys(3), a
    real(real64), target :: m(3), n(3), av(2)
    integer(c_int64_t) :: before
    integer :: i
    m = [1d0, 2d0, 3d0]
    n = 0
    av = 1
    allocate(b1%ts(2), b2%ts(2))
    do i = 1, 2
      call torch_tensor_from_array(b1%ts(i), m(i:i), torch_kCPU)
      call torch_tensor_from_array(b2%ts(i), n(i:i), torch_kCPU)
    end do
    do i = 1, 3
      call torch_tensor_from_array(xs(i), m(i:i), torch_kCPU)
      call torch_tensor_from_array(ys(i), n(i:i), torch_kCPU)
    end do
    call torch_tensor_from_array(a, av, torch_kCPU)
    before = ftorch_live_handles()
    do i = 1, 10
      b2 = b1
    end do
    print '(a,i0)', "leaked by b2 = b1 (allocatable array component) ", ftorch_live_handles() - before
    before = ftorch_live_handles()
    do i = 1, 10
      b2%ts = b1%ts
    end do
    print '(a,i0)', "leaked by b2%ts = b1%ts ", ftorch_live_handles() - before
    before = ftorch_live_handles()
    do i = 1, 10
      ys = doubled_plain(xs)
    end do
    print '(a,i0)', "leaked by an impure elemental function without torch_result ", ftorch_live_handles() - before
    call check(all(values_of(ys) == [2d0, 4d0, 6d0]), "... its values")
    before = ftorch_live_handles()
    do i = 1, 10
      ys = doubled(xs)
    end do
    print '(a,i0)', "leaked by an impure elemental function with torch_result ", ftorch_live_handles() - before
    before = ftorch_live_handles()
    do i = 1, 10
      call ignores(a * 2d0)
    end do
    print '(a,i0)', "leaked by an expression argument never read ", ftorch_live_handles() - before
    call torch_delete(b1%ts)
    call torch_delete(b2%ts)
    call torch_delete(xs)
    call torch_delete(ys)
    call torch_delete(a)
  end subroutine leak_patterns

  ! Overlapping sections of an array of a type with a tensor component: Fortran's result is
  ! [1, 1, 2]. Prints the wrapped values, stat and message.
  subroutine shift_user_types()
    real(real64), target :: mem(3)
    type(state_t) :: hs(3)
    integer :: i, stat
    character(len=300) :: msg
    mem = [1d0, 2d0, 3d0]
    do i = 1, 3
      call torch_tensor_from_array(hs(i)%t, mem(i:i), torch_kCPU)
    end do
    msg = ""
    call torch_catch_begin()
    hs(2:3) = hs(1:2)
    call torch_catch_end(stat, msg)
    print '(a,3(1x,f0.0),a,i0,1x,a)', "shifted", mem, " stat ", stat, trim(msg)
    print '(a,3(1x,a))', "held", (held(hs(i)%t), i = 1, 3)
    ! What the guide advises instead: a loop that reads each element before writing it (from fresh
    ! tensors: the statement above may have left some stale).
    mem = [1d0, 2d0, 3d0]
    do i = 1, 3
      call torch_delete(hs(i)%t)
      call torch_tensor_from_array(hs(i)%t, mem(i:i), torch_kCPU)
    end do
    do i = 3, 2, -1
      hs(i) = hs(i - 1)
    end do
    print '(a,3(1x,f0.0))', "looped", values_of([hs(1)%t, hs(2)%t, hs(3)%t])
    do i = 1, 3
      call torch_delete(hs(i)%t)
    end do
  end subroutine shift_user_types

  ! A scope begun and never ended in the main program: the failure is kept, the program goes on to
  ! its end (tests/test_lifetime.py checks what FTorch says at exit).
  subroutine unended_catch_scope()
    real(real64), target :: xv(2, 3)
    type(torch_tensor) :: x, y
    xv = 1
    call torch_tensor_from_array(x, xv, torch_kCPU)
    call torch_catch_begin()
    y = torch_reshape(x, [7])
    print '(a)', "reached the end"
  end subroutine unended_catch_scope

  ! Without torch_result: counts what the compiler leaves alive (gfortran <= 12: every result).
  subroutine plain_function_results()
    integer(c_int64_t) :: leaked
    leaked = time_loop(.false.)  ! (not inside the print: time_loop prints too)
    print '(a,i0)', "plain function results leaked ", leaked
  end subroutine plain_function_results

  ! 150 optimizer steps (steps of a time loop, as forwards and training steps are); each step then
  ! ("keep") keeps one more tensor alive (an array filled step by step, as a forgotten delete would
  ! do), ("overwrite") overwrites the tensor of the step, or ("plain function") advances u with a
  ! function result that is never finalized by gfortran <= 12. Prints the handles gained.
  subroutine steps_of_a_loop(what)
    character(len=*), intent(in) :: what
    type(torch_tensor) :: w, scratch, kept(150), u
    type(torch_optim) :: opt
    real(real64), target :: wv(2), uv(2)
    integer(c_int64_t) :: before
    integer :: i
    wv = 1
    uv = 1
    call torch_tensor_from_array(w, wv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(u, uv, torch_kCPU)
    call torch_optim_SGD(opt, [w], learning_rate=0.1d0)
    before = ftorch_live_handles()
    do i = 1, 150
      call torch_optim_step(opt)
      select case (what)
      case ("keep")
        kept(i) = w * 2d0
      case ("overwrite")
        scratch = w * 2d0
      case default
        u = u + 0.01d0 * tendency_plain(u)
      end select
    end do
    print '(a,i0)', "handles gained over the loop ", ftorch_live_handles() - before
    call torch_delete(kept)
    call torch_delete(scratch)
    call torch_delete(opt)
    call torch_delete(w)
    call torch_delete(u)
    if (what == "plain function") then
      call check_close(uv, [(0.995d0**150, i = 1, 2)], 1d-12, "u advanced by 150 steps")  ! (as time_loop)
    else
      call check(ftorch_live_handles() == before - 3, "every handle of the loop freed")
    end if
  end subroutine steps_of_a_loop

  subroutine gradcheck_restores_input()
    type(torch_tensor) :: x
    real(real64), target :: xv(2)
    logical :: passed
    integer :: stat
    xv = [1d0, 2d0]
    call torch_tensor_from_array(x, xv, torch_kCPU, requires_grad=.true.)
    passed = torch_gradcheck(grad_fails, [x], stat=stat)
    call check(stat /= 0 .and. .not. passed, "gradcheck of a failing function fails")
    call check(all(xv == [1d0, 2d0]), "... and leaves the input as it was")
    call torch_delete(x)
  end subroutine gradcheck_restores_input

  subroutine allow_unused_gives_zeros()
    type(torch_tensor) :: x, z, g(2), loss
    real(real64), target :: xv(2), zv(3), gz(3)
    xv = 1
    zv = 5
    call torch_tensor_from_array(x, xv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(z, zv, torch_kCPU, requires_grad=.true.)
    loss = torch_sum(x * x)
    call torch_autograd_grad(g, [loss], [x, z], allow_unused=.true.)
    call check(torch_tensor_get_rank(g(2)) == 1, "allow_unused: the unused input's gradient is constructed")
    call torch_tensor_to_array(g(2), gz)
    call check(all(gz == 0), "... and holds zeros of its shape")
    call torch_delete(g)
    call torch_delete(x)
    call torch_delete(z)
    call torch_delete(loss)
  end subroutine allow_unused_gives_zeros
end program test_lifetime
