!> Training from Fortran, run by tests/test_train.py, which replays each run with torch.optim
!> and compares. Usage: test_train <data dir> <mode> [arguments]
!>   parity <case line>    one optimizer/scheduler case; writes train_<name>.txt
!>   params                freeze, set-gradient, accumulation, parameter queries
!>   staggered             Adam whose parameters have different step counts when the CUDA-graph
!>                         step starts (run with FTORCH_CUDA_GRAPHS=eager); writes train_staggered.txt
!>   resume full|first|second   checkpoint resume across processes
!>   saver <file>          saves checkpoints of a large model forever (killed by the test)
!>   loadcheck <file>      loads a checkpoint written by saver
!>   losses                every loss and option; writes losses.txt
!>   errors                bad inputs of the training API
module train_state
  use ftorch
  implicit none
  type(torch_model) :: model
  type(torch_tensor) :: tx, ty
  real(8), target :: x(16, 4), y(16, 2), pred(16, 2)
contains
  ! The loss evaluation of the LBFGS cases.
  subroutine mse_closure(loss)
    type(torch_tensor), intent(inout) :: loss
    type(torch_tensor) :: out(1)
    call torch_tensor_from_array(out(1), pred, torch_kCPU)
    call torch_model_forward(model, [tx], out, requires_grad=.true.)
    call torch_loss_mse(loss, out(1), ty)
    call torch_delete(out)
  end subroutine mse_closure

  ! A closure whose FTorch call fails without stat: the step fails with the reason, no stop.
  subroutine failing_closure(loss)
    type(torch_tensor), intent(inout) :: loss
    loss = torch_reshape(tx, [7, 7, 7])
  end subroutine failing_closure
end module train_state

program test_train
  use, intrinsic :: iso_fortran_env, only: real64, int64
  use ftorch
  use train_state
  use testing, only: check, summary, read_values, data_path
  implicit none
  character(len=64) :: mode
  character(len=4096) :: arg
  real(real64), allocatable :: v(:)
  integer :: unit

  call get_command_argument(2, mode)
  call read_values("train_x.txt", v); x = reshape(v, [16, 4])
  call read_values("train_y.txt", v); y = reshape(v, [16, 2])
  call torch_tensor_from_array(tx, x, torch_kCPU)
  call torch_tensor_from_array(ty, y, torch_kCPU)

  select case (trim(mode))
  case ("parity")
    call parity()
  case ("params")
    call parameter_handling()
    call rollback()
  case ("staggered")
    call first_layer_frozen("staggered", 1, 3, 5)
  case ("refreeze")
    call first_layer_frozen("refreeze", 6, 8, 1)
  case ("resume")
    call get_command_argument(3, arg)
    call get_command_argument(4, mode)
    call resume(trim(arg), trim(mode) == "graph")
  case ("saver")
    call get_command_argument(3, arg)
    call saver(trim(arg))
  case ("loadcheck")
    call get_command_argument(3, arg)
    call loadcheck(trim(arg))
  case ("losses")
    call losses()
  case ("errors")
    call errors()
  case default
    error stop "unknown mode"
  end select
  if (allocated(v)) deallocate(v)  ! main-program allocatables are not freed at the end (leak checks)
  call summary()

contains

  subroutine load_fresh_model(params)
    type(torch_tensor), allocatable, intent(inout) :: params(:)
    call torch_model_load(model, data_path("train_mlp.pt"), torch_kCPU, is_training=.true.)
    if (allocated(params)) then
      call torch_delete(params)
      deallocate(params)
    end if
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
  end subroutine load_fresh_model

  ! Flattened (row-major) values of every parameter, one line.
  subroutine write_params(out_unit, params)
    integer, intent(in) :: out_unit
    type(torch_tensor), intent(in) :: params(:)
    integer :: i
    do i = 1, size(params)
      write(out_unit, '(a,*(1x,es25.17e3))') "param", flat_values(params(i))
    end do
  end subroutine write_params

  ! One parameter's values, row-major.
  function flat_values(param) result(values)
    type(torch_tensor), intent(in) :: param
    real(real64), allocatable :: values(:)
    type(torch_tensor) :: flat
    integer :: n
    n = int(product(param%get_shape()))
    allocate(values(n))
    flat = torch_reshape(param, [n])
    call torch_tensor_to_array(flat, values)
    call torch_delete(flat)
  end function flat_values

  ! One step of the standard loop: zero_grad, forward, MSE, backward; returns the loss.
  function forward_backward(optim) result(loss)
    type(torch_optim), intent(in) :: optim
    real(real64) :: loss
    real(real64), target :: loss_value(1)
    type(torch_tensor) :: out(1), tloss
    call optim%zero_grad()
    call torch_tensor_from_array(out(1), pred, torch_kCPU)
    call torch_model_forward(model, [tx], out, requires_grad=.true.)
    call torch_tensor_from_array(tloss, loss_value, torch_kCPU)
    call torch_loss_mse(tloss, out(1), ty)
    call torch_tensor_backward(tloss)
    loss = loss_value(1)
    call torch_delete(out)
    call torch_delete(tloss)
  end function forward_backward

  subroutine parity()
    character(len=64) :: name
    integer :: kind, sched_kind, run_mode, nsteps, step, milestones(3)
    real(real64) :: h(7), s(8), loss, lr
    type(torch_optim) :: optim
    type(torch_scheduler) :: sched, warm
    type(torch_tensor), allocatable :: params(:)
    character(len=1024) :: line
    call get_command_argument(3, line)
    read(line, *) name, kind, h, sched_kind, s, run_mode, nsteps
    call load_fresh_model(params)
    select case (kind)
    case (0)
      call torch_optim_SGD(optim, params, learning_rate=h(1), momentum=h(2), weight_decay=h(3), dampening=h(4), &
                           nesterov=h(5) /= 0)
    case (1)
      call torch_optim_Adam(optim, params, learning_rate=h(1), beta_1=h(2), beta_2=h(3), eps=h(4), &
                            weight_decay=h(5), amsgrad=h(6) /= 0)
    case (2)
      call torch_optim_AdamW(optim, params, learning_rate=h(1), beta_1=h(2), beta_2=h(3), eps=h(4), &
                             weight_decay=h(5), amsgrad=h(6) /= 0)
    case (3)
      call torch_optim_RMSprop(optim, params, learning_rate=h(1), alpha=h(2), eps=h(3), weight_decay=h(4), &
                               momentum=h(5), centered=h(6) /= 0)
    case (4)
      call torch_optim_Adagrad(optim, params, learning_rate=h(1), lr_decay=h(2), weight_decay=h(3), &
                               initial_accumulator_value=h(4), eps=h(5))
    case (5)
      call torch_optim_LBFGS(optim, params, learning_rate=h(1), max_iter=nint(h(2)), history_size=nint(h(3)), &
                             strong_wolfe=h(4) /= 0)
    end select
    milestones = nint(s(2:4))
    ! mode 6: a linear warm-up made first, stepped before the case's scheduler
    if (run_mode == 6) call torch_scheduler_linear_lr(warm, optim, start_factor=0.1d0, end_factor=1.0d0, total_iters=3)
    select case (sched_kind)
    case (0)
      call torch_scheduler_step_lr(sched, optim, step_size=nint(s(1)), gamma=s(2))
    case (1)
      call torch_scheduler_multistep_lr(sched, optim, milestones, gamma=s(1))
    case (2)
      call torch_scheduler_exponential_lr(sched, optim, gamma=s(1))
    case (3)
      call torch_scheduler_cosine_annealing_lr(sched, optim, T_max=nint(s(1)), eta_min=s(2))
    case (4)
      call torch_scheduler_reduce_on_plateau(sched, optim, factor=s(1), patience=nint(s(2)), threshold=s(3), &
                                             cooldown=nint(s(4)), min_lr=s(5))
    case (5)
      call torch_scheduler_linear_lr(sched, optim, start_factor=s(1), end_factor=s(2), total_iters=nint(s(3)))
    end select

    open(newunit=unit, file=data_path("train_" // trim(name) // ".txt"), status="replace", action="write")
    do step = 1, nsteps
      lr = torch_optim_get_learning_rate(optim)
      if (run_mode == 5) then
        ! The CUDA-graph form of the step (run with FTORCH_CUDA_GRAPHS=eager: the captured work, uncaptured)
        if (sched_kind >= 0) then
          call torch_train_step(model, optim, [tx], ty, loss, scheduler=sched, max_grad_norm=1.0d0, cuda_graph=.true.)
        else
          call torch_train_step(model, optim, [tx], ty, loss, max_grad_norm=1.0d0, cuda_graph=.true.)
        end if
      else if (run_mode == 1) then
        if (sched_kind >= 0) then
          call torch_train_step(model, optim, [tx], ty, loss, scheduler=sched, max_grad_norm=1.0d0)
        else
          call torch_train_step(model, optim, [tx], ty, loss, max_grad_norm=1.0d0)
        end if
      else if (run_mode == 7) then
        call torch_train_step(model, optim, [tx], ty, loss, loss_type=torch_kL1Loss, reduction_type=torch_kSum)
      else if (run_mode == 8) then
        call torch_train_step(model, optim, [tx], ty, loss, reduction_type=torch_kSum)
      else
        if (kind == 5) then
          call torch_optim_step_closure(optim, mse_closure, loss)
        else
          loss = forward_backward(optim)
          if (run_mode == 2) call torch_optim_clip_grad_norm(optim, 0.5d0)
          if (run_mode == 3) call torch_optim_clip_grad_value(optim, 0.05d0)
          call optim%step()
        end if
        if (run_mode == 6) call warm%step()
        if (sched_kind == 4) then
          call sched%step(loss)
        else if (sched_kind >= 0) then
          call sched%step()
        end if
        if (run_mode == 4 .and. step == 10) call torch_optim_set_learning_rate(optim, 0.02d0)
      end if
      write(unit, '(a,2(1x,es25.17e3))') "step", loss, lr
      if (run_mode == 6) write(unit, '(a,2(1x,es25.17e3))') "last", torch_scheduler_get_last_lr(warm), &
        torch_scheduler_get_last_lr(sched)
    end do
    call write_params(unit, params)
    close(unit)
    call check(torch_optim_step_count(optim) == nsteps, "the optimizer counted its steps")
    call torch_model_save(model, data_path("trained_" // trim(name) // ".pt"))
    call check(torch_model_is_training(model), "the model is still in training mode after torch_model_save")
    call torch_delete(params)
    call torch_delete(optim)
    call torch_delete(sched)
    if (run_mode == 6) call torch_delete(warm)
  end subroutine parity

  ! 12 Adam steps with the first layer frozen for steps frozen_from..frozen_to, CUDA-graph steps
  ! from step first_graph on, written to train_<name>.txt. staggered: frozen for steps 1-3, graph
  ! steps from 5: the first layer has taken 3 steps fewer than the others when the graph-safe
  ! update starts, so it updates them in groups of different step counts. refreeze: graph steps
  ! throughout, the layer frozen for steps 6-8 (after the capture): each change captures anew.
  subroutine first_layer_frozen(name, frozen_from, frozen_to, first_graph)
    character(len=*), intent(in) :: name
    integer, intent(in) :: frozen_from, frozen_to, first_graph
    integer, parameter :: steps = 12
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:)
    real(real64) :: loss
    integer :: step
    call load_fresh_model(params)
    call torch_optim_Adam(optim, params, learning_rate=0.01d0)
    open(newunit=unit, file=data_path("train_" // name // ".txt"), status="replace", action="write")
    do step = 1, steps
      if (step == frozen_from) call torch_model_freeze(model, "0")
      if (step == frozen_to + 1) call torch_model_unfreeze(model, "0")
      call torch_train_step(model, optim, [tx], ty, loss, cuda_graph=step >= first_graph)
      write(unit, '(a,2(1x,es25.17e3))') "step", loss, 0.01d0
    end do
    call write_params(unit, params)
    close(unit)
    call check(torch_optim_step_count(optim) == steps, "the optimizer counted every step")
    call torch_delete(params)
    call torch_delete(optim)
  end subroutine first_layer_frozen

  subroutine parameter_handling()
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: w, gt, out(1), tloss
    real(real64), target :: g(2, 8), before(8, 4), after(8, 4), xa(8, 4), xb(8, 4), ya(8, 2), yb(8, 2)
    real(real64) :: loss
    integer :: step
    call load_fresh_model(params)
    call check(torch_model_parameter_name(model, 1) == "0.weight" .and. torch_model_parameter_name(model, 4) == "2.bias", &
               "parameter names in parameters() order")
    call check(torch_model_num_parameters(model) == 4 * 8 + 8 + 8 * 2 + 2, "number of parameter elements")
    block
      type(torch_model) :: long
      call torch_model_load(long, data_path("long_names.pt"), torch_kCPU)
      call check(torch_model_parameter_name(long, 1) == repeat("w", 300) // ".weight", &
                 "a parameter name of 307 characters, whole")
      call torch_delete(long)
    end block
    call torch_model_parameter(model, "0.weight", w)
    call check(all(w%get_shape() == [8, 4]), "parameter by name")
    call torch_tensor_to_array(w, before)

    ! freeze: the first layer does not move, the rest trains as in PyTorch
    call torch_model_freeze(model, "0")
    call check(torch_model_num_parameters(model, trainable_only=.true.) == 8 * 2 + 2, "frozen parameters are not trainable")
    call torch_optim_SGD(optim, params, learning_rate=0.1d0)
    open(newunit=unit, file=data_path("train_freeze.txt"), status="replace", action="write")
    do step = 1, 5
      loss = forward_backward(optim)
      call optim%step()
      write(unit, '(a,2(1x,es25.17e3))') "step", loss, 0.1d0
    end do
    call write_params(unit, params)
    close(unit)
    call torch_tensor_to_array(w, after)
    call check(all(after == before), "a frozen parameter is unchanged by training")
    call torch_model_unfreeze(model, "0")
    call check(torch_model_num_parameters(model, trainable_only=.true.) == 58, "unfreeze")

    ! set-gradient: halve the last layer's weight gradient in Fortran before each step
    call load_fresh_model(params)
    call torch_optim_SGD(optim, params, learning_rate=0.1d0)
    call torch_model_parameter(model, 3, w)
    call torch_tensor_from_array(gt, g, torch_kCPU)
    open(newunit=unit, file=data_path("train_setgrad.txt"), status="replace", action="write")
    do step = 1, 5
      loss = forward_backward(optim)
      call torch_tensor_get_gradient(gt, w)      ! lands in g
      g = 0.5d0 * g
      call torch_tensor_set_gradient(w, gt)
      call optim%step()
      write(unit, '(a,2(1x,es25.17e3))') "step", loss, 0.1d0
    end do
    call write_params(unit, params)
    close(unit)

    ! accumulation: two half-batch backward calls before each step
    call load_fresh_model(params)
    call torch_optim_Adam(optim, params, learning_rate=0.01d0)
    xa = x(1:8, :); xb = x(9:16, :); ya = y(1:8, :); yb = y(9:16, :)
    open(newunit=unit, file=data_path("train_accumulate.txt"), status="replace", action="write")
    do step = 1, 5
      call optim%zero_grad()
      loss = 0
      call half(xa, ya, loss)
      call half(xb, yb, loss)
      call optim%step()
      write(unit, '(a,2(1x,es25.17e3))') "step", loss, 0.01d0
    end do
    call write_params(unit, params)
    close(unit)
    call torch_delete(params); call torch_delete(w); call torch_delete(gt); call torch_delete(optim)
    call torch_delete(out); call torch_delete(tloss)
  end subroutine parameter_handling

  ! Rolling back to a checkpoint taken before the first step: the optimizer has no state again (as
  ! after PyTorch's load_state_dict), so the next step is a first step, bit for bit; never one
  ! with the moments and step count of the steps since.
  subroutine rollback()
    type(torch_tensor), allocatable :: params(:)
    type(torch_optim) :: optim
    real(real64) :: loss
    real(real64), allocatable :: after_first(:), after_rollback(:)
    integer :: i
    call load_fresh_model(params)
    call torch_optim_Adam(optim, params, learning_rate=1d-2)
    call torch_checkpoint_save(data_path("rollback.ckpt"), model, optim)
    loss = forward_backward(optim)
    call optim%step()
    after_first = values_of(params)
    do i = 1, 5
      loss = forward_backward(optim)
      call optim%step()
    end do
    call torch_checkpoint_load(data_path("rollback.ckpt"), model, optim)
    loss = forward_backward(optim)
    call optim%step()
    after_rollback = values_of(params)
    call check(size(after_first) > 0 .and. all(after_first == after_rollback), &
               "a checkpoint from before the first step rolls the optimizer back to no state")
    call torch_delete(params)
    call torch_delete(optim)
  end subroutine rollback

  ! Every parameter's values, one after the other (row-major within each).
  function values_of(params) result(all_values)
    type(torch_tensor), intent(in) :: params(:)
    real(real64), allocatable :: all_values(:)
    integer :: i
    allocate(all_values(0))
    do i = 1, size(params)
      all_values = [all_values, flat_values(params(i))]
    end do
  end function values_of

  subroutine half(xh, yh, loss)
    real(real64), target, intent(inout) :: xh(8, 4), yh(8, 2)
    real(real64), intent(inout) :: loss
    real(real64), target :: p8(8, 2)
    type(torch_tensor) :: ti(1), to(1), tt, tl
    real(real64), target :: lv(1)
    call torch_tensor_from_array(ti(1), xh, torch_kCPU)
    call torch_tensor_from_array(tt, yh, torch_kCPU)
    call torch_tensor_from_array(to(1), p8, torch_kCPU)
    call torch_model_forward(model, ti, to, requires_grad=.true.)
    call torch_tensor_from_array(tl, lv, torch_kCPU)
    call torch_loss_mse(tl, to(1), tt)
    call torch_tensor_backward(0.5d0 * tl)
    loss = loss + 0.5d0 * lv(1)
    call torch_delete(ti); call torch_delete(to); call torch_delete(tt); call torch_delete(tl)
  end subroutine half

  ! Steps 1-20 in one run (full), or 1-10, a checkpoint, and 11-20 in a new process (first,
  ! second). With graph, torch_train_step with cuda_graph (run with FTORCH_CUDA_GRAPHS=eager).
  subroutine resume(phase, graph)
    character(len=*), intent(in) :: phase
    logical, intent(in) :: graph
    character(len=16) :: tag
    type(torch_optim) :: optim
    type(torch_scheduler) :: sched
    type(torch_tensor), allocatable :: params(:)
    real(real64) :: loss
    integer :: step, first, last, saved
    tag = merge("graph_", "      ", graph)
    call load_fresh_model(params)
    call torch_optim_Adam(optim, params, learning_rate=0.02d0, amsgrad=.true.)
    call torch_scheduler_step_lr(sched, optim, step_size=3, gamma=0.7d0)
    first = 1
    last = 20
    if (phase == "first") last = 10
    if (phase == "second") then
      call torch_checkpoint_load(data_path("resume_" // trim(tag) // "ckpt"), model, optim, sched, step=saved)
      call check(saved == 10, "the checkpoint restores the step counter")
      call check(torch_optim_step_count(optim) == 10, "the checkpoint restores the optimizer's step count")
      first = saved + 1
    end if
    open(newunit=unit, file=data_path("resume_" // trim(tag) // phase // ".txt"), status="replace", action="write")
    do step = first, last
      if (graph) then
        call torch_train_step(model, optim, [tx], ty, loss, scheduler=sched, cuda_graph=.true.)
      else
        loss = forward_backward(optim)
        call optim%step()
        call sched%step()
      end if
      write(unit, '(a,i0,2(1x,es25.17e3))') "step ", step, loss, torch_optim_get_learning_rate(optim)
    end do
    if (phase == "first") call torch_checkpoint_save(data_path("resume_" // trim(tag) // "ckpt"), model, optim, sched, &
                                                     step=10)
    call write_params(unit, params)
    close(unit)
    call check(.true., "resume phase " // phase // " ran")
    call torch_delete(params); call torch_delete(optim); call torch_delete(sched)
  end subroutine resume

  subroutine saver(file)
    character(len=*), intent(in) :: file
    type(torch_model) :: big
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: loss
    integer :: i
    call torch_model_load(big, data_path("big_linear.pt"), torch_kCPU)
    allocate(params(torch_model_parameter_count(big)))
    call torch_model_parameters(big, params)
    call torch_optim_Adam(optim, params, learning_rate=1.0d-3)
    loss = torch_sum(params(1) * params(1))
    call torch_tensor_backward(loss)
    call optim%step()
    do i = 1, 100000
      call torch_checkpoint_save(file, big, optim, step=i)
      print '(a,i0)', "saved ", i
      flush(6)
    end do
  end subroutine saver

  subroutine loadcheck(file)
    character(len=*), intent(in) :: file
    type(torch_model) :: big
    type(torch_optim) :: optim
    type(torch_tensor), allocatable :: params(:)
    integer :: stat, step
    character(len=512) :: msg
    call torch_model_load(big, data_path("big_linear.pt"), torch_kCPU)
    allocate(params(torch_model_parameter_count(big)))
    call torch_model_parameters(big, params)
    call torch_optim_Adam(optim, params, learning_rate=1.0d-3)
    msg = ""
    call torch_checkpoint_load(file, big, optim, step=step, stat=stat, errmsg=msg)
    if (stat /= 0) print '(a)', trim(msg)
    call check(stat == 0 .and. step >= 1, "the checkpoint left by a killed writer loads")
    print '(a,i0)', "loaded step ", step
  end subroutine loadcheck

  subroutine losses()
    real(real64), target :: pred4(6, 4), target4(6, 4), probs(6, 4), binary(6, 4), cw(4), pw(4), grad(6, 4)
    integer(int64), target :: classes(6)
    type(torch_tensor) :: tp, tt, tc, tprobs, tb, tcw, tpw, l, tg
    call read_values("loss_pred.txt", v); pred4 = reshape(v, [6, 4])
    call read_values("loss_target.txt", v); target4 = reshape(v, [6, 4])
    call read_values("loss_probs.txt", v); probs = reshape(v, [6, 4])
    call read_values("loss_binary.txt", v); binary = reshape(v, [6, 4])
    call read_values("loss_class_weight.txt", v); cw = v
    call read_values("loss_pos_weight.txt", v); pw = v
    call read_values("loss_classes.txt", v); classes = nint(v, int64)
    call torch_tensor_from_array(tp, pred4, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tt, target4, torch_kCPU)
    call torch_tensor_from_array(tc, classes, torch_kCPU)
    call torch_tensor_from_array(tprobs, probs, torch_kCPU)
    call torch_tensor_from_array(tb, binary, torch_kCPU)
    call torch_tensor_from_array(tcw, cw, torch_kCPU)
    call torch_tensor_from_array(tpw, pw, torch_kCPU)
    call torch_tensor_from_array(tg, grad, torch_kCPU)
    open(newunit=unit, file=data_path("losses.txt"), status="replace", action="write")
    call torch_loss_mse(l, tp, tt)
    call out("mse_mean", l, tp, tg, grad)
    call torch_loss_mse(l, tp, tt, torch_kSum)
    call out("mse_sum", l, tp, tg, grad)
    call torch_loss_mse(l, tp, tt, torch_kNone)
    call out("mse_none", l, tp, tg, grad)
    call torch_loss_l1(l, tp, tt)
    call out("l1_mean", l, tp, tg, grad)
    call torch_loss_l1(l, tp, tt, torch_kNone)
    call out("l1_none", l, tp, tg, grad)
    call torch_loss_huber(l, tp, tt, delta=0.5d0)
    call out("huber_0.5", l, tp, tg, grad)
    call torch_loss_huber(l, tp, tt, torch_kSum)
    call out("huber_sum", l, tp, tg, grad)
    call torch_loss_smooth_l1(l, tp, tt, beta=0.5d0)
    call out("smooth_l1_0.5", l, tp, tg, grad)
    call torch_loss_smooth_l1(l, tp, tt, torch_kNone, beta=2.0d0)
    call out("smooth_l1_none_2", l, tp, tg, grad)
    call torch_loss_cross_entropy(l, tp, tc)
    call out("ce_index", l, tp, tg, grad)
    call torch_loss_cross_entropy(l, tp, tc, torch_kNone)
    call out("ce_index_none", l, tp, tg, grad)
    call torch_loss_cross_entropy(l, tp, tc, weight=tcw, ignore_index=3, label_smoothing=0.1d0)
    call out("ce_options", l, tp, tg, grad)
    call torch_loss_cross_entropy(l, tp, tc, torch_kSum, weight=tcw)
    call out("ce_weight_sum", l, tp, tg, grad)
    call torch_loss_cross_entropy(l, tp, tprobs)
    call out("ce_probs", l, tp, tg, grad)
    call torch_loss_cross_entropy(l, tp, tprobs, label_smoothing=0.2d0)
    call out("ce_probs_smooth", l, tp, tg, grad)
    call torch_loss_nll(l, tp, tc)
    call out("nll", l, tp, tg, grad)
    call torch_loss_nll(l, tp, tc, weight=tcw, ignore_index=0)
    call out("nll_options", l, tp, tg, grad)
    call torch_loss_bce_with_logits(l, tp, tb)
    call out("bce", l, tp, tg, grad)
    call torch_loss_bce_with_logits(l, tp, tb, torch_kNone, pos_weight=tpw)
    call out("bce_pos_weight_none", l, tp, tg, grad)
    call torch_loss_bce_with_logits(l, tp, tb, weight=tt, pos_weight=tpw)
    call out("bce_weight_pos_weight", l, tp, tg, grad)
    close(unit)
    call check(.true., "losses recorded")
  end subroutine losses

  subroutine out(name, l, tp, tg, grad)
    character(len=*), intent(in) :: name
    type(torch_tensor), intent(inout) :: l, tp, tg
    real(real64), intent(in) :: grad(6, 4)
    type(torch_tensor) :: flat
    real(real64), allocatable :: values(:)
    integer :: n
    n = int(product(l%get_shape()))
    allocate(values(n))
    flat = torch_reshape(l, [n])
    call torch_tensor_to_array(flat, values)
    call tp%zero_grad()
    call torch_tensor_backward(torch_sum(l))
    call torch_tensor_get_gradient(tg, tp)
    write(unit, '(a,*(1x,es25.17e3))') name, values
    write(unit, '(a,*(1x,es25.17e3))') "grad", transpose(grad)
    call torch_delete(l)
    call torch_delete(flat)
    end subroutine out

  subroutine errors()
    type(torch_optim) :: optim, other_optim
    type(torch_scheduler) :: sched, other_sched
    type(torch_model) :: other
    type(torch_tensor), allocatable :: params(:)
    type(torch_tensor) :: none(0), l, short, nonleaf(1), free_w
    real(real64), target :: s5(5), w5(5)
    character(len=1), allocatable :: bytes(:)
    integer :: stat, in_unit, size_bytes
    character(len=512) :: msg
    call load_fresh_model(params)
    call torch_optim_SGD(optim, none, learning_rate=0.1d0, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "[torch_optim_SGD]") == 1 .and. &
               index(msg, "at least one parameter") > 0, "an optimizer on zero parameters is an error")
    call torch_optim_Adam(optim, params, learning_rate=-0.1d0, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "learning rate must be non-negative") > 0, &
               "a negative learning rate is an error")
    nonleaf(1) = params(1) * 2
    call torch_optim_Adam(optim, nonleaf, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "not a leaf") > 0, "a non-leaf parameter is an error")
    call torch_optim_SGD(optim, params, learning_rate=0.1d0, nesterov=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "nesterov") > 0, "nesterov without momentum")
    call torch_optim_Adam(optim, params, learning_rate=0.01d0)
    call torch_optim_set_learning_rate(optim, -1.0d0, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. torch_optim_get_learning_rate(optim) == 0.01d0, &
               "setting a negative learning rate fails and keeps the old one")
    call torch_tensor_from_array(short, s5, torch_kCPU)
    call torch_loss_mse(l, tx, short, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "[torch_loss_mse]") == 1 .and. &
               index(msg, "differs from target shape") > 0, "a loss shape mismatch is an error")
    call torch_loss_cross_entropy(l, tx, short, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "[torch_loss_cross_entropy]") == 1, "cross entropy with a bad target")
    call torch_loss_huber(l, tx, tx, delta=-1.0d0, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "delta") > 0, "a negative Huber delta")
    call torch_train_step(model, optim, [tx], short, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "[torch_train_step]") == 1, &
               "a train step with a mismatched target")
    call torch_scheduler_reduce_on_plateau(sched, optim, mode="sideways", stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "mode") > 0, "an unknown plateau mode")
    call torch_scheduler_reduce_on_plateau(sched, optim)
    call sched%step(stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "metric") > 0, "reduce-on-plateau without a metric")
    call torch_optim_step_closure(optim, mse_closure, stat=stat)
    call check(stat == 0, "a closure step works for any optimizer")
    call torch_optim_step_closure(optim, failing_closure, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_CALLBACK .and. index(msg, "the closure failed") > 0 .and. &
               index(msg, "[torch_reshape]") > 0, "a closure whose FTorch call fails fails the step with its reason")
    call optim%step(stat=stat)
    call check(stat == 0, "the optimizer still works after the errors")
    ! The CUDA-graph step: CPU tensors are a device error, other optimizers are refused by name.
    call torch_train_step(model, optim, [tx], ty, cuda_graph=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DEVICE .and. index(msg, "[torch_train_step]") == 1 .and. &
               index(msg, "CUDA graphs need every tensor of the step on a CUDA device") > 0, &
               "a CUDA-graph step on CPU tensors is a device error")
    call torch_optim_RMSprop(other_optim, params, learning_rate=0.01d0)
    call torch_train_step(model, other_optim, [tx], ty, cuda_graph=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "SGD, Adam and AdamW optimizers, not RMSPROP") > 0, &
               "a CUDA-graph step refuses an optimizer it cannot capture")
    ! a scheduler of another optimizer would decay that one's rate and never this one's
    call torch_scheduler_step_lr(other_sched, other_optim, step_size=1, gamma=0.5d0)
    call torch_train_step(model, optim, [tx], ty, scheduler=other_sched, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "another optimizer") > 0 .and. &
               torch_optim_get_learning_rate(other_optim) == 0.01d0, &
               "torch_train_step refuses a scheduler of another optimizer: " // trim(msg))
    call torch_delete(other_sched)
    call torch_delete(other_optim)
    ! an optimizer over tensors that are not the model's parameters would step nothing, every step
    call torch_tensor_from_array(free_w, w5, torch_kCPU, requires_grad=.true.)
    call torch_optim_SGD(other_optim, [free_w], learning_rate=0.1d0)
    call torch_train_step(model, other_optim, [tx], ty, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "none of the model's parameters") > 0, &
               "torch_train_step refuses an optimizer over none of the model's parameters: " // trim(msg))
    ! re-making a parameter's handle (here the optimizer's) would leave the optimizer updating the old leaf
    call torch_tensor_from_array(free_w, w5, torch_kCPU, requires_grad=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "is a parameter") > 0, &
               "a constructor refuses the handle of an optimizer's parameter: " // trim(msg))
    call torch_model_parameter(model, 1, free_w)
    call torch_model_parameter(model, 2, free_w)
    call check(.true., "a parameter handle may be re-pointed to another of the model's parameters")
    call torch_tensor_from_array(free_w, w5, torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "is a parameter") > 0, &
               "a constructor refuses the handle of a model's parameter: " // trim(msg))
    call torch_tensor_zeros(free_w, 1, [5_int64], torch_kFloat64, torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "is a parameter") > 0, &
               "torch_tensor_zeros refuses the handle of a model's parameter: " // trim(msg))
    call torch_delete(free_w)
    call torch_tensor_from_array(free_w, w5, torch_kCPU)
    call check(.true., "a deleted parameter handle may be made anew")
    call torch_delete(free_w)
    call torch_delete(other_optim)

    ! checkpoints
    call torch_checkpoint_save(data_path("errors.ckpt"), model, optim, step=3)
    call torch_model_load(other, data_path("other_model.pt"), torch_kCPU)
    call torch_checkpoint_load(data_path("errors.ckpt"), other, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "different model") > 0, &
               "a checkpoint of a different model is refused")
    call torch_checkpoint_load(data_path("errors.ckpt"), model, optim, sched, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "no scheduler") > 0, &
               "a checkpoint without the scheduler asked for is refused")
    call torch_optim_RMSprop(other_optim, params, learning_rate=0.01d0)
    call torch_checkpoint_load(data_path("errors.ckpt"), model, other_optim, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "the one given to resume into is RMSPROP") > 0, &
               "resuming into an optimizer of another kind names both kinds: " // trim(msg))
    call torch_delete(other_optim)
    call torch_checkpoint_load(data_path("no_such.ckpt"), model, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_IO, "a missing checkpoint is an I/O error")
    call torch_model_load(other, data_path("errors.ckpt"), torch_kCPU, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_IO .and. index(msg, "is an FTorch checkpoint") > 0, &
               "torch_model_load of a checkpoint says what the file is: " // trim(msg))
    open(newunit=in_unit, file=data_path("errors.ckpt"), access="stream", form="unformatted", status="old")
    inquire(unit=in_unit, size=size_bytes)
    allocate(bytes(size_bytes))
    read(in_unit) bytes
    close(in_unit)
    open(newunit=in_unit, file=data_path("truncated.ckpt"), access="stream", form="unformatted", status="replace")
    write(in_unit) bytes(1:size_bytes / 2)
    close(in_unit)
    call torch_checkpoint_load(data_path("truncated.ckpt"), model, optim, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_IO .and. index(msg, "[torch_checkpoint_load]") == 1, &
               "a truncated checkpoint is an I/O error")
    call torch_checkpoint_load(data_path("train_mlp.pt"), model, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_IO .and. index(msg, "not an FTorch checkpoint") > 0, "a TorchScript file is not a checkpoint")
    call torch_checkpoint_save("/nonexistent-dir/x.ckpt", model, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_IO, "saving into a missing directory is an I/O error")
    call torch_model_freeze(model, "no_such_layer", stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "no_such_layer") > 0, "freezing an unknown name")
    call torch_model_parameter(model, "nope", l, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT, "an unknown parameter name")
    call torch_model_parameter(model, 9, l, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "out of range 1..4") > 0, "a parameter index out of range")
    call torch_delete(params); call torch_delete(optim); call torch_delete(sched); call torch_delete(other)
  end subroutine errors
end program test_train
