!> Misuse fuzzer. From a seed, makes n_calls random calls to FTorch's public procedures with random
!> and mostly wrong arguments: wrong ranks, shapes, dtypes and devices, deleted, never-constructed,
!> stale and garbage handles, expressions as arguments, mismatched operands, models, losses,
!> autograd, optimizers, grad-mode and catch scopes. Every call that can fail is made with `stat=`
!> (or inside a catch scope), and every failure must be a non-zero status with an errmsg starting
!> with "[". The program keeps a model of what each variable holds (live, never constructed,
!> deleted, stale copy, garbage) and also checks the calls whose outcome that model predicts
!> (a stale handle must fail with FTORCH_ERR_NULL_HANDLE, a valid construction must succeed, a
!> failed construction leaves the tensor in place, ...) and, after every action, that the number
!> of live handles is the number the model expects (so a leak is pinned to the action that caused
!> it). At the end everything is deleted and the live-handle count must be back to its baseline.
!>
!> Usage: test_fuzz <data_dir> <seed> [n_calls] [trace]
!> The seed drives a xorshift64 generator of our own (not random_number), so a seed replays the
!> same sequence of calls with every compiler; "trace" prints each action before it runs. A problem
!> is printed as "PROBLEM (seed, action): <the action> / <the call> -- <what went wrong>", with the
!> actions before the first one.

!> The loss closure the fuzzer hands to torch_optim_step_closure, and what it is told to do.
module test_fuzz_closure
  use, intrinsic :: iso_c_binding, only: c_null_ptr
  use ftorch
  implicit none
  private
  public :: closure_loss, closure_mode, closure_calls, closure_tensor, closure_optim_copy, closure_reset

  integer, save :: closure_mode = 1, closure_calls = 0
  logical, save :: reentered = .false.
  type(torch_tensor), pointer, save :: closure_tensor => null()
  !> A raw copy of the handle of the optimizer being stepped (not a second handle).
  type(torch_optim), save :: closure_optim_copy

contains

  recursive subroutine closure_loss(loss)
    type(torch_tensor), intent(inout) :: loss
    integer :: s
    character(len=512) :: msg
    closure_calls = closure_calls + 1
    select case (closure_mode)
    case (1)   ! the loss of a tensor; a bad one gives no loss
      call torch_catch_begin()
      loss = torch_sum(closure_tensor * closure_tensor)
      call torch_catch_end(s)
    case (2)   ! no loss at all
    case (3)   ! a "loss" of more than one element (or none, for a bad tensor)
      call torch_catch_begin()
      loss = closure_tensor * 2
      call torch_catch_end(s)
    case (4)   ! delete the optimizer being stepped (through the raw copy of its handle)
      call torch_catch_begin()
      loss = torch_sum(closure_tensor * closure_tensor)
      call torch_catch_end(s)
      call torch_delete(closure_optim_copy)
    case default   ! step the same optimizer again from inside its step, once
      if (.not. reentered) then
        reentered = .true.
        closure_mode = 1
        call torch_optim_step_closure(closure_optim_copy, closure_loss, stat=s, errmsg=msg)
        closure_mode = 5
      end if
      call torch_catch_begin()
      loss = torch_sum(closure_tensor * closure_tensor)
      call torch_catch_end(s)
    end select
  end subroutine closure_loss

  !> Forget the raw copy (never delete it: it is not a handle of its own).
  subroutine closure_reset()
    closure_optim_copy%p = c_null_ptr
    reentered = .false.
    closure_calls = 0
  end subroutine closure_reset
end module test_fuzz_closure

program test_fuzz
  use, intrinsic :: iso_c_binding, only: c_associated, c_int, c_int64_t, c_loc, c_null_ptr, c_ptr
  use, intrinsic :: iso_fortran_env, only: int8, int16, int32, int64, real32, real64, output_unit
  use ftorch
  use testing, only: check, summary, data_path
  use test_fuzz_closure, only: closure_loss, closure_mode, closure_calls, closure_tensor, closure_optim_copy, &
                               closure_reset
  implicit none

  integer, parameter :: NP = 8, HELD_SLOT = NP + 1, NM = 3, MAXR = 16, MAXPROB = 25, RING = 12
  integer, parameter :: S_NULL = 0, S_LIVE = 1, S_STALE = 2, S_GARBAGE = 3
  integer, parameter :: E_ANY = 0, E_OK = 1, E_FAIL = 2
  integer, parameter :: G_NO_GRAD = 1, G_ENABLE = 2, G_INFERENCE = 3
  character(len=1), parameter :: STATE_LETTER(0:3) = ["N", "L", "S", "G"]

  ! ---------------------------------------------------------------- the objects being fuzzed
  type(torch_tensor), target :: pool(NP)
  type(torch_tensor), allocatable, target :: held   ! sourced-allocation copies live here
  type(torch_model), target :: mdl(NM)
  type(torch_optim), target :: opt(2)
  type(torch_scheduler), target :: sch(2)

  ! Fortran arrays wrapped by tensors (they outlive every tensor) and destinations of copies.
  real(real64), target :: r64a(5), r64b(2,3), r64c(2,2,2), blob(64)
  real(real32), target :: r32b(3,4)
  integer(int32), target :: i32a(6)
  integer(int64), target :: i64b(2,2)
  integer(int8), target :: i8c(2,2,2)
  real(real64), target :: d64a(5), d64b(2,3), d64c(2,2,2), d64s(1)
  real(real32), target :: d32a(5), d32b(3,4)
  integer(int32), target :: di32a(6)
  integer(int64), target :: di64b(2,2)
  integer(int8), target :: di8c(2,2,2)
  integer(int16), target :: di16a(4)
  real(real64), pointer :: p64a(:) => null(), p64b(:,:) => null(), p64c(:,:,:) => null()
  real(real32), pointer :: p32b(:,:) => null()
  integer(int32), pointer :: pi32a(:) => null()
  integer(int64), pointer :: pi64b(:,:) => null()

  ! ---------------------------------------------------------------- the model of their states
  integer :: st(NP + 1) = S_NULL, obj(NP + 1) = 0
  integer :: mrank(NP + 1) = 0, mdtype(NP + 1) = 0
  integer(int64) :: mshape(MAXR, NP + 1) = 0
  logical :: mrg(NP + 1) = .false., mleaf(NP + 1) = .true.
  logical, allocatable :: obj_grad(:), obj_inf(:)   ! per tensor handle: may have a .grad; made in inference mode
  integer, allocatable :: obj_stamp(:)   ! per tensor: write stamp of its newest handle (see same_handle)
  integer :: n_obj = 0
  integer :: mst(NM) = S_NULL, mobj(NM) = 0, mkind(NM) = 0
  logical :: minf(NM) = .false.   ! loaded in inference mode: its parameters are inference tensors
  integer :: ost(2) = S_NULL, oobj(2) = 0, sst(2) = S_NULL, sobj(2) = 0
  integer :: n_hobj = 0                              ! ids of model/optimizer/scheduler handles
  integer :: gstack(16), gdepth = 0

  ! ---------------------------------------------------------------- bookkeeping
  integer(int64) :: rng_state, seed
  integer :: n_actions = 10000, action = 0
  integer :: n_checked = 0, n_failed = 0, n_succeeded = 0
  integer :: n_unclean = 0, n_missed = 0, n_unexpected = 0, n_wrongcode = 0, n_model = 0, n_problems = 0
  integer :: n_dealloc_finalized = 0, n_dealloc_kept = 0
  integer :: n_predicted(0:2) = 0   ! checked calls by prediction: either way, success, failure
  integer(int64) :: base, drift = 0
  logical :: trace = .false.
  character(len=512) :: ring_buffer(RING) = ""
  character(len=512) :: desc
  integer :: s, s2
  character(len=1024) :: msg, msg2
  character(len=4096) :: arg
  integer :: ios, i
  integer(int64) :: t_start, t_end, t_rate

  ! ---------------------------------------------------------------- arguments
  call get_command_argument(2, arg)
  read(arg, *, iostat=ios) seed
  if (ios /= 0 .or. len_trim(arg) == 0) error stop "usage: test_fuzz <data_dir> <seed> [n_calls] [trace]"
  call get_command_argument(3, arg)
  if (len_trim(arg) > 0) then
    read(arg, *, iostat=ios) n_actions
    if (ios /= 0) error stop "n_calls must be an integer"
  end if
  call get_command_argument(4, arg)
  trace = trim(arg) == "trace"
  write(output_unit, '(a,i0)') "seed = ", seed
  write(output_unit, '(a,i0)') "n_calls = ", n_actions
  flush(output_unit)

  rng_state = ieor(seed, -7046029254386353131_int64)   ! 0x9E3779B97F4A7C15
  if (rng_state == 0) rng_state = 1
  do i = 1, 8
    rng_state = next_u()
  end do
  if (rng_state == 0) rng_state = 1
  allocate(obj_grad(1024), obj_inf(1024), obj_stamp(1024))
  obj_stamp = 0
  obj_grad = .false.
  obj_inf = .false.

  r64a = [0.5d0, -1.0d0, 0.25d0, 2.0d0, 1.5d0]
  r64b = reshape([1.0d0, 2.0d0, 3.0d0, 4.0d0, 5.0d0, 6.0d0], [2, 3])
  r64c = 0.75d0
  r32b = 1.5
  i32a = [1, 2, 3, 4, 5, 6]
  i64b = 3
  i8c = 2
  blob = 1.0d0

  call system_clock(t_start, t_rate)
  base = ftorch_live_handles()

  ! Start with a loaded model and a couple of constructed tensors.
  call begin_action("setup")
  call torch_model_load(mdl(1), data_path("simplenet_f64.pt"), torch_kCPU, stat=s, errmsg=msg)
  call outcome("load simplenet_f64", E_OK, 0)
  if (s == 0) call model_new(1, 1, .false.)
  call torch_tensor_from_array(pool(1), r64a, torch_kCPU, stat=s, errmsg=msg)
  call outcome("from_array r64a", E_OK, 0)
  if (s == 0) call new_live(1)
  call torch_tensor_zeros(pool(2), 1, [5_c_int64_t], torch_kFloat64, torch_kCPU, stat=s, errmsg=msg)
  call outcome("zeros [5]", E_OK, 0)
  if (s == 0) call new_live(2)
  call check_handle_count()

  do action = 1, n_actions
    call one_action()
    call check_handle_count()
    if (mod(action, 50) == 0) call sweep()
  end do

  call sweep()
  call teardown()
  call system_clock(t_end)

  write(output_unit, '(a,i0,a,i0,a,i0,a,i0,a)') "actions: ", n_actions, ", checked calls: ", n_checked, &
    " (", n_failed, " failed, ", n_succeeded, " succeeded)"
  write(output_unit, '(a,i0,a,i0,a,i0,a)') "predicted: ", n_predicted(E_FAIL), " to fail, ", n_predicted(E_OK), &
    " to succeed, ", n_predicted(E_ANY), " either way"
  write(output_unit, '(a,i0,a,i0)') "deallocate(held) finalized the handle: ", n_dealloc_finalized, &
    " times, kept it: ", n_dealloc_kept
  write(output_unit, '(a,f7.2,a)') "time: ", real(t_end - t_start) / real(t_rate), " s"
  call check(n_failed > 100 .and. n_succeeded > 100, "the fuzzer exercised both failures and successes")
  call check(n_unclean == 0, "every failure returned a non-zero stat and an errmsg starting with '['")
  call check(n_missed == 0, "every call the model says must fail (bad handle, device, dtype, rank, shape) failed")
  call check(n_unexpected == 0, "every call the model says must succeed succeeded")
  call check(n_wrongcode == 0, "failures with a predictable status returned that status")
  call check(n_model == 0, "handles, shapes and failed constructions behaved as modeled; no handle leaked")
  write(output_unit, '(a,i0)') "seed = ", seed
  call summary()

contains

  ! ============================================================== random numbers (xorshift64)

  function next_u() result(x)
    integer(int64) :: x
    rng_state = ieor(rng_state, ishft(rng_state, 13))
    rng_state = ieor(rng_state, ishft(rng_state, -7))
    rng_state = ieor(rng_state, ishft(rng_state, 17))
    x = ishft(rng_state, -1)
  end function next_u

  !> Uniform integer in [lo, hi].
  integer function rnd(lo, hi)
    integer, intent(in) :: lo, hi
    rnd = int(int(lo, int64) + mod(next_u(), int(hi, int64) - int(lo, int64) + 1))
  end function rnd

  logical function chance(percent)
    integer, intent(in) :: percent
    chance = rnd(1, 100) <= percent
  end function chance

  ! ============================================================== text

  function str(i) result(text)
    integer, intent(in) :: i
    character(len=:), allocatable :: text
    character(len=24) :: buf
    write(buf, '(i0)') i
    text = trim(buf)
  end function str

  function str8(i) result(text)
    integer(int64), intent(in) :: i
    character(len=:), allocatable :: text
    character(len=24) :: buf
    write(buf, '(i0)') i
    text = trim(buf)
  end function str8

  function strs(v) result(text)
    integer, intent(in) :: v(:)
    character(len=:), allocatable :: text
    integer :: j
    text = "["
    do j = 1, size(v)
      if (j > 1) text = text // ","
      text = text // str(v(j))
    end do
    text = text // "]"
  end function strs

  function strs8(v) result(text)
    integer(int64), intent(in) :: v(:)
    character(len=:), allocatable :: text
    integer :: j
    text = "["
    do j = 1, size(v)
      if (j > 1) text = text // ","
      text = text // str8(v(j))
    end do
    text = text // "]"
  end function strs8

  function lstr(flag) result(text)
    logical, intent(in) :: flag
    character(len=1) :: text
    text = merge("T", "F", flag)
  end function lstr

  ! ============================================================== outcomes and problems

  subroutine begin_action(text)
    character(len=*), intent(in) :: text
    desc = text
    ring_buffer(mod(action, RING) + 1) = text
    if (trace) then
      write(output_unit, '(a,i0,a,a)') "#", action, " ", trim(text)
      flush(output_unit)
    end if
    msg = ""
    msg2 = ""
  end subroutine begin_action

  !> Judge the status `s` and message `msg` of the call just made against the prediction.
  subroutine outcome(what, expect, code)
    character(len=*), intent(in) :: what
    integer, intent(in) :: expect, code
    call judge(what, expect, code, s, msg)
  end subroutine outcome

  subroutine judge(what, expect, code, stat_value, text)
    character(len=*), intent(in) :: what
    integer, intent(in) :: expect, code, stat_value
    character(len=*), intent(in) :: text
    character(len=64) :: note
    n_checked = n_checked + 1
    n_predicted(expect) = n_predicted(expect) + 1
    if (stat_value /= 0) then
      n_failed = n_failed + 1
      if (len_trim(text) == 0) then
        n_unclean = n_unclean + 1
        call problem(what, "failed with an empty errmsg", stat_value, text)
      else if (text(1:1) /= "[") then
        n_unclean = n_unclean + 1
        call problem(what, "failed with an errmsg not starting with '['", stat_value, text)
      end if
      if (expect == E_OK) then
        n_unexpected = n_unexpected + 1
        call problem(what, "predicted to succeed but failed", stat_value, text)
      else if (expect == E_FAIL .and. code /= 0 .and. stat_value /= code) then
        n_wrongcode = n_wrongcode + 1
        write(note, '(a,i0)') "predicted stat ", code
        call problem(what, trim(note), stat_value, text)
      end if
    else
      n_succeeded = n_succeeded + 1
      if (expect == E_FAIL) then
        n_missed = n_missed + 1
        call problem(what, "predicted to fail but succeeded", stat_value, text)
      end if
    end if
  end subroutine judge

  subroutine model_problem(what)
    character(len=*), intent(in) :: what
    n_model = n_model + 1
    call problem(what, "model mismatch", 0, "")
  end subroutine model_problem

  subroutine problem(what, note, stat_value, text)
    character(len=*), intent(in) :: what, note, text
    integer, intent(in) :: stat_value
    integer :: j
    n_problems = n_problems + 1
    if (n_problems > MAXPROB) return
    write(output_unit, '(a,i0,a,i0,a,a)') "PROBLEM (seed ", seed, ", action ", action, "): ", trim(desc)
    write(output_unit, '(a,a,a,a)') "  call: ", trim(what), " -- ", trim(note)
    write(output_unit, '(a,i0,a,a)') "  stat = ", stat_value, ", errmsg = ", trim(text)
    if (n_problems == 1) then
      write(output_unit, '(a)') "  last actions:"
      do j = action - RING + 1, action
        if (j >= 0) write(output_unit, '(a,i0,a,a)') "    #", j, " ", trim(ring_buffer(mod(j, RING) + 1))
      end do
    end if
    flush(output_unit)
  end subroutine problem

  ! ============================================================== the model of the variables

  !> The tensor variable of slot k: pool(k), or `held` for HELD_SLOT.
  function ref(k) result(t)
    integer, intent(in) :: k
    type(torch_tensor), pointer :: t
    if (k <= NP) then
      t => pool(k)
    else
      t => held
    end if
  end function ref

  function tag(k) result(text)
    integer, intent(in) :: k
    character(len=16) :: text
    if (k <= NP) then
      write(text, '(a,i0,a,a)') "pool(", k, "):", STATE_LETTER(st(k))
    else
      write(text, '(a,a)') "held:", STATE_LETTER(st(k))
    end if
  end function tag

  !> Slots and their states, for descriptions: "[pool(3):L,pool(5):S]".
  function tags(ks) result(text)
    integer, intent(in) :: ks(:)
    character(len=:), allocatable :: text
    integer :: j
    text = "["
    do j = 1, size(ks)
      if (j > 1) text = text // ","
      text = text // trim(tag(ks(j)))
    end do
    text = text // "]"
  end function tags

  !> Modeled dtype and shape of a live slot, for descriptions.
  function shape_text(k) result(text)
    integer, intent(in) :: k
    character(len=:), allocatable :: text
    text = ""
    if (st(k) == S_LIVE) text = "dtype " // str(mdtype(k)) // " shape " // strs8(mshape(1:mrank(k), k))
  end function shape_text

  logical function live(k)
    integer, intent(in) :: k
    live = st(k) == S_LIVE
  end function live

  integer function n_slots()
    n_slots = NP
    if (allocated(held)) n_slots = NP + 1
  end function n_slots

  !> A tensor slot: often a live one, else any (including `held` when allocated).
  integer function pick()
    pick = pick_from(n_slots())
  end function pick

  integer function pick_pool()
    pick_pool = pick_from(NP)
  end function pick_pool

  integer function pick_from(n)
    integer, intent(in) :: n
    integer :: candidates(NP + 1), nl, k
    if (chance(50)) then
      nl = 0
      do k = 1, n
        if (st(k) == S_LIVE) then
          nl = nl + 1
          candidates(nl) = k
        end if
      end do
      if (nl > 0) then
        pick_from = candidates(rnd(1, nl))
        return
      end if
    end if
    pick_from = rnd(1, n)
  end function pick_from

  !> Whether two handle values name the same object. A tensor's `=` gives its handle a new write
  !> stamp (bits 24-31: see src/cpp/handles.hpp); every copy of the handle still names the tensor,
  !> so the stamp is left out of the comparison.
  logical function same_handle(a, b)
    type(c_ptr), intent(in) :: a, b
    integer(int64), parameter :: stamp_bits = ishft(255_int64, 24)
    same_handle = iand(transfer(a, 0_int64), not(stamp_bits)) == iand(transfer(b, 0_int64), not(stamp_bits))
  end function same_handle

  !> The write stamp of a handle value.
  integer function stamp_of(p)
    type(c_ptr), intent(in) :: p
    stamp_of = int(ibits(transfer(p, 0_int64), 24, 8))
  end function stamp_of

  integer function new_obj()
    logical, allocatable :: grown(:)
    integer, allocatable :: grown_stamps(:)
    n_obj = n_obj + 1
    if (n_obj > size(obj_grad)) then
      allocate(grown_stamps(2 * size(obj_stamp)))
      grown_stamps = 0
      grown_stamps(1:size(obj_stamp)) = obj_stamp
      call move_alloc(grown_stamps, obj_stamp)
      allocate(grown(2 * size(obj_grad)))
      grown = .false.
      grown(1:size(obj_grad)) = obj_grad
      call move_alloc(grown, obj_grad)
      allocate(grown(2 * size(obj_inf)))
      grown = .false.
      grown(1:size(obj_inf)) = obj_inf
      call move_alloc(grown, obj_inf)
    end if
    obj_grad(n_obj) = .false.
    obj_inf(n_obj) = inference_active()
    obj_stamp(n_obj) = 0
    new_obj = n_obj
  end function new_obj

  !> Slot k now holds a handle of its own to a new tensor.
  subroutine new_live(k)
    integer, intent(in) :: k
    st(k) = S_LIVE
    obj(k) = new_obj()
    call refresh(k)
  end subroutine new_live

  !> The tensor of slot k is freed: every copy of its handle becomes stale.
  subroutine kill_slot(k)
    integer, intent(in) :: k
    integer :: j, o
    if (st(k) /= S_LIVE) return
    o = obj(k)
    do j = 1, NP + 1
      if (st(j) == S_LIVE .and. obj(j) == o) st(j) = S_STALE
    end do
  end subroutine kill_slot

  !> Slot k was deleted through its own variable.
  subroutine deleted(k)
    integer, intent(in) :: k
    type(torch_tensor), pointer :: t
    t => ref(k)
    if (c_associated(t%p)) call model_problem("torch_delete left a non-null handle in " // trim(tag(k)))
    call kill_slot(k)
    st(k) = S_NULL
  end subroutine deleted

  !> Re-read shape, dtype, requires_grad and leafness of a live slot.
  subroutine refresh(k)
    integer, intent(in) :: k
    type(torch_tensor), pointer :: t
    integer(c_int64_t), pointer :: sizes(:)
    integer :: q(5)
    t => ref(k)
    q = 0
    mrank(k) = t%get_rank(stat=q(1))
    sizes => t%get_shape(stat=q(2))
    mdtype(k) = t%get_dtype(stat=q(3))
    mrg(k) = t%requires_grad(stat=q(4))
    mleaf(k) = torch_tensor_is_leaf(t, stat=q(5))
    if (any(q /= 0) .or. .not. associated(sizes)) then
      call model_problem("a query of " // trim(tag(k)) // ", modeled as live, failed")
      return
    end if
    if (size(sizes) /= mrank(k) .or. mrank(k) > MAXR) then
      call model_problem("get_shape and get_rank disagree")
      return
    end if
    mshape(:, k) = 0
    mshape(1:mrank(k), k) = sizes
    if (mrg(k)) obj_grad(obj(k)) = .true.
  end subroutine refresh

  !> The tensor of handle `o` changed (values, history): refresh every slot holding it.
  subroutine changed(o)
    integer, intent(in) :: o
    integer :: j
    obj_grad(o) = .true.
    if (inference_active()) obj_inf(o) = .true.
    do j = 1, NP + 1
      if (st(j) == S_LIVE .and. obj(j) == o) call refresh(j)
    end do
  end subroutine changed

  integer(int64) function numel(k)
    integer, intent(in) :: k
    numel = product(mshape(1:mrank(k), k))
  end function numel

  logical function is_float(k)
    integer, intent(in) :: k
    is_float = mdtype(k) == torch_kFloat32 .or. mdtype(k) == torch_kFloat64
  end function is_float

  logical function same_shape(a, b)
    integer, intent(in) :: a, b
    same_shape = mrank(a) == mrank(b)
    if (same_shape) same_shape = all(mshape(1:mrank(a), a) == mshape(1:mrank(b), b))
  end function same_shape

  !> After a call that writes into slot k as `=` does (a live tensor keeps its handle; a
  !> non-live one gets a new handle or, for an unconstructed right-hand side, becomes null).
  subroutine settle(k, before, was_live)
    integer, intent(in) :: k
    type(c_ptr), intent(in) :: before
    logical, intent(in) :: was_live
    type(torch_tensor), pointer :: t
    t => ref(k)
    if (was_live) then
      if (.not. same_handle(t%p, before)) then
        call model_problem("a write into live " // trim(tag(k)) // " replaced its handle")
        st(k) = S_LIVE
        obj(k) = new_obj()
      end if
      ! `=` stamps the handle it writes (a failed one leaves it, and the tensor's stamp, alone)
      if (transfer(t%p, 0_int64) /= transfer(before, 0_int64)) obj_stamp(obj(k)) = stamp_of(t%p)
      call changed(obj(k))
    else if (same_handle(t%p, before)) then
      continue
    else if (.not. c_associated(t%p)) then
      st(k) = S_NULL
    else
      call new_live(k)
    end if
  end subroutine settle

  !> A failed construction must leave the variable as it was.
  subroutine unchanged(k, before, what)
    integer, intent(in) :: k
    type(c_ptr), intent(in) :: before
    character(len=*), intent(in) :: what
    type(torch_tensor), pointer :: t
    t => ref(k)
    if (.not. same_handle(t%p, before)) call model_problem("a failed " // what // " changed the handle of " // tag(k))
  end subroutine unchanged

  !> Result of a construction into slot k: a new tensor, or (failure) the old one untouched.
  subroutine constructed(k, before, what)
    integer, intent(in) :: k
    type(c_ptr), intent(in) :: before
    character(len=*), intent(in) :: what
    if (s == 0) then
      call kill_slot(k)
      call new_live(k)
    else
      call unchanged(k, before, what)
    end if
  end subroutine constructed

  integer function distinct_live()
    integer :: j, i2
    logical :: first
    distinct_live = 0
    do j = 1, NP + 1
      if (st(j) /= S_LIVE) cycle
      first = .true.
      do i2 = 1, j - 1
        if (st(i2) == S_LIVE .and. obj(i2) == obj(j)) first = .false.
      end do
      if (first) distinct_live = distinct_live + 1
    end do
    distinct_live = distinct_live + count_distinct(mst, mobj) + count_distinct(ost, oobj) + count_distinct(sst, sobj)
  end function distinct_live

  integer function count_distinct(states, ids)
    integer, intent(in) :: states(:), ids(:)
    integer :: j, i2
    logical :: first
    count_distinct = 0
    do j = 1, size(states)
      if (states(j) /= S_LIVE) cycle
      first = .true.
      do i2 = 1, j - 1
        if (states(i2) == S_LIVE .and. ids(i2) == ids(j)) first = .false.
      end do
      if (first) count_distinct = count_distinct + 1
    end do
  end function count_distinct

  !> The live-handle count must be the baseline plus the distinct live handles of the model.
  subroutine check_handle_count()
    integer(int64) :: now, d
    now = ftorch_live_handles()
    d = now - (base + distinct_live())
    if (d > drift) then
      call model_problem("this action leaked " // str8(d - drift) // " handle(s): " // str8(now) // &
                         " live, the model expects " // str8(now - d))
    else if (d < drift) then
      call model_problem("this action freed " // str8(drift - d) // " handle(s) the model expects alive: " // &
                         str8(now) // " live, the model expects " // str8(now - d))
    end if
    drift = d
  end subroutine check_handle_count

  ! Grad-mode scopes, as modeled.
  logical function inference_active()
    inference_active = any(gstack(1:gdepth) == G_INFERENCE)
  end function inference_active

  logical function grad_enabled_model()
    grad_enabled_model = .true.
    if (gdepth > 0) grad_enabled_model = gstack(gdepth) == G_ENABLE
  end function grad_enabled_model

  ! Dimension d (1-based; 0 and negatives wrap as in PyTorch) valid for rank r.
  logical function dim_ok(d, r)
    integer, intent(in) :: d, r
    integer :: d0, rr
    d0 = d - 1
    rr = max(r, 1)
    dim_ok = d0 >= -rr .and. d0 <= rr - 1
  end function dim_ok

  !> What an operator on slot k must do: fail for a bad operand; succeed on a live tensor, unless
  !> it is an inference tensor used outside inference mode (autograd may refuse it).
  integer function op_expect(k)
    integer, intent(in) :: k
    if (.not. live(k)) then
      op_expect = E_FAIL
    else if (obj_inf(obj(k))) then
      op_expect = E_ANY
    else
      op_expect = E_OK
    end if
  end function op_expect

  !> After a catch scope (status s) around an expression on slot k passed to a procedure called
  !> with stat (status s2): judge the operator, then the procedure, which sees an unconstructed
  !> tensor when the operator failed and must then fail with FTORCH_ERR_NULL_HANDLE.
  subroutine operator_then(k, what, expect, code, partial)
    integer, intent(in) :: k, expect, code
    character(len=*), intent(in) :: what
    logical, intent(in), optional :: partial   ! several expressions: one may fail, another not
    logical :: several
    several = .false.
    if (present(partial)) several = partial
    select case (op_expect(k))
    case (E_FAIL)
      call outcome("operator on a bad operand in a catch scope", E_FAIL, FTORCH_ERR_NULL_HANDLE)
    case (E_OK)
      call outcome("operator in a catch scope", E_OK, 0)
    case default
      call outcome("operator on an inference tensor in a catch scope", E_ANY, 0)
    end select
    if (s /= 0 .and. several .and. live(k)) then
      call judge(what // " of expressions, one failed", E_ANY, 0, s2, msg2)
    else if (s /= 0) then
      call judge(what // " of a failed expression", E_FAIL, FTORCH_ERR_NULL_HANDLE, s2, msg2)
    else
      call judge(what // " of an expression", expect, code, s2, msg2)
    end if
  end subroutine operator_then

  !> A tensor computed from slot `from` (handle id o_from, 0 if none) may be an inference tensor too.
  subroutine inherit_inference(k, o_from)
    integer, intent(in) :: k, o_from
    if (o_from > 0 .and. st(k) == S_LIVE) then
      if (obj_inf(o_from)) obj_inf(obj(k)) = .true.
    end if
  end subroutine inherit_inference

  integer function obj_of(k)
    integer, intent(in) :: k
    obj_of = 0
    if (st(k) == S_LIVE) obj_of = obj(k)
  end function obj_of

  ! ============================================================== model/optim/scheduler slots

  subroutine model_new(m, kind, inference)
    integer, intent(in) :: m, kind
    logical, intent(in) :: inference
    n_hobj = n_hobj + 1
    mst(m) = S_LIVE
    mobj(m) = n_hobj
    mkind(m) = kind
    minf(m) = inference
  end subroutine model_new

  !> A handle among `states` is freed: its copies become stale.
  subroutine kill_handle(states, ids, m)
    integer, intent(inout) :: states(:)
    integer, intent(in) :: ids(:), m
    integer :: j
    if (states(m) /= S_LIVE) return
    do j = 1, size(states)
      if (j /= m .and. states(j) == S_LIVE .and. ids(j) == ids(m)) states(j) = S_STALE
    end do
    states(m) = S_STALE
  end subroutine kill_handle

  ! ============================================================== one random action

  subroutine one_action()
    integer :: r
    r = rnd(1, 200)
    select case (r)
    case (1:12);    call act_new_tensor()
    case (13:24);   call act_from_array()
    case (25:28);   call act_from_blob()
    case (29:35);   call act_delete()
    case (36:39);   call act_handle_copy()
    case (40:43);   call act_sourced_copy()
    case (44:45);   call act_garbage()
    case (46:55);   call act_query()
    case (56:59);   call act_query_expression()
    case (60:67);   call act_to_array()
    case (68:71);   call act_data_pointer()
    case (72:75);   call act_copy_into()
    case (76:79);   call act_zero_fill()
    case (80:111);  call act_math()
    case (112:115); call act_reduce_into()
    case (116:121); call act_backward()
    case (122:125); call act_get_gradient()
    case (126:127); call act_set_gradient()
    case (128:131); call act_set_requires_grad()
    case (132:135); call act_grad_scope()
    case (136:143); call act_loss()
    case (144:157); call act_forward()
    case (158:160); call act_model_load()
    case (161:164); call act_model_handles()
    case (165:170); call act_model_queries()
    case (171:184); call act_optim()
    case (185:190); call act_catch()
    case (191:192); call act_runtime()
    case (193:194); call act_step_closure()
    case (195:197); call act_train_step()
    case (198:199); call act_checkpoint()
    case default;   call act_math()
    end select
  end subroutine one_action

  ! ------------------------------------------------------------------ construction

  subroutine act_new_tensor()
    integer :: k, fill, ndims, n, j, dtype, dev, idx, expect, code
    logical :: has_idx, has_rg, rg, neg
    integer(c_int64_t) :: shp(8)
    integer, parameter :: good_dtypes(6) = [1, 2, 3, 4, 6, 7], bad_dtypes(5) = [0, 5, 8, 99, -1]
    integer, parameter :: bad_devices(6) = [1, 12, 13, 7, 77, -1], indices(6) = [-1, 0, 1, 2, 77, -5]
    type(torch_tensor), pointer :: t
    type(c_ptr) :: before
    k = pick()
    t => ref(k)
    fill = rnd(0, 2)
    ndims = rnd(0, 4)
    n = ndims
    if (chance(12)) then
      ndims = rnd(-1, 8)
      n = rnd(0, 8)
    end if
    do j = 1, 8
      shp(j) = rnd(1, 4)
      if (chance(8)) shp(j) = rnd(-3, 0)
    end do
    neg = any(shp(1:n) < 0)
    dtype = good_dtypes(rnd(1, 6))
    if (chance(15)) dtype = bad_dtypes(rnd(1, 5))
    dev = torch_kCPU
    if (chance(12)) dev = unavailable(bad_devices(rnd(1, 6)))
    has_idx = chance(25)
    idx = indices(rnd(1, 6))
    has_rg = chance(40)
    rg = chance(50)
    call begin_action("new_tensor " // trim(tag(k)) // " fill=" // str(fill) // " ndims=" // str(ndims) // &
      " shape=" // strs8(int(shp(1:n), int64)) // " dtype=" // str(dtype) // " dev=" // str(dev) // " idx=" // &
      lstr(has_idx) // str(idx) // " rg=" // lstr(has_rg) // lstr(rg))
    ! Prediction, in the order the checks are made.
    expect = E_OK
    code = 0
    if (ndims /= n) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (neg) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (all(dtype /= good_dtypes)) then
      code = FTORCH_ERR_DTYPE
    else if (dev /= torch_kCPU) then
      code = FTORCH_ERR_DEVICE
    else if (has_idx .and. idx > 0) then
      code = FTORCH_ERR_DEVICE
    else if (has_rg .and. rg .and. dtype /= torch_kFloat32 .and. dtype /= torch_kFloat64) then
      code = FTORCH_ERR_TORCH
    else if (has_rg .and. rg .and. inference_active()) then
      expect = E_ANY
    end if
    if (code /= 0) expect = E_FAIL
    before = t%p
    if (has_idx .and. has_rg) then
      call do_new(t, fill, ndims, shp(1:n), dtype, dev, idx, rg)
    else if (has_idx) then
      call do_new(t, fill, ndims, shp(1:n), dtype, dev, idx=idx)
    else if (has_rg) then
      call do_new(t, fill, ndims, shp(1:n), dtype, dev, rg=rg)
    else
      call do_new(t, fill, ndims, shp(1:n), dtype, dev)
    end if
    call outcome("torch_tensor_zeros/ones/empty", expect, code)
    call constructed(k, before, "construction")
    if (fill == 0 .and. s == 0) then
      ! Uninitialised values could decide later outcomes (class indices, integer powers): zero
      ! them so that a seed replays the same calls.
      call t%zero(stat=s, errmsg=msg)
      call outcome("zero after torch_tensor_empty", E_OK, 0)
    end if
  end subroutine act_new_tensor

  subroutine do_new(t, fill, ndims, shp, dtype, dev, idx, rg)
    type(torch_tensor), intent(inout) :: t
    integer, intent(in) :: fill, ndims, dtype, dev
    integer(c_int64_t), intent(in) :: shp(:)
    integer, intent(in), optional :: idx
    logical, intent(in), optional :: rg
    select case (fill)
    case (0)
      call torch_tensor_empty(t, ndims, shp, dtype, dev, idx, rg, stat=s, errmsg=msg)
    case (1)
      call torch_tensor_zeros(t, ndims, shp, dtype, dev, idx, rg, stat=s, errmsg=msg)
    case default
      call torch_tensor_ones(t, ndims, shp, dtype, dev, idx, rg, stat=s, errmsg=msg)
    end select
  end subroutine do_new

  ! Fortran arrays that from_array wraps: rank and whether integer.
  integer function array_rank(which)
    integer, intent(in) :: which
    integer, parameter :: ranks(7) = [1, 2, 3, 2, 1, 2, 3]
    array_rank = ranks(which)
  end function array_rank

  logical function array_is_int(which)
    integer, intent(in) :: which
    array_is_int = which >= 5
  end function array_is_int

  !> A permutation of 1..n (valid) or, when `wrong`, a list of n values that is not one.
  subroutine make_perm(n, wrong, p)
    integer, intent(in) :: n
    logical, intent(in) :: wrong
    integer, intent(out) :: p(:)
    integer :: j, q, tmp
    logical :: flip
    if (n == 0) return   ! the empty list is the only list of 0 values, and a permutation
    do j = 1, n
      p(j) = j
    end do
    do j = n, 2, -1
      q = rnd(1, j)
      tmp = p(j)
      p(j) = p(q)
      p(q) = tmp
    end do
    if (wrong) then
      flip = chance(50)
      if (n == 1 .or. flip) then
        q = rnd(1, n)
        p(q) = rnd(-1, n + 2)
        if (all(p(1:n) >= 1 .and. p(1:n) <= n)) then
          if (n == 1) then
            p(1) = 2
          else
            p(1) = p(2)
          end if
        end if
      else
        p(1) = p(n)
      end if
    end if
  end subroutine make_perm

  subroutine act_from_array()
    integer :: k, which, r, dev, idx, expect, code
    logical :: has_lay, bad_lay, has_perm, bad_perm, has_idx, has_rg, rg
    integer(ftorch_int) :: lay(3)
    integer :: perm(3), lay_default(3)
    integer, parameter :: devices(5) = [1, 12, 13, 77, -1], indices(5) = [-1, 0, 1, 3, -9]
    type(torch_tensor), pointer :: t
    type(c_ptr) :: before
    k = pick()
    t => ref(k)
    which = rnd(1, 7)
    r = array_rank(which)
    has_lay = chance(25)
    bad_lay = chance(40)
    call make_perm(r, bad_lay, lay_default)
    lay(1:r) = int(lay_default(1:r), ftorch_int)
    has_perm = chance(25)
    bad_perm = chance(40)
    call make_perm(r, bad_perm, perm)
    dev = torch_kCPU
    if (chance(12)) dev = unavailable(devices(rnd(1, 5)))
    has_idx = chance(20)
    idx = indices(rnd(1, 5))
    has_rg = chance(40)
    rg = chance(50)
    call begin_action("from_array " // trim(tag(k)) // " array=" // str(which) // " layout=" // lstr(has_lay) // &
      strs(int(lay(1:r))) // " perm=" // lstr(has_perm) // strs(perm(1:r)) // " dev=" // str(dev) // " idx=" // &
      lstr(has_idx) // str(idx) // " rg=" // lstr(has_rg) // lstr(rg))
    expect = E_OK
    code = 0
    if (has_lay .and. bad_lay) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (dev /= torch_kCPU .or. (has_idx .and. idx > 0)) then
      code = FTORCH_ERR_DEVICE
    else if (has_perm .and. bad_perm) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (has_rg .and. rg .and. array_is_int(which)) then
      code = FTORCH_ERR_TORCH
    else if (has_rg .and. rg .and. inference_active()) then
      expect = E_ANY
    end if
    if (code /= 0) expect = E_FAIL
    before = t%p
    ! Every combination of present and absent optional arguments.
    if (has_idx .and. has_rg .and. has_perm) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), perm(1:r), idx, rg)
    else if (has_idx .and. has_rg) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), idx=idx, rg=rg)
    else if (has_idx .and. has_perm) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), perm(1:r), idx=idx)
    else if (has_rg .and. has_perm) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), perm(1:r), rg=rg)
    else if (has_idx) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), idx=idx)
    else if (has_rg) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), rg=rg)
    else if (has_perm) then
      call do_from_array(t, which, dev, has_lay, lay(1:r), perm(1:r))
    else
      call do_from_array(t, which, dev, has_lay, lay(1:r))
    end if
    call outcome("torch_tensor_from_array", expect, code)
    call constructed(k, before, "from_array")
  end subroutine act_from_array

  subroutine do_from_array(t, which, dev, has_lay, lay, perm, idx, rg)
    type(torch_tensor), intent(inout) :: t
    integer, intent(in) :: which, dev
    logical, intent(in) :: has_lay
    integer(ftorch_int), intent(in) :: lay(:)
    integer, intent(in), optional :: perm(:)
    integer, intent(in), optional :: idx
    logical, intent(in), optional :: rg
    select case (which)
    case (1)
      if (has_lay) then
        call torch_tensor_from_array(t, r64a, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, r64a, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    case (2)
      if (has_lay) then
        call torch_tensor_from_array(t, r64b, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, r64b, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    case (3)
      if (has_lay) then
        call torch_tensor_from_array(t, r64c, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, r64c, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    case (4)
      if (has_lay) then
        call torch_tensor_from_array(t, r32b, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, r32b, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    case (5)
      if (has_lay) then
        call torch_tensor_from_array(t, i32a, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, i32a, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    case (6)
      if (has_lay) then
        call torch_tensor_from_array(t, i64b, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, i64b, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    case default
      if (has_lay) then
        call torch_tensor_from_array(t, i8c, lay, dev, idx, rg, perm, stat=s, errmsg=msg)
      else
        call torch_tensor_from_array(t, i8c, dev, idx, rg, perm, stat=s, errmsg=msg)
      end if
    end select
  end subroutine do_from_array

  subroutine act_from_blob()
    integer :: k, ndims, n, nl, j, dtype, dev, expect, code
    integer(c_int64_t) :: shp(3)
    integer :: lay(3)
    logical :: null_data, bad_lay, rg
    integer, parameter :: dtypes(8) = [1, 2, 3, 4, 6, 7, 5, 42]
    type(torch_tensor), pointer :: t
    type(c_ptr) :: before, data
    k = pick()
    t => ref(k)
    ndims = rnd(0, 3)
    n = ndims
    nl = ndims
    if (chance(10)) n = rnd(0, 3)
    if (chance(10)) nl = rnd(0, 3)
    do j = 1, 3
      shp(j) = rnd(1, 4)
      if (chance(6)) shp(j) = rnd(-2, 0)
    end do
    bad_lay = chance(15)
    call make_perm(nl, bad_lay .and. nl > 0, lay)
    if (nl == 0) bad_lay = .false.
    dtype = dtypes(rnd(1, 8))
    dev = torch_kCPU
    if (chance(10)) dev = unavailable(torch_kCUDA)
    null_data = chance(10)
    rg = chance(20)
    data = c_loc(blob)
    if (null_data) data = c_null_ptr
    call begin_action("from_blob " // trim(tag(k)) // " ndims=" // str(ndims) // " shape=" // &
      strs8(int(shp(1:n), int64)) // " layout=" // strs(lay(1:nl)) // " dtype=" // str(dtype) // " dev=" // str(dev) // &
      " null=" // lstr(null_data) // " rg=" // lstr(rg))
    expect = E_OK
    code = 0
    if (ndims /= n .or. ndims /= nl) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (any(shp(1:n) < 0)) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (bad_lay) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (dtype == 5 .or. dtype == 42) then
      code = FTORCH_ERR_DTYPE
    else if (dev /= torch_kCPU) then
      code = FTORCH_ERR_DEVICE
    else if (null_data .and. product(shp(1:n)) > 0) then
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (rg .and. dtype /= torch_kFloat32 .and. dtype /= torch_kFloat64) then
      code = FTORCH_ERR_TORCH
    else if (rg .and. inference_active()) then
      expect = E_ANY
    end if
    if (code /= 0) expect = E_FAIL
    before = t%p
    call torch_tensor_from_blob(t, data, ndims, shp(1:n), lay(1:nl), dtype, dev, requires_grad=rg, &
                                stat=s, errmsg=msg)
    call outcome("torch_tensor_from_blob", expect, code)
    call constructed(k, before, "from_blob")
  end subroutine act_from_blob

  ! ------------------------------------------------------------------ lifetime

  subroutine act_delete()
    integer :: k, a, b, j
    type(torch_tensor), pointer :: t
    if (chance(20)) then
      a = rnd(1, NP)
      b = rnd(a - 1, NP)
      call begin_action("torch_delete(pool(" // str(a) // ":" // str(b) // ")) (elemental)")
      call torch_delete(pool(a:b))
      do j = a, b
        call deleted(j)
      end do
      return
    end if
    k = pick()
    t => ref(k)
    call begin_action("delete " // trim(tag(k)))
    call torch_delete(t)
    if (chance(40)) call torch_tensor_delete(t)   ! deleting twice is a no-op
    call deleted(k)
  end subroutine act_delete

  !> A raw copy of a handle (as `transfer` or a compiler's intrinsic copy makes): it shares the
  !> tensor until either copy is deleted, then it is stale.
  subroutine act_handle_copy()
    integer :: i2, j
    type(torch_tensor), pointer :: src, dst
    integer(int64) :: bits
    i2 = pick()
    j = pick_pool()
    if (j == i2) j = mod(j, NP) + 1
    src => ref(i2)
    dst => pool(j)
    call begin_action("handle copy " // trim(tag(j)) // " <- transfer of " // trim(tag(i2)))
    call torch_delete(dst)
    call deleted(j)
    bits = transfer(src%p, 0_int64)
    dst%p = transfer(bits, c_null_ptr)
    st(j) = st(i2)
    obj(j) = obj(i2)
    if (st(j) == S_LIVE) then
      mrank(j) = mrank(i2)
      mshape(:, j) = mshape(:, i2)
      mdtype(j) = mdtype(i2)
      mrg(j) = mrg(i2)
      mleaf(j) = mleaf(i2)
    end if
  end subroutine act_handle_copy

  !> `allocate(held, source=...)` copies the handle; deallocating `held` runs its finalizer.
  subroutine act_sourced_copy()
    integer :: i2, j
    i2 = pick_pool()
    if (allocated(held) .and. chance(35)) then
      ! Move the handle back into the pool, or deallocate `held`.
      if (chance(50)) then
        j = pick_pool()
        call begin_action("pool <- held: " // trim(tag(j)) // " gets held's handle " // trim(tag(HELD_SLOT)))
        call torch_delete(pool(j))
        call deleted(j)
        pool(j)%p = held%p
        st(j) = st(HELD_SLOT)
        obj(j) = obj(HELD_SLOT)
        if (st(j) == S_LIVE) call refresh(j)
      else
        call drop_held(chance(50))
      end if
      return
    end if
    if (allocated(held)) call drop_held(chance(50))
    call begin_action("allocate(held, source=) from " // trim(tag(i2)))
    allocate(held, source=pool(i2))
    if (same_handle(held%p, pool(i2)%p)) then
      st(HELD_SLOT) = st(i2)
      obj(HELD_SLOT) = obj(i2)
      if (st(HELD_SLOT) == S_LIVE) call refresh(HELD_SLOT)
    else if (c_associated(held%p)) then
      call new_live(HELD_SLOT)   ! a compiler that deep-copies: a tensor of its own
    else
      st(HELD_SLOT) = S_NULL
    end if
  end subroutine act_sourced_copy

  subroutine drop_held(explicit)
    logical, intent(in) :: explicit
    integer :: j, o, q
    integer :: r
    logical :: was_live
    call begin_action("deallocate(held), explicit delete first: " // lstr(explicit) // " " // trim(tag(HELD_SLOT)))
    if (explicit) then
      call torch_delete(held)
      call deleted(HELD_SLOT)
    end if
    was_live = st(HELD_SLOT) == S_LIVE
    o = obj(HELD_SLOT)
    deallocate(held)
    st(HELD_SLOT) = S_NULL
    if (.not. was_live) return
    ! Whether deallocation finalized the shared handle is the compiler's business: observe it.
    ! (With no pool entry sharing it, the finalizer must have freed the tensor: the leak check
    ! after this action says so if not.)
    do j = 1, NP
      if (st(j) == S_LIVE .and. obj(j) == o) then
        r = pool(j)%get_rank(stat=q)
        if (q == 0) then
          n_dealloc_kept = n_dealloc_kept + 1
        else
          n_dealloc_finalized = n_dealloc_finalized + 1
          call kill_slot(j)
        end if
        exit
      end if
    end do
  end subroutine drop_held

  !> A handle that was never given out (an uninitialised c_ptr).
  subroutine act_garbage()
    integer :: j, variant
    integer(int64) :: bits, low, high
    j = pick_pool()
    variant = rnd(1, 3)
    select case (variant)
    case (1)   ! slot index beyond the table's capacity
      low = int(rnd(2**28 + 1, huge(0)), int64)
      high = int(rnd(0, huge(0)), int64)
    case (2)   ! a plausible slot with a generation no slot reaches
      low = int(rnd(1, 300), int64)
      high = int(rnd(2**30, huge(0)), int64)
    case default   ! generation 0 is never given out
      low = int(rnd(1, 300), int64)
      high = 0
    end select
    bits = ior(ishft(high, 32), low)
    call begin_action("garbage handle into " // trim(tag(j)) // ": " // str8(bits))
    call torch_delete(pool(j))
    call deleted(j)
    pool(j)%p = transfer(bits, c_null_ptr)
    st(j) = S_GARBAGE
  end subroutine act_garbage

  ! ------------------------------------------------------------------ queries

  subroutine act_query()
    integer :: k, q, expect, code, r, dt
    integer(c_int64_t), pointer :: sizes(:)
    logical :: flag
    type(torch_tensor), pointer :: t
    k = pick()
    t => ref(k)
    q = rnd(1, 10)
    call begin_action("query " // str(q) // " of " // trim(tag(k)))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k)) then
      expect = E_OK
      code = 0
    end if
    select case (q)
    case (1)
      r = t%get_rank(stat=s, errmsg=msg)
      call outcome("get_rank", expect, code)
      if (s == 0 .and. live(k) .and. r /= mrank(k)) call model_problem("get_rank changed")
    case (2)
      sizes => t%get_shape(stat=s, errmsg=msg)
      call outcome("get_shape", expect, code)
      if (s /= 0 .and. associated(sizes)) call model_problem("a failed get_shape returned an associated pointer")
      if (s == 0 .and. live(k)) then
        if (size(sizes) /= mrank(k)) then
          call model_problem("get_shape changed")
        else if (any(sizes /= mshape(1:mrank(k), k))) then
          call model_problem("get_shape changed")
        end if
      end if
    case (3)
      sizes => t%get_stride(stat=s, errmsg=msg)
      call outcome("get_stride", expect, code)
      if (s == 0 .and. live(k)) then
        if (size(sizes) /= mrank(k)) call model_problem("get_stride has the wrong size")
      end if
    case (4)
      dt = t%get_dtype(stat=s, errmsg=msg)
      call outcome("get_dtype", expect, code)
      if (s == 0 .and. live(k) .and. dt /= mdtype(k)) call model_problem("get_dtype changed")
    case (5)
      dt = t%get_device_type(stat=s, errmsg=msg)
      call outcome("get_device_type", expect, code)
      if (s == 0 .and. dt /= torch_kCPU) call model_problem("a tensor is not on the CPU")
    case (6)
      dt = t%get_device_index(stat=s, errmsg=msg)
      call outcome("get_device_index", expect, code)
      if (s == 0 .and. dt /= -1) call model_problem("a CPU tensor has a device index")
    case (7)
      flag = t%requires_grad(stat=s, errmsg=msg)
      call outcome("requires_grad", expect, code)
    case (8)
      flag = torch_tensor_is_leaf(t, stat=s, errmsg=msg)
      call outcome("torch_tensor_is_leaf", expect, code)
    case (9)
      ! Printing a live tensor writes it out: keep that to small ones.
      if (live(k)) then
        if (numel(k) > 6) return
      end if
      call torch_tensor_print(t, stat=s, errmsg=msg)
      call outcome("torch_tensor_print", expect, code)
    case default
      ! (An inference tensor's gradient cannot be zeroed in place outside inference mode.)
      if (expect == E_OK) then
        if (obj_inf(obj(k))) expect = E_ANY
      end if
      call t%zero_grad(stat=s, errmsg=msg)
      call outcome("zero_grad", expect, code)
    end select
  end subroutine act_query

  !> Queries of expressions (inside a catch scope: the operator itself may fail).
  subroutine act_query_expression()
    integer :: k, form, r, dt
    integer(c_int64_t), pointer :: sizes(:)
    logical :: flag
    type(torch_tensor), pointer :: t
    k = pick()
    t => ref(k)
    form = rnd(1, 6)
    call begin_action("query of an expression, form " // str(form) // ", of " // trim(tag(k)))
    call torch_catch_begin()
    select case (form)
    case (1)
      r = torch_tensor_get_rank(t * 2.0_real64, stat=s2, errmsg=msg2)
    case (2)
      dt = torch_tensor_get_dtype(torch_exp(t), stat=s2, errmsg=msg2)
    case (3)
      flag = torch_tensor_requires_grad(-t, stat=s2, errmsg=msg2)
    case (4)
      flag = torch_tensor_is_leaf(torch_relu(t), stat=s2, errmsg=msg2)
    case (5)
      sizes => torch_tensor_get_shape(torch_abs(t), stat=s2, errmsg=msg2)
      if (s2 /= 0 .and. associated(sizes)) call model_problem("a failed get_shape returned an associated pointer")
      nullify(sizes)
    case default
      sizes => torch_tensor_get_stride(t + 1, stat=s2, errmsg=msg2)
      nullify(sizes)
    end select
    call torch_catch_end(s, msg)
    if (form >= 5) then
      ! A pointer into an expression's result would dangle once the statement ends.
      call operator_then(k, "get_shape/get_stride", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT)
    else
      call operator_then(k, "query", E_OK, 0)
    end if
  end subroutine act_query_expression

  ! ------------------------------------------------------------------ data

  subroutine act_to_array()
    integer :: k, dest, expect, code, drank
    integer(int64) :: dshape(3)
    logical :: expr
    type(torch_tensor), pointer :: t
    k = pick()
    t => ref(k)
    dest = rnd(1, 11)
    expr = chance(20)
    select case (dest)
    case (1, 3, 11); drank = 1; dshape(1) = 5
    case (2); drank = 2; dshape(1:2) = [2, 3]
    case (4, 9); drank = 3; dshape = 2
    case (5); drank = 1; dshape(1) = 1
    case (6); drank = 2; dshape(1:2) = [3, 4]
    case (7); drank = 1; dshape(1) = 6
    case (8); drank = 2; dshape(1:2) = 2
    case default; drank = 1; dshape(1) = 4
    end select
    call begin_action("to_array " // trim(tag(k)) // " dest=" // str(dest) // " expression=" // lstr(expr))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k)) then
      code = FTORCH_ERR_INVALID_ARGUMENT
      if (mrank(k) == drank) then
        if (all(mshape(1:drank, k) == dshape(1:drank))) then
          expect = E_OK
          code = 0
          call expect_conversion(mdtype(k), dest, expr, expect, code)
        end if
      end if
    end if
    if (expr) then
      call torch_catch_begin()
      select case (dest)
      case (1); call torch_tensor_to_array(t + 1, d64a, stat=s2, errmsg=msg2)
      case (2); call torch_tensor_to_array(torch_sin(t), d64b, stat=s2, errmsg=msg2)
      case (3); call torch_tensor_to_array(t * t, d32a, stat=s2, errmsg=msg2)
      case (4); call torch_tensor_to_array(-t, di8c, stat=s2, errmsg=msg2)
      case (5); call torch_tensor_to_array(torch_detach(t), d64s, stat=s2, errmsg=msg2)
      case (6); call torch_tensor_to_array(t / 2, d32b, stat=s2, errmsg=msg2)
      case (7); call torch_tensor_to_array(torch_abs(t), di32a, stat=s2, errmsg=msg2)
      case (8); call torch_tensor_to_array(torch_clone(t), di64b, stat=s2, errmsg=msg2)
      case (9); call torch_tensor_to_array(t ** 2, d64c, stat=s2, errmsg=msg2)
      case (10); call torch_tensor_to_array(t - 1.0_real32, di16a, stat=s2, errmsg=msg2)
      case default; call torch_tensor_to_array(torch_relu(t), r64a, stat=s2, errmsg=msg2)
      end select
      call torch_catch_end(s, msg)
      call operator_then(k, "torch_tensor_to_array", expect, code)
      return
    end if
    select case (dest)
    case (1); call torch_tensor_to_array(t, d64a, stat=s, errmsg=msg)
    case (2); call torch_tensor_to_array(t, d64b, stat=s, errmsg=msg)
    case (3); call torch_tensor_to_array(t, d32a, stat=s, errmsg=msg)
    case (4); call torch_tensor_to_array(t, di8c, stat=s, errmsg=msg)
    case (5); call torch_tensor_to_array(t, d64s, stat=s, errmsg=msg)
    case (6); call torch_tensor_to_array(t, d32b, stat=s, errmsg=msg)
    case (7); call torch_tensor_to_array(t, di32a, stat=s, errmsg=msg)
    case (8); call torch_tensor_to_array(t, di64b, stat=s, errmsg=msg)
    case (9); call torch_tensor_to_array(t, d64c, stat=s, errmsg=msg)
    case (10); call torch_tensor_to_array(t, di16a, stat=s, errmsg=msg)
    case default; call torch_tensor_to_array(t, r64a, stat=s, errmsg=msg)   ! into an array a tensor may alias
    end select
    call outcome("torch_tensor_to_array", expect, code)
  end subroutine act_to_array

  !> to_array converts only where no value can change: floating-point values into an integer
  !> array are FTORCH_ERR_DTYPE; integers into a narrower integer kind depend on the values.
  !> (Destination 10’s expression, t - 1.0_real32, is floating point whatever t is.)
  subroutine expect_conversion(dtype, dest, expr, expect, code)
    integer, intent(in) :: dtype, dest
    logical, intent(in) :: expr
    integer, intent(inout) :: expect, code
    integer :: into
    select case (dest)
    case (4); into = torch_kInt8
    case (7); into = torch_kInt32
    case (8); into = torch_kInt64
    case (10); into = torch_kInt16
    case default; return  ! a real array: rounding at most
    end select
    if (dtype == torch_kFloat32 .or. dtype == torch_kFloat64 .or. (expr .and. dest == 10)) then
      expect = E_FAIL
      code = FTORCH_ERR_DTYPE
    else if (int_bytes(dtype) > int_bytes(into)) then
      expect = E_ANY
    end if
  end subroutine expect_conversion

  integer function int_bytes(dtype)
    integer, intent(in) :: dtype
    select case (dtype)
    case (torch_kInt8); int_bytes = 1
    case (torch_kInt16); int_bytes = 2
    case (torch_kInt32); int_bytes = 4
    case default; int_bytes = 8
    end select
  end function int_bytes

  subroutine act_data_pointer()
    integer :: k, dest, expect, code, drank, ddtype
    logical :: expr, ok_assoc
    integer(int64) :: got(3)
    type(torch_tensor), pointer :: t
    k = pick()
    t => ref(k)
    dest = rnd(1, 6)
    expr = chance(25)
    select case (dest)
    case (1); drank = 1; ddtype = torch_kFloat64
    case (2); drank = 2; ddtype = torch_kFloat64
    case (3); drank = 3; ddtype = torch_kFloat64
    case (4); drank = 2; ddtype = torch_kFloat32
    case (5); drank = 1; ddtype = torch_kInt32
    case default; drank = 2; ddtype = torch_kInt64
    end select
    call begin_action("data_pointer " // trim(tag(k)) // " " // shape_text(k) // " dest=" // str(dest) // " expression=" // &
      lstr(expr))
    if (expr) then
      call torch_catch_begin()
      select case (dest)
      case (1); call torch_tensor_data_pointer(t * 1.0_real64, p64a, stat=s2, errmsg=msg2)
      case (2); call torch_tensor_data_pointer(torch_tanh(t), p64b, stat=s2, errmsg=msg2)
      case (3); call torch_tensor_data_pointer(t + t, p64c, stat=s2, errmsg=msg2)
      case (4); call torch_tensor_data_pointer(torch_exp(t), p32b, stat=s2, errmsg=msg2)
      case (5); call torch_tensor_data_pointer(-t, pi32a, stat=s2, errmsg=msg2)
      case default; call torch_tensor_data_pointer(t * 3_int64, pi64b, stat=s2, errmsg=msg2)
      end select
      call torch_catch_end(s, msg)
      ! Its memory is freed when the statement ends: a pointer to it would dangle.
      call operator_then(k, "torch_tensor_data_pointer", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT)
      ok_assoc = any_pointer_associated()
      if (s2 /= 0 .and. ok_assoc) call model_problem("a failed data_pointer left the pointer associated")
      call nullify_pointers()
      return
    end if
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k)) then
      if (mdtype(k) /= ddtype) then
        code = FTORCH_ERR_DTYPE
      else if (mrank(k) /= drank) then
        code = FTORCH_ERR_INVALID_ARGUMENT
      else
        expect = E_ANY   ! fails unless laid out in Fortran order
        code = 0
      end if
    end if
    got = -1
    select case (dest)
    case (1)
      call torch_tensor_data_pointer(t, p64a, stat=s, errmsg=msg)
      if (associated(p64a)) got(1:1) = shape(p64a, kind=int64)
    case (2)
      call torch_tensor_data_pointer(t, p64b, stat=s, errmsg=msg)
      if (associated(p64b)) got(1:2) = shape(p64b, kind=int64)
    case (3)
      call torch_tensor_data_pointer(t, p64c, stat=s, errmsg=msg)
      if (associated(p64c)) got(1:3) = shape(p64c, kind=int64)
    case (4)
      call torch_tensor_data_pointer(t, p32b, stat=s, errmsg=msg)
      if (associated(p32b)) got(1:2) = shape(p32b, kind=int64)
    case (5)
      call torch_tensor_data_pointer(t, pi32a, stat=s, errmsg=msg)
      if (associated(pi32a)) got(1:1) = shape(pi32a, kind=int64)
    case default
      call torch_tensor_data_pointer(t, pi64b, stat=s, errmsg=msg)
      if (associated(pi64b)) got(1:2) = shape(pi64b, kind=int64)
    end select
    call outcome("torch_tensor_data_pointer", expect, code)
    ok_assoc = any_pointer_associated()
    if (s /= 0 .and. ok_assoc) call model_problem("a failed data_pointer left the pointer associated")
    if (s == 0) then
      if (.not. ok_assoc) then
        call model_problem("a successful data_pointer gave a disassociated pointer")
      else if (any(got(1:drank) /= mshape(1:drank, k))) then
        call model_problem("data_pointer's shape differs from the tensor's")
      end if
    end if
    call nullify_pointers()
  end subroutine act_data_pointer

  logical function any_pointer_associated()
    any_pointer_associated = associated(p64a) .or. associated(p64b) .or. associated(p64c) .or. &
                             associated(p32b) .or. associated(pi32a) .or. associated(pi64b)
  end function any_pointer_associated

  subroutine nullify_pointers()
    nullify(p64a, p64b, p64c, p32b, pi32a, pi64b)
  end subroutine nullify_pointers

  subroutine act_copy_into()
    integer :: a, b, expect, code
    logical :: expr, nb
    type(torch_tensor), pointer :: ta, tb
    a = pick()
    b = pick()
    ta => ref(a)
    tb => ref(b)
    expr = chance(25)
    nb = chance(30)
    call begin_action("torch_tensor_to " // trim(tag(a)) // " -> " // trim(tag(b)) // " expression=" // lstr(expr) // &
      " non_blocking=" // lstr(nb))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(a) .and. live(b)) then
      code = 0
      expect = E_ANY
      if (.not. same_shape(a, b)) then
        expect = E_FAIL
        code = FTORCH_ERR_INVALID_ARGUMENT
      end if
    end if
    if (expr) then
      call torch_catch_begin()
      call torch_tensor_to(ta * 0.5_real64, tb, nb, stat=s2, errmsg=msg2)
      call torch_catch_end(s, msg)
      call operator_then(a, "torch_tensor_to", expect, code)
    else
      call torch_tensor_to(ta, tb, nb, stat=s, errmsg=msg)
      call outcome("torch_tensor_to", expect, code)
    end if
    if (live(b)) call changed(obj(b))
  end subroutine act_copy_into

  subroutine act_zero_fill()
    integer :: k, form, expect, code
    type(torch_tensor), pointer :: t
    type(c_ptr) :: before
    k = pick()
    t => ref(k)
    form = rnd(1, 7)
    call begin_action("zero/fill form " // str(form) // " of " // trim(tag(k)))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k)) then
      expect = E_ANY   ! in-place writes fail on leaves that require grad and on inference tensors
      code = 0
    end if
    before = t%p
    if (form == 1) then
      call t%zero(stat=s, errmsg=msg)
      call outcome("zero", expect, code)
    else
      call torch_catch_begin()
      select case (form)
      case (2); t = 3_int8
      case (3); t = 4_int16
      case (4); t = 5_int32
      case (5); t = 6_int64
      case (6); t = 0.5_real32
      case default; t = 2.5_real64
      end select
      call torch_catch_end(s, msg)
      call outcome("assignment(=) of a scalar", expect, code)
    end if
    if (.not. same_handle(t%p, before)) call model_problem("zero or a scalar fill changed the handle")
    if (live(k)) call changed(obj(k))
  end subroutine act_zero_fill

  ! ------------------------------------------------------------------ arithmetic

  subroutine act_math()
    integer :: a, b, c, form, expect, code, u, nr, npd, j, d1, d2
    integer :: rs(3), pd(4)
    logical :: uses_b, safe, compound, was_live, kd, dims_valid, direct, c40, c50, c50b, c30
    integer :: oa, ob
    type(torch_tensor), pointer :: ta, tb, tc
    type(c_ptr) :: before
    integer(int64) :: p
    a = pick()
    b = pick()
    c = pick()
    ta => ref(a)
    tb => ref(b)
    tc => ref(c)
    form = rnd(1, 27)
    u = rnd(1, 11)
    kd = chance(50)
    d1 = rnd(-1, 4)
    d2 = rnd(-1, 4)
    uses_b = .false.
    safe = .false.
    compound = .false.
    dims_valid = .true.
    direct = .false.
    ! Shape arguments for reshape and permute: often valid, often not.
    nr = rnd(0, 3)
    npd = rnd(0, 4)
    do j = 1, 3
      rs(j) = rnd(-1, 6)
    end do
    c40 = chance(40)
    c50 = chance(50)
    c50b = chance(50)
    c30 = chance(30)
    do j = 1, 4
      pd(j) = rnd(-1, 4)
    end do
    if (live(a) .and. c40) then
      nr = 1
      rs(1) = int(numel(a))
      if (c50) rs(1) = -1
    else if (live(a) .and. c50b .and. mrank(a) <= 4) then
      npd = mrank(a)
      call make_perm(npd, c30, pd)
    end if
    call begin_action("math form " // str(form) // " u=" // str(u) // " " // trim(tag(c)) // " = f(" // trim(tag(a)) // &
      ", " // trim(tag(b)) // ") reshape=" // strs(rs(1:nr)) // " permute=" // strs(pd(1:npd)) // " dims=" // str(d1) // &
      "," // str(d2) // " keepdim=" // lstr(kd))
    was_live = live(c)
    before = tc%p
    oa = obj_of(a)
    ob = obj_of(b)
    call torch_catch_begin()
    select case (form)
    case (1); tc = ta + tb; uses_b = .true.
    case (2); tc = ta - tb; uses_b = .true.
    case (3); tc = ta * tb; uses_b = .true.
    case (4); tc = ta / tb; uses_b = .true.
    case (5); tc = ta ** tb; uses_b = .true.
    case (6); tc = torch_matmul(ta, tb); uses_b = .true.
    case (7); tc = ta + 1_int8; safe = .true.
    case (8); tc = 2_int16 * ta; safe = .true.
    case (9); tc = ta / 3_int32; safe = .true.
    case (10); tc = ta ** 2_int64; safe = .true.
    case (11); tc = 0.5_real32 - ta; safe = .true.
    case (12); tc = ta * 1.5_real64; safe = .true.
    case (13); tc = 2 ** ta
    case (14); tc = -ta; safe = .true.
    case (15)
      safe = .true.
      select case (u)
      case (1); tc = torch_exp(ta)
      case (2); tc = torch_log(ta)
      case (3); tc = torch_sqrt(ta)
      case (4); tc = torch_abs(ta)
      case (5); tc = torch_sin(ta)
      case (6); tc = torch_cos(ta)
      case (7); tc = torch_tanh(ta)
      case (8); tc = torch_sigmoid(ta)
      case (9); tc = torch_relu(ta)
      case (10); tc = torch_clone(ta)
      case default; tc = torch_detach(ta)
      end select
    case (16)
      if (kd) then
        tc = torch_sum(ta)
        safe = .true.
      else
        tc = torch_mean(ta)
        if (live(a)) safe = is_float(a)
      end if
    case (17)
      if (live(a)) dims_valid = dim_ok(d1, mrank(a))
      if (u <= 6) then
        tc = torch_sum(ta, dim=d1, keepdim=kd)
        safe = .true.
      else
        tc = torch_mean(ta, d1, kd)
        if (live(a)) safe = is_float(a)
      end if
    case (18)
      tc = torch_reshape(ta, rs(1:nr))
      if (live(a)) then
        p = product(int(rs(1:nr), int64), mask=rs(1:nr) /= -1)
        if (any(rs(1:nr) < -1) .or. count(rs(1:nr) == -1) > 1) then
          dims_valid = .false.
        else if (count(rs(1:nr) == -1) == 0) then
          dims_valid = p == numel(a)
          safe = dims_valid
        else if (p > 0) then
          dims_valid = mod(numel(a), p) == 0
          safe = dims_valid
        end if
      end if
    case (19)
      tc = torch_permute(ta, pd(1:npd))
      if (live(a)) then
        dims_valid = npd == mrank(a)
        if (dims_valid .and. npd > 0) dims_valid = all(pd(1:npd) >= 1 - npd .and. pd(1:npd) <= npd)
        if (dims_valid .and. npd > 0) then
          do j = 1, npd
            if (count(modulo(pd(1:npd) - 1, npd) == modulo(pd(j) - 1, npd)) > 1) dims_valid = .false.
          end do
        end if
        safe = dims_valid
      end if
    case (20)
      tc = torch_transpose(ta, d1, d2)
      if (live(a)) then
        dims_valid = dim_ok(d1, mrank(a)) .and. dim_ok(d2, mrank(a))
        safe = dims_valid
      end if
    case (21); tc = ta * tb + ta - tb / 2; uses_b = .true.; compound = .true.
    case (22); tc = torch_exp(ta) * tb + 2; uses_b = .true.; compound = .true.
    case (23); tc = torch_sum(ta * tb); uses_b = .true.; compound = .true.
    case (24); tc = torch_matmul(ta, torch_transpose(tb, 1, 2)); uses_b = .true.; compound = .true.
    case (25); tc = ta; direct = .true.
    case (26); tc = torch_clone(torch_detach(ta)); safe = .true.; compound = .true.
    case default; tc = torch_relu(torch_reshape(ta, [-1])); safe = .true.; compound = .true.
    end select
    call torch_catch_end(s, msg)
    ! Prediction.
    expect = E_ANY
    code = 0
    if (direct) then
      if (st(a) == S_STALE .or. st(a) == S_GARBAGE) then
        expect = E_FAIL   ! checked before `t = t` is recognized
        code = FTORCH_ERR_NULL_HANDLE
      else if (st(a) == S_NULL) then
        if (was_live) then
          expect = E_FAIL
          code = FTORCH_ERR_NULL_HANDLE
        else
          expect = E_OK
        end if
      else if (transfer(ta%p, 0_int64) == transfer(before, 0_int64)) then
        expect = E_OK     ! t = t
      else if (stamp_of(ta%p) /= obj_stamp(obj(a))) then
        expect = E_FAIL   ! a copy of the handle older than the last `=` into its tensor
        code = FTORCH_ERR_NULL_HANDLE
      else if (.not. was_live) then
        expect = E_OK
      else if (same_handle(ta%p, before)) then
        expect = E_OK
      end if
    else if (.not. live(a) .or. (uses_b .and. .not. live(b))) then
      expect = E_FAIL
      if (.not. compound) code = FTORCH_ERR_NULL_HANDLE
    else if (.not. dims_valid) then
      expect = E_FAIL
    else if (safe .and. .not. was_live .and. .not. obj_inf(obj(a))) then
      expect = E_OK
    end if
    call outcome("operators, functions and assignment in a catch scope", expect, code)
    call settle(c, before, was_live)
    call inherit_inference(c, oa)
    if (uses_b) call inherit_inference(c, ob)
  end subroutine act_math

  !> torch_tensor_sum/mean(output, tensor): FTorch's forms, with stat.
  subroutine act_reduce_into()
    integer :: o, k, expect, code
    logical :: expr, mean
    type(torch_tensor), pointer :: to, t
    type(c_ptr) :: before
    o = pick()
    k = pick()
    to => ref(o)
    t => ref(k)
    expr = chance(30)
    mean = chance(50)
    call begin_action("torch_tensor_sum/mean mean=" // lstr(mean) // " " // trim(tag(o)) // " <- " // trim(tag(k)) // &
      " expression=" // lstr(expr))
    ! Order: the reduction (a bad tensor, the mean of integers), then the output.
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k)) then
      if (mean .and. .not. is_float(k) .and. .not. expr) then   ! (the expression is floating point)
        code = FTORCH_ERR_TORCH
      else if (live(o)) then
        expect = E_ANY
        code = 0
        if (numel(o) /= 1) code = FTORCH_ERR_INVALID_ARGUMENT
        if (code /= 0) expect = E_FAIL
      end if
      ! A reduction of an inference tensor outside inference mode may fail first.
      if (obj_inf(obj(k)) .and. expect == E_FAIL) code = 0
      if (obj_inf(obj(k)) .and. expect /= E_FAIL) expect = E_ANY
    end if
    before = to%p
    if (expr) then
      call torch_catch_begin()
      if (mean) then
        call torch_tensor_mean(to, torch_abs(t) * 1.0_real64, stat=s2, errmsg=msg2)
      else
        call torch_tensor_sum(to, t * t, stat=s2, errmsg=msg2)
      end if
      call torch_catch_end(s, msg)
      call operator_then(k, "torch_tensor_sum/mean", expect, code)
    else
      if (mean) then
        call torch_tensor_mean(to, t, stat=s, errmsg=msg)
      else
        call torch_tensor_sum(to, t, stat=s, errmsg=msg)
      end if
      call outcome("torch_tensor_sum/mean", expect, code)
    end if
    if (.not. same_handle(to%p, before)) call model_problem("torch_tensor_sum/mean changed the output handle")
    if (live(o)) call changed(obj(o))
    call inherit_inference(o, obj_of(k))
  end subroutine act_reduce_into

  ! ------------------------------------------------------------------ autograd

  subroutine act_backward()
    integer :: k, g, expect, code, form
    logical :: retain, has_g, expr
    type(torch_tensor), pointer :: t, tg
    k = pick()
    g = pick()
    t => ref(k)
    tg => ref(g)
    has_g = chance(40)
    retain = chance(50)
    expr = chance(25)
    form = rnd(1, 2)
    call begin_action("backward " // trim(tag(k)) // " gradient=" // lstr(has_g) // " " // trim(tag(g)) // " retain=" // &
      lstr(retain) // " expression=" // lstr(expr) // " form=" // str(form))
    if (live(k)) call refresh(k)
    if (expr) then
      call torch_catch_begin()
      if (form == 1) then
        call torch_tensor_backward(torch_sum(t * t), retain_graph=retain, stat=s2, errmsg=msg2)
      else
        call torch_tensor_backward(t * 2.0_real64, torch_abs(t), stat=s2, errmsg=msg2)
      end if
      call torch_catch_end(s, msg)
      ! An expression requires grad only when its operand does (and grad mode is on).
      if (live(k) .and. .not. mrg(k)) then
        call operator_then(k, "torch_tensor_backward", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT, form == 2)
      else
        call operator_then(k, "torch_tensor_backward", E_ANY, 0, form == 2)
      end if
    else
      expect = E_FAIL
      code = FTORCH_ERR_NULL_HANDLE
      if (live(k)) then
        code = FTORCH_ERR_INVALID_ARGUMENT
        if (mrg(k)) then
          if (has_g .and. st(g) /= S_NULL) then
            if (.not. live(g)) then
              code = FTORCH_ERR_NULL_HANDLE
            else if (.not. same_shape(g, k)) then
              code = FTORCH_ERR_INVALID_ARGUMENT
            else
              expect = E_ANY
              code = 0
            end if
          else if (numel(k) == 1) then
            expect = E_ANY
            code = 0
          end if
        end if
      end if
      if (has_g) then
        call torch_tensor_backward(t, tg, retain, stat=s, errmsg=msg)
      else
        call torch_tensor_backward(t, retain_graph=retain, stat=s, errmsg=msg)
      end if
      call outcome("torch_tensor_backward", expect, code)
    end if
    call all_may_have_grad()
  end subroutine act_backward

  subroutine all_may_have_grad()
    integer :: j
    do j = 1, NP + 1
      if (st(j) == S_LIVE) then
        if (mrg(j)) obj_grad(obj(j)) = .true.
      end if
    end do
  end subroutine all_may_have_grad

  subroutine act_get_gradient()
    integer :: g, k, expect, code
    logical :: expr, was_live
    type(torch_tensor), pointer :: tg, t
    type(c_ptr) :: before
    g = pick()
    k = pick()
    tg => ref(g)
    t => ref(k)
    expr = chance(20)
    if (g == k) expr = .true.   ! not the same variable as gradient and tensor
    call begin_action("get_gradient " // trim(tag(g)) // " <- grad of " // trim(tag(k)) // " expression=" // lstr(expr))
    if (live(k)) call refresh(k)
    was_live = live(g)
    before = tg%p
    if (expr) then
      call torch_catch_begin()
      call torch_tensor_get_gradient(tg, t * 1, stat=s2, errmsg=msg2)
      call torch_catch_end(s, msg)
      ! The result of an expression is a leaf without a gradient, or not a leaf.
      call operator_then(k, "torch_tensor_get_gradient", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT)
    else
      expect = E_FAIL
      code = FTORCH_ERR_NULL_HANDLE
      if (live(k)) then
        code = FTORCH_ERR_INVALID_ARGUMENT
        if (mleaf(k) .and. obj_grad(obj(k))) then
          expect = E_ANY
          code = 0
        end if
      end if
      call torch_tensor_get_gradient(tg, t, stat=s, errmsg=msg)
      call outcome("torch_tensor_get_gradient", expect, code)
    end if
    if (s /= 0 .or. (expr .and. s2 /= 0)) then
      call unchanged(g, before, "get_gradient")
    else
      call settle(g, before, was_live)
      call inherit_inference(g, obj_of(k))
    end if
  end subroutine act_get_gradient

  subroutine act_set_gradient()
    integer :: k, g, expect, code
    type(torch_tensor), pointer :: t, tg
    k = pick()
    g = pick()
    t => ref(k)
    tg => ref(g)
    call begin_action("set_gradient of " // trim(tag(k)) // " to " // trim(tag(g)))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k) .and. live(g)) then
      code = 0
      expect = E_ANY
      if (.not. same_shape(k, g)) then
        expect = E_FAIL
        code = FTORCH_ERR_INVALID_ARGUMENT
      end if
    end if
    call torch_tensor_set_gradient(t, tg, stat=s, errmsg=msg)
    call outcome("torch_tensor_set_gradient", expect, code)
    if (live(k)) obj_grad(obj(k)) = .true.
  end subroutine act_set_gradient

  subroutine act_set_requires_grad()
    integer :: k, expect, code
    logical :: flag
    type(torch_tensor), pointer :: t
    k = pick()
    t => ref(k)
    flag = chance(60)
    call begin_action("set_requires_grad " // trim(tag(k)) // " " // lstr(flag))
    if (live(k)) call refresh(k)
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(k)) then
      code = 0
      expect = E_ANY
      if (mleaf(k)) then
        expect = E_OK
        if (flag .and. .not. is_float(k)) then
          expect = E_FAIL
          code = FTORCH_ERR_TORCH
        else if (obj_inf(obj(k)) .or. inference_active()) then
          expect = E_ANY
        end if
      end if
    end if
    call torch_tensor_set_requires_grad(t, flag, stat=s, errmsg=msg)
    call outcome("torch_tensor_set_requires_grad", expect, code)
    if (live(k)) call changed(obj(k))
  end subroutine act_set_requires_grad

  subroutine act_grad_scope()
    integer :: kind, expect
    logical :: begin
    logical :: c1, c2
    kind = rnd(1, 3)
    c1 = chance(50)
    c2 = chance(50)
    begin = c1 .and. gdepth < 6
    if (gdepth > 0 .and. c2) kind = gstack(gdepth)   ! often the right one to end
    call begin_action("grad scope begin=" // lstr(begin) // " kind=" // str(kind) // " depth=" // str(gdepth))
    if (begin) then
      select case (kind)
      case (G_NO_GRAD); call torch_no_grad_begin(stat=s, errmsg=msg)
      case (G_ENABLE); call torch_enable_grad_begin(stat=s, errmsg=msg)
      case default; call torch_inference_mode_begin(stat=s, errmsg=msg)
      end select
      call outcome("grad scope begin", E_OK, 0)
      if (s == 0) then
        gdepth = gdepth + 1
        gstack(gdepth) = kind
      end if
    else
      expect = E_FAIL
      if (gdepth > 0) then
        if (gstack(gdepth) == kind) expect = E_OK
      end if
      select case (kind)
      case (G_NO_GRAD); call torch_no_grad_end(stat=s, errmsg=msg)
      case (G_ENABLE); call torch_enable_grad_end(stat=s, errmsg=msg)
      case default; call torch_inference_mode_end(stat=s, errmsg=msg)
      end select
      call outcome("grad scope end", expect, FTORCH_ERR_INVALID_ARGUMENT)
      if (s == 0 .and. gdepth > 0) gdepth = gdepth - 1
    end if
    if (torch_grad_enabled() .neqv. grad_enabled_model()) call model_problem("torch_grad_enabled() is not as modeled")
    if (torch_inference_mode_enabled() .neqv. inference_active()) &
      call model_problem("torch_inference_mode_enabled() is not as modeled")
  end subroutine act_grad_scope

  ! ------------------------------------------------------------------ losses

  subroutine act_loss()
    integer :: l, x, y, w, kind, red, expect, code, ox, oy
    logical :: has_red, has_w, expr, was_live, param_ok
    real(real64) :: param
    type(torch_tensor), pointer :: tl, tx, ty, tw
    type(c_ptr) :: before
    l = pick()
    x = pick()
    y = pick()
    w = pick()
    tl => ref(l)
    tx => ref(x)
    ty => ref(y)
    tw => ref(w)
    kind = rnd(1, 7)
    has_red = chance(60)
    red = rnd(-1, 3)
    has_w = chance(25)
    has_w = has_w .and. kind >= 5
    expr = chance(20)
    param = real(rnd(-1, 3), real64) * 0.5d0
    call begin_action("loss " // str(kind) // " " // trim(tag(l)) // " <- (" // trim(tag(x)) // ", " // trim(tag(y)) // &
      ") reduction=" // lstr(has_red) // str(red) // " weight=" // lstr(has_w) // trim(tag(w)) // " param*2=" // &
      str(nint(2 * param)) // " expression=" // lstr(expr))
    param_ok = .true.
    if (kind == 3) param_ok = param > 0
    if (kind == 4) param_ok = param >= 0
    if (kind == 5) param_ok = param >= 0 .and. param <= 1
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (live(x) .and. live(y) .and. .not. (has_w .and. (st(w) == S_STALE .or. st(w) == S_GARBAGE))) then
      expect = E_ANY
      code = 0
      if (has_red .and. (red < 0 .or. red > 2)) then
        code = FTORCH_ERR_INVALID_ARGUMENT
      else if (kind /= 5 .and. kind /= 6 .and. .not. same_shape(x, y)) then
        code = FTORCH_ERR_INVALID_ARGUMENT
      else if (.not. param_ok) then
        code = FTORCH_ERR_INVALID_ARGUMENT
      else if (kind <= 4 .and. .not. live(l) .and. mdtype(x) == mdtype(y) .and. is_float(x) &
               .and. .not. obj_inf(obj(x)) .and. .not. obj_inf(obj(y))) then
        expect = E_OK
      end if
      if (code /= 0) expect = E_FAIL
    end if
    was_live = live(l)
    before = tl%p
    ox = obj_of(x)
    oy = obj_of(y)
    if (expr) then
      call torch_catch_begin()
      call do_loss(kind, tl, tx * 1.0_real64, ty, has_red, red, has_w, tw, param)
      s2 = s
      msg2 = msg
      msg = ""
      call torch_catch_end(s, msg)
      if (expect == E_OK .and. mdtype(x) /= torch_kFloat64) expect = E_ANY
      call operator_then(x, "loss", expect, code)
      if (s2 == 0) then
        call settle(l, before, was_live)
      else
        call unchanged(l, before, "loss")
      end if
    else
      call do_loss(kind, tl, tx, ty, has_red, red, has_w, tw, param)
      call outcome("loss", expect, code)
      if (s == 0) then
        call settle(l, before, was_live)
      else
        call unchanged(l, before, "loss")
      end if
    end if
    call inherit_inference(l, ox)
    call inherit_inference(l, oy)
  end subroutine act_loss

  subroutine do_loss(kind, tl, tx, ty, has_red, red, has_w, tw, param)
    integer, intent(in) :: kind, red
    type(torch_tensor), intent(inout) :: tl
    type(torch_tensor), intent(in) :: tx, ty, tw
    logical, intent(in) :: has_red, has_w
    real(real64), intent(in) :: param
    select case (kind)
    case (1)
      if (has_red) then
        call torch_loss_mse(tl, tx, ty, red, stat=s, errmsg=msg)
      else
        call torch_loss_mse(tl, tx, ty, stat=s, errmsg=msg)
      end if
    case (2)
      if (has_red) then
        call torch_loss_l1(tl, tx, ty, red, stat=s, errmsg=msg)
      else
        call torch_loss_l1(tl, tx, ty, stat=s, errmsg=msg)
      end if
    case (3)
      if (has_red) then
        call torch_loss_huber(tl, tx, ty, red, param, stat=s, errmsg=msg)
      else
        call torch_loss_huber(tl, tx, ty, delta=param, stat=s, errmsg=msg)
      end if
    case (4)
      if (has_red) then
        call torch_loss_smooth_l1(tl, tx, ty, red, param, stat=s, errmsg=msg)
      else
        call torch_loss_smooth_l1(tl, tx, ty, beta=param, stat=s, errmsg=msg)
      end if
    case (5)
      if (has_red .and. has_w) then
        call torch_loss_cross_entropy(tl, tx, ty, red, tw, ignore_index=1, label_smoothing=param, stat=s, errmsg=msg)
      else if (has_w) then
        call torch_loss_cross_entropy(tl, tx, ty, weight=tw, label_smoothing=param, stat=s, errmsg=msg)
      else if (has_red) then
        call torch_loss_cross_entropy(tl, tx, ty, red, label_smoothing=param, stat=s, errmsg=msg)
      else
        call torch_loss_cross_entropy(tl, tx, ty, label_smoothing=param, stat=s, errmsg=msg)
      end if
    case (6)
      if (has_red .and. has_w) then
        call torch_loss_nll(tl, tx, ty, red, tw, 0, stat=s, errmsg=msg)
      else if (has_w) then
        call torch_loss_nll(tl, tx, ty, weight=tw, stat=s, errmsg=msg)
      else if (has_red) then
        call torch_loss_nll(tl, tx, ty, red, stat=s, errmsg=msg)
      else
        call torch_loss_nll(tl, tx, ty, stat=s, errmsg=msg)
      end if
    case default
      if (has_red .and. has_w) then
        call torch_loss_bce_with_logits(tl, tx, ty, red, tw, tw, stat=s, errmsg=msg)
      else if (has_w) then
        call torch_loss_bce_with_logits(tl, tx, ty, pos_weight=tw, stat=s, errmsg=msg)
      else if (has_red) then
        call torch_loss_bce_with_logits(tl, tx, ty, red, stat=s, errmsg=msg)
      else
        call torch_loss_bce_with_logits(tl, tx, ty, stat=s, errmsg=msg)
      end if
    end select
  end subroutine do_loss

  ! ------------------------------------------------------------------ models

  subroutine act_forward()
    integer :: m, nin, nout, a, b, form, expect, code, j, kind, din
    integer :: ins(3), outs(3)
    logical :: rg, has_rg, any_bad, expr_in
    type(c_ptr) :: before(3)
    logical :: c(5)
    do j = 1, 5
      c(j) = chance(50)
    end do
    m = rnd(1, NM)
    if (mst(1) == S_LIVE .and. c(1)) m = 1
    kind = mkind(m)
    nin = rnd(0, 3)
    nout = rnd(0, 3)
    if (chance(60)) nin = 1
    if (chance(60)) nout = 1
    if (mst(m) == S_LIVE .and. kind == 2 .and. c(2)) nout = 2
    if (mst(m) == S_LIVE .and. kind == 3 .and. c(3)) nin = 2
    has_rg = chance(30)
    rg = chance(50)
    form = rnd(1, 4)   ! 1: pool slices, 2: array constructors, 3: an expression input, 4: an expression output
    if (form == 1) then
      a = rnd(1, NP - nin + 1)
      b = rnd(1, NP - nout + 1)
      ins = [(a + j - 1, j = 1, 3)]
      outs = [(b + j - 1, j = 1, 3)]
    else
      do j = 1, 3
        ins(j) = pick_pool()
        outs(j) = pick_pool()
      end do
    end if
    if (form == 3 .and. nin == 0) nin = 1
    if (form == 4) nout = 1
    ! Often a valid simplenet case first (two more checked constructions).
    if (kind == 1 .and. mst(m) == S_LIVE .and. nin == 1 .and. nout == 1 .and. c(4)) then
      call begin_action("forward setup: input from_array(r64a), output zeros([5])")
      before(1) = pool(ins(1))%p
      call torch_tensor_from_array(pool(ins(1)), r64a, torch_kCPU, stat=s, errmsg=msg)
      call outcome("from_array r64a", E_OK, 0)
      call constructed(ins(1), before(1), "from_array")
      if (outs(1) /= ins(1)) then
        before(1) = pool(outs(1))%p
        call torch_tensor_zeros(pool(outs(1)), 1, [5_c_int64_t], torch_kFloat64, torch_kCPU, stat=s, errmsg=msg)
        call outcome("zeros [5]", E_OK, 0)
        call constructed(outs(1), before(1), "zeros")
      end if
    end if
    call begin_action("forward mdl(" // str(m) // "):" // STATE_LETTER(mst(m)) // " kind " // str(kind) // &
      " inputs " // tags(ins(1:nin)) // " outputs " // tags(outs(1:nout)) // " form " // str(form) // &
      " requires_grad " // lstr(has_rg) // lstr(rg))
    ! Prediction.
    any_bad = .false.
    do j = 1, nin
      if (.not. live(ins(j))) any_bad = .true.
    end do
    do j = 1, nout
      if (.not. live(outs(j))) any_bad = .true.
    end do
    expect = E_ANY
    code = 0
    din = -1
    if (nin > 0) then
      din = mdtype(ins(1))
      if (form == 3 .and. din /= torch_kFloat64 .and. din /= torch_kFloat32) din = torch_kFloat32   ! int * 1.0d0
    end if
    if (any_bad .or. mst(m) /= S_LIVE) then
      expect = E_FAIL
      code = FTORCH_ERR_NULL_HANDLE
    else if (nout == 0) then
      expect = E_FAIL
      code = FTORCH_ERR_INVALID_ARGUMENT
    else if (kind == 1 .or. kind == 4) then
      if (nin /= 1 .or. nout /= 1) then
        expect = E_FAIL
      else if (din /= merge(torch_kFloat64, torch_kFloat32, kind == 1) .or. mrank(ins(1)) == 0) then
        expect = E_FAIL
      else if (mshape(mrank(ins(1)), ins(1)) /= 5) then
        expect = E_FAIL
      else if (.not. same_shape(ins(1), outs(1))) then
        expect = E_FAIL
        if (.not. (has_rg .and. rg)) code = FTORCH_ERR_INVALID_ARGUMENT
      else if (gdepth == 0 .and. .not. mrg(outs(1)) .and. .not. obj_inf(obj(outs(1))) .and. .not. minf(m) .and. &
               .not. obj_inf(obj(ins(1))) .and. .not. (has_rg .and. rg) .and. form /= 3) then
        expect = E_OK
      end if
    else if (kind == 2) then
      if (nin /= 1 .or. nout /= 2) expect = E_FAIL
    else if (kind == 3) then
      if (nin /= 2 .or. nout /= 1) expect = E_FAIL
    end if
    if (form == 4) then
      ! The output is an expression: results written into a temporary. A bad operand fails in the
      ! operator, and forward then sees an unconstructed output.
      if (.not. any_bad .and. mst(m) == S_LIVE .and. expect == E_OK) expect = E_ANY
      call torch_catch_begin()
      select case (nin)
      case (0)
        call torch_model_forward(mdl(m), pool(1:0), [pool(outs(1)) * 1.0_real64], stat=s2, errmsg=msg2)
      case (1)
        call torch_model_forward(mdl(m), [pool(ins(1))], [pool(outs(1)) * 1.0_real64], stat=s2, errmsg=msg2)
      case (2)
        call torch_model_forward(mdl(m), [pool(ins(1)), pool(ins(2))], [pool(outs(1)) * 1.0_real64], &
                                 stat=s2, errmsg=msg2)
      case default
        call torch_model_forward(mdl(m), [pool(ins(1)), pool(ins(2)), pool(ins(3))], [pool(outs(1)) * 1.0_real64], &
                                 stat=s2, errmsg=msg2)
      end select
      call torch_catch_end(s, msg)
      call operator_then(outs(1), "torch_model_forward (expression output)", expect, code)
    else if (form == 3) then
      ! The input is the expression pool(ins(1)) * 1.0d0 (same dtype and shape): a bad operand
      ! fails in the operator, then forward sees an unconstructed input.
      expr_in = .true.
      call torch_catch_begin()
      select case (nin)
      case (1)
        call fwd_rg(mdl(m), [pool(ins(1)) * 1.0_real64], nout, outs, has_rg, rg)
      case (2)
        call fwd_rg(mdl(m), [pool(ins(1)) * 1.0_real64, pool(ins(2))], nout, outs, has_rg, rg)
      case default
        call fwd_rg(mdl(m), [pool(ins(1)) * 1.0_real64, pool(ins(2)), pool(ins(3))], nout, outs, has_rg, rg)
      end select
      s2 = s
      msg2 = msg
      msg = ""
      call torch_catch_end(s, msg)
      call operator_then(ins(1), "torch_model_forward", expect, code)
    else
      expr_in = .false.
      do j = 1, nout
        before(j) = pool(outs(j))%p
      end do
      if (form == 1) then
        if (has_rg) then
          call torch_model_forward(mdl(m), pool(ins(1):ins(1) + nin - 1), pool(outs(1):outs(1) + nout - 1), rg, &
                                   stat=s, errmsg=msg)
        else
          call torch_model_forward(mdl(m), pool(ins(1):ins(1) + nin - 1), pool(outs(1):outs(1) + nout - 1), &
                                   stat=s, errmsg=msg)
        end if
      else
        call fwd_constructors(m, nin, ins, nout, outs, has_rg, rg)
      end if
      call outcome("torch_model_forward", expect, code)
      do j = 1, nout
        if (.not. same_handle(pool(outs(j))%p, before(j))) call model_problem("forward changed an output's handle")
      end do
    end if
    do j = 1, nout
      if (live(outs(j))) call changed(obj(outs(j)))
      do a = 1, nin
        call inherit_inference(outs(j), obj_of(ins(a)))
      end do
    end do
  end subroutine act_forward

  !> Forward with the inputs and outputs in array constructors (copies of the handles).
  subroutine fwd_constructors(m, nin, ins, nout, outs, has_rg, rg)
    integer, intent(in) :: m, nin, ins(3), nout, outs(3)
    logical, intent(in) :: has_rg, rg
    select case (nin)
    case (0)
      call fwd_rg(mdl(m), pool(1:0), nout, outs, has_rg, rg)
    case (1)
      call fwd_rg(mdl(m), [pool(ins(1))], nout, outs, has_rg, rg)
    case (2)
      call fwd_rg(mdl(m), [pool(ins(1)), pool(ins(2))], nout, outs, has_rg, rg)
    case default
      call fwd_rg(mdl(m), [pool(ins(1)), pool(ins(2)), pool(ins(3))], nout, outs, has_rg, rg)
    end select
  end subroutine fwd_constructors

  subroutine fwd_rg(model, inputs, nout, outs, has_rg, rg)
    type(torch_model), intent(in) :: model
    type(torch_tensor), intent(in) :: inputs(:)
    integer, intent(in) :: nout, outs(3)
    logical, intent(in) :: has_rg, rg
    select case (nout)
    case (0)
      if (has_rg) then
        call torch_model_forward(model, inputs, pool(1:0), rg, stat=s, errmsg=msg)
      else
        call torch_model_forward(model, inputs, pool(1:0), stat=s, errmsg=msg)
      end if
    case (1)
      if (has_rg) then
        call torch_model_forward(model, inputs, [pool(outs(1))], rg, stat=s, errmsg=msg)
      else
        call torch_model_forward(model, inputs, [pool(outs(1))], stat=s, errmsg=msg)
      end if
    case (2)
      if (has_rg) then
        call torch_model_forward(model, inputs, [pool(outs(1)), pool(outs(2))], rg, stat=s, errmsg=msg)
      else
        call torch_model_forward(model, inputs, [pool(outs(1)), pool(outs(2))], stat=s, errmsg=msg)
      end if
    case default
      if (has_rg) then
        call torch_model_forward(model, inputs, [pool(outs(1)), pool(outs(2)), pool(outs(3))], rg, stat=s, errmsg=msg)
      else
        call torch_model_forward(model, inputs, [pool(outs(1)), pool(outs(2)), pool(outs(3))], stat=s, errmsg=msg)
      end if
    end select
  end subroutine fwd_rg

  subroutine act_model_load()
    integer :: m, file, dev, idx, expect, code, nfaults
    logical :: has_idx, training, rg
    character(len=32), parameter :: files(7) = [character(len=32) :: "simplenet_f64.pt", "tuple_net.pt", &
      "two_inputs.pt", "simplenet_f32.pt", "does_not_exist.pt", "corrupt.pt", ""]
    integer, parameter :: kinds(4) = [1, 2, 3, 4], devices(4) = [1, 77, 12, -3]
    type(c_ptr) :: before
    m = rnd(1, NM)
    file = rnd(1, 7)
    if (chance(50)) file = rnd(1, 4)
    dev = torch_kCPU
    if (chance(15)) dev = unavailable(devices(rnd(1, 4)))
    has_idx = chance(15)
    idx = rnd(-1, 3)
    training = chance(30)
    rg = chance(30)
    call begin_action("model_load mdl(" // str(m) // ") file=" // trim(files(file)) // " dev=" // str(dev) // " idx=" // &
      lstr(has_idx) // str(idx))
    nfaults = 0
    code = 0
    if (file >= 5) then
      nfaults = nfaults + 1
      code = FTORCH_ERR_IO
    end if
    if (dev /= torch_kCPU .or. (has_idx .and. idx > 0)) then
      nfaults = nfaults + 1
      code = FTORCH_ERR_DEVICE
    end if
    expect = E_OK
    if (nfaults > 0) expect = E_FAIL
    if (nfaults > 1) code = 0
    before = mdl(m)%p
    if (has_idx) then
      call torch_model_load(mdl(m), data_path(trim(files(file))), dev, idx, rg, training, stat=s, errmsg=msg)
    else
      call torch_model_load(mdl(m), data_path(trim(files(file))), dev, requires_grad=rg, is_training=training, &
                            stat=s, errmsg=msg)
    end if
    call outcome("torch_model_load", expect, code)
    if (s == 0) then
      call kill_handle(mst, mobj, m)
      call model_new(m, kinds(file), inference_active())
    else if (.not. same_handle(mdl(m)%p, before)) then
      call model_problem("a failed load changed the model's handle")
    end if
  end subroutine act_model_load

  subroutine act_model_handles()
    integer :: i2, j, form, expect, code
    integer(int64) :: bits
    type(c_ptr) :: before
    i2 = rnd(1, NM)
    j = rnd(1, NM)
    form = rnd(1, 4)
    call begin_action("model handles form " // str(form) // " mdl(" // str(j) // "):" // STATE_LETTER(mst(j)) // &
      " mdl(" // str(i2) // "):" // STATE_LETTER(mst(i2)))
    select case (form)
    case (1)   ! delete (maybe twice)
      call torch_delete(mdl(j))
      if (chance(50)) call torch_model_delete(mdl(j))
      if (c_associated(mdl(j)%p)) call model_problem("torch_model_delete left a non-null handle")
      call kill_handle(mst, mobj, j)
      mst(j) = S_NULL
    case (2)   ! `=`: a second handle to the same model
      before = mdl(j)%p
      expect = E_OK
      code = 0
      if (mst(i2) == S_STALE .or. mst(i2) == S_GARBAGE) then
        expect = E_FAIL
        code = FTORCH_ERR_NULL_HANDLE
      end if
      call torch_catch_begin()
      mdl(j) = mdl(i2)
      call torch_catch_end(s, msg)
      call outcome("assignment(=) of models", expect, code)
      if (s == 0 .and. .not. same_handle(mdl(j)%p, before)) then
        if (j /= i2) call kill_handle(mst, mobj, j)
        if (mst(i2) == S_LIVE) then
          call model_new(j, mkind(i2), minf(i2))
        else
          mst(j) = S_NULL
          if (c_associated(mdl(j)%p)) call model_problem("assigning an unloaded model left a handle")
        end if
      else if (s /= 0 .and. .not. same_handle(mdl(j)%p, before)) then
        call model_problem("a failed model assignment changed the handle")
      end if
    case (3)   ! raw copy of the handle
      if (j == i2) return
      call torch_delete(mdl(j))
      call kill_handle(mst, mobj, j)
      bits = transfer(mdl(i2)%p, 0_int64)
      mdl(j)%p = transfer(bits, c_null_ptr)
      mst(j) = mst(i2)
      mobj(j) = mobj(i2)
      mkind(j) = mkind(i2)
      minf(j) = minf(i2)
    case default   ! garbage
      call torch_delete(mdl(j))
      call kill_handle(mst, mobj, j)
      bits = int(rnd(1, huge(0)), int64)
      bits = ior(ishft(bits, 32), int(rnd(2**28 + 1, huge(0)), int64))
      mdl(j)%p = transfer(bits, c_null_ptr)
      mst(j) = S_GARBAGE
    end select
  end subroutine act_model_handles

  subroutine act_model_queries()
    integer :: m, q, expect, code, n, idx, k, a, b, j, count
    integer(int64) :: big
    logical :: flag
    character(len=:), allocatable :: name
    character(len=16), parameter :: names(4) = [character(len=16) :: "fc.weight", "fc.bias", "nope", "fc"]
    type(c_ptr) :: before
    type(torch_tensor), pointer :: t
    logical :: quiet
    m = rnd(1, NM)
    q = rnd(1, 9)
    k = pick()
    a = rnd(1, NP)
    b = min(NP, a + rnd(-1, 2))
    call begin_action("model query " // str(q) // " of mdl(" // str(m) // "):" // STATE_LETTER(mst(m)) // " kind " // &
      str(mkind(m)) // " into " // trim(tag(k)) // " or pool(" // str(a) // ":" // str(b) // ")")
    count = 0
    if (mkind(m) == 1 .or. mkind(m) == 4) count = 2
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (mst(m) == S_LIVE) then
      expect = E_OK
      code = 0
    end if
    select case (q)
    case (1)
      flag = mdl(m)%is_training(stat=s, errmsg=msg)
      call outcome("torch_model_is_training", expect, code)
    case (2)
      n = torch_model_parameter_count(mdl(m), stat=s, errmsg=msg)
      call outcome("torch_model_parameter_count", expect, code)
      if (s == 0 .and. n /= count) call model_problem("parameter count differs")
    case (3)
      big = torch_model_num_parameters(mdl(m), chance(50), stat=s, errmsg=msg)
      call outcome("torch_model_num_parameters", expect, code)
    case (4)
      idx = rnd(-1, 3)
      if (mst(m) == S_LIVE .and. (idx < 1 .or. idx > count)) then
        expect = E_FAIL
        code = FTORCH_ERR_INVALID_ARGUMENT
      end if
      name = torch_model_parameter_name(mdl(m), idx, stat=s, errmsg=msg)
      call outcome("torch_model_parameter_name", expect, code)
    case (5)
      if (mst(m) == S_LIVE) expect = E_ANY   ! a name that matches nothing may be an error
      if (chance(50)) then
        call torch_model_freeze(mdl(m), trim(names(rnd(1, 4))), stat=s, errmsg=msg)
      else
        call torch_model_unfreeze(mdl(m), trim(names(rnd(1, 4))), stat=s, errmsg=msg)
      end if
      call outcome("torch_model_freeze/unfreeze", expect, code)
    case (6, 7)   ! one parameter into a tensor slot, by index or by name
      t => ref(k)
      before = t%p
      if (q == 6) then
        idx = rnd(0, 3)
        if (mst(m) == S_LIVE .and. (idx < 1 .or. idx > count)) then
          expect = E_FAIL
          code = FTORCH_ERR_INVALID_ARGUMENT
        end if
        call torch_model_parameter(mdl(m), idx, t, stat=s, errmsg=msg)
      else
        idx = rnd(1, 4)
        if (mst(m) == S_LIVE .and. (idx > 2 .or. count == 0)) then
          expect = E_FAIL
          code = FTORCH_ERR_INVALID_ARGUMENT
        end if
        call torch_model_parameter(mdl(m), trim(names(idx)), t, stat=s, errmsg=msg)
      end if
      call outcome("torch_model_parameter", expect, code)
      call constructed(k, before, "torch_model_parameter")
      if (s == 0 .and. minf(m)) obj_inf(obj(k)) = .true.
    case (8)   ! all parameters into a slice of the pool
      n = b - a + 1
      if (mst(m) == S_LIVE) then
        if (n /= count .or. any(st(a:b) == S_LIVE)) then
          expect = E_FAIL
          code = FTORCH_ERR_INVALID_ARGUMENT
        end if
      end if
      call torch_model_parameters(mdl(m), pool(a:b), stat=s, errmsg=msg)
      call outcome("torch_model_parameters", expect, code)
      if (s == 0) then
        do j = a, b
          call new_live(j)
          if (minf(m)) obj_inf(obj(j)) = .true.
        end do
      end if
    case default
      quiet = chance(80)
      if (quiet .and. mst(m) == S_LIVE) return   ! printing parameters is noisy
      call torch_model_print_parameters(mdl(m), stat=s, errmsg=msg)
      call outcome("torch_model_print_parameters", expect, code)
    end select
  end subroutine act_model_queries

  ! ------------------------------------------------------------------ optimizers, schedulers

  subroutine act_optim()
    integer :: o, j, form, kind, a, b, n, expect, code
    integer(int64) :: steps
    real(real64) :: lr, value
    integer(int64) :: bits
    logical :: any_bad, any_int, expr
    type(c_ptr) :: before
    o = rnd(1, 2)
    j = 3 - o
    form = rnd(1, 12)
    call begin_action("optim form " // str(form) // " opt(" // str(o) // "):" // STATE_LETTER(ost(o)) // " opt(" // &
      str(3 - o) // "):" // STATE_LETTER(ost(3 - o)) // " sched:" // STATE_LETTER(sst(1)) // STATE_LETTER(sst(2)))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (ost(o) == S_LIVE) then
      expect = E_ANY
      code = 0
    end if
    select case (form)
    case (1, 2)   ! a new optimizer over a slice of the pool, or over an expression
      kind = rnd(1, 6)
      a = rnd(1, NP)
      b = min(NP, a + rnd(-1, 2))
      n = b - a + 1
      expr = chance(20)
      lr = 0.01d0
      if (chance(15)) lr = -1.0d0
      call begin_action("  optimizer kind " // str(kind) // " (1 SGD, 2 Adam, 3 AdamW, 4 RMSprop, 5 Adagrad, 6 LBFGS) over " // &
        tags([(j, j = a, b)]) // " expression " // lstr(expr) // " lr " // lstr(lr > 0))
      any_bad = .false.
      any_int = .false.
      do j = a, b
        if (.not. live(j)) then
          any_bad = .true.
        else if (.not. is_float(j) .or. .not. mleaf(j)) then
          any_int = .true.
        end if
      end do
      expect = E_ANY
      code = 0
      if (any_bad) then
        expect = E_FAIL
        code = FTORCH_ERR_NULL_HANDLE
      else if (n == 0 .or. any_int) then
        expect = E_FAIL
      end if
      before = opt(o)%p
      if (expr) then
        call torch_catch_begin()
        call new_optim(opt(o), kind, [pool(a) * 2.0_real64], lr)
        s2 = s
        msg2 = msg
        msg = ""
        call torch_catch_end(s, msg)
        call operator_then(a, "optimizer construction", E_ANY, 0)
        s = s2
      else
        call new_optim(opt(o), kind, pool(a:b), lr)
        call outcome("optimizer construction", expect, code)
      end if
      if (s == 0) then
        call kill_handle(ost, oobj, o)
        n_hobj = n_hobj + 1
        ost(o) = S_LIVE
        oobj(o) = n_hobj
      else if (.not. same_handle(opt(o)%p, before)) then
        call model_problem("a failed optimizer construction changed the handle")
      end if
    case (3)
      call torch_optim_step(opt(o), stat=s, errmsg=msg)
      call outcome("torch_optim_step", expect, code)
      call all_changed()
    case (4)
      if (chance(50)) then
        call opt(o)%zero_grad(stat=s, errmsg=msg)
      else
        call torch_optim_zero_grad(opt(o), chance(50), stat=s, errmsg=msg)
      end if
      call outcome("torch_optim_zero_grad", expect, code)
    case (5)
      if (expect == E_ANY) expect = E_OK
      lr = torch_optim_get_learning_rate(opt(o), stat=s, errmsg=msg)
      call outcome("torch_optim_get_learning_rate", expect, code)
      steps = torch_optim_step_count(opt(o), stat=s, errmsg=msg)
      call outcome("torch_optim_step_count", expect, code)
    case (6)
      lr = 0.001d0
      if (chance(30)) lr = -0.5d0
      call torch_optim_set_learning_rate(opt(o), lr, stat=s, errmsg=msg)
      if (lr < 0) code = 0   ! checked before or after the handle
      if (lr < 0) expect = E_FAIL
      call outcome("torch_optim_set_learning_rate", expect, code)
    case (7)
      value = real(rnd(-1, 2), real64)
      if (value < 0) code = 0
      if (value < 0) expect = E_FAIL
      if (chance(50)) then
        call torch_optim_clip_grad_norm(opt(o), value, total_norm=lr, stat=s, errmsg=msg)
        call outcome("torch_optim_clip_grad_norm", expect, code)
      else
        call torch_optim_clip_grad_value(opt(o), value, stat=s, errmsg=msg)
        call outcome("torch_optim_clip_grad_value", expect, code)
      end if
      call all_changed()
    case (8)   ! delete, share, raw copy
      j = 3 - o
      select case (rnd(1, 3))
      case (1)
        call torch_delete(opt(o))
        if (chance(50)) call torch_optim_delete(opt(o))
        call kill_handle(ost, oobj, o)
        ost(o) = S_NULL
      case (2)
        before = opt(j)%p
        expect = E_OK
        code = 0
        if (ost(o) == S_STALE .or. ost(o) == S_GARBAGE) then
          expect = E_FAIL
          code = FTORCH_ERR_NULL_HANDLE
        end if
        call torch_catch_begin()
        opt(j) = opt(o)
        call torch_catch_end(s, msg)
        call outcome("assignment(=) of optimizers", expect, code)
        if (s == 0 .and. .not. same_handle(opt(j)%p, before)) then
          call kill_handle(ost, oobj, j)
          if (ost(o) == S_LIVE) then
            n_hobj = n_hobj + 1
            ost(j) = S_LIVE
            oobj(j) = n_hobj
          else
            ost(j) = S_NULL
          end if
        end if
      case default
        call torch_delete(opt(j))
        call kill_handle(ost, oobj, j)
        ost(j) = S_NULL
        bits = transfer(opt(o)%p, 0_int64)
        opt(j)%p = transfer(bits, c_null_ptr)
        ost(j) = ost(o)
        oobj(j) = oobj(o)
      end select
    case (9, 10)   ! a scheduler on opt(o)
      j = rnd(1, 2)
      before = sch(j)%p
      select case (rnd(1, 4))
      case (1); call torch_scheduler_step_lr(sch(j), opt(o), rnd(-1, 3), stat=s, errmsg=msg)
      case (2); call torch_scheduler_exponential_lr(sch(j), opt(o), 0.9d0, stat=s, errmsg=msg)
      case (3); call torch_scheduler_cosine_annealing_lr(sch(j), opt(o), rnd(0, 5), stat=s, errmsg=msg)
      case default
        call torch_scheduler_reduce_on_plateau(sch(j), opt(o), mode=merge("min ", "nope", chance(70)), &
                                               stat=s, errmsg=msg)
        code = 0   ! a bad mode is found before the optimizer is looked at
      end select
      call outcome("scheduler construction", expect, code)
      if (s == 0) then
        call kill_handle(sst, sobj, j)
        n_hobj = n_hobj + 1
        sst(j) = S_LIVE
        sobj(j) = n_hobj
      else if (.not. same_handle(sch(j)%p, before)) then
        call model_problem("a failed scheduler construction changed the handle")
      end if
    case default   ! scheduler step, last lr, delete
      j = rnd(1, 2)
      expect = E_FAIL
      code = FTORCH_ERR_NULL_HANDLE
      if (sst(j) == S_LIVE) then
        expect = E_ANY
        code = 0
      end if
      select case (rnd(1, 4))
      case (1)
        call sch(j)%step(stat=s, errmsg=msg)
        call outcome("torch_scheduler_step", expect, code)
      case (2)
        call torch_scheduler_step(sch(j), 0.5d0, stat=s, errmsg=msg)
        call outcome("torch_scheduler_step with a metric", expect, code)
      case (3)
        lr = torch_scheduler_get_last_lr(sch(j), stat=s, errmsg=msg)
        call outcome("torch_scheduler_get_last_lr", expect, code)
      case default
        call torch_delete(sch(j))
        call kill_handle(sst, sobj, j)
        sst(j) = S_NULL
      end select
    end select
  end subroutine act_optim

  subroutine new_optim(o, kind, params, lr)
    type(torch_optim), intent(inout) :: o
    integer, intent(in) :: kind
    type(torch_tensor), intent(in) :: params(:)
    real(real64), intent(in) :: lr
    select case (kind)
    case (1); call torch_optim_SGD(o, params, learning_rate=lr, momentum=0.9d0, stat=s, errmsg=msg)
    case (2); call torch_optim_Adam(o, params, learning_rate=lr, stat=s, errmsg=msg)
    case (3); call torch_optim_AdamW(o, params, learning_rate=lr, amsgrad=.true., stat=s, errmsg=msg)
    case (4); call torch_optim_RMSprop(o, params, learning_rate=lr, stat=s, errmsg=msg)
    case (5); call torch_optim_Adagrad(o, params, learning_rate=lr, stat=s, errmsg=msg)
    case default; call torch_optim_LBFGS(o, params, learning_rate=lr, stat=s, errmsg=msg)
    end select
  end subroutine new_optim

  !> Optimizer steps write into the parameters: refresh every live slot.
  subroutine all_changed()
    integer :: j
    do j = 1, NP + 1
      if (st(j) == S_LIVE) call refresh(j)
    end do
  end subroutine all_changed

  !> torch_optim_step_closure with closures that misbehave: no loss, a loss of several elements,
  !> deleting the optimizer being stepped, stepping it again from inside its step.
  subroutine act_step_closure()
    integer :: o, k, mode, expect, code
    real(real64) :: value
    o = rnd(1, 2)
    k = pick()
    mode = rnd(1, 5)
    call begin_action("step_closure opt(" // str(o) // "):" // STATE_LETTER(ost(o)) // " closure mode " // str(mode) // &
      " on " // trim(tag(k)) // " " // shape_text(k))
    expect = E_FAIL
    code = FTORCH_ERR_NULL_HANDLE
    if (ost(o) == S_LIVE) then
      expect = E_ANY
      code = 0
      if (mode == 2 .or. .not. live(k)) then
        code = FTORCH_ERR_INVALID_ARGUMENT   ! no loss tensor
      else if (mode == 3) then
        if (numel(k) /= 1) code = FTORCH_ERR_INVALID_ARGUMENT
      end if
      if (code /= 0) expect = E_FAIL
    end if
    call closure_reset()
    closure_mode = mode
    closure_tensor => ref(k)
    closure_optim_copy%p = opt(o)%p
    call torch_optim_step_closure(opt(o), closure_loss, value, stat=s, errmsg=msg)
    call outcome("torch_optim_step_closure", expect, code)
    if (mode == 4 .and. closure_calls > 0) then
      ! The closure deleted the optimizer: its variable now holds a stale handle.
      call kill_handle(ost, oobj, o)
    end if
    call closure_reset()
    nullify(closure_tensor)
    call all_changed()
  end subroutine act_step_closure

  !> torch_train_step with bad objects, expressions as inputs and target, an unconstructed
  !> scheduler, invalid loss kinds and reductions.
  subroutine act_train_step()
    integer :: m, o, j, a, n, tgt, variant, lt, red, expect, code, i2
    logical :: has_sched, has_lt, has_red, any_bad, c60
    m = rnd(1, NM)
    o = rnd(1, 2)
    j = rnd(1, 2)
    c60 = chance(60)
    n = rnd(0, 2)
    if (c60) n = 1
    variant = rnd(1, 2)   ! 1: named tensors, 2: expressions
    if (variant == 2) n = 1
    a = rnd(1, NP - max(n, 1) + 1)
    tgt = pick_pool()
    has_sched = chance(40)
    has_lt = chance(50)
    lt = rnd(0, 7)
    has_red = chance(50)
    red = rnd(0, 2)
    call begin_action("train_step mdl(" // str(m) // "):" // STATE_LETTER(mst(m)) // " opt(" // str(o) // "):" // &
      STATE_LETTER(ost(o)) // " inputs " // tags([(i2, i2 = a, a + n - 1)]) // " target " // trim(tag(tgt)) // &
      " expressions " // lstr(variant == 2) // " scheduler " // lstr(has_sched) // STATE_LETTER(sst(j)) // &
      " loss_type " // lstr(has_lt) // str(lt) // " reduction " // lstr(has_red) // str(red))
    any_bad = .not. live(tgt) .or. mst(m) /= S_LIVE .or. ost(o) /= S_LIVE
    if (has_sched) any_bad = any_bad .or. sst(j) /= S_LIVE
    do i2 = a, a + n - 1
      if (.not. live(i2)) any_bad = .true.
    end do
    expect = E_ANY
    code = 0
    if (any_bad) then
      expect = E_FAIL
      code = FTORCH_ERR_NULL_HANDLE
    else if (has_red .and. red == 0) then
      expect = E_FAIL
      code = FTORCH_ERR_INVALID_ARGUMENT
    end if
    if (variant == 1) then
      if (has_sched) then
        call do_train(m, o, pool(a:a + n - 1), pool(tgt), has_lt, lt, has_red, red, sch(j))
      else
        call do_train(m, o, pool(a:a + n - 1), pool(tgt), has_lt, lt, has_red, red)
      end if
      call outcome("torch_train_step", expect, code)
    else
      ! Expressions as inputs and target (a bad operand makes an unconstructed tensor: same status).
      call torch_catch_begin()
      if (has_sched) then
        call do_train(m, o, [pool(a) * 1.0_real64], pool(tgt) * 1.0_real64, has_lt, lt, has_red, red, sch(j))
      else
        call do_train(m, o, [pool(a) * 1.0_real64], pool(tgt) * 1.0_real64, has_lt, lt, has_red, red)
      end if
      s2 = s
      msg2 = msg
      msg = ""
      call torch_catch_end(s, msg)
      call outcome("operators in a catch scope", E_ANY, 0)
      call judge("torch_train_step of expressions", expect, code, s2, msg2)
    end if
    call all_changed()
  end subroutine act_train_step

  subroutine do_train(m, o, inputs, target, has_lt, lt, has_red, red, scheduler)
    integer, intent(in) :: m, o, lt, red
    type(torch_tensor), intent(in) :: inputs(:), target
    logical, intent(in) :: has_lt, has_red
    type(torch_scheduler), intent(in), optional :: scheduler
    real(real64) :: value
    if (has_lt .and. has_red) then
      call torch_train_step(mdl(m), opt(o), inputs, target, value, lt, red, scheduler, stat=s, errmsg=msg)
    else if (has_lt) then
      call torch_train_step(mdl(m), opt(o), inputs, target, value, lt, scheduler=scheduler, stat=s, errmsg=msg)
    else if (has_red) then
      call torch_train_step(mdl(m), opt(o), inputs, target, value, reduction_type=red, scheduler=scheduler, &
                            stat=s, errmsg=msg)
    else
      call torch_train_step(mdl(m), opt(o), inputs, target, value, scheduler=scheduler, stat=s, errmsg=msg)
    end if
  end subroutine do_train

  !> Checkpoints: saving to an unwritable path and loading a missing or corrupt file must fail
  !> (with a bad object, for that reason first). Nothing is ever written.
  subroutine act_checkpoint()
    integer :: m, o, j, form, expect, code, step
    logical :: with_m, with_o, with_s, any_bad, any_null
    m = rnd(1, NM)
    o = rnd(1, 2)
    j = rnd(1, 2)
    form = rnd(1, 3)
    with_m = chance(60)
    with_o = chance(50)
    with_s = chance(30)
    ! The combinations do_checkpoint passes: (model, optim, scheduler), (model, optim), (model),
    ! (optim, scheduler) or nothing.
    if (with_m) then
      if (.not. with_o) with_s = .false.
    else
      with_s = with_o
    end if
    call begin_action("checkpoint form " // str(form) // " model " // lstr(with_m) // STATE_LETTER(mst(m)) // &
      " optim " // lstr(with_o) // STATE_LETTER(ost(o)) // " scheduler " // lstr(with_s) // STATE_LETTER(sst(j)))
    any_null = (with_m .and. mst(m) == S_NULL) .or. (with_o .and. ost(o) == S_NULL) .or. (with_s .and. sst(j) == S_NULL)
    any_bad = (with_m .and. mst(m) /= S_LIVE) .or. (with_o .and. ost(o) /= S_LIVE) .or. (with_s .and. sst(j) /= S_LIVE)
    ! An unconstructed object is refused before anything else; a stale one may be found before or
    ! after the file is tried.
    expect = E_FAIL
    code = FTORCH_ERR_IO
    if (any_bad) code = 0
    if (any_null) code = FTORCH_ERR_NULL_HANDLE
    select case (form)
    case (1)
      call do_checkpoint(.true., "/nonexistent-dir/fuzz.ckpt", with_m, m, with_o, o, with_s, j, step)
    case (2)
      call do_checkpoint(.false., data_path("does_not_exist.ckpt"), with_m, m, with_o, o, with_s, j, step)
    case default
      call do_checkpoint(.false., data_path("corrupt.pt"), with_m, m, with_o, o, with_s, j, step)
    end select
    call outcome("torch_checkpoint_save/load", expect, code)
  end subroutine act_checkpoint

  subroutine do_checkpoint(save, file, with_m, m, with_o, o, with_s, j, step)
    logical, intent(in) :: save, with_m, with_o, with_s
    character(len=*), intent(in) :: file
    integer, intent(in) :: m, o, j
    integer, intent(out) :: step
    step = 0
    if (save) then
      if (with_m .and. with_o .and. with_s) then
        call torch_checkpoint_save(file, mdl(m), opt(o), sch(j), 7, stat=s, errmsg=msg)
      else if (with_m .and. with_o) then
        call torch_checkpoint_save(file, mdl(m), opt(o), stat=s, errmsg=msg)
      else if (with_m) then
        call torch_checkpoint_save(file, mdl(m), stat=s, errmsg=msg)
      else if (with_o) then
        call torch_checkpoint_save(file, optim=opt(o), scheduler=sch(j), stat=s, errmsg=msg)
      else
        call torch_checkpoint_save(file, stat=s, errmsg=msg)
      end if
    else
      if (with_m .and. with_o .and. with_s) then
        call torch_checkpoint_load(file, mdl(m), opt(o), sch(j), step, stat=s, errmsg=msg)
      else if (with_m .and. with_o) then
        call torch_checkpoint_load(file, mdl(m), opt(o), stat=s, errmsg=msg)
      else if (with_m) then
        call torch_checkpoint_load(file, mdl(m), stat=s, errmsg=msg)
      else if (with_o) then
        call torch_checkpoint_load(file, optim=opt(o), scheduler=sch(j), step=step, stat=s, errmsg=msg)
      else
        call torch_checkpoint_load(file, stat=s, errmsg=msg)
      end if
    end if
  end subroutine do_checkpoint

  ! ------------------------------------------------------------------ catch scopes, runtime

  subroutine act_catch()
    integer :: form, k, j, r
    type(torch_tensor), pointer :: t, tj
    type(c_ptr) :: before
    form = rnd(1, 4)
    k = pick()
    j = pick()
    t => ref(k)
    tj => ref(j)
    call begin_action("catch scopes form " // str(form) // " " // trim(tag(k)) // " " // trim(tag(j)))
    select case (form)
    case (1)   ! ending a scope that was never begun
      call torch_catch_end(s, msg)
      call outcome("torch_catch_end without a scope", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT)
    case (2)   ! nested scopes: the inner one keeps the failure
      call torch_catch_begin()
      call torch_catch_begin()
      r = t%get_rank()
      call torch_catch_end(s, msg)
      if (live(k)) then
        call outcome("inner catch scope", E_OK, 0)
      else
        call outcome("inner catch scope", E_FAIL, FTORCH_ERR_NULL_HANDLE)
      end if
      msg = ""
      call torch_catch_end(s, msg)
      call outcome("outer catch scope", E_OK, 0)
    case (3)   ! subroutines without stat inside a scope: the first failure is kept
      before = t%p
      call torch_catch_begin()
      call torch_tensor_zeros(t, 2, [3_c_int64_t], torch_kFloat64, torch_kCPU)
      call torch_tensor_zero(tj)
      call torch_tensor_ones(t, 1, [2_c_int64_t], 99, torch_kCPU)
      call torch_catch_end(s, msg)
      call outcome("failures of subroutines called without stat", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT)
      call unchanged(k, before, "construction inside a catch scope")
      if (live(j)) call changed(obj(j))
    case default   ! a chain of operators, any of which may fail
      before = t%p
      call torch_catch_begin()
      r = torch_tensor_get_rank(torch_sum((t + tj) * torch_exp(tj), dim=rnd(-2, 3)))
      call torch_catch_end(s, msg)
      if (.not. live(k) .or. .not. live(j)) then
        call outcome("a chain of operators on a bad operand", E_FAIL, 0)
      else
        call outcome("a chain of operators", E_ANY, 0)
      end if
    end select
  end subroutine act_catch

  !> The device types drawn as wrong ones must fail: on a machine with a GPU, CUDA becomes type 77
  !> (never available, also FTORCH_ERR_DEVICE). No random number is drawn, so a seed replays the
  !> same calls with and without a GPU.
  integer function unavailable(dev)
    integer, intent(in) :: dev
    unavailable = dev
    if (dev == torch_kCUDA) then
      if (torch_device_available(torch_kCUDA)) unavailable = 77
    end if
  end function unavailable

  subroutine act_runtime()
    character(len=:), allocatable :: v
    call begin_action("runtime queries")
    if (torch_device_available(torch_kCUDA) .neqv. torch_device_available(torch_kCUDA, 0)) &
      call model_problem("torch_device_available(CUDA) depends on the default index")
    if (torch_device_available(77)) call model_problem("device type 77 is available")
    if (torch_device_available(torch_kCPU, 3)) call model_problem("CPU device index 3 is available")
    if (.not. torch_device_available(torch_kCPU)) call model_problem("the CPU is not available")
    call ftorch_check_runtime(stat=s, errmsg=msg)
    call outcome("ftorch_check_runtime", E_OK, 0)
    v = ftorch_version()
    if (len(v) == 0) call model_problem("empty ftorch_version()")
  end subroutine act_runtime

  ! ============================================================== sweep and teardown

  !> Every variable must be in the state the model says.
  subroutine sweep()
    integer :: k, r, q
    logical :: flag
    real(real64) :: lr
    type(torch_tensor), pointer :: t
    character(len=80) :: note
    do k = 1, n_slots()
      t => ref(k)
      q = 0
      r = t%get_rank(stat=q)
      select case (st(k))
      case (S_LIVE)
        if (q /= 0) then
          write(note, '(a,a,a)') "sweep: ", trim(tag(k)), " modeled live is not"
          call model_problem(trim(note))
        else if (r /= mrank(k)) then
          write(note, '(a,a,a)') "sweep: ", trim(tag(k)), " changed rank"
          call model_problem(trim(note))
        end if
      case default
        if (q /= FTORCH_ERR_NULL_HANDLE) then
          write(note, '(a,a,a,i0)') "sweep: ", trim(tag(k)), " is not a bad handle: stat ", q
          call model_problem(trim(note))
        end if
        if (st(k) == S_NULL .and. c_associated(t%p)) call model_problem("sweep: an unconstructed tensor has a handle")
      end select
    end do
    do k = 1, NM
      flag = mdl(k)%is_training(stat=q)
      if ((mst(k) == S_LIVE) .neqv. (q == 0)) call model_problem("sweep: a model is not in its modeled state")
    end do
    do k = 1, 2
      lr = torch_optim_get_learning_rate(opt(k), stat=q)
      if ((ost(k) == S_LIVE) .neqv. (q == 0)) call model_problem("sweep: an optimizer is not in its modeled state")
      lr = torch_scheduler_get_last_lr(sch(k), stat=q)
      if ((sst(k) == S_LIVE) .neqv. (q == 0)) call model_problem("sweep: a scheduler is not in its modeled state")
    end do
  end subroutine sweep

  subroutine teardown()
    integer(int64) :: now
    action = n_actions + 1
    call begin_action("teardown")
    do while (gdepth > 0)
      select case (gstack(gdepth))
      case (G_NO_GRAD); call torch_no_grad_end(stat=s, errmsg=msg)
      case (G_ENABLE); call torch_enable_grad_end(stat=s, errmsg=msg)
      case default; call torch_inference_mode_end(stat=s, errmsg=msg)
      end select
      call outcome("closing a grad scope", E_OK, 0)
      gdepth = gdepth - 1
    end do
    call torch_catch_end(s, msg)
    call outcome("no catch scope is left open", E_FAIL, FTORCH_ERR_INVALID_ARGUMENT)
    call torch_delete(pool)
    call torch_delete(pool)
    if (allocated(held)) then
      call torch_delete(held)
      deallocate(held)
    end if
    call torch_delete(sch)
    call torch_delete(opt)
    call torch_delete(mdl)
    st = S_NULL
    mst = S_NULL
    ost = S_NULL
    sst = S_NULL
    now = ftorch_live_handles()
    write(output_unit, '(a,i0,a,i0)') "live handles at the start: ", base, ", after deleting everything: ", now
    call check(now == base, "the live-handle count is back to its baseline after deleting everything")
  end subroutine teardown

end program test_fuzz
