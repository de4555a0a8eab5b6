!> Versions, device availability and the live-handle count (for leak checks).
module ftorch_runtime
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_ptr
  use ftorch_errors, only: ftorch_check
  use ftorch_interop, only: f_string
  use ftorch_c_api, only: ftc_check_runtime, ftc_device_available, ftc_live_handles, &
                            ftc_manual_seed, ftc_torch_version_built, ftc_torch_version_runtime, &
                            ftc_version
  implicit none
  private
  public :: ftorch_version, ftorch_torch_version, ftorch_runtime_torch_version, &
            ftorch_check_runtime, torch_device_available, ftorch_live_handles, torch_manual_seed

contains

  !> Version of this FTorch.
  function ftorch_version() result(v)
    character(len=:), allocatable :: v
    v = f_string(ftc_version())
  end function ftorch_version

  !> The torch release the C++ layer was built against.
  function ftorch_torch_version() result(v)
    character(len=:), allocatable :: v
    v = f_string(ftc_torch_version_built())
  end function ftorch_torch_version

  !> The torch release whose LibTorch is loaded in this process ("" if unknown).
  function ftorch_runtime_torch_version() result(v)
    character(len=:), allocatable :: v
    v = f_string(ftc_torch_version_runtime())
  end function ftorch_runtime_torch_version

  !> Check that the loaded LibTorch is the one FTorch was built against.
  subroutine ftorch_check_runtime(stat, errmsg)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_check_runtime(), "ftorch_check_runtime", stat, errmsg)
  end subroutine ftorch_check_runtime

  !> Whether a device of this type (torch_kCPU, torch_kCUDA, ...) and index can be used.
  logical function torch_device_available(device_type, device_index)
    !> Device type: `torch_kCPU`, `torch_kCUDA`, `torch_kHIP`, `torch_kXPU` or `torch_kMPS`.
    integer(c_int), intent(in) :: device_type
    !> Index of the device (0-based); absent asks for the device type’s default device.
    integer, intent(in), optional :: device_index
    integer(c_int) :: idx
    idx = -1
    if (present(device_index)) idx = int(device_index, c_int)
    torch_device_available = ftc_device_available(device_type, idx) /= 0
  end function torch_device_available

  !> Seed the random-number generators LibTorch draws from (CPU and GPUs), as torch.manual_seed
  !> does: the same seed gives the same dropout masks and random tensors, in compiled training
  !> packages too.
  subroutine torch_manual_seed(seed, stat, errmsg)
    !> The seed (a non-negative integer).
    integer, intent(in) :: seed
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_manual_seed(int(seed, c_int64_t)), "torch_manual_seed", stat, errmsg)
  end subroutine torch_manual_seed

  !> Number of tensor and model handles currently alive.
  function ftorch_live_handles() result(n)
    integer(c_int64_t) :: n
    n = ftc_live_handles()
  end function ftorch_live_handles

end module ftorch_runtime
