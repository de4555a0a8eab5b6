!> FTorch’s `ftorch_tensor` module: the tensor type with its arithmetic and autograd, re-exported
!> from the modules that implement them (ftorch_tensor_type, ftorch_math, ftorch_autograd).
module ftorch_tensor
  use ftorch_tensor_type, only: torch_tensor, torch_tensor_from_array, torch_tensor_from_blob, torch_tensor_empty, &
                                torch_tensor_zeros, torch_tensor_ones, torch_tensor_delete, torch_tensor_get_rank, &
                                torch_tensor_get_shape, torch_tensor_get_stride, torch_tensor_get_dtype, &
                                torch_tensor_get_device_type, torch_tensor_get_device_index, &
                                torch_tensor_requires_grad, torch_tensor_print, torch_tensor_zero, torch_tensor_to, &
                                torch_tensor_data_pointer, torch_tensor_to_array, torch_tensor_zero_grad
  use ftorch_math
  use ftorch_autograd
  implicit none
  public
end module ftorch_tensor
