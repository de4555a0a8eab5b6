!> The functional gradient API (PyTorch’s `torch.autograd.grad`, Jacobians, vector products) and
!> the gradient check (`torch.autograd.gradcheck`).
!>
!> Results go into the given tensors as `=` does: a constructed tensor (over a Fortran array, say)
!> receives the values in its memory (same shape), an unconstructed one becomes the result. With
!> `create_graph`, results carry their own graph, so a loss built from them (a physics-informed
!> residual containing d(network)/d(input)) can be backpropagated to the weights.
module ftorch_functional
  use, intrinsic :: iso_c_binding, only: c_double, c_funloc, c_funptr, c_int, c_int64_t, c_loc, c_null_ptr, c_ptr
  use ftorch_kinds, only: int64, real64
  use ftorch_errors, only: ftorch_check, ftorch_reject, FTORCH_ERR_INVALID_ARGUMENT
  use ftorch_interop, only: c_flag
  use ftorch_tensor_type, only: torch_tensor
  use ftorch_function, only: torch_tensor_function, tensor_function_data
  use ftorch_callbacks, only: segment_callback
  use ftorch_c_api, only: ftc_autograd_grad, ftc_autograd_jacobian, ftc_autograd_jvp, ftc_gradcheck
  implicit none
  private

  public :: torch_autograd_grad, torch_autograd_jacobian, torch_autograd_jvp, torch_autograd_vjp, &
            torch_gradcheck, torch_gradcheck_result

  !> Gradients of outputs w.r.t. inputs, without touching `.grad`:
  !> `(grads(:), outputs(:), inputs(:) [, grad_outputs(:)] ...)` or, for one output and one
  !> input, `(grad, output, input [, grad_output] ...)`.
  interface torch_autograd_grad
    module procedure grad_many, grad_one
  end interface torch_autograd_grad

  !> What `torch_gradcheck` found: the worst entry of the Jacobians (largest error relative to
  !> its tolerance) and where it is (1-based; elements counted in row-major order, as PyTorch
  !> numbers them).
  type :: torch_gradcheck_result
    !> Whether every entry was within tolerance.
    logical :: passed = .false.
    real(real64) :: max_error = 0    !< |analytic - numeric| at the worst entry
    !> The worst entry as computed by backward and by finite differences.
    real(real64) :: analytic = 0, numeric = 0
    !> Where the worst entry is: which input and which of its elements, which output and which
    !> of its elements.
    integer :: input = 0, input_element = 0, output = 0, output_element = 0
  end type torch_gradcheck_result

contains

  ! Gradient arguments as the C layer takes them: 1 / 0, or -1 for "as create_graph".
  integer(c_int) function retain_flag(retain_graph)
    logical, intent(in), optional :: retain_graph
    retain_flag = -1
    if (present(retain_graph)) retain_flag = c_flag(retain_graph)
  end function retain_flag

  recursive subroutine grad_many(grads, outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, &
                                 stat, errmsg)
    type(torch_tensor), intent(inout) :: grads(:)          !< one per input
    !> The outputs to differentiate (one-element tensors unless `grad_outputs` is given), and
    !> the tensors (requiring grad) to differentiate them with respect to.
    type(torch_tensor), intent(in) :: outputs(:), inputs(:)
    type(torch_tensor), intent(in), optional, target :: grad_outputs(:)  !< one per output (vector-Jacobian product)
    logical, intent(in), optional :: retain_graph  !< keep the graph (default: as create_graph)
    logical, intent(in), optional :: create_graph  !< record the gradients’ own graph (higher derivatives)
    logical, intent(in), optional :: allow_unused  !< an input the outputs do not depend on gets zeros
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr), target :: out_h(size(outputs)), go_h(size(outputs))
    type(c_ptr) :: in_h(size(inputs)), grad_h(size(grads)), go_p
    integer :: i
    integer(c_int) :: status
    do i = 1, size(outputs)
      out_h(i) = outputs(i)%p
    end do
    do i = 1, size(inputs)
      in_h(i) = inputs(i)%p
    end do
    if (size(grads) /= size(inputs)) then
      call ftorch_reject(FTORCH_ERR_INVALID_ARGUMENT, "torch_autograd_grad", "size(grads) differs from size(inputs)", &
                         [out_h, in_h], stat, errmsg)
      return
    end if
    go_p = c_null_ptr
    if (present(grad_outputs)) then
      do i = 1, size(grad_outputs)
        if (i <= size(outputs)) go_h(i) = grad_outputs(i)%p
      end do
      if (size(grad_outputs) /= size(outputs)) then
        call ftorch_reject(FTORCH_ERR_INVALID_ARGUMENT, "torch_autograd_grad", &
                           "size(grad_outputs) differs from size(outputs)", &
                           [out_h, in_h, (grad_outputs(i)%p, i = 1, size(grad_outputs))], stat, errmsg)
        return
      end if
      go_p = c_loc(go_h)
    end if
    do i = 1, size(inputs)
      grad_h(i) = grads(i)%p
    end do
    status = ftc_autograd_grad(out_h, size(outputs, kind=c_int), in_h, size(inputs, kind=c_int), go_p, &
                               retain_flag(retain_graph), c_flag(create_graph), c_flag(allow_unused), grad_h)
    do i = 1, size(grads)
      grads(i)%p = grad_h(i)
    end do
    call ftorch_check(status, "torch_autograd_grad", stat, errmsg)
  end subroutine grad_many

  recursive subroutine grad_one(grad, output, input, grad_output, retain_graph, create_graph, allow_unused, stat, errmsg)
    !> Receives d output / d input (input’s shape), as `=` does.
    type(torch_tensor), intent(inout) :: grad
    !> The output to differentiate (one element unless `grad_output` is given), and the tensor
    !> (requiring grad) to differentiate it with respect to.
    type(torch_tensor), intent(in) :: output, input
    !> The vector of a vector-Jacobian product, of output’s shape.
    type(torch_tensor), intent(in), optional :: grad_output
    !> Keep the graph (`retain_graph`, default: as create_graph); record the gradient’s own graph
    !> (`create_graph`); give zeros for an input the output does not depend on (`allow_unused`).
    logical, intent(in), optional :: retain_graph, create_graph, allow_unused
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr), target :: go_h(1)
    type(c_ptr) :: out_h(1), in_h(1), grad_h(1), go_p
    integer(c_int) :: status
    out_h(1) = output%p
    in_h(1) = input%p
    grad_h(1) = grad%p
    go_p = c_null_ptr
    if (present(grad_output)) then
      go_h(1) = grad_output%p
      go_p = c_loc(go_h)
    end if
    status = ftc_autograd_grad(out_h, 1_c_int, in_h, 1_c_int, go_p, retain_flag(retain_graph), c_flag(create_graph), &
                               c_flag(allow_unused), grad_h)
    grad%p = grad_h(1)
    call ftorch_check(status, "torch_autograd_grad", stat, errmsg)
  end subroutine grad_one

  !> The Jacobian d output / d input, of shape [shape(output), shape(input)] (PyTorch’s
  !> torch.autograd.functional.jacobian layout), from output’s recorded graph (kept), one
  !> backward per output element: for small problems.
  recursive subroutine torch_autograd_jacobian(jacobian, output, input, create_graph, stat, errmsg)
    !> Receives the Jacobian, as `=` does.
    type(torch_tensor), intent(inout) :: jacobian
    !> The output to differentiate, and the tensor (requiring grad) it is differentiated with
    !> respect to.
    type(torch_tensor), intent(in) :: output, input
    !> Record the Jacobian’s own graph (default .false.).
    logical, intent(in), optional :: create_graph
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_autograd_jacobian(output%p, input%p, c_flag(create_graph), jacobian%p), &
                      "torch_autograd_jacobian", stat, errmsg)
  end subroutine torch_autograd_jacobian

  !> Jacobian-vector product (d output / d input) v (v has input’s shape; the result has
  !> output’s), from output’s recorded graph (kept), by differentiating a vector-Jacobian
  !> product: the graph must be twice differentiable.
  recursive subroutine torch_autograd_jvp(result, output, input, v, create_graph, stat, errmsg)
    !> Receives the product (output’s shape), as `=` does.
    type(torch_tensor), intent(inout) :: result
    !> The output, the input (requiring grad) and the vector v (input’s shape).
    type(torch_tensor), intent(in) :: output, input, v
    !> Record the product’s own graph (default .false.).
    logical, intent(in), optional :: create_graph
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_autograd_jvp(output%p, input%p, v%p, c_flag(create_graph), result%p), "torch_autograd_jvp", &
                      stat, errmsg)
  end subroutine torch_autograd_jvp

  !> Vector-Jacobian product v^T (d output / d input) (v has output’s shape; the result has
  !> input’s): torch_autograd_grad with v as grad_output, the graph kept unless told otherwise.
  recursive subroutine torch_autograd_vjp(result, output, input, v, retain_graph, create_graph, stat, errmsg)
    !> Receives the product (input’s shape), as `=` does.
    type(torch_tensor), intent(inout) :: result
    !> The output, the input (requiring grad) and the vector v (output’s shape).
    type(torch_tensor), intent(in) :: output, input, v
    !> Keep the graph (`retain_graph`, default .true.); record the product’s own graph
    !> (`create_graph`, default .false.).
    logical, intent(in), optional :: retain_graph, create_graph
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    logical :: retain
    retain = .true.
    if (present(retain_graph)) retain = retain_graph
    call grad_one(result, output, input, v, retain, create_graph, .false., stat, errmsg)
  end subroutine torch_autograd_vjp

  !> Gradient check (torch.autograd.gradcheck): the Jacobians of `fn` computed by backward against
  !> central finite differences, for every input that requires grad (float64 only). Passes when
  !> every entry satisfies |analytic - numeric| <= atol + rtol |numeric|. Inputs are perturbed in
  !> place and restored. Returns whether it passed; `result` tells where the worst entry is.
  recursive function torch_gradcheck(fn, inputs, n_outputs, eps, atol, rtol, result, stat, errmsg) result(passed)
    !> The function checked: computes its outputs from `inputs` (a module procedure).
    procedure(torch_tensor_function) :: fn
    !> The point at which the Jacobians are checked: float64 tensors; those that require grad
    !> are checked.
    type(torch_tensor), intent(in) :: inputs(:)
    integer, intent(in), optional :: n_outputs  !< number of outputs of fn (default 1)
    real(real64), intent(in), optional :: eps   !< finite-difference step (default 1e-6)
    real(real64), intent(in), optional :: atol  !< default 1e-5
    real(real64), intent(in), optional :: rtol  !< default 1e-3
    !> Details of the worst entry.
    type(torch_gradcheck_result), intent(out), optional :: result
    !> Status, 0 on success (whether or not the check passed), else an `FTORCH_ERR_*` code. When
    !> absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    logical :: passed
    type(c_ptr) :: handles(size(inputs))
    real(c_double) :: h, a, r, worst, ana, num
    integer(c_int) :: ok, nout
    integer(c_int64_t) :: where(4)
    integer :: i
    h = 1.0e-6_c_double
    a = 1.0e-5_c_double
    r = 1.0e-3_c_double
    nout = 1
    if (present(eps)) h = eps
    if (present(atol)) a = atol
    if (present(rtol)) r = rtol
    if (present(n_outputs)) nout = int(n_outputs, c_int)
    do i = 1, size(inputs)
      handles(i) = inputs(i)%p
    end do
    ok = 0
    worst = 0
    ana = 0
    num = 0
    where = -1
    call ftorch_check(ftc_gradcheck(c_funloc(segment_callback), tensor_function_data(fn), handles, &
                                    size(inputs, kind=c_int), nout, h, a, r, ok, worst, ana, num, where), &
                      "torch_gradcheck", stat, errmsg)
    passed = ok /= 0
    if (present(result)) then
      result%passed = passed
      result%max_error = worst
      result%analytic = ana
      result%numeric = num
      result%input = int(where(1)) + 1
      result%input_element = int(where(2)) + 1
      result%output = int(where(3)) + 1
      result%output_element = int(where(4)) + 1
    end if
  end function torch_gradcheck

end module ftorch_functional
