!> Example 5: differentiate through a TorchScript model's forward pass.
!>
!> With requires_grad=.true., torch_model_forward keeps the graph back to the inputs and to the
!> model's parameters. We get d(sum of outputs)/d(input), then the gradient of an MSE loss
!> with respect to the first layer's weight, and compare both with PyTorch (write_model.py).
!> Usage: model_gradients <directory holding mlp.pt>
program model_gradients
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  integer, parameter :: batch = 4, n_in = 3, n_out = 2
  real(real64), target :: x(batch, n_in), y(batch, n_out), dx(batch, n_in), ones(batch, n_out)
  real(real64), target :: target_values(batch, n_out), loss_value(1), dw(8, n_in)
  real(real64) :: expected_dx(batch, n_in), expected_dw(8, n_in), expected_loss
  type(torch_model) :: model
  type(torch_tensor) :: inputs(1), outputs(1), grad_output, grad_x, targets, loss, grad_w
  type(torch_tensor), allocatable :: params(:)
  character(len=4096) :: dir
  integer :: i, j, unit

  call get_command_argument(1, dir)
  call torch_model_load(model, trim(dir) // "/mlp.pt", torch_kCPU)
  do j = 1, n_in
    do i = 1, batch
      x(i, j) = 0.1_real64 * (i + j)
    end do
  end do

  ! d(sum of outputs)/d(input)
  call torch_tensor_from_array(inputs(1), x, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(outputs(1), y, torch_kCPU)
  call torch_model_forward(model, inputs, outputs, requires_grad=.true.)
  ones = 1.0_real64
  call torch_tensor_from_array(grad_output, ones, torch_kCPU)
  call torch_tensor_backward(outputs(1), grad_output)
  call torch_tensor_from_array(grad_x, dx, torch_kCPU)
  call torch_tensor_get_gradient(grad_x, inputs(1))

  ! d(loss)/d(parameters): parameters share storage with the model (weight 1, bias 1, ...).
  allocate(params(torch_model_parameter_count(model)))
  call torch_model_parameters(model, params)
  do i = 1, size(params)      ! the first backward also reached the parameters
    call params(i)%zero_grad()
  end do
  call torch_tensor_from_array(inputs(1), x, torch_kCPU)     ! a plain input this time
  call torch_model_forward(model, inputs, outputs, requires_grad=.true.)
  target_values = 0.5_real64
  call torch_tensor_from_array(targets, target_values, torch_kCPU)
  call torch_tensor_from_array(loss, loss_value, torch_kCPU)
  call torch_tensor_mean(loss, (outputs(1) - targets)**2)  ! a loss written in Fortran
  call torch_tensor_backward(loss)
  ! The first parameter is the [8, 3] weight; element (i, j) of its gradient goes to dw(i, j).
  call torch_tensor_get_gradient(grad_w, params(1))
  call torch_tensor_to_array(grad_w, dw)

  open(newunit=unit, file=trim(dir) // "/expected_dx.txt", status="old", action="read")
  read(unit, *) expected_dx
  close(unit)
  open(newunit=unit, file=trim(dir) // "/expected_dw.txt", status="old", action="read")
  read(unit, *) expected_dw
  close(unit)
  open(newunit=unit, file=trim(dir) // "/expected_loss.txt", status="old", action="read")
  read(unit, *) expected_loss
  close(unit)
  print '(a,es12.5,a,es12.5)', "loss =", loss_value(1), "   PyTorch:", expected_loss
  print '(a,es10.3)', "max |d(sum y)/dx - PyTorch| =", maxval(abs(dx - expected_dx))
  print '(a,es10.3)', "max |dloss/dW1 - PyTorch|   =", maxval(abs(dw - expected_dw))
  if (maxval(abs(dx - expected_dx)) > 1.0e-12_real64 * maxval(abs(expected_dx)) .or. &
      maxval(abs(dw - expected_dw)) > 1.0e-12_real64 * maxval(abs(expected_dw)) .or. &
      abs(loss_value(1) - expected_loss) > 1.0e-12_real64 * expected_loss) then
    error stop "example 5: gradients differ from PyTorch"
  end if

  call torch_delete(params)
  call torch_delete(inputs); call torch_delete(outputs); call torch_delete(grad_output)
  call torch_delete(grad_x); call torch_delete(targets); call torch_delete(loss); call torch_delete(grad_w)
  call torch_delete(model)
  print '(a)', "example 5 finished"
end program model_gradients
