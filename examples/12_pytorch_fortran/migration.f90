!> Example 12: a pytorch-fortran program, compiled unchanged against FTorch (`use torch_ftn`), then
!> migrated one call at a time: the torch_ftn types hold native FTorch objects (`net%model` is a
!> torch_model, `net%optim` a torch_optim, a tensor's `%t` a torch_tensor), so native procedures
!> can be used on them right away. Usage: migration WORK_DIR
program migration
  use, intrinsic :: iso_fortran_env, only: real32
  use torch_ftn                                     ! pytorch-fortran's interface
  use ftorch, only: torch_model_num_parameters, torch_optim_set_learning_rate, torch_checkpoint_save
  implicit none
  integer, parameter :: batch = 64
  type(torch_module) :: net
  type(torch_tensor_wrap) :: inputs
  type(torch_tensor) :: target_tensor, prediction
  real(real32) :: x(2, batch), y(1, batch), loss
  real(real32), pointer :: out(:, :)
  character(len=1024) :: work_dir
  integer :: i, epoch

  call get_command_argument(1, work_dir)
  ! pytorch-fortran convention: Fortran x(2, batch) is a torch (batch, 2) tensor, same memory.
  do i = 1, batch
    x(:, i) = [real(i - 1) / (batch - 1), real(mod(7 * i, batch)) / batch]
    y(1, i) = x(1, i) * x(2, i) - 0.5 * x(1, i)
  end do

  ! --- unchanged pytorch-fortran code
  call net%load(trim(work_dir) // "/pf_mlp.pt")
  call net%create_optimizer_sgd(0.2)
  call inputs%create()
  call inputs%add_array(x)
  call target_tensor%from_array(y)
  do epoch = 1, 200
    call net%train(inputs, target_tensor, loss)
    if (mod(epoch, 50) == 0) print '(a, i4, a, es10.3)', "epoch ", epoch, "  loss ", loss
  end do
  call net%forward(inputs, prediction, flags=module_use_inference_mode)
  call prediction%to_array(out)                     ! a (1, batch) pointer into the result
  print '(a, es10.3)', "max error: ", maxval(abs(out - y))

  ! --- native FTorch on the same objects (the first migrated calls)
  print '(a, i0)', "parameters: ", torch_model_num_parameters(net%model)
  call torch_optim_set_learning_rate(net%optim, 0.05d0)
  do epoch = 1, 50
    call net%train(inputs, target_tensor, loss)
  end do
  call torch_checkpoint_save(trim(work_dir) // "/pf_checkpoint.pt", net%model, net%optim)
  call net%save(trim(work_dir) // "/pf_mlp_trained.pt")
  print '(a, es10.3)', "loss after 50 more epochs at lr 0.05: ", loss
  print '(a)', "example 12 finished"
end program migration
