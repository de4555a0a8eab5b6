!> Example 1: Fortran arrays as tensors, without copies.
!>
!> A tensor made by torch_tensor_from_array *is* the Fortran array: LibTorch reads and writes
!> the same memory. Element (i,j) of the tensor is a(i+1,j+1); the tensor simply has
!> column-major strides. permute_dims= gives other views of the same memory.
program tensors
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  real(real64), target :: field(3, 4)       ! e.g. 3 levels x 4 columns
  real(real64), pointer :: view(:,:)
  real(real64) :: copy(4, 3)
  type(torch_tensor) :: t, t_rows
  integer :: i

  field = reshape([(real(i, real64), i = 1, 12)], [3, 4])

  call torch_tensor_from_array(t, field, torch_kCPU)
  print '(a,2i3,a,2i3)', "shape", t%get_shape(), "   strides", t%get_stride()

  ! The same memory seen as a 4 x 3 row-major tensor: what a model expecting [columns, levels] wants.
  call torch_tensor_from_array(t_rows, field, torch_kCPU, permute_dims=[2, 1])
  print '(a,2i3,a,2i3)', "permuted shape", t_rows%get_shape(), "   strides", t_rows%get_stride()

  ! Writing through the tensor writes the Fortran array, and the other way round.
  call t%zero()
  print '(a,f4.1)', "after t%zero(), sum(field) = ", sum(field)
  field(2, 3) = 7.0_real64

  ! Getting data back: a pointer (no copy) for Fortran-ordered CPU tensors...
  call torch_tensor_data_pointer(t, view)
  print '(a,f4.1)', "view(2,3) through the tensor = ", view(2, 3)
  ! ... and a copy into an array for any other layout, dtype or device.
  call torch_tensor_to_array(t_rows, copy)
  print '(a,f4.1)', "copy(3,2) of the permuted view = ", copy(3, 2)

  call torch_delete(t)
  call torch_delete(t_rows)
  if (view(2, 3) /= 7.0_real64 .or. copy(3, 2) /= 7.0_real64) error stop "example 1: unexpected values"
  print '(a)', "example 1 finished"
end program tensors
