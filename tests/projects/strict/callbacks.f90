!> User procedures handed to FTorch (gradient hook, custom function, saved-tensor hooks, checkpoint
!> segment, gradcheck), compiled with the consumer’s strict flags (-std=f2008 among them: the
!> procedures are ordinary module procedures, not bind(c) ones). The expected gradients are exact
!> in float64 (small integers, products and sums of them).
module strict_callbacks
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none
  integer, save :: packed_count = 0, unpacked_count = 0

contains

  subroutine double_grad(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    if (stat /= 0) errmsg = "unexpected status on entry"
    new_grad = grad * 2.0_real64
  end subroutine double_grad

  subroutine cube_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    if (stat /= 0) errmsg = "unexpected status on entry"
    call ctx%save_for_backward(inputs)
    outputs(1) = inputs(1) * inputs(1) * inputs(1)
  end subroutine cube_forward

  subroutine cube_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x
    if (stat /= 0) errmsg = "unexpected status on entry"
    call ctx%saved_tensor(1, x)
    grad_inputs(1) = grad_outputs(1) * 3.0_real64 * x * x
    call torch_delete(x)
  end subroutine cube_backward

  subroutine pack_clone(tensor, packed, stat, errmsg)
    type(torch_tensor), intent(in) :: tensor
    type(torch_tensor), intent(inout) :: packed
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    if (stat /= 0) errmsg = "unexpected status on entry"
    packed_count = packed_count + 1
    packed = torch_clone(tensor)
  end subroutine pack_clone

  subroutine unpack_same(packed, tensor, stat, errmsg)
    type(torch_tensor), intent(in) :: packed
    type(torch_tensor), intent(inout) :: tensor
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    if (stat /= 0) errmsg = "unexpected status on entry"
    unpacked_count = unpacked_count + 1
    tensor = packed
  end subroutine unpack_same

  subroutine square_segment(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    if (stat /= 0) errmsg = "unexpected status on entry"
    outputs(1) = inputs(1) * inputs(1)
  end subroutine square_segment
end module strict_callbacks

program callbacks
  use, intrinsic :: iso_fortran_env, only: real64, int64
  use ftorch
  use strict_callbacks
  implicit none
  real(real64), target :: x(3)
  real(real64) :: g(3)
  type(torch_tensor) :: tx, outs(1)
  type(torch_function) :: cube
  integer(int64) :: hook_id
  integer :: passed, failed

  passed = 0
  failed = 0
  x = [1.0_real64, -2.0_real64, 3.0_real64]
  call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)

  ! A gradient hook doubling the gradient: d/dx sum(x*x) = 2x, doubled.
  call torch_tensor_register_hook(tx, double_grad, hook_id)
  call torch_tensor_backward(torch_sum(tx * tx))
  call gradient(g)
  call check(exact(g, 4.0_real64 * x), "gradient hook")
  call torch_tensor_remove_hook(tx, hook_id)

  ! A custom function under user saved-tensor hooks: d/dx sum(x**3) = 3x**2.
  call torch_function_define(cube, "cube", cube_forward, cube_backward)
  call torch_saved_tensors_hooks_begin(pack_clone, unpack_same)
  call torch_function_apply(cube, [tx], outs)
  call torch_saved_tensors_hooks_end()
  call torch_tensor_backward(torch_sum(outs(1)))
  call gradient(g)
  call check(exact(g, 3.0_real64 * x * x), "custom function backward")
  call check(packed_count == 1 .and. unpacked_count == 1, "saved-tensor hooks packed and unpacked")
  call torch_delete(outs(1))

  ! A checkpointed segment, recomputed in backward: d/dx sum(x*x) = 2x.
  call torch_checkpoint_segment(square_segment, [tx], outs)
  call torch_tensor_backward(torch_sum(outs(1)))
  call gradient(g)
  call check(exact(g, 2.0_real64 * x), "checkpoint segment")
  call torch_delete(outs(1))

  call check(torch_gradcheck(square_segment, [tx]), "gradcheck of a module procedure")
  call torch_delete(tx)

  print '(i0, a, i0, a)', passed, " passed, ", failed, " failed"
  if (failed > 0) error stop 1

contains

  ! The gradient accumulated in x, read and then zeroed.
  subroutine gradient(values)
    real(real64), intent(out) :: values(3)
    type(torch_tensor) :: tg
    call torch_tensor_get_gradient(tg, tx)
    call torch_tensor_to_array(tg, values)
    call torch_delete(tg)
    call tx%zero_grad()
  end subroutine gradient

  ! Equal to the last bit (written without ==, which -Wcompare-reals flags).
  logical function exact(a, b)
    real(real64), intent(in) :: a(:), b(:)
    exact = maxval(abs(a - b)) <= 0.0_real64
  end function exact

  subroutine check(ok, name)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: name
    if (ok) then
      passed = passed + 1
    else
      failed = failed + 1
      print '(2a)', "FAIL ", name
    end if
  end subroutine check
end program callbacks
