!> FTorch’s explicit training step, written only with what upstream FTorch and this package both
!> offer, so that one source builds against either (bench/run.py build_upstream; the FTorch idiom
!> rows of bench/instructions.py):
!>   bench_idiom <model.pt> <parameters> <batch> <inputs> <outputs> <iterations>
!> Each step, as upstream FTorch’s training example writes it: zero_grad, forward with
!> requires_grad into the output tensor (made over the Fortran array of predictions), the loss
!> tensor made anew over a one-element array (upstream’s torch_loss_mse copies into it in place,
!> recording the copy: a loss tensor kept from the previous step would take that step’s freed
!> graph into this backward), torch_loss_mse into it, backward, an Adam step. The model’s
!> parameter count is an argument (upstream FTorch has no call that counts them). The data are
!> fixed (not random_number, which gfortran seeds anew each run), so both builds print one loss.
program bench_idiom
  use, intrinsic :: iso_fortran_env, only : int64, real64
  use ftorch, only : torch_kCPU, torch_tensor, torch_tensor_from_array, torch_model, torch_model_load, &
                     torch_model_parameters, torch_model_forward, torch_loss_mse, torch_tensor_backward, &
                     torch_optim, torch_optim_Adam, torch_optim_zero_grad, torch_optim_step
  implicit none
  character(len=4096) :: path
  integer :: n_params, batch, n_in, n_out, iters, i, warm
  real(real64), allocatable, target :: x(:,:), y(:,:), pred(:,:)
  real(real64), target :: loss_value(1)
  real(real64) :: loss
  type(torch_model) :: model
  type(torch_optim) :: optim
  type(torch_tensor) :: inputs(1), outputs(1), target, tloss
  type(torch_tensor), allocatable :: params(:)
  integer(int64) :: t0, t1, rate

  call get_command_argument(1, path)
  n_params = int_arg(2)
  batch = int_arg(3)
  n_in = int_arg(4)
  n_out = int_arg(5)
  iters = int_arg(6)
  allocate(x(batch, n_in), y(batch, n_out), pred(batch, n_out), params(n_params))
  x = reshape([(sin(0.1_real64 * i), i = 1, batch * n_in)], [batch, n_in])
  y = reshape([(cos(0.3_real64 * i), i = 1, batch * n_out)], [batch, n_out])
  call torch_model_load(model, trim(path), torch_kCPU, is_training=.true.)
  call torch_model_parameters(model, params)
  call torch_optim_Adam(optim, params, learning_rate=1.0d-4)
  call torch_tensor_from_array(inputs(1), x, torch_kCPU)
  call torch_tensor_from_array(outputs(1), pred, torch_kCPU)
  call torch_tensor_from_array(target, y, torch_kCPU)
  warm = max(10, iters / 10)
  do i = 1, warm + iters
    if (i == warm + 1) call system_clock(t0, rate)
    call torch_optim_zero_grad(optim)
    call torch_model_forward(model, inputs, outputs, requires_grad=.true.)
    call torch_tensor_from_array(tloss, loss_value, torch_kCPU)
    call torch_loss_mse(tloss, outputs(1), target)
    call torch_tensor_backward(tloss)
    call torch_optim_step(optim)
    loss = loss_value(1)
  end do
  call system_clock(t1)
  print '(a,es16.8)', "seconds ", real(t1 - t0, real64) / real(rate, real64)
  print '(a,es16.8)', "loss ", loss

contains

  integer function int_arg(n)
    integer, intent(in) :: n
    character(len=64) :: text
    call get_command_argument(n, text)
    read (text, *) int_arg
  end function int_arg

end program bench_idiom
