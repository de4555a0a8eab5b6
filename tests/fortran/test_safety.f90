!> No silent wrong values: the mistakes a compiler lets through, and the handle rules' holes that
!> once gave wrong values with status 0 (issue 37). Each case either gets Fortran's right answer
!> or a clear error naming the argument and the fix; every handle it made is freed.
program test_safety
  use, intrinsic :: iso_c_binding, only: c_associated, c_int64_t
  use, intrinsic :: iso_fortran_env, only: int8, int32, int64, real32, real64, compiler_version
  use ftorch
  use testing, only: check, summary, data_path
  implicit none

  integer(c_int64_t) :: base

  base = ftorch_live_handles()
  call assignment_into_shared_memory()
  call pointers_into_results()
  call writes_through_shape_pointers()
  call parameters_stay_leaves()
  call overlapping_memory()
  call non_contiguous_arrays()
  call lossy_conversions()
  call sourced_allocation_of_an_expression()
  call scalar_expression_into_an_array_of_tensors()
  if (index(compiler_version(), "flang") > 0) call expressions_live_to_the_end_of_the_statement()
  if (index(compiler_version(), "GCC") > 0) call expressions_are_read_once()
  call check(ftorch_live_handles() == base, "every handle made by this program was freed")
  call summary()

contains

  !> The values of a float64 tensor of any rank, in PyTorch's (row-major) order.
  function values_of(t) result(v)
    type(torch_tensor), intent(in) :: t
    real(real64), allocatable :: v(:)
    type(torch_tensor) :: flat
    allocate(v(product(t%get_shape())))
    flat = torch_reshape(t, [size(v)])
    call torch_tensor_to_array(flat, v)
    call torch_delete(flat)
  end function values_of

  function twice(u) result(r)
    type(torch_tensor), intent(in) :: u
    type(torch_tensor) :: r
    r = torch_result(2.0_real64 * u)
  end function twice

  subroutine assignment_into_shared_memory()
    real(real64), target :: xa(3)
    real(real64), pointer :: pv(:)
    type(torch_tensor) :: t, v, x, y
    ! A view whose memory a Fortran pointer points into: `=` into its base writes in place (the
    ! view sees it, as in PyTorch) and the memory stays with the view when the base is deleted.
    call torch_tensor_zeros(t, 1, [4_c_int64_t], torch_kFloat64, torch_kCPU)
    t = 1.0_real64
    v = torch_reshape(t, [4])
    call torch_tensor_data_pointer(v, pv)
    t = t * 2.0_real64
    call check(all(pv == 2.0_real64) .and. all(values_of(v) == 2.0_real64), &
               "= into the base of a view whose data pointer was taken writes the memory the pointer sees")
    call torch_delete(t)
    pv = 7.0_real64
    call check(all(values_of(v) == 7.0_real64), &
               "the view's data pointer stays valid after its base is assigned to and deleted")
    call torch_delete(v)
    ! A detached copy of a tensor over a Fortran array: `=` into the copy leaves the array with x.
    xa = [1.0_real64, 2.0_real64, 3.0_real64]
    call torch_tensor_from_array(x, xa, torch_kCPU)
    y = torch_detach(x)
    y = 5.0_real64
    call check(all(xa == [1.0_real64, 2.0_real64, 3.0_real64]) .and. all(values_of(y) == 5.0_real64), &
               "= into a detached copy of a wrapped tensor does not take the Fortran array")
    x = 7.0_real64
    call check(all(xa == 7.0_real64) .and. all(values_of(x) == 7.0_real64) .and. all(values_of(y) == 5.0_real64), &
               "the wrapped tensor still writes into its Fortran array after = into its detached copy")
    call torch_delete(x)
    call torch_delete(y)
  end subroutine assignment_into_shared_memory

  subroutine pointers_into_results()
    real(real64), target :: av(3)
    real(real64), pointer :: p(:)
    integer(c_int64_t), pointer :: sizes(:)
    type(torch_tensor) :: a
    integer :: stat
    integer(c_int64_t) :: before
    character(len=512) :: msg
    av = [1.0_real64, 2.0_real64, 3.0_real64]
    call torch_tensor_from_array(a, av, torch_kCPU)
    before = ftorch_live_handles()
    msg = ""
    call torch_tensor_data_pointer(twice(a), p, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "would dangle") > 0, &
               "a data pointer into a function's torch_result is refused: " // trim(msg))
    call check(ftorch_live_handles() == before, "the refused function result is freed")
    msg = ""
    sizes => torch_tensor_get_shape(twice(a), stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "would dangle") > 0 .and. .not. associated(sizes) &
               .and. ftorch_live_handles() == before, "get_shape of a function's torch_result is refused and freed")
    msg = ""
    call torch_tensor_data_pointer(a * 2.0_real64, p, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "would dangle") > 0 .and. &
               ftorch_live_handles() == before, "a data pointer into an operator's result is refused and freed")
    call torch_delete(a)
  end subroutine pointers_into_results

  !> Reusing get_shape’s array to build another shape (a pointer Fortran lets one write through)
  !> changes a copy, never the tensor: its extents, strides and values stay those of its memory.
  subroutine writes_through_shape_pointers()
    integer(c_int64_t), pointer :: sizes(:), strides(:)
    type(torch_tensor) :: a, b
    real(real64), allocatable :: v(:)
    call torch_tensor_ones(a, 2, [2_c_int64_t, 3_c_int64_t], torch_kFloat64, torch_kCPU)
    sizes => a%get_shape()
    strides => a%get_stride()
    sizes(2) = 1000
    strides = 0
    call check(all(a%get_shape() == [2, 3]) .and. all(a%get_stride() == [3, 1]), &
               "writes through get_shape/get_stride pointers leave the tensor’s extents and strides")
    call check(all(sizes == [2, 3]) .and. all(strides == [3, 1]), "the next get_shape/get_stride renews the copy")
    sizes(1) = 4
    b = torch_reshape(a, [3, 2])
    v = values_of(b)
    call check(size(v) == 6 .and. all(v == 1.0_real64) .and. all(b%get_shape() == [3, 2]), &
               "operations on a tensor whose shape pointer was written see its real shape")
    call torch_delete(a)
    call torch_delete(b)
    call torch_tensor_ones(b, 2, [2_c_int64_t, 2_c_int64_t], torch_kFloat64, torch_kCPU)
    a = torch_sum(b)
    call torch_delete(b)
    sizes => a%get_shape()
    strides => a%get_stride()
    call check(associated(sizes) .and. associated(strides) .and. size(sizes) == 0 .and. size(strides) == 0, &
               "a 0-d tensor’s shape and strides are associated pointers of size 0")
    call torch_delete(a)
  end subroutine writes_through_shape_pointers

  subroutine parameters_stay_leaves()
    type(torch_model) :: net
    type(torch_tensor), allocatable :: params(:)
    real(real64), allocatable :: w1(:)
    real(real64), allocatable :: before(:)
    integer :: stat
    character(len=512) :: msg
    call torch_model_load(net, data_path("simplenet_f64.pt"), torch_kCPU, requires_grad=.true.)
    allocate(params(torch_model_parameter_count(net)))
    call torch_model_parameters(net, params)
    before = values_of(params(1))
    msg = ""
    call torch_catch_begin()
    params(1) = params(1) * 1.0_real64
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "parameter") > 0 .and. &
               index(msg, "torch_no_grad_begin") > 0, &
               "= of a value with autograd history into a model parameter is an error: " // trim(msg))
    call check(torch_tensor_is_leaf(params(1)) .and. all(values_of(params(1)) == before), &
               "the refused = leaves the parameter a leaf with its values")
    call torch_no_grad_begin()
    params(1) = params(1) * 0.5_real64
    call torch_no_grad_end()
    w1 = values_of(params(1))
    call check(torch_tensor_is_leaf(params(1)) .and. w1(1) == 0.5_real64 * before(1), &
               "under torch_no_grad_begin, = into a parameter writes in place and it stays a leaf")
    call torch_delete(params)
    call torch_delete(net)
  end subroutine parameters_stay_leaves

  subroutine overlapping_memory()
    real(real64), target :: a(5)
    type(torch_tensor) :: t1, t2
    a = [1.0_real64, 2.0_real64, 3.0_real64, 4.0_real64, 5.0_real64]
    call torch_tensor_from_array(t1, a(1:4), torch_kCPU)
    call torch_tensor_from_array(t2, a(2:5), torch_kCPU)
    t2 = t1
    call check(all(a == [1.0_real64, 1.0_real64, 2.0_real64, 3.0_real64, 4.0_real64]), &
               "t2 = t1 over overlapping sections a(2:5) and a(1:4) gives a(2:5) = a(1:4)")
    a = [1.0_real64, 2.0_real64, 3.0_real64, 4.0_real64, 5.0_real64]
    t1 = t2
    call check(all(a == [2.0_real64, 3.0_real64, 4.0_real64, 5.0_real64, 5.0_real64]), &
               "t1 = t2 over overlapping sections a(1:4) and a(2:5) gives a(1:4) = a(2:5)")
    call torch_delete(t1)
    call torch_delete(t2)
  end subroutine overlapping_memory

  subroutine non_contiguous_arrays()
    real(real64), target :: big(10, 4)
    real(real64) :: got(10, 2)
    type(torch_tensor) :: t
    integer :: stat, i
    character(len=512) :: msg
    big = reshape([(real(i, real64), i = 1, 40)], [10, 4])
    msg = ""
    call torch_tensor_from_array(t, big(1:5, :), torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "data_in") > 0 .and. &
               index(msg, "contiguous") > 0 .and. .not. c_associated(t%p), &
               "a non-contiguous section is refused by torch_tensor_from_array: " // trim(msg))
    call torch_tensor_from_array(t, big(:, 2:3), torch_kCPU)
    call torch_tensor_to_array(t, got)
    call check(all(got == big(:, 2:3)), "a contiguous section is wrapped")
    ! A section of one element is contiguous (gfortran 12 says otherwise for it): wrapped, aliased.
    msg = ""
    call torch_tensor_from_array(t, big(3:3, 2:2), torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == 0, "a one-element section big(3:3, 2:2) is wrapped: " // trim(msg))
    if (stat == 0) then
      t = 99.0_real64
      call check(big(3, 2) == 99.0_real64 .and. big(2, 2) == 12.0_real64 .and. big(4, 2) == 14.0_real64, &
                 "the tensor over a one-element section writes that element of the array only")
    end if
    call null_pointer_is_refused()
    call torch_delete(t)
  end subroutine non_contiguous_arrays

  subroutine null_pointer_is_refused()
    real(real32), pointer :: p(:, :) => null()
    type(torch_tensor) :: t
    integer :: stat
    character(len=512) :: msg
    msg = ""
    call torch_tensor_from_array(t, p, torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "data_in is not associated") > 0 .and. &
               .not. c_associated(t%p), "a null pointer is refused by torch_tensor_from_array: " // trim(msg))
  end subroutine null_pointer_is_refused

  subroutine lossy_conversions()
    real(real64), target :: fv(3)
    integer(int8) :: i8(3)
    integer(int32), target :: i32(3)
    integer(int64), target :: i64(2)
    real(real32) :: r32(3)
    type(torch_tensor) :: tf, ti, tl
    integer :: stat
    character(len=512) :: msg
    fv = [1000.7_real64, 2501.75_real64, -3202.2_real64]
    call torch_tensor_from_array(tf, fv, torch_kCPU)
    msg = ""
    i8 = 0
    call torch_tensor_to_array(tf, i8, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DTYPE .and. index(msg, "float64") > 0 .and. index(msg, "torch_tensor_to") > 0 &
               .and. all(i8 == 0), "to_array of float64 values into an int8 array is an error: " // trim(msg))
    call torch_tensor_to_array(tf, r32, stat=stat)
    call check(stat == 0 .and. all(abs(r32 - real(fv, real32)) == 0), "to_array of float64 into real32 rounds")
    i32 = 0
    call torch_tensor_from_array(ti, i32, torch_kCPU)
    msg = ""
    call torch_catch_begin()
    ti = tf
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_DTYPE .and. all(i32 == 0), "= of a float64 tensor into an int32 tensor is an error: " &
               // trim(msg))
    call torch_catch_begin()
    ti = 2.5_real64
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_DTYPE .and. all(i32 == 0), "= of 2.5 into an int32 tensor is an error")
    ti = 3.0_real64
    call check(all(i32 == 3), "= of a whole real number into an int32 tensor fills it")
    call torch_tensor_to(tf, ti)
    call check(all(i32 == [1000, 2501, -3202]), "torch_tensor_to converts explicitly (truncating toward zero)")
    i64 = [100_int64, 300_int64]
    call torch_tensor_from_array(tl, i64, torch_kCPU)
    call torch_tensor_to_array(tl, i8(1:2), stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DTYPE .and. index(msg, "300") > 0, &
               "to_array of int64 values outside int8's range is an error: " // trim(msg))
    i64 = [100_int64, -20_int64]
    call torch_tensor_to_array(tl, i8(1:2), stat=stat)
    call check(stat == 0 .and. all(i8(1:2) == [100_int8, -20_int8]), "to_array of int64 values within int8's range")
    call lossy_forward_outputs()
    call torch_delete(tf)
    call torch_delete(ti)
    call torch_delete(tl)
  end subroutine lossy_conversions

  subroutine lossy_forward_outputs()
    type(torch_model) :: net
    type(torch_tensor) :: inputs(1), outputs(1)
    real(real64), target :: x(5)
    integer(int32), target :: y(5)
    integer :: stat
    character(len=512) :: msg
    call torch_model_load(net, data_path("simplenet_f64.pt"), torch_kCPU)
    x = [-1.0_real64, -0.5_real64, 0.0_real64, 0.5_real64, 1.0_real64]
    y = -99
    call torch_tensor_from_array(inputs(1), x, torch_kCPU)
    call torch_tensor_from_array(outputs(1), y, torch_kCPU)
    msg = ""
    call torch_model_forward(net, inputs, outputs, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DTYPE .and. all(y == -99) .and. index(msg, "int32") > 0, &
               "a float64 forward output written into an int32 array is an error: " // trim(msg))
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(net)
  end subroutine lossy_forward_outputs

  !> `allocate(p, source=expr)` copies the handle of the expression's temporary, which the statement
  !> frees (flang) or its first reader releases (gfortran 11/12): p then holds a stale handle, a
  !> clear error to use (never another tensor's values), and nothing leaks.
  subroutine sourced_allocation_of_an_expression()
    real(real64), target :: av(2)
    real(real64) :: got(2)
    type(torch_tensor) :: a
    type(torch_tensor), allocatable :: p
    integer :: stat1, stat2
    integer(c_int64_t) :: before
    av = [1.0_real64, 2.0_real64]
    call torch_tensor_from_array(a, av, torch_kCPU)
    before = ftorch_live_handles()
    allocate(p, source=a * 2.0_real64)
    got = 0
    call torch_tensor_to_array(p, got, stat=stat1)
    call torch_tensor_to_array(p, got, stat=stat2)
    call check((stat1 == 0 .and. all(got == [2.0_real64, 4.0_real64]) .or. stat1 == FTORCH_ERR_NULL_HANDLE) &
               .and. stat2 == FTORCH_ERR_NULL_HANDLE, &
               "allocate(p, source=expression) leaves p stale: the right values once at most, then a clear error")
    deallocate(p)
    call check(ftorch_live_handles() == before, "the sourced allocation of an expression leaks nothing")
    call torch_delete(a)
  end subroutine sourced_allocation_of_an_expression

  !> Where the compiler finalizes every function result (flang), an expression's result
  !> lives until the compiler finalizes it: an associate name or a dummy argument may be read twice.
  !> (gfortran 11 and 12 never finalize them: the first FTorch call that reads one releases it.)
  subroutine expressions_live_to_the_end_of_the_statement()
    real(real64), target :: av(2), bv(2), cv(2)
    type(torch_tensor) :: a, b, c
    integer(c_int64_t) :: before
    av = [1.0_real64, 2.0_real64]
    call torch_tensor_from_array(a, av, torch_kCPU)
    call torch_tensor_from_array(b, bv, torch_kCPU)
    call torch_tensor_from_array(c, cv, torch_kCPU)
    before = ftorch_live_handles()
    associate (s => a * 2.0_real64)
      b = s
      c = s + 1.0_real64
    end associate
    call check(all(bv == [2.0_real64, 4.0_real64]) .and. all(cv == [3.0_real64, 5.0_real64]), &
               "an associate name for an expression is read twice (finalizing compiler)")
    call read_twice(a * 3.0_real64, b, c)
    call check(all(bv == [3.0_real64, 6.0_real64]) .and. all(cv == [6.0_real64, 12.0_real64]), &
               "a procedure reads its expression argument twice (finalizing compiler)")
    call check(ftorch_live_handles() == before, "the expressions were freed")
    call torch_delete(a)
    call torch_delete(b)
    call torch_delete(c)
  end subroutine expressions_live_to_the_end_of_the_statement

  !> gfortran 11 and 12 never finalize function results, gfortran 13 and 14 none inside an array
  !> constructor: on every gfortran the first FTorch call that reads one releases it, so a second
  !> read is a stale-handle error (never other values), and nothing leaks. gfortran 13 and 14
  !> finalize an associate construct’s expression selector at once, after copying its handle: the
  !> associate name is stale from the start (an error at the first read).
  subroutine expressions_are_read_once()
    real(real64), target :: av(2), bv(2), cv(2)
    type(torch_tensor) :: a, b, c
    integer :: stat1, stat2, major
    integer(c_int64_t) :: before
    character(len=:), allocatable :: version
    version = compiler_version()
    read(version(index(version, "GCC version ") + 12:index(version, "GCC version ") + 13), "(i2)") major
    av = [1.0_real64, 2.0_real64]
    bv = -1.0_real64
    cv = -1.0_real64
    call torch_tensor_from_array(a, av, torch_kCPU)
    call torch_tensor_from_array(b, bv, torch_kCPU)
    call torch_tensor_from_array(c, cv, torch_kCPU)
    before = ftorch_live_handles()
    associate (s => a * 2.0_real64)
      call torch_catch_begin()
      b = s
      call torch_catch_end(stat1)
      call torch_catch_begin()
      c = s + 1.0_real64
      call torch_catch_end(stat2)
    end associate
    if (major <= 12) then
      call check(stat1 == 0 .and. all(bv == [2.0_real64, 4.0_real64]) .and. stat2 == FTORCH_ERR_NULL_HANDLE &
                 .and. all(cv == -1.0_real64), &
                 "an associate name for an expression is read once; the second read is a stale-handle error (gfortran 11/12)")
    else
      call check(stat1 == FTORCH_ERR_NULL_HANDLE .and. stat2 == FTORCH_ERR_NULL_HANDLE .and. all(bv == -1.0_real64) &
                 .and. all(cv == -1.0_real64), &
                 "an associate name for an expression is stale from the start: an error, no values (gfortran 13/14)")
    end if
    call check(ftorch_live_handles() == before, "the expression was freed")
    call torch_catch_begin()
    call read_twice(a * 3.0_real64, b, c)
    call torch_catch_end(stat1)
    call check(stat1 == FTORCH_ERR_NULL_HANDLE .and. all(bv == [3.0_real64, 6.0_real64]) .and. all(cv == -1.0_real64), &
               "a procedure reads its expression argument once; the second read is a stale-handle error (gfortran)")
    call check(ftorch_live_handles() == before, "the expression argument was freed")
    call torch_delete(a)
    call torch_delete(b)
    call torch_delete(c)
  end subroutine expressions_are_read_once

  !> `ts = x + 1` with ts an array of tensors: Fortran gives every element the value (gfortran calls
  !> the elemental `=` once per element with the one result), each element its own tensor.
  subroutine scalar_expression_into_an_array_of_tensors()
    real(real64), target :: xv(3)
    type(torch_tensor) :: x, ts(3), us(2)
    integer(c_int64_t) :: before
    integer :: i, stat
    character(len=512) :: msg
    xv = [1.0_real64, 2.0_real64, 3.0_real64]
    call torch_tensor_from_array(x, xv, torch_kCPU)
    before = ftorch_live_handles()
    msg = ""
    call torch_catch_begin()
    ts = x + 1.0_real64  ! unconstructed elements
    call torch_catch_end(stat, msg)
    call check(stat == 0, "ts = x + 1 into unconstructed tensors: " // trim(msg))
    if (stat /= 0) return
    do i = 1, 3
      call check(all(values_of(ts(i)) == xv + 1.0_real64), "ts = x + 1 gives every element the value")
    end do
    call torch_tensor_set_requires_grad(ts(1), .true.)
    call check(.not. ts(2)%requires_grad() .and. .not. ts(3)%requires_grad(), &
               "... each its own tensor (requires_grad set on ts(1) only)")
    ts(1) = 0.0_real64
    call check(all(values_of(ts(2)) == xv + 1.0_real64) .and. all(values_of(ts(3)) == xv + 1.0_real64), &
               "... each its own tensor (a write to ts(1) leaves the others alone)")
    us = spread(x - 1.0_real64, 1, 2)
    call torch_tensor_set_requires_grad(us(1), .true.)
    call check(.not. us(2)%requires_grad() .and. all(values_of(us(2)) == xv - 1.0_real64), &
               "us = spread(x - 1, 1, 2): each element its own tensor")
    call torch_delete(us)
    ts = x * 2.0_real64  ! constructed elements
    ts(3) = -1.0_real64
    call check(all(values_of(ts(1)) == 2 * xv) .and. all(values_of(ts(2)) == 2 * xv) .and. &
               all(values_of(ts(3)) == -1.0_real64), "ts = x * 2 into constructed tensors, each its own")
    call check(ftorch_live_handles() == before + 3, "the expressions were freed")
    call torch_delete(ts)
    call torch_delete(x)
  end subroutine scalar_expression_into_an_array_of_tensors

  subroutine read_twice(x, b, c)
    type(torch_tensor), intent(in) :: x
    type(torch_tensor), intent(inout) :: b, c
    b = x
    c = x + x
  end subroutine read_twice

end program test_safety
