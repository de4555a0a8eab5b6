!> Example 13: a model exported by `python -m ftorch export` (see docs/guide/export.md) as TorchScript and as an
!> AOTInductor package (.pt2) with a dynamic batch dimension, run from Fortran.
!>
!> torch_model_load recognises the package by its content and torch_model_forward runs it like
!> TorchScript: the inputs and outputs wrap Fortran arrays, here x(ncol, 5) -> y(ncol, 3) for two
!> numbers of columns. The TorchScript export of the same model runs alongside for comparison.
!> Usage: compiled_inference <directory holding exported_mlp.pt2 and exported_mlp.pt>
program compiled_inference
  use, intrinsic :: iso_fortran_env, only: real32
  use ftorch
  implicit none

  type(torch_model) :: compiled, scripted
  character(len=4096) :: dir
  integer :: ncol

  call get_command_argument(1, dir)
  call torch_model_load(compiled, trim(dir) // "/exported_mlp.pt2", torch_kCPU)
  call torch_model_load(scripted, trim(dir) // "/exported_mlp.pt", torch_kCPU)
  do ncol = 16, 40, 24   ! any batch size: the batch dimension was exported as dynamic
    call run_both(ncol)
  end do
  call torch_delete(compiled)
  call torch_delete(scripted)
  print '(a)', "example 13 finished"

contains

  subroutine run_both(ncol)
    integer, intent(in) :: ncol
    real(real32), allocatable, target :: x(:,:), y_compiled(:,:), y_script(:,:)
    type(torch_tensor) :: inputs(1), out_compiled(1), out_script(1)
    integer :: i, j
    real(real32) :: diff
    allocate (x(ncol, 5), y_compiled(ncol, 3), y_script(ncol, 3))
    do j = 1, 5
      do i = 1, ncol
        x(i, j) = sin(0.3 * i + j)
      end do
    end do
    call torch_tensor_from_array(inputs(1), x, torch_kCPU)
    call torch_tensor_from_array(out_compiled(1), y_compiled, torch_kCPU)
    call torch_tensor_from_array(out_script(1), y_script, torch_kCPU)
    call torch_model_forward(compiled, inputs, out_compiled)
    call torch_model_forward(scripted, inputs, out_script)
    diff = maxval(abs(y_compiled - y_script))
    print '(a,i0,a,es10.3)', "batch of ", ncol, " columns: max |compiled - TorchScript| = ", diff
    ! The compiled kernels may round float32 sums and tanh differently from ATen's in the last
    ! bits (another blocking, a vectorised tanh); a layout or indexing error would be O(1).
    if (diff > 1.0e-5 * max(1.0, maxval(abs(y_script)))) error stop "compiled and TorchScript outputs differ"
    call torch_delete(inputs)
    call torch_delete(out_compiled)
    call torch_delete(out_script)
  end subroutine run_both

end program compiled_inference
