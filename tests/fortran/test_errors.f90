!> Failures reported through stat/errmsg: the program continues and the objects involved stay
!> usable. One block per failure mode; each asserts the status, the procedure name and the reason.
program test_errors
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use, intrinsic :: iso_fortran_env, only: int8, real32, real64
  use ftorch
  use testing, only: check, summary, read_values, data_path
  implicit none

  type(torch_model) :: model, tuple_model
  type(torch_tensor) :: tin(1), tout(1), two(2), never, gpu
  real(real64), target :: x(5), y(5), x4(4), y4(4), a(2,3)
  real(real32), target :: x32(5)
  integer(int8), target :: bytes5(5)
  type(torch_tensor) :: bytes_out(1)
  real(real64), allocatable :: y_ref(:), x_ref(:)
  integer, target :: ints(3)
  integer :: stat, rank
  character(len=1024) :: msg

  call read_values("simplenet_f64_in.txt", x_ref)
  call read_values("simplenet_f64_out.txt", y_ref)
  x = x_ref
  call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU)
  call torch_tensor_from_array(tin(1), x, torch_kCPU)
  call torch_tensor_from_array(tout(1), y, torch_kCPU)

  ! --- model files
  call torch_model_load(model, data_path("does_not_exist.pt"), torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_IO, "torch_model_load", "cannot open model file", "missing model file")
  call forward_still_works("the loaded model survives a failed load into the same variable")
  call torch_model_load(model, data_path("corrupt.pt"), torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_IO, "torch_model_load", "not a loadable TorchScript model", "corrupt model file")
  call forward_still_works("the loaded model survives a corrupt file")
  call torch_model_save(model, "/nonexistent-dir/model.pt", stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_IO, "torch_model_save", "cannot write model", "save to an unwritable path")

  ! --- forward
  call torch_tensor_from_array(two(1), x4, torch_kCPU)
  call torch_model_forward(model, two(1:1), tout, stat=stat, errmsg=msg)
  call check(index(msg, "input 1: shape [4], float64, on cpu") > 0 .and. &
             index(msg, "forward failed: mat1") < index(msg, "Traceback"), &
             "a failing forward lists its inputs, then the TorchScript traceback")
  call expect(FTORCH_ERR_SHAPE, "torch_model_forward", "forward failed: mat1 and mat2 shapes cannot be multiplied", &
              "wrong input shape: LibTorch's reason on the first line, a shape error")
  call forward_still_works("the model works after a wrong input shape")
  call torch_tensor_from_array(two(2), x, torch_kCPU)
  call torch_model_forward(model, [tin(1), two(2)], tout, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_TORCH, "torch_model_forward", "argument", "wrong number of inputs")
  call forward_still_works("the model works after a wrong number of inputs")
  x32 = 0.5
  call torch_tensor_from_array(two(1), x32, torch_kCPU)
  call torch_model_forward(model, two(1:1), tout, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DTYPE, "torch_model_forward", "dtype", "a float32 input to a float64 model: a dtype error")
  call forward_still_works("the model works after an input of the wrong dtype")
  call torch_tensor_from_array(two(1), y4, torch_kCPU)
  call torch_model_forward(model, tin, two(1:1), stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_model_forward", "has shape [4]", "output tensor of the wrong shape")
  call torch_model_load(tuple_model, data_path("tuple_net.pt"), torch_kCPU)
  call torch_model_forward(tuple_model, tin, tout, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_model_forward", "returned 2 tensors but 1", &
              "output count differs from the tuple size")
  ! the same output twice, or two outputs over one array: one result would be lost
  call torch_model_forward(tuple_model, tin, [tout(1), tout(1)], stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_model_forward", "output tensor 2 is output tensor 1 again", &
              "the same output tensor twice")
  call torch_tensor_from_array(two(2), y, torch_kCPU)
  call torch_model_forward(tuple_model, tin, [tout(1), two(2)], stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_model_forward", "output tensor 2 shares its memory with output tensor 1", &
              "two output tensors over one array")
  ! uint8 results (200) into a signed int8 array: a dtype error, never -56
  call torch_model_load(tuple_model, data_path("uint8_net.pt"), torch_kCPU)
  call torch_tensor_from_array(bytes_out(1), bytes5, torch_kCPU)
  bytes5 = 7_int8
  call torch_model_forward(tuple_model, tin, bytes_out, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DTYPE, "torch_model_forward", "overflow", "uint8 results into an int8 array")
  call check(all(bytes5 == 7_int8), "... and the array is untouched")
  call torch_model_load(tuple_model, data_path("dict_net.pt"), torch_kCPU)
  call torch_model_forward(tuple_model, tin, tout, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_model_forward", "GenericDict", "unsupported output type")

  ! --- devices (CUDA requests fail only where no GPU is present; with one, they succeed)
  if (.not. torch_device_available(torch_kCUDA)) then
    call torch_tensor_zeros(two(1), 1, [3_c_int64_t], torch_kFloat64, torch_kCUDA, stat=stat, errmsg=msg)
    call expect(FTORCH_ERR_DEVICE, "torch_tensor_zeros", "no CUDA/HIP device is available", "CUDA tensor")
    call torch_tensor_from_array(two(1), x, torch_kCUDA, stat=stat, errmsg=msg)
    call expect(FTORCH_ERR_DEVICE, "torch_tensor_from_array", "CUDA", "CUDA tensor from a Fortran array")
    call torch_model_load(tuple_model, data_path("simplenet_f64.pt"), torch_kCUDA, stat=stat, errmsg=msg)
    call expect(FTORCH_ERR_DEVICE, "torch_model_load", "no CUDA/HIP device is available", "CUDA model")
  else
    call torch_tensor_zeros(gpu, 1, [3_c_int64_t], torch_kFloat64, torch_kCUDA, stat=stat, errmsg=msg)
    call check(stat == FTORCH_OK .and. gpu%get_device_type() == torch_kCUDA, &
               "torch_device_available(torch_kCUDA): a CUDA tensor can be made")
    call torch_tensor_delete(gpu)
  end if
  if (.not. torch_device_available(torch_kCUDA, 3)) then
    call torch_model_load(tuple_model, data_path("simplenet_f64.pt"), torch_kCUDA, device_index=3, &
                          stat=stat, errmsg=msg)
    call expect(FTORCH_ERR_DEVICE, "torch_model_load", "CUDA", "CUDA model with an index")
  end if
  call torch_tensor_zeros(two(1), 1, [3_c_int64_t], torch_kFloat64, torch_kXPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DEVICE, "torch_tensor_zeros", "XPU", "XPU tensor")
  call check(two(1)%get_rank() == 1 .and. all(two(1)%get_shape() == [4]), &
             "a tensor keeps its previous value when reconstruction fails")
  call torch_tensor_zeros(two(1), 1, [3_c_int64_t], torch_kFloat64, torch_kMPS, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DEVICE, "torch_tensor_zeros", "MPS", "MPS tensor")
  call torch_tensor_zeros(two(1), 1, [3_c_int64_t], torch_kFloat64, 7, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DEVICE, "torch_tensor_zeros", "unknown device type 7", "unknown device type")
  call torch_tensor_zeros(two(1), 1, [3_c_int64_t], torch_kFloat64, torch_kCPU, device_index=2, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DEVICE, "torch_tensor_zeros", "CPU device index", "CPU with a device index")
  call check(torch_device_available(torch_kCPU) .and. .not. torch_device_available(torch_kCPU, 2), &
             "torch_device_available reports the CPU, and no second CPU")

  ! --- dtypes and shapes
  call torch_tensor_empty(two(1), 1, [3_c_int64_t], torch_kFloat16, torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DTYPE, "torch_tensor_empty", "unsupported dtype 5", "float16 dtype")
  call torch_tensor_empty(two(1), 1, [3_c_int64_t], torch_kUInt8, torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DTYPE, "torch_tensor_empty", "unsupported dtype 0", "uint8 dtype")
  call torch_tensor_zeros(two(1), 1, [3_c_int64_t], torch_kBool, torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DTYPE, "torch_tensor_zeros", "unsupported dtype 11", "bool dtype (get_dtype only)")
  call torch_tensor_ones(two(1), 1, [3_c_int64_t], torch_kBFloat16, torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_DTYPE, "torch_tensor_ones", "unsupported dtype 15", "bfloat16 dtype (get_dtype only)")
  call torch_tensor_empty(two(1), 2, [3_c_int64_t], torch_kFloat64, torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_tensor_empty", "ndims = 2 but size(tensor_shape) = 1", &
              "ndims differs from the shape's size")
  call torch_tensor_empty(two(1), 1, [-3_c_int64_t], torch_kFloat64, torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_tensor_empty", "negative", "negative extent")
  call torch_tensor_from_array(two(1), a, [1, 1], torch_kCPU, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_tensor_from_array", "layout = [1,1] is not a permutation", &
              "invalid layout")
  call torch_tensor_from_array(two(1), a, torch_kCPU, permute_dims=[2, 3], stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_tensor_from_array", "permute_dims", "invalid permute_dims")
  call torch_tensor_from_array(two(1), ints, torch_kCPU, requires_grad=.true., stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_TORCH, "torch_tensor_from_array", "floating point", "requires_grad on an integer tensor")
  call torch_tensor_from_array(two(1), a, torch_kCPU)
  call torch_tensor_to(tin(1), two(1), stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_tensor_to", "differs from target shape", "torch_tensor_to shape mismatch")
  call torch_tensor_to_array(tin(1), a, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_INVALID_ARGUMENT, "torch_tensor_to_array", "shape", "to_array into an array of another rank")

  ! --- objects that were never constructed
  rank = never%get_rank(stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_NULL_HANDLE, "torch_tensor_get_rank", "not constructed", "get_rank of a never-constructed tensor")
  call torch_model_forward(model, [never], tout, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_NULL_HANDLE, "torch_model_forward", "input tensor 1 is not constructed", &
              "forward with a never-constructed input")
  call torch_model_forward(tuple_model, tin, tout, stat=stat, errmsg=msg)
  call torch_model_delete(tuple_model)
  call torch_model_forward(tuple_model, tin, tout, stat=stat, errmsg=msg)
  call expect(FTORCH_ERR_NULL_HANDLE, "torch_model_forward", "model is not loaded", "forward of a deleted model")
  deallocate(x_ref, y_ref)  ! main-program allocatables are not freed at the end (leak checks)
  call summary()

contains

  subroutine expect(code, procedure, reason, name)
    integer, intent(in) :: code
    character(len=*), intent(in) :: procedure, reason, name
    call check(stat == code, name // ": stat is the expected code")
    call check(index(msg, "[" // procedure // "]") == 1 .and. index(msg, reason) > 0, &
               name // ": errmsg names the procedure and the reason")
    if (stat /= code .or. index(msg, reason) == 0) print '(a,i0,a,a)', "  stat = ", stat, ", errmsg = ", trim(msg)
    msg = ""
  end subroutine expect

  subroutine forward_still_works(name)
    character(len=*), intent(in) :: name
    y = 0.0d0
    call torch_model_forward(model, tin, tout, stat=stat)
    call check(stat == 0 .and. all(abs(y - y_ref) <= 1.0d-12 * abs(y_ref)), name)
  end subroutine forward_still_works
end program test_errors
