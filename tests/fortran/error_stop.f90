!> Failures without stat: each case must end the program with `error stop` and a message naming
!> the procedure and LibTorch's reason (pytest checks the exit status and the message).
!> Usage: error_stop <data dir> <case>
program error_stop
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  use ftorch_types, only: torch_kFloat16
  use testing, only: data_path
  implicit none
  character(len=64) :: which
  type(torch_model) :: model
  type(torch_tensor) :: t(2), out(1), never
  real(real64), target :: x(5), x4(4), y(5)
  integer :: rank

  x = 1.0d0
  call get_command_argument(2, which)
  select case (trim(which))
  case ("python_exception")
    block
      type(torch_pymodule) :: py
      type(torch_arglist) :: args
      call torch_pymodule_load(py, data_path("py_raises.py"))
      call torch_arglist_add(args, "boom")
      call torch_pymodule_call(py, "fail", args)
    end block
  case ("missing_file")
    call torch_model_load(model, data_path("does_not_exist.pt"), torch_kCPU)
  case ("corrupt_file")
    call torch_model_load(model, data_path("corrupt.pt"), torch_kCPU)
  case ("wrong_shape")
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU)
    call torch_tensor_from_array(t(1), x4, torch_kCPU)
    call torch_tensor_from_array(out(1), y, torch_kCPU)
    call torch_model_forward(model, t(1:1), out)
  case ("wrong_inputs")
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU)
    call torch_tensor_from_array(t(1), x, torch_kCPU)
    call torch_tensor_from_array(t(2), x, torch_kCPU)
    call torch_tensor_from_array(out(1), y, torch_kCPU)
    call torch_model_forward(model, t, out)
  case ("cuda_tensor")
    call torch_tensor_from_array(t(1), x, torch_kCUDA)
  case ("cuda_model")
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCUDA)
  case ("dtype")
    call torch_tensor_zeros(t(1), 1, [2_c_int64_t], torch_kFloat16, torch_kCPU)
  case ("unconstructed")
    rank = never%get_rank()
    print *, rank
  case ("shape_mismatch_add")
    call torch_tensor_from_array(t(1), x, torch_kCPU)
    call torch_tensor_from_array(t(2), x4, torch_kCPU)
    out(1) = t(1) + t(2)
  case ("backward_no_grad")
    call torch_tensor_from_array(t(1), x, torch_kCPU)
    call torch_tensor_backward(t(1))
  case ("gradient_before_backward")
    call torch_tensor_from_array(t(1), x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_get_gradient(t(2), t(1))
  case ("implicit_backward_non_scalar")
    call torch_tensor_from_array(t(1), x, torch_kCPU, requires_grad=.true.)
    out(1) = t(1) * 2
    call torch_tensor_backward(out(1))
  case ("version")
    call torch_tensor_zeros(t(1), 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
  case default
    print '(a)', "unknown case " // trim(which)
    stop 2
  end select
  print '(a)', "not reached: the call above should have stopped the program"
end program error_stop
