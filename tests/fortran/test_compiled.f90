!> Compiled models: AOTInductor packages (.pt2, written by tests/models.py build_compiled) through
!> the same torch_model_load / torch_model_forward as TorchScript, against PyTorch's eager outputs.
!> Arguments: the data directory; then, optionally, a directory of the same packages written by the
!> helper (ftorch.export), whose recorded inputs FTorch checks itself.
program test_compiled
  use, intrinsic :: iso_fortran_env, only: int64, real32, real64
  use ftorch
  use testing, only: check, check_close, summary, read_values, data_path
  implicit none

  ! The helper's packages first: loading torch's (compiled_model.bin, mlp_rules_unreadable.pt2)
  ! turns the generated checks on for the packages that run after it.
  call several_inputs_and_outputs()
  call dynamic_batch_with_fortran_strides()
  call static_shapes_and_bad_inputs()
  call what_a_compiled_model_cannot_do()
  call load_errors()
  call handles_stay_flat()
  call batch_outside_the_exported_range()
  if (helper_packages()) call recorded_inputs()
  call chosen_by_content()
  call summary()

contains

  !> Whether the packages are the helper's (a second command-line argument).
  logical function helper_packages()
    helper_packages = command_argument_count() >= 2
  end function helper_packages

  !> A package: from the helper's directory when given, else from the data directory.
  function package_path(name) result(path)
    character(len=*), intent(in) :: name
    character(len=:), allocatable :: path
    character(len=4096) :: dir
    if (.not. helper_packages()) then
      path = data_path(name)
      return
    end if
    call get_command_argument(2, dir)
    path = trim(dir) // "/" // name
  end function package_path

  ! Two inputs, two outputs (a tuple), float64, written into the aliased Fortran arrays.
  subroutine several_inputs_and_outputs()
    real(real64), allocatable :: a_ref(:), b_ref(:), y1_ref(:), y2_ref(:)
    real(real64), target :: a(2,3), b(2,3), y1(2,3), y2(2,3)
    type(torch_model) :: model
    type(torch_tensor) :: inputs(2), outputs(2)
    call read_values("multi_a.txt", a_ref)
    call read_values("multi_b.txt", b_ref)
    call read_values("multi_out1.txt", y1_ref)
    call read_values("multi_out2.txt", y2_ref)
    a = reshape(a_ref, [2, 3])
    b = reshape(b_ref, [2, 3])
    y1 = 0
    y2 = 0
    call torch_model_load(model, package_path("multi_io.pt2"), torch_kCPU)
    call torch_tensor_from_array(inputs(1), a, torch_kCPU)
    call torch_tensor_from_array(inputs(2), b, torch_kCPU)
    call torch_tensor_from_array(outputs(1), y1, torch_kCPU)
    call torch_tensor_from_array(outputs(2), y2, torch_kCPU)
    call torch_model_forward(model, inputs, outputs)
    ! Elementwise float64 arithmetic: the compiled code computes exactly what eager PyTorch does.
    call check_close(reshape(y1, [6]), y1_ref, 1.0d-12, "compiled model: output 1 of 2 equals PyTorch")
    call check_close(reshape(y2, [6]), y2_ref, 1.0d-12, "compiled model: output 2 of 2 equals PyTorch")
    a = 2 * a
    call torch_model_forward(model, inputs, outputs)
    call check(maxval(abs(reshape(y1, [6]) - y1_ref)) > 1.0d-3, "a second forward reads the updated input array")
    call check(.not. torch_model_is_training(model), "a compiled model is in eval mode")
    call torch_delete(inputs)
    call torch_delete(outputs)
    call torch_delete(model)
  end subroutine several_inputs_and_outputs

  ! x(batch, 5) Fortran arrays (column-major strides) through a package whose batch dimension was
  ! exported as dynamic: two batch sizes, each equal to the eager model.
  subroutine dynamic_batch_with_fortran_strides()
    type(torch_model) :: model
    call torch_model_load(model, package_path("mlp_dynamic.pt2"), torch_kCPU)
    call run_mlp(model, 1, "batch 1 (a single row: strides along size-1 dimensions differ)")
    call run_mlp(model, 4, "batch 4")
    call run_mlp(model, 7, "batch 7 (dynamic batch dimension)")
    call torch_delete(model)
  end subroutine dynamic_batch_with_fortran_strides

  subroutine run_mlp(model, batch, what)
    type(torch_model), intent(inout) :: model
    integer, intent(in) :: batch
    character(len=*), intent(in) :: what
    real(real64), allocatable :: x_ref(:), y_ref(:)
    real(real32), allocatable, target :: x(:,:), y(:,:)
    type(torch_tensor) :: tx(1), ty(1)
    character(len=8) :: tag
    write (tag, '(i0)') batch
    call read_values("mlp_x" // trim(tag) // ".txt", x_ref)
    call read_values("mlp_y" // trim(tag) // ".txt", y_ref)
    allocate (x(batch, 5), y(batch, 3))
    x = reshape(real(x_ref, real32), [batch, 5])
    y = 0
    call torch_tensor_from_array(tx(1), x, torch_kCPU)
    call torch_tensor_from_array(ty(1), y, torch_kCPU)
    call torch_model_forward(model, tx, ty)
    ! float32 matrix products and tanh: the compiled kernels (generated C++ and its vectorised
    ! tanh, another blocking of the sums) may round differently from eager ATen in the last bits;
    ! 2e-5 relative is ~100 float32 ulps, far below any error of layout or indexing.
    call check_close(reshape(y, [batch * 3]), real(y_ref, real32), 2.0e-5, "compiled MLP, " // what)
    call torch_delete(tx)
    call torch_delete(ty)
  end subroutine run_mlp

  ! A package is recognised by its content; a TorchScript file named .pt2 stays TorchScript.
  subroutine chosen_by_content()
    type(torch_model) :: compiled, script
    real(real32), target :: x(3, 5), y1(3, 3), y2(3, 3)
    type(torch_tensor) :: tx(1), ty1(1), ty2(1)
    integer :: i
    x = reshape([(0.1 * i - 0.7, i = 1, 15)], [3, 5])
    call torch_model_load(compiled, data_path("compiled_model.bin"), torch_kCPU)
    call torch_model_load(script, data_path("script_named.pt2"), torch_kCPU, is_training=.false.)
    call torch_tensor_from_array(tx(1), x, torch_kCPU)
    call torch_tensor_from_array(ty1(1), y1, torch_kCPU)
    call torch_tensor_from_array(ty2(1), y2, torch_kCPU)
    call torch_model_forward(compiled, tx, ty1)
    call torch_model_forward(script, tx, ty2)
    ! Same justification as in run_mlp.
    call check_close(reshape(y1, [9]), reshape(y2, [9]), 2.0e-5, &
                     "a package named .bin and TorchScript named .pt2 load by content and agree")
    call check(torch_model_parameter_count(script) == 4, "the TorchScript one keeps its parameters")
    call torch_delete(tx)
    call torch_delete(ty1)
    call torch_delete(ty2)
    call torch_delete(compiled)
    call torch_delete(script)
  end subroutine chosen_by_content

  ! Static shapes: another shape, dtype, input count or output count is a clear error.
  subroutine static_shapes_and_bad_inputs()
    type(torch_model) :: model
    real(real64), target :: a(3,3), b(3,3), y(3,3), z(3,3), a2(2,3), y2(2,3), z2(2,3)
    real(real32), target :: f(2,3)
    type(torch_tensor) :: in2(2), out2(2), bad(2), one(1), out1(1), other(1)
    integer :: stat
    character(len=512) :: msg
    a = 1
    b = 1
    a2 = 1
    f = 1
    call torch_model_load(model, package_path("multi_io.pt2"), torch_kCPU)
    call torch_tensor_from_array(in2(1), a, torch_kCPU)
    call torch_tensor_from_array(in2(2), b, torch_kCPU)
    call torch_tensor_from_array(out2(1), y, torch_kCPU)
    call torch_tensor_from_array(out2(2), z, torch_kCPU)
    msg = ""
    call torch_model_forward(model, in2, out2, stat=stat, errmsg=msg)
    ! (The wording after the procedure name is AOTInductor's and differs between torch releases.)
    call check(stat /= 0 .and. index(msg, "[torch_model_forward]") == 1 .and. index(msg, "2") > 0 &
               .and. index(msg, "3") > 0, "a shape other than the exported static one is a shape error: " // trim(msg))
    call torch_tensor_from_array(bad(1), f, torch_kCPU)
    call torch_tensor_from_array(bad(2), a2, torch_kCPU)
    call torch_tensor_from_array(out1(1), y2, torch_kCPU)
    call torch_tensor_from_array(other(1), z2, torch_kCPU)
    msg = ""
    call torch_model_forward(model, bad, [out1(1), other(1)], stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "dtype") > 0, "a float32 input where float64 was exported: " // trim(msg))
    call torch_tensor_from_array(one(1), a2, torch_kCPU)
    msg = ""
    call torch_model_forward(model, one, out1, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "inputs") > 0, "one input for a two-input model: " // trim(msg))
    msg = ""
    call torch_model_forward(model, [one(1), one(1)], out1, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "returned 2 tensors but 1 output") > 0, &
               "one output tensor for two results: " // trim(msg))
    ! The second output of the wrong shape: an error before anything is written (the first output's
    ! array keeps its values).
    y2 = -7
    msg = ""
    call torch_model_forward(model, [one(1), one(1)], [out1(1), out2(1)], stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "output tensor 2") > 0 .and. all(y2 == -7), &
               "a second output of the wrong shape leaves the first one untouched: " // trim(msg))
    call torch_delete(in2)
    call torch_delete(out2)
    call torch_delete(other)
    call torch_delete(bad)
    call torch_delete(one)
    call torch_delete(out1)
    call torch_delete(model)
  end subroutine static_shapes_and_bad_inputs

  ! Training, gradients, parameters and save: clear errors, and the model still runs after them.
  subroutine what_a_compiled_model_cannot_do()
    type(torch_model) :: model
    type(torch_tensor) :: params(4)
    type(torch_tensor) :: tx(1), ty(1)
    real(real32), target :: x(2, 5), y(2, 3)
    integer :: stat
    character(len=512) :: msg
    x = 0.5
    call torch_model_load(model, package_path("mlp_dynamic.pt2"), torch_kCPU)
    call torch_tensor_from_array(tx(1), x, torch_kCPU)
    call torch_tensor_from_array(ty(1), y, torch_kCPU)
    msg = ""
    call torch_model_forward(model, tx, ty, requires_grad=.true., stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "cannot record a graph") > 0, &
               "forward with requires_grad: " // trim(msg))
    msg = ""
    call torch_model_save(model, "never_written.pt", stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "[torch_model_save]") == 1 .and. &
               index(msg, "can only run forward") > 0, &
               "save: " // trim(msg))
    msg = ""
    call torch_model_parameters(model, params, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "can only run forward") > 0, &
               "parameters (and so an optimizer of them): " // trim(msg))
    msg = ""
    call torch_model_load(model, package_path("mlp_dynamic.pt2"), torch_kCPU, is_training=.true., stat=stat, &
                          errmsg=msg)
    call check(stat == FTORCH_ERR_INVALID_ARGUMENT .and. index(msg, "training") > 0, &
               "loading a package for training: " // trim(msg))
    y = -1
    call torch_model_forward(model, tx, ty, stat=stat)
    call check(stat == 0 .and. all(y /= -1), "the model still runs after these errors")
    call torch_delete(tx)
    call torch_delete(ty)
    call torch_delete(model)
  end subroutine what_a_compiled_model_cannot_do

  subroutine load_errors()
    type(torch_model) :: model
    integer :: stat
    character(len=512) :: msg
    msg = ""
    call torch_model_load(model, data_path("exported_only.pt2"), torch_kCPU, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "without AOTInductor-compiled code") > 0, &
               "a .pt2 with an exported program but no compiled code: " // trim(msg))
    msg = ""
    call torch_model_load(model, data_path("missing.pt2"), torch_kCPU, stat=stat, errmsg=msg)
    call check(stat /= 0 .and. index(msg, "cannot open") > 0, "a missing package: " // trim(msg))
  end subroutine load_errors

  ! Loads and forwards in a loop leave no handle behind.
  subroutine handles_stay_flat()
    type(torch_model) :: model
    type(torch_tensor) :: tx(1), ty(1)
    real(real32), target :: x(3, 5), y(3, 3)
    integer(int64) :: before
    integer :: i
    x = 0.25
    before = ftorch_live_handles()
    do i = 1, 200
      if (mod(i, 100) == 1) call torch_model_load(model, package_path("mlp_dynamic.pt2"), torch_kCPU)
      call torch_tensor_from_array(tx(1), x, torch_kCPU)
      call torch_tensor_from_array(ty(1), y, torch_kCPU)
      call torch_model_forward(model, tx, ty)
    end do
    call torch_delete(tx)
    call torch_delete(ty)
    call torch_delete(model)
    call check(ftorch_live_handles() == before, "200 forwards and reloads leave the live handle count flat")
  end subroutine handles_stay_flat

  ! A dynamic batch beyond the exported range (1..4096) is refused before the compiled code reads
  ! past the input (by the package's generated checks, or by FTorch's where the helper recorded the
  ! range): the message names the size and the bound.
  subroutine batch_outside_the_exported_range()
    integer :: stat
    character(len=512) :: msg
    logical :: untouched
    call forward_batch_4097(package_path("mlp_dynamic.pt2"), stat, msg, untouched)
    call check(stat /= 0 .and. index(msg, "4097") > 0 .and. index(msg, "4096") > 0 .and. untouched, &
               "batch 4097 for a package exported for 1..4096: " // trim(msg))
  end subroutine batch_outside_the_exported_range

  ! What only FTorch's checks of the helper's recorded inputs catch: a batch shared by two inputs
  ! (the compiled code reads it from the first) must agree; errors carry FTorch's statuses; a
  ! package whose record does not parse falls back to its generated checks.
  subroutine recorded_inputs()
    type(torch_model) :: model
    real(real64), target :: a(3, 3), b(3, 3), b2(2, 3), y1(3, 3), y2(3, 3)
    real(real32), target :: f(3, 3)
    type(torch_tensor) :: tin(2), tout(2), tbad(2)
    integer :: stat, i
    character(len=512) :: msg
    logical :: untouched
    a = reshape([(0.25d0 * i - 1, i = 1, 9)], [3, 3])
    b = reshape([(0.5d0 * i, i = 1, 9)], [3, 3])
    b2 = 1
    f = 1
    call get_environment_variable("AOTI_RUNTIME_CHECK_INPUTS", status=stat)
    call check(stat == 1, "the helper's packages ran without turning on their generated checks")
    call torch_model_load(model, package_path("multi_io_dynamic.pt2"), torch_kCPU)
    call torch_tensor_from_array(tin(1), a, torch_kCPU)
    call torch_tensor_from_array(tin(2), b, torch_kCPU)
    call torch_tensor_from_array(tout(1), y1, torch_kCPU)
    call torch_tensor_from_array(tout(2), y2, torch_kCPU)
    call torch_model_forward(model, tin, tout, stat=stat)
    ! Exact comparison: a and b are short dyadic fractions, so a*b + a and 2b - a are exact in
    ! float64 with or without fused multiply-adds (any CPU, any vector width).
    call check(stat == 0 .and. all(y1 == a * b + a) .and. all(y2 == 2 * b - a), &
               "a shared dynamic batch of 3 (exported with 2) runs and equals a*b + a, 2b - a")
    call torch_tensor_from_array(tbad(1), a, torch_kCPU)
    call torch_tensor_from_array(tbad(2), b2, torch_kCPU)
    y1 = -1
    msg = ""
    call torch_model_forward(model, tbad, tout, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_SHAPE .and. index(msg, "batch") > 0 .and. all(y1 == -1), &
               "inputs with batches 3 and 2 where the package takes one batch: " // trim(msg))
    call torch_delete(tbad(1))
    call torch_tensor_from_array(tbad(1), f, torch_kCPU)
    msg = ""
    call torch_model_forward(model, [tbad(1), tin(2)], tout, stat=stat, errmsg=msg)
    call check(stat == FTORCH_ERR_DTYPE .and. index(msg, "float32") > 0 .and. index(msg, "float64") > 0, &
               "a float32 input where float64 was exported: FTORCH_ERR_DTYPE: " // trim(msg))
    call torch_delete(model)
    ! The generated checks of a package whose recorded inputs FTorch cannot read.
    call forward_batch_4097(package_path("mlp_rules_unreadable.pt2"), stat, msg, untouched)
    call check(stat /= 0 .and. index(msg, "4097") > 0 .and. untouched, &
               "an unreadable record: the package's own checks refuse batch 4097: " // trim(msg))
    call torch_delete(tin)
    call torch_delete(tout)
    call torch_delete(tbad)
  end subroutine recorded_inputs

  ! Forward of x(4097, 5) through the MLP package `file` (exported for batches 1..4096), with stat:
  ! its status and message, and whether the output array was left untouched.
  subroutine forward_batch_4097(file, stat, msg, untouched)
    character(len=*), intent(in) :: file
    integer, intent(out) :: stat
    character(len=*), intent(out) :: msg
    logical, intent(out) :: untouched
    type(torch_model) :: model
    real(real32), allocatable, target :: x(:,:), y(:,:)
    type(torch_tensor) :: tx(1), ty(1)
    allocate (x(4097, 5), y(4097, 3))
    x = 0.5
    y = -1
    call torch_model_load(model, file, torch_kCPU)
    call torch_tensor_from_array(tx(1), x, torch_kCPU)
    call torch_tensor_from_array(ty(1), y, torch_kCPU)
    msg = ""
    call torch_model_forward(model, tx, ty, stat=stat, errmsg=msg)
    untouched = all(y == -1)
    call torch_delete(tx)
    call torch_delete(ty)
    call torch_delete(model)
  end subroutine forward_batch_4097

end program test_compiled
