!> Autograd (backward, gradients, requires_grad) and grad-mode scopes.
!>
!> Grad-mode scopes are LibTorch’s thread-local modes: a scope begun on one thread (or OpenMP
!> thread) affects only that thread and must be ended on it, innermost first.
module ftorch_autograd
  use, intrinsic :: iso_c_binding, only: c_funloc, c_funptr, c_int, c_int64_t, c_null_ptr, c_ptr
  use ftorch_kinds, only: int64
  use ftorch_callbacks, only: callback_box, callback_data, callback_box_at
  use ftorch_errors, only: ftorch_check, ftorch_callback_begin, ftorch_callback_end
  use ftorch_interop, only: c_flag
  use ftorch_tensor_type, only: torch_tensor, torch_tensor_zero_grad
  implicit none
  private

  public :: torch_tensor_backward, torch_tensor_get_gradient, torch_tensor_zero_grad, &
            torch_tensor_set_requires_grad, torch_tensor_is_leaf, torch_tensor_set_gradient
  public :: torch_no_grad_begin, torch_no_grad_end, torch_enable_grad_begin, torch_enable_grad_end, &
            torch_inference_mode_begin, torch_inference_mode_end, torch_grad_enabled, &
            torch_inference_mode_enabled
  public :: torch_grad_hook, torch_tensor_register_hook, torch_tensor_remove_hook, torch_autograd_set_detect_anomaly, &
            torch_autograd_detect_anomaly_enabled

  abstract interface
    !> A gradient hook: sees the gradient of a tensor during backward, before it is accumulated
    !> or passed on. Leave `new_grad` unconstructed to keep `grad`, or set it (same shape, dtype
    !> and device) to replace it. Set `stat` /= 0 (and `errmsg`) to fail the backward.
    subroutine torch_grad_hook(grad, new_grad, stat, errmsg)
      import :: torch_tensor
      !> The gradient computed for the tensor (owned by backward: do not delete it).
      type(torch_tensor), intent(in) :: grad
      !> Unconstructed on entry; construct it to replace `grad`.
      type(torch_tensor), intent(inout) :: new_grad
      !> 0 on entry; set it nonzero to fail the backward.
      integer, intent(inout) :: stat
      !> Blank on entry; the reason of the failure when setting `stat`.
      character(len=*), intent(inout) :: errmsg
    end subroutine torch_grad_hook
  end interface

  !> Backpropagate from a tensor: `(tensor, external_gradient [, retain_graph])`, or
  !> `(tensor [, retain_graph])` with an implicit unit gradient for one-element tensors.
  interface torch_tensor_backward
    module procedure backward_with_gradient, backward_implicit
  end interface torch_tensor_backward

  integer(c_int), parameter :: SCOPE_NO_GRAD = 0, SCOPE_ENABLE_GRAD = 1, SCOPE_INFERENCE = 2

  ! A gradient hook on its way to the C layer (see ftorch_callbacks).
  type, extends(callback_box) :: hook_box
    procedure(torch_grad_hook), pointer, nopass :: fn => null()
  contains
    procedure :: same => hook_same
  end type hook_box

  interface
    function ftc_tensor_backward(t, gradient, retain_graph) result(status) bind(c, name="ftc_tensor_backward")
      import :: c_ptr, c_int
      type(c_ptr), value :: t, gradient
      integer(c_int), value :: retain_graph
      integer(c_int) :: status
    end function ftc_tensor_backward
    function ftc_tensor_get_gradient(t, gradient) result(status) bind(c, name="ftc_tensor_get_gradient")
      import :: c_ptr, c_int
      type(c_ptr), value :: t
      type(c_ptr), intent(inout) :: gradient
      integer(c_int) :: status
    end function ftc_tensor_get_gradient
    function ftc_tensor_set_gradient(t, g) result(status) bind(c, name="ftc_tensor_set_gradient")
      import :: c_ptr, c_int
      type(c_ptr), value :: t, g
      integer(c_int) :: status
    end function ftc_tensor_set_gradient
    function ftc_tensor_set_requires_grad(t, flag) result(status) bind(c, name="ftc_tensor_set_requires_grad")
      import :: c_ptr, c_int
      type(c_ptr), value :: t
      integer(c_int), value :: flag
      integer(c_int) :: status
    end function ftc_tensor_set_requires_grad
    function ftc_tensor_is_leaf(t, flag) result(status) bind(c, name="ftc_tensor_is_leaf")
      import :: c_ptr, c_int
      type(c_ptr), value :: t
      integer(c_int), intent(out) :: flag
      integer(c_int) :: status
    end function ftc_tensor_is_leaf
    function ftc_grad_scope_push(scope) result(status) bind(c, name="ftc_grad_scope_push")
      import :: c_int
      integer(c_int), value :: scope
      integer(c_int) :: status
    end function ftc_grad_scope_push
    function ftc_grad_scope_pop(scope) result(status) bind(c, name="ftc_grad_scope_pop")
      import :: c_int
      integer(c_int), value :: scope
      integer(c_int) :: status
    end function ftc_grad_scope_pop
    function ftc_grad_enabled() result(flag) bind(c, name="ftc_grad_enabled")
      import :: c_int
      integer(c_int) :: flag
    end function ftc_grad_enabled
    function ftc_inference_mode_enabled() result(flag) bind(c, name="ftc_inference_mode_enabled")
      import :: c_int
      integer(c_int) :: flag
    end function ftc_inference_mode_enabled
    function ftc_tensor_register_hook(t, hook, data, id) result(status) bind(c, name="ftc_tensor_register_hook")
      import :: c_ptr, c_funptr, c_int, c_int64_t
      type(c_ptr), value :: t
      type(c_funptr), value :: hook
      type(c_ptr), value :: data
      integer(c_int64_t), intent(out) :: id
      integer(c_int) :: status
    end function ftc_tensor_register_hook
    function ftc_tensor_remove_hook(t, id) result(status) bind(c, name="ftc_tensor_remove_hook")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: t
      integer(c_int64_t), value :: id
      integer(c_int) :: status
    end function ftc_tensor_remove_hook
    function ftc_set_detect_anomaly(enabled, check_nan) result(status) bind(c, name="ftc_set_detect_anomaly")
      import :: c_int
      integer(c_int), value :: enabled, check_nan
      integer(c_int) :: status
    end function ftc_set_detect_anomaly
    function ftc_detect_anomaly_enabled() result(flag) bind(c, name="ftc_detect_anomaly_enabled")
      import :: c_int
      integer(c_int) :: flag
    end function ftc_detect_anomaly_enabled
  end interface

contains

  subroutine backward_with_gradient(tensor, external_gradient, retain_graph, stat, errmsg)
    !> The tensor to backpropagate from (the result of recorded operations).
    type(torch_tensor), intent(in) :: tensor
    type(torch_tensor), intent(in) :: external_gradient  !< d(objective)/d(tensor), same shape
    logical, intent(in), optional :: retain_graph       !< keep the graph for another backward
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_tensor_backward(tensor%p, external_gradient%p, c_flag(retain_graph)), &
                      "torch_tensor_backward", stat, errmsg)
  end subroutine backward_with_gradient

  subroutine backward_implicit(tensor, retain_graph, stat, errmsg)
    !> A one-element tensor (a loss) to backpropagate from, with gradient 1.
    type(torch_tensor), intent(in) :: tensor
    !> Keep the graph for another backward (default .false.: the graph is freed).
    logical, intent(in), optional :: retain_graph
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_tensor_backward(tensor%p, c_null_ptr, c_flag(retain_graph)), "torch_tensor_backward", &
                      stat, errmsg)
  end subroutine backward_implicit

  !> The gradient accumulated in `tensor` by backward, copied into `gradient` (its storage, so an
  !> aliased Fortran array receives it; constructed with the gradient’s value if it is not yet).
  subroutine torch_tensor_get_gradient(gradient, tensor, stat, errmsg)
    !> Receives the gradient: a tensor of the same shape (e.g. over a Fortran array), or an
    !> unconstructed one, which is constructed.
    type(torch_tensor), intent(inout) :: gradient
    !> A tensor that requires grad, after a backward through it.
    type(torch_tensor), intent(in) :: tensor
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_tensor_get_gradient(tensor%p, gradient%p), "torch_tensor_get_gradient", stat, errmsg)
  end subroutine torch_tensor_get_gradient

  !> Set the gradient of `tensor` to a copy of `gradient` (same shape), e.g. from a Fortran array
  !> after modifying it; the next optimizer step uses it.
  subroutine torch_tensor_set_gradient(tensor, gradient, stat, errmsg)
    !> The tensor (typically a parameter) whose gradient is set.
    type(torch_tensor), intent(inout) :: tensor
    !> The new gradient, same shape as `tensor`; copied.
    type(torch_tensor), intent(in) :: gradient
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_tensor_set_gradient(tensor%p, gradient%p), "torch_tensor_set_gradient", stat, errmsg)
  end subroutine torch_tensor_set_gradient

  !> Switch recording of operations on `tensor` on or off (e.g. to freeze a parameter).
  subroutine torch_tensor_set_requires_grad(tensor, requires_grad, stat, errmsg)
    !> A leaf tensor (made by the user, not by an operation).
    type(torch_tensor), intent(inout) :: tensor
    !> .true. to record operations on it (and accumulate its gradient), .false. to stop.
    logical, intent(in) :: requires_grad
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_tensor_set_requires_grad(tensor%p, c_flag(requires_grad)), &
                      "torch_tensor_set_requires_grad", stat, errmsg)
  end subroutine torch_tensor_set_requires_grad

  !> Whether `tensor` is a leaf of the graph (made by the user rather than by an operation).
  function torch_tensor_is_leaf(tensor, stat, errmsg) result(is_leaf)
    !> The tensor asked about.
    type(torch_tensor), intent(in) :: tensor
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    logical :: is_leaf
    integer(c_int) :: value
    value = 0
    call ftorch_check(ftc_tensor_is_leaf(tensor%p, value), "torch_tensor_is_leaf", stat, errmsg)
    is_leaf = value /= 0
  end function torch_tensor_is_leaf

  !> Begin a scope in which no operation is recorded for autograd (this thread only).
  subroutine torch_no_grad_begin(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_grad_scope_push(SCOPE_NO_GRAD), "torch_no_grad_begin", stat, errmsg)
  end subroutine torch_no_grad_begin

  !> End the innermost scope, which must be a no-grad scope.
  subroutine torch_no_grad_end(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_grad_scope_pop(SCOPE_NO_GRAD), "torch_no_grad_end", stat, errmsg)
  end subroutine torch_no_grad_end

  !> Begin a scope that records operations again inside a no-grad scope (this thread only).
  subroutine torch_enable_grad_begin(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_grad_scope_push(SCOPE_ENABLE_GRAD), "torch_enable_grad_begin", stat, errmsg)
  end subroutine torch_enable_grad_begin

  !> End the innermost scope, which must be an enable-grad scope.
  subroutine torch_enable_grad_end(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_grad_scope_pop(SCOPE_ENABLE_GRAD), "torch_enable_grad_end", stat, errmsg)
  end subroutine torch_enable_grad_end

  !> Begin an inference-mode scope (this thread only): no autograd bookkeeping at all; tensors
  !> created inside cannot be used in autograd afterwards.
  subroutine torch_inference_mode_begin(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_grad_scope_push(SCOPE_INFERENCE), "torch_inference_mode_begin", stat, errmsg)
  end subroutine torch_inference_mode_begin

  !> End the innermost scope, which must be an inference-mode scope.
  subroutine torch_inference_mode_end(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_grad_scope_pop(SCOPE_INFERENCE), "torch_inference_mode_end", stat, errmsg)
  end subroutine torch_inference_mode_end

  !> Whether operations are being recorded on this thread.
  logical function torch_grad_enabled()
    torch_grad_enabled = ftc_grad_enabled() /= 0
  end function torch_grad_enabled

  !> Whether this thread is in an inference-mode scope.
  logical function torch_inference_mode_enabled()
    torch_inference_mode_enabled = ftc_inference_mode_enabled() /= 0
  end function torch_inference_mode_enabled


  !> Register `hook` (a module procedure) on `tensor`, which must require grad: it runs each time
  !> backward computes the tensor’s gradient (for a leaf, before accumulation into its `.grad`),
  !> and may replace the gradient (per-tensor clipping, eligibility traces). The hook stays on the
  !> tensor until removed with `hook_id`.
  subroutine torch_tensor_register_hook(tensor, hook, hook_id, stat, errmsg)
    !> A tensor that requires grad.
    type(torch_tensor), intent(in) :: tensor
    !> The hook, a module procedure with the interface `torch_grad_hook`.
    procedure(torch_grad_hook) :: hook
    !> Identifier of the registration, for `torch_tensor_remove_hook`.
    integer(int64), intent(out), optional :: hook_id
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: id
    type(hook_box) :: box
    box%fn => hook
    id = -1
    call ftorch_check(ftc_tensor_register_hook(tensor%p, c_funloc(hook_trampoline), callback_data(box), id), &
                      "torch_tensor_register_hook", stat, errmsg)
    if (present(hook_id)) hook_id = id
  end subroutine torch_tensor_register_hook

  !> Remove a hook registered on `tensor` (removing it twice is a no-op).
  subroutine torch_tensor_remove_hook(tensor, hook_id, stat, errmsg)
    !> The tensor the hook was registered on.
    type(torch_tensor), intent(in) :: tensor
    !> The identifier `torch_tensor_register_hook` returned.
    integer(int64), intent(in) :: hook_id
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_tensor_remove_hook(tensor%p, hook_id), "torch_tensor_remove_hook", stat, errmsg)
  end subroutine torch_tensor_remove_hook

  ! Called by the C layer during backward: runs a gradient hook.
  recursive function hook_trampoline(data, grad, new_grad) result(status) bind(c)
    type(c_ptr), value :: data
    type(c_ptr), value :: grad
    type(c_ptr), intent(inout) :: new_grad
    integer(c_int) :: status
    class(callback_box), pointer :: box
    ! Arrays of tensors the C layer owns are pointers: never finalized (their handles are not ours),
    ! and not the local arrays flang warns about (torch_tensor has no finalizer of rank 1, on purpose).
    type(torch_tensor), pointer :: g(:), replacement(:)
    integer :: user_stat
    character(len=1024) :: user_msg
    box => callback_box_at(data)
    allocate(g(1), replacement(1))
    g(1)%p = grad  ! owned by the C layer
    call ftorch_callback_begin(user_stat, user_msg)
    select type (box)
    type is (hook_box)
      call box%fn(g(1), replacement(1), user_stat, user_msg)
    end select
    status = ftorch_callback_end(user_stat, user_msg)
    new_grad = replacement(1)%p  ! taken over by the C layer
    g(1)%p = c_null_ptr
    replacement(1)%p = c_null_ptr
    deallocate(g, replacement)
  end function hook_trampoline

  logical function hook_same(box, other)
    class(hook_box), intent(in) :: box
    class(callback_box), intent(in) :: other
    hook_same = .false.
    select type (other)
    type is (hook_box)
      hook_same = associated(box%fn, other%fn)
    end select
  end function hook_same

  !> Anomaly detection (process-wide, as torch.autograd.set_detect_anomaly): while enabled,
  !> backward checks the results of every node for NaN (`check_nan`, default .true.) and fails
  !> naming the node -- the backward of the forward operation that produced it (`SqrtBackward0`
  !> for torch_sqrt, a custom function by its name) -- and LibTorch prints the native stack of
  !> the forward call that created the node. Slows backward down: for debugging.
  subroutine torch_autograd_set_detect_anomaly(enabled, check_nan, stat, errmsg)
    !> .true. to switch anomaly detection on, .false. to switch it off.
    logical, intent(in) :: enabled
    !> Whether to check the nodes’ results for NaN while enabled (default .true.).
    logical, intent(in), optional :: check_nan
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: nan
    nan = 1
    if (present(check_nan)) nan = c_flag(check_nan)
    call ftorch_check(ftc_set_detect_anomaly(c_flag(enabled), nan), "torch_autograd_set_detect_anomaly", stat, errmsg)
  end subroutine torch_autograd_set_detect_anomaly

  !> Whether anomaly detection is on.
  logical function torch_autograd_detect_anomaly_enabled()
    torch_autograd_detect_anomaly_enabled = ftc_detect_anomaly_enabled() /= 0
  end function torch_autograd_detect_anomaly_enabled
end module ftorch_autograd
