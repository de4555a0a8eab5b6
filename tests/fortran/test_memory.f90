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
  call operator_loops()
  call summary()
contains

  ! 10^5 operator expressions: temporaries are released without relying on finalization, and
  ! re-assignment replaces the autograd history instead of growing it.
  subroutine operator_loops()
    integer, parameter :: n = 100000
    real(real64), target :: a(8), b(8), c(8), one(1)
    type(torch_tensor) :: ta, tb, tc, pa, pb, q, tone
    integer(c_int64_t) :: handles
    a = 1.5d0
    b = 0.5d0
    call torch_tensor_from_array(ta, a, torch_kCPU)
    call torch_tensor_from_array(tb, b, torch_kCPU)
    call torch_tensor_from_array(tc, c, torch_kCPU)
    call torch_tensor_from_array(pa, a, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(pb, b, torch_kCPU, requires_grad=.true.)
    call torch_tensor_from_array(tone, one, torch_kCPU)
    handles = ftorch_live_handles()
    do i = 1, n
      if (i == n / 10) rss_warm = rss_kib()
      tc = ta * tb + ta - tb / 2
    end do
    rss_end = rss_kib()
    print '(a,i0,a,i0,a)', "operator loop: RSS ", rss_warm, " -> ", rss_end, " KiB"
    call check(all(c == a * b + a - b / 2), "c = a*b + a - b/2 lands in c")
    call check(rss_end - rss_warm < 2048, "10^5 operator expressions keep RSS flat")
    call check(ftorch_live_handles() == handles, "10^5 operator expressions leave no handles behind")
    do i = 1, n
      if (i == n / 10) rss_warm = rss_kib()
      q = pa * pb + 2.0d0 * pa
      call torch_tensor_sum(tone, q)
      call torch_tensor_backward(tone)
      call pa%zero_grad()
    end do
    rss_end = rss_kib()
    print '(a,i0,a,i0,a)', "autograd loop: RSS ", rss_warm, " -> ", rss_end, " KiB"
    call check(rss_end - rss_warm < 2048, "10^5 forward/backward steps keep RSS flat")
    call check(ftorch_live_handles() == handles + 1, "only q was added")
    call torch_delete(q); call torch_delete(ta); call torch_delete(tb); call torch_delete(tc)
    call torch_delete(pa); call torch_delete(pb); call torch_delete(tone)
  end subroutine operator_loops
end program test_memory
