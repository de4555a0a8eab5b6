! Example 9: a hybrid model trained online. A TorchScript network maps a forcing profile to a
! field; a Fortran physics routine advances the field one time step (periodic diffusion with a
! cubic sink); the loss compares the result with the truth. The physics is a custom autograd
! function whose backward is its hand-written adjoint, so training reaches the network's weights
! through the Fortran code. The adjoint is checked against finite differences (gradcheck) and,
! since this physics can also be written with tensor operations, against LibTorch's autograd.
module physics
  use, intrinsic :: iso_fortran_env, only: real64, int64
  use ftorch
  implicit none
  private
  public :: physics_forward, physics_backward, physics_step, step_field, n, dt, kappa

  integer, parameter :: wp = real64, n = 16
  real(wp), parameter :: dt = 0.1_wp, kappa = 0.5_wp

contains

  ! The Fortran physics, on plain arrays: q = u + dt (kappa laplacian(u) - u^3), periodic.
  pure subroutine step_field(u, q)
    real(wp), intent(in) :: u(:, :)   ! (batch, n)
    real(wp), intent(out) :: q(:, :)
    q = u + dt * (kappa * laplacian(u) - u**3)
  end subroutine step_field

  ! Its adjoint: g_u = g + dt (kappa laplacian(g) - 3 u^2 g) (the periodic laplacian is symmetric).
  pure subroutine step_field_adjoint(u, g, gu)
    real(wp), intent(in) :: u(:, :), g(:, :)
    real(wp), intent(out) :: gu(:, :)
    gu = g + dt * (kappa * laplacian(g) - 3 * u**2 * g)
  end subroutine step_field_adjoint

  pure function laplacian(u) result(l)
    real(wp), intent(in) :: u(:, :)
    real(wp) :: l(size(u, 1), size(u, 2))
    l = cshift(u, 1, dim=2) - 2 * u + cshift(u, -1, dim=2)
  end function laplacian

  ! Forward of the custom function: tensor -> Fortran array -> physics -> tensor.
  subroutine physics_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    real(wp), allocatable, target :: u(:, :), q(:, :)
    integer :: batch
    type(torch_tensor) :: tq
    batch = batch_size(inputs(1))
    allocate(u(batch, n), q(batch, n))
    call torch_tensor_to_array(inputs(1), u)
    call step_field(u, q)
    call ctx%save_for_backward([inputs(1)])
    call torch_tensor_from_array(tq, q, torch_kCPU)
    outputs(1) = torch_clone(tq)   ! q is local: the output owns a copy
    call torch_delete(tq)
  end subroutine physics_forward

  ! Backward: the adjoint, on Fortran arrays.
  subroutine physics_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    real(wp), allocatable, target :: u(:, :), g(:, :), gu(:, :)
    type(torch_tensor) :: saved, tg
    integer :: batch
    call ctx%saved_tensor(1, saved)
    batch = batch_size(saved)
    allocate(u(batch, n), g(batch, n), gu(batch, n))
    call torch_tensor_to_array(saved, u)
    call torch_tensor_to_array(grad_outputs(1), g)
    call step_field_adjoint(u, g, gu)
    call torch_tensor_from_array(tg, gu, torch_kCPU)
    grad_inputs(1) = torch_clone(tg)
    call torch_delete(tg)
    call torch_delete(saved)
  end subroutine physics_backward

  integer function batch_size(t)
    type(torch_tensor), intent(in) :: t
    integer(int64), pointer :: extents(:)
    extents => t%get_shape()
    batch_size = int(extents(1))
  end function batch_size

  ! The physics as a function of tensors (for torch_gradcheck).
  subroutine physics_step(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_function), save :: fn
    if (.not. associated(fn%forward)) call torch_function_define(fn, "physics", physics_forward, physics_backward)
    call torch_function_apply(fn, inputs, outputs, stat=stat, errmsg=errmsg)
  end subroutine physics_step
end module physics

program hybrid_physics
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  use physics
  implicit none
  integer, parameter :: wp = real64, batch = 8
  real(wp), target :: forcing(batch, n), truth(batch, n), field(batch, n), lap(n, n), u0(3, n)
  type(torch_model) :: net
  type(torch_optim) :: optim
  type(torch_tensor) :: inputs(1), target, fields(1), stepped(1), loss, tlap, tu0, reference
  type(torch_tensor), allocatable :: params(:), grads_fortran(:), grads_torch(:)
  type(torch_function) :: physics_fn
  type(torch_gradcheck_result) :: check
  character(len=4096) :: dir
  real(wp) :: first, last, worst
  real(wp), target :: loss_value(1)
  integer :: step, i, j, k

  call get_command_argument(1, dir)
  call torch_model_load(net, trim(dir) // "/fieldnet.pt", torch_kCPU, is_training=.true.)
  allocate(params(torch_model_parameter_count(net)))
  call torch_model_parameters(net, params)
  call torch_optim_Adam(optim, params, learning_rate=1.0e-2_wp)
  call torch_function_define(physics_fn, "physics", physics_forward, physics_backward)

  ! 1. The adjoint against finite differences.
  do j = 1, n
    do i = 1, 3
      u0(i, j) = 0.8_wp * sin(0.9_wp * i + 0.4_wp * j)
    end do
  end do
  call torch_tensor_from_array(tu0, u0, torch_kCPU, requires_grad=.true.)
  if (.not. torch_gradcheck(physics_step, [tu0], result=check)) error stop "example 9: gradcheck failed"
  print '(a,es9.2)', "gradcheck of the Fortran adjoint passed; worst |analytic - numeric| = ", check%max_error

  call torch_tensor_from_array(inputs(1), forcing, torch_kCPU)
  call torch_tensor_from_array(target, truth, torch_kCPU)
  call torch_tensor_from_array(fields(1), field, torch_kCPU)

  ! 2. One step's weight gradients through the Fortran adjoint and through the same physics in
  !    tensor operations (the laplacian as a matrix): LibTorch's autograd is the reference.
  call make_data(0.0_wp)
  allocate(grads_fortran(size(params)), grads_torch(size(params)))
  call torch_model_forward(net, inputs, fields, requires_grad=.true.)
  call torch_function_apply(physics_fn, fields, stepped)
  call torch_loss_mse(loss, stepped(1), target)
  call torch_tensor_backward(loss)
  do k = 1, size(params)
    call torch_tensor_get_gradient(grads_fortran(k), params(k))
  end do
  call torch_optim_zero_grad(optim)
  lap = 0
  do j = 1, n
    lap(j, j) = -2
    lap(modulo(j, n) + 1, j) = 1
    lap(modulo(j - 2, n) + 1, j) = 1
  end do
  call torch_tensor_from_array(tlap, lap, torch_kCPU)
  call torch_model_forward(net, inputs, fields, requires_grad=.true.)
  reference = fields(1) + dt * (kappa * torch_matmul(fields(1), tlap) - fields(1) ** 3)
  call torch_loss_mse(loss, reference, target)
  call torch_tensor_backward(loss)
  worst = 0
  do k = 1, size(params)
    call torch_tensor_get_gradient(grads_torch(k), params(k))
    worst = max(worst, abs_difference(grads_fortran(k), grads_torch(k)))
  end do
  print '(a,es9.2)', "weight gradients, Fortran adjoint vs tensor operations: largest difference ", worst
  ! The two paths sum the laplacian in different orders (stencil vs matrix product): rounding only.
  if (worst > 1e-12_wp) error stop "example 9: adjoint gradients differ"
  call torch_optim_zero_grad(optim)

  ! 3. Online training through the Fortran physics.
  do step = 1, 300
    call make_data(0.05_wp * step)
    call torch_model_forward(net, inputs, fields, requires_grad=.true.)
    call torch_function_apply(physics_fn, fields, stepped)
    call torch_loss_mse(loss, stepped(1), target)
    call torch_optim_zero_grad(optim)
    call torch_tensor_backward(loss)
    call torch_optim_step(optim)
    call torch_tensor_to_array(torch_reshape(loss, [1]), loss_value)
    if (step == 1) first = loss_value(1)
    last = loss_value(1)
    if (mod(step, 100) == 0) print '(a,i4,a,es10.3)', "step", step, "  loss", last
  end do
  print '(a,es10.3,a,es10.3)', "loss: first step", first, ", last step", last
  if (.not. (last < 0.05_wp * first)) error stop "example 9: the hybrid model did not learn"

  call torch_delete(params); call torch_delete(grads_fortran); call torch_delete(grads_torch)
  call torch_delete(inputs); call torch_delete(fields); call torch_delete(stepped); call torch_delete(target)
  call torch_delete(loss); call torch_delete(tlap); call torch_delete(tu0); call torch_delete(reference)
  call torch_delete(optim); call torch_delete(net)
  print '(a)', "example 9 finished"

contains

  ! Forcing of this time step, and the truth: the physics applied to the field it should produce.
  subroutine make_data(t)
    real(wp), intent(in) :: t
    real(wp) :: u_true(batch, n)
    integer :: b, p
    do p = 1, n
      do b = 1, batch
        forcing(b, p) = sin(0.4_wp * p + 0.7_wp * b + t)
      end do
    end do
    u_true = 0.5_wp * tanh(forcing) + 0.2_wp * cshift(forcing, 1, dim=2)
    call step_field(u_true, truth)
  end subroutine make_data

  ! sum |a - b| (bounds the largest difference)
  real(wp) function abs_difference(a, b)
    type(torch_tensor), intent(in) :: a, b
    type(torch_tensor) :: d
    real(wp), target :: m(1)
    d = torch_reshape(torch_sum(torch_abs(a - b)), [1])
    call torch_tensor_to_array(d, m)
    abs_difference = m(1)
    call torch_delete(d)
  end function abs_difference
end program hybrid_physics
