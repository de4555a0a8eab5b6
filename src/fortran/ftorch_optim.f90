!> Optimizers (`torch_optim`: SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS), learning-rate
!> schedulers (`torch_scheduler`) and gradient clipping, with torch.optim’s semantics.
module ftorch_optim
  use, intrinsic :: iso_c_binding, only: c_double, c_funloc, c_funptr, c_int, c_int64_t, c_null_ptr, c_ptr
  use ftorch_kinds, only: real64
  use ftorch_errors, only: ftorch_check, ftorch_fail, FTORCH_ERR_INVALID_ARGUMENT
  use ftorch_tensor_type, only: torch_tensor
  use ftorch_callbacks, only: callback_box, callback_data, callback_box_at
  implicit none
  ! Kind of the real literals below (double precision whatever -fdefault-real-8 or -fdefault-double-8 say).
  integer, parameter :: dp = c_double
  private

  public :: torch_optim, torch_optim_SGD, torch_optim_Adam, torch_optim_AdamW, torch_optim_RMSprop, &
            torch_optim_Adagrad, torch_optim_LBFGS, torch_optim_step, torch_optim_step_closure, &
            torch_optim_zero_grad, torch_optim_delete, torch_optim_get_learning_rate, &
            torch_optim_set_learning_rate, torch_optim_step_count, torch_optim_clip_grad_norm, &
            torch_optim_clip_grad_value, torch_closure
  public :: torch_scheduler, torch_scheduler_step_lr, torch_scheduler_multistep_lr, torch_scheduler_exponential_lr, &
            torch_scheduler_cosine_annealing_lr, torch_scheduler_reduce_on_plateau, torch_scheduler_linear_lr, &
            torch_scheduler_step, torch_scheduler_get_last_lr, torch_scheduler_delete

  !> An optimizer over a set of parameter tensors; `p` is null until constructed. `o2 = o1` makes
  !> a second handle to the same optimizer.
  type :: torch_optim
    !> Opaque handle of the optimizer (null until constructed); not to be set directly.
    type(c_ptr) :: p = c_null_ptr
  contains
    procedure, private :: torch_optim_share
    !> `o2 = o1`: a second handle to the same optimizer.
    generic :: assignment(=) => torch_optim_share
    !> `call optim%step()`: `torch_optim_step`.
    procedure :: step => torch_optim_step
    !> `call optim%zero_grad()`: `torch_optim_zero_grad`.
    procedure :: zero_grad => torch_optim_zero_grad
    final :: finalize_optim
  end type torch_optim

  !> A learning-rate schedule driving an optimizer (which it keeps alive). `s2 = s1` makes a
  !> second handle to the same scheduler.
  type :: torch_scheduler
    !> Opaque handle of the scheduler (null until constructed); not to be set directly.
    type(c_ptr) :: p = c_null_ptr
  contains
    procedure, private :: torch_scheduler_share
    !> `s2 = s1`: a second handle to the same scheduler.
    generic :: assignment(=) => torch_scheduler_share
    !> `call scheduler%step()`: `torch_scheduler_step`.
    procedure :: step => torch_scheduler_step
    final :: finalize_scheduler
  end type torch_scheduler

  abstract interface
    !> Loss evaluation for optimizers that need it more than once per step (LBFGS): compute the
    !> loss (forward and loss function) into `loss`, e.g. `loss = torch_mean((y - target)**2)`.
    !> zero_grad and backward are done for you.
    subroutine torch_closure(loss)
      import :: torch_tensor
      !> Unconstructed on entry; set it to the loss, a one-element tensor carrying the graph.
      type(torch_tensor), intent(inout) :: loss
    end subroutine torch_closure
  end interface

  integer(c_int), parameter :: SGD = 0, ADAM = 1, ADAMW = 2, RMSPROP = 3, ADAGRAD = 4, LBFGS = 5
  integer(c_int), parameter :: SCHED_STEP = 0, SCHED_MULTISTEP = 1, SCHED_EXPONENTIAL = 2, SCHED_COSINE = 3, &
                               SCHED_PLATEAU = 4, SCHED_LINEAR = 5

  ! The closure of an LBFGS step, handed to the C layer as the step’s context through the
  ! callback registry (ftorch_callbacks), as every user procedure is.
  type, extends(callback_box) :: closure_box
    procedure(torch_closure), pointer, nopass :: f => null()
  contains
    procedure :: same => closure_same
  end type closure_box

  interface
    subroutine ftc_scheduler_release(h) bind(c, name="ftc_scheduler_release")
      import :: c_ptr
      type(c_ptr), value :: h
    end subroutine ftc_scheduler_release
    subroutine ftc_optim_release(h) bind(c, name="ftc_optim_release")
      import :: c_ptr
      type(c_ptr), value :: h
    end subroutine ftc_optim_release
    function ftc_optim_new(out, kind, params, n_params, hyper, n_hyper) result(status) bind(c, name="ftc_optim_new")
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), intent(inout) :: out
      integer(c_int), value :: kind, n_hyper
      type(c_ptr), intent(in) :: params(*)
      integer(c_int64_t), value :: n_params
      real(c_double), intent(in) :: hyper(*)
      integer(c_int) :: status
    end function ftc_optim_new
    function ftc_optim_share(src, dst) result(status) bind(c, name="ftc_optim_share")
      import :: c_ptr, c_int
      type(c_ptr), value :: src
      type(c_ptr), intent(inout) :: dst
      integer(c_int) :: status
    end function ftc_optim_share
    function ftc_scheduler_share(src, dst) result(status) bind(c, name="ftc_scheduler_share")
      import :: c_ptr, c_int
      type(c_ptr), value :: src
      type(c_ptr), intent(inout) :: dst
      integer(c_int) :: status
    end function ftc_scheduler_share
    function ftc_optim_delete(o) result(status) bind(c, name="ftc_optim_delete")
      import :: c_ptr, c_int
      type(c_ptr), intent(inout) :: o
      integer(c_int) :: status
    end function ftc_optim_delete
    function ftc_optim_step(o) result(status) bind(c, name="ftc_optim_step")
      import :: c_ptr, c_int
      type(c_ptr), value :: o
      integer(c_int) :: status
    end function ftc_optim_step
    function ftc_optim_step_closure(o, closure, context, loss) result(status) bind(c, name="ftc_optim_step_closure")
      import :: c_ptr, c_int, c_funptr, c_double
      type(c_ptr), value :: o, context
      type(c_funptr), value :: closure
      real(c_double), intent(out) :: loss
      integer(c_int) :: status
    end function ftc_optim_step_closure
    function ftc_optim_zero_grad(o, set_to_none) result(status) bind(c, name="ftc_optim_zero_grad")
      import :: c_ptr, c_int
      type(c_ptr), value :: o
      integer(c_int), value :: set_to_none
      integer(c_int) :: status
    end function ftc_optim_zero_grad
    function ftc_optim_get_lr(o, lr) result(status) bind(c, name="ftc_optim_get_lr")
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: o
      real(c_double), intent(out) :: lr
      integer(c_int) :: status
    end function ftc_optim_get_lr
    function ftc_optim_set_lr(o, lr) result(status) bind(c, name="ftc_optim_set_lr")
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: o
      real(c_double), value :: lr
      integer(c_int) :: status
    end function ftc_optim_set_lr
    function ftc_optim_step_count(o, steps) result(status) bind(c, name="ftc_optim_step_count")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: o
      integer(c_int64_t), intent(out) :: steps
      integer(c_int) :: status
    end function ftc_optim_step_count
    function ftc_optim_clip_grad_norm(o, max_norm, norm_type, total) result(status) &
        bind(c, name="ftc_optim_clip_grad_norm")
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: o
      real(c_double), value :: max_norm, norm_type
      real(c_double), intent(out) :: total
      integer(c_int) :: status
    end function ftc_optim_clip_grad_norm
    function ftc_optim_clip_grad_value(o, clip) result(status) bind(c, name="ftc_optim_clip_grad_value")
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: o
      real(c_double), value :: clip
      integer(c_int) :: status
    end function ftc_optim_clip_grad_value
    function ftc_scheduler_new(out, o, kind, params, n_params, milestones, n_milestones) result(status) &
        bind(c, name="ftc_scheduler_new")
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), intent(inout) :: out
      type(c_ptr), value :: o
      integer(c_int), value :: kind, n_params, n_milestones
      real(c_double), intent(in) :: params(*)
      integer(c_int64_t), intent(in) :: milestones(*)
      integer(c_int) :: status
    end function ftc_scheduler_new
    function ftc_scheduler_delete(s) result(status) bind(c, name="ftc_scheduler_delete")
      import :: c_ptr, c_int
      type(c_ptr), intent(inout) :: s
      integer(c_int) :: status
    end function ftc_scheduler_delete
    function ftc_scheduler_step(s, has_metric, metric) result(status) bind(c, name="ftc_scheduler_step")
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: s
      integer(c_int), value :: has_metric
      real(c_double), value :: metric
      integer(c_int) :: status
    end function ftc_scheduler_step
    function ftc_scheduler_last_lr(s, lr) result(status) bind(c, name="ftc_scheduler_last_lr")
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: s
      real(c_double), intent(out) :: lr
      integer(c_int) :: status
    end function ftc_scheduler_last_lr
  end interface

contains

  ! ------------------------------------------------------------------------------ optimizers

  subroutine new_optim(optim, kind, parameters, hyper, procedure, stat, errmsg)
    type(torch_optim), intent(inout) :: optim
    integer(c_int), intent(in) :: kind
    type(torch_tensor), intent(in) :: parameters(:)
    real(c_double), intent(in) :: hyper(:)
    character(len=*), intent(in) :: procedure
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: handles(size(parameters))
    integer :: i
    do i = 1, size(parameters)
      handles(i) = parameters(i)%p
    end do
    call ftorch_check(ftc_optim_new(optim%p, kind, handles, size(handles, kind=c_int64_t), hyper, &
                                    size(hyper, kind=c_int)), procedure, stat, errmsg)
  end subroutine new_optim

  !> Stochastic gradient descent (torch.optim.SGD). Fortran argument order as FTorch:
  !> learning_rate, momentum, weight_decay, dampening, nesterov.
  subroutine torch_optim_SGD(optim, parameters, learning_rate, momentum, weight_decay, dampening, nesterov, &
                             stat, errmsg)
    !> Replaced by the new optimizer (a handle it held is released first).
    type(torch_optim), intent(inout) :: optim
    type(torch_tensor), intent(in) :: parameters(:)   !< leaf tensors to update (e.g. torch_model_parameters)
    !> Hyperparameters as in torch.optim.SGD: learning_rate (default 1e-3), momentum, weight_decay
    !> (L2 penalty) and dampening (defaults 0).
    real(real64), intent(in), optional :: learning_rate, momentum, weight_decay, dampening
    !> Nesterov momentum (default .false.).
    logical, intent(in), optional :: nesterov
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_optim(optim, SGD, parameters, [opt(learning_rate, 1.0e-3_dp), opt(momentum, 0.0_dp), &
                   opt(dampening, 0.0_dp), opt(weight_decay, 0.0_dp), optflag(nesterov)], "torch_optim_SGD", stat, errmsg)
  end subroutine torch_optim_SGD

  !> Adam (torch.optim.Adam).
  subroutine torch_optim_Adam(optim, parameters, learning_rate, beta_1, beta_2, eps, weight_decay, amsgrad, &
                              stat, errmsg)
    !> Replaced by the new optimizer (a handle it held is released first).
    type(torch_optim), intent(inout) :: optim
    !> Leaf tensors to update (e.g. from torch_model_parameters).
    type(torch_tensor), intent(in) :: parameters(:)
    !> Hyperparameters as in torch.optim.Adam: learning_rate (default 1e-3), beta_1 and beta_2
    !> (the betas, defaults 0.9 and 0.999), eps (default 1e-8), weight_decay (L2 penalty, default 0).
    real(real64), intent(in), optional :: learning_rate, beta_1, beta_2, eps, weight_decay
    !> Use the AMSGrad variant (default .false.).
    logical, intent(in), optional :: amsgrad
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_optim(optim, ADAM, parameters, [opt(learning_rate, 1.0e-3_dp), opt(beta_1, 0.9_dp), opt(beta_2, 0.999_dp), &
                   opt(eps, 1.0e-8_dp), opt(weight_decay, 0.0_dp), optflag(amsgrad)], "torch_optim_Adam", stat, errmsg)
  end subroutine torch_optim_Adam

  !> AdamW (torch.optim.AdamW): decoupled weight decay, default 0.01.
  subroutine torch_optim_AdamW(optim, parameters, learning_rate, beta_1, beta_2, eps, weight_decay, amsgrad, &
                               stat, errmsg)
    !> Replaced by the new optimizer (a handle it held is released first).
    type(torch_optim), intent(inout) :: optim
    !> Leaf tensors to update (e.g. from torch_model_parameters).
    type(torch_tensor), intent(in) :: parameters(:)
    !> Hyperparameters as in torch.optim.AdamW: learning_rate (default 1e-3), beta_1 and beta_2
    !> (defaults 0.9 and 0.999), eps (default 1e-8), weight_decay (decoupled, default 0.01).
    real(real64), intent(in), optional :: learning_rate, beta_1, beta_2, eps, weight_decay
    !> Use the AMSGrad variant (default .false.).
    logical, intent(in), optional :: amsgrad
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_optim(optim, ADAMW, parameters, [opt(learning_rate, 1.0e-3_dp), opt(beta_1, 0.9_dp), opt(beta_2, 0.999_dp), &
                   opt(eps, 1.0e-8_dp), opt(weight_decay, 1.0e-2_dp), optflag(amsgrad)], "torch_optim_AdamW", stat, errmsg)
  end subroutine torch_optim_AdamW

  !> RMSprop (torch.optim.RMSprop).
  subroutine torch_optim_RMSprop(optim, parameters, learning_rate, alpha, eps, weight_decay, momentum, centered, &
                                 stat, errmsg)
    !> Replaced by the new optimizer (a handle it held is released first).
    type(torch_optim), intent(inout) :: optim
    !> Leaf tensors to update (e.g. from torch_model_parameters).
    type(torch_tensor), intent(in) :: parameters(:)
    !> Hyperparameters as in torch.optim.RMSprop: learning_rate (default 1e-2), alpha (smoothing
    !> constant, default 0.99), eps (default 1e-8), weight_decay and momentum (defaults 0).
    real(real64), intent(in), optional :: learning_rate, alpha, eps, weight_decay, momentum
    !> Normalize by an estimate of the gradient’s variance (default .false.).
    logical, intent(in), optional :: centered
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_optim(optim, RMSPROP, parameters, [opt(learning_rate, 1.0e-2_dp), opt(alpha, 0.99_dp), opt(eps, 1.0e-8_dp), &
                   opt(weight_decay, 0.0_dp), opt(momentum, 0.0_dp), optflag(centered)], "torch_optim_RMSprop", &
                   stat, errmsg)
  end subroutine torch_optim_RMSprop

  !> Adagrad (torch.optim.Adagrad).
  subroutine torch_optim_Adagrad(optim, parameters, learning_rate, lr_decay, weight_decay, &
                                 initial_accumulator_value, eps, stat, errmsg)
    !> Replaced by the new optimizer (a handle it held is released first).
    type(torch_optim), intent(inout) :: optim
    !> Leaf tensors to update (e.g. from torch_model_parameters).
    type(torch_tensor), intent(in) :: parameters(:)
    !> Hyperparameters as in torch.optim.Adagrad: learning_rate (default 1e-2), lr_decay,
    !> weight_decay and initial_accumulator_value (defaults 0), eps (default 1e-10).
    real(real64), intent(in), optional :: learning_rate, lr_decay, weight_decay, initial_accumulator_value, eps
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_optim(optim, ADAGRAD, parameters, [opt(learning_rate, 1.0e-2_dp), opt(lr_decay, 0.0_dp), &
                   opt(weight_decay, 0.0_dp), opt(initial_accumulator_value, 0.0_dp), opt(eps, 1.0e-10_dp)], &
                   "torch_optim_Adagrad", stat, errmsg)
  end subroutine torch_optim_Adagrad

  !> L-BFGS (torch.optim.LBFGS); step with torch_optim_step_closure.
  subroutine torch_optim_LBFGS(optim, parameters, learning_rate, max_iter, max_eval, tolerance_grad, &
                               tolerance_change, history_size, strong_wolfe, stat, errmsg)
    !> Replaced by the new optimizer (a handle it held is released first).
    type(torch_optim), intent(inout) :: optim
    !> Leaf tensors to update (e.g. from torch_model_parameters).
    type(torch_tensor), intent(in) :: parameters(:)
    !> As in torch.optim.LBFGS: learning_rate (default 1), tolerance_grad (default 1e-7) and
    !> tolerance_change (default 1e-9).
    real(real64), intent(in), optional :: learning_rate, tolerance_grad, tolerance_change
    !> As in torch.optim.LBFGS: max_iter (iterations per step, default 20), max_eval (loss
    !> evaluations per step, default max_iter*5/4), history_size (default 100).
    integer, intent(in), optional :: max_iter, max_eval, history_size
    logical, intent(in), optional :: strong_wolfe   !< line search "strong_wolfe" (default: none)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: iters, evals, history
    iters = 20
    if (present(max_iter)) iters = max_iter
    evals = 0   ! 0: PyTorch’s default, max_iter * 5 / 4
    if (present(max_eval)) evals = max_eval
    history = 100
    if (present(history_size)) history = history_size
    call new_optim(optim, LBFGS, parameters, [opt(learning_rate, 1.0_dp), iters, evals, opt(tolerance_grad, 1.0e-7_dp), &
                   opt(tolerance_change, 1.0e-9_dp), history, optflag(strong_wolfe)], "torch_optim_LBFGS", stat, errmsg)
  end subroutine torch_optim_LBFGS

  !> One optimization step from the current gradients.
  subroutine torch_optim_step(optim, stat, errmsg)
    !> A constructed optimizer.
    class(torch_optim), intent(in) :: optim
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_optim_step(optim%p), "torch_optim_step", stat, errmsg)
  end subroutine torch_optim_step

  !> One step of an optimizer that re-evaluates the loss (LBFGS): `closure` computes the loss;
  !> `loss` receives its value at the start of the step.
  recursive subroutine torch_optim_step_closure(optim, closure, loss, stat, errmsg)
    !> A constructed optimizer.
    class(torch_optim), intent(in) :: optim
    !> Computes the loss; called as many times as the optimizer needs.
    procedure(torch_closure) :: closure
    !> The loss at the start of the step.
    real(real64), intent(out), optional :: loss
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(closure_box) :: box
    real(c_double) :: value
    integer(c_int) :: status
    box%f => closure
    status = ftc_optim_step_closure(optim%p, c_funloc(closure_trampoline), callback_data(box), value)
    if (present(loss)) loss = value
    call ftorch_check(status, "torch_optim_step_closure", stat, errmsg)
  end subroutine torch_optim_step_closure

  ! Called by the C layer: runs the active closure and hands the loss handle over to C.
  recursive function closure_trampoline(context) result(handle) bind(c)
    type(c_ptr), value :: context
    type(c_ptr) :: handle
    type(torch_tensor) :: loss
    class(callback_box), pointer :: box
    box => callback_box_at(context)
    select type (box)
    type is (closure_box)
      call box%f(loss)
    end select
    handle = loss%p
    loss%p = c_null_ptr
  end function closure_trampoline

  logical function closure_same(box, other)
    class(closure_box), intent(in) :: box
    class(callback_box), intent(in) :: other
    closure_same = .false.
    select type (other)
    type is (closure_box)
      closure_same = associated(box%f, other%f)
    end select
  end function closure_same

  !> Clear the gradients of the optimizer’s parameters (to undefined, PyTorch’s default, or to
  !> zero with set_to_none=.false.).
  subroutine torch_optim_zero_grad(optim, set_to_none, stat, errmsg)
    !> A constructed optimizer.
    class(torch_optim), intent(in) :: optim
    !> .true. (default): the gradients become undefined; .false.: they are set to zero.
    logical, intent(in), optional :: set_to_none
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: flag
    flag = 1
    if (present(set_to_none)) then
      if (.not. set_to_none) flag = 0
    end if
    call ftorch_check(ftc_optim_zero_grad(optim%p, flag), "torch_optim_zero_grad", stat, errmsg)
  end subroutine torch_optim_zero_grad

  !> Current learning rate.
  function torch_optim_get_learning_rate(optim, stat, errmsg) result(lr)
    !> A constructed optimizer.
    type(torch_optim), intent(in) :: optim
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(real64) :: lr
    real(c_double) :: value
    value = 0
    call ftorch_check(ftc_optim_get_lr(optim%p, value), "torch_optim_get_learning_rate", stat, errmsg)
    lr = value
  end function torch_optim_get_learning_rate

  !> Set the learning rate (non-negative).
  subroutine torch_optim_set_learning_rate(optim, learning_rate, stat, errmsg)
    !> A constructed optimizer.
    type(torch_optim), intent(in) :: optim
    !> The new learning rate (>= 0).
    real(real64), intent(in) :: learning_rate
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_optim_set_lr(optim%p, real(learning_rate, c_double)), "torch_optim_set_learning_rate", &
                      stat, errmsg)
  end subroutine torch_optim_set_learning_rate

  !> Number of optimizer steps taken (restored by checkpoints).
  function torch_optim_step_count(optim, stat, errmsg) result(steps)
    !> A constructed optimizer.
    type(torch_optim), intent(in) :: optim
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: steps
    steps = 0
    call ftorch_check(ftc_optim_step_count(optim%p, steps), "torch_optim_step_count", stat, errmsg)
  end function torch_optim_step_count

  !> Scale the gradients so that their global norm is at most max_norm (clip_grad_norm_);
  !> total_norm receives the norm before clipping.
  subroutine torch_optim_clip_grad_norm(optim, max_norm, norm_type, total_norm, stat, errmsg)
    !> A constructed optimizer: its parameters’ gradients are clipped.
    type(torch_optim), intent(in) :: optim
    !> Largest norm allowed for all gradients together.
    real(real64), intent(in) :: max_norm
    real(real64), intent(in), optional :: norm_type   !< default 2
    !> The norm of all gradients together before clipping.
    real(real64), intent(out), optional :: total_norm
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: total
    total = 0
    call ftorch_check(ftc_optim_clip_grad_norm(optim%p, real(max_norm, c_double), opt(norm_type, 2.0_dp), total), &
                      "torch_optim_clip_grad_norm", stat, errmsg)
    if (present(total_norm)) total_norm = total
  end subroutine torch_optim_clip_grad_norm

  !> Clamp every gradient element to [-clip_value, clip_value] (clip_grad_value_).
  subroutine torch_optim_clip_grad_value(optim, clip_value, stat, errmsg)
    !> A constructed optimizer: its parameters’ gradients are clamped.
    type(torch_optim), intent(in) :: optim
    !> Largest magnitude allowed for a gradient element.
    real(real64), intent(in) :: clip_value
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_optim_clip_grad_value(optim%p, real(clip_value, c_double)), &
                      "torch_optim_clip_grad_value", stat, errmsg)
  end subroutine torch_optim_clip_grad_value

  ! `dst = src`: a second handle to the optimizer of src.
  impure elemental subroutine torch_optim_share(dst, src)
    !> Left-hand side: becomes a second handle to src’s optimizer (a handle it held is released).
    class(torch_optim), intent(inout) :: dst
    !> Right-hand side (unconstructed: dst becomes unconstructed too).
    type(torch_optim), intent(in) :: src
    call ftorch_check(ftc_optim_share(src%p, dst%p), "assignment(=)")
  end subroutine torch_optim_share

  ! Finalizer of scalars: frees the object, writing nothing (see ftorch_tensor_type’s finalize).
  subroutine finalize_optim(object)
    type(torch_optim), intent(inout) :: object
    call ftc_optim_release(object%p)
  end subroutine finalize_optim

  !> Free the optimizer and null its handle (a no-op if not constructed, or for a stale copy).
  impure elemental subroutine torch_optim_delete(optim)
    !> The optimizer (or, elementally, an array of them); its handle is null on return.
    type(torch_optim), intent(inout) :: optim
    integer(c_int) :: status
    status = ftc_optim_delete(optim%p)
  end subroutine torch_optim_delete

  ! ------------------------------------------------------------------------------ schedulers

  subroutine new_scheduler(scheduler, optim, kind, params, milestones, procedure, stat, errmsg)
    type(torch_scheduler), intent(inout) :: scheduler
    type(torch_optim), intent(in) :: optim
    integer(c_int), intent(in) :: kind
    real(c_double), intent(in) :: params(:)
    integer(c_int64_t), intent(in) :: milestones(:)
    character(len=*), intent(in) :: procedure
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_scheduler_new(scheduler%p, optim%p, kind, params, size(params, kind=c_int), milestones, &
                                        size(milestones, kind=c_int)), procedure, stat, errmsg)
  end subroutine new_scheduler

  !> Multiply the learning rate by gamma every step_size steps (StepLR).
  subroutine torch_scheduler_step_lr(scheduler, optim, step_size, gamma, stat, errmsg)
    !> Replaced by the new scheduler (a handle it held is released first).
    type(torch_scheduler), intent(inout) :: scheduler
    !> The optimizer whose learning rate is scheduled (kept alive by the scheduler).
    type(torch_optim), intent(in) :: optim
    !> Number of scheduler steps between two decays.
    integer, intent(in) :: step_size
    real(real64), intent(in), optional :: gamma   !< default 0.1
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_scheduler(scheduler, optim, SCHED_STEP, [real(step_size, c_double), opt(gamma, 0.1_dp)], &
                       [integer(c_int64_t) ::], "torch_scheduler_step_lr", stat, errmsg)
  end subroutine torch_scheduler_step_lr

  !> Multiply the learning rate by gamma at each milestone step (MultiStepLR).
  subroutine torch_scheduler_multistep_lr(scheduler, optim, milestones, gamma, stat, errmsg)
    !> Replaced by the new scheduler (a handle it held is released first).
    type(torch_scheduler), intent(inout) :: scheduler
    !> The optimizer whose learning rate is scheduled (kept alive by the scheduler).
    type(torch_optim), intent(in) :: optim
    !> Scheduler step counts at which the rate decays, increasing.
    integer, intent(in) :: milestones(:)
    !> Decay factor (default 0.1).
    real(real64), intent(in), optional :: gamma
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_scheduler(scheduler, optim, SCHED_MULTISTEP, [opt(gamma, 0.1_dp)], int(milestones, c_int64_t), &
                       "torch_scheduler_multistep_lr", stat, errmsg)
  end subroutine torch_scheduler_multistep_lr

  !> Multiply the learning rate by gamma every step (ExponentialLR).
  subroutine torch_scheduler_exponential_lr(scheduler, optim, gamma, stat, errmsg)
    !> Replaced by the new scheduler (a handle it held is released first).
    type(torch_scheduler), intent(inout) :: scheduler
    !> The optimizer whose learning rate is scheduled (kept alive by the scheduler).
    type(torch_optim), intent(in) :: optim
    !> Decay factor per step.
    real(real64), intent(in) :: gamma
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_scheduler(scheduler, optim, SCHED_EXPONENTIAL, [real(gamma, c_double)], [integer(c_int64_t) ::], &
                       "torch_scheduler_exponential_lr", stat, errmsg)
  end subroutine torch_scheduler_exponential_lr

  !> Cosine annealing from the initial rate to eta_min over T_max steps (CosineAnnealingLR).
  subroutine torch_scheduler_cosine_annealing_lr(scheduler, optim, T_max, eta_min, stat, errmsg)
    !> Replaced by the new scheduler (a handle it held is released first).
    type(torch_scheduler), intent(inout) :: scheduler
    !> The optimizer whose learning rate is scheduled (kept alive by the scheduler).
    type(torch_optim), intent(in) :: optim
    !> Number of scheduler steps of the half cosine period.
    integer, intent(in) :: T_max
    !> Smallest learning rate (default 0).
    real(real64), intent(in), optional :: eta_min
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call new_scheduler(scheduler, optim, SCHED_COSINE, [real(T_max, c_double), opt(eta_min, 0.0_dp)], &
                       [integer(c_int64_t) ::], "torch_scheduler_cosine_annealing_lr", stat, errmsg)
  end subroutine torch_scheduler_cosine_annealing_lr

  !> Linear warm-up: the rate goes from start_factor to end_factor times the initial rate over
  !> total_iters steps (LinearLR).
  subroutine torch_scheduler_linear_lr(scheduler, optim, start_factor, end_factor, total_iters, stat, errmsg)
    !> Replaced by the new scheduler (a handle it held is released first).
    type(torch_scheduler), intent(inout) :: scheduler
    !> The optimizer whose learning rate is scheduled (kept alive by the scheduler).
    type(torch_optim), intent(in) :: optim
    real(real64), intent(in), optional :: start_factor, end_factor   !< defaults 1/3 and 1
    integer, intent(in), optional :: total_iters                      !< default 5
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: iters
    iters = 5
    if (present(total_iters)) iters = total_iters
    call new_scheduler(scheduler, optim, SCHED_LINEAR, [opt(start_factor, 1.0_dp / 3.0_dp), opt(end_factor, 1.0_dp), &
                       iters], [integer(c_int64_t) ::], "torch_scheduler_linear_lr", stat, errmsg)
  end subroutine torch_scheduler_linear_lr

  !> Reduce the learning rate when a metric stops improving (ReduceLROnPlateau); step it with the
  !> metric. mode "min" or "max", threshold_mode "rel" or "abs".
  subroutine torch_scheduler_reduce_on_plateau(scheduler, optim, mode, factor, patience, threshold, &
                                               threshold_mode, cooldown, min_lr, eps, stat, errmsg)
    !> Replaced by the new scheduler (a handle it held is released first).
    type(torch_scheduler), intent(inout) :: scheduler
    !> The optimizer whose learning rate is scheduled (kept alive by the scheduler).
    type(torch_optim), intent(in) :: optim
    !> The `mode`, "min" (default: the metric should decrease) or "max", and the
    !> `threshold_mode`, "rel" (default) or "abs": how `threshold` measures an improvement.
    character(len=*), intent(in), optional :: mode, threshold_mode
    !> As in ReduceLROnPlateau: factor (of each reduction, default 0.1), threshold (default 1e-4),
    !> min_lr (default 0), eps (smallest change of the rate applied, default 1e-8).
    real(real64), intent(in), optional :: factor, threshold, min_lr, eps
    !> The `patience`, steps without improvement before a reduction (default 10), and the
    !> `cooldown`, steps to wait after a reduction (default 0).
    integer, intent(in), optional :: patience, cooldown
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: mode_code, threshold_code, patience_value, cooldown_value
    mode_code = 0
    if (present(mode)) then
      select case (mode)
      case ("min")
      case ("max")
        mode_code = 1
      case default
        call ftorch_fail(FTORCH_ERR_INVALID_ARGUMENT, "torch_scheduler_reduce_on_plateau", &
                         "mode must be ""min"" or ""max""", stat, errmsg)
        return
      end select
    end if
    threshold_code = 0
    if (present(threshold_mode)) then
      select case (threshold_mode)
      case ("rel")
      case ("abs")
        threshold_code = 1
      case default
        call ftorch_fail(FTORCH_ERR_INVALID_ARGUMENT, "torch_scheduler_reduce_on_plateau", &
                         "threshold_mode must be ""rel"" or ""abs""", stat, errmsg)
        return
      end select
    end if
    patience_value = 10
    if (present(patience)) patience_value = patience
    cooldown_value = 0
    if (present(cooldown)) cooldown_value = cooldown
    call new_scheduler(scheduler, optim, SCHED_PLATEAU, [mode_code, opt(factor, 0.1_dp), patience_value, &
                       opt(threshold, 1.0e-4_dp), threshold_code, cooldown_value, opt(min_lr, 0.0_dp), opt(eps, 1.0e-8_dp)], &
                       [integer(c_int64_t) ::], "torch_scheduler_reduce_on_plateau", stat, errmsg)
  end subroutine torch_scheduler_reduce_on_plateau

  !> Advance the schedule by one step (after the optimizer’s step, as in PyTorch); reduce-on-
  !> plateau needs `metric` (e.g. the loss).
  subroutine torch_scheduler_step(scheduler, metric, stat, errmsg)
    !> A constructed scheduler.
    class(torch_scheduler), intent(in) :: scheduler
    !> The monitored value: required by a reduce-on-plateau scheduler, ignored by the others.
    real(real64), intent(in), optional :: metric
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: has_metric
    has_metric = 0
    if (present(metric)) has_metric = 1
    call ftorch_check(ftc_scheduler_step(scheduler%p, has_metric, opt(metric, 0.0_dp)), "torch_scheduler_step", &
                      stat, errmsg)
  end subroutine torch_scheduler_step

  !> The learning rate the schedule last set.
  function torch_scheduler_get_last_lr(scheduler, stat, errmsg) result(lr)
    !> A constructed scheduler.
    type(torch_scheduler), intent(in) :: scheduler
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(real64) :: lr
    real(c_double) :: value
    value = 0
    call ftorch_check(ftc_scheduler_last_lr(scheduler%p, value), "torch_scheduler_get_last_lr", stat, errmsg)
    lr = value
  end function torch_scheduler_get_last_lr

  ! `dst = src`: a second handle to the scheduler of src.
  impure elemental subroutine torch_scheduler_share(dst, src)
    !> Left-hand side: becomes a second handle to src’s scheduler (a handle it held is released).
    class(torch_scheduler), intent(inout) :: dst
    !> Right-hand side (unconstructed: dst becomes unconstructed too).
    type(torch_scheduler), intent(in) :: src
    call ftorch_check(ftc_scheduler_share(src%p, dst%p), "assignment(=)")
  end subroutine torch_scheduler_share

  ! Finalizer of scalars: frees the object, writing nothing (see ftorch_tensor_type’s finalize).
  subroutine finalize_scheduler(object)
    type(torch_scheduler), intent(inout) :: object
    call ftc_scheduler_release(object%p)
  end subroutine finalize_scheduler

  !> Free the scheduler and null its handle (a no-op if not constructed, or for a stale copy).
  impure elemental subroutine torch_scheduler_delete(scheduler)
    !> The scheduler (or, elementally, an array of them); its handle is null on return.
    type(torch_scheduler), intent(inout) :: scheduler
    integer(c_int) :: status
    status = ftc_scheduler_delete(scheduler%p)
  end subroutine torch_scheduler_delete

  ! ------------------------------------------------------------------------------ helpers

  real(c_double) function opt(value, default)
    real(real64), intent(in), optional :: value
    real(real64), intent(in) :: default
    opt = default
    if (present(value)) opt = value
  end function opt

  real(c_double) function optflag(value)
    logical, intent(in), optional :: value
    optflag = 0
    if (present(value)) then
      if (value) optflag = 1
    end if
  end function optflag
end module ftorch_optim
