!> Models: TorchScript load/forward/save against PyTorch's own outputs (written by tests/models.py),
!> single, multiple and tuple outputs, batched inputs with Fortran strides, parameters, lifetime.
program test_model
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use ftorch
  use testing, only: check, check_close, summary, read_values, data_path
  implicit none

  call simplenet_float64()
  call simplenet_float32()
  call several_inputs_and_tuple_outputs()
  call batched_fortran_layout()
  call modes_parameters_and_save()
  call summary()

contains

  subroutine simplenet_float64()
    real(real64), allocatable :: x_ref(:), y_ref(:)
    real(real64), target :: x(5), y(5)
    type(torch_model) :: model
    type(torch_tensor) :: inputs(1), outputs(1)
    call read_values("simplenet_f64_in.txt", x_ref)
    call read_values("simplenet_f64_out.txt", y_ref)
    x = x_ref
    y = 0.0d0
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU)
    call torch_tensor_from_array(inputs(1), x, torch_kCPU)
    call torch_tensor_from_array(outputs(1), y, torch_kCPU)
    call torch_model_forward(model, inputs, outputs)
    call check_close(y, y_ref, 1.0d-12, "float64 forward lands in the aliased output array, equal to PyTorch")
    x = 2.0d0 * x_ref
    call torch_model_forward(model, inputs, outputs)
    call check(any(abs(y - y_ref) > 1.0d-6), "a second forward sees the updated input array")
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(model)
  end subroutine simplenet_float64

  subroutine simplenet_float32()
    real(real64), allocatable :: x_ref(:), y_ref(:)
    real(real32), target :: x(5), y(5)
    type(torch_model) :: model
    type(torch_tensor) :: tin, tout
    call read_values("simplenet_f32_in.txt", x_ref)
    call read_values("simplenet_f32_out.txt", y_ref)
    x = real(x_ref, real32)
    call torch_model_load(model, "  " // data_path("simplenet_f32.pt") // "  ", torch_kCPU)
    call torch_tensor_from_array(tin, x, torch_kCPU)
    call torch_tensor_from_array(tout, y, torch_kCPU)
    call torch_model_forward(model, [tin], [tout])
    call check_close(y, real(y_ref, real32), 1.0e-6, "float32 forward equals PyTorch (array constructors as arguments)")
    call check(tin%get_rank() == 1 .and. tout%get_rank() == 1, "tensors passed in array constructors stay alive")
    call torch_delete(tin)
    call torch_delete(tout)
  end subroutine simplenet_float32

  subroutine several_inputs_and_tuple_outputs()
    real(real64), target :: a(2,3), b(2,3), c(2,3), d(2,3)
    type(torch_model) :: two, tup
    type(torch_tensor) :: ins(2), outs(2)
    call random_number(a)
    call random_number(b)
    call torch_model_load(two, data_path("two_inputs.pt"), torch_kCPU)
    call torch_tensor_from_array(ins(1), a, torch_kCPU)
    call torch_tensor_from_array(ins(2), b, torch_kCPU)
    call torch_tensor_from_array(outs(1), c, torch_kCPU)
    call torch_model_forward(two, ins, outs(1:1))
    call check(all(c == a * b + a), "two inputs: forward(a, b) = a*b + a elementwise in Fortran order")

    call torch_model_load(tup, data_path("tuple_net.pt"), torch_kCPU)
    call torch_tensor_from_array(outs(2), d, torch_kCPU)
    call torch_model_forward(tup, ins(1:1), outs)
    call check(all(c == 2.0d0 * a) .and. all(d == a + 1.0d0), "tuple result fills each output array")
    call torch_delete(ins)
    call torch_delete(outs)
  end subroutine several_inputs_and_tuple_outputs

  subroutine batched_fortran_layout()
    real(real64), allocatable :: x_ref(:), y_ref(:)
    real(real64), target :: x(6,4), y(6,4)
    type(torch_model) :: model
    type(torch_tensor) :: tin(1), tout(1)
    call read_values("batched_in.txt", x_ref)
    call read_values("batched_out.txt", y_ref)
    x = reshape(x_ref, [6, 4])
    call torch_model_load(model, data_path("batched.pt"), torch_kCPU)
    call torch_tensor_from_array(tin(1), x, torch_kCPU)
    call torch_tensor_from_array(tout(1), y, torch_kCPU)
    call check(all(tin(1)%get_stride() == [1, 6]), "batched input keeps Fortran strides (no copy)")
    call torch_model_forward(model, tin, tout)
    call check_close(reshape(y, [24]), y_ref, 1.0d-12, "batch x features input with Fortran strides equals PyTorch")
    call torch_delete(tin)
    call torch_delete(tout)
  end subroutine batched_fortran_layout

  subroutine modes_parameters_and_save()
    real(real64), allocatable :: x_ref(:), y_ref(:)
    real(real64), target :: x(5), y(5)
    real(real64) :: w(5,5)
    type(torch_model) :: model
    type(torch_tensor) :: tin(1), tout(1), params(2)
    integer(c_int64_t) :: base
    integer :: i
    call read_values("simplenet_f64_in.txt", x_ref)
    call read_values("simplenet_f64_out.txt", y_ref)
    x = x_ref
    base = ftorch_live_handles()
    do i = 1, 3
      call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU)
    end do
    call check(ftorch_live_handles() == base + 1, "loading into a loaded model frees the old one")
    call check(.not. model%is_training(), "models load in eval mode by default")
    call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU, is_training=.true.)
    call check(torch_model_is_training(model), "is_training=.true. loads in training mode")
    call check(torch_model_parameter_count(model) == 2, "simplenet has 2 parameter tensors")
    call torch_model_parameters(model, params)
    call check(all(params(1)%get_shape() == [5, 5]) .and. all(params(2)%get_shape() == [5]), &
               "parameters in parameters() order: weight then bias")
    call torch_tensor_to_array(params(1), w)
    call check(any(w /= 0.0d0), "parameter values are readable")
    call model%print_parameters()

    call torch_tensor_from_array(tin(1), x, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tout(1), y, torch_kCPU)
    call torch_model_forward(model, tin, tout, requires_grad=.true.)
    call check(tout(1)%requires_grad(), "forward with requires_grad=.true. keeps the graph in the output")
    call torch_tensor_to_array(tout(1), y)
    call check_close(y, y_ref, 1.0d-12, "forward with requires_grad=.true. computes the same values")

    call torch_model_save(model, data_path("saved_by_fortran.pt"))
    call torch_model_load(model, data_path("saved_by_fortran.pt"), torch_kCPU)
    call torch_tensor_from_array(tout(1), y, torch_kCPU)
    y = 0.0d0
    call torch_model_forward(model, tin, tout)
    call check_close(y, y_ref, 1.0d-12, "a model saved from Fortran loads back and gives the same output")
    call torch_delete(params)
    call torch_delete(tin)
    call torch_delete(tout)
    call torch_delete(model)
    call check(ftorch_live_handles() == base, "no handle leaks after deleting everything")
  end subroutine modes_parameters_and_save
end program test_model
