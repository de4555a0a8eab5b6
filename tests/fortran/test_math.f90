!> Tensor arithmetic and autograd: computes every operator and function (values, dtypes and
!> gradients) on inputs written by tests/models.py and records them in math_results.txt, which
!> tests/test_math.py compares with PyTorch. Also checks requires_grad propagation and the
!> assignment semantics directly.
program test_math
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use, intrinsic :: iso_fortran_env, only: int8, int16, int32, int64, real32, real64
  use ftorch
  use testing, only: check, summary, read_values, data_path
  implicit none

  real(real64), target :: a(2,3), b(2,3), c(3), q(2,3), ga(2,3), gb(2,3), one(1)
  real(real32), target :: a32(2,3)
  integer(int32), target :: i32(2,3)
  real(real64), allocatable :: v(:)
  type(torch_tensor) :: ta, tb, tc, t32, ti, pa, pb, tq, tga, tgb, tmp
  integer :: unit

  call read_values("math_a.txt", v); a = reshape(v, [2, 3])
  call read_values("math_b.txt", v); b = reshape(v, [2, 3])
  call read_values("math_c.txt", v); c = v
  call read_values("math_a32.txt", v); a32 = real(reshape(v, [2, 3]), real32)
  call read_values("math_i32.txt", v); i32 = nint(reshape(v, [2, 3]))
  call torch_tensor_from_array(ta, a, torch_kCPU)
  call torch_tensor_from_array(tb, b, torch_kCPU)
  call torch_tensor_from_array(tc, c, torch_kCPU)
  call torch_tensor_from_array(t32, a32, torch_kCPU)
  call torch_tensor_from_array(ti, i32, torch_kCPU)
  open(newunit=unit, file=data_path("math_results.txt"), status="replace", action="write")

  ! --- operators between tensors, with broadcasting
  call record("a+b", ta + tb)
  call record("a-b", ta - tb)
  call record("a*b", ta * tb)
  call record("a/b", ta / tb)
  call record("a**b", ta ** tb)
  call record("a+c", ta + tc)
  call record("c*a", tc * ta)
  call record("-a", -ta)
  call record("a*b+a-b/2", ta * tb + ta - tb / 2)
  ! --- scalars of every kind, on either side
  call record("a+2.5", ta + 2.5_real64)
  call record("2.5+a", 2.5_real64 + ta)
  call record("a-0.25f", ta - 0.25_real32)
  call record("0.25f-a", 0.25_real32 - ta)
  call record("a*3i8", ta * 3_int8)
  call record("3i16*a", 3_int16 * ta)
  call record("a/2i32", ta / 2_int32)
  call record("2i64/a", 2_int64 / ta)
  call record("a/0.5", ta / 0.5_real64)
  call record("7/a", 7 / ta)
  call record("a**2", ta ** 2)
  call record("a**3i64", ta ** 3_int64)
  call record("a**-1i8", ta ** (-1_int8))
  call record("a**2i16", ta ** 2_int16)
  call record("a**2i32", ta ** 2_int32)
  call record("a**2.0f", ta ** 2.0_real32)
  call record("a**0.5f", ta ** 0.5_real32)
  call record("a**1.5", ta ** 1.5_real64)
  call record("2**a", 2 ** ta)
  call record("1.5**a", 1.5_real64 ** ta)
  call record("a**3*1.5-a", 1.5_real64 * ta ** 3 - ta)
  ! --- FTorch's idiom: a one-element tensor as a scalar, broadcast
  one = 2.5d0
  call torch_tensor_from_array(tmp, one, torch_kCPU)
  call record("a*s1", ta * tmp)
  call record("s1*a", tmp * ta)
  ! --- type promotion
  call record("i32+1", ti + 1)
  call record("i32+1.5", ti + 1.5_real64)
  call record("i32/i32", ti / ti)
  call record("i32*a", ti * ta)
  call record("a32*2.0d0", t32 * 2.0_real64)
  call record("a32+a", t32 + ta)
  call record("i32**2", ti ** 2)
  ! --- functions
  call record("exp", torch_exp(ta))
  call record("log", torch_log(ta))
  call record("sqrt", torch_sqrt(ta))
  call record("abs", torch_abs(ta - 1.0_real64))
  call record("sin", torch_sin(ta))
  call record("cos", torch_cos(ta))
  call record("tanh", torch_tanh(ta))
  call record("sigmoid", torch_sigmoid(ta))
  call record("relu", torch_relu(ta - 1.0_real64))
  call record("matmul", torch_matmul(ta, torch_transpose(tb, 1, 2)))
  call record("matmul_vec", torch_matmul(ta, tc))
  call record("sum", torch_sum(ta))
  block  ! a 0-d result into a scalar; a one-element tensor of rank 1 is refused by its shape
    real(real64) :: total
    integer :: stat
    call torch_tensor_to_array(torch_sum(ta), total)
    call check(abs(total - sum(a)) <= 1e-12_real64 * abs(sum(a)), "torch_tensor_to_array of a 0-d tensor into a scalar")
    call torch_tensor_to_array(torch_reshape(torch_sum(ta), [1]), total, stat=stat)
    call check(stat /= 0, "... a one-element tensor of rank 1 into a scalar: refused (shape)")
  end block
  call record("mean", torch_mean(ta))
  call record("sum_dim1", torch_sum(ta, dim=1))
  call record("mean_dim2_keep", torch_mean(ta, dim=2, keepdim=.true.))
  call record("reshape", torch_reshape(ta, [3, 2]))
  call record("permute", torch_permute(ta, [2, 1]))
  call record("transpose", torch_transpose(ta, 1, 2))
  call record("clone", torch_clone(ta))
  call record("detach", torch_detach(ta))
  call record("a32_exp", torch_exp(t32))

  ! --- gradients of the sum of each expression with respect to a and b
  call torch_tensor_from_array(pa, a, torch_kCPU, requires_grad=.true.)
  call torch_tensor_from_array(pb, b, torch_kCPU, requires_grad=.true.)
  call grads("g:a*b", torch_sum(pa * pb))
  call grads("g:a/b", torch_sum(pa / pb))
  call grads("g:a**b", torch_sum(pa ** pb))
  call grads("g:a-b", torch_sum(pa - pb))
  call grads("g:a+c", torch_sum((pa + tc) * pb))
  call grads("g:scalars", torch_sum(2.0_real64 / pa + pb ** 3 - 0.5_real32 * pa * pb))
  call grads("g:pow_scalar_base", torch_sum(2 ** pa * pb))
  call grads("g:neg", torch_sum(-(pa * pb)))
  call grads("g:exp", torch_sum(torch_exp(pa) * pb))
  call grads("g:log", torch_sum(torch_log(pa) * pb))
  call grads("g:sqrt", torch_sum(torch_sqrt(pa) * pb))
  call grads("g:abs", torch_sum(torch_abs(pa - 1.0_real64) * pb))
  call grads("g:sin", torch_sum(torch_sin(pa) * pb))
  call grads("g:cos", torch_sum(torch_cos(pa) * pb))
  call grads("g:tanh", torch_sum(torch_tanh(pa) * pb))
  call grads("g:sigmoid", torch_sum(torch_sigmoid(pa) * pb))
  call grads("g:relu", torch_sum(torch_relu(pa - 1.0_real64) * pb))
  call grads("g:matmul", torch_sum(torch_matmul(pa, torch_transpose(pb, 1, 2)) ** 2))
  call grads("g:mean", torch_mean(pa * pb))
  call grads("g:sum_dim", torch_sum(torch_sum(pa * pb, dim=2) ** 2))
  call grads("g:reshape", torch_sum(torch_reshape(pa, [3, 2]) * torch_reshape(pb, [3, 2]) ** 2))
  call grads("g:permute", torch_sum(torch_permute(pa, [2, 1]) * torch_transpose(pb, 1, 2) ** 2))
  call grads("g:clone", torch_sum(torch_clone(pa) * pb))
  call grads("g:detach", torch_sum(torch_detach(pa) * pb))
  close(unit)

  call propagation_rules()
  call assignment_semantics()
  call assignment_take_over()
  call assignment_with_other_holders()
  if (allocated(v)) deallocate(v)  ! main-program allocatables are not freed at the end (leak checks)
  call summary()

contains

  ! Write "name dtype n" and the values in row-major order (as torch's reshape(-1)).
  ! `expression` is read once (named as `t`): on a compiler that does not finalize function
  ! results, the first FTorch call that reads an expression's result releases it.
  subroutine record(name, expression)
    character(len=*), intent(in) :: name
    type(torch_tensor), intent(in) :: expression
    type(torch_tensor) :: flat, t
    real(real64), allocatable :: values(:)
    integer :: n, dtype
    t = expression
    n = int(product(t%get_shape()))
    dtype = t%get_dtype()
    allocate(values(n))
    flat = torch_reshape(t, [n])
    call torch_tensor_to_array(flat, values)
    write(unit, '(a,1x,i0,1x,i0)') name, dtype, n
    write(unit, '(*(1x,es25.17e3))') values
    call torch_tensor_delete(flat)
  end subroutine record

  ! backward of a scalar `loss` and record the gradients of pa and pb (zero when absent).
  subroutine grads(name, loss)
    character(len=*), intent(in) :: name
    type(torch_tensor), intent(in) :: loss
    type(torch_tensor) :: ga_t, gb_t
    integer :: stat
    call torch_tensor_backward(loss)
    ga = 0.0d0
    gb = 0.0d0
    call torch_tensor_from_array(ga_t, ga, torch_kCPU)
    call torch_tensor_from_array(gb_t, gb, torch_kCPU)
    call torch_tensor_get_gradient(ga_t, pa, stat=stat)
    call torch_tensor_get_gradient(gb_t, pb, stat=stat)
    write(unit, '(a,1x,i0,1x,i0)') name, torch_kFloat64, 12
    write(unit, '(*(1x,es25.17e3))') transpose(ga), transpose(gb)
    call pa%zero_grad()
    call pb%zero_grad()
    call torch_delete(ga_t)
    call torch_delete(gb_t)
  end subroutine grads

  subroutine propagation_rules()
    type(torch_tensor) :: r
    r = pa * tb
    call check(r%requires_grad(), "grad op plain gives requires_grad")
    r = ta * tb
    call check(.not. r%requires_grad(), "plain op plain gives no requires_grad")
    r = -pa
    call check(r%requires_grad(), "unary minus keeps requires_grad")
    r = pa ** 2
    call check(r%requires_grad(), "power keeps requires_grad")
    r = torch_sum(pa)
    call check(r%requires_grad(), "sum keeps requires_grad")
    r = torch_detach(pa)
    call check(.not. r%requires_grad(), "detach drops requires_grad")
    call torch_no_grad_begin()
    r = pa * pb
    call check(.not. r%requires_grad() .and. .not. torch_grad_enabled(), "no-grad scope records nothing")
    call torch_enable_grad_begin()
    r = pa * pb
    call check(r%requires_grad(), "enable-grad scope inside no-grad records again")
    call torch_enable_grad_end()
    call torch_no_grad_end()
    call check(torch_grad_enabled(), "grad mode restored after the scopes")
    call torch_inference_mode_begin()
    r = ta * tb
    call check(torch_inference_mode_enabled() .and. .not. torch_grad_enabled(), "inference-mode scope")
    call torch_inference_mode_end()
    call check(.not. torch_inference_mode_enabled(), "inference mode ends")
    r = pa * pb
    call check(torch_tensor_is_leaf(pa) .and. .not. torch_tensor_is_leaf(r), "leaf status")
    call torch_delete(r)
  end subroutine propagation_rules

  subroutine assignment_semantics()
    type(torch_tensor) :: r, s, tone, t32b, ones_t
    real(real64), target :: ones(2,3)
    real(real64) :: a_saved(2,3)
    integer(c_int64_t) :: base
    integer :: i
    q = 0.0d0
    call torch_tensor_from_array(tq, q, torch_kCPU)
    tq = ta + tb
    call check(all(q == a + b), "c = a + b lands in the Fortran array behind c")
    tq = ta
    a_saved = a
    a(1, 1) = a(1, 1) + 1.0d0
    call check(all(q == a_saved), "c = a copies the values (the arrays stay distinct)")
    a = a_saved
    s = ta
    a(1, 1) = a(1, 1) + 1.0d0
    r = s - ta
    call torch_tensor_to_array(r, ga)
    call check(ga(1, 1) == -1.0d0 .and. all(ga(2, :) == 0.0d0), "assigning to an unconstructed tensor makes a copy")
    a = a_saved
    tq = torch_sum(ta)
    call check(all(abs(q - sum(a)) <= 1.0d-14 * sum(a)), "a one-element result broadcasts into the left-hand side")
    call torch_tensor_from_array(t32b, a32, torch_kCPU)
    t32b = ta
    call check(all(a32 == real(a, real32)), "assignment converts to the left-hand side's dtype")

    ! FTorch's sum/mean into a one-element tensor, with autograd.
    one = 0.0d0
    call torch_tensor_from_array(tone, one, torch_kCPU)
    call torch_tensor_sum(tone, ta)
    call check(abs(one(1) - sum(a)) <= 1.0d-14 * sum(a), "torch_tensor_sum writes into the aliased array")
    call torch_tensor_mean(tone, pa)
    call check(tone%requires_grad(), "torch_tensor_mean carries requires_grad")
    call torch_tensor_backward(tone)
    call torch_tensor_from_array(tga, ga, torch_kCPU)
    call torch_tensor_get_gradient(tga, pa)
    call check(all(abs(ga - 1.0d0 / 6.0d0) <= 1.0d-15), "backward through torch_tensor_mean")
    call pa%zero_grad()

    ! Re-assigning a tensor after backward replaces its history (FTorch chains it instead).
    ones = 1.0d0
    call torch_tensor_from_array(ones_t, ones, torch_kCPU)
    tq = pa * pb
    call torch_tensor_backward(tq, ones_t)
    call torch_tensor_from_array(tgb, gb, torch_kCPU)
    call torch_tensor_get_gradient(tga, pa)
    call torch_tensor_get_gradient(tgb, pb)
    call check(all(ga == b) .and. all(gb == a), "Q = a*b: dQ/da = b, dQ/db = a")
    call check(all(q == a * b), "Q's values land in its Fortran array while it carries a graph")
    call pa%zero_grad()
    call pb%zero_grad()
    tq = 3 * (pa ** 3 - pb * pb / 3)
    call torch_tensor_backward(tq, ones_t)
    call torch_tensor_get_gradient(tga, pa)
    call torch_tensor_get_gradient(tgb, pb)
    call check(all(abs(ga - 9 * a**2) <= 1.0d-12 * 9 * a**2) .and. all(abs(gb + 2 * b) <= 1.0d-12 * 2 * b), &
               "Q = 3*(a**3 - b*b/3) re-assigned after backward: dQ/da = 9a**2, dQ/db = -2b")

    ! Loops of y = f(x) neither grow the graph nor leak handles.
    base = ftorch_live_handles()
    do i = 1, 2000
      tq = pa * pb + pa
      r = ta * tb + ta - tb / 2
    end do
    call check(ftorch_live_handles() == base, "no handles leak from 2000 expressions")
    call pa%zero_grad()
    call torch_tensor_backward(tq, ones_t)
    call torch_tensor_get_gradient(tga, pa)
    call check(all(abs(ga - (b + 1)) <= 1.0d-14 * (b + 1)), "after 2000 re-assignments the gradient is one step's")
    call torch_delete(r); call torch_delete(s); call torch_delete(tone); call torch_delete(t32b)
    call torch_delete(ones_t)
  end subroutine assignment_semantics

  ! `y = expression` into a tensor over LibTorch's own memory may take the expression's result
  ! over instead of copying into y (no copy, no CopyBackwards node for backward to run): only
  ! where nothing can tell the difference. The loop users write keeps its values, gradients and
  ! handle count; wherever the memory is observed, `=` still writes into it.
  subroutine assignment_take_over()
    type(torch_tensor) :: x, x2, y, z, w, leaf, saved, prod, tg, got, loss, kept
    type(torch_arglist) :: list
    real(real64), target :: xv(3), x2v(3), gv(3), out(3)
    real(real64), pointer :: p(:)
    integer(c_int64_t) :: base
    integer :: i
    logical :: ok
    xv = [1d0, 2d0, 3d0]
    x2v = [0.5d0, -1d0, 4d0]
    call torch_tensor_from_array(x, xv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(x2, x2v, torch_kCPU)
    call torch_tensor_from_array(tg, gv, torch_kCPU)
    y = x * x
    base = ftorch_live_handles()
    ok = .true.
    do i = 1, 50
      y = x * x * real(i, real64)
      call torch_tensor_to_array(y, out)
      ok = ok .and. all(out == xv * xv * i) .and. y%requires_grad()
      call torch_tensor_backward(torch_sum(y))
      call torch_tensor_get_gradient(tg, x)
      ok = ok .and. all(gv == 2 * i * xv)
      call x%zero_grad()
    end do
    call check(ok, "y = x*x*i then backward, 50 times: every step's values and gradient")
    call check(ftorch_live_handles() == base, "... and no handle left over")
    ! Without autograd, y (a result with history) becomes a plain tensor with the new values.
    call torch_no_grad_begin()
    y = x2 * 3d0
    call torch_no_grad_end()
    call torch_tensor_to_array(y, out)
    call check(all(out == x2v * 3) .and. .not. y%requires_grad() .and. torch_tensor_is_leaf(y), &
               "y = x2 * 3 without autograd: y is a plain tensor with the new values")

    ! A Fortran pointer into y's memory sees every later `=` (with history and without).
    call torch_tensor_zeros(z, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_tensor_data_pointer(z, p)
    z = x2 * 2d0
    call check(all(p == x2v * 2), "a data pointer sees z = x2 * 2")
    z = x * 3d0
    call check(all(p == xv * 3) .and. z%requires_grad(), "... and z = x * 3 (z takes x's history)")
    call torch_tensor_backward(torch_sum(z))
    call torch_tensor_get_gradient(tg, x)
    call check(all(gv == 3), "... whose backward reaches x")
    call x%zero_grad()

    ! A list holding w sees w = ... .
    call torch_tensor_zeros(w, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_arglist_add(list, w)
    w = x2 + 1d0
    call torch_arglist_get(list, 1, got)
    call torch_tensor_to_array(got, out)
    call check(all(out == x2v + 1), "a list holding w sees w = x2 + 1")

    ! A leaf that requires grad stays one, with the new values.
    call torch_tensor_zeros(leaf, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU, requires_grad=.true.)
    leaf = x2 * 2d0
    call torch_tensor_to_array(leaf, out)
    call check(all(out == x2v * 2) .and. leaf%requires_grad() .and. torch_tensor_is_leaf(leaf), &
               "a leaf that requires grad keeps being one after leaf = x2 * 2")

    ! A leaf with a gradient from before, requires_grad switched off since: it keeps its
    ! gradient (its TensorImpl) after kept = x2 * 4.
    call torch_tensor_zeros(kept, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU, requires_grad=.true.)
    loss = torch_sum(kept * x2)
    call torch_tensor_backward(loss)
    call torch_delete(loss)  ! (its graph, while alive, refers to kept: = would not take over then)
    call torch_tensor_set_requires_grad(kept, .false.)
    kept = x2 * 4d0
    call torch_tensor_get_gradient(tg, kept)
    call torch_tensor_to_array(kept, out)
    call check(all(gv == x2v) .and. all(out == x2v * 4), "a leaf keeps its gradient after kept = x2 * 4")

    ! A tensor a graph saved for backward: the graph keeps the values it saved.
    call torch_tensor_zeros(saved, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    saved = x2 * 1d0
    prod = x * saved
    saved = x2 * 5d0
    loss = torch_sum(prod)
    call torch_tensor_backward(loss)
    call torch_tensor_get_gradient(tg, x)
    call check(all(gv == x2v), "backward uses the values a graph saved before saved = x2 * 5")
    call torch_tensor_to_array(saved, out)
    call check(all(out == x2v * 5), "... and saved has the new ones")
    call x%zero_grad()

    call torch_arglist_delete(list)
    call torch_delete(x); call torch_delete(x2); call torch_delete(y); call torch_delete(z); call torch_delete(w)
    call torch_delete(leaf); call torch_delete(saved); call torch_delete(prod); call torch_delete(tg)
    call torch_delete(got); call torch_delete(loss); call torch_delete(kept)
  end subroutine assignment_take_over

  ! `=` into a tensor that something else refers to: a view writes into its base's memory (the
  ! base keeps its Fortran array); a leaf with autograd state stays itself (gradient, hooks, the
  ! graphs that accumulate into it); a leaf that takes history while a graph holds it still does.
  subroutine assignment_with_other_holders()
    real(real64), target :: av(4), out4(4), out22(2, 2), wv(3), xv(3), gv(3), uv(1)
    type(torch_tensor) :: t, v, w, x, tg, loss, u
    integer :: stat
    character(len=256) :: msg
    av = [1d0, 2d0, 3d0, 4d0]
    call torch_tensor_from_array(t, av, torch_kCPU)
    v = torch_reshape(t, [2, 2])
    v = 5d0
    av(1) = 9d0
    call torch_tensor_to_array(t, out4)
    call check(all(out4 == [9d0, 5d0, 5d0, 5d0]), &
               "v = 5 into a view writes the base's array, which the base still wraps")
    t = 7d0
    call torch_tensor_to_array(v, out22)
    call check(all(av == 7d0) .and. all(out22 == reshape([9d0, 5d0, 5d0, 5d0], [2, 2])), &
               "t = 7 into the base: the view made before keeps its values")

    wv = [1d0, 2d0, 3d0]
    xv = [4d0, 5d0, 6d0]
    call torch_tensor_from_array(w, wv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(x, xv, torch_kCPU)
    call torch_tensor_from_array(tg, gv, torch_kCPU)
    call torch_tensor_register_hook(w, doubling_hook)
    loss = torch_sum(w * x)                ! its graph accumulates into w (and saves x only)
    call torch_tensor_backward(loss, retain_graph=.true.)
    call torch_no_grad_begin()
    w = x * 0.5d0
    call torch_no_grad_end()
    call torch_tensor_get_gradient(tg, w)
    call check(all(wv == xv * 0.5d0) .and. all(gv == 2 * xv) .and. torch_tensor_is_leaf(w) .and. w%requires_grad(), &
               "w = x/2 while a graph holds leaf w: new values, w keeps its gradient")
    call torch_tensor_backward(loss)
    call torch_tensor_get_gradient(tg, w)
    call check(all(gv == 4 * xv), "... and the graph's next backward accumulates into w, through w's hook")

    call w%zero_grad()
    loss = torch_sum(w * w)                ! saves w
    call torch_no_grad_begin()
    w = x * 1d0
    call torch_no_grad_end()
    call torch_tensor_backward(loss, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "torch_tensor_backward") > 0, &
               "backward through a graph that saved leaf w, after w = x: an error, as in PyTorch")

    uv = 1.5d0
    call torch_tensor_from_array(u, uv, torch_kCPU, requires_grad=.true.)
    u = u * u                              ! the leaf takes history: its old values stay with the graph
    u = u * u
    call torch_tensor_backward(u)
    call check(all(uv == 1.5d0 ** 4) .and. .not. torch_tensor_is_leaf(u), "u = u * u twice from leaf u, then backward")

    ! `=` into a view of a tensor with history: the base takes the write into its graph, as an
    ! in-place copy into a view does in PyTorch (CopySlices). Gradients of the base then flow
    ! through the new values (to the right-hand side) and not through the overwritten ones.
    block
      real(real64), target :: x0v(6), xbv(6), cv(6), av(6), g0(6), ga(6)
      type(torch_tensor) :: tx0, tx, tc, ta, vw, l2, tg0, tga
      integer :: i
      x0v = [(real(i, real64), i = 1, 6)]
      cv = [(real(9 + i, real64), i = 1, 6)]
      av = 0.5d0
      call torch_tensor_from_array(tx0, x0v, torch_kCPU, requires_grad=.true.)
      call torch_tensor_from_array(ta, av, torch_kCPU, requires_grad=.true.)
      call torch_tensor_from_array(tx, xbv, torch_kCPU)
      call torch_tensor_from_array(tc, cv, torch_kCPU)
      call torch_tensor_from_array(tg0, g0, torch_kCPU)
      call torch_tensor_from_array(tga, ga, torch_kCPU)
      tx = 2d0 * tx0
      vw = torch_reshape(tx, [2, 3])
      vw = 0d0
      l2 = torch_sum(tx * tc)
      call torch_tensor_backward(l2)
      call torch_tensor_get_gradient(tg0, tx0)
      call check(all(xbv == 0d0) .and. all(g0 == 0d0), &
                 "v = 0 into a view of x = 2*x0: no gradient reaches x0 through the overwritten values")
      call tx0%zero_grad()
      tx = 2d0 * tx0
      call torch_delete(vw)  ! (else `vw = ...` below would copy into the view made above)
      vw = torch_reshape(tx, [2, 3])
      vw = torch_reshape(2d0 * ta, [2, 3])
      l2 = torch_sum(tx * tc)
      call torch_tensor_backward(l2)
      call torch_tensor_get_gradient(tg0, tx0)
      call torch_tensor_get_gradient(tga, ta)
      call check(all(g0 == 0d0) .and. all(ga == 2 * cv), &
                 "v = 2*a into a view of x: the gradient reaches a (2c), not x0")
      call torch_delete(tx0); call torch_delete(tx); call torch_delete(tc); call torch_delete(ta)
      call torch_delete(vw); call torch_delete(l2); call torch_delete(tg0); call torch_delete(tga)
    end block

    call torch_delete(t); call torch_delete(v); call torch_delete(w); call torch_delete(x); call torch_delete(tg)
    call torch_delete(loss); call torch_delete(u)
  end subroutine assignment_with_other_holders

  subroutine doubling_hook(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 2d0
  end subroutine doubling_hook
end program test_math
