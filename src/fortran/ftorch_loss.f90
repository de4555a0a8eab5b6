!> Loss functions with torch.nn.functional’s semantics. Each writes its result into `loss_tensor`
!> as `=` does: into its storage when constructed (an aliased array receives the value, and the
!> autograd history is carried so that backward(loss_tensor) works), or as a new tensor.
module ftorch_loss
  use, intrinsic :: iso_c_binding, only: c_double, c_int, c_int64_t, c_null_ptr, c_ptr
  use ftorch_kinds, only: real64
  use ftorch_errors, only: ftorch_check
  use ftorch_types, only: torch_kNone, torch_kMean, torch_kSum
  use ftorch_tensor_type, only: torch_tensor
  implicit none
  ! Kind of the real literals below (double precision whatever -fdefault-real-8 or -fdefault-double-8 say).
  integer, parameter :: dp = c_double
  private

  public :: torch_loss_mse, torch_loss_cross_entropy, torch_loss_l1, torch_loss_huber, torch_loss_smooth_l1, &
            torch_loss_nll, torch_loss_bce_with_logits
  public :: torch_kNone, torch_kMean, torch_kSum

  !> Loss kinds, for torch_train_step.
  enum, bind(c)
    !> The loss computed by torch_loss_mse, torch_loss_l1, torch_loss_huber, torch_loss_smooth_l1,
    !> torch_loss_cross_entropy, torch_loss_nll and torch_loss_bce_with_logits respectively.
    enumerator :: torch_kMSELoss = 0, torch_kL1Loss = 1, torch_kHuberLoss = 2, torch_kSmoothL1Loss = 3, &
                  torch_kCrossEntropyLoss = 4, torch_kNLLLoss = 5, torch_kBCEWithLogitsLoss = 6
  end enum
  public :: torch_kMSELoss, torch_kL1Loss, torch_kHuberLoss, torch_kSmoothL1Loss, torch_kCrossEntropyLoss, &
            torch_kNLLLoss, torch_kBCEWithLogitsLoss

  interface
    function ftc_loss(kind, input, target, weight, pos_weight, reduction, ignore_index, param, label_smoothing, out) &
        result(status) bind(c, name="ftc_loss")
      import :: c_ptr, c_int, c_int64_t, c_double
      integer(c_int), value :: kind, reduction
      type(c_ptr), value :: input, target, weight, pos_weight
      integer(c_int64_t), value :: ignore_index
      real(c_double), value :: param, label_smoothing
      type(c_ptr), intent(inout) :: out
      integer(c_int) :: status
    end function ftc_loss
  end interface

contains

  subroutine compute(kind, loss_tensor, input_tensor, target_tensor, reduction_type, weight, pos_weight, &
                     ignore_index, param, label_smoothing, procedure, stat, errmsg)
    integer(c_int), intent(in) :: kind
    type(torch_tensor), intent(inout) :: loss_tensor
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    integer, intent(in), optional :: reduction_type, ignore_index
    type(torch_tensor), intent(in), optional :: weight, pos_weight
    real(real64), intent(in) :: param
    real(real64), intent(in), optional :: label_smoothing
    character(len=*), intent(in) :: procedure
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: w, pw
    integer(c_int) :: reduction
    integer(c_int64_t) :: ignore
    real(c_double) :: smoothing
    reduction = torch_kMean
    if (present(reduction_type)) reduction = int(reduction_type, c_int)
    ignore = -100
    if (present(ignore_index)) ignore = ignore_index
    smoothing = 0
    if (present(label_smoothing)) smoothing = label_smoothing
    w = c_null_ptr
    if (present(weight)) w = weight%p
    pw = c_null_ptr
    if (present(pos_weight)) pw = pos_weight%p
    call ftorch_check(ftc_loss(kind, input_tensor%p, target_tensor%p, w, pw, reduction, ignore, real(param, c_double), &
                               smoothing, loss_tensor%p), procedure, stat, errmsg)
  end subroutine compute

  !> Mean squared error (F.mse_loss); input and target of the same shape.
  subroutine torch_loss_mse(loss_tensor, input_tensor, target_tensor, reduction_type, stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The prediction and the target.
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    integer, intent(in), optional :: reduction_type   !< torch_kNone, torch_kMean (default), torch_kSum
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call compute(torch_kMSELoss, loss_tensor, input_tensor, target_tensor, reduction_type, param=0.0_dp, &
                 procedure="torch_loss_mse", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_mse

  !> Mean absolute error (F.l1_loss).
  subroutine torch_loss_l1(loss_tensor, input_tensor, target_tensor, reduction_type, stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The prediction and the target, of the same shape.
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    !> torch_kNone, torch_kMean (default) or torch_kSum.
    integer, intent(in), optional :: reduction_type
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call compute(torch_kL1Loss, loss_tensor, input_tensor, target_tensor, reduction_type, param=0.0_dp, &
                 procedure="torch_loss_l1", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_l1

  !> Huber loss (F.huber_loss), quadratic below delta (default 1), linear above.
  subroutine torch_loss_huber(loss_tensor, input_tensor, target_tensor, reduction_type, delta, stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The prediction and the target, of the same shape.
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    !> torch_kNone, torch_kMean (default) or torch_kSum.
    integer, intent(in), optional :: reduction_type
    !> Where the loss turns from quadratic to linear (> 0, default 1).
    real(real64), intent(in), optional :: delta
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(real64) :: d
    d = 1.0_dp
    if (present(delta)) d = delta
    call compute(torch_kHuberLoss, loss_tensor, input_tensor, target_tensor, reduction_type, param=d, &
                 procedure="torch_loss_huber", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_huber

  !> Smooth L1 loss (F.smooth_l1_loss) with threshold beta (default 1).
  subroutine torch_loss_smooth_l1(loss_tensor, input_tensor, target_tensor, reduction_type, beta, stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The prediction and the target, of the same shape.
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    !> torch_kNone, torch_kMean (default) or torch_kSum.
    integer, intent(in), optional :: reduction_type
    !> Where the loss turns from quadratic to linear (>= 0, default 1).
    real(real64), intent(in), optional :: beta
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    real(real64) :: b
    b = 1.0_dp
    if (present(beta)) b = beta
    call compute(torch_kSmoothL1Loss, loss_tensor, input_tensor, target_tensor, reduction_type, param=b, &
                 procedure="torch_loss_smooth_l1", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_smooth_l1

  !> Cross entropy (F.cross_entropy) of logits [N, C] (or [C]) against class indices (int64) or
  !> class probabilities (same shape as the input).
  subroutine torch_loss_cross_entropy(loss_tensor, input_tensor, target_tensor, reduction_type, weight, &
                                      ignore_index, label_smoothing, stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The logits and the target (class indices or probabilities).
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    !> torch_kNone, torch_kMean (default) or torch_kSum.
    integer, intent(in), optional :: reduction_type
    type(torch_tensor), intent(in), optional :: weight        !< class weights [C]
    integer, intent(in), optional :: ignore_index             !< a class index whose targets are ignored
    real(real64), intent(in), optional :: label_smoothing     !< in [0, 1]
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call compute(torch_kCrossEntropyLoss, loss_tensor, input_tensor, target_tensor, reduction_type, weight, &
                 ignore_index=ignore_index, param=0.0_dp, label_smoothing=label_smoothing, &
                 procedure="torch_loss_cross_entropy", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_cross_entropy

  !> Negative log-likelihood (F.nll_loss) of log-probabilities [N, C] against class indices.
  subroutine torch_loss_nll(loss_tensor, input_tensor, target_tensor, reduction_type, weight, ignore_index, &
                            stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The log-probabilities and the target class indices (int64).
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    !> torch_kNone, torch_kMean (default) or torch_kSum.
    integer, intent(in), optional :: reduction_type
    !> Class weights [C] (default: all 1).
    type(torch_tensor), intent(in), optional :: weight
    !> A class index whose targets are ignored (default -100).
    integer, intent(in), optional :: ignore_index
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call compute(torch_kNLLLoss, loss_tensor, input_tensor, target_tensor, reduction_type, weight, &
                 ignore_index=ignore_index, param=0.0_dp, procedure="torch_loss_nll", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_nll

  !> Binary cross entropy on logits (F.binary_cross_entropy_with_logits).
  subroutine torch_loss_bce_with_logits(loss_tensor, input_tensor, target_tensor, reduction_type, weight, &
                                        pos_weight, stat, errmsg)
    !> Receives the loss, as `=` does (see the module’s description).
    type(torch_tensor), intent(inout) :: loss_tensor
    !> The logits and the targets (probabilities in [0, 1], same shape).
    type(torch_tensor), intent(in) :: input_tensor, target_tensor
    !> torch_kNone, torch_kMean (default) or torch_kSum.
    integer, intent(in), optional :: reduction_type
    !> Rescaling weights of each element’s loss, and weights of the positive examples per class,
    !> broadcast against the input (defaults: none).
    type(torch_tensor), intent(in), optional :: weight, pos_weight
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call compute(torch_kBCEWithLogitsLoss, loss_tensor, input_tensor, target_tensor, reduction_type, weight, &
                 pos_weight, param=0.0_dp, procedure="torch_loss_bce_with_logits", stat=stat, errmsg=errmsg)
  end subroutine torch_loss_bce_with_logits
end module ftorch_loss
