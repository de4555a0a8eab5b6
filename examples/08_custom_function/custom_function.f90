! Example 8: a custom autograd function written in Fortran -- the linear layer of PyTorch's
! custom-function tutorial (output = input . weight^T + bias) with its hand-written backward --
! checked against LibTorch's own autograd of the same layer and by a gradient check.
module linear_function
  use ftorch
  implicit none
  private
  public :: linear_forward, linear_backward, linear_layer

contains

  ! Forward: runs with grad mode off; saves what backward needs.
  subroutine linear_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)       ! input, weight, bias
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call ctx%save_for_backward(inputs)
    outputs(1) = torch_matmul(inputs(1), torch_transpose(inputs(2), 1, 2)) + inputs(3)
  end subroutine linear_forward

  ! Backward: gradients of the three inputs from the gradient of the output, computing only
  ! those this backward pass needs.
  subroutine linear_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: input, weight
    call ctx%saved_tensor(1, input)
    call ctx%saved_tensor(2, weight)
    if (ctx%needs_input_grad(1)) grad_inputs(1) = torch_matmul(grad_outputs(1), weight)
    if (ctx%needs_input_grad(2)) grad_inputs(2) = torch_matmul(torch_transpose(grad_outputs(1), 1, 2), input)
    if (ctx%needs_input_grad(3)) grad_inputs(3) = torch_sum(grad_outputs(1), dim=1)
    call torch_delete(input)
    call torch_delete(weight)
  end subroutine linear_backward

  ! The layer as a function of tensors (for torch_gradcheck).
  subroutine linear_layer(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_function), save :: linear
    if (.not. associated(linear%forward)) call torch_function_define(linear, "LinearFunction", linear_forward, &
                                                                     linear_backward)
    call torch_function_apply(linear, inputs, outputs, stat=stat, errmsg=errmsg)
  end subroutine linear_layer
end module linear_function

program custom_function
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  use linear_function
  implicit none
  integer, parameter :: wp = real64, batch = 5, nin = 4, nout = 3
  real(wp), target :: x(batch, nin), w(nout, nin), b(nout), y(batch, nout)
  real(wp), target :: gx(batch, nin), gw(nout, nin), gb(nout), rx(batch, nin), rw(nout, nin), rb(nout)
  type(torch_tensor) :: tx, tw, tb, outs(1), loss, ref, tgx, tgw, tgb
  type(torch_function) :: linear
  type(torch_gradcheck_result) :: check
  real(wp) :: worst
  integer :: i, j

  do j = 1, nin
    do i = 1, batch
      x(i, j) = sin(0.4_wp * i - 0.9_wp * j)
    end do
    do i = 1, nout
      w(i, j) = 0.3_wp * cos(1.1_wp * i + 0.6_wp * j)
    end do
  end do
  b = [0.1_wp, -0.2_wp, 0.05_wp]
  call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(tw, w, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(tb, b, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(outs(1), y, torch_kCPU)

  ! Define once, apply to tensors: the result lands in y; the graph holds one LinearFunction node.
  call torch_function_define(linear, "LinearFunction", linear_forward, linear_backward)
  call torch_function_apply(linear, [tx, tw, tb], outs)
  loss = torch_sum(outs(1) * outs(1))
  call torch_tensor_backward(loss)
  call torch_tensor_from_array(tgx, gx, torch_kCPU)
  call torch_tensor_from_array(tgw, gw, torch_kCPU)
  call torch_tensor_from_array(tgb, gb, torch_kCPU)
  call torch_tensor_get_gradient(tgx, tx)
  call torch_tensor_get_gradient(tgw, tw)
  call torch_tensor_get_gradient(tgb, tb)

  ! The same layer with built-in operators: LibTorch's autograd computes the reference.
  call tx%zero_grad()
  call tw%zero_grad()
  call tb%zero_grad()
  ref = torch_matmul(tx, torch_transpose(tw, 1, 2)) + tb
  call torch_tensor_backward(torch_sum(ref * ref))
  call torch_delete(tgx); call torch_delete(tgw); call torch_delete(tgb)
  call torch_tensor_from_array(tgx, rx, torch_kCPU)
  call torch_tensor_from_array(tgw, rw, torch_kCPU)
  call torch_tensor_from_array(tgb, rb, torch_kCPU)
  call torch_tensor_get_gradient(tgx, tx)
  call torch_tensor_get_gradient(tgw, tw)
  call torch_tensor_get_gradient(tgb, tb)
  worst = max(maxval(abs(gx - rx)), maxval(abs(gw - rw)), maxval(abs(gb - rb)))
  print '(a,es9.2)', "largest difference from LibTorch's autograd of the same layer: ", worst
  if (worst > 1e-12_wp) error stop "example 8: gradients differ"

  ! Finite differences against the hand-written backward.
  if (.not. torch_gradcheck(linear_layer, [tx, tw, tb], result=check)) error stop "example 8: gradcheck failed"
  print '(a,es9.2)', "gradcheck passed; worst |analytic - numeric| = ", check%max_error

  call torch_delete(tx); call torch_delete(tw); call torch_delete(tb); call torch_delete(outs)
  call torch_delete(loss); call torch_delete(ref)
  call torch_delete(tgx); call torch_delete(tgw); call torch_delete(tgb)
  print '(a)', "example 8 finished"
end program custom_function
