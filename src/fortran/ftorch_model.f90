!> `torch_model`: TorchScript models loaded from file, run on tensors, saved, inspected.
module ftorch_model
  use, intrinsic :: iso_c_binding, only: c_char, c_int, c_int64_t, c_null_ptr, c_ptr
  use ftorch_kinds, only: output_unit
  use ftorch_errors, only: ftorch_check
  use ftorch_interop, only: c_flag, c_string
  use ftorch_tensor_type, only: torch_tensor
  use ftorch_arglist, only: torch_arglist
  implicit none
  private

  public :: torch_model, torch_model_load, torch_model_forward, torch_model_save, &
            torch_model_is_training, torch_model_print_parameters, torch_model_delete, &
            torch_model_parameters, torch_model_parameter_count, torch_model_parameter, &
            torch_model_parameter_name, torch_model_num_parameters, torch_model_freeze, torch_model_unfreeze, &
            torch_jit_set_optimize

  !> A model handle (TorchScript or a compiled `.pt2` package); `p` is null until loaded. `m2 = m1` (also as components of user
  !> types and in arrays) makes a second handle to the same model: both run and train the same
  !> module, and either may be deleted first.
  type :: torch_model
    !> Opaque handle of the loaded model (null until loaded); not to be set directly.
    type(c_ptr) :: p = c_null_ptr
  contains
    procedure, private :: torch_model_share
    !> `m2 = m1`: a second handle to the same model (see the type’s description).
    generic :: assignment(=) => torch_model_share
    !> `call model%print_parameters()`: `torch_model_print_parameters`.
    procedure :: print_parameters => torch_model_print_parameters
    !> `model%is_training()`: `torch_model_is_training`.
    procedure :: is_training => torch_model_is_training
    final :: finalize_model
  end type torch_model

  !> Run the model’s forward method on tensors, or on a `torch_arglist` for models whose forward
  !> also takes integers, reals, logicals or strings.
  interface torch_model_forward
    module procedure forward_tensors, forward_args, forward_list
  end interface torch_model_forward

  !> A tensor sharing storage with one parameter, by name or by 1-based index.
  interface torch_model_parameter
    module procedure parameter_by_name, parameter_by_index
  end interface torch_model_parameter

  interface
    subroutine ftc_model_release(h) bind(c, name="ftc_model_release")
      import :: c_ptr
      type(c_ptr), value :: h
    end subroutine ftc_model_release
    subroutine ftc_set_jit_optimize(enabled) bind(c, name="ftc_set_jit_optimize")
      import :: c_int
      integer(c_int), value :: enabled
    end subroutine ftc_set_jit_optimize
    function ftc_model_parameter(m, name, index, out) result(status) bind(c, name="ftc_model_parameter")
      import :: c_ptr, c_char, c_int, c_int64_t
      type(c_ptr), value :: m
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int64_t), value :: index
      type(c_ptr), intent(inout) :: out
      integer(c_int) :: status
    end function ftc_model_parameter
    function ftc_model_parameter_name(m, index, buf, buflen, length) result(status) &
        bind(c, name="ftc_model_parameter_name")
      import :: c_ptr, c_char, c_int, c_int64_t
      type(c_ptr), value :: m
      integer(c_int64_t), value :: index, buflen
      character(kind=c_char), intent(out) :: buf(*)
      integer(c_int64_t), intent(out) :: length
      integer(c_int) :: status
    end function ftc_model_parameter_name
    function ftc_model_set_requires_grad(m, name, flag, matched) result(status) &
        bind(c, name="ftc_model_set_requires_grad")
      import :: c_ptr, c_char, c_int, c_int64_t
      type(c_ptr), value :: m
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int), value :: flag
      integer(c_int64_t), intent(out) :: matched
      integer(c_int) :: status
    end function ftc_model_set_requires_grad
    function ftc_model_numel(m, trainable_only, count) result(status) bind(c, name="ftc_model_numel")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: m
      integer(c_int), value :: trainable_only
      integer(c_int64_t), intent(out) :: count
      integer(c_int) :: status
    end function ftc_model_numel
    function ftc_model_load(out, filename, device_type, device_index, requires_grad, is_training) &
        result(status) bind(c, name="ftc_model_load")
      import :: c_ptr, c_char, c_int
      type(c_ptr), intent(inout) :: out
      character(kind=c_char), intent(in) :: filename(*)
      integer(c_int), value :: device_type, device_index, requires_grad, is_training
      integer(c_int) :: status
    end function ftc_model_load
    function ftc_model_share(src, dst) result(status) bind(c, name="ftc_model_share")
      import :: c_ptr, c_int
      type(c_ptr), value :: src
      type(c_ptr), intent(inout) :: dst
      integer(c_int) :: status
    end function ftc_model_share
    function ftc_model_delete(m) result(status) bind(c, name="ftc_model_delete")
      import :: c_ptr, c_int
      type(c_ptr), intent(inout) :: m
      integer(c_int) :: status
    end function ftc_model_delete
    function ftc_model_forward(m, inputs, n_inputs, outputs, n_outputs, requires_grad) result(status) &
        bind(c, name="ftc_model_forward")
      import :: c_ptr, c_int
      type(c_ptr), value :: m
      type(c_ptr), intent(in) :: inputs(*), outputs(*)
      integer(c_int), value :: n_inputs, n_outputs, requires_grad
      integer(c_int) :: status
    end function ftc_model_forward
    function ftc_model_forward_args(m, args, outputs, n_outputs, requires_grad) result(status) &
        bind(c, name="ftc_model_forward_args")
      import :: c_ptr, c_int
      type(c_ptr), value :: m, args
      type(c_ptr), intent(in) :: outputs(*)
      integer(c_int), value :: n_outputs, requires_grad
      integer(c_int) :: status
    end function ftc_model_forward_args
    function ftc_model_forward_list(m, args, results, requires_grad) result(status) &
        bind(c, name="ftc_model_forward_list")
      import :: c_ptr, c_int
      type(c_ptr), value :: m, args
      type(c_ptr), intent(inout) :: results
      integer(c_int), value :: requires_grad
      integer(c_int) :: status
    end function ftc_model_forward_list
    function ftc_model_save(m, filename) result(status) bind(c, name="ftc_model_save")
      import :: c_ptr, c_char, c_int
      type(c_ptr), value :: m
      character(kind=c_char), intent(in) :: filename(*)
      integer(c_int) :: status
    end function ftc_model_save
    function ftc_model_is_training(m, is_training) result(status) bind(c, name="ftc_model_is_training")
      import :: c_ptr, c_int
      type(c_ptr), value :: m
      integer(c_int), intent(out) :: is_training
      integer(c_int) :: status
    end function ftc_model_is_training
    function ftc_model_print_parameters(m) result(status) bind(c, name="ftc_model_print_parameters")
      import :: c_ptr, c_int
      type(c_ptr), value :: m
      integer(c_int) :: status
    end function ftc_model_print_parameters
    function ftc_model_parameter_count(m, count) result(status) bind(c, name="ftc_model_parameter_count")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: m
      integer(c_int64_t), intent(out) :: count
      integer(c_int) :: status
    end function ftc_model_parameter_count
    function ftc_model_parameters(m, outputs, n) result(status) bind(c, name="ftc_model_parameters")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: m
      type(c_ptr), intent(inout) :: outputs(*)
      integer(c_int64_t), value :: n
      integer(c_int) :: status
    end function ftc_model_parameters
  end interface

contains

  !> Load a model from `filename` onto a device (leading/trailing blanks ignored): a TorchScript
  !> file, or an AOTInductor package (`.pt2`, from torch.export + AOTInductor), recognised by its
  !> content whatever the file’s name. A compiled package runs forward only (on the device it was
  !> compiled for, with the shapes it was exported with, or any size along dynamic dimensions);
  !> training, gradients, parameters and save are errors for it.
  subroutine torch_model_load(model, filename, device_type, device_index, requires_grad, is_training, &
                              stat, errmsg)
    type(torch_model), intent(inout) :: model  !< replaced (a loaded model is freed first)
    !> Path of the model file.
    character(len=*), intent(in) :: filename
    integer(c_int), intent(in) :: device_type            !< torch_kCPU, torch_kCUDA, ...
    integer(c_int), intent(in), optional :: device_index  !< default: -1 on the CPU, 0 otherwise
    logical, intent(in), optional :: requires_grad        !< autograd mode while loading (default .false.)
    logical, intent(in), optional :: is_training          !< train() if .true., eval() otherwise (default)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: idx
    idx = -1
    if (present(device_index)) idx = device_index
    call ftorch_check(ftc_model_load(model%p, c_string(filename), device_type, idx, c_flag(requires_grad), &
                                     c_flag(is_training)), "torch_model_load", stat, errmsg)
  end subroutine torch_model_load

  !> Run the model’s forward method. The results are written into the output tensors’ storage as
  !> `=` does (aliased Fortran arrays receive them); with requires_grad the outputs also carry the
  !> graph, so that gradients flow back to inputs and parameters.
  subroutine forward_tensors(model, input_tensors, output_tensors, requires_grad, stat, errmsg)
    !> A loaded model.
    type(torch_model), intent(in) :: model
    !> The arguments of forward, in order.
    type(torch_tensor), intent(in) :: input_tensors(:)
    !> Constructed tensors receiving the results, one per tensor forward returns (a tuple’s items
    !> in order), each of the result’s shape.
    type(torch_tensor), intent(in) :: output_tensors(:)
    !> Record the graph of the forward pass for backward (default .false.).
    logical, intent(in), optional :: requires_grad
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: inputs(size(input_tensors)), outputs(size(output_tensors))
    integer :: i
    do i = 1, size(input_tensors)
      inputs(i) = input_tensors(i)%p
    end do
    do i = 1, size(output_tensors)
      outputs(i) = output_tensors(i)%p
    end do
    call ftorch_check(ftc_model_forward(model%p, inputs, size(inputs, kind=c_int), outputs, &
                                        size(outputs, kind=c_int), c_flag(requires_grad)), &
                      "torch_model_forward", stat, errmsg)
  end subroutine forward_tensors

  !> forward(args...) with the items of an argument list: tensors, and integers, reals,
  !> logicals and strings for a forward declared with int, float, bool or str arguments.
  subroutine forward_args(model, args, output_tensors, requires_grad, stat, errmsg)
    !> A loaded model.
    type(torch_model), intent(in) :: model
    !> The arguments of forward, in order.
    type(torch_arglist), intent(in) :: args
    !> Constructed tensors receiving the results, one per tensor forward returns (a tuple’s items
    !> in order), each of the result’s shape.
    type(torch_tensor), intent(in) :: output_tensors(:)
    !> Record the graph of the forward pass for backward (default .false.).
    logical, intent(in), optional :: requires_grad
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: outputs(size(output_tensors))
    integer :: i
    do i = 1, size(output_tensors)
      outputs(i) = output_tensors(i)%p
    end do
    call ftorch_check(ftc_model_forward_args(model%p, args%p, outputs, size(outputs, kind=c_int), &
                                             c_flag(requires_grad)), "torch_model_forward", stat, errmsg)
  end subroutine forward_args

  !> forward(args...) with the returned tensors (one, or each of a tuple) as the items of
  !> `results`: new tensors over the model’s result memory (no copy), any shape.
  subroutine forward_list(model, args, results, requires_grad, stat, errmsg)
    !> A loaded model.
    type(torch_model), intent(in) :: model
    !> The arguments of forward, in order.
    type(torch_arglist), intent(in) :: args
    !> Receives the returned tensors as its items, replacing any previous ones (constructed if it
    !> is not yet).
    type(torch_arglist), intent(inout) :: results
    !> Record the graph of the forward pass for backward (default .false.).
    logical, intent(in), optional :: requires_grad
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_model_forward_list(model%p, args%p, results%p, c_flag(requires_grad)), &
                      "torch_model_forward", stat, errmsg)
  end subroutine forward_list

  !> Save the model as TorchScript (loadable by torch.jit.load).
  subroutine torch_model_save(model, filename, stat, errmsg)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> Path of the file to write (replaced if it exists).
    character(len=*), intent(in) :: filename
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_model_save(model%p, c_string(filename)), "torch_model_save", stat, errmsg)
  end subroutine torch_model_save

  !> Whether the model is in training mode.
  function torch_model_is_training(self, stat, errmsg) result(is_training)
    !> A loaded model.
    class(torch_model), intent(in) :: self
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    logical :: is_training
    integer(c_int) :: value
    value = 0
    call ftorch_check(ftc_model_is_training(self%p, value), "torch_model_is_training", stat, errmsg)
    is_training = value /= 0
  end function torch_model_is_training

  !> Print every named parameter and its values.
  subroutine torch_model_print_parameters(self, stat, errmsg)
    !> A loaded model.
    class(torch_model), intent(in) :: self
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    flush(output_unit)
    call ftorch_check(ftc_model_print_parameters(self%p), "torch_model_print_parameters", stat, errmsg)
  end subroutine torch_model_print_parameters

  !> Number of parameter tensors of the model.
  function torch_model_parameter_count(model, stat, errmsg) result(count)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer :: count
    integer(c_int64_t) :: n
    n = 0
    call ftorch_check(ftc_model_parameter_count(model%p, n), "torch_model_parameter_count", stat, errmsg)
    count = int(n)
  end function torch_model_parameter_count

  !> Tensors sharing storage with the model’s parameters, in parameters() order. The array size
  !> must equal the parameter count and its elements must not be constructed.
  subroutine torch_model_parameters(model, output_tensors, stat, errmsg)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> Unconstructed tensors, as many as the model has parameters; each becomes a tensor sharing
    !> the storage of one parameter.
    type(torch_tensor), intent(inout) :: output_tensors(:)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: handles(size(output_tensors))
    integer :: i, status
    do i = 1, size(output_tensors)
      handles(i) = output_tensors(i)%p
    end do
    status = ftc_model_parameters(model%p, handles, size(handles, kind=c_int64_t))
    if (status == 0) then
      do i = 1, size(output_tensors)
        output_tensors(i)%p = handles(i)
      end do
    end if
    call ftorch_check(status, "torch_model_parameters", stat, errmsg)
  end subroutine torch_model_parameters

  subroutine parameter_by_name(model, name, tensor, stat, errmsg)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    character(len=*), intent(in) :: name          !< as in named_parameters(), e.g. "fc1.weight"
    type(torch_tensor), intent(inout) :: tensor   !< replaced (a live tensor is freed first)
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_model_parameter(model%p, c_string(name), -1_c_int64_t, tensor%p), &
                      "torch_model_parameter", stat, errmsg)
  end subroutine parameter_by_name

  subroutine parameter_by_index(model, index, tensor, stat, errmsg)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    integer, intent(in) :: index                  !< 1-based, in parameters() order
    !> Replaced by a tensor sharing the parameter’s storage (a live tensor is freed first).
    type(torch_tensor), intent(inout) :: tensor
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    call ftorch_check(ftc_model_parameter(model%p, c_string(""), int(index - 1, c_int64_t), tensor%p), &
                      "torch_model_parameter", stat, errmsg)
  end subroutine parameter_by_index

  !> Name of parameter `index` (1-based), e.g. "fc1.weight".
  function torch_model_parameter_name(model, index, stat, errmsg) result(name)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> Index of the parameter: 1-based, in parameters() order.
    integer, intent(in) :: index
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    character(len=:), allocatable :: name
    character(kind=c_char) :: buf(1024)
    integer(c_int64_t) :: length
    integer :: i
    length = 0
    call ftorch_check(ftc_model_parameter_name(model%p, int(index - 1, c_int64_t), buf, &
                                               size(buf, kind=c_int64_t), length), &
                      "torch_model_parameter_name", stat, errmsg)
    allocate(character(len=min(length, size(buf, kind=c_int64_t))) :: name)
    do i = 1, len(name)
      name(i:i) = buf(i)
    end do
  end function torch_model_parameter_name

  !> Total number of parameter elements (only trainable ones if trainable_only).
  function torch_model_num_parameters(model, trainable_only, stat, errmsg) result(count)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> Count only the parameters that require grad (default .false.: all of them).
    logical, intent(in), optional :: trainable_only
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: count
    count = 0
    call ftorch_check(ftc_model_numel(model%p, c_flag(trainable_only), count), "torch_model_num_parameters", &
                      stat, errmsg)
  end function torch_model_num_parameters

  !> Stop training the parameters named `name` or under it ("fc1" freezes fc1.weight and
  !> fc1.bias; "" freezes all): requires_grad off.
  subroutine torch_model_freeze(model, name, stat, errmsg)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> A parameter’s name ("fc1.weight"), a submodule’s ("fc1"), or "" for the whole model.
    character(len=*), intent(in) :: name
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: matched
    call ftorch_check(ftc_model_set_requires_grad(model%p, c_string(name), 0_c_int, matched), "torch_model_freeze", &
                      stat, errmsg)
  end subroutine torch_model_freeze

  !> Train the parameters named `name` or under it again: requires_grad on.
  subroutine torch_model_unfreeze(model, name, stat, errmsg)
    !> A loaded TorchScript model.
    type(torch_model), intent(in) :: model
    !> A parameter’s name ("fc1.weight"), a submodule’s ("fc1"), or "" for the whole model.
    character(len=*), intent(in) :: name
    !> Status: 0 on success, else an `FTORCH_ERR_*` code. When absent, a failure stops the program.
    integer, intent(out), optional :: stat
    !> On failure, when `stat` is present: the message "[procedure] reason" (unchanged otherwise).
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: matched
    call ftorch_check(ftc_model_set_requires_grad(model%p, c_string(name), 1_c_int, matched), &
                      "torch_model_unfreeze", stat, errmsg)
  end subroutine torch_model_unfreeze

  !> Switch TorchScript’s graph-executor optimization on or off for the models FTorch runs
  !> (default off: every call runs the same operators, so results never depend on how many calls
  !> came before, and a resumed run reproduces an uninterrupted one bit for bit).
  subroutine torch_jit_set_optimize(enabled)
    !> .true. to switch optimization on, .false. to switch it off.
    logical, intent(in) :: enabled
    call ftc_set_jit_optimize(c_flag(enabled))
  end subroutine torch_jit_set_optimize

  ! `dst = src`: a second handle to the model of src.
  impure elemental subroutine torch_model_share(dst, src)
    !> Left-hand side: becomes a second handle to src’s model (a handle it held is released).
    class(torch_model), intent(inout) :: dst
    !> Right-hand side (unloaded: dst becomes unloaded too).
    type(torch_model), intent(in) :: src
    call ftorch_check(ftc_model_share(src%p, dst%p), "assignment(=)")
  end subroutine torch_model_share

  ! Finalizer of scalars: frees the object, writing nothing (see ftorch_tensor_type’s finalize).
  subroutine finalize_model(object)
    type(torch_model), intent(inout) :: object
    call ftc_model_release(object%p)
  end subroutine finalize_model

  !> Free the model (a no-op if not loaded, or for a copy of a deleted handle).
  impure elemental subroutine torch_model_delete(model)
    !> The model (or, elementally, an array of models); its handle is null on return.
    type(torch_model), intent(inout) :: model
    integer(c_int) :: status
    status = ftc_model_delete(model%p)
  end subroutine torch_model_delete

end module ftorch_model
