!> Example 7: differentiating through a Fortran time loop.
!>
!> A 1-D periodic diffusion solver steps its own array, `u = u + dt * kappa * (L u)`, written as
!> the Fortran line it is (`x = f(x)` on a tensor that wraps the array). Backward through all the
!> steps gives d(loss)/d(kappa), and a few gradient-descent iterations recover the diffusivity
!> that produced an observed final state: calibrating a model parameter through the solver.
program time_stepping
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  integer, parameter :: n = 32, nsteps = 50, iterations = 60
  real(real64), parameter :: dt = 0.1_real64, kappa_true = 0.8_real64, lr = 10.0_real64
  real(real64), target :: u(n), u0(n), observed(n), lap(n, n), kappa(1), dkappa(1), loss_value(1)
  type(torch_tensor) :: tu, tu0, tobs, tlap, tkappa, tgrad, tloss
  integer :: i, step, it
  real(real64), parameter :: pi = acos(-1.0_real64)

  ! Initial state and the periodic Laplacian (as a matrix: u_{i-1} - 2 u_i + u_{i+1}).
  do i = 1, n
    u0(i) = sin(2 * pi * (i - 1) / n) + 0.5_real64 * cos(6 * pi * (i - 1) / n)
  end do
  lap = 0
  do i = 1, n
    lap(i, i) = -2
    lap(i, modulo(i, n) + 1) = 1
    lap(i, modulo(i - 2, n) + 1) = 1
  end do
  call torch_tensor_from_array(tu, u, torch_kCPU)
  call torch_tensor_from_array(tu0, u0, torch_kCPU)
  call torch_tensor_from_array(tobs, observed, torch_kCPU)
  call torch_tensor_from_array(tlap, lap, torch_kCPU)   ! tlap[i-1, j-1] = lap(i, j)
  call torch_tensor_from_array(tkappa, kappa, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(tgrad, dkappa, torch_kCPU)
  call torch_tensor_from_array(tloss, loss_value, torch_kCPU)

  ! The "observation": the same solver run with the true diffusivity, without autograd.
  kappa = kappa_true
  call torch_no_grad_begin()
  tu = tu0
  do step = 1, nsteps
    tu = tu + dt * tkappa * torch_matmul(tlap, tu)
  end do
  call torch_no_grad_end()
  observed = u

  ! Calibration: start from a wrong diffusivity and descend the gradient through the time loop.
  kappa = 0.3_real64
  do it = 1, iterations
    tu = tu0
    do step = 1, nsteps
      tu = tu + dt * tkappa * torch_matmul(tlap, tu)   ! u receives every step's values
    end do
    tloss = torch_mean((tu - tobs) ** 2)
    call tkappa%zero_grad()
    call torch_tensor_backward(tloss)
    call torch_tensor_get_gradient(tgrad, tkappa)
    if (mod(it, 10) == 0) print '(a,i3,a,es10.3,a,f8.5)', "iteration", it, "  loss", loss_value(1), "  kappa", kappa(1)
    kappa = kappa - lr * dkappa       ! a plain Fortran update of the array behind the leaf tensor
  end do
  print '(a,f8.5,a,f8.5)', "recovered kappa =", kappa(1), "   true kappa =", kappa_true
  if (abs(kappa(1) - kappa_true) > 1e-3_real64) error stop "calibration did not converge"

  call torch_delete(tu); call torch_delete(tu0); call torch_delete(tobs); call torch_delete(tlap)
  call torch_delete(tkappa); call torch_delete(tgrad); call torch_delete(tloss)
  print '(a)', "example 7 finished"
end program time_stepping
