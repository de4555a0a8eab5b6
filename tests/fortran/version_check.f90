!> Run with a LibTorch whose version differs from the one FTorch was built against (pytest sets
!> this up): every call fails with FTORCH_ERR_VERSION through stat and the program continues.
program version_check
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  use testing, only: check, summary, data_path
  implicit none
  type(torch_tensor) :: t
  type(torch_model) :: model
  real(real64), target :: x(3)
  integer :: stat
  character(len=512) :: msg

  call ftorch_check_runtime(stat, msg)
  call check(stat == FTORCH_ERR_VERSION, "ftorch_check_runtime reports the mismatch")
  call check(index(msg, "torch version mismatch") > 0 .and. index(msg, ftorch_torch_version()) > 0, &
             "the message names both versions")
  print '(a)', trim(msg)
  call torch_tensor_from_array(t, x, torch_kCPU, stat=stat, errmsg=msg)
  call check(stat == FTORCH_ERR_VERSION .and. index(msg, "[torch_tensor_from_array]") == 1, &
             "tensor construction fails with FTORCH_ERR_VERSION")
  call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU, stat=stat, errmsg=msg)
  call check(stat == FTORCH_ERR_VERSION, "model load fails with FTORCH_ERR_VERSION")
  call check(ftorch_runtime_torch_version() /= ftorch_torch_version(), "the runtime version is the one loaded")
  call summary()
end program version_check
