!> What FTorch does with threads, run by tests/test_threads.py with OMP_NUM_THREADS=4.
!> Usage: test_threads <data dir>
!>
!> Allowed, and checked here:
!>  a. each thread loading and training its OWN model, optimizer and tensors, concurrently: the
!>     result is bit-identical to running the same trainings one after the other;
!>  b. several threads running forward (no grad) on ONE shared model, each with its own input and
!>     output tensors;
!>  c. grad-mode scopes belong to the thread that opens them;
!>  d. the last error, stat/errmsg and catch scopes belong to the calling thread;
!>  e. a handle created on one thread and deleted on another: the live-handle count stays exact;
!>  f. threads registering gradient hooks (their own procedures, new to FTorch) at the same time;
!>  g. threads loading a compiled .pt2 package (optional argument 2) and running their first
!>     forward at the same time: each briefly sends standard error to a file, and standard error
!>     is the program's own again afterwards (tests/test_threads.py looks for the line printed then).
!> Not allowed: using one tensor, optimizer or model from several threads at once where one of
!> them writes to it (training a shared model, backward through shared parameters, assigning to
!> a shared tensor): LibTorch does not lock tensors.
!>
!> Reproducibility: LibTorch's CPU parallelism is OpenMP, and it binds to the program's OpenMP
!> runtime (gfortran's libgomp, flang's libomp). Inside an active parallel region it runs each
!> operation on the calling thread; outside one it splits large operations (above its grain
!> size of 32768 elements) over omp_get_max_threads() threads, which changes the rounding of
!> reductions (a 4-million-element sum on the main thread differs in the last bits from the
!> same sum inside a region unless OMP_NUM_THREADS=1). The tensors here are far below the grain
!> size, so the serial reference runs on the main thread follow the same order of operations;
!> with large tensors, compare runs made in the same setting if bitwise equality matters.
! Per-thread state of the LBFGS closures (each thread steps its own model).
module lbfgs_state
  use ftorch
  implicit none
  type(torch_model), save :: lmodel
  type(torch_tensor), save :: lx, ly
  real(8), target, save :: lxv(16, 4), lyv(16, 2), lpred(16, 2)
  !$omp threadprivate(lmodel, lx, ly, lxv, lyv, lpred)
contains
  subroutine lbfgs_closure(loss)
    type(torch_tensor), intent(inout) :: loss
    type(torch_tensor) :: out(1)
    call torch_tensor_from_array(out(1), lpred, torch_kCPU)
    call torch_model_forward(lmodel, [lx], out, requires_grad=.true.)
    call torch_loss_mse(loss, out(1), ly)
    call torch_delete(out)
  end subroutine lbfgs_closure
end module lbfgs_state

! Gradient hooks registered by several threads at once (f. below).
module thread_hooks
  use ftorch
  implicit none
contains
  subroutine scale_by_1(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 1.0d0
  end subroutine scale_by_1
  subroutine scale_by_2(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 2.0d0
  end subroutine scale_by_2
  subroutine scale_by_3(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 3.0d0
  end subroutine scale_by_3
  subroutine scale_by_4(grad, new_grad, stat, errmsg)
    type(torch_tensor), intent(in) :: grad
    type(torch_tensor), intent(inout) :: new_grad
    integer, intent(inout) :: stat
    character(len=*), intent(inout) :: errmsg
    new_grad = grad * 4.0d0
  end subroutine scale_by_4
end module thread_hooks

program test_threads
  use, intrinsic :: iso_fortran_env, only: real32, real64, error_unit, output_unit
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use omp_lib, only: omp_get_thread_num, omp_get_num_threads
  use ftorch
  use ftorch_errors, only: ftorch_check
  use testing, only: check, summary, data_path
  use lbfgs_state, only: lmodel, lx, ly, lxv, lyv, lbfgs_closure
  use thread_hooks, only: scale_by_1, scale_by_2, scale_by_3, scale_by_4
  implicit none

  integer, parameter :: NT = 4          ! threads of the concurrent sections
  integer, parameter :: NSTEPS = 20     ! training steps per thread
  integer, parameter :: NPARAM = 58     ! parameter elements of train_mlp.pt: 4*8 + 8 + 8*2 + 2
  integer, parameter :: NFWD = 200      ! forward calls per thread on the shared model

  character(len=:), allocatable :: mlp_file, missing_file
  integer(c_int64_t) :: live_start

  mlp_file = data_path("train_mlp.pt")
  missing_file = data_path("no_such_model_for_threads.pt")
  live_start = ftorch_live_handles()

  call concurrent_training()
  call concurrent_lbfgs()
  call shared_model_inference()
  call grad_mode_scopes_per_thread()
  call errors_per_thread()
  call errmsg_path_under_contention()
  call handles_across_threads()
  call concurrent_checkpoints()
  call concurrent_hook_registration()
  call steps_made_on_a_worker()
  call compiled_loads_across_threads()
  call package_shared_by_threads()
  call check(ftorch_live_handles() == live_start, &
             "after every thread deleted its objects the live-handle count is back to its starting value")
  call data_sharing_clauses()  ! last: it leaves tensors alive on purpose
  call summary()

contains

  ! h. OpenMP data-sharing clauses on tensors, as the guide (threads.md) describes them with every
  ! compiler: firstprivate copies are bitwise copies of the handle made by the compiler (no `=`):
  ! the threads share the one tensor; private copies are never finalized (their tensors stay alive
  ! unless deleted in the region).
  subroutine data_sharing_clauses()
    type(torch_tensor) :: t, u
    real(real64), target :: a(2)
    integer(c_int64_t) :: before, original
    logical :: same_handle(NT)
    integer :: n, stat
    a = 1
    call torch_tensor_from_array(t, a, torch_kCPU)
    original = transfer(t%p, 0_c_int64_t)
    same_handle = .false.
    n = 0
    before = ftorch_live_handles()
    !$omp parallel num_threads(NT) firstprivate(t) shared(same_handle, n)
    same_handle(omp_get_thread_num() + 1) = transfer(t%p, 0_c_int64_t) == original
    !$omp atomic
    n = n + 1
    !$omp end parallel
    call check(n == NT .and. all(same_handle) .and. ftorch_live_handles() == before, &
               "firstprivate(t): every thread gets a bitwise copy of the handle (one shared tensor)")
    call check(torch_tensor_get_rank(t, stat=stat) == 1 .and. stat == 0, "... and the original stays usable")
    before = ftorch_live_handles()
    !$omp parallel num_threads(NT) private(u)
    call torch_tensor_zeros(u, 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
    call torch_delete(u)
    !$omp end parallel
    call check(ftorch_live_handles() == before, "private(u) deleted in the region: nothing left alive")
    !$omp parallel num_threads(NT) private(u)
    call torch_tensor_zeros(u, 1, [2_c_int64_t], torch_kFloat64, torch_kCPU)
    !$omp end parallel
    call check(ftorch_live_handles() == before + NT, &
               "private(u) not deleted: each thread’s tensor stays alive (private copies are never finalized)")
    call torch_delete(t)
  end subroutine data_sharing_clauses

  ! g. A worker thread makes a tensor at each of 150 steps (after its optimizer step) and the main
  ! thread deletes it after the step: the worker's own count grows from step to step, the count of
  ! all threads does not, so the step-growth leak warning must stay quiet (tests/test_threads.py
  ! reads standard error).
  subroutine steps_made_on_a_worker()
    type(torch_tensor) :: w, made
    type(torch_optim) :: opt
    real(real64), target :: wv(2)
    integer(c_int64_t) :: before
    integer :: step
    wv = 1
    call torch_tensor_from_array(w, wv, torch_kCPU, requires_grad=.true.)
    call torch_optim_SGD(opt, [w], learning_rate=0.1d0)
    before = ftorch_live_handles()
    do step = 1, 150
      !$omp parallel num_threads(2) default(shared)
      if (omp_get_thread_num() == 1) then
        call torch_optim_step(opt)
        made = w * 2d0
      end if
      !$omp end parallel
      call torch_delete(made)
    end do
    call check(ftorch_live_handles() == before, "tensors made on a worker and deleted on the main thread: none left")
    call torch_delete(opt)
    call torch_delete(w)
  end subroutine steps_made_on_a_worker

  ! f. NT threads register gradient hooks on their own tensors at the same time, each cycling
  ! through four procedures that FTorch has not seen before: the registry of user procedures is
  ! changed from several threads at once, and every backward must run the hook just registered.
  subroutine concurrent_hook_registration()
    logical :: ok(0:NT-1)
    integer :: id, before
    before = ftorch_callbacks_registered()
    ok = .false.
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    call hook_worker(id, ok(id))
    !$omp end parallel
    call check(all(ok), "threads registering gradient hooks at the same time each get their own hook's gradient")
    call check(ftorch_callbacks_registered() == before + 4, &
               "the registry holds each of the four hook procedures once, whatever the interleaving")
  end subroutine concurrent_hook_registration

  subroutine hook_worker(id, ok)
    integer, intent(in) :: id
    logical, intent(out) :: ok
    real(real64), target :: x(3)
    real(real64) :: g(3)
    type(torch_tensor) :: tx, tg
    integer(c_int64_t) :: hook_id
    integer :: i, k
    x = [1.0_real64, 2.0_real64, 3.0_real64] * (id + 1)
    call torch_tensor_from_array(tx, x, torch_kCPU, requires_grad=.true.)
    ok = .true.
    do i = 1, 100
      k = mod(id + i, 4) + 1
      select case (k)
      case (1)
        call torch_tensor_register_hook(tx, scale_by_1, hook_id)
      case (2)
        call torch_tensor_register_hook(tx, scale_by_2, hook_id)
      case (3)
        call torch_tensor_register_hook(tx, scale_by_3, hook_id)
      case default
        call torch_tensor_register_hook(tx, scale_by_4, hook_id)
      end select
      call torch_tensor_backward(torch_sum(tx * tx))
      call torch_tensor_get_gradient(tg, tx)
      call torch_tensor_to_array(tg, g)
      ok = ok .and. all(g == 2.0_real64 * k * x)  ! exact: small integers times the values
      call torch_delete(tg)
      call tx%zero_grad()
      call torch_tensor_remove_hook(tx, hook_id)
    end do
    call torch_delete(tx)
  end subroutine hook_worker

  ! Deterministic training data of thread `id` (different for every id).
  subroutine thread_data(id, x, y)
    integer, intent(in) :: id
    real(real64), intent(out) :: x(16, 4), y(16, 2)
    integer :: i, j
    do j = 1, 4
      do i = 1, 16
        x(i, j) = sin(0.31d0 * i + 0.73d0 * j + 1.3d0 * id)
      end do
    end do
    y(:, 1) = sin(2 * x(:, 1)) + x(:, 2) * x(:, 3)
    y(:, 2) = cos(x(:, 4)) - x(:, 1) + 0.1d0 * id
  end subroutine thread_data

  ! Load a fresh copy of train_mlp.pt and train it for NSTEPS steps on the data of thread `id`:
  ! even ids with torch_train_step and Adam, odd ids with the building-block loop (forward with
  ! requires_grad, MSE loss, backward, step) and SGD with momentum. With `lockstep` (inside a
  ! parallel region) the team synchronises after loading and after every step, so that all the
  ! threads really are inside LibTorch at the same time.
  subroutine train_one(id, lockstep, losses, flat)
    integer, intent(in) :: id
    logical, intent(in) :: lockstep
    real(real64), intent(out) :: losses(NSTEPS), flat(NPARAM)
    real(real64), target :: x(16, 4), y(16, 2), pred(16, 2), loss_value(1)
    real(real64), allocatable :: values(:)
    type(torch_model) :: model
    type(torch_optim) :: optim
    type(torch_tensor) :: tx, ty, out(1), tloss, reshaped
    type(torch_tensor), allocatable :: params(:)
    integer :: step, i, n, k

    call thread_data(id, x, y)
    call torch_model_load(model, mlp_file, torch_kCPU, is_training=.true.)
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
    call torch_tensor_from_array(tx, x, torch_kCPU)
    call torch_tensor_from_array(ty, y, torch_kCPU)
    if (mod(id, 2) == 0) then
      call torch_optim_Adam(optim, params, learning_rate=0.01d0)
    else
      call torch_optim_SGD(optim, params, learning_rate=0.05d0, momentum=0.9d0)
    end if
    if (lockstep) then
      !$omp barrier
    end if
    do step = 1, NSTEPS
      if (mod(id, 2) == 0) then
        call torch_train_step(model, optim, [tx], ty, losses(step))
      else
        call optim%zero_grad()
        call torch_tensor_from_array(out(1), pred, torch_kCPU)
        call torch_model_forward(model, [tx], out, requires_grad=.true.)
        call torch_tensor_from_array(tloss, loss_value, torch_kCPU)
        call torch_loss_mse(tloss, out(1), ty)
        call torch_tensor_backward(tloss)
        losses(step) = loss_value(1)
        call optim%step()
        call torch_delete(out)
        call torch_delete(tloss)
      end if
      if (lockstep) then
        !$omp barrier
      end if
    end do

    k = 0
    do i = 1, size(params)
      n = int(product(params(i)%get_shape()))
      if (allocated(values)) deallocate(values)
      allocate(values(n))
      reshaped = torch_reshape(params(i), [n])
      call torch_tensor_to_array(reshaped, values)
      call torch_delete(reshaped)
      if (k + n <= NPARAM) flat(k + 1:k + n) = values
      k = k + n
    end do
    if (k /= NPARAM) flat = -huge(1.0d0)   ! a different model: fails the comparisons below
    call torch_delete(params)
    call torch_delete(optim)
    call torch_delete(tx)
    call torch_delete(ty)
    call torch_delete(model)
  end subroutine train_one

  ! a. NT threads each train their own model at the same time; then the same trainings run one
  ! after the other on the main thread. Everything must agree to the last bit.
  subroutine concurrent_training()
    real(real64) :: losses_par(NSTEPS, 0:NT - 1), flat_par(NPARAM, 0:NT - 1)
    real(real64) :: losses_ser(NSTEPS, 0:NT - 1), flat_ser(NPARAM, 0:NT - 1)
    integer :: team, id, other
    logical :: distinct

    team = 0
    losses_par = 0
    flat_par = 0
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    !$omp single
    team = omp_get_num_threads()
    !$omp end single
    call train_one(id, .true., losses_par(:, id), flat_par(:, id))
    !$omp end parallel
    call check(team == NT, "the concurrent sections run with the requested number of threads")

    do id = 0, NT - 1
      call train_one(id, .false., losses_ser(:, id), flat_ser(:, id))
    end do

    call check(all(losses_ser(NSTEPS, :) < 0.5d0 * losses_ser(1, :)), &
               "every serial training run reduces its loss (the runs compared below do train)")
    distinct = .true.
    do id = 0, NT - 1
      do other = id + 1, NT - 1
        if (all(flat_ser(:, id) == flat_ser(:, other))) distinct = .false.
      end do
    end do
    call check(distinct, "threads trained on different data end with different parameters")
    call check(all(losses_par == losses_ser), &
               "concurrent per-thread trainings give bit-identical losses to the same trainings run serially")
    call check(all(flat_par == flat_ser), &
               "concurrent per-thread trainings give bit-identical final parameters to the serial runs")
  end subroutine concurrent_training

  ! LBFGS steps (which call back into a Fortran closure) on NT threads at once, each on its own
  ! model: the same losses as the same runs made one after the other.
  subroutine lbfgs_one(id, lockstep, losses)
    integer, intent(in) :: id
    logical, intent(in) :: lockstep
    real(real64), intent(out) :: losses(5)
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:)
    integer :: step
    call thread_data(id, lxv, lyv)
    call torch_model_load(lmodel, mlp_file, torch_kCPU, is_training=.true.)
    allocate(params(torch_model_parameter_count(lmodel)))
    call torch_model_parameters(lmodel, params)
    call torch_tensor_from_array(lx, lxv, torch_kCPU)
    call torch_tensor_from_array(ly, lyv, torch_kCPU)
    call torch_optim_LBFGS(optim, params, learning_rate=0.5d0, max_iter=5, history_size=10)
    do step = 1, 5
      if (lockstep) then
        !$omp barrier
      end if
      call torch_optim_step_closure(optim, lbfgs_closure, losses(step))
    end do
    call torch_delete(params)
    call torch_delete(optim)
    call torch_delete(lx)
    call torch_delete(ly)
    call torch_delete(lmodel)
  end subroutine lbfgs_one

  subroutine concurrent_lbfgs()
    real(real64) :: par(5, 0:NT - 1), ser(5, 0:NT - 1)
    integer :: id
    par = 0
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    call lbfgs_one(id, .true., par(:, id))
    !$omp end parallel
    do id = 0, NT - 1
      call lbfgs_one(id, .false., ser(:, id))
    end do
    call check(all(ser(5, :) < ser(1, :)) .and. all(par == ser), &
               "concurrent LBFGS steps with Fortran closures on per-thread models equal the serial runs")
  end subroutine concurrent_lbfgs

  ! Input of forward call k of thread id on the shared model.
  subroutine inference_input(id, k, x)
    integer, intent(in) :: id, k
    real(real64), intent(out) :: x(16, 4)
    integer :: i, j
    do j = 1, 4
      do i = 1, 16
        x(i, j) = cos(0.1d0 * i * j + 0.37d0 * k + 2.1d0 * id)
      end do
    end do
  end subroutine inference_input

  ! NFWD forward calls on the shared model, each thread with its own tensors.
  subroutine infer_many(model, id, lockstep, results, any_grad)
    type(torch_model), intent(in) :: model
    integer, intent(in) :: id
    logical, intent(in) :: lockstep
    real(real64), intent(out) :: results(16, 2, NFWD)
    logical, intent(out) :: any_grad
    real(real64), target :: x(16, 4), y(16, 2)
    type(torch_tensor) :: tin(1), tout(1)
    integer :: k
    call torch_tensor_from_array(tin(1), x, torch_kCPU)
    call torch_tensor_from_array(tout(1), y, torch_kCPU)
    any_grad = .false.
    if (lockstep) then
      !$omp barrier
    end if
    do k = 1, NFWD
      call inference_input(id, k, x)
      call torch_model_forward(model, tin, tout)
      results(:, :, k) = y
      any_grad = any_grad .or. tout(1)%requires_grad()
    end do
    call torch_delete(tin)
    call torch_delete(tout)
  end subroutine infer_many

  ! b. Forward without grad on ONE model shared by all threads, compared with the serial calls.
  subroutine shared_model_inference()
    type(torch_model) :: shared
    real(real64), allocatable :: par(:, :, :, :), ser(:, :, :, :)
    logical :: grad_par(0:NT - 1), grad_ser(0:NT - 1)
    integer :: id

    allocate(par(16, 2, NFWD, 0:NT - 1), ser(16, 2, NFWD, 0:NT - 1))
    par = 0
    grad_par = .true.
    call torch_model_load(shared, mlp_file, torch_kCPU)
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    call infer_many(shared, id, .true., par(:, :, :, id), grad_par(id))
    !$omp end parallel
    do id = 0, NT - 1
      call infer_many(shared, id, .false., ser(:, :, :, id), grad_ser(id))
    end do
    call torch_delete(shared)
    call check(all(par == ser), &
               "concurrent forward calls on one shared model equal the serial calls bit for bit")
    call check(.not. any(grad_par) .and. .not. any(grad_ser), &
               "forward without requires_grad records no graph on any thread")
  end subroutine shared_model_inference

  ! g. Compiled packages loaded and run for the first time on several threads at once.
  subroutine compiled_loads_across_threads()
    character(len=4096) :: file
    integer :: id, ok(0:NT - 1)
    if (command_argument_count() < 2) return
    call get_command_argument(2, file)
    ok = 0
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    call compiled_forward(trim(file), 2 + id, ok(id))
    !$omp end parallel
    call check(all(ok == 1), "threads loading a .pt2 and running their first forward at the same time")
    write (error_unit, '(a)') "standard error after the compiled loads"
    flush (error_unit)
  end subroutine compiled_loads_across_threads

  ! One package shared by every thread: forwards of several threads at once (each its own batch
  ! size and values) give each thread what the same forward gives alone.
  subroutine package_shared_by_threads()
    character(len=4096) :: file
    type(torch_model) :: m
    real(real32) :: want(NT + 1, 3, 0:NT - 1), got(NT + 1, 3)
    integer :: id, k, ok(0:NT - 1)
    if (command_argument_count() < 2) return
    call get_command_argument(2, file)
    call torch_model_load(m, trim(file), torch_kCPU)
    want = 0
    do id = 0, NT - 1
      call forward_of(m, id, want(:, :, id))
    end do
    ok = 1
    !$omp parallel num_threads(NT) default(shared) private(id, k, got)
    id = omp_get_thread_num()
    do k = 1, 20
      got = 0
      call forward_of(m, id, got)
      if (any(got /= want(:, :, id))) ok(id) = 0
    end do
    !$omp end parallel
    call check(all(ok == 1), "threads sharing one .pt2 model: each forward gives what it gives alone")
    call torch_delete(m)
  end subroutine package_shared_by_threads

  ! Thread id’s forward (2 + id rows of its own values) into y(1:2 + id, :).
  subroutine forward_of(m, id, y)
    type(torch_model), intent(in) :: m
    integer, intent(in) :: id
    real(real32), intent(inout) :: y(:, :)
    type(torch_tensor) :: tin(1), tout(1)
    real(real32), target :: x(2 + id, 5), out(2 + id, 3)
    integer :: i, j
    do j = 1, 5
      do i = 1, 2 + id
        x(i, j) = 0.1 * i - 0.05 * j + 0.3 * id
      end do
    end do
    call torch_tensor_from_array(tin(1), x, torch_kCPU)
    call torch_tensor_from_array(tout(1), out, torch_kCPU)
    call torch_model_forward(m, tin, tout)
    y(1:2 + id, :) = out
    call torch_delete(tin)
    call torch_delete(tout)
  end subroutine forward_of

  ! One load and one forward of a package mapping x(nb, 5) to y(nb, 3); ok = 1 when both worked.
  subroutine compiled_forward(file, nb, ok)
    character(len=*), intent(in) :: file
    integer, intent(in) :: nb
    integer, intent(out) :: ok
    type(torch_model) :: m
    type(torch_tensor) :: tin(1), tout(1)
    real(real32), target :: x(nb, 5), y(nb, 3)
    integer :: stat
    character(len=1024) :: msg
    x = 0.5
    y = -1
    ok = 0
    msg = ""
    call torch_model_load(m, file, torch_kCPU, stat=stat, errmsg=msg)
    if (stat /= 0) then
      !$omp critical (compiled_forward_report)
      write (output_unit, '(a,i0,a)') "  thread with batch ", nb, ": load failed: " // trim(msg)
      !$omp end critical (compiled_forward_report)
      return
    end if
    call torch_tensor_from_array(tin(1), x, torch_kCPU)
    call torch_tensor_from_array(tout(1), y, torch_kCPU)
    call torch_model_forward(m, tin, tout, stat=stat, errmsg=msg)
    if (stat == 0 .and. all(y /= -1)) ok = 1
    if (ok == 0) then
      !$omp critical (compiled_forward_report)
      write (output_unit, '(a,i0,a,i0,a)') "  thread with batch ", nb, ": forward stat ", stat, ": " // trim(msg)
      !$omp end critical (compiled_forward_report)
    end if
    call torch_delete(tin)
    call torch_delete(tout)
    call torch_delete(m)
  end subroutine compiled_forward

  ! c. Grad-mode scopes belong to the thread that opens them.
  subroutine grad_mode_scopes_per_thread()
    logical :: enabled(0:1), recorded(0:1), after(0:1)
    integer :: team, id, foreign_stat
    character(len=256) :: foreign_msg

    team = 0
    enabled = .true.
    recorded = .true.
    after = .false.
    foreign_stat = 0
    foreign_msg = ""
    !$omp parallel num_threads(2) default(shared) private(id)
    id = omp_get_thread_num()
    !$omp single
    team = omp_get_num_threads()
    !$omp end single
    call scope_worker(id, enabled(id), recorded(id), after(id), foreign_stat, foreign_msg)
    !$omp end parallel
    call check(team == 2 .and. .not. enabled(0) .and. enabled(1), &
               "inside one thread's no-grad scope another thread still has grad mode enabled")
    call check(.not. recorded(0) .and. recorded(1), &
               "operations record a graph only on the thread outside the no-grad scope")
    call check(foreign_stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(foreign_msg, "no open scope") > 0, &
               "a thread cannot end a no-grad scope opened by another thread")
    call check(all(after) .and. torch_grad_enabled(), "ending the scope restores grad mode on its own thread")
  end subroutine grad_mode_scopes_per_thread

  ! Thread 0 opens a no-grad scope; while it is open (between the barriers) both threads look at
  ! their grad mode and compute with a leaf that requires grad, and thread 1 tries to end it.
  subroutine scope_worker(id, enabled, recorded, after, foreign_stat, foreign_msg)
    integer, intent(in) :: id
    logical, intent(out) :: enabled, recorded, after
    integer, intent(inout) :: foreign_stat
    character(len=*), intent(inout) :: foreign_msg
    type(torch_tensor) :: w, prod
    call torch_tensor_ones(w, 1, [3_c_int64_t], torch_kFloat64, torch_kCPU, requires_grad=.true.)
    if (id == 0) call torch_no_grad_begin()
    !$omp barrier
    enabled = torch_grad_enabled()
    prod = w * w
    recorded = prod%requires_grad()
    if (id == 1) call torch_no_grad_end(stat=foreign_stat, errmsg=foreign_msg)
    !$omp barrier
    if (id == 0) call torch_no_grad_end()
    after = torch_grad_enabled()
    call torch_delete(prod)
    call torch_delete(w)
  end subroutine scope_worker

  ! d. Failures, their messages and catch scopes belong to the calling thread. The expected
  ! messages are taken from the same failures made first on the main thread alone.
  subroutine errors_per_thread()
    type(torch_model) :: shared
    logical :: ok(0:1)
    integer :: team, id, catch_stat(0:1)
    character(len=512) :: catch_msg(0:1), expected(4)

    call torch_model_load(shared, mlp_file, torch_kCPU)
    call expected_messages(expected)
    team = 0
    ok = .false.
    catch_stat = 0
    catch_msg = ""
    !$omp parallel num_threads(2) default(shared) private(id)
    id = omp_get_thread_num()
    !$omp single
    team = omp_get_num_threads()
    !$omp end single
    call error_worker(shared, id, expected, ok(id), catch_stat(id), catch_msg(id))
    !$omp end parallel
    call torch_delete(shared)
    call check(all(expected(1:2) /= "") .and. index(expected(1), "[torch_model_load]") == 1 .and. &
               index(expected(2), "[torch_tensor_zeros]") == 1 .and. index(expected(3), "[torch_reshape]") == 1 .and. &
               expected(3) /= expected(4), "each failure used below has its own message on the main thread")
    call check(team == 2 .and. ok(0) .and. ok(1), &
               "two threads failing at the same time each get exactly their own stat and errmsg")
    call check(catch_stat(1) /= 0 .and. index(catch_msg(1), "no catch scope is open on this thread") > 0, &
               "a catch scope opened on one thread cannot be ended from another thread")
    call check(catch_stat(0) /= 0 .and. catch_msg(0) == expected(3), &
               "a catch scope keeps the failure of its own thread")
  end subroutine errors_per_thread

  ! The failures of error_worker, made on one thread: a missing model file, an unsupported
  ! dtype, and two bad reshapes caught by catch scopes.
  subroutine expected_messages(expected)
    character(len=*), intent(out) :: expected(4)
    integer :: stat, which
    type(torch_model) :: missing
    type(torch_tensor) :: t
    expected = ""
    call torch_model_load(missing, missing_file, torch_kCPU, stat=stat, errmsg=expected(1))
    call torch_tensor_zeros(t, 1, [3_c_int64_t], 5, torch_kCPU, stat=stat, errmsg=expected(2))
    do which = 0, 1
      call caught_reshape(which, stat, expected(3 + which))
    end do
  end subroutine expected_messages

  ! A reshape of a 3-element tensor to a shape that depends on `which`, in a catch scope.
  subroutine caught_reshape(which, stat, msg)
    integer, intent(in) :: which
    integer, intent(out) :: stat
    character(len=*), intent(inout) :: msg
    real(real64), target :: three(3)
    type(torch_tensor) :: t3, r
    three = 1
    call torch_tensor_from_array(t3, three, torch_kCPU)
    call torch_catch_begin()
    if (which == 0) then
      r = torch_reshape(t3, [4])
    else
      r = torch_reshape(t3, [5, 7])
    end if
    call torch_catch_end(stat, msg)
    call torch_delete(r)
    call torch_delete(t3)
  end subroutine caught_reshape

  ! Both threads fail NREP times at the same time, with different failures: thread 0 loads a
  ! missing file, thread 1 asks for an unsupported dtype; on odd repetitions thread 1 also makes
  ! a successful call, which must leave errmsg alone; both then fail inside a catch scope. Every
  ! message must equal the one the same failure gives on one thread. Then thread 0 opens a catch
  ! scope that thread 1 tries to end, and fails inside it.
  subroutine error_worker(shared, id, expected, ok, catch_stat, catch_msg)
    integer, parameter :: NREP = 2000
    type(torch_model), intent(in) :: shared
    integer, intent(in) :: id
    character(len=*), intent(in) :: expected(4)
    logical, intent(out) :: ok
    integer, intent(inout) :: catch_stat
    character(len=*), intent(inout) :: catch_msg
    real(real64), target :: x(16, 4), y(16, 2)
    type(torch_model) :: missing
    type(torch_tensor) :: tin(1), tout(1), t
    character(len=512) :: msg
    integer :: rep, stat
    logical :: good

    x = 0.5d0
    call torch_tensor_from_array(tin(1), x, torch_kCPU)
    call torch_tensor_from_array(tout(1), y, torch_kCPU)
    ok = .true.
    !$omp barrier
    do rep = 1, NREP
      msg = ""
      if (id == 0) then
        call torch_model_load(missing, missing_file, torch_kCPU, stat=stat, errmsg=msg)
        good = stat == FTORCH_ERR_IO .and. msg == expected(1)
      else
        call torch_tensor_zeros(t, 1, [3_c_int64_t], 5, torch_kCPU, stat=stat, errmsg=msg)
        good = stat == FTORCH_ERR_DTYPE .and. msg == expected(2)
        if (good .and. mod(rep, 2) == 1) then
          msg = "untouched"
          call torch_model_forward(shared, tin, tout, stat=stat, errmsg=msg)
          good = stat == 0 .and. msg == "untouched"
        end if
      end if
      if (good) then
        msg = ""
        call caught_reshape(id, stat, msg)
        good = stat == FTORCH_ERR_TORCH .and. msg == expected(3 + id)
      end if
      if (ok .and. .not. good) then
        !$omp critical (report)
        write(*, '(a,i0,a,i0,a,i0,a,a)') "  thread ", id, " repetition ", rep, ": stat ", stat, ", errmsg: ", trim(msg)
        !$omp end critical (report)
      end if
      ok = ok .and. good
    end do

    if (id == 0) call torch_catch_begin()
    !$omp barrier
    if (id == 1) call torch_catch_end(catch_stat, catch_msg)
    !$omp barrier
    if (id == 0) then
      call caught_reshape_in_open_scope(catch_stat, catch_msg)
    end if
    call torch_delete(tin)
    call torch_delete(tout)
    call torch_delete(t)
    call torch_delete(missing)
  end subroutine error_worker

  ! A failing reshape inside the catch scope the caller opened; ends that scope.
  subroutine caught_reshape_in_open_scope(stat, msg)
    integer, intent(out) :: stat
    character(len=*), intent(inout) :: msg
    real(real64), target :: three(3)
    type(torch_tensor) :: t3, r
    three = 1
    call torch_tensor_from_array(t3, three, torch_kCPU)
    r = torch_reshape(t3, [4])
    call torch_catch_end(stat, msg)
    call torch_delete(r)
    call torch_delete(t3)
  end subroutine caught_reshape_in_open_scope

  ! Threads saving checkpoints of their own models to the same file at the same time: each write
  ! goes through a temporary file unique to its host, process and thread, then an atomic rename,
  ! so every save succeeds and the file left behind is a whole checkpoint.
  subroutine concurrent_checkpoints()
    character(len=4096) :: file   ! not deferred-length: gfortran 12 mishandles those in parallel regions
    integer :: failures, id, k, stat
    type(torch_model) :: model
    file = data_path("threads_shared.ckpt")
    failures = 0
    !$omp parallel num_threads(NT) default(shared) private(id, k, stat, model) reduction(+:failures)
    id = omp_get_thread_num()
    call torch_model_load(model, mlp_file, torch_kCPU)
    do k = 1, 10
      call torch_checkpoint_save(trim(file), model=model, step=id, stat=stat)
      if (stat /= 0) failures = failures + 1
    end do
    call torch_delete(model)
    !$omp end parallel
    call torch_model_load(model, mlp_file, torch_kCPU)
    call torch_checkpoint_load(trim(file), model=model, step=k, stat=stat)
    call check(failures == 0 .and. stat == 0 .and. k >= 0 .and. k < NT, &
               "concurrent checkpoint saves to one file all succeed and leave a whole checkpoint")
    call torch_delete(model)
  end subroutine concurrent_checkpoints

  ! d (continued). The path from a failed C call to stat/errmsg, ftorch_check, which every
  ! procedure with `stat` goes through, hammered by NT threads at once: each thread's last error
  ! (thread-local in the C layer) is set by a failure of its own, then ftorch_check turns it into
  ! errmsg NCHECK times. Without the C calls' cost between them, the threads spend most of
  ! their time in ftorch_check, where a message length kept in static storage (as gfortran 12
  ! does for the result of a deferred-length character function) would mix the threads' messages.

  subroutine errmsg_path_under_contention()
    integer :: wrong(0:NT - 1), team, id
    team = 0
    wrong = -1
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    !$omp single
    team = omp_get_num_threads()
    !$omp end single
    call errmsg_worker(id, wrong(id))
    !$omp end parallel
    if (any(wrong /= 0)) write(*, '(a,*(1x,i0))') "  wrong messages per thread:", wrong
    call check(team == NT .and. all(wrong == 0), &
               "stat/errmsg of failures on several threads at once are always the thread's own message")
  end subroutine errmsg_path_under_contention

  subroutine errmsg_worker(id, wrong)
    integer, parameter :: NCHECK = 500000
    integer, intent(in) :: id
    integer, intent(out) :: wrong
    character(len=512) :: expected, msg
    type(torch_tensor) :: t
    integer :: i, stat, status
    ! A failure of this thread's own: an unsupported dtype (even ids) or device type (odd ids)
    ! whose number depends on the thread, so that every thread's message differs.
    expected = ""
    if (mod(id, 2) == 0) then
      call torch_tensor_zeros(t, 1, [2_c_int64_t], 5 + 100 * id, torch_kCPU, stat=status, errmsg=expected)
    else
      call torch_tensor_zeros(t, 1, [2_c_int64_t], torch_kFloat64, 90 + 1000 * id, stat=status, errmsg=expected)
    end if
    wrong = 0
    if (status == 0 .or. index(expected, "[torch_tensor_zeros]") /= 1) wrong = 1
    !$omp barrier
    do i = 1, NCHECK
      msg = ""
      call ftorch_check(status, "torch_tensor_zeros", stat, msg)
      if (stat /= status .or. msg /= expected) wrong = wrong + 1
    end do
    call torch_delete(t)
  end subroutine errmsg_worker

  ! e. Handles created on one thread and deleted on another are counted exactly.
  subroutine handles_across_threads()
    integer, parameter :: PER_THREAD = 3
    type(torch_tensor) :: made(PER_THREAD, 0:NT - 1), given(PER_THREAD, 0:NT - 1)
    integer(c_int64_t) :: before, inside, after_region, after_delete, after_threads_delete
    integer :: id, i

    before = ftorch_live_handles()
    inside = -1
    ! Threads create, the main thread deletes after the region.
    !$omp parallel num_threads(NT) default(shared) private(id, i)
    id = omp_get_thread_num()
    do i = 1, PER_THREAD
      call torch_tensor_zeros(made(i, id), 2, [2_c_int64_t, int(i, c_int64_t)], torch_kFloat64, torch_kCPU)
    end do
    !$omp barrier
    !$omp single
    inside = ftorch_live_handles()
    !$omp end single
    !$omp end parallel
    after_region = ftorch_live_handles()
    call torch_delete(made)
    after_delete = ftorch_live_handles()

    ! The main thread creates, the threads delete.
    do id = 0, NT - 1
      do i = 1, PER_THREAD
        call torch_tensor_ones(given(i, id), 1, [int(i, c_int64_t)], torch_kFloat32, torch_kCPU)
      end do
    end do
    !$omp parallel num_threads(NT) default(shared) private(id)
    id = omp_get_thread_num()
    call torch_delete(given(:, id))
    !$omp end parallel
    after_threads_delete = ftorch_live_handles()

    call check(inside == before + PER_THREAD * NT .and. after_region == inside, &
               "the live-handle count includes the handles that every thread has created")
    call check(after_delete == before, &
               "handles created on worker threads and deleted on the main thread leave the count at its start")
    call check(after_threads_delete == before, &
               "handles created on the main thread and deleted on worker threads leave the count at its start")
  end subroutine handles_across_threads
end program test_threads
