!> Training packages from Fortran (run by tests/test_train_package.py, which compares with eager
!> PyTorch). Usage: test_train_package <data dir> <mode> <case>
!>   grads <case>    <case>.pt2 on <case>_x.txt: the training-mode forward recorded, a loss built
!>                   in Fortran from the outputs (sum(out * g) with g from <case>_g.txt), its
!>                   backward; writes the outputs, every parameter gradient, the input gradient and
!>                   the eval-mode outputs (without and with gradients: the gradients of an
!>                   eval-mode forward too) to <case>_got.txt, the state after that forward to
!>                   <case>_state.pt, and after one Adam step the state and the package
!>                   (<case>_stepped.pt, <case>_stepped.pt2) and the outputs of a forward
!>                   without gradients, then loads the saved package back
!>   dropout <case>  the same seed gives the same dropout masks (outputs and gradients), another
!>                   seed others
!>   errors <case>   what a training package refuses, each with its reason
!>   bound <case>    forwards without gradients (the inference model, which reads the state where
!>                   it is) follow the parameters written by `=`, trainable and frozen
!>   older <case>    <case>_older.pt2 (the same package as an earlier FTorch recorded it: no
!>                   compiled step, inference model or eval-mode backward) trains as <case>.pt2 on
!>                   the eager step (run with FTORCH_COMPILED_STEP=0), infers as it in eval mode,
!>                   and refuses eval-mode gradients saying to export it again
!>   memory <case>   200 training steps of forward, Fortran loss and backward: live handles flat
!>   hooks <case>    as grads, with gradient hooks on the package's output (doubles the gradient)
!>                   and on its first parameter (halves it): writes <case>_hooked.txt
!>   float32 <case>  <case>_f32.pt2 (a float32 package), 10 steps of forward, MSE against
!>                   <case>_g.txt, backward and Adam (lr 0.01): writes the losses and the trained
!>                   parameters to <case>_f32_got.txt
module package_hooks
  use ftorch
  implicit none
  integer :: halve_calls = 0
contains
  subroutine double_grad(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 2.0d0
  end subroutine double_grad

  subroutine halve_grad(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 0.5d0
    halve_calls = halve_calls + 1
  end subroutine halve_grad
end module package_hooks

program test_train_package
  use, intrinsic :: iso_fortran_env, only: real64, int64
  use, intrinsic :: iso_fortran_env, only: real32
  use ftorch
  use package_hooks, only: double_grad, halve_grad, halve_calls
  use testing, only: check, summary, data_path
  implicit none
  character(len=64) :: mode, name
  real(real64), allocatable, target :: x(:, :), g(:, :)

  call get_command_argument(2, mode)
  call get_command_argument(3, name)
  call read_matrix(trim(name) // "_x.txt", x)
  call read_matrix(trim(name) // "_g.txt", g)
  select case (trim(mode))
  case ("grads")
    call gradients()
  case ("dropout")
    call dropout()
  case ("errors")
    call errors()
  case ("memory")
    call memory()
  case ("hooks")
    call hooks()
  case ("float32")
    call float32_training()
  case ("bound")
    call bound_state()
  case ("older")
    call older_package()
  case default
    call check(.false., "unknown mode " // trim(mode))
  end select
  call summary()

contains

  subroutine read_matrix(file, a)
    character(len=*), intent(in) :: file
    real(real64), allocatable, intent(out) :: a(:, :)
    integer :: unit, rank, n1, n2
    open(newunit=unit, file=data_path(file), status="old", action="read")
    read(unit, *) rank, n1, n2
    allocate(a(n1, n2))
    read(unit, *) a
    close(unit)
  end subroutine read_matrix

  !> The values of any tensor, flattened in PyTorch's (row-major) order.
  function values_of(t) result(v)
    type(torch_tensor), intent(in) :: t
    real(real64), allocatable, target :: v(:)
    type(torch_tensor) :: flat, tv
    integer(int64), allocatable :: shape(:)
    shape = torch_tensor_get_shape(t)
    allocate(v(product(shape)))
    flat = torch_reshape(t, [size(v)])
    call torch_tensor_from_array(tv, v, torch_kCPU)
    tv = flat
    call torch_delete(tv)
    call torch_delete(flat)
  end function values_of

  subroutine write_values(unit, key, v)
    integer, intent(in) :: unit
    character(len=*), intent(in) :: key
    real(real64), intent(in) :: v(:)
    integer :: i
    write(unit, '(a)', advance="no") key
    do i = 1, size(v)
      write(unit, '(1x,es24.16e3)', advance="no") v(i)
    end do
    write(unit, *)
  end subroutine write_values

  ! The gradients of the model's parameters (keys "<prefix> <name>") and of the input tx (key xkey).
  subroutine write_gradients(unit, model, params, tx, prefix, xkey)
    integer, intent(in) :: unit
    type(torch_model), intent(in) :: model
    type(torch_tensor), intent(in) :: params(:), tx
    character(len=*), intent(in) :: prefix, xkey
    type(torch_tensor) :: grad
    integer :: i
    do i = 1, size(params)
      call torch_tensor_get_gradient(grad, params(i))
      call write_values(unit, prefix // " " // torch_model_parameter_name(model, i), values_of(grad))
      call torch_delete(grad)
    end do
    call torch_tensor_get_gradient(grad, tx)
    call write_values(unit, xkey, values_of(grad))
    call torch_delete(grad)
  end subroutine write_gradients

  ! Forward (recorded), loss = sum(out * g) in Fortran, backward; the outputs and gradients.
  subroutine forward_backward(model, out, tx)
    type(torch_model), intent(in) :: model
    real(real64), intent(inout), target :: out(:, :)
    type(torch_tensor), intent(inout) :: tx
    type(torch_tensor) :: outputs(1), tg, loss
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(outputs(1), out, torch_kCPU)
    call torch_tensor_from_array(tg, g, torch_kCPU)
    call torch_model_forward(model, [tx], outputs, requires_grad=.true.)
    loss = torch_sum(outputs(1) * tg)
    call torch_tensor_backward(loss)
    call torch_delete(loss)
    call torch_delete(tg)
    call torch_delete(outputs)
  end subroutine forward_backward

  subroutine gradients()
    type(torch_model) :: model, evaluated, reloaded
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:), again(:), eparams(:)
    type(torch_tensor) :: tx, ex, inputs(1), outputs(1)
    real(real64), allocatable, target :: out(:, :), evals(:, :)
    integer :: unit, i, n

    call torch_model_load(model, data_path(trim(name) // ".pt2"), torch_kCPU, is_training=.true.)
    call check(torch_model_is_training(model), "loaded in training mode")
    n = torch_model_parameter_count(model)
    allocate(params(n))
    call torch_model_parameters(model, params)
    allocate(out(size(g, 1), size(g, 2)), evals(size(g, 1), size(g, 2)))
    call forward_backward(model, out, tx)
    open(newunit=unit, file=data_path(trim(name) // "_got.txt"), status="replace", action="write")
    call write_values(unit, "out", reshape(transpose(out), [size(out)]))
    call write_gradients(unit, model, params, tx, "grad", "xgrad")
    ! The state after one training-mode forward (batch-norm statistics updated once).
    call torch_model_save(model, data_path(trim(name) // "_state.pt"))

    ! Eval mode, a model loaded fresh (its initial buffers).
    call torch_model_load(evaluated, data_path(trim(name) // ".pt2"), torch_kCPU)
    call check(.not. torch_model_is_training(evaluated), "loaded in eval mode by default")
    call torch_tensor_from_array(inputs(1), x, torch_kCPU)
    call torch_tensor_from_array(outputs(1), evals, torch_kCPU)
    call torch_model_forward(evaluated, inputs, outputs)
    call write_values(unit, "eval", reshape(transpose(evals), [size(evals)]))
    ! Eval-mode gradients of the same model (batch norm on its running statistics, no dropout).
    allocate(eparams(n))
    call torch_model_parameters(evaluated, eparams)
    call forward_backward(evaluated, evals, ex)
    call write_values(unit, "evalout", reshape(transpose(evals), [size(evals)]))
    call write_gradients(unit, evaluated, eparams, ex, "evalgrad", "evalxgrad")
    call torch_delete(eparams)
    call torch_delete(ex)

    ! One Adam step on those gradients; the new state and an updated package written.
    call torch_optim_Adam(optim, params, learning_rate=0.01_real64)
    call torch_optim_step(optim)
    call torch_model_save(model, data_path(trim(name) // "_stepped.pt"))
    call torch_model_save(model, data_path(trim(name) // "_stepped.pt2"))
    ! A forward without gradients after the step reads the stepped parameters (the inference
    ! model reads the state where the optimizer wrote it).
    call torch_tensor_from_array(outputs(1), out, torch_kCPU)
    call torch_model_forward(model, inputs, outputs)
    call write_values(unit, "stepped", reshape(transpose(out), [size(out)]))
    close(unit)
    ! The saved package loads with the stepped parameters.
    call torch_model_load(reloaded, data_path(trim(name) // "_stepped.pt2"), torch_kCPU, is_training=.true.)
    allocate(again(n))
    call torch_model_parameters(reloaded, again)
    do i = 1, n
      call check(all(values_of(again(i)) == values_of(params(i))), &
                 "the saved package holds the trained " // torch_model_parameter_name(model, i))
    end do
    call torch_delete(again)
    call torch_delete(params)
    call torch_delete(tx)
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(optim)
    call torch_delete(reloaded)
    call torch_delete(evaluated)
    call torch_delete(model)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine gradients

  ! Hooks on what the package computes: the output's gradient doubled on its way into the compiled
  ! backward, the first parameter's halved on its way out.
  subroutine hooks()
    type(torch_model) :: model
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: tx, tg, loss, outputs(1)
    real(real64), allocatable, target :: out(:, :)
    integer :: unit, n
    allocate(out(size(g, 1), size(g, 2)))
    call torch_tensor_from_array(outputs(1), out, torch_kCPU)
    call torch_model_load(model, data_path(trim(name) // ".pt2"), torch_kCPU, is_training=.true.)
    n = torch_model_parameter_count(model)
    allocate(params(n))
    call torch_model_parameters(model, params)
    call torch_tensor_register_hook(params(1), halve_grad)
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tg, g, torch_kCPU)
    call torch_model_forward(model, [tx], outputs, requires_grad=.true.)
    call torch_tensor_register_hook(outputs(1), double_grad)
    loss = torch_sum(outputs(1) * tg)
    call torch_tensor_backward(loss)
    open(newunit=unit, file=data_path(trim(name) // "_hooked.txt"), status="replace", action="write")
    call write_gradients(unit, model, params, tx, "grad", "xgrad")
    close(unit)
    ! The training step on a parameter with a hook runs the hook: the compiled step, which writes
    ! gradients directly, steps aside (and for an input that requires grad, whose gradient it
    ! would not compute).
    block
      type(torch_optim) :: optim
      type(torch_tensor) :: plain_x
      integer :: calls
      call torch_optim_Adam(optim, params, learning_rate=1d-3)
      call torch_tensor_from_array(plain_x, x, torch_kCPU)
      calls = halve_calls
      call torch_train_step(model, optim, [plain_x], tg)
      call check(halve_calls == calls + 1, "torch_train_step runs a parameter's gradient hook")
      call optim%zero_grad()
      call torch_train_step(model, optim, [tx], tg)
      call check(tx%requires_grad() .and. halve_calls == calls + 2, &
                 "torch_train_step with an input that requires grad takes autograd's backward")
      call torch_delete(plain_x)
      call torch_delete(optim)
    end block
    call torch_delete(loss)
    call torch_delete(tg)
    call torch_delete(tx)
    call torch_delete(outputs)
    call torch_delete(params)
    call torch_delete(model)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine hooks

  ! Training a float32 package from Fortran: the explicit loop (forward, MSE, backward, Adam).
  subroutine float32_training()
    integer, parameter :: STEPS = 10
    type(torch_model) :: model
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: tx, ty, loss, outputs(1)
    real(real32), allocatable, target :: x32(:, :), y32(:, :), out32(:, :)
    real(real32), target :: loss_value(1)
    real(real64) :: losses(STEPS)
    integer :: unit, i, n, step
    x32 = real(x, real32)
    y32 = real(g, real32)
    allocate(out32(size(g, 1), size(g, 2)))
    call torch_tensor_from_array(outputs(1), out32, torch_kCPU)
    call torch_model_load(model, data_path(trim(name) // "_f32.pt2"), torch_kCPU, is_training=.true.)
    n = torch_model_parameter_count(model)
    allocate(params(n))
    call torch_model_parameters(model, params)
    call check(params(1)%get_dtype() == torch_kFloat32, "the package's parameters are float32")
    call torch_optim_Adam(optim, params, learning_rate=0.01_real64)
    call torch_tensor_from_array(tx, x32, torch_kCPU)
    call torch_tensor_from_array(ty, y32, torch_kCPU)
    call torch_tensor_from_array(loss, loss_value, torch_kCPU)
    do step = 1, STEPS
      call torch_optim_zero_grad(optim)
      call torch_model_forward(model, [tx], outputs, requires_grad=.true.)
      call torch_loss_mse(loss, outputs(1), ty)
      call torch_tensor_backward(loss)
      call torch_optim_step(optim)
      losses(step) = loss_value(1)
    end do
    open(newunit=unit, file=data_path(trim(name) // "_f32_got.txt"), status="replace", action="write")
    call write_values(unit, "losses", losses)
    do i = 1, n
      call write_values(unit, "param " // torch_model_parameter_name(model, i), values_of(params(i)))
    end do
    close(unit)
    call torch_delete(loss)
    call torch_delete(tx)
    call torch_delete(ty)
    call torch_delete(outputs)
    call torch_delete(params)
    call torch_delete(optim)
    call torch_delete(model)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine float32_training

  subroutine dropout()
    type(torch_model) :: model
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: tx, grad
    real(real64), allocatable, target :: out(:, :)
    real(real64), allocatable :: first(:, :), grad_first(:), grad_again(:)

    call torch_model_load(model, data_path(trim(name) // ".pt2"), torch_kCPU, is_training=.true.)
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
    allocate(out(size(g, 1), size(g, 2)))
    call torch_manual_seed(7)
    call forward_backward(model, out, tx)
    first = out
    call torch_tensor_get_gradient(grad, params(1))
    grad_first = values_of(grad)
    call torch_delete(grad)
    call torch_delete(tx)
    ! No zero_grad: the second backward accumulates onto the first gradients.
    call torch_manual_seed(7)
    call forward_backward(model, out, tx)
    call torch_tensor_get_gradient(grad, params(1))
    grad_again = values_of(grad)
    call torch_delete(grad)
    call torch_delete(tx)
    call check(all(out == first), "the same seed: the same dropout masks (outputs)")
    call check(all(grad_again == 2 * grad_first), "the same seed: the same masks in the backward (gradients accumulate)")
    call torch_manual_seed(8)
    call forward_backward(model, out, tx)
    call torch_delete(tx)
    call check(any(out /= first), "another seed: other masks")
    call torch_delete(params)
    call torch_delete(model)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine dropout

  subroutine bound_state()
    type(torch_model) :: model
    type(torch_tensor) :: inputs(1), outputs(1), grad_out(1)
    type(torch_tensor), allocatable :: params(:)
    real(real64), allocatable, target :: out(:, :), first(:, :), recorded(:, :)
    real(real64), allocatable :: w(:)

    call torch_model_load(model, data_path(trim(name) // ".pt2"), torch_kCPU, is_training=.true.)
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
    allocate(out(size(g, 1), size(g, 2)), recorded(size(g, 1), size(g, 2)))
    call torch_tensor_from_array(inputs(1), x, torch_kCPU)
    call torch_tensor_from_array(outputs(1), out, torch_kCPU)
    call torch_tensor_from_array(grad_out(1), recorded, torch_kCPU)
    call torch_model_forward(model, inputs, outputs)
    first = out
    ! `=` into a parameter's handle writes in place (tensors.md), trainable or frozen: the next
    ! forward without gradients reads the new values, as the recorded forward does.
    w = values_of(params(1))
    call torch_no_grad_begin()
    params(1) = params(1) * 2.0_real64
    call torch_no_grad_end()
    call check(all(values_of(params(1)) == 2 * w), "the handle holds the doubled values")
    call torch_model_forward(model, inputs, outputs)
    call check(any(out /= first), "a doubled parameter: other outputs")
    call torch_model_forward(model, inputs, grad_out, requires_grad=.true.)
    call check(all(abs(out - recorded) <= 1e-12_real64 * (1 + abs(recorded))), &
               "the forward without gradients equals the recorded one")
    call torch_model_freeze(model, "")
    params(1) = params(1) * 0.5_real64
    call torch_model_forward(model, inputs, outputs)
    call check(all(abs(out - first) <= 1e-12_real64 * (1 + abs(first))), "a frozen parameter halved back")
    call torch_delete(params)
    call torch_delete(model)
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(grad_out)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine bound_state

  ! A package of an earlier FTorch against this one's: the same steps, the same eval outputs; the
  ! eval-mode gradients it cannot compute refused with the reason.
  subroutine older_package()
    character(len=*), parameter :: suffix(2) = [character(len=10) :: ".pt2", "_older.pt2"]
    type(torch_model) :: models(2), evaluated(2)
    type(torch_optim) :: optims(2)
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: tx, ty, inputs(1), outputs(1)
    real(real64), allocatable, target :: out(:, :, :)
    real(real64), allocatable :: flat(:), trained(:, :)
    real(real64) :: losses(3, 2)
    integer :: k, i, step, stat
    character(len=1024) :: msg

    allocate(out(size(g, 1), size(g, 2), 2))
    call torch_tensor_from_array(tx, x, torch_kCPU)
    call torch_tensor_from_array(ty, g, torch_kCPU)
    do k = 1, 2
      call torch_model_load(models(k), data_path(trim(name) // trim(suffix(k))), torch_kCPU, is_training=.true.)
      allocate(params(torch_model_parameter_count(models(k))))
      call torch_model_parameters(models(k), params)
      call torch_optim_Adam(optims(k), params, learning_rate=0.01_real64)
      do step = 1, 3
        call torch_train_step(models(k), optims(k), [tx], ty, loss=losses(step, k))
      end do
      flat = [(values_of(params(i)), i = 1, size(params))]
      if (k == 1) allocate(trained(size(flat), 2))
      trained(:, k) = flat
      call torch_delete(params)
      deallocate(params)
      ! Eval mode (a fresh load): forwards without gradients.
      call torch_model_load(evaluated(k), data_path(trim(name) // trim(suffix(k))), torch_kCPU)
      call torch_tensor_from_array(inputs(1), x, torch_kCPU)
      call torch_tensor_from_array(outputs(1), out(:, :, k), torch_kCPU)
      call torch_model_forward(evaluated(k), inputs, outputs)
      call torch_delete(inputs)
      call torch_delete(outputs)
    end do
    ! The same compiled forward and backward, and LibTorch's Adam on both: the same numbers.
    call check(all(losses(:, 2) == losses(:, 1)), "the earlier package: the same losses")
    call check(all(trained(:, 2) == trained(:, 1)), "the earlier package: the same trained parameters")
    ! Its eval model against this package's inference model: other compiled kernels for the same
    ! float64 arithmetic (rounding only).
    call check(all(abs(out(:, :, 2) - out(:, :, 1)) <= 1e-12_real64 * (1 + abs(out(:, :, 1)))), &
               "the earlier package: the same eval-mode outputs")
    ! Eval-mode gradients need the model it lacks.
    call torch_tensor_from_array(inputs(1), x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(outputs(1), out(:, :, 2), torch_kCPU)
    msg = ""
    call torch_model_forward(evaluated(2), inputs, outputs, requires_grad=.true., stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "export it again") > 0, "the earlier package: eval-mode gradients refused: " &
               // trim(msg))
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(tx)
    call torch_delete(ty)
    call torch_delete(optims)
    call torch_delete(evaluated)
    call torch_delete(models)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine older_package

  subroutine errors()
    type(torch_model) :: model
    type(torch_tensor) :: inputs(1), outputs(1)
    real(real64), allocatable, target :: out(:, :), wide(:, :)
    real, allocatable, target :: single(:, :)
    integer :: stat
    character(len=1024) :: msg

    call torch_model_load(model, data_path(trim(name) // ".pt2"), torch_kCPU, is_training=.true.)
    allocate(out(size(g, 1), size(g, 2)), single(size(x, 1), size(x, 2)), wide(size(x, 1), size(x, 2) + 1))
    single = real(x)
    call torch_tensor_from_array(inputs(1), single, torch_kCPU)
    call torch_tensor_from_array(outputs(1), out, torch_kCPU)
    msg = ""
    call torch_model_forward(model, inputs, outputs, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DTYPE .and. index(msg, "dtype float32") > 0 .and. index(msg, "float64") > 0, &
               "a float32 input into a float64 package: " // trim(msg))
    call torch_tensor_from_array(inputs(1), wide, torch_kCPU)
    msg = ""
    call torch_model_forward(model, inputs, outputs, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_SHAPE .and. index(msg, "exported for") > 0, &
               "an input of another feature count: " // trim(msg))
    msg = ""
    call torch_model_save(model, "/nonexistent/dir/state.pt", stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_IO .and. index(msg, "/nonexistent/dir/state.pt") > 0, &
               "saving where nothing can be written: " // trim(msg))
    msg = ""
    call torch_manual_seed(-1, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "negative") > 0, "a negative seed: " // trim(msg))
    ! Second derivatives: the compiled backward is once differentiable (a clear error, never zeros).
    block
      type(torch_tensor) :: tx, tv, y(1), jv
      real(real64), allocatable, target :: xv(:, :), vv(:, :), yv(:, :)
      xv = x
      vv = x * 0 + 1
      allocate(yv(size(g, 1), size(g, 2)))
      call torch_tensor_from_array(tx, xv, torch_kCPU, requires_grad=.true.)
      call torch_tensor_from_array(tv, vv, torch_kCPU)
      call torch_tensor_from_array(y(1), yv, torch_kCPU)
      call torch_model_forward(model, [tx], y, requires_grad=.true.)
      msg = ""
      call torch_autograd_jvp(jv, y(1), tx, tv, stat=stat, errmsg=msg)
      call check(stat /= 0 .and. index(msg, "once differentiable") > 0, &
                 "a Jacobian-vector product through a package is an error, not zeros: " // trim(msg))
      call torch_delete(tx)
      call torch_delete(tv)
      call torch_delete(y)
      call torch_delete(jv)
    end block
    ! Freezing is kept by a saved package, as a TorchScript file keeps requires_grad.
    block
      type(torch_model) :: reloaded
      type(torch_tensor) :: w
      call torch_model_freeze(model, "fc.weight")
      call torch_model_save(model, data_path(trim(name) // "_frozen.pt2"))
      call torch_model_load(reloaded, data_path(trim(name) // "_frozen.pt2"), torch_kCPU, is_training=.true.)
      call torch_model_parameter(reloaded, "fc.weight", w)
      call check(.not. w%requires_grad(), "a parameter frozen before torch_model_save stays frozen when reloaded")
      call torch_delete(w)
      call torch_delete(reloaded)
    end block
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(model)
    ! A package for inference only (--pt2) refuses training and says what to export instead.
    msg = ""
    call torch_model_load(model, data_path(trim(name) // "_inference.pt2"), torch_kCPU, is_training=.true., &
                          stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "--train") > 0, "an inference package loaded for training: " // trim(msg))
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine errors

  subroutine memory()
    type(torch_model) :: model
    type(torch_tensor) :: tx
    real(real64), allocatable, target :: out(:, :)
    integer(int64) :: before
    integer :: step

    call torch_model_load(model, data_path(trim(name) // ".pt2"), torch_kCPU, is_training=.true.)
    allocate(out(size(g, 1), size(g, 2)))
    do step = 1, 200
      call forward_backward(model, out, tx)
      call torch_delete(tx)
      if (step == 10) before = ftorch_live_handles()
    end do
    call check(ftorch_live_handles() == before, "live handles flat over 190 training steps")
    call torch_delete(model)
    call check(ftorch_live_handles() == 0, "every handle released")
  end subroutine memory
end program test_train_package
