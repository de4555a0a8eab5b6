!> What ordinary Fortran does to tensors must never corrupt memory or leak: copies of tensors in
!> arrays and components, sourced allocation, double deletes, expressions passed to every
!> procedure, `x = f(x)` under autograd, failures of functions caught by a catch scope.
!> Writes hardening_*.txt into the data directory for tests/test_hardening.py to replay in PyTorch.
program test_hardening
  use, intrinsic :: iso_c_binding, only: c_associated, c_int64_t
  use, intrinsic :: iso_fortran_env, only: int64, real32, real64
  use, intrinsic :: ieee_arithmetic, only: ieee_value, ieee_quiet_nan
  use ftorch
  use testing, only: check, check_close, summary, data_path, rss_kib
  implicit none

  type :: state_t
    type(torch_tensor) :: a
    type(torch_tensor) :: pair(2)
  end type state_t

  type :: bag_t
    type(torch_tensor), allocatable :: v(:)
  end type bag_t

  integer(c_int64_t) :: base

  base = ftorch_live_handles()
  call copies_of_tensors()
  call copies_of_objects()
  call stale_handles()
  call expressions_everywhere()
  call assignment_of_scalars()
  call x_equals_f_of_x()
  call time_stepping()
  call model_time_stepping()
  call catch_scopes()
  call unconstructed_objects()
  call copies_and_conversions()
  call checkpoint_all_or_nothing()
  call check(ftorch_live_handles() == base, "every handle made by this program was freed")
  call summary()

contains

  function values_of(t) result(v)
    type(torch_tensor), intent(in) :: t
    real(real64), allocatable :: v(:)
    allocate(v(product(t%get_shape())))
    call torch_tensor_to_array(t, v)
  end function values_of

  subroutine copies_of_tensors()
    real(real64), target :: mem(2, 3)
    type(torch_tensor) :: ts1(3), ts2(3), ts3(3)
    type(state_t) :: s1, s2
    type(bag_t) :: b1, b2
    integer :: i, stat
    integer(c_int64_t) :: before
    before = ftorch_live_handles()
    do i = 1, 3
      call torch_tensor_zeros(ts1(i), 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
      ts1(i) = real(i, real64)
    end do
    ts2 = ts1
    call check(all([(c_associated(ts2(i)%p), i = 1, 3)]) .and. ftorch_live_handles() == before + 6, &
               "ts2 = ts1 on arrays makes three new tensors")
    ts1(2) = 20.0_real64
    call check(all(values_of(ts2(2)) == 2.0_real64), "array copies are copies, not shares")
    do i = 1, 3
      call torch_tensor_from_array(ts3(i), mem(:, i), torch_kCPU)
    end do
    ts3 = ts1
    call check(all(mem(:, 1) == 1.0_real64) .and. all(mem(:, 2) == 20.0_real64) .and. all(mem(:, 3) == 3.0_real64), &
               "ts3 = ts1 on constructed arrays writes into the aliased Fortran memory")
    call torch_delete(ts1)
    call check(all(values_of(ts2(3)) == 3.0_real64), "a copy outlives the deleted original")

    s1%a = ts2(1)
    s1%pair = ts2(2:3)
    s2 = s1
    call check(c_associated(s2%a%p) .and. .not. c_associated(s2%a%p, s1%a%p), &
               "a user type's tensor component is copied by s2 = s1, not shared")
    call torch_delete(s1%a)
    call torch_delete(s1%pair)
    call check(all(values_of(s2%pair(2)) == 3.0_real64), "components copied by s2 = s1 outlive the original")
    call torch_delete(s2%a)
    call torch_delete(s2%pair)

    allocate(b1%v(2))
    b1%v = ts2(1:2)
    b2 = b1  ! flang copies each element; gfortran 12 copies the handles bitwise (shares them)
    call torch_delete(b1%v)
    i = b2%v(1)%get_rank(stat=stat)
    call check(stat == 0 .or. stat == FTORCH_ERR_NULL_HANDLE, &
               "an allocatable component copied by b2 = b1 is a copy or a stale share, never a crash")
    call torch_delete(b2%v)
    call torch_delete(b2%v)  ! twice: harmless
    call torch_delete(ts2)
    call torch_delete(ts3)
    call check(ftorch_live_handles() == before, "copies of tensors in arrays and components leave no handles")
  end subroutine copies_of_tensors

  subroutine copies_of_objects()
    type(torch_model) :: m1, m2, ms(2)
    type(torch_optim) :: o1, o2
    type(torch_scheduler) :: sc1, sc2
    type(torch_tensor) :: x, y, w
    real(real64), target :: xv(5), yv(5), yv2(5)
    integer(c_int64_t) :: before
    before = ftorch_live_handles()
    xv = 0.25_real64
    call torch_model_load(m1, data_path("simplenet_f64.pt"), torch_kCPU)
    call torch_tensor_from_array(x, xv, torch_kCPU)
    call torch_tensor_from_array(y, yv, torch_kCPU)
    call torch_model_forward(m1, [x], [y])
    yv2 = yv
    m2 = m1
    ms = m1
    call torch_delete(m1)
    yv = 0
    call torch_model_forward(m2, [x], [y])
    call check(all(yv == yv2), "m2 = m1 shares the model: it runs after m1 is deleted")
    call torch_model_parameter(m2, 1, w)
    call torch_optim_SGD(o1, [w], learning_rate=0.1_real64)
    call torch_scheduler_step_lr(sc1, o1, 1, 0.5_real64)
    o2 = o1
    sc2 = sc1
    call torch_delete(o1)
    call torch_delete(sc1)
    call torch_scheduler_step(sc2)
    call check(abs(torch_optim_get_learning_rate(o2) - 0.05_real64) < 1e-15_real64, &
               "optimizer and scheduler copies share them and outlive the originals")
    call torch_delete(ms)
    call torch_delete(m2)
    call torch_delete(o2)
    call torch_delete(sc2)
    call torch_delete(sc2)
    call torch_delete(x); call torch_delete(y); call torch_delete(w)
    call check(ftorch_live_handles() == before, "copies of models, optimizers and schedulers leave no handles")
  end subroutine copies_of_objects

  subroutine stale_handles()
    type(torch_tensor) :: a, b, c, d
    type(torch_tensor), allocatable :: al(:)
    type(torch_tensor) :: src(2)
    integer :: stat, rank
    character(len=256) :: msg
    call torch_tensor_ones(a, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    b%p = a%p  ! what a bitwise copy does
    call torch_tensor_delete(a)
    msg = ""
    rank = b%get_rank(stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(msg, "stale") > 0, &
               "a copy of a deleted tensor is a clear error: " // trim(msg))
    call torch_tensor_delete(b)  ! a second delete of the same handle: a no-op
    call torch_tensor_zeros(c, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_tensor_ones(d, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    c = 5.0_real64
    call check(all(values_of(c) == 5.0_real64) .and. all(values_of(d) == 1.0_real64), &
               "after a double delete, two new tensors are still distinct")
    call torch_tensor_ones(src(1), 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_tensor_ones(src(2), 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
    allocate(al, source=src)  ! sourced allocation copies handles bitwise
    call torch_delete(src)
    rank = al(1)%get_rank(stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE, "a sourced copy of a deleted tensor is a clear error")
    call torch_delete(al)
    b%p = transfer(12345_int64, b%p)  ! never a handle
    rank = b%get_rank(stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE, "a value that was never a handle is rejected")
    call torch_tensor_delete(b)
    call torch_delete(c); call torch_delete(d)
  end subroutine stale_handles

  ! Every public procedure that reads a tensor, given an expression, 10^4 times: no handle is
  ! left behind (the call releases it, or the compiler's finalizer does).
  subroutine expressions_everywhere()
    integer, parameter :: n = 10000
    real(real64), target :: av(5), bv(5), outv(5), onev(1), gv(5)
    type(torch_tensor) :: a, b, out, one, g, p, loss, labels
    type(torch_model) :: model
    type(torch_optim) :: opt
    real(real64) :: lossv
    integer(c_int64_t) :: before
    integer(int64) :: rss_warm, rss_end
    integer :: i, stat, k
    integer(c_int64_t), pointer :: shp(:)
    logical :: flag
    character(len=256) :: msg
    av = [1, 2, 3, 4, 5] * 0.1_real64
    bv = 0.5_real64
    call torch_tensor_from_array(a, av, torch_kCPU)
    call torch_tensor_from_array(b, bv, torch_kCPU)
    call torch_tensor_from_array(out, outv, torch_kCPU)
    call torch_tensor_from_array(one, onev, torch_kCPU)
    call torch_tensor_from_array(g, gv, torch_kCPU)
    call torch_tensor_from_array(p, gv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_zeros(loss, 0, [integer(c_int64_t) ::], torch_kFloat64, torch_kCPU)
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU, requires_grad=.true.)
    call torch_optim_SGD(opt, [p], learning_rate=0.0_real64)
    before = ftorch_live_handles()
    rss_warm = 0
    do i = 1, n
      if (i == n / 10) rss_warm = rss_kib()
      k = torch_tensor_get_rank(a * 1.0_real64)
      k = torch_tensor_get_dtype(a + 0.0_real64)
      k = torch_tensor_get_device_type(a * 1)
      k = torch_tensor_get_device_index(a * 1)
      flag = torch_tensor_requires_grad(a * 2)
      flag = torch_tensor_is_leaf(a * 2)
      call torch_tensor_to_array(a * 2.0_real64, outv)
      call torch_tensor_to(a * 3.0_real64, out)
      call torch_tensor_sum(one, a * b)
      call torch_tensor_mean(one, a * b)
      call torch_model_forward(model, [a * 1.0_real64], [out])
      call torch_model_forward(model, [a * 1.0_real64], [out], requires_grad=.true.)
      call torch_loss_mse(loss, out * 2.0_real64, b * 1.0_real64)
      call torch_loss_l1(loss, a * 2.0_real64, b * 1.0_real64)
      call torch_tensor_backward(torch_sum(p * b))
      call torch_tensor_backward(p * 2.0_real64, b * 1.0_real64)
      call torch_tensor_set_gradient(p, b * 0.0_real64)
      call torch_tensor_get_gradient(g, p * 1.0_real64, stat=stat)   ! not a leaf: a clean error
      call torch_optim_SGD(opt, [p * 1.0_real64], stat=stat)         ! not a leaf: a clean error
      call torch_tensor_backward(a * 2.0_real64, stat=stat)          ! no graph: a clean error
      call torch_model_forward(model, [a * 1.0_real64, b * 1.0_real64], [out], stat=stat)  ! 2 inputs: error
      call torch_tensor_to_array(a * 2.0_real64, gv(1:3), stat=stat) ! wrong shape: error
      shp => torch_tensor_get_shape(a * 2.0_real64, stat=stat)       ! would dangle: error
      call torch_train_step(model, opt, [a * 1.0_real64], b * 1.0_real64, loss=lossv, stat=stat)
      labels = torch_relu(a - 0.2_real64)
      call torch_tensor_delete(labels)
    end do
    rss_end = rss_kib()
    print '(a,i0,a,i0,a)', "expressions loop: RSS ", rss_warm, " -> ", rss_end, " KiB"
    call check(ftorch_live_handles() == before, "expressions passed to every procedure leave no handle behind")
    call check(rss_end - rss_warm < 4096, "10^4 iterations of expressions to every procedure keep RSS flat")
    msg = ""
    shp => torch_tensor_get_shape(a * 2.0_real64, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "dangle") > 0 .and. .not. associated(shp), &
               "a pointer into an expression's result is refused: " // trim(msg))
    call torch_delete(a); call torch_delete(b); call torch_delete(out); call torch_delete(one)
    call torch_delete(g); call torch_delete(p); call torch_delete(loss); call torch_delete(model)
    call torch_delete(opt)
  end subroutine expressions_everywhere

  subroutine assignment_of_scalars()
    real(real64), target :: v(4)
    integer(int64), target :: iv(3)
    type(torch_tensor) :: t, ti
    call torch_tensor_from_array(t, v, torch_kCPU)
    call torch_tensor_from_array(ti, iv, torch_kCPU)
    t = 2.5_real64
    ti = 7
    call check(all(v == 2.5_real64) .and. all(iv == 7), "tensor = scalar fills the tensor and its Fortran array")
    call torch_delete(t); call torch_delete(ti)
  end subroutine assignment_of_scalars

  ! x = x*y, x = x**2, x = sin(x) on a tensor over a Fortran array, then backward: the values
  ! land in the array and the gradient is the one PyTorch gives for the same lines.
  subroutine x_equals_f_of_x()
    real(real64), target :: x0v(3), xv(3), yv(3), gx(3), gy(3), lv(1)
    type(torch_tensor) :: x0, x, y, l, tg
    integer :: unit
    x0v = [0.3_real64, -0.7_real64, 1.1_real64]
    yv = [1.5_real64, 0.5_real64, -2.0_real64]
    call torch_tensor_from_array(x0, x0v, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(y, yv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(x, xv, torch_kCPU)
    call torch_tensor_from_array(l, lv, torch_kCPU)
    x = x0
    x = x * y
    x = x ** 2
    x = torch_sin(x)
    x = x * x + y
    call torch_tensor_sum(l, x)
    call torch_tensor_backward(l)
    call torch_tensor_from_array(tg, gx, torch_kCPU)
    call torch_tensor_get_gradient(tg, x0)
    call torch_tensor_from_array(tg, gy, torch_kCPU)
    call torch_tensor_get_gradient(tg, y)
    open(newunit=unit, file=data_path("hardening_xfx.txt"), status="replace", action="write")
    write(unit, '(*(1x,es25.17e3))') xv
    write(unit, '(*(1x,es25.17e3))') gx
    write(unit, '(*(1x,es25.17e3))') gy
    close(unit)
    call check(all(x0v == [0.3_real64, -0.7_real64, 1.1_real64]), "x = f(x) never changes the initial values")
    call torch_delete(x0); call torch_delete(x); call torch_delete(y); call torch_delete(l); call torch_delete(tg)
  end subroutine x_equals_f_of_x

  ! Differentiable time stepping on a Fortran state array: state = state + dt*tendency(state)
  ! for 50 steps, then backward to the initial state and to the weights; repeated 200 times to
  ! show memory stays flat.
  subroutine time_stepping()
    integer, parameter :: nsteps = 50, nrepeat = 200
    real(real64), parameter :: dt = 0.05_real64
    real(real64), target :: sv(4), s0v(4), wv(4), lv(1), g0(4), gw(4)
    type(torch_tensor) :: s, s0, w, l, tg
    integer(c_int64_t) :: before
    integer(int64) :: rss_warm, rss_end
    integer :: k, r, unit
    s0v = [0.1_real64, 0.4_real64, -0.3_real64, 0.8_real64]
    wv = [1.2_real64, -0.6_real64, 0.9_real64, 0.3_real64]
    call torch_tensor_from_array(s0, s0v, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(w, wv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(s, sv, torch_kCPU)
    call torch_tensor_from_array(l, lv, torch_kCPU)
    before = ftorch_live_handles()
    rss_warm = 0
    do r = 1, nrepeat
      if (r == nrepeat / 4) rss_warm = rss_kib()
      s = s0
      do k = 1, nsteps
        s = s + dt * torch_tanh(s * w)
        s = s ** 2 * 0.01_real64 + s * 0.999_real64
      end do
      call torch_tensor_sum(l, s * s)
      call s0%zero_grad()
      call w%zero_grad()
      call torch_tensor_backward(l)
    end do
    rss_end = rss_kib()
    print '(a,i0,a,i0,a)', "time stepping: RSS ", rss_warm, " -> ", rss_end, " KiB"
    call check(rss_end - rss_warm < 4096, "200 differentiable 50-step runs keep RSS flat")
    call check(ftorch_live_handles() == before, "differentiable time stepping leaves no handle behind")
    call torch_tensor_from_array(tg, g0, torch_kCPU)
    call torch_tensor_get_gradient(tg, s0)
    call torch_tensor_from_array(tg, gw, torch_kCPU)
    call torch_tensor_get_gradient(tg, w)
    open(newunit=unit, file=data_path("hardening_timestep.txt"), status="replace", action="write")
    write(unit, '(*(1x,es25.17e3))') sv
    write(unit, '(*(1x,es25.17e3))') g0
    write(unit, '(*(1x,es25.17e3))') gw
    close(unit)
    call torch_delete(s); call torch_delete(s0); call torch_delete(w); call torch_delete(l); call torch_delete(tg)
  end subroutine time_stepping

  ! A hybrid model: state = state + dt * net(state) for 10 steps through a TorchScript model, then
  ! backward to the model's weights.
  subroutine model_time_stepping()
    integer, parameter :: nsteps = 10
    real(real64), parameter :: dt = 0.1_real64
    real(real64), target :: sv(5), tendv(5), lv(1), gw(5, 5), gb(5)
    type(torch_tensor) :: s, tend, l, w, b, tg
    type(torch_model) :: net
    integer :: k, unit
    call torch_model_load(net, data_path("simplenet_f64.pt"), torch_kCPU, requires_grad=.true.)
    sv = [-1.0_real64, -0.5_real64, 0.0_real64, 0.5_real64, 1.0_real64]
    call torch_tensor_from_array(s, sv, torch_kCPU)
    call torch_tensor_from_array(tend, tendv, torch_kCPU)
    call torch_tensor_from_array(l, lv, torch_kCPU)
    do k = 1, nsteps
      call torch_model_forward(net, [s], [tend], requires_grad=.true.)
      s = s + dt * tend
    end do
    call torch_tensor_sum(l, s * s)
    call torch_tensor_backward(l)
    call torch_model_parameter(net, "fc.weight", w)
    call torch_model_parameter(net, "fc.bias", b)
    call torch_tensor_from_array(tg, gw, torch_kCPU)
    call torch_tensor_get_gradient(tg, w)
    call torch_tensor_from_array(tg, gb, torch_kCPU)
    call torch_tensor_get_gradient(tg, b)
    open(newunit=unit, file=data_path("hardening_model.txt"), status="replace", action="write")
    write(unit, '(*(1x,es25.17e3))') sv
    write(unit, '(*(1x,es25.17e3))') gw   ! column-major of the (5, 5) weight's transpose
    write(unit, '(*(1x,es25.17e3))') gb
    close(unit)
    call check(.true., "state = state + dt*net(state) runs and backpropagates (values checked by pytest)")
    call torch_delete(s); call torch_delete(tend); call torch_delete(l); call torch_delete(w)
    call torch_delete(b); call torch_delete(tg); call torch_delete(net)
  end subroutine model_time_stepping

  subroutine catch_scopes()
    real(real64), target :: av(6), cv(6), dv(3)
    type(torch_tensor) :: a, c, d, r
    integer :: stat, inner
    character(len=256) :: msg
    av = 1.0_real64
    cv = 9.0_real64
    call torch_tensor_from_array(a, av, torch_kCPU)
    call torch_tensor_from_array(c, cv, torch_kCPU)
    call torch_tensor_from_array(d, dv, torch_kCPU)
    call torch_catch_begin()
    r = torch_reshape(a, [7])
    call torch_catch_end(stat, msg)
    call check(stat /= 0 .and. index(msg, "[torch_reshape]") == 1 .and. .not. c_associated(r%p), &
               "a failing function in a catch scope returns stat and errmsg: " // trim(msg))
    call torch_catch_begin()
    c = a + d
    call torch_catch_end(stat, msg)
    call check(stat /= 0 .and. index(msg, "[operator(+)]") == 1 .and. all(cv == 9.0_real64), &
               "a failing operator is caught, the first failure is kept and the target is left alone")
    call torch_catch_begin()
    call torch_catch_begin()
    r = torch_permute(a, [1, 1])
    call torch_catch_end(inner)
    c = a * 2.0_real64
    call torch_catch_end(stat)
    call check(inner /= 0 .and. stat == 0 .and. all(cv == 2.0_real64), &
               "catch scopes nest, and a library call works after a caught failure")
    call torch_catch_end(stat, msg)
    call check(stat /= 0, "ending a catch scope that was never begun is an error")
    ! Dimensions are numbered from 1: 0 or -1 is an error, never LibTorch's counting from the end.
    call dimension_errors(a)
    call torch_delete(a); call torch_delete(c); call torch_delete(d)
  end subroutine catch_scopes

  subroutine dimension_errors(a)
    type(torch_tensor), intent(in) :: a   ! rank 1
    type(torch_tensor) :: m, r
    real(real64), target :: mv(2, 3)
    integer :: stat
    character(len=256) :: msg
    mv = 1
    call torch_tensor_from_array(m, mv, torch_kCPU)
    call torch_catch_begin()
    r = torch_sum(a, dim=0)
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "dimension 0 is out of range") > 0 .and. &
               index(msg, "1 to 1") > 0 .and. .not. c_associated(r%p), "torch_sum(dim=0) is an error: " // trim(msg))
    call torch_catch_begin()
    r = torch_mean(m, dim=-1)
    call torch_catch_end(stat)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. .not. c_associated(r%p), "torch_mean(dim=-1) is an error")
    call torch_catch_begin()
    r = torch_sum(m, dim=3)
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "1 to 2") > 0, &
               "torch_sum(dim=3) of a rank-2 tensor is an error naming the range")
    call torch_catch_begin()
    r = torch_permute(m, [0, 1])
    call torch_catch_end(stat)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. .not. c_associated(r%p), &
               "torch_permute(m, [0, 1]) is an error, not a transpose")
    call torch_catch_begin()
    r = torch_transpose(m, 0, 1)
    call torch_catch_end(stat)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. .not. c_associated(r%p), "torch_transpose(m, 0, 1) is an error")
    r = torch_sum(m, dim=2)
    call check(all(values_of(r) == 3.0_real64), "torch_sum(dim=2) still sums along the second dimension")
    call torch_delete(m); call torch_delete(r)
  end subroutine dimension_errors

  subroutine unconstructed_objects()
    type(torch_model) :: model
    type(torch_optim) :: opt
    type(torch_scheduler) :: sched
    type(torch_tensor) :: x, y
    integer :: stat
    character(len=256) :: msg
    real(real64) :: w_before(5, 5), w_after(5, 5)   ! simplenet's fc.weight
    msg = ""
    call torch_checkpoint_save(data_path("never.ckpt"), model=model, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(msg, "model") > 0, &
               "an unloaded model passed to checkpoint_save is an error, not 'absent'")
    call torch_checkpoint_load(data_path("never.ckpt"), optim=opt, stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE, "an unconstructed optimizer passed to checkpoint_load is an error")
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU, requires_grad=.true., is_training=.true.)
    call torch_model_parameter(model, 1, x)
    call torch_optim_SGD(opt, [x])
    call torch_tensor_zeros(y, 1, [5_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_train_step(model, opt, [y], y, scheduler=sched, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(msg, "scheduler") > 0, &
               "an unconstructed scheduler passed to train_step is an error")
    call torch_tensor_to_array(x, w_before)
    msg = ""
    call torch_train_step(model, opt, [y], y, max_grad_norm=-1.0_real64, stat=stat, errmsg=msg)
    call torch_tensor_to_array(x, w_after)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "max_grad_norm") > 0 .and. &
               all(w_after == w_before), "a negative max_grad_norm is an error before the step: " // trim(msg))
    call torch_train_step(model, opt, [y], y, max_grad_norm=ieee_value(1.0_real64, ieee_quiet_nan), stat=stat)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT, "a NaN max_grad_norm is an error")
    msg = ""
    call torch_train_step(model, opt, [y], y, log_every=1, log_unit=-7, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "log_unit -7") > 0, &
               "a progress line that cannot be written is an error of the step, not a runtime stop: " // trim(msg))
    call torch_delete(model); call torch_delete(opt); call torch_delete(x); call torch_delete(y)
    call unconstructed_tensors()
  end subroutine unconstructed_objects

  ! Copies whose source memory the target overlaps read the source whole first; conversions that
  ! would change values and descriptions longer than the array are errors.
  subroutine copies_and_conversions()
    integer, parameter :: n = 40000   ! (beyond LibTorch's one-thread copies)
    real(real64), target :: sq(2, 2), line(n + 1), orig(n + 1), big(2)
    real(real32), target :: small(2)
    type(torch_tensor) :: t, u, w
    integer :: i, stat
    character(len=256) :: msg
    integer(c_int64_t) :: before
    before = ftorch_live_handles()
    sq = reshape([1.0_real64, 2.0_real64, 3.0_real64, 4.0_real64], [2, 2])
    call torch_tensor_from_array(t, sq, torch_kCPU)
    call torch_tensor_to_array(torch_transpose(t, 1, 2), sq)
    call check(all(sq == reshape([1.0_real64, 3.0_real64, 2.0_real64, 4.0_real64], [2, 2])), &
               "to_array of a transposed view into its own array is the transpose")
    call torch_delete(t)
    orig = [(real(i, real64), i = 1, n + 1)]
    line = orig
    call torch_tensor_from_array(t, line(1:n), torch_kCPU)
    call torch_tensor_to_array(t, line(2:n + 1))
    call check(all(line(2:n + 1) == orig(1:n)), "to_array into an overlapping section: a shift, as Fortran's")
    line = orig
    call torch_tensor_from_array(u, line(2:n + 1), torch_kCPU)
    call torch_tensor_to(t, u)
    call check(all(line(2:n + 1) == orig(1:n)), "torch_tensor_to between overlapping sections: a shift")
    call torch_delete(t); call torch_delete(u)
    ! float64 beyond float32's range: an error, not infinities
    big = [1.0_real64, 1.0e39_real64]
    small = -1
    call torch_tensor_from_array(t, big, torch_kCPU)
    call torch_tensor_to_array(t, small, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DTYPE .and. index(msg, "infinities") > 0 .and. all(small == -1), &
               "float64 values beyond float32 into a real32 array: " // trim(msg))
    call torch_tensor_from_array(w, small, torch_kCPU)
    call torch_catch_begin()
    w = 1.0e300_real64
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_DTYPE .and. all(small == -1), "a float32 tensor = 1e300: an error: " // trim(msg))
    big(2) = 2.0_real64
    call torch_tensor_to_array(t, small)
    call check(all(small == [1.0_real32, 2.0_real32]), "float64 within float32's range converts")
    call torch_delete(t); call torch_delete(w)
    ! one entry of permute_dims and layout per dimension
    call torch_tensor_from_array(t, sq, torch_kCPU, permute_dims=[2, 1, 3], stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "3 entries for an array of rank 2") > 0, &
               "permute_dims longer than the rank: " // trim(msg))
    call torch_tensor_from_array(t, sq, [1, 2, 3], torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "layout has 3 entries") > 0, &
               "a layout longer than the rank: " // trim(msg))
    call torch_tensor_from_array(t, sq, [2, 1], torch_kCPU)
    call check(c_associated(t%p), "a layout of the rank's length is taken")
    call torch_delete(t)
    ! `=` broadcasts as PyTorch's copy_ does; a shape that cannot be broadcast is an error
    sq = 0
    call torch_tensor_from_array(t, sq, torch_kCPU)
    call torch_tensor_ones(u, 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
    t = u
    call check(all(sq == 1), "= of a [2] tensor into a [2, 2] one fills every row (broadcast)")
    call torch_delete(u)
    call torch_tensor_ones(u, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_catch_begin()
    t = 2 * u
    call torch_catch_end(stat, msg)
    call check(stat == FTORCH_ERR_SHAPE .and. all(sq == 1), "= of a [3] tensor into a [2, 2] one: a shape error: " &
               // trim(msg))
    call torch_delete(t); call torch_delete(u)
    call check(ftorch_live_handles() == before, "copies_and_conversions leaves no handle behind")
  end subroutine copies_and_conversions

  ! A tensor passed for an optional one but never constructed is an error: never the implicit unit
  ! gradient, nor a loss without its weight.
  subroutine unconstructed_tensors()
    real(real64), target :: xv(3), tv(3)
    type(torch_tensor) :: xa, l, g, r, grads(1), t, w
    integer :: stat
    character(len=256) :: msg
    integer(c_int64_t) :: before
    before = ftorch_live_handles()
    xv = [0.5_real64, -1.0_real64, 2.0_real64]
    tv = [1.0_real64, 0.0_real64, 1.0_real64]
    call torch_tensor_from_array(xa, xv, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(t, tv, torch_kCPU)
    l = torch_sum(xa * xa)
    msg = ""
    call torch_tensor_backward(l, g, retain_graph=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(msg, "not constructed") > 0, &
               "backward with an unconstructed external gradient is an error: " // trim(msg))
    call torch_autograd_vjp(r, l, xa, g, stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. .not. c_associated(r%p), &
               "vjp with an unconstructed vector is an error")
    call torch_autograd_grad(grads, [l], [xa], grad_outputs=[g], stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. .not. c_associated(grads(1)%p), &
               "autograd_grad with an unconstructed grad_output is an error")
    call torch_autograd_grad(r, l, xa, grad_output=g, stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE, "autograd_grad (one output) with an unconstructed grad_output is an error")
    call torch_loss_bce_with_logits(r, xa, t, weight=w, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_NULL_HANDLE .and. index(msg, "weight") > 0, &
               "a loss with an unconstructed weight is an error: " // trim(msg))
    call torch_loss_bce_with_logits(r, xa, t, pos_weight=w, stat=stat)
    call check(stat == FTORCH_ERR_NULL_HANDLE, "a loss with an unconstructed pos_weight is an error")
    call torch_delete(xa); call torch_delete(t); call torch_delete(l)
    call check(ftorch_live_handles() == before, "the refused calls leave no handle behind")
  end subroutine unconstructed_tensors

  ! A checkpoint whose parameters match but whose buffers do not (either way) is refused before
  ! anything of the target model changes.
  subroutine checkpoint_all_or_nothing()
    type(torch_model) :: m2, m3
    type(torch_tensor) :: w
    real(real64), target :: before(2, 4), after(2, 4)
    integer :: stat
    character(len=256) :: msg
    call torch_model_load(m2, data_path("buffer2.pt"), torch_kCPU)
    call torch_model_load(m3, data_path("buffer3.pt"), torch_kCPU)
    call torch_checkpoint_save(data_path("buffer2.ckpt"), model=m2)
    call torch_model_parameter(m3, "fc.weight", w)
    call torch_tensor_to_array(w, before)
    msg = ""
    call torch_checkpoint_load(data_path("buffer2.ckpt"), model=m3, stat=stat, errmsg=msg)
    call torch_tensor_to_array(w, after)
    call check(stat /= 0 .and. index(msg, "buffer scale") > 0 .and. all(after == before), &
               "a checkpoint with other buffers is refused and the parameters are untouched: " // trim(msg))
    call torch_delete(w); call torch_delete(m3)
    ! A buffer the model has not (the same parameters, no buffer): a different model too.
    call torch_model_load(m3, data_path("no_buffer.pt"), torch_kCPU)
    call torch_model_parameter(m3, "fc.weight", w)
    call torch_tensor_to_array(w, before)
    msg = ""
    call torch_checkpoint_load(data_path("buffer2.ckpt"), model=m3, stat=stat, errmsg=msg)
    call torch_tensor_to_array(w, after)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "it has buffer scale") > 0 .and. &
               all(after == before), "a checkpoint with a buffer the model has not is refused: " // trim(msg))
    call torch_delete(w); call torch_delete(m2); call torch_delete(m3)
  end subroutine checkpoint_all_or_nothing

end program test_hardening
