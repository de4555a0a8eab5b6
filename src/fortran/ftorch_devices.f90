!> Device enumerators. The device is chosen at run time; asking for one that is not available
!> is an error (never a silent fall-back to the CPU).
module ftorch_devices
  implicit none
  public

  enum, bind(c)
    enumerator :: torch_kCPU = 0
    !> CUDA and HIP (ROCm) share a value: LibTorch exposes HIP devices as CUDA devices.
    enumerator :: torch_kCUDA = 1
    enumerator :: torch_kHIP = 1
    enumerator :: torch_kXPU = 12
    enumerator :: torch_kMPS = 13
  end enum
end module ftorch_devices
