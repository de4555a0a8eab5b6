! Custom autograd functions, the functional gradient API, gradcheck, hooks, saved-tensor hooks,
! checkpointing and anomaly mode (issue: Fortran-defined autograd functions). Values and
! gradients are written to files (one line per tensor, row-major) that tests/test_function.py
! compares with PyTorch at test time; everything else is checked here.
module custom_functions
  use, intrinsic :: iso_fortran_env, only: real64, int64
  use ftorch
  implicit none
  public

  ! What the callbacks saw, for the checks in the program.
  logical :: needs(3) = .false., values_ok = .false., grad2_absent = .false., grad2_zero = .false.
  logical :: value_errors_ok = .false.
  integer :: fail_backward = 0, fail_forward = 0, backward_calls = 0, pack_calls = 0, unpack_calls = 0
  integer :: bad_gradient = 0
  integer :: expression_calls = 0, fail_expression_after = -1
  real(real64) :: hook_scale = 2.0_real64
  real(real64) :: trace_z(3) = 0, trace_gamma = 0.5_real64, trace_alpha = 0.1_real64, trace_delta = 2.0_real64
  type(torch_tensor) :: segment_weight

contains

  ! ---- the custom linear layer of PyTorch's custom-function tutorial: y = x W^T + b
  subroutine linear_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call ctx%save_for_backward(inputs)
    outputs(1) = torch_matmul(inputs(1), torch_transpose(inputs(2), 1, 2)) + inputs(3)
  end subroutine linear_forward

  subroutine linear_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x, w
    integer :: i
    call ctx%saved_tensor(1, x)
    call ctx%saved_tensor(2, w)
    do i = 1, 3
      needs(i) = ctx%needs_input_grad(i)
    end do
    if (needs(1)) grad_inputs(1) = torch_matmul(grad_outputs(1), w)
    if (needs(2)) grad_inputs(2) = torch_matmul(torch_transpose(grad_outputs(1), 1, 2), x)
    if (needs(3)) grad_inputs(3) = torch_sum(grad_outputs(1), dim=1)
    call torch_delete(x)
    call torch_delete(w)
  end subroutine linear_backward

  ! ---- y = alpha x^3 with alpha a non-tensor argument; saved values of every kind
  subroutine cube_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    real(real64), allocatable :: alpha(:)
    if (fail_forward /= 0) then
      stat = fail_forward
      errmsg = "forward refused on purpose"
      return
    end if
    alpha = ctx%real_args()
    call ctx%save_for_backward([inputs(1)])
    call ctx%save_value("n", 42)
    call ctx%save_value("big", 9000000000_int64)
    call ctx%save_value("r32", 1.5)
    call ctx%save_value("flags", [.true., .false., .true.])
    call ctx%save_value("coefs", [0.25_real64, -3.5_real64])
    outputs(1) = alpha(1) * inputs(1) ** 3
  end subroutine cube_forward

  subroutine cube_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x
    integer :: n
    integer(int64) :: big
    real :: r32
    logical, allocatable :: flags(:)
    real(real64), allocatable :: coefs(:), alpha(:)
    integer, allocatable :: ints(:)
    integer :: s_narrow, s_kind, s_missing_ok, s_missing
    character(len=200) :: m_narrow
    backward_calls = backward_calls + 1
    if (fail_backward /= 0) then
      stat = fail_backward
      errmsg = "adjoint refused on purpose"
      return
    end if
    call ctx%load_value("n", n)
    call ctx%load_value("big", big)
    call ctx%load_value("r32", r32)
    call ctx%load_value("flags", flags)
    call ctx%load_value("coefs", coefs)
    alpha = ctx%real_args()
    ! Loads that cannot give the value saved are errors, never wrong or empty values.
    n = -1
    m_narrow = ""
    call ctx%load_value("big", n, stat=s_narrow, errmsg=m_narrow)   ! 9e9 into a 32-bit integer
    call ctx%load_value("coefs", ints, missing_ok=.true., stat=s_kind)  ! reals into integers
    call ctx%load_value("absent", ints, missing_ok=.true., stat=s_missing_ok)
    value_errors_ok = s_narrow == FTORCH_ERR_DTYPE .and. index(m_narrow, "32-bit") > 0 .and. &
                      s_kind == FTORCH_ERR_DTYPE .and. s_missing_ok == 0
    if (value_errors_ok) value_errors_ok = size(ints) == 0
    call ctx%load_value("absent", ints, stat=s_missing)
    value_errors_ok = value_errors_ok .and. s_missing == FTORCH_ERR_INVALID_ARGUMENT
    call ctx%load_value("n", n)
    values_ok = n == 42 .and. big == 9000000000_int64 .and. r32 == 1.5 .and. size(flags) == 3 .and. &
                size(coefs) == 2 .and. size(alpha) == 1
    if (values_ok) values_ok = flags(1) .and. .not. flags(2) .and. flags(3) .and. coefs(2) == -3.5_real64 .and. &
                               alpha(1) == 0.5_real64
    call ctx%saved_tensor(1, x)
    grad_inputs(1) = grad_outputs(1) * (3 * alpha(1)) * x * x
    call torch_delete(x)
  end subroutine cube_backward

  ! ---- two outputs: y1 = sin(x) (differentiable), y2 = x > 0 as 0/1 (not differentiable)
  subroutine split_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call ctx%save_for_backward([inputs(1)])
    outputs(1) = torch_sin(inputs(1))
    outputs(2) = (torch_sign01(inputs(1)))
    call ctx%mark_non_differentiable(2)
  end subroutine split_forward

  function torch_sign01(x) result(y)
    type(torch_tensor), intent(in) :: x
    type(torch_tensor) :: y
    y = (torch_abs(x) + x) / (2 * torch_abs(x))
  end function torch_sign01

  subroutine split_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x
    real(real64) :: g2(3)
    g2 = -1
    call torch_tensor_to_array(grad_outputs(2), g2)
    grad2_zero = all(g2 == 0)
    call ctx%saved_tensor(1, x)
    grad_inputs(1) = grad_outputs(1) * torch_cos(x)
    call torch_delete(x)
  end subroutine split_backward

  ! ---- two outputs y1 = 2x, y2 = 3x with materialize_grads off
  subroutine pair_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call ctx%set_materialize_grads(.false.)
    outputs(1) = inputs(1) * 2
    outputs(2) = inputs(1) * 3
  end subroutine pair_forward

  subroutine pair_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    grad2_absent = .not. c_associated_tensor(grad_outputs(2))
    grad_inputs(1) = grad_outputs(1) * 2
  end subroutine pair_backward

  logical function c_associated_tensor(t)
    use, intrinsic :: iso_c_binding, only: c_associated
    type(torch_tensor), intent(in) :: t
    c_associated_tensor = c_associated(t%p)
  end function c_associated_tensor

  ! ---- in place: x <- 2 x through the Fortran array, marked dirty
  subroutine double_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    real(real64), pointer :: values(:)
    call torch_tensor_data_pointer(inputs(1), values)
    values = 2 * values
    call ctx%mark_dirty(1, 1)
  end subroutine double_forward

  subroutine double_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    grad_inputs(1) = grad_outputs(1) * 2
  end subroutine double_backward

  ! ---- backwards that return wrong gradients, or fail inside an FTorch call
  subroutine wrong_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x
    select case (bad_gradient)
    case (1)  ! wrong shape
      grad_inputs(1) = torch_reshape(grad_outputs(1), [3, 1])
    case (2)  ! wrong dtype
      call torch_tensor_ones(grad_inputs(1), 1, [3_int64], torch_kFloat32, torch_kCPU)
    case (3)  ! an FTorch call failing without stat
      grad_inputs(1) = torch_reshape(grad_outputs(1), [7])
    case (4)  ! a deliberately wrong adjoint (for gradcheck): d/dx x^2 taken as x
      call ctx%saved_tensor(1, x)
      grad_inputs(1) = grad_outputs(1) * x
    case default
      call ctx%saved_tensor(1, x)
      grad_inputs(1) = grad_outputs(1) * 2 * x
    end select
    call torch_delete(x)
  end subroutine wrong_backward

  subroutine square_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    call ctx%save_for_backward([inputs(1)])
    outputs(1) = inputs(1) * inputs(1)
  end subroutine square_forward

  ! ---- saves a tensor, then gives it new values: an error when forward returns
  subroutine resave_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: e
    e = inputs(1) * 2.0_real64
    call ctx%save_for_backward([e])
    e = inputs(1) * 3.0_real64
    outputs(1) = inputs(1) * e
    call torch_delete(e)
  end subroutine resave_forward

  ! A backward made of differentiable operations: usable under create_graph when declared.
  subroutine square_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: x
    call ctx%saved_tensor(1, x)
    grad_inputs(1) = grad_outputs(1) * 2 * x
    call torch_delete(x)
  end subroutine square_backward

  ! ---- a backward that produces NaN (anomaly mode names the function)
  subroutine nan_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    grad_inputs(1) = grad_outputs(1) * 0 / 0.0_real64
  end subroutine nan_backward

  ! ---- functions of tensors (gradcheck, checkpointing)
  subroutine expression(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    expression_calls = expression_calls + 1
    if (fail_expression_after >= 0 .and. expression_calls > fail_expression_after) then
      stat = 1
      errmsg = "the expression gave up"
      return
    end if
    outputs(1) = torch_sin(inputs(1)) * inputs(2) + inputs(1) ** 2
    outputs(2) = torch_tanh(inputs(2) * inputs(1))
  end subroutine expression

  subroutine apply_square(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_function), save :: f
    if (f%id == 0) call torch_function_define(f, "wrong_square", square_forward, wrong_backward)
    call torch_function_apply(f, inputs, outputs, stat=stat, errmsg=errmsg)
  end subroutine apply_square

  subroutine apply_linear(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_function), save :: f
    if (f%id == 0) call torch_function_define(f, "linear", linear_forward, linear_backward)
    call torch_function_apply(f, inputs, outputs, stat=stat, errmsg=errmsg)
  end subroutine apply_linear

  ! One time step s <- s + 0.1 tanh(w s), w a module variable (as a model's weights would be).
  subroutine step(inputs, outputs, stat, errmsg)
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    outputs(1) = inputs(1) + 0.1_real64 * torch_tanh(segment_weight * inputs(1))
  end subroutine step

  ! ---- hooks
  subroutine scale_hook(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * hook_scale
  end subroutine scale_hook

  ! Eligibility trace (reinforcement learning): z <- gamma z + grad; grad <- alpha delta z.
  subroutine trace_hook(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    real(real64), target :: g(3)
    type(torch_tensor) :: tg
    call torch_tensor_to_array(grad, g)
    trace_z = trace_gamma * trace_z + g
    g = trace_alpha * trace_delta * trace_z
    call torch_tensor_from_array(tg, g, torch_kCPU)
    new_grad = torch_clone(tg)  ! not tied to this procedure's array
    call torch_delete(tg)
  end subroutine trace_hook

  ! Registered only by callbacks_registered_once (new to the registry there).
  subroutine identity_hook(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 1.0_real64
  end subroutine identity_hook

  subroutine failing_hook(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    stat = 5
    errmsg = "hook refused on purpose"
  end subroutine failing_hook

  ! ---- saved-tensor hooks: pack into a clone, count the calls
  subroutine count_pack(tensor, packed, stat, errmsg)
    type(torch_tensor), intent(in) :: tensor
    type(torch_tensor), intent(inout) :: packed
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    pack_calls = pack_calls + 1
    packed = torch_clone(tensor)
  end subroutine count_pack

  subroutine failing_pack(tensor, packed, stat, errmsg)
    type(torch_tensor), intent(in) :: tensor
    type(torch_tensor), intent(inout) :: packed
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    packed = torch_clone(tensor)  ! made, then the hook fails: the library frees it
    stat = 1
    errmsg = "pack refused on purpose"
  end subroutine failing_pack

  subroutine count_unpack(packed, tensor, stat, errmsg)
    type(torch_tensor), intent(in) :: packed
    type(torch_tensor), intent(inout) :: tensor
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    unpack_calls = unpack_calls + 1
    tensor = packed
  end subroutine count_unpack

  ! ---- a function that saves a large intermediate (for the offload memory test)
  subroutine heavy_forward(ctx, inputs, outputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: inputs(:)
    type(torch_tensor), intent(inout) :: outputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: e
    e = torch_exp(inputs(1) * 0.001_real64)
    call ctx%save_for_backward([e])
    outputs(1) = torch_sum(e)
    call torch_delete(e)
  end subroutine heavy_forward

  subroutine heavy_backward(ctx, grad_outputs, grad_inputs, stat, errmsg)
    type(torch_function_ctx), intent(inout) :: ctx
    type(torch_tensor), intent(in) :: grad_outputs(:)
    type(torch_tensor), intent(inout) :: grad_inputs(:)
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    type(torch_tensor) :: e
    call ctx%saved_tensor(1, e)
    grad_inputs(1) = grad_outputs(1) * e * 0.001_real64
    call torch_delete(e)
  end subroutine heavy_backward
end module custom_functions

program test_function
  use, intrinsic :: iso_fortran_env, only: real64, real32, int64
  use ftorch
  use custom_functions
  use testing, only: check, check_close, summary, data_path, rss_kib
  implicit none
  integer :: out

  open(newunit=out, file=data_path("function_results.txt"), status="replace", action="write")
  call tutorial_linear()
  call context_features()
  call in_place()
  call double_backward_rules()
  call callback_errors()
  call wrong_gradients()
  call functional_api()
  call gradient_check()
  call gradient_hooks()
  call saved_tensor_hooks()
  call checkpointing()
  call anomaly_mode()
  call memory_flat()
  call callbacks_registered_once()
  close(out)
  call summary()

contains

  ! One line "name v1 v2 ..." per tensor, values in row-major order.
  subroutine record(name, t)
    character(len=*), intent(in) :: name
    type(torch_tensor), intent(in) :: t
    real(real64), allocatable :: v(:)
    integer :: n
    type(torch_tensor) :: flat
    n = int(product(t%get_shape()))
    allocate(v(n))
    flat = torch_reshape(t, [n])
    call torch_tensor_to_array(flat, v)
    write(out, '(a)', advance="no") name
    write(out, '(*(1x,es24.16e3))') v
  end subroutine record

  subroutine tutorial_linear()
    real(real64), target :: x(4, 3), w(2, 3), b(2), y(4, 2)
    type(torch_tensor) :: tx, tw, tb, outs(1), loss, gx, gw, gb
    type(torch_function) :: linear
    integer :: i, j
    do j = 1, 3
      do i = 1, 4
        x(i, j) = sin(0.3_real64 * i + 0.7_real64 * j)
      end do
      w(:, j) = [cos(0.5_real64 * j), 0.2_real64 * j - 0.3_real64]
    end do
    b = [0.1_real64, -0.4_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tw, w, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tb, b, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(outs(1), y, torch_kCPU)
    call torch_function_define(linear, "LinearFunction", linear_forward, linear_backward)
    call torch_function_apply(linear, [tx, tw, tb], outs)
    call check(abs(y(3, 2) - (sum(x(3, :) * w(2, :)) + b(2))) < 1e-14_real64, "linear: output lands in the Fortran array")
    loss = torch_sum(outs(1) * outs(1))
    call torch_tensor_backward(loss)
    call check(all(needs), "linear: needs_input_grad for three inputs that require grad")
    call record("linear_y", outs(1))
    call torch_tensor_get_gradient(gx, tx)
    call record("linear_gx", gx)
    call torch_tensor_get_gradient(gw, tw)
    call record("linear_gw", gw)
    call torch_tensor_get_gradient(gb, tb)
    call record("linear_gb", gb)
    ! Only x requires grad: backward is told not to compute the others.
    call torch_tensor_set_requires_grad(tw, .false.)
    call torch_tensor_set_requires_grad(tb, .false.)
    call torch_function_apply(linear, [tx, tw, tb], outs)
    call torch_tensor_backward(torch_sum(outs(1)))
    call check(needs(1) .and. .not. needs(2) .and. .not. needs(3), "linear: needs_input_grad false for frozen inputs")
  end subroutine tutorial_linear

  subroutine context_features()
    real(real64), target :: x(3)
    type(torch_tensor) :: tx, outs(1), outs2(2), g
    type(torch_function) :: cube, split, pair
    integer :: stat
    character(len=1024) :: msg
    x = [0.5_real64, -1.25_real64, 2.0_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_function_define(cube, "cube", cube_forward, cube_backward)
    call torch_function_apply(cube, [tx], outs, real_args=[0.5_real64])
    call torch_tensor_backward(torch_sum(outs(1)))
    call check(values_ok, "ctx: saved integers, reals, logicals, arrays and non-tensor arguments")
    call check(value_errors_ok, "ctx: a value too large for the integer, of another kind or missing is an error " // &
               "(missing_ok: only a missing key gives an empty array)")
    call torch_tensor_get_gradient(g, tx)
    call record("cube_y", outs(1))
    call record("cube_gx", g)
    call tx%zero_grad()
    ! Several outputs, one not differentiable.
    call torch_function_define(split, "split", split_forward, split_backward)
    call torch_function_apply(split, [tx], outs2)
    call check(.not. outs2(2)%requires_grad() .and. outs2(1)%requires_grad(), &
               "ctx: mark_non_differentiable output does not require grad")
    call torch_tensor_backward(torch_sum(outs2(1) * 3))
    call check(grad2_zero, "ctx: a non-differentiable output's gradient is materialized as zeros")
    call torch_tensor_get_gradient(g, tx)
    call record("split_gx", g)
    call tx%zero_grad()
    ! materialize_grads off: the unused output's gradient is absent.
    call torch_function_define(pair, "pair", pair_forward, pair_backward)
    call torch_function_apply(pair, [tx], outs2)
    call torch_tensor_backward(torch_sum(outs2(1)))
    call check(grad2_absent, "ctx: set_materialize_grads(.false.) passes an absent gradient")
    call torch_tensor_get_gradient(g, tx)
    call check(all(abs(tensor_values(g, 3) - 2) < 1e-15_real64), "ctx: gradient through the used output")
    ! A saved tensor modified in place after it was saved: a clear error when backward reads it.
    call torch_function_apply(cube, [tx], outs, real_args=[0.5_real64])
    call tx%zero()
    call torch_tensor_backward(torch_sum(outs(1)), stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "modified by an inplace operation") > 0 .and. &
               index(msg, "'cube'") > 0, "ctx: a saved tensor modified in place is a clear error")
  end subroutine context_features

  function tensor_values(t, n) result(v)
    type(torch_tensor), intent(in) :: t
    integer, intent(in) :: n
    real(real64), allocatable :: v(:)  ! allocatable: large results stay off the stack
    type(torch_tensor) :: flat
    allocate(v(n))
    flat = torch_reshape(t, [n])
    call torch_tensor_to_array(flat, v)
  end function tensor_values

  subroutine in_place()
    real(real64), target :: x(3)
    type(torch_tensor) :: tx, xc, outs(1), g
    type(torch_function) :: dbl
    integer :: stat
    character(len=512) :: msg
    x = [1.0_real64, 2.0_real64, 3.0_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    xc = tx * 1
    call torch_function_define(dbl, "double_in_place", double_forward, double_backward)
    call torch_function_apply(dbl, [xc], outs)
    call check(all(tensor_values(xc, 3) == [2.0_real64, 4.0_real64, 6.0_real64]), "mark_dirty: input modified in place")
    call check(all(tensor_values(outs(1), 3) == tensor_values(xc, 3)), "mark_dirty: the output is the input")
    call torch_tensor_backward(torch_sum(outs(1) * outs(1)))
    call torch_tensor_get_gradient(g, tx)
    call check(all(abs(tensor_values(g, 3) - 8 * x) < 1e-14_real64), "mark_dirty: gradient through the in-place node")
    ! A leaf that requires grad cannot be modified in place.
    call torch_function_apply(dbl, [tx], outs, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "leaf") > 0, "mark_dirty: a leaf requiring grad is a clear error")
  end subroutine in_place

  subroutine double_backward_rules()
    real(real64), target :: x(3)
    type(torch_tensor) :: tx, outs(1), dx, g
    type(torch_function) :: once, twice
    integer :: stat
    character(len=512) :: msg
    x = [0.5_real64, -1.5_real64, 2.5_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    bad_gradient = 0
    call torch_function_define(once, "square_once", square_forward, square_backward)
    call torch_function_apply(once, [tx], outs)
    call torch_autograd_grad(dx, torch_sum(outs(1)), tx, create_graph=.true.)
    call check(all(abs(tensor_values(dx, 3) - 2 * x) < 1e-15_real64), "once differentiable: first derivative")
    call torch_tensor_backward(torch_sum(dx), stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "square_once") > 0 .and. index(msg, "once differentiable") > 0, &
               "once differentiable: double backward is a clear error naming the function")
    call torch_function_define(twice, "square_twice", square_forward, square_backward, double_backward=.true.)
    call torch_function_apply(twice, [tx], outs)
    call torch_autograd_grad(dx, torch_sum(outs(1) * outs(1)), tx, create_graph=.true.)
    call torch_tensor_backward(torch_sum(dx))
    call torch_tensor_get_gradient(g, tx)
    call record("twice_dx", dx)
    call record("twice_gx", g)
  end subroutine double_backward_rules

  subroutine callback_errors()
    real(real64), target :: x(3)
    type(torch_tensor) :: tx, outs(1), loss, g
    type(torch_function) :: cube, resave
    type(torch_function_ctx) :: dead
    real(real64), allocatable :: dead_args(:)
    integer :: stat, before
    character(len=512) :: msg
    x = [0.5_real64, 1.0_real64, 1.5_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_function_define(cube, "cube", cube_forward, cube_backward)
    before = int(ftorch_live_handles())
    fail_forward = 3
    call torch_function_apply(cube, [tx], outs, real_args=[0.5_real64], stat=stat, errmsg=msg)
    fail_forward = 0
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "forward refused on purpose") > 0 .and. &
               index(msg, "'cube'") > 0, "callback: a failing forward gives stat/errmsg naming the function")
    call check(int(ftorch_live_handles()) == before, "callback: a failing forward leaks no handle")
    call torch_function_apply(cube, [tx], outs, real_args=[0.5_real64])
    loss = torch_sum(outs(1))
    fail_backward = 9
    call torch_tensor_backward(loss, retain_graph=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "adjoint refused on purpose") > 0 .and. &
               index(msg, "'cube'") > 0 .and. index(msg, "status 9") > 0, &
               "callback: a failing backward gives stat/errmsg naming the function")
    ! Without stat, inside a catch scope.
    call torch_catch_begin()
    call torch_tensor_backward(loss, retain_graph=.true.)
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_CALLBACK, "callback: a failing backward without stat is caught")
    fail_backward = 0
    call torch_tensor_backward(loss)
    call torch_tensor_get_gradient(g, tx)
    call check(all(abs(tensor_values(g, 3) - 1.5_real64 * x * x) < 1e-14_real64), &
               "callback: the graph is usable after a failed backward")
    ! A context that is not live (a default one, outside any callback) has no arguments to give:
    ! an error, not an empty array.
    call torch_catch_begin()
    dead_args = dead%real_args()
    call torch_catch_end(stat, msg)
    call check(stat /= 0, "ctx: real_args of a context that is not live is an error: " // trim(msg))
    ! A tensor given new values by = after save_for_backward (backward would get the old values,
    ! or the new ones, depending on whether = wrote in place): an error naming the function.
    call torch_function_define(resave, "resave", resave_forward, square_backward)
    before = int(ftorch_live_handles())
    call torch_function_apply(resave, [tx], outs, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "'resave'") > 0 .and. &
               index(msg, "the left-hand side was saved for backward") > 0, &
               "save_for_backward: a saved tensor given new values before forward returns is an error: " // trim(msg))
    call check(int(ftorch_live_handles()) == before, "save_for_backward: ... and leaks no handle")
    ! Outside a forward (a context that is not live): an error, and the expression's temporary released.
    call dead%save_for_backward([tx * 2.0_real64], stat=stat, errmsg=msg)
    call check(stat /= 0 .and. int(ftorch_live_handles()) == before, &
               "save_for_backward outside a forward: an error that releases its temporary")
  end subroutine callback_errors

  subroutine wrong_gradients()
    real(real64), target :: x(3)
    type(torch_tensor) :: tx, outs(1), loss
    type(torch_function) :: f
    integer :: stat
    character(len=512) :: msg
    x = [0.5_real64, 1.0_real64, 1.5_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_function_define(f, "bad_adjoint", square_forward, wrong_backward)
    call torch_function_apply(f, [tx], outs)
    loss = torch_sum(outs(1))
    bad_gradient = 1
    call torch_tensor_backward(loss, retain_graph=.true., stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "'bad_adjoint'") > 0 .and. index(msg, "[3, 1]") > 0, &
               "wrong gradient shape is a clear error naming the function")
    bad_gradient = 2
    call torch_tensor_backward(loss, retain_graph=.true., stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "'bad_adjoint'") > 0 .and. index(msg, "Float") > 0, &
               "wrong gradient dtype is a clear error naming the function")
    bad_gradient = 3
    call torch_tensor_backward(loss, retain_graph=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "torch_reshape") > 0, &
               "an FTorch call failing inside backward surfaces as the callback's failure")
    bad_gradient = 0
    call torch_tensor_backward(loss, stat=stat)
    call check(stat == 0, "graph usable after wrong gradients")
  end subroutine wrong_gradients

  subroutine functional_api()
    real(real64), target :: x(3), w(3), v(3), gbuf(3)
    type(torch_tensor) :: tx, tw, tv, u, dudx, residual, g, gs(2), jac, jv, vj, unused
    x = [0.1_real64, 0.7_real64, -0.4_real64]
    w = [1.3_real64, -0.8_real64, 0.5_real64]
    v = [1.0_real64, 2.0_real64, -1.0_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tw, w, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tv, v, torch_kCPU)
    ! Physics-informed: the residual contains du/dx; backward to the weights.
    u = torch_tanh(tw * tx) * tw
    call torch_autograd_grad(dudx, torch_sum(u), tx, create_graph=.true.)
    residual = torch_sum((dudx - 1) ** 2)
    call torch_tensor_backward(residual)
    call torch_tensor_get_gradient(g, tw)
    call record("pinn_dudx", dudx)
    call record("pinn_gw", g)
    call check(.not. torch_tensor_is_leaf(dudx), "grad with create_graph has a graph")
    ! .grad untouched by the functional API; several inputs; grad_outputs; into a Fortran array.
    call tw%zero_grad()
    u = torch_sin(tw * tx)
    gbuf = 0
    call torch_tensor_from_array(gs(1), gbuf, torch_kCPU)
    call torch_autograd_grad(gs, [u], [tx, tw], grad_outputs=[tv], retain_graph=.true.)
    call record("vjp_gx", gs(1))
    call record("vjp_gw", gs(2))
    call check(all(gbuf == tensor_values(gs(1), 3)), "grad into a constructed tensor lands in its array")
    call torch_tensor_get_gradient(g, tw)
    call check(all(tensor_values(g, 3) == 0), "grad leaves .grad alone")
    ! allow_unused
    call torch_tensor_ones(unused, 1, [3_int64], torch_kFloat64, torch_kCPU, requires_grad=.true.)
    call torch_autograd_grad(gs, [torch_sum(u)], [tx, unused], allow_unused=.true., retain_graph=.true.)
    call check(.not. c_associated_tensor(gs(2)) .or. all(tensor_values(gs(2), 3) == 0), "allow_unused: no gradient")
    call torch_autograd_jacobian(jac, u, tx)
    call record("jacobian", jac)
    call torch_autograd_jvp(jv, u, tx, tv)
    call record("jvp", jv)
    call torch_autograd_vjp(vj, u, tw, tv)
    call record("vjp", vj)
  end subroutine functional_api

  subroutine gradient_check()
    real(real64), target :: a(3), b(3), x(2, 3), w(2, 3), bias(2)
    real(real32), target :: a32(3)
    type(torch_tensor) :: ta, tb, tx, tw, tbias, t32, squares, g
    type(torch_gradcheck_result) :: r
    integer :: stat
    character(len=512) :: msg
    a = [0.3_real64, -0.6_real64, 1.2_real64]
    b = [0.9_real64, 0.4_real64, -0.2_real64]
    x = reshape([0.1_real64, 0.2_real64, -0.3_real64, 0.4_real64, 0.5_real64, -0.6_real64], [2, 3])
    w = reshape([0.7_real64, -0.1_real64, 0.3_real64, 0.2_real64, -0.5_real64, 0.8_real64], [2, 3])
    bias = [0.05_real64, -0.02_real64]
    call torch_tensor_from_array(ta, a, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tb, b, torch_kCPU, requires_grad=.true.)
    squares = ta * ta  ! (a graph that saved ta, recorded before the check)
    call check(torch_gradcheck(expression, [ta, tb], n_outputs=2, result=r), "gradcheck: an expression passes")
    call check(r%max_error < 1e-8_real64, "gradcheck: worst error small for a correct gradient")
    call check(all(a == [0.3_real64, -0.6_real64, 1.2_real64]), "gradcheck: inputs restored")
    call torch_tensor_backward(torch_sum(squares), stat=stat, errmsg=msg)
    call torch_tensor_get_gradient(g, ta)
    call check(stat == 0, "gradcheck: a graph recorded before it that saved an input still backpropagates: " // trim(msg))
    call check(all(tensor_values(g, 3) == 2 * a), "gradcheck: that graph’s gradient is unchanged")
    call torch_delete(squares)
    call torch_delete(g)
    call ta%zero_grad()
    ! The function fails at its second call (the first perturbed evaluation): the input element it
    ! had perturbed gets its value back.
    expression_calls = 0
    fail_expression_after = 1
    msg = ""
    call check(.not. torch_gradcheck(expression, [ta, tb], n_outputs=2, stat=stat, errmsg=msg) .and. stat /= 0 &
               .and. index(msg, "the expression gave up") > 0, "gradcheck: a failing function is an error: " // trim(msg))
    fail_expression_after = -1
    call check(all(a == [0.3_real64, -0.6_real64, 1.2_real64]), "gradcheck: inputs restored when the function fails")
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tw, w, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tbias, bias, torch_kCPU, requires_grad=.true.)
    call check(torch_gradcheck(apply_linear, [tx, tw, tbias]), "gradcheck: the custom linear function passes")
    bad_gradient = 4
    call check(.not. torch_gradcheck(apply_square, [ta], result=r), "gradcheck: a wrong backward fails")
    bad_gradient = 0
    ! d(x^2)/dx = 2x, the wrong backward says x: the worst entry is the largest |x|, element 3.
    call check(r%input == 1 .and. r%input_element == 3 .and. r%output == 1 .and. r%output_element == 3 .and. &
               abs(r%analytic - 1.2_real64) < 1e-12_real64 .and. abs(r%numeric - 2.4_real64) < 1e-6_real64, &
               "gradcheck: reports where the worst mismatch is")
    a32 = 1
    call torch_tensor_from_array(t32, a32, torch_kCPU, requires_grad=.true.)
    call check(.not. torch_gradcheck(expression, [t32, t32], n_outputs=2, stat=stat, errmsg=msg) .and. &
               stat == FTORCH_ERR_DTYPE, "gradcheck: float32 inputs are a clear error")
  end subroutine gradient_check

  subroutine gradient_hooks()
    real(real64), target :: w(3), x(3)
    type(torch_tensor) :: tw, tx, g
    integer(int64) :: id
    integer :: stat, i
    character(len=512) :: msg
    w = [0.2_real64, -0.4_real64, 0.6_real64]
    x = [1.0_real64, 2.0_real64, 3.0_real64]
    call torch_tensor_from_array(tw, w, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tx, x, torch_kCPU)
    call torch_tensor_register_hook(tw, scale_hook, id)
    call torch_tensor_backward(torch_sum(tw * tx))
    call torch_tensor_get_gradient(g, tw)
    call check(all(abs(tensor_values(g, 3) - 2 * x) < 1e-15_real64), "hook: replaces the gradient")
    call torch_tensor_remove_hook(tw, id)
    call tw%zero_grad()
    call torch_tensor_backward(torch_sum(tw * tx))
    call torch_tensor_get_gradient(g, tw)
    call check(all(abs(tensor_values(g, 3) - x) < 1e-15_real64), "hook: removed")
    ! Eligibility traces over three steps.
    call torch_tensor_register_hook(tw, trace_hook, id)
    do i = 1, 3
      call tw%zero_grad()
      call torch_tensor_backward(torch_sum(torch_sin(tw * tx * i)))
    end do
    call torch_tensor_get_gradient(g, tw)
    call record("trace_grad", g)
    call torch_tensor_remove_hook(tw, id)
    call torch_tensor_register_hook(tw, failing_hook, id)
    call torch_tensor_backward(torch_sum(tw * tx), stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "hook refused on purpose") > 0, &
               "hook: a failing hook fails the backward cleanly")
    call torch_tensor_remove_hook(tw, id)
    call torch_tensor_register_hook(tx, scale_hook, id, stat=stat)
    call check(stat /= 0, "hook: a tensor that does not require grad is refused")
  end subroutine gradient_hooks

  subroutine saved_tensor_hooks()
    integer, parameter :: n = 1000000
    real(real64), allocatable, target :: x(:)
    type(torch_tensor) :: tx, outs(1), g, g_ref
    type(torch_function) :: heavy, cube
    integer(int64) :: rss_plain, rss_files
    integer :: i
    character(len=32) :: threshold
    allocate(x(n))
    x = [(real(i, real64) / n, i = 1, n)]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_function_define(heavy, "heavy", heavy_forward, heavy_backward)
    call torch_function_define(cube, "cube", cube_forward, cube_backward)
    ! User pack/unpack.
    call torch_saved_tensors_hooks_begin(count_pack, count_unpack)
    call torch_function_apply(cube, [tx], outs, real_args=[0.5_real64])
    call torch_saved_tensors_hooks_end()
    call torch_tensor_backward(torch_sum(outs(1)))
    call check(pack_calls == 1 .and. unpack_calls == 1, "saved-tensor hooks: pack and unpack called once each")
    call torch_tensor_get_gradient(g, tx)
    call check(abs(tensor_values_at(g, n) - 1.5_real64) < 1e-12_real64, "saved-tensor hooks: gradient unchanged")
    ! Peak memory of saved tensors, offloaded to files or kept in memory (tests/test_function.py
    ! runs this with a fixed glibc mmap threshold, so that freed blocks leave the RSS).
    call run_heavy(tx, heavy, 1, g, rss_files)
    call run_heavy(tx, heavy, 0, g_ref, rss_plain)
    call check(all(tensor_values(g, n) == tensor_values(g_ref, n)), "file offload: gradients unchanged (bitwise)")
    call get_environment_variable("MALLOC_MMAP_THRESHOLD_", threshold, status=i)
    if (rss_kib() >= 0 .and. i == 0) then
      write(*, '(a,i0,a,i0,a)') "  saved tensors in memory: +", rss_plain, " KiB; in files: +", rss_files, " KiB"
      call check(rss_plain > 40000 .and. rss_files < rss_plain / 4, "file offload: peak memory drops")
    end if
    call check(torch_saved_tensors_files() == 0, "file offload: files removed with the graph")
    call run_heavy(tx, heavy, 2, g, rss_files)
    call check(all(tensor_values(g, n) == tensor_values(g_ref, n)), "CPU offload: gradients unchanged")
    call saved_then_modified(cube)
  end subroutine saved_tensor_hooks

  ! A tensor saved for backward, then written in place: an error under every saved-tensor policy, as
  ! without one (LibTorch checks only what was saved without hooks; FTorch checks the rest). And a
  ! pack hook that fails after making its result leaks nothing.
  subroutine saved_then_modified(cube)
    type(torch_function), intent(in) :: cube
    real(real64), target :: x(3), y(3)
    type(torch_tensor) :: tx, xc, ty, outs(1)
    integer :: policy, stat, i
    integer(int64) :: live
    character(len=512) :: msg
    character(len=*), parameter :: names(0:2) = ["no policy  ", "CPU offload", "user hooks "]
    y = [1.0_real64, 2.0_real64, 4.0_real64]
    call torch_tensor_from_array(ty, y, torch_kCPU)
    do policy = 0, 2
      x = [0.5_real64, 1.0_real64, 2.0_real64]
      call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
      if (policy == 1) call torch_saved_tensors_to_cpu_begin()
      if (policy == 2) call torch_saved_tensors_hooks_begin(count_pack, count_unpack)
      call torch_function_apply(cube, [tx], outs, real_args=[0.5_real64])
      if (policy /= 0) call torch_saved_tensors_hooks_end()
      tx = ty  ! a leaf requiring grad: `=` writes in place, after cube saved it
      msg = ""
      call torch_tensor_backward(torch_sum(outs(1)), stat=stat, errmsg=msg)
      call check(stat /= 0 .and. index(msg, "modified") > 0, &
                 "saved tensor modified in place (" // trim(names(policy)) // "): an error: " // trim(msg))
    end do
    xc = tx * 1
    live = ftorch_live_handles()
    do i = 1, 20
      xc = tx * 1
      call torch_saved_tensors_hooks_begin(failing_pack, count_unpack)
      call torch_function_apply(cube, [xc], outs, real_args=[0.5_real64], stat=stat, errmsg=msg)
      call torch_saved_tensors_hooks_end()
    end do
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "pack refused on purpose") > 0 .and. &
               ftorch_live_handles() == live, "a failing pack hook: a clear error, and no handle left behind")
    call torch_delete(outs)
    call torch_delete(xc)
    call torch_delete(tx)
    call torch_delete(ty)
  end subroutine saved_then_modified

  ! Eight applications of a function that saves 8 MB each; policy 0: in memory, 1: files, 2: CPU.
  subroutine run_heavy(tx, heavy, policy, grad, growth)
    integer, parameter :: apps = 8
    type(torch_tensor), intent(inout) :: tx
    type(torch_function), intent(in) :: heavy
    integer, intent(in) :: policy
    type(torch_tensor), intent(inout) :: grad
    integer(int64), intent(out) :: growth
    type(torch_tensor) :: ys(apps), total
    integer(int64) :: before
    integer :: k
    call tx%zero_grad()
    before = rss_kib()
    if (policy == 1) call torch_saved_tensors_to_files_begin(".", threshold_bytes=1024_int64)
    if (policy == 2) call torch_saved_tensors_to_cpu_begin()
    do k = 1, apps
      call torch_function_apply(heavy, [tx], ys(k:k))
    end do
    if (policy == 1) call check(torch_saved_tensors_files() == apps, "file offload: one file per saved tensor")
    if (policy /= 0) call torch_saved_tensors_hooks_end()
    growth = rss_kib() - before
    total = ys(1)
    do k = 2, apps
      total = total + ys(k)
    end do
    call torch_delete(ys)
    call torch_tensor_backward(torch_sum(total))
    call torch_delete(total)
    call torch_tensor_get_gradient(grad, tx)
  end subroutine run_heavy

  real(real64) function tensor_values_at(t, n)
    type(torch_tensor), intent(in) :: t
    integer, intent(in) :: n
    real(real64), allocatable :: v(:)
    type(torch_tensor) :: flat
    allocate(v(n))
    flat = torch_reshape(t, [n])
    call torch_tensor_to_array(flat, v)
    tensor_values_at = v(n)
  end function tensor_values_at

  subroutine checkpointing()
    real(real64), target :: s0(4), w(4)
    type(torch_tensor) :: ts0, s, seg(1), g0, gw, g0c, gwc
    integer :: k, stat
    character(len=512) :: msg
    s0 = [0.1_real64, 0.4_real64, -0.3_real64, 0.8_real64]
    w = [1.2_real64, -0.6_real64, 0.9_real64, 0.3_real64]
    call torch_tensor_from_array(ts0, s0, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(segment_weight, w, torch_kCPU, requires_grad=.true.)
    ! Plain unrolled loop.
    s = ts0 * 1
    do k = 1, 20
      s = s + 0.1_real64 * torch_tanh(segment_weight * s)
    end do
    call torch_tensor_backward(torch_sum(s * s))
    call torch_tensor_get_gradient(g0, ts0)
    call torch_tensor_get_gradient(gw, segment_weight)
    call ts0%zero_grad()
    call segment_weight%zero_grad()
    ! The same loop, each step checkpointed.
    s = ts0 * 1
    do k = 1, 20
      call torch_checkpoint_segment(step, [s], seg)
      s = seg(1)
    end do
    call torch_tensor_backward(torch_sum(s * s))
    call torch_tensor_get_gradient(g0c, ts0)
    call torch_tensor_get_gradient(gwc, segment_weight)
    call check(all(tensor_values(g0c, 4) == tensor_values(g0, 4)), "checkpoint: input gradients unchanged (bitwise)")
    call check(all(tensor_values(gwc, 4) == tensor_values(gw, 4)), &
               "checkpoint: gradients of parameters used inside the segment unchanged (bitwise)")
    call record("checkpoint_g0", g0c)
    call record("checkpoint_gw", gwc)
    ! The innermost saved-tensor policy applies to what a segment keeps (its inputs): one file here,
    ! removed by the backward, and the same gradients as without the policy.
    call ts0%zero_grad()
    call segment_weight%zero_grad()
    call torch_checkpoint_segment(step, [ts0], seg)
    call torch_tensor_backward(torch_sum(seg(1) * seg(1)))
    call torch_tensor_get_gradient(g0, ts0)
    call ts0%zero_grad()
    call segment_weight%zero_grad()
    call torch_saved_tensors_to_files_begin(".", threshold_bytes=0_int64)
    call torch_checkpoint_segment(step, [ts0], seg)
    call torch_saved_tensors_hooks_end()
    call check(torch_saved_tensors_files() == 1, "checkpoint: a saved-tensor policy applies to the segment's inputs")
    call torch_tensor_backward(torch_sum(seg(1) * seg(1)))
    call torch_tensor_get_gradient(g0c, ts0)
    call check(torch_saved_tensors_files() == 0 .and. all(tensor_values(g0c, 4) == tensor_values(g0, 4)), &
               "checkpoint: the offloaded inputs give the same gradients, the file removed")
    ! Gradients computed without .grad cannot pass through a segment: its backward recomputes it and
    ! writes the .grad of the weights it uses.
    call torch_checkpoint_segment(step, [ts0], seg)
    msg = ""
    call torch_autograd_grad(gw, torch_sum(seg(1)) + torch_sum(segment_weight), segment_weight, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. &
               index(msg, "cannot differentiate through a checkpointed segment") > 0, &
               "checkpoint: torch_autograd_grad through a segment is a clear error: " // trim(msg))
    call torch_autograd_jacobian(gw, seg(1), ts0, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "torch_autograd_jacobian") > 0, &
               "checkpoint: torch_autograd_jacobian through a segment is a clear error")
    ! Not twice differentiable.
    call torch_checkpoint_segment(step, [ts0], seg)
    call torch_autograd_grad(g0, torch_sum(seg(1)), ts0, create_graph=.true., stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "checkpointed segment") > 0, "checkpoint: create_graph is a clear error")
    call torch_tensor_delete(seg(1))
    call torch_delete(segment_weight)
  end subroutine checkpointing

  subroutine anomaly_mode()
    real(real64), target :: x(2)
    type(torch_tensor) :: tx, y, outs(1)
    type(torch_function) :: f
    integer :: stat
    character(len=1024) :: msg
    x = [-1.0_real64, 4.0_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_autograd_set_detect_anomaly(.true.)
    call check(torch_autograd_detect_anomaly_enabled(), "anomaly: enabled")
    y = torch_sqrt(tx)
    call torch_tensor_backward(torch_sum(y), stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "SqrtBackward0") > 0 .and. index(msg, "nan") > 0, &
               "anomaly: a NaN in backward names the forward operation (sqrt)")
    call torch_function_define(f, "nan_adjoint", square_forward, nan_backward)
    call torch_function_apply(f, [tx], outs)
    call torch_tensor_backward(torch_sum(outs(1)), stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "nan_adjoint") > 0 .and. index(msg, "nan") > 0, &
               "anomaly: a NaN from a custom backward names the function")
    call torch_autograd_set_detect_anomaly(.false.)
    call check(.not. torch_autograd_detect_anomaly_enabled(), "anomaly: disabled")
    y = torch_sqrt(tx)
    call torch_tensor_backward(torch_sum(y), stat=stat)
    call check(stat == 0, "anomaly: off, NaN gradients pass silently as in PyTorch")
  end subroutine anomaly_mode

  subroutine memory_flat()
    real(real64), target :: x(64)
    type(torch_tensor) :: tx, outs(1)
    type(torch_function) :: cube
    integer :: i
    integer(int64) :: handles_before, rss_before, rss_after
    x = 0.5_real64
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_function_define(cube, "cube", cube_forward, cube_backward)
    handles_before = ftorch_live_handles()
    rss_before = 0
    do i = 1, 10000
      if (i == 1000) rss_before = rss_kib()
      call torch_function_apply(cube, [tx * 1], outs, real_args=[0.5_real64])
      call torch_tensor_backward(torch_sum(outs(1)))
    end do
    rss_after = rss_kib()
    call check(ftorch_live_handles() == handles_before + 1, "memory: handle count flat over 10^4 applications")
    if (rss_before >= 0) call check(rss_after - rss_before < 4096, "memory: RSS flat over 10^4 applications")
    call torch_tensor_delete(outs(1))
  end subroutine memory_flat

  ! User procedures reach the C layer boxed in a registry (ftorch_callbacks) that keeps one entry
  ! per distinct procedure: registering the same ones again and again does not grow it.
  subroutine callbacks_registered_once()
    real(real64), target :: x(4), y(4)
    type(torch_tensor) :: tx, ty, outs(2)
    type(torch_function) :: cube
    type(torch_gradcheck_result) :: result
    integer :: i, n_first, n_before
    integer(int64) :: id, first_id
    x = [0.5_real64, -1.0_real64, 2.0_real64, 0.25_real64]
    y = [1.5_real64, 0.5_real64, -0.75_real64, 2.0_real64]
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(ty, y, torch_kCPU, requires_grad=.true.)
    n_first = 0
    first_id = 0
    n_before = ftorch_callbacks_registered()
    call torch_tensor_register_hook(tx, identity_hook, id)
    call torch_tensor_remove_hook(tx, id)
    call check(ftorch_callbacks_registered() == n_before + 1, "registry: a procedure new to it adds one entry")
    do i = 1, 1000
      call torch_function_define(cube, "cube", cube_forward, cube_backward)
      call torch_tensor_register_hook(tx, scale_hook, id)
      call torch_tensor_remove_hook(tx, id)
      call torch_tensor_register_hook(tx, identity_hook, id)
      call torch_tensor_remove_hook(tx, id)
      call torch_saved_tensors_hooks_begin(count_pack, count_unpack)
      call torch_saved_tensors_hooks_end()
      call torch_checkpoint_segment(expression, [tx, ty], outs)
      if (i == 1) then
        call check(torch_gradcheck(expression, [tx, ty], n_outputs=2, result=result), &
                   "registry: gradcheck through a boxed procedure")
        n_first = ftorch_callbacks_registered()
        first_id = cube%id
      end if
    end do
    call check(ftorch_callbacks_registered() == n_first, "registry: flat over 10^3 registrations of the same procedures")
    call check(cube%id == first_id, "registry: defining the same function again reuses its definition")
    call torch_tensor_delete(outs(1))
    call torch_tensor_delete(outs(2))
    call torch_delete(tx)
    call torch_delete(ty)
  end subroutine callbacks_registered_once
end program test_function
