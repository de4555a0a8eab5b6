!> FTorch communicators over MPI. This module is compiled in *your* build with *your* MPI
!> (`use mpi_f08`), so FTorch itself never links an MPI library and works with any MPI
!> implementation: CMake `FTorch::ftorch_mpi` (find_package(FTorch COMPONENTS MPI)), the fpm
!> package `ftorch_mpi`, or this file compiled with mpif90 (pkg-config variable
!> `fortran_mpi_source`).
!>
!> `torch_comm_init(comm, communicator)` takes any communicator the program has (MPI_COMM_WORLD, or
!> a sub-communicator of the ranks that train), as `type(MPI_Comm)` (mpi_f08) or as an integer
!> handle (`use mpi`, mpif.h). FTorch works on a duplicate of it, with MPI_ERRORS_RETURN, so its
!> collectives never mix with the program’s messages and MPI errors come back as
!> `stat`/`errmsg` (FTORCH_ERR_DISTRIBUTED) rather than aborting.
module ftorch_mpi
  use, intrinsic :: iso_c_binding, only: c_char, c_f_pointer, c_funloc, c_funptr, c_int, c_int64_t, c_int8_t, &
                                         c_null_char, c_ptr
  use mpi_f08
  use ftorch_types, only: torch_kUInt8, torch_kInt8, torch_kInt16, torch_kInt32, torch_kInt64, torch_kFloat32, &
                          torch_kFloat64
  use ftorch_errors, only: ftorch_check, ftorch_fail, FTORCH_ERR_DISTRIBUTED, FTORCH_ERR_INVALID_ARGUMENT
  use ftorch_distributed, only: torch_comm, torch_kReduceSum, torch_kReduceMax, torch_kReduceMin
  implicit none
  private
  public :: torch_comm, torch_comm_init

  !> Make `comm` a communicator over the ranks of an MPI communicator (collective over it).
  !> device_aware = .true. when the MPI is CUDA-aware: buffers of CUDA tensors are then handed to
  !> MPI as they are; otherwise (default) they are staged through host memory.
  interface torch_comm_init
    module procedure init_f08, init_integer
  end interface torch_comm_init

  ! FTorch’s duplicates of the users’ communicators; the C layer refers to them by index.
  type(MPI_Comm), allocatable, save :: comms(:)

  interface
    function ftc_comm_new(out, ctx, rank, size, device_aware, allreduce, broadcast, allgather, barrier, free_fn) &
        result(status) bind(c, name="ftc_comm_new")
      import :: c_ptr, c_int, c_int64_t, c_funptr
      type(c_ptr), intent(inout) :: out
      integer(c_int64_t), value :: ctx
      integer(c_int), value :: rank, size, device_aware
      type(c_funptr), value :: allreduce, broadcast, allgather, barrier, free_fn
      integer(c_int) :: status
    end function ftc_comm_new
  end interface

contains

  subroutine init_f08(comm, communicator, device_aware, stat, errmsg)
    !> Replaced by the new FTorch communicator (a handle it held is released first).
    type(torch_comm), intent(inout) :: comm
    !> The ranks to communicate over: MPI_COMM_WORLD or any communicator of the program’s.
    type(MPI_Comm), intent(in) :: communicator
    !> .true. if the MPI library is CUDA-aware (default .false.: CUDA buffers go through the host).
    logical, intent(in), optional :: device_aware
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    character(len=MPI_MAX_ERROR_STRING) :: text
    type(MPI_Comm) :: dup
    logical :: initialized, finalized
    integer :: ierr, rank, size, slot, n, ignored
    integer(c_int) :: aware
    call MPI_Initialized(initialized, ierr)
    call MPI_Finalized(finalized, ierr)
    if (.not. initialized .or. finalized) then
      call ftorch_fail(FTORCH_ERR_DISTRIBUTED, "torch_comm_init", &
                       "MPI is not initialized (or already finalized): call MPI_Init first", stat, errmsg)
      return
    end if
    if (communicator == MPI_COMM_NULL) then
      call ftorch_fail(FTORCH_ERR_INVALID_ARGUMENT, "torch_comm_init", &
                       "the MPI communicator is MPI_COMM_NULL (this rank is not part of it)", stat, errmsg)
      return
    end if
    call MPI_Comm_dup(communicator, dup, ierr)
    if (ierr /= MPI_SUCCESS) then
      call MPI_Error_string(ierr, text, n, ignored)
      call ftorch_fail(FTORCH_ERR_DISTRIBUTED, "torch_comm_init", "MPI_Comm_dup failed: " // text(1:n), stat, errmsg)
      return
    end if
    call MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN, ierr)
    call MPI_Comm_rank(dup, rank, ierr)
    call MPI_Comm_size(dup, size, ierr)
    slot = free_slot()
    comms(slot) = dup
    aware = 0
    if (present(device_aware)) then
      if (device_aware) aware = 1
    end if
    call ftorch_check(ftc_comm_new(comm%p, int(slot, c_int64_t), int(rank, c_int), int(size, c_int), aware, &
                                   c_funloc(mpi_allreduce_cb), c_funloc(mpi_broadcast_cb), c_funloc(mpi_allgather_cb), &
                                   c_funloc(mpi_barrier_cb), c_funloc(mpi_free_cb)), "torch_comm_init", stat, errmsg)
  end subroutine init_f08

  subroutine init_integer(comm, communicator, device_aware, stat, errmsg)
    !> Replaced by the new FTorch communicator (a handle it held is released first).
    type(torch_comm), intent(inout) :: comm
    !> The ranks to communicate over, as an integer handle (`use mpi` or mpif.h).
    integer, intent(in) :: communicator
    !> .true. if the MPI library is CUDA-aware (default .false.: CUDA buffers go through the host).
    logical, intent(in), optional :: device_aware
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(MPI_Comm) :: handle
    handle%MPI_VAL = communicator
    call init_f08(comm, handle, device_aware, stat, errmsg)
  end subroutine init_integer

  integer function free_slot() result(slot)
    type(MPI_Comm), allocatable :: grown(:)
    integer :: i
    if (.not. allocated(comms)) then
      allocate(comms(4))
      comms = MPI_COMM_NULL
    end if
    do i = 1, size(comms)
      if (comms(i) == MPI_COMM_NULL) then
        slot = i
        return
      end if
    end do
    allocate(grown(2 * size(comms)))
    grown = MPI_COMM_NULL
    grown(1:size(comms)) = comms
    slot = size(comms) + 1
    call move_alloc(grown, comms)
  end function free_slot

  ! ------------------------------------------------------------------------------ the collectives
  ! Called by FTorch’s C layer (ftorch_c_distributed.h); buffers are contiguous.

  integer(c_int) function mpi_allreduce_cb(ctx, buf, count, dtype, op, msg, msglen) result(status) bind(c)
    integer(c_int64_t), value :: ctx, count, msglen
    type(c_ptr), value :: buf, msg
    integer(c_int), value :: dtype, op
    integer(c_int8_t), pointer :: bytes(:)
    type(MPI_Op) :: reduction
    integer :: ierr
    select case (op)
    case (torch_kReduceSum)
      reduction = MPI_SUM
    case (torch_kReduceMax)
      reduction = MPI_MAX
    case (torch_kReduceMin)
      reduction = MPI_MIN
    case default
      status = report(MPI_ERR_OP, "MPI_Allreduce", msg, msglen)
      return
    end select
    call c_f_pointer(buf, bytes, [count * element_size(dtype)])
    call MPI_Allreduce(MPI_IN_PLACE, bytes, int(count), datatype(dtype), reduction, comms(ctx), ierr)
    status = report(ierr, "MPI_Allreduce", msg, msglen)
  end function mpi_allreduce_cb

  integer(c_int) function mpi_broadcast_cb(ctx, buf, count, dtype, root, msg, msglen) result(status) bind(c)
    integer(c_int64_t), value :: ctx, count, msglen
    type(c_ptr), value :: buf, msg
    integer(c_int), value :: dtype, root
    integer(c_int8_t), pointer :: bytes(:)
    integer :: ierr
    call c_f_pointer(buf, bytes, [count * element_size(dtype)])
    call MPI_Bcast(bytes, int(count), datatype(dtype), int(root), comms(ctx), ierr)
    status = report(ierr, "MPI_Bcast", msg, msglen)
  end function mpi_broadcast_cb

  integer(c_int) function mpi_allgather_cb(ctx, send, recv, count, dtype, msg, msglen) result(status) bind(c)
    integer(c_int64_t), value :: ctx, count, msglen
    type(c_ptr), value :: send, recv, msg
    integer(c_int), value :: dtype
    integer(c_int8_t), pointer :: sent(:), received(:)
    integer :: ierr, size
    call MPI_Comm_size(comms(ctx), size, ierr)
    call c_f_pointer(send, sent, [count * element_size(dtype)])
    call c_f_pointer(recv, received, [count * element_size(dtype) * size])
    call MPI_Allgather(sent, int(count), datatype(dtype), received, int(count), datatype(dtype), comms(ctx), ierr)
    status = report(ierr, "MPI_Allgather", msg, msglen)
  end function mpi_allgather_cb

  integer(c_int) function mpi_barrier_cb(ctx, msg, msglen) result(status) bind(c)
    integer(c_int64_t), value :: ctx, msglen
    type(c_ptr), value :: msg
    integer :: ierr
    call MPI_Barrier(comms(ctx), ierr)
    status = report(ierr, "MPI_Barrier", msg, msglen)
  end function mpi_barrier_cb

  ! The last handle went away: free the duplicate, unless MPI is finalized (then it is gone).
  subroutine mpi_free_cb(ctx) bind(c)
    integer(c_int64_t), value :: ctx
    logical :: finalized
    integer :: ierr
    if (.not. allocated(comms)) return
    if (ctx < 1 .or. ctx > size(comms)) return
    call MPI_Finalized(finalized, ierr)
    if (.not. finalized .and. comms(ctx) /= MPI_COMM_NULL) call MPI_Comm_free(comms(ctx), ierr)
    comms(ctx) = MPI_COMM_NULL
  end subroutine mpi_free_cb

  type(MPI_Datatype) function datatype(dtype)
    integer(c_int), intent(in) :: dtype
    select case (dtype)
    case (torch_kInt8)
      datatype = MPI_INT8_T
    case (torch_kInt16)
      datatype = MPI_INT16_T
    case (torch_kInt32)
      datatype = MPI_INT32_T
    case (torch_kInt64)
      datatype = MPI_INT64_T
    case (torch_kFloat32)
      datatype = MPI_FLOAT
    case (torch_kFloat64)
      datatype = MPI_DOUBLE
    case default
      datatype = MPI_UINT8_T
    end select
  end function datatype

  integer(c_int64_t) function element_size(dtype)
    integer(c_int), intent(in) :: dtype
    select case (dtype)
    case (torch_kInt16)
      element_size = 2
    case (torch_kInt32, torch_kFloat32)
      element_size = 4
    case (torch_kInt64, torch_kFloat64)
      element_size = 8
    case default
      element_size = 1
    end select
  end function element_size

  ! 0 for MPI_SUCCESS; otherwise MPI’s error text into the C layer’s message buffer.
  integer(c_int) function report(ierr, what, msg, msglen) result(status)
    integer, intent(in) :: ierr
    character(len=*), intent(in) :: what
    type(c_ptr), intent(in) :: msg
    integer(c_int64_t), intent(in) :: msglen
    character(kind=c_char), pointer :: chars(:)
    character(len=MPI_MAX_ERROR_STRING) :: text
    character(len=:), allocatable :: line
    integer :: n, ignored, i, m
    status = 0
    if (ierr == MPI_SUCCESS) return
    status = int(ierr, c_int)
    text = ""
    n = 0
    call MPI_Error_string(ierr, text, n, ignored)
    line = what // ": " // text(1:max(n, 0))
    call c_f_pointer(msg, chars, [msglen])
    m = int(min(int(len(line), c_int64_t), msglen - 1))
    do i = 1, m
      chars(i) = line(i:i)
    end do
    chars(m + 1) = c_null_char
  end function report

end module ftorch_mpi
