!> Long loops keep memory flat: construction, deletion, reconstruction and forward passes.
program test_memory
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use, intrinsic :: iso_fortran_env, only: int64, real64
  use ftorch
  use testing, only: check, summary, data_path, rss_kib
  implicit none
  integer, parameter :: warmup = 2000, steps = 20000
  real(real64), target :: x(5), y(5), big(1000)
  type(torch_model) :: model
  type(torch_tensor) :: tin(1), tout(1), tmp
  integer(c_int64_t) :: base
  integer(int64) :: rss_warm, rss_end
  integer :: i

  x = 0.5d0
  big = 1.0d0
  base = ftorch_live_handles()
  call torch_model_load(model, data_path("simplenet_f64.pt"), torch_kCPU)
  call torch_tensor_from_array(tin(1), x, torch_kCPU)
  call torch_tensor_from_array(tout(1), y, torch_kCPU)
  do i = 1, warmup + steps
    if (i == warmup) rss_warm = rss_kib()
    call torch_tensor_from_array(tmp, big, torch_kCPU)       ! reconstruct into a live tensor
    call torch_model_forward(model, tin, tout)
    call torch_tensor_zeros(tmp, 1, [100_c_int64_t], torch_kFloat32, torch_kCPU)
    call torch_tensor_delete(tmp)
  end do
  rss_end = rss_kib()
  print '(a,i0,a,i0,a)', "RSS after warm-up ", rss_warm, " KiB, after the loop ", rss_end, " KiB"
  call check(rss_end - rss_warm < 2048, "RSS stays flat (< 2 MiB growth) over 20000 iterations")
  call check(ftorch_live_handles() == base + 3, "only the three long-lived handles are alive")
  call torch_delete(tin)
  call torch_delete(tout)
  call torch_delete(model)
  call check(ftorch_live_handles() == base, "all handles freed")
  call summary()
end program test_memory
