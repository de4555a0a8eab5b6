!> Example 3: recoverable errors. With stat= a failure returns a code and a message instead of
!> stopping the program, so a long simulation can fall back and carry on.
!> Usage: errors <directory holding parameterisation.pt>
program errors
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  type(torch_model) :: model
  type(torch_tensor) :: inputs(1), outputs(1), flat
  real(real64), target :: state(16, 8), tendency(16, 8), wrong(16, 5)
  character(len=4096) :: dir
  character(len=512) :: msg
  integer :: stat, device
  logical :: use_ml

  call get_command_argument(1, dir)
  state = 0.5_real64

  ! A missing file: keep running with the physics scheme instead.
  call torch_model_load(model, trim(dir) // "/no_such_model.pt", torch_kCPU, stat=stat, errmsg=msg)
  if (stat /= FTORCH_OK) print '(a,i0,a,a)', "load failed, code ", stat, ": ", trim(msg)

  ! A GPU that is not there is an error, never a silent fall-back to the CPU.
  call torch_model_load(model, trim(dir) // "/parameterisation.pt", torch_kCUDA, stat=stat, errmsg=msg)
  if (stat == FTORCH_ERR_DEVICE) print '(a)', "no GPU: " // trim(msg)

  ! Choose the device at run time: the model and its tensors on the GPU when there is one (there
  ! a tensor made from an array is a copy on the device, so results are copied back below).
  device = torch_kCPU
  if (torch_device_available(torch_kCUDA)) device = torch_kCUDA
  call torch_model_load(model, trim(dir) // "/parameterisation.pt", device, stat=stat, errmsg=msg)
  use_ml = stat == FTORCH_OK

  ! A wrong input shape: LibTorch's reason comes back in errmsg; the model stays usable.
  call torch_tensor_from_array(inputs(1), wrong, device)
  call torch_tensor_from_array(outputs(1), tendency, device)
  call torch_model_forward(model, inputs, outputs, stat=stat, errmsg=msg)
  print '(a,i0,a,a)', "forward with 5 levels: stat = ", stat, ", ", msg(1:index(msg, ":") - 1)

  call torch_tensor_from_array(inputs(1), state, device)
  call torch_model_forward(model, inputs, outputs, stat=stat, errmsg=msg)
  print '(a,i0)', "forward with 8 levels: stat = ", stat
  if (stat == FTORCH_OK .and. device /= torch_kCPU) call torch_tensor_to_array(outputs(1), tendency)
  if (.not. use_ml .or. stat /= FTORCH_OK) error stop "example 3: the model should work on the chosen device"

  ! Without stat=, the same failure would stop the program with
  ! "ERROR STOP [torch_model_forward] forward failed: ...".

  ! Functions and operators cannot take stat=: a catch scope collects their first failure.
  call torch_catch_begin()
  flat = torch_reshape(inputs(1), [100])      ! 128 elements: not a valid shape
  call torch_catch_end(stat, msg)
  print '(a,i0,a,a)', "reshape in a catch scope: stat = ", stat, ", ", trim(msg)
  if (stat == FTORCH_OK) error stop "example 3: the reshape should have failed"
  call torch_delete(inputs)
  call torch_delete(outputs)
  call torch_delete(model)
  print '(a)', "example 3 finished"
end program errors
