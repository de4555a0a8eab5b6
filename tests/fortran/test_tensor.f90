!> Tensors: construction over Fortran arrays without copying (all kinds, ranks 1-7), layouts,
!> permuted views, LibTorch-owned tensors, queries, copies and handle lifetime.
program test_tensor
  use, intrinsic :: iso_c_binding, only: c_associated, c_int, c_int64_t, c_loc, c_ptr
  use, intrinsic :: iso_fortran_env, only: int8, int16, int32, int64, real32, real64
  use ftorch
  use testing, only: check, summary
  implicit none

  call kinds_alias_both_ways()
  call ranks_one_to_seven()
  call layout_and_permute()
  call blob_and_owned_tensors()
  call copies_and_views()
  call lifetime()
  call summary()

contains

  subroutine kinds_alias_both_ways()
    integer(int8), target :: i1(3)
    integer(int16), target :: i2(3)
    integer(int32), target :: i4(3)
    integer(int64), target :: i8(3)
    real(real32), target :: r4(3)
    real(real64), target :: r8(3)
    type(torch_tensor) :: t
    integer(int8), pointer :: p1(:)
    integer(int16), pointer :: p2(:)
    integer(int32), pointer :: p4(:)
    integer(int64), pointer :: p8(:)
    real(real32), pointer :: q4(:)
    real(real64), pointer :: q8(:)

    i1 = [1_int8, 2_int8, 3_int8]
    call torch_tensor_from_array(t, i1, torch_kCPU)
    call check(t%get_dtype() == torch_kInt8, "int8 array gives dtype torch_kInt8")
    call torch_tensor_data_pointer(t, p1)
    call check(c_associated(c_loc(p1), c_loc(i1)), "int8 tensor data is the Fortran array (no copy)")
    i1(2) = 7
    call check(p1(2) == 7, "int8 write in Fortran is seen by the tensor")
    call t%zero()
    call check(all(i1 == 0), "int8 zero() of the tensor zeroes the Fortran array")

    i2 = [1_int16, 2_int16, 3_int16]
    call torch_tensor_from_array(t, i2, torch_kCPU)
    call check(t%get_dtype() == torch_kInt16, "int16 array gives dtype torch_kInt16")
    call torch_tensor_data_pointer(t, p2)
    call check(c_associated(c_loc(p2), c_loc(i2)), "int16 tensor data is the Fortran array (no copy)")
    call t%zero()
    call check(all(i2 == 0), "int16 zero() of the tensor zeroes the Fortran array")

    i4 = [1, 2, 3]
    call torch_tensor_from_array(t, i4, torch_kCPU)
    call check(t%get_dtype() == torch_kInt32, "int32 array gives dtype torch_kInt32")
    call torch_tensor_data_pointer(t, p4)
    call check(c_associated(c_loc(p4), c_loc(i4)), "int32 tensor data is the Fortran array (no copy)")
    call t%zero()
    call check(all(i4 == 0), "int32 zero() of the tensor zeroes the Fortran array")

    i8 = [1_int64, 2_int64, 3_int64]
    call torch_tensor_from_array(t, i8, torch_kCPU)
    call check(t%get_dtype() == torch_kInt64, "int64 array gives dtype torch_kInt64")
    call torch_tensor_data_pointer(t, p8)
    call check(c_associated(c_loc(p8), c_loc(i8)), "int64 tensor data is the Fortran array (no copy)")
    call t%zero()
    call check(all(i8 == 0), "int64 zero() of the tensor zeroes the Fortran array")

    r4 = [1.0, 2.0, 3.0]
    call torch_tensor_from_array(t, r4, torch_kCPU)
    call check(t%get_dtype() == torch_kFloat32, "real32 array gives dtype torch_kFloat32")
    call torch_tensor_data_pointer(t, q4)
    call check(c_associated(c_loc(q4), c_loc(r4)), "real32 tensor data is the Fortran array (no copy)")
    call t%zero()
    call check(all(r4 == 0.0), "real32 zero() of the tensor zeroes the Fortran array")

    r8 = [1.0d0, 2.0d0, 3.0d0]
    call torch_tensor_from_array(t, r8, torch_kCPU)
    call check(t%get_dtype() == torch_kFloat64, "real64 array gives dtype torch_kFloat64")
    call torch_tensor_data_pointer(t, q8)
    call check(c_associated(c_loc(q8), c_loc(r8)), "real64 tensor data is the Fortran array (no copy)")
    r8(3) = 9.5d0
    call check(q8(3) == 9.5d0, "real64 write in Fortran is seen by the tensor")
    call t%zero()
    call check(all(r8 == 0.0d0), "real64 zero() of the tensor zeroes the Fortran array")
    call torch_tensor_delete(t)
  end subroutine kinds_alias_both_ways

  ! Shape, column-major strides and aliasing for ranks 1 to 7.
  subroutine ranks_one_to_seven()
    real(real64), target :: a1(2), a2(2,3), a3(2,3,2), a4(2,1,3,2), a5(2,1,2,1,3), a6(1,2,1,2,1,3), &
                            a7(2,1,1,2,1,1,3)
    type(torch_tensor) :: t
    call random_number(a1); call random_number(a2); call random_number(a3); call random_number(a4)
    call random_number(a5); call random_number(a6); call random_number(a7)
    call torch_tensor_from_array(t, a1, torch_kCPU)
    call check_rank(t, shape(a1, kind=c_int64_t), "rank 1")
    call torch_tensor_from_array(t, a2, torch_kCPU)
    call check_rank(t, shape(a2, kind=c_int64_t), "rank 2")
    call torch_tensor_from_array(t, a3, torch_kCPU)
    call check_rank(t, shape(a3, kind=c_int64_t), "rank 3")
    call torch_tensor_from_array(t, a4, torch_kCPU)
    call check_rank(t, shape(a4, kind=c_int64_t), "rank 4")
    call torch_tensor_from_array(t, a5, torch_kCPU)
    call check_rank(t, shape(a5, kind=c_int64_t), "rank 5")
    call torch_tensor_from_array(t, a6, torch_kCPU)
    call check_rank(t, shape(a6, kind=c_int64_t), "rank 6")
    call torch_tensor_from_array(t, a7, torch_kCPU)
    call check_rank(t, shape(a7, kind=c_int64_t), "rank 7")
    call t%zero()
    call check(all(a7 == 0.0d0), "rank 7: zero() of the tensor zeroes the Fortran array")
  end subroutine ranks_one_to_seven

  subroutine check_rank(t, expected_shape, name)
    type(torch_tensor), intent(in) :: t
    integer(c_int64_t), intent(in) :: expected_shape(:)
    character(len=*), intent(in) :: name
    integer(c_int64_t) :: expected_stride(size(expected_shape))
    integer :: i
    expected_stride(1) = 1
    do i = 2, size(expected_shape)
      expected_stride(i) = expected_stride(i - 1) * expected_shape(i - 1)
    end do
    call check(t%get_rank() == size(expected_shape), name // ": get_rank is the array rank")
    call check(all(t%get_shape() == expected_shape), name // ": get_shape is the Fortran shape")
    call check(all(pack(t%get_stride(), expected_shape /= 1) == pack(expected_stride, expected_shape /= 1)), &
               name // ": strides are column-major")
    call check(t%get_device_type() == torch_kCPU .and. t%get_device_index() == -1, name // ": on the CPU, index -1")
    call check(.not. t%requires_grad(), name // ": requires_grad defaults to false")
  end subroutine check_rank

  subroutine layout_and_permute()
    real(real64), target :: a(2,3)
    real(real64) :: out(2,3), out_t(3,2)
    type(torch_tensor) :: t
    a = reshape([1, 2, 3, 4, 5, 6], [2, 3])

    call torch_tensor_from_array(t, a, [1, 2], torch_kCPU)
    call check(all(t%get_stride() == [1, 2]), "layout [1,2] is the default column-major view")
    call torch_tensor_from_array(t, a, [2, 1], torch_kCPU)
    call check(all(t%get_shape() == [2, 3]) .and. all(t%get_stride() == [3, 1]), &
               "layout [2,1] keeps the shape and reads memory row-major")
    call torch_tensor_to_array(t, out)
    call check(all(out == reshape([1, 2, 3, 4, 5, 6], [2, 3], order=[2, 1])), &
               "layout [2,1] reads like reshape(..., order=[2,1])")

    call torch_tensor_from_array(t, a, torch_kCPU, permute_dims=[2, 1])
    call check(all(t%get_shape() == [3, 2]) .and. all(t%get_stride() == [2, 1]), &
               "permute_dims=[2,1] gives the transposed, row-major contiguous view")
    call torch_tensor_to_array(t, out_t)
    call check(all(out_t == transpose(a)), "permute_dims=[2,1] view holds transpose(a)")
    call t%zero()
    call check(all(a == 0.0d0), "permuted view still aliases the Fortran array")
    call torch_tensor_delete(t)
  end subroutine layout_and_permute

  subroutine blob_and_owned_tensors()
    real(real64), target :: b(2,3)
    real(real64) :: out(2,3)
    real(real32) :: out32(2,3)
    type(torch_tensor) :: t
    integer :: stat
    character(len=256) :: msg
    b = 1.5d0
    call torch_tensor_from_blob(t, c_loc(b), 2, [2_c_int64_t, 3_c_int64_t], [1, 2], torch_kFloat64, torch_kCPU)
    call check(all(t%get_shape() == [2, 3]) .and. all(t%get_stride() == [1, 2]), "from_blob with layout [1,2]")
    call t%zero()
    call check(all(b == 0.0d0), "from_blob aliases the memory")
    call torch_tensor_from_blob(t, c_loc(b), 2, [2_c_int64_t, 3_c_int64_t], [2, 1], torch_kFloat64, torch_kCPU)
    call check(all(t%get_stride() == [3, 1]), "from_blob with layout [2,1] is row-major")
    ! device_memory: the address is memory of the tensor's device, wrapped as it is (on the CPU,
    ! host memory); host memory claimed to be CUDA memory is refused, with or without a GPU.
    b = 2.5d0
    call torch_tensor_from_blob(t, c_loc(b), 2, [2_c_int64_t, 3_c_int64_t], [1, 2], torch_kFloat64, torch_kCPU, &
                                device_memory=.true.)
    call t%zero()
    call check(all(b == 0.0d0) .and. all(t%get_stride() == [1, 2]), "from_blob of device memory (CPU) aliases it")
    msg = ""
    call torch_tensor_from_blob(t, c_loc(b), 2, [2_c_int64_t, 3_c_int64_t], [1, 2], torch_kFloat64, torch_kCUDA, &
                                device_memory=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DEVICE .and. index(msg, "[torch_tensor_from_blob]") == 1 .and. &
               index(msg, "CUDA") > 0, "from_blob: host memory given as CUDA memory is a device error")

    call torch_tensor_ones(t, 2, [2_c_int64_t, 3_c_int64_t], torch_kFloat64, torch_kCPU)
    call check(all(t%get_stride() == [3, 1]), "ones() allocates row-major storage")
    call torch_tensor_to_array(t, out)
    call check(all(out == 1.0d0), "ones() holds ones")
    call torch_tensor_zeros(t, 2, [2_c_int64_t, 3_c_int64_t], torch_kFloat32, torch_kCPU, requires_grad=.true.)
    call torch_tensor_to_array(t, out32)
    call check(all(out32 == 0.0), "zeros() holds zeros")
    call check(t%requires_grad(), "requires_grad=.true. at construction")
    call check(t%get_dtype() == torch_kFloat32, "zeros() has the requested dtype")
    call torch_tensor_empty(t, 1, [4_c_int64_t], torch_kInt32, torch_kCPU, device_index=-1)
    call check(all(t%get_shape() == [4]) .and. t%get_dtype() == torch_kInt32, "empty() with shape and dtype")
    call torch_tensor_empty(t, 0, [integer(c_int64_t) ::], torch_kFloat64, torch_kCPU)
    call check(t%get_rank() == 0, "rank-0 tensor from empty()")
    call t%print()
    call torch_tensor_delete(t)
  end subroutine blob_and_owned_tensors

  subroutine copies_and_views()
    real(real64), target :: src(2,2)
    real(real32), target :: dst(2,2)
    integer(int32) :: ints(2,3)
    real(real32) :: reals(2,3)
    real(real64), pointer :: view(:,:)
    type(torch_tensor) :: ts, td
    integer :: stat
    character(len=256) :: msg
    src = reshape([1.25d0, 2.5d0, 3.75d0, 5.0d0], [2, 2])
    dst = 0.0
    call torch_tensor_from_array(ts, src, torch_kCPU)
    call torch_tensor_from_array(td, dst, torch_kCPU)
    call torch_tensor_to(ts, td)
    call check(all(dst == real(src, real32)), "torch_tensor_to copies into the target's Fortran array, converting dtype")

    call torch_tensor_ones(ts, 2, [2_c_int64_t, 3_c_int64_t], torch_kFloat64, torch_kCPU)
    ints = 7
    call torch_tensor_to_array(ts, ints, stat=stat)
    call check(stat == FTORCH_ERR_DTYPE .and. all(ints == 7), &
               "to_array of a float64 tensor into an int32 array is an error, whatever the values")
    call torch_tensor_to_array(ts, reals)
    call check(all(reals == 1), "to_array copies a row-major float64 tensor into a real32 array")
    msg = ""
    call torch_tensor_data_pointer(ts, view, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. .not. associated(view), &
               "data_pointer refuses a row-major tensor (a copy is needed)")
    call check(index(msg, "torch_tensor_data_pointer") > 0 .and. index(msg, "column-major") > 0, &
               "data_pointer error names the procedure and the reason")
    call torch_tensor_from_array(ts, src, torch_kCPU)
    call torch_tensor_data_pointer(ts, view)
    call check(all(shape(view) == [2, 2]) .and. all(view == src), "data_pointer of a Fortran-ordered tensor")
    call torch_tensor_delete(ts)
    call torch_tensor_delete(td)
  end subroutine copies_and_views

  subroutine lifetime()
    real(real64), target :: a(4)
    type(torch_tensor) :: t, many(3)
    type(torch_tensor), allocatable :: owned
    integer(c_int64_t) :: base
    integer :: i
    a = 1.0d0
    base = ftorch_live_handles()
    do i = 1, 100
      call torch_tensor_from_array(t, a, torch_kCPU)
    end do
    call check(ftorch_live_handles() == base + 1, "constructing into a live tensor frees the old handle")
    call torch_tensor_delete(t)
    call check(.not. c_associated(t%p), "delete nulls the handle")
    call torch_tensor_delete(t)
    call check(ftorch_live_handles() == base, "deleting twice is harmless")
    do i = 1, 3
      call torch_tensor_from_array(many(i), a, torch_kCPU)
    end do
    call pass_array([many(1), many(2)])
    call check(ftorch_live_handles() == base + 3 .and. many(1)%get_rank() == 1, &
               "an array constructor of tensors leaves the originals alive")
    call torch_delete(many)
    call check(ftorch_live_handles() == base, "elemental torch_delete frees an array of tensors")
    allocate(owned)
    call torch_tensor_from_array(owned, a, torch_kCPU)
    call check(ftorch_live_handles() == base + 1, "allocatable tensor constructed")
    deallocate(owned)
    call check(ftorch_live_handles() == base, "deallocating a tensor runs its finalizer")
  end subroutine lifetime

  subroutine pass_array(ts)
    type(torch_tensor), intent(in) :: ts(:)
    if (size(ts) /= 2) error stop "pass_array"
  end subroutine pass_array
end program test_tensor
