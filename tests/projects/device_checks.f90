!> What the device test programs share (tests/projects/gpu and tests/projects/openacc, standalone
!> CMake projects): checks counted and printed, an optimizer over a model, a model's parameters
!> (a weight matrix and a bias, as simplenet_f64.pt) copied to the host, and the closing line.
module device_checks
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none
  private
  public :: check, require, make_optim, parameters_of, summary
  integer :: passed = 0, failures = 0
contains
  subroutine check(ok, name)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: name
    if (ok) then
      print '(a)', "ok   " // name
      passed = passed + 1
    else
      print '(a)', "FAIL " // name
      failures = failures + 1
    end if
  end subroutine check

  !> A step the checks depend on: its failure ends the program.
  subroutine require(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      print '(a)', "FAIL " // what // " failed"
      error stop 1
    end if
  end subroutine require

  !> SGD (lr 0.1) over the model's parameters, or Adam (lr 0.01) when adam.
  subroutine make_optim(model, optim, adam)
    type(torch_model), intent(in) :: model
    type(torch_optim), intent(inout) :: optim
    logical, intent(in) :: adam
    type(torch_tensor), allocatable :: params(:)
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
    if (adam) then
      call torch_optim_Adam(optim, params, learning_rate=0.01d0)
    else
      call torch_optim_SGD(optim, params, learning_rate=0.1d0)
    end if
    call torch_delete(params)
  end subroutine make_optim

  !> The model's weight matrix and bias, flattened in order, copied to host memory.
  subroutine parameters_of(model, values)
    type(torch_model), intent(in) :: model
    real(real64), intent(out) :: values(:)
    type(torch_tensor), allocatable :: params(:)
    real(real64), allocatable :: w(:, :), b(:)
    integer :: shape(2)
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
    shape = params(1)%get_shape()
    allocate(w(shape(1), shape(2)), b(shape(1)))
    call torch_tensor_to_array(params(1), w)
    call torch_tensor_to_array(params(2), b)
    values = [reshape(w, [size(w)]), b]
    call torch_delete(params)
  end subroutine parameters_of

  !> "N passed, M failed"; a failure stops the program with a non-zero status.
  subroutine summary()
    print '(i0,a,i0,a)', passed, " passed, ", failures, " failed"
    if (failures > 0) error stop 1
  end subroutine summary
end module device_checks
