!> Example 4: automatic differentiation of Fortran tensor expressions.
!>
!> Q = a*b and P = a+b for a = [2, 3], b = [6, 4]; gradients read back into Fortran arrays;
!> zero_grad; retain_graph; then Q re-assigned to 3*(a**3 - b*b/3) and its gradient checked
!> against the analytic one, dQ/da = 9a**2 and dQ/db = -2b.
program autograd
  use, intrinsic :: iso_fortran_env, only: real64
  ! Importing one by one works too; assignment(=) must come with the type.
  use ftorch, only: torch_tensor, torch_kCPU, torch_tensor_from_array, torch_delete, assignment(=), &
                    operator(*), operator(+), operator(-), operator(/), operator(**), torch_tensor_backward, &
                    torch_tensor_get_gradient
  implicit none

  real(real64), target :: a(2), b(2), q(2), p(2), ones(2), da(2), db(2)
  type(torch_tensor) :: ta, tb, tq, tp, external_gradient, grad_a, grad_b

  a = [2.0_real64, 3.0_real64]
  b = [6.0_real64, 4.0_real64]
  ones = 1.0_real64
  call torch_tensor_from_array(ta, a, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(tb, b, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(tq, q, torch_kCPU)
  call torch_tensor_from_array(tp, p, torch_kCPU)
  call torch_tensor_from_array(external_gradient, ones, torch_kCPU)
  call torch_tensor_from_array(grad_a, da, torch_kCPU)   ! gradients land in da and db
  call torch_tensor_from_array(grad_b, db, torch_kCPU)

  tq = ta * tb        ! the values land in q, the graph is kept in tq
  tp = ta + tb
  print '(a,2f8.2,a,2f8.2)', "Q = a*b =", q, "    P = a+b =", p

  ! Q is not a scalar: backward takes the gradient of the objective with respect to Q.
  call torch_tensor_backward(tq, external_gradient, retain_graph=.true.)
  call torch_tensor_get_gradient(grad_a, ta)
  call torch_tensor_get_gradient(grad_b, tb)
  print '(a,2f8.2,a,2f8.2)', "dQ/da =", da, "    dQ/db =", db

  ! Gradients accumulate: a second backward through the retained graph doubles them.
  call torch_tensor_backward(tq, external_gradient)
  call torch_tensor_get_gradient(grad_a, ta)
  print '(a,2f8.2)', "dQ/da after a second backward =", da

  call ta%zero_grad()
  call tb%zero_grad()
  call torch_tensor_backward(tp, external_gradient)
  call torch_tensor_get_gradient(grad_a, ta)
  call torch_tensor_get_gradient(grad_b, tb)
  print '(a,2f8.2,a,2f8.2)', "dP/da =", da, "    dP/db =", db

  ! Assignment replaces Q's value and history: backward again works on the new expression.
  call ta%zero_grad()
  call tb%zero_grad()
  tq = 3 * (ta**3 - tb * tb / 3)
  call torch_tensor_backward(tq, external_gradient)
  call torch_tensor_get_gradient(grad_a, ta)
  call torch_tensor_get_gradient(grad_b, tb)
  print '(a,2f8.2,a,2f8.2)', "Q = 3*(a**3 - b*b/3): dQ/da =", da, "    dQ/db =", db
  if (any(abs(da - 9 * a**2) > 1.0e-12_real64 * 9 * a**2) .or. any(abs(db + 2 * b) > 1.0e-12_real64 * 2 * b)) then
    error stop "example 4: gradient differs from the analytic one"
  end if

  call torch_delete(ta); call torch_delete(tb); call torch_delete(tq); call torch_delete(tp)
  call torch_delete(external_gradient); call torch_delete(grad_a); call torch_delete(grad_b)
  print '(a)', "example 4 finished"
end program autograd
