!> Benchmark, Fortran side (through FTorch). Usage:
!>   bench_fortran train|infer|idiom <model.pt> <batch> <inputs> <outputs> <iterations>
!>     (idiom: upstream FTorch's explicit training step -- zero_grad, forward into a tensor over a
!>      Fortran array, torch_loss_mse into a tensor over a one-element array, backward, Adam step)
!>   bench_fortran ops <elements> <iterations>
!>   bench_fortran from_array <elements> <iterations>
!>   bench_fortran custom|builtin <elements> <iterations>   (y = x*x and backward, as a custom
!>                                                            function or with built-in operators)
!>   bench_fortran rss <model.pt> <batch> <inputs> <outputs> <iterations>
!> Prints "seconds <total of the timed loop>" and "peak_rss_kib <n>" (rss: rss_at_1000 and rss_at_end).
!> y = x*x as a custom function: forward and hand-written backward.
module bench_square
  use ftorch
  implicit none
contains
  subroutine square_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call ctx%save_for_backward(inputs)
    outputs(1) = inputs(1) * inputs(1)
  end subroutine square_forward

  subroutine square_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x
    call ctx%saved_tensor(1, x)
    grad_inputs(1) = grad_outputs(1) * 2 * x
    call torch_delete(x)
  end subroutine square_backward
end module bench_square

program bench_fortran
  use, intrinsic :: iso_fortran_env, only: int64, real64
  use ftorch
  use bench_square
  implicit none
  character(len=32) :: mode
  character(len=4096) :: path
  integer :: batch, n_in, n_out, iters, n

  call get_command_argument(1, mode)
  select case (trim(mode))
  case ("train", "infer", "rss", "compiled", "idiom")
    call get_command_argument(2, path)
    batch = int_arg(3); n_in = int_arg(4); n_out = int_arg(5); iters = int_arg(6)
    call model_case(trim(mode), trim(path), batch, n_in, n_out, iters)
  case ("pymodule", "pycall")
    call get_command_argument(2, path)
    batch = int_arg(3); n_in = int_arg(4); n_out = int_arg(5); iters = int_arg(6)
    call pymodule_case(trim(mode), trim(path), batch, n_in, n_out, iters)
  case ("ops")
    n = int_arg(2); iters = int_arg(3)
    call ops_case(n, iters)
  case ("from_array")
    n = int_arg(2); iters = int_arg(3)
    call from_array_case(n, iters)
  case ("custom", "builtin")
    n = int_arg(2); iters = int_arg(3)
    call autograd_case(trim(mode) == "custom", n, iters)
  case default
    error stop "unknown mode"
  end select
  print '(a,i0)', "peak_rss_kib ", status_kib("VmHWM:")

contains

  subroutine model_case(mode, path, batch, n_in, n_out, iters)
    character(len=*), intent(in) :: mode, path
    integer, intent(in) :: batch, n_in, n_out, iters
    real(real64), allocatable, target :: x(:,:), y(:,:), pred(:,:)
    real(real64), target :: loss_value(1)
    type(torch_model) :: model
    type(torch_optim) :: optim
    type(torch_tensor) :: inputs(1), outputs(1), target, tloss
    type(torch_tensor), allocatable :: params(:)
    real(real64) :: loss
    integer :: i, warm
    integer(int64) :: t0
    logical :: forward_only, rss, idiom
    allocate(x(batch, n_in), y(batch, n_out), pred(batch, n_out))
    call random_number(x)
    call random_number(y)
    call torch_model_load(model, path, torch_kCPU, is_training=(mode /= "infer" .and. mode /= "compiled"))
    if (mode /= "compiled") then  ! an AOTInductor package (.pt2) runs forward only
      allocate(params(torch_model_parameter_count(model)))
      call torch_model_parameters(model, params)
      call torch_optim_Adam(optim, params, learning_rate=1.0d-4)
    end if
    call torch_tensor_from_array(inputs(1), x, torch_kCPU)
    call torch_tensor_from_array(outputs(1), pred, torch_kCPU)
    call torch_tensor_from_array(target, y, torch_kCPU)
    call torch_tensor_from_array(tloss, loss_value, torch_kCPU)
    warm = max(10, iters / 10)
    forward_only = mode == "infer" .or. mode == "compiled"  ! compared once, not per step
    rss = mode == "rss"
    idiom = mode == "idiom"
    do i = 1, warm + iters
      if (i == warm + 1) t0 = ticks()
      if (forward_only) then
        call torch_model_forward(model, inputs, outputs)
      else if (idiom) then
        call torch_optim_zero_grad(optim)
        call torch_model_forward(model, inputs, outputs, requires_grad=.true.)
        call torch_loss_mse(tloss, outputs(1), target)
        call torch_tensor_backward(tloss)
        call torch_optim_step(optim)
        loss = loss_value(1)
      else
        call torch_train_step(model, optim, inputs, target, loss)
      end if
      if (rss .and. i == warm + 1000) print '(a,i0)', "rss_at_1000 ", status_kib("VmRSS:")
    end do
    print '(a,es16.8)', "seconds ", seconds_since(t0)
    if (mode == "rss") print '(a,i0)', "rss_at_end ", status_kib("VmRSS:")
  end subroutine model_case

  subroutine ops_case(n, iters)
    integer, intent(in) :: n, iters
    real(real64), allocatable, target :: a(:), b(:), c(:)
    type(torch_tensor) :: ta, tb, tc
    integer :: i, warm
    integer(int64) :: t0
    allocate(a(n), b(n), c(n))
    call random_number(a)
    call random_number(b)
    call torch_tensor_from_array(ta, a, torch_kCPU)
    call torch_tensor_from_array(tb, b, torch_kCPU)
    call torch_tensor_from_array(tc, c, torch_kCPU)
    warm = max(10, iters / 10)
    do i = 1, warm + iters
      if (i == warm + 1) t0 = ticks()
      tc = ta * tb + ta - tb / 2
    end do
    print '(a,es16.8)', "seconds ", seconds_since(t0)
  end subroutine ops_case

  subroutine from_array_case(n, iters)
    integer, intent(in) :: n, iters
    real(real64), allocatable, target :: a(:)
    type(torch_tensor) :: t
    integer :: i, warm
    integer(int64) :: t0
    allocate(a(n))
    a = 1
    warm = max(10, iters / 10)
    do i = 1, warm + iters
      if (i == warm + 1) t0 = ticks()
      call torch_tensor_from_array(t, a, torch_kCPU)
      call torch_tensor_delete(t)
    end do
    print '(a,es16.8)', "seconds ", seconds_since(t0)
  end subroutine from_array_case

  ! One application of y = x*x and backward of sum(y), then the gradient zeroed.
  subroutine autograd_case(custom, n, iters)
    logical, intent(in) :: custom
    integer, intent(in) :: n, iters
    real(real64), allocatable, target :: a(:)
    type(torch_tensor) :: x, y(1)
    type(torch_function) :: square
    integer :: i, warm
    integer(int64) :: t0
    allocate(a(n))
    call random_number(a)
    call torch_tensor_from_array(x, a, torch_kCPU, requires_grad=.true.)
    call torch_function_define(square, "Square", square_forward, square_backward)
    warm = max(10, iters / 10)
    do i = 1, warm + iters
      if (i == warm + 1) t0 = ticks()
      if (custom) then
        call torch_function_apply(square, [x], y)
      else
        y(1) = x * x
      end if
      call torch_tensor_backward(torch_sum(y(1)))
      call x%zero_grad()
    end do
    print '(a,es16.8)', "seconds ", seconds_since(t0)
    call torch_delete(y)
    call torch_delete(x)
  end subroutine autograd_case

  ! The training step of model_case written in Python (bench/python/pystep.py, argument 7), called
  ! through torch_pymodule each step ("pymodule"); or an empty Python function ("pycall").
  subroutine pymodule_case(mode, path, batch, n_in, n_out, iters)
    character(len=*), intent(in) :: mode, path
    integer, intent(in) :: batch, n_in, n_out, iters
    real(real64), allocatable, target :: x(:,:), y(:,:)
    type(torch_pymodule) :: pystep
    type(torch_tensor) :: xt, yt
    type(torch_arglist) :: args, results
    character(len=4096) :: script
    character(len=:), allocatable :: fn
    real(real64) :: loss
    integer :: i, warm
    integer(int64) :: t0
    call get_command_argument(7, script)
    allocate(x(batch, n_in), y(batch, n_out))
    call random_number(x)
    call random_number(y)
    call torch_pymodule_load(pystep, trim(script))
    call torch_arglist_add(args, path)
    call torch_pymodule_call(pystep, "setup", args)
    call torch_tensor_from_array(xt, x, torch_kCPU)
    call torch_tensor_from_array(yt, y, torch_kCPU)
    call torch_arglist_clear(args)
    call torch_arglist_add(args, xt)
    call torch_arglist_add(args, yt)
    fn = "step"
    if (mode == "pycall") fn = "noop"
    warm = max(10, iters / 10)
    do i = 1, warm + iters
      if (i == warm + 1) then
        call torch_pymodule_call(pystep, "reset", torch_arglist())
        t0 = ticks()
      end if
      call torch_pymodule_call(pystep, fn, args, results)
      call torch_arglist_get(results, 1, loss)
    end do
    print '(a,es16.8)', "seconds ", seconds_since(t0)
    call torch_pymodule_call(pystep, "inner_seconds", torch_arglist(), results)
    call torch_arglist_get(results, 1, loss)
    print '(a,es16.8)', "inner_seconds ", loss
  end subroutine pymodule_case

  integer(int64) function ticks()
    call system_clock(ticks)
  end function ticks

  real(real64) function seconds_since(t0)
    integer(int64), intent(in) :: t0
    integer(int64) :: t1, rate
    call system_clock(t1, rate)
    seconds_since = real(t1 - t0, real64) / real(rate, real64)
  end function seconds_since

  integer function int_arg(i)
    integer, intent(in) :: i
    character(len=32) :: s
    call get_command_argument(i, s)
    read(s, *) int_arg
  end function int_arg

  integer(int64) function status_kib(key)
    character(len=*), intent(in) :: key
    character(len=256) :: line
    integer :: unit, ios
    status_kib = -1
    open(newunit=unit, file="/proc/self/status", action="read", iostat=ios)
    if (ios /= 0) return
    do
      read(unit, '(a)', iostat=ios) line
      if (ios /= 0) exit
      if (index(line, key) == 1) read(line(len(key) + 1:), *) status_kib
    end do
    close(unit)
  end function status_kib
end program bench_fortran
