!> Training-step time of an MLP on a device (bench/gpu.py): Adam, MSE, the loss read every step,
!> the data in device tensors made once. Mode "eager": torch_train_step; mode "graph": the same with
!> cuda_graph=.true. (3 warm-up steps, then one capture replayed). Prints
!>   RESULT <microseconds per step> <loss of the last step>
!> Usage: bench_graph <model.pt> <features> <batch> <cuda|cpu> <eager|graph> <warm-up steps> <timed steps>
program bench_graph
  use, intrinsic :: iso_c_binding, only: c_int
  use, intrinsic :: iso_fortran_env, only: int64, real32, real64
  use ftorch
  implicit none
  type(torch_model) :: model
  type(torch_optim) :: optim
  type(torch_tensor), allocatable :: params(:)
  type(torch_tensor) :: tx(1), ty
  real(real32), allocatable, target :: x(:, :), y(:, :)
  real(real64) :: loss
  character(len=4096) :: file, arg, device_name, mode
  integer :: features, batch, warmup, steps, step, i, j
  integer(c_int) :: device
  integer(int64) :: t0, t1, rate
  logical :: graph

  call get_command_argument(1, file)
  call get_command_argument(2, arg); read(arg, *) features
  call get_command_argument(3, arg); read(arg, *) batch
  call get_command_argument(4, device_name)
  call get_command_argument(5, mode)
  call get_command_argument(6, arg); read(arg, *) warmup
  call get_command_argument(7, arg); read(arg, *) steps
  device = torch_kCPU
  if (trim(device_name) == "cuda") device = torch_kCUDA
  graph = trim(mode) == "graph"
  allocate(x(batch, features), y(batch, features))
  do j = 1, features
    do i = 1, batch
      x(i, j) = sin(0.01 * i * j)
      y(i, j) = cos(0.02 * i + 0.03 * j)
    end do
  end do
  call torch_model_load(model, trim(file), device, is_training=.true.)
  allocate(params(torch_model_parameter_count(model)))
  call torch_model_parameters(model, params)
  call torch_optim_Adam(optim, params, learning_rate=1d-4)
  call torch_tensor_from_array(tx(1), x, device)   ! on a GPU: device copies, made once
  call torch_tensor_from_array(ty, y, device)
  do step = 1, warmup + steps
    if (step == warmup + 1) call system_clock(t0, rate)
    call torch_train_step(model, optim, tx, ty, loss, cuda_graph=graph)
  end do
  call system_clock(t1)
  print '(a,1x,es14.6,1x,es14.6)', "RESULT", 1d6 * real(t1 - t0, real64) / real(rate, real64) / steps, loss
  call torch_delete(tx)
  call torch_delete(ty)
  call torch_delete(params)
  call torch_delete(optim)
  call torch_delete(model)
end program bench_graph
