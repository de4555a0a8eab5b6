!> Embedded Python: torch_pymodule and torch_arglist (argument kinds, aliasing both ways, results,
!> errors, several modules, autograd after Python started, memory over many calls).
!> Usage: test_python DATA_DIR PY_DIR (PY_DIR holds pyfuncs.py).
program test_python
  use, intrinsic :: iso_fortran_env, only: real32, real64, int32, int64
  use ftorch
  use testing, only: check, check_close, summary, rss_kib
  implicit none

  character(len=1024) :: data_dir, py_dir
  type(torch_pymodule) :: py, py2, other, math
  type(torch_tensor) :: a, b, c, r, x, y, g
  type(torch_arglist) :: args, results
  real(real64), target :: av(3), bv(3), cv(3), m(2, 3), out(5), xv(3), gv(3)
  real(real32), target :: f32(4)
  integer(int64) :: i64, n_before, n_after
  integer(int32) :: i32
  real(real64) :: r64
  real(real32) :: r32
  logical :: flag
  integer :: stat, i, rss_before, rss_after
  character(len=4096) :: errmsg

  call get_command_argument(1, data_dir)
  call get_command_argument(2, py_dir)

  call check(.not. torch_python_loaded(), "Python is not loaded before the first pymodule")
  call torch_pymodule_load(py, trim(py_dir) // "/pyfuncs.py")
  call check(torch_python_loaded(), "loading a pymodule starts Python")

  ! Tensors in, tensors out (written into the outputs' memory, i.e. the Fortran array).
  av = [1d0, 2d0, 3d0]
  bv = [10d0, 20d0, 30d0]
  cv = 0
  call torch_tensor_from_array(a, av, torch_kCPU)
  call torch_tensor_from_array(b, bv, torch_kCPU)
  call torch_tensor_from_array(c, cv, torch_kCPU)
  call torch_pymodule_call(py, "add", [a, b], [c])
  call check_close(cv, [11d0, 22d0, 33d0], 0d0, "tensors in, result written into the output array")
  call torch_pymodule_call(py, "negated_view", [a], [c])
  call check_close(cv, -av, 0d0, "a result with torch's negative bit (z.conj().imag) arrives negated")

  ! Every argument kind goes in, and comes back (echo returns its arguments).
  call torch_arglist_add(args, a)
  call torch_arglist_add(args, 7_int32)
  call torch_arglist_add(args, 8_int64)
  call torch_arglist_add(args, 2.5_real32)
  call torch_arglist_add(args, 0.1_real64)
  call torch_arglist_add(args, .true.)
  call torch_arglist_add(args, "hello")
  call check(torch_arglist_size(args) == 7, "arglist size")
  call torch_pymodule_call(py, "kinds", args, results)
  call check(torch_arglist_size(results) == 1 .and. torch_arglist_kind(results, 1) == torch_kArgString, &
             "kinds() returns one string")
  call torch_pymodule_call(py, "echo", args, results)
  call check(torch_arglist_size(results) == 7, "echo returns every argument")
  call check(torch_arglist_kind(results, 1) == torch_kArgTensor .and. torch_arglist_kind(results, 2) == torch_kArgInt &
             .and. torch_arglist_kind(results, 4) == torch_kArgReal .and. &
             torch_arglist_kind(results, 6) == torch_kArgLogical .and. torch_arglist_kind(results, 7) == torch_kArgString, &
             "result kinds: tensor, int, float, bool, str")
  call torch_arglist_get(results, 2, i32)
  call torch_arglist_get(results, 3, i64)
  call check(i32 == 7 .and. i64 == 8, "integers round-trip")
  call torch_arglist_get(results, 4, r32)
  call torch_arglist_get(results, 5, r64)
  call check(r32 == 2.5_real32 .and. r64 == 0.1_real64, "reals round-trip exactly (as Python floats)")
  call torch_arglist_get(results, 6, flag)
  call check(flag, "logical round-trips")
  call torch_arglist_get(results, 1, r)
  call torch_tensor_to_array(r, out(1:3))
  call check_close(out(1:3), av, 0d0, "tensor round-trips")
  av(2) = -5d0
  call torch_tensor_to_array(r, out(1:3))
  call check(out(2) == -5d0, "a tensor returned by Python still aliases the Fortran array (no copy either way)")
  av(2) = 2d0
  call torch_arglist_get(results, 7, r, stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_DTYPE .and. index(errmsg, "item 7 is a string") > 0, "reading a string as a tensor fails")
  call torch_arglist_get(results, 1, r64, stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_DTYPE .and. index(errmsg, "shape [3]") > 0, "a 3-element tensor is not a real")
  call torch_arglist_get(results, 9, r64, stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(errmsg, "out of range") > 0, "item index out of range")

  ! Layout: a Fortran (2, 3) array is a (2, 3) tensor with Fortran strides, no copy.
  m = reshape([1d0, 2d0, 3d0, 4d0, 5d0, 6d0], [2, 3])
  call torch_tensor_from_array(x, m, torch_kCPU)
  call torch_arglist_clear(args)
  call torch_arglist_add(args, x)
  call torch_pymodule_call(py, "layout", args, results)
  call torch_arglist_get(results, 1, i64)
  call check(torch_arglist_size(results) == 4, "layout returns shape and strides")
  call torch_arglist_get(results, 3, i32)
  call torch_arglist_get(results, 4, i)
  call check(i64 == 2 .and. i32 == 1 .and. i == 2, "shape (2, 3), strides (1, 2): Fortran order seen in Python")

  ! Python writes into the Fortran array; Fortran changes are seen by Python.
  call torch_arglist_clear(args)
  call torch_arglist_add(args, x)
  call torch_arglist_add(args, 3d0)
  call torch_pymodule_call(py, "scale_", args)
  call check(all(m == 3 * reshape([1d0, 2d0, 3d0, 4d0, 5d0, 6d0], [2, 3])), "Python's in-place write lands in the Fortran array")
  call torch_arglist_clear(args)
  call torch_arglist_add(args, x)
  call torch_pymodule_call(py, "keep", args)
  m = 1d0
  call torch_pymodule_call(py, "kept_sum", torch_arglist(), results)
  call torch_arglist_get(results, 1, r64)
  call check(r64 == 6d0, "a tensor kept by Python sees later Fortran writes")

  ! requires_grad is carried.
  call torch_tensor_from_array(y, xv, torch_kCPU, requires_grad=.true.)
  call torch_arglist_clear(args)
  call torch_arglist_add(args, y)
  call torch_arglist_add(args, a)
  call torch_pymodule_call(py, "grad_flags", args, results)
  call torch_arglist_get(results, 1, flag)
  call check(flag, "requires_grad arrives set")
  call torch_arglist_get(results, 2, flag)
  call check(.not. flag, "requires_grad arrives unset")

  ! New tensors from Python; a 0-d tensor reads as a number; float32 tensors.
  call torch_arglist_clear(args)
  call torch_arglist_add(args, 5)
  call torch_pymodule_call(py, "arange", args, results)
  call torch_arglist_get(results, 1, r)
  call torch_tensor_to_array(r, out)
  call check_close(out, [0d0, 1d0, 2d0, 3d0, 4d0], 0d0, "a new tensor from Python")
  ! Dtypes no Fortran array has: bool and bfloat16 are reported by name; a dtype FTorch has no
  ! code for (complex) is an error, never a number outside the table.
  call torch_pymodule_call(py, "dtypes", torch_arglist(), results)
  call torch_arglist_get(results, 1, r)
  call check(r%get_dtype() == torch_kBool, "a bool tensor reports torch_kBool")
  call torch_arglist_get(results, 2, r)
  call check(r%get_dtype() == torch_kBFloat16, "a bfloat16 tensor reports torch_kBFloat16")
  call torch_arglist_get(results, 3, r)
  i = r%get_dtype(stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_DTYPE .and. index(errmsg, "ComplexFloat") > 0, "a complex tensor has no FTorch dtype")
  f32 = [1.5, 2.5, 3.5, 4.5]
  call torch_tensor_from_array(g, f32, torch_kCPU)
  call torch_arglist_clear(args)
  call torch_arglist_add(args, g)
  call torch_pymodule_call(py, "scalar_tensor", args, results)
  call torch_arglist_get(results, 1, r32)
  call check(r32 == 12.0, "a one-element tensor result reads as a real")
  ! The list refers to the named tensor: Python sees `g = ...` and later writes to the array.
  g = g * 2.0
  call torch_pymodule_call(py, "scalar_tensor", args, results)
  call torch_arglist_get(results, 1, r32)
  call check(r32 == 24.0, "after g = g * 2, Python sees the new values through the list")
  f32(1) = 100
  call torch_pymodule_call(py, "scalar_tensor", args, results)
  call torch_arglist_get(results, 1, r32)
  call check(r32 == 100.0 + 5.0 + 7.0 + 9.0, "... and later writes to the wrapped array")
  g = 0.0
  call torch_pymodule_call(py, "scalar_tensor", args, results)
  call torch_arglist_get(results, 1, r32)
  call check(r32 == 0.0, "... and g = 0")
  f32 = 1.0
  call torch_tensor_delete(g)
  call torch_pymodule_call(py, "scalar_tensor", args, results)
  call torch_arglist_get(results, 1, r32)
  call check(r32 == 4.0, "a list whose tensor was deleted keeps the tensor, over the wrapped array")

  ! Results with autograd history come back detached; gradients are computed on one side.
  xv = [1d0, 2d0, 3d0]
  call torch_arglist_clear(args)
  call torch_arglist_add(args, y)
  call torch_pymodule_call(py, "square_sum", args, results)
  call torch_arglist_get(results, 1, r64)
  call check(r64 == 14d0, "square_sum value")

  ! Fortran autograd keeps working after torch was imported in the embedded interpreter.
  call torch_tensor_delete(r)
  r = y * y * 0.5d0
  call torch_tensor_backward(torch_sum(r))
  call torch_tensor_delete(g)
  call torch_tensor_get_gradient(g, y)
  call torch_tensor_to_array(g, gv)
  call check_close(gv, xv, 0d0, "torch_tensor_backward from Fortran after Python started")

  ! None gives no results; several outputs must match what is returned.
  call torch_pymodule_call(py, "nothing", torch_arglist(), results)
  call check(torch_arglist_size(results) == 0, "None returns no results")
  call torch_pymodule_call(py, "add", [a, b], [c, x], stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(errmsg, "returned 1 tensor but 2 output tensors") > 0, &
             "output count mismatch")
  call torch_pymodule_call(py, "add", [a, b], [x], stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(errmsg, "shape") > 0, "output shape mismatch")
  call torch_pymodule_call(py, "a_dict", torch_arglist(), results, stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_PYTHON .and. index(errmsg, "is a dict") > 0, "an unsupported result type is an error")
  call torch_pymodule_call(py, "lone_surrogate", torch_arglist(), results, stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_PYTHON .and. index(errmsg, "UnicodeEncodeError") > 0, &
             "a string result UTF-8 cannot hold is an error, not a stand-in")

  ! Exceptions become stat/errmsg with type, message and traceback; the module stays usable.
  call torch_arglist_clear(args)
  call torch_arglist_add(args, "bad input 42")
  call torch_pymodule_call(py, "fail", args, stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_PYTHON, "a Python exception is FTORCH_ERR_PYTHON")
  call check(index(errmsg, "ValueError: bad input 42") > 0, "errmsg has the exception type and message")
  call check(index(errmsg, "Traceback") > 0 .and. index(errmsg, "pyfuncs.py") > 0, "errmsg has the traceback")
  call torch_pymodule_call(py, "no_such_function", torch_arglist(), stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_PYTHON .and. index(errmsg, "AttributeError") > 0, "a missing function is an error")
  cv = 0
  call torch_pymodule_call(py, "add", [a, b], [c])
  call check(cv(1) == 11d0, "the module works after exceptions")

  ! Loading errors.
  call torch_pymodule_load(other, trim(py_dir) // "/missing.py", stat, errmsg)
  call check(stat == FTORCH_ERR_PYTHON .and. index(errmsg, "FileNotFoundError") > 0, "a missing file")
  call torch_pymodule_load(other, trim(py_dir) // "/syntax_error.py", stat, errmsg)
  call check(stat == FTORCH_ERR_PYTHON .and. index(errmsg, "SyntaxError") > 0, "a file with a syntax error")
  call torch_pymodule_load(other, "no_such_module_xyz", stat, errmsg)
  call check(stat == FTORCH_ERR_PYTHON .and. index(errmsg, "ModuleNotFoundError") > 0, "a missing module")
  call torch_pymodule_call(other, "f", torch_arglist(), stat=stat, errmsg=errmsg)
  call check(stat == FTORCH_ERR_NULL_HANDLE, "an unloaded pymodule is an error")

  ! Several modules at once: two loads of one file have their own state; modules by name.
  call torch_pymodule_load(py2, trim(py_dir) // "/pyfuncs.py")
  call torch_pymodule_call(py, "count", torch_arglist(), results)
  call torch_pymodule_call(py, "count", torch_arglist(), results)
  call torch_arglist_get(results, 1, i)
  call torch_pymodule_call(py2, "count", torch_arglist(), results)
  call torch_arglist_get(results, 1, i32)
  call check(i == 2 .and. i32 == 1, "two loads of a file keep separate state")
  ! Inside a catch scope, without stat: an argument that cannot be passed stops the call before
  ! Python runs (count would have counted).
  block
    type(torch_tensor) :: unconstructed
    call torch_catch_begin()
    call torch_pymodule_call(py, "count", [unconstructed], [c])
    call torch_catch_end(stat, errmsg)
    call check(stat /= 0, "an unconstructed argument fails inside a catch scope: " // trim(errmsg))
    call torch_pymodule_call(py, "count", torch_arglist(), results)
    call torch_arglist_get(results, 1, i)
    call check(i == 3, "... and Python never ran for it")
  end block
  call torch_pymodule_load(math, "math")
  call torch_arglist_clear(args)
  call torch_arglist_add(args, 16d0)
  call torch_pymodule_call(math, "sqrt", args, results)
  call torch_arglist_get(results, 1, r64)
  call check(r64 == 4d0, "a module loaded by dotted name")

  ! Model forward with non-tensor arguments (forward(x, scale: float, n: int, flag: bool)).
  block
    type(torch_model) :: model
    call torch_model_load(model, trim(data_dir) // "/scalar_args.pt", torch_kCPU)
    call torch_arglist_clear(args)
    call torch_arglist_add(args, a)
    call torch_arglist_add(args, 2d0)
    call torch_arglist_add(args, 3)
    call torch_arglist_add(args, .true.)
    call torch_model_forward(model, args, [c])
    call check_close(cv, [7d0, 9d0, 11d0], 0d0, "forward(x, 2.0, 3, True) = x * 2 + 3 + 2")
    call torch_model_forward(model, args, results)
    call torch_arglist_get(results, 1, r)
    call torch_tensor_to_array(r, out(1:3))
    call check_close(out(1:3), [7d0, 9d0, 11d0], 0d0, "forward into a results list")
    call torch_arglist_clear(args)
    call torch_arglist_add(args, a)
    call torch_arglist_add(args, "not a number")
    call torch_model_forward(model, args, [c], stat=stat, errmsg=errmsg)
    call check(stat == FTORCH_ERR_TORCH, "a wrongly typed scalar argument is a clear error")
    call torch_model_delete(model)
  end block

  ! The Python tensor of an argument over a Fortran array is passed again, as a Python loop passes
  ! the same tensor, while its memory and layout are unchanged and the last call neither kept it nor
  ! changed it (in place, or by requiring grad); Python always sees the array's current values.
  block
    real(real64), target :: pv(2, 3), qv(2, 3)
    type(torch_tensor) :: p, q, z
    logical :: first, again
    integer(int64) :: d1, d2
    real(real64) :: s1, s2
    pv = 1
    qv = 5
    call torch_tensor_from_array(p, pv, torch_kCPU)
    call torch_tensor_from_array(q, qv, torch_kCPU)
    call torch_arglist_clear(args)
    call torch_arglist_add(args, p)
    first = logical_result("identity_of")
    again = logical_result("identity_of")
    call check(.not. first .and. again, &
               "an unchanged argument over a Fortran array is the same Python tensor again")
    pv = 2
    call check(real_result("total") == 12d0, "... which sees the array's current values")
    call torch_pymodule_call(py, "add_one", args)
    again = logical_result("identity_of")
    call check(all(pv == 3d0) .and. .not. again, &
               "changed in place by Python: the array has the values, the next call a new tensor")
    d1 = int_result("add_dim")
    d2 = int_result("add_dim")
    call check(d1 == 3 .and. d2 == 3, "sizes changed in place by the last call are not seen by the next")
    s1 = real_result("input_gradient")
    s2 = real_result("input_gradient")
    call check(s1 == 36d0 .and. s2 == 36d0, "a gradient Python took of the argument does not accumulate over calls")
    s1 = real_result("gradient_then_off")
    s2 = real_result("gradient_then_off")
    call check(s1 == 36d0 .and. s2 == 36d0, "... also when the call switched requires_grad off again")
    call torch_arglist_clear(args)
    call torch_arglist_add(args, q)
    again = logical_result("identity_of")
    call check(.not. again .and. real_result("total") == 30d0, &
               "another array in the same place: another tensor, over that array")
    call torch_tensor_zeros(z, 2, [2_int64, 3_int64], torch_kFloat64, torch_kCPU)
    call torch_arglist_clear(args)
    call torch_arglist_add(args, z)
    first = logical_result("identity_of")
    again = logical_result("identity_of")
    call check(.not. again, "a tensor over LibTorch's memory is not kept (deleting it frees its memory)")
    call torch_delete(p); call torch_delete(q); call torch_delete(z)
  end block

  ! Memory stays flat over 10^4 calls (handles and resident memory).
  call torch_arglist_clear(args)
  call torch_arglist_add(args, a)
  call torch_arglist_add(args, 2d0)
  do i = 1, 1000
    call torch_pymodule_call(py, "add", [a, b], [c])
    call torch_pymodule_call(py, "echo", args, results)
  end do
  n_before = ftorch_live_handles()
  rss_before = rss_kib()
  do i = 1, 10000
    call torch_pymodule_call(py, "add", [a, b], [c])
    call torch_pymodule_call(py, "echo", args, results)
    call torch_pymodule_call(py, "fail", args, stat=stat)
  end do
  n_after = ftorch_live_handles()
  rss_after = rss_kib()
  call check(n_after == n_before, "live handles flat over 10^4 calls")
  print '(a, i0, a)', "  resident memory grew by ", rss_after - rss_before, " KiB over 3x10^4 calls"
  call check(rss_after - rss_before < 4096, "resident memory flat over 10^4 calls (< 4 MiB growth)")

  call torch_delete(a)
  call torch_delete(b)
  call torch_delete(c)
  call torch_delete(r)
  call torch_delete(x)
  call torch_delete(y)
  call torch_delete(g)
  call torch_arglist_delete(args)
  call torch_arglist_delete(results)
  call torch_pymodule_delete(py)
  call torch_pymodule_delete(py2)
  call torch_pymodule_delete(math)
  call check(ftorch_live_handles() == 0, "no live handles at the end")
  call summary()

contains

  ! The first result of py's function fn called with args.
  logical function logical_result(fn)
    character(len=*), intent(in) :: fn
    call torch_pymodule_call(py, fn, args, results)
    call torch_arglist_get(results, 1, logical_result)
  end function logical_result

  real(real64) function real_result(fn)
    character(len=*), intent(in) :: fn
    call torch_pymodule_call(py, fn, args, results)
    call torch_arglist_get(results, 1, real_result)
  end function real_result

  integer(int64) function int_result(fn)
    character(len=*), intent(in) :: fn
    call torch_pymodule_call(py, fn, args, results)
    call torch_arglist_get(results, 1, int_result)
  end function int_result
end program test_python
