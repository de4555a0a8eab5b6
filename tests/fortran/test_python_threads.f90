!> Embedded Python from OpenMP threads: every thread calls the same pymodule concurrently (the
!> GIL serializes the Python part) while Fortran autograd runs in others; results are exact.
!> Usage: test_python_threads PY_DIR
program test_python_threads
  use, intrinsic :: iso_fortran_env, only: real64
  use omp_lib, only: omp_get_thread_num, omp_get_num_threads
  use ftorch
  use testing, only: check, summary
  implicit none
  character(len=1024) :: py_dir
  type(torch_pymodule) :: py
  integer, parameter :: n_iter = 200
  integer :: errors, nthreads

  call get_command_argument(1, py_dir)
  call torch_pymodule_load(py, trim(py_dir) // "/pyfuncs.py")
  errors = 0
  nthreads = 0
  !$omp parallel reduction(+:errors)
  !$omp atomic write
  nthreads = omp_get_num_threads()
  call worker(omp_get_thread_num(), errors)
  !$omp end parallel
  call check(nthreads > 1, "more than one thread ran")
  call check(errors == 0, "concurrent pymodule calls and Fortran autograd give exact results")
  call torch_pymodule_delete(py)
  call check(ftorch_live_handles() == 0, "no live handles after the threads")
  call summary()

contains

  ! One thread's work: n_iter Python calls, and Fortran autograd every other iteration.
  subroutine worker(me, errors)
    integer, intent(in) :: me
    integer, intent(inout) :: errors
    type(torch_tensor) :: a, b, c, w, loss, g, none(0)
    real(real64), target :: av(4), bv(4), cv(4), wv(4), gv(4)
    integer :: i, stat
    character(len=512) :: errmsg
    call torch_tensor_from_array(a, av, torch_kCPU)
    call torch_tensor_from_array(b, bv, torch_kCPU)
    call torch_tensor_from_array(c, cv, torch_kCPU)
    wv = real(me + 1, real64)
    call torch_tensor_from_array(w, wv, torch_kCPU, requires_grad=.true.)
    do i = 1, n_iter
      av = real(me * 1000 + i, real64)
      bv = [1d0, 2d0, 3d0, 4d0]
      call torch_pymodule_call(py, "add", [a, b], [c], stat=stat, errmsg=errmsg)
      if (stat /= 0) errors = errors + 1
      if (any(cv /= av + bv)) errors = errors + 1
      ! Fortran autograd at the same time as other threads run Python.
      if (mod(i, 2) == 0) then
        loss = torch_sum(w * w)
        call torch_tensor_backward(loss)
        call torch_tensor_get_gradient(g, w)
        call torch_tensor_to_array(g, gv)
        if (any(gv /= 2 * wv)) errors = errors + 1
        call torch_tensor_zero_grad(w)
        call torch_tensor_delete(loss)
        call torch_tensor_delete(g)
      end if
    end do
    call torch_pymodule_call(py, "fail", [a], none, stat=stat, errmsg=errmsg)
    if (stat /= FTORCH_ERR_PYTHON .or. index(errmsg, "ValueError") == 0) errors = errors + 1
    call torch_tensor_delete(a)
    call torch_tensor_delete(b)
    call torch_tensor_delete(c)
    call torch_tensor_delete(w)
  end subroutine worker
end program test_python_threads
