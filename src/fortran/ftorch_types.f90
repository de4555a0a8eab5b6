!> Kinds and enumerators shared by all FTorch modules: dtypes, loss reductions, `ftorch_int`.
module ftorch_types
  use, intrinsic :: iso_c_binding, only: c_int
  use, intrinsic :: iso_fortran_env, only: int32
  implicit none
  public

  !> Integer kind of the `layout` argument of `torch_tensor_from_array`.
  integer, parameter :: ftorch_int = int32

  !> Data types (values follow c10::ScalarType).
  enum, bind(c)
    enumerator :: torch_kUInt8 = 0
    enumerator :: torch_kInt8 = 1
    enumerator :: torch_kInt16 = 2
    enumerator :: torch_kInt32 = 3
    enumerator :: torch_kInt64 = 4
    enumerator :: torch_kFloat16 = 5
    enumerator :: torch_kFloat32 = 6
    enumerator :: torch_kFloat64 = 7
  end enum

  !> Reductions of loss functions.
  enum, bind(c)
    enumerator :: torch_kNone = 0
    enumerator :: torch_kMean = 1
    enumerator :: torch_kSum = 2
  end enum
end module ftorch_types
