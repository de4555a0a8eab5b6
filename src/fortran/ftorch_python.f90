!> `torch_pymodule`: Python modules run from Fortran. Load a Python file or module, call its
!> functions on tensors (Python sees the same memory, no copy), numbers, logicals and strings,
!> and get tensors and numbers back. Python state (a model, an optimizer) lives in the module
!> between calls. The interpreter (that of the environment FTorch is installed in) starts on
!> first use; programs that never call these procedures do not load Python at all.
module ftorch_python
  use, intrinsic :: iso_c_binding, only: c_char, c_int, c_int64_t, c_loc, c_null_ptr, c_ptr
  use ftorch_arglist, only: torch_arglist, torch_arglist_delete
  use ftorch_errors, only: ftorch_check
  use ftorch_interop, only: c_string
  use ftorch_tensor_type, only: torch_tensor
  implicit none
  private

  public :: torch_pymodule, torch_pymodule_load, torch_pymodule_call, torch_pymodule_delete, &
            torch_python_loaded, torch_python_initialize

  !> A loaded Python module; `p` is null until loaded. `m2 = m1` makes a second handle to the same
  !> module (one Python state).
  type :: torch_pymodule
    !> Opaque handle of the module (null until loaded); not to be set directly.
    type(c_ptr) :: p = c_null_ptr
  contains
    procedure, private :: torch_pymodule_share
    !> `m2 = m1`: a second handle to the same module.
    generic :: assignment(=) => torch_pymodule_share
    final :: finalize_pymodule
  end type torch_pymodule

  !> Call a function of a Python module.
  !>  - `call torch_pymodule_call(module, "f", inputs, outputs)`: tensors in, tensor results
  !>    written into the output tensors as `torch_model_forward` does (number and shapes must
  !>    match);
  !>  - `call torch_pymodule_call(module, "f", args [, results] [, outputs=...])`: any arguments
  !>    in a `torch_arglist`; `results` receives every returned value (tensors, integers, reals,
  !>    logicals, strings: a tuple or list is unpacked, None gives none).
  !> A Python exception is FTORCH_ERR_PYTHON with its type, message and traceback in `errmsg`;
  !> the module stays usable.
  interface torch_pymodule_call
    module procedure call_tensors, call_args
  end interface torch_pymodule_call

  interface
    function ftc_pymodule_load(out, name) result(status) bind(c, name="ftc_pymodule_load")
      import :: c_ptr, c_char, c_int
      type(c_ptr), intent(inout) :: out
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int) :: status
    end function ftc_pymodule_load
    function ftc_pymodule_delete(m) result(status) bind(c, name="ftc_pymodule_delete")
      import :: c_ptr, c_int
      type(c_ptr), intent(inout) :: m
      integer(c_int) :: status
    end function ftc_pymodule_delete
    subroutine ftc_pymodule_release(m) bind(c, name="ftc_pymodule_release")
      import :: c_ptr
      type(c_ptr), value :: m
    end subroutine ftc_pymodule_release
    function ftc_pymodule_share(src, dst) result(status) bind(c, name="ftc_pymodule_share")
      import :: c_ptr, c_int
      type(c_ptr), value :: src
      type(c_ptr), intent(inout) :: dst
      integer(c_int) :: status
    end function ftc_pymodule_share
    function ftc_pymodule_call(m, name, args, results, outputs, n_outputs) result(status) &
        bind(c, name="ftc_pymodule_call")
      import :: c_ptr, c_char, c_int
      type(c_ptr), value :: m
      character(kind=c_char), intent(in) :: name(*)
      type(c_ptr), value :: args
      type(c_ptr), value :: results  ! address of the results’ handle; NULL: results not wanted
      type(c_ptr), intent(in) :: outputs(*)
      integer(c_int), value :: n_outputs
      integer(c_int) :: status
    end function ftc_pymodule_call
    function ftc_arglist_add_tensors(l, ts, n) result(status) bind(c, name="ftc_arglist_add_tensors")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), intent(inout) :: l
      type(c_ptr), intent(in) :: ts(*)
      integer(c_int64_t), value :: n
      integer(c_int) :: status
    end function ftc_arglist_add_tensors
    function ftc_python_loaded() result(loaded) bind(c, name="ftc_python_loaded")
      import :: c_int
      integer(c_int) :: loaded
    end function ftc_python_loaded
    function ftc_python_initialize() result(status) bind(c, name="ftc_python_initialize")
      import :: c_int
      integer(c_int) :: status
    end function ftc_python_initialize
  end interface

contains

  !> Load a Python module: a file path (ending in `.py` or containing `/`) is executed as a new
  !> module (each load has its own state) with its directory first on `sys.path`; anything else
  !> is imported by dotted name (`importlib.import_module`, shared with other imports of it).
  subroutine torch_pymodule_load(module, name, stat, errmsg)
    type(torch_pymodule), intent(inout) :: module  !< replaced (a loaded module is released first)
    character(len=*), intent(in) :: name            !< file path or dotted module name
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_pymodule_load(module%p, c_string(name)), "torch_pymodule_load", stat, errmsg)
  end subroutine torch_pymodule_load

  subroutine call_tensors(module, function, inputs, outputs, stat, errmsg)
    !> A loaded module.
    type(torch_pymodule), intent(in) :: module
    character(len=*), intent(in) :: function       !< name of the Python function
    type(torch_tensor), intent(in) :: inputs(:)    !< positional arguments
    type(torch_tensor), intent(in) :: outputs(:)   !< receive the returned tensors, in order
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(torch_arglist) :: args
    type(c_ptr) :: handles(size(inputs))
    integer :: i
    do i = 1, size(inputs)
      handles(i) = inputs(i)%p
    end do
    call ftorch_check(ftc_arglist_add_tensors(args%p, handles, size(handles, kind=c_int64_t)), &
                      "torch_pymodule_call", stat, errmsg)
    if (present(stat)) then
      if (stat /= 0) return
    end if
    call call_args(module, function, args, outputs=outputs, stat=stat, errmsg=errmsg)
    call torch_arglist_delete(args)
  end subroutine call_tensors

  subroutine call_args(module, function, args, results, outputs, stat, errmsg)
    !> A loaded module.
    type(torch_pymodule), intent(in) :: module
    character(len=*), intent(in) :: function            !< name of the Python function
    type(torch_arglist), intent(in) :: args              !< positional arguments (unconstructed: none)
    type(torch_arglist), intent(inout), optional :: results  !< receives every returned value
    type(torch_tensor), intent(in), optional :: outputs(:)   !< receive the returned tensors
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr), allocatable :: handles(:)
    type(c_ptr), target :: results_handle
    integer :: i
    if (present(outputs)) then
      allocate(handles(size(outputs)))
      do i = 1, size(outputs)
        handles(i) = outputs(i)%p
      end do
    else
      allocate(handles(0))
    end if
    if (present(results)) then
      results_handle = results%p
      call ftorch_check(ftc_pymodule_call(module%p, c_string(function), args%p, c_loc(results_handle), &
                                          handles, size(handles, kind=c_int)), "torch_pymodule_call", stat, errmsg)
      results%p = results_handle
    else
      call ftorch_check(ftc_pymodule_call(module%p, c_string(function), args%p, c_null_ptr, handles, &
                                          size(handles, kind=c_int)), "torch_pymodule_call", stat, errmsg)
    end if
  end subroutine call_args

  !> Whether a Python interpreter is loaded in this process (started by FTorch, or the program’s own).
  logical function torch_python_loaded()
    torch_python_loaded = ftc_python_loaded() /= 0
  end function torch_python_loaded

  !> Start the embedded interpreter now (as the first `torch_pymodule_load` would), e.g. to
  !> report a missing libpython or a torch mismatch at start-up.
  subroutine torch_python_initialize(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_python_initialize(), "torch_python_initialize", stat, errmsg)
  end subroutine torch_python_initialize

  impure elemental subroutine torch_pymodule_share(dst, src)
    !> Left-hand side: becomes a second handle to src’s module (a handle it held is released).
    class(torch_pymodule), intent(inout) :: dst
    !> Right-hand side (unloaded: dst becomes unloaded too).
    type(torch_pymodule), intent(in) :: src
    call ftorch_check(ftc_pymodule_share(src%p, dst%p), "assignment(=)")
  end subroutine torch_pymodule_share

  ! Finalizer: releases the module, writing nothing (see ftorch_tensor_type’s finalize).
  subroutine finalize_pymodule(object)
    type(torch_pymodule), intent(inout) :: object
    call ftc_pymodule_release(object%p)
  end subroutine finalize_pymodule

  !> Release the module (a no-op if not loaded, or for a copy of a deleted handle).
  impure elemental subroutine torch_pymodule_delete(module)
    !> The module handle (or, elementally, an array of them); null on return.
    type(torch_pymodule), intent(inout) :: module
    integer(c_int) :: status
    status = ftc_pymodule_delete(module%p)
  end subroutine torch_pymodule_delete

end module ftorch_python
