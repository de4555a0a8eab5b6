!> Training helpers: the one-call training step (with an optional progress log) and checkpoints
!> of model, optimizer and scheduler together.
module ftorch_train
  use, intrinsic :: iso_c_binding, only: c_associated, c_char, c_double, c_int, c_int64_t, c_intptr_t, c_null_ptr, &
                                         c_ptr
  use ftorch_kinds, only: int64, real64, output_unit
  use ftorch_errors, only: ftorch_check
  use ftorch_interop, only: c_string
  use ftorch_types, only: torch_kMean
  use ftorch_tensor_type, only: torch_tensor
  use ftorch_model, only: torch_model
  use ftorch_optim, only: torch_optim, torch_scheduler, torch_optim_get_learning_rate, torch_optim_step_count
  use ftorch_loss, only: torch_kMSELoss
  use ftorch_distributed, only: torch_comm, torch_model_is_leader
  use ftorch_c_api, only: ftc_checkpoint_load, ftc_checkpoint_save, ftc_comm_checkpoint_load, &
                            ftc_comm_checkpoint_save, ftc_train_step, ftc_train_step_cuda_graph, ftc_optim_train_time
  implicit none
  ! Kind of the real literals below (double precision whatever -fdefault-real-8 or -fdefault-double-8 say).
  integer, parameter :: dp = c_double
  private
  public :: torch_train_step, torch_checkpoint_save, torch_checkpoint_load

contains

  !> One training step: zero_grad, forward, loss against `target_tensor`, backward, optional
  !> gradient clipping (max_grad_norm), optimizer step, optional scheduler step (fed the loss for
  !> reduce-on-plateau). With log_every = N, every N-th optimizer step writes
  !> "step <n>  loss <value>  lr <rate>  <ms> ms/step" to log_unit (default: standard output).
  !> With cuda_graph = .true. (everything on one CUDA device; SGD, Adam or AdamW), the step is
  !> captured as a CUDA graph after 3 warm-up steps and replayed from then on, on the same input
  !> and target buffers: write the next data into their memory between steps.
  subroutine torch_train_step(model, optim, input_tensors, target_tensor, loss, loss_type, reduction_type, &
                              scheduler, max_grad_norm, log_every, log_unit, stat, errmsg, cuda_graph)
    !> The model to train (a loaded TorchScript model).
    type(torch_model), intent(in) :: model
    !> An optimizer over the model’s parameters.
    type(torch_optim), intent(in) :: optim
    !> The arguments of the model’s forward, in order.
    type(torch_tensor), intent(in) :: input_tensors(:)
    !> The target the model’s output is compared with.
    type(torch_tensor), intent(in) :: target_tensor
    real(real64), intent(out), optional :: loss      !< the loss value of this step
    integer, intent(in), optional :: loss_type       !< torch_kMSELoss (default), torch_kL1Loss, ...
    integer, intent(in), optional :: reduction_type  !< torch_kMean (default) or torch_kSum
    !> A scheduler of `optim`, stepped after the optimizer (default: none).
    type(torch_scheduler), intent(in), optional :: scheduler
    !> Clip the gradients to this global (2-)norm before the step (default: no clipping).
    real(real64), intent(in), optional :: max_grad_norm
    !> Write a progress line every `log_every` optimizer steps (default: never; <= 0 never
    !> writes), to unit `log_unit` (default: standard output).
    integer, intent(in), optional :: log_every, log_unit
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    !> Capture the step as a CUDA graph and replay it (default: .false.); see above.
    logical, intent(in), optional :: cuda_graph
    ! The C training step, eager or as a CUDA graph (one interface, two entry points).
    procedure(ftc_train_step), pointer :: step
    type(c_ptr) :: handles(size(input_tensors)), sched
    real(c_double) :: value, seconds, clip
    integer(c_int) :: kind, reduction, status
    integer :: i, unit
    character(len=16) :: ms
    integer(c_int64_t) :: window_steps
    real(c_double) :: window_seconds
    do i = 1, size(input_tensors)
      handles(i) = input_tensors(i)%p
    end do
    call handles_of(scheduler=scheduler, s=sched)
    kind = torch_kMSELoss
    if (present(loss_type)) kind = int(loss_type, c_int)
    reduction = torch_kMean
    if (present(reduction_type)) reduction = int(reduction_type, c_int)
    clip = 0
    if (present(max_grad_norm)) clip = max_grad_norm
    value = 0
    seconds = 0
    step => ftc_train_step
    if (present(cuda_graph)) then
      if (cuda_graph) step => ftc_train_step_cuda_graph
    end if
    status = step(model%p, optim%p, sched, handles, size(handles, kind=c_int), target_tensor%p, kind, reduction, &
                  clip, value, seconds)
    if (present(loss)) loss = value
    call ftorch_check(status, "torch_train_step", stat, errmsg)
    if (status /= 0 .or. .not. present(log_every)) return
    if (log_every <= 0) return
    if (.not. torch_model_is_leader(model)) return  ! (the optimizer of a node-shared model is the leader’s)
    associate (steps => torch_optim_step_count(optim))
      if (mod(steps, int(log_every, int64)) /= 0) return
      ! The mean time of the train steps of the optimizer since its last line (kept with it:
      ! two models trained in turn, or on two threads, keep their logs apart).
      call ftorch_check(ftc_optim_train_time(optim%p, 1_c_int, window_steps, window_seconds), "torch_train_step", &
                        stat, errmsg)
      unit = output_unit
      if (present(log_unit)) unit = log_unit
      ! (F0.d may drop the zero before the decimal point: "0.5558", never ".5558".)
      write(ms, '(f16.4)') 1.0e3_dp * window_seconds / max(window_steps, 1_c_int64_t)
      write(unit, '(a,i0,a,es14.7,a,es11.4,a,a,a)') "step ", steps, "  loss ", value, "  lr ", &
        torch_optim_get_learning_rate(optim), "  ", trim(adjustl(ms)), " ms/step"
      flush(unit)
    end associate
  end subroutine torch_train_step

  !> Write model parameters and buffers, optimizer state, scheduler state and a step counter to
  !> one file. The write is atomic: a crash while saving leaves the previous file intact.
  !> With `comm` (a data-parallel run; collective): rank 0 writes, and every rank returns rank 0’s
  !> status, so no rank goes on before the file is complete.
  subroutine torch_checkpoint_save(filename, model, optim, scheduler, step, stat, errmsg, comm)
    !> Path of the checkpoint file (replaced if it exists).
    character(len=*), intent(in) :: filename
    !> The model whose parameters and buffers are saved. Each object is optional, but one given
    !> and not constructed is an error.
    type(torch_model), intent(in), optional :: model
    !> The optimizer to save (its state, e.g. Adam’s moments, and step count).
    type(torch_optim), intent(in), optional :: optim
    !> The scheduler to save.
    type(torch_scheduler), intent(in), optional :: scheduler
    !> A step counter of the caller’s, returned by torch_checkpoint_load (default 0).
    integer, intent(in), optional :: step
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    !> The communicator of a data-parallel run: the call is then collective (see above).
    type(torch_comm), intent(in), optional :: comm
    type(c_ptr) :: m, o, s
    integer(c_int64_t) :: n
    call handles_of(model, optim, scheduler, m, o, s)
    n = 0
    if (present(step)) n = step
    if (present(comm)) then
      call ftorch_check(ftc_comm_checkpoint_save(given(comm%p), c_string(filename), m, o, s, n), &
                        "torch_checkpoint_save", stat, errmsg)
      return
    end if
    call ftorch_check(ftc_checkpoint_save(c_string(filename), m, o, s, n), "torch_checkpoint_save", stat, errmsg)
  end subroutine torch_checkpoint_save

  !> Restore a checkpoint into objects of the same structure (checked before anything changes);
  !> continuing from it gives the same trajectory as never stopping. With `comm` (collective):
  !> every rank reads and checks its file into a staging copy, then the ranks agree that all of
  !> them succeeded and hold the same parameters and step; only then does every rank apply it.
  !> Otherwise nothing changes on any rank, and every rank returns a failure (FTORCH_ERR_DISTRIBUTED
  !> on the healthy ones, naming the failing rank(s)).
  subroutine torch_checkpoint_load(filename, model, optim, scheduler, step, stat, errmsg, comm)
    !> Path of a file written by torch_checkpoint_save.
    character(len=*), intent(in) :: filename
    !> The model whose parameters and buffers are restored (optional).
    type(torch_model), intent(in), optional :: model
    !> The optimizer whose state is restored (optional).
    type(torch_optim), intent(in), optional :: optim
    !> The scheduler whose state is restored (optional).
    type(torch_scheduler), intent(in), optional :: scheduler
    !> The step counter saved with the checkpoint.
    integer, intent(out), optional :: step
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    !> The communicator of a data-parallel run: the call is then collective (see above).
    type(torch_comm), intent(in), optional :: comm
    type(c_ptr) :: m, o, s
    integer(c_int64_t) :: n
    call handles_of(model, optim, scheduler, m, o, s)
    n = 0
    if (present(comm)) then
      call ftorch_check(ftc_comm_checkpoint_load(given(comm%p), c_string(filename), m, o, s, n), &
                        "torch_checkpoint_load", stat, errmsg)
    else
      call ftorch_check(ftc_checkpoint_load(c_string(filename), m, o, s, n), "torch_checkpoint_load", stat, errmsg)
    end if
    if (present(step)) step = int(n)
  end subroutine torch_checkpoint_load

  ! The handles of the objects given (null for those absent). An object that is given but not
  ! constructed is an error, never "absent": it is passed as the C layer’s "unconstructed" value,
  ! which the C call rejects after releasing any expression arguments.
  subroutine handles_of(model, optim, scheduler, m, o, s)
    type(torch_model), intent(in), optional :: model
    type(torch_optim), intent(in), optional :: optim
    type(torch_scheduler), intent(in), optional :: scheduler
    type(c_ptr), intent(out), optional :: m, o, s
    if (present(m)) m = c_null_ptr
    if (present(o)) o = c_null_ptr
    if (present(s)) s = c_null_ptr
    if (present(model) .and. present(m)) m = given(model%p)
    if (present(optim) .and. present(o)) o = given(optim%p)
    if (present(scheduler) .and. present(s)) s = given(scheduler%p)
  end subroutine handles_of

  type(c_ptr) function given(p)
    type(c_ptr), intent(in) :: p
    given = p
    if (.not. c_associated(p)) given = transfer(-1_c_intptr_t, p)
  end function given
end module ftorch_train
