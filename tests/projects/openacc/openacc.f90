! OpenACC and FTorch without copies (pytorch-fortran's use case): arrays in an `!$acc data` region
! are wrapped through `!$acc host_data use_device` with torch_tensor_from_blob(...,
! device_memory=.true.), a model runs forward into one of them and trains on them, and OpenACC
! kernels and FTorch see each other's writes. With an NVIDIA GPU (code offloaded, torch with CUDA)
! the tensors are CUDA tensors over OpenACC's device copies; without one OpenACC runs on the host
! and the same program wraps the host arrays (device CPU). The same steps with tensors made by
! torch_tensor_from_array are the reference. Usage: openacc DATA_DIR (simplenet_f64.pt).
program openacc_ftorch
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_loc
  use, intrinsic :: iso_fortran_env, only: real64
  use openacc, only: acc_device_host, acc_on_device
  use ftorch
  use device_checks, only: check, make_optim, parameters_of, summary
  implicit none
  integer, parameter :: n = 5
  character(len=1024) :: dir
  real(real64), target :: x(n), y(n), t(n), xr(n), yr(n), tr(n), back(n)
  real(real64) :: loss, loss_ref, p(n * n + n), p_ref(n * n + n)
  type(torch_model) :: model, reference
  type(torch_optim) :: optim, optim_ref
  type(torch_tensor) :: tx, ty, tt, rx, ry, rt, probe
  integer(c_int) :: device
  integer :: i
  logical :: on_gpu

  call get_command_argument(1, dir)
  ! gfortran's OpenACC (libgomp) shares the CUDA context that is current when it first opens the
  ! GPU, and otherwise creates its own, whose kernels fail ("cuLaunchKernel error: invalid resource
  ! handle") once torch has made CUDA's primary context current. So FTorch touches the GPU first:
  ! then both use the primary context.
  if (torch_device_available(torch_kCUDA)) then
    call torch_tensor_zeros(probe, 1_c_int, [1_c_int64_t], torch_kFloat64, torch_kCUDA)
    call torch_delete(probe)
  end if
  ! Where OpenACC's kernels (and so its copies of the arrays) run: on the GPU only where the code
  ! was compiled for it and a device is there; otherwise on the host.
  on_gpu = .false.
  !$acc parallel num_gangs(1) copy(on_gpu)
  on_gpu = .not. acc_on_device(acc_device_host)
  !$acc end parallel
  device = torch_kCPU
  if (on_gpu) device = torch_kCUDA
  if (device == torch_kCUDA) then
    print '(a)', "OpenACC on an NVIDIA GPU: CUDA tensors"
  else
    print '(a)', "OpenACC on the host: CPU tensors"
  end if
  x = [(-1.0d0 + 0.5d0 * (i - 1), i = 1, n)]
  t = [(0.1d0 * i, i = 1, n)]
  y = 0
  xr = x
  tr = t
  call torch_model_load(model, trim(dir) // "/simplenet_f64.pt", device, is_training=.true.)
  call torch_model_load(reference, trim(dir) // "/simplenet_f64.pt", torch_kCPU, is_training=.true.)
  call torch_tensor_from_array(rx, xr, torch_kCPU)
  call torch_tensor_from_array(ry, yr, torch_kCPU)
  call torch_tensor_from_array(rt, tr, torch_kCPU)

  !$acc data copyin(x, t) copy(y)
  !$acc host_data use_device(x, y, t)
  call torch_tensor_from_blob(tx, c_loc(x), 1_c_int, [int(n, c_int64_t)], [1_c_int], torch_kFloat64, device, &
                              device_memory=.true.)
  call torch_tensor_from_blob(ty, c_loc(y), 1_c_int, [int(n, c_int64_t)], [1_c_int], torch_kFloat64, device, &
                              device_memory=.true.)
  call torch_tensor_from_blob(tt, c_loc(t), 1_c_int, [int(n, c_int64_t)], [1_c_int], torch_kFloat64, device, &
                              device_memory=.true.)
  !$acc end host_data

  ! Forward writes into OpenACC's copy of y; `update self` brings it to the host. Tolerance: a GPU's
  ! float64 dot products of length 5 may round differently from the CPU's in the last bits (~1e-16).
  call torch_model_forward(model, [tx], [ty])
  call torch_model_forward(reference, [rx], [ry])
  !$acc update self(y)
  call check(maxval(abs(y - yr)) <= 1d-12, "forward into an array of an OpenACC data region")

  ! An OpenACC kernel doubles x where OpenACC keeps it; the tensor over it sees the new values.
  !$acc parallel loop present(x)
  do i = 1, n
    x(i) = 2 * x(i)
  end do
  call torch_tensor_to_array(tx, back)
  call check(all(back == 2 * xr), "an OpenACC kernel's write is seen through the tensor")
  ! FTorch writes through the tensor; an OpenACC kernel reads what it wrote.
  tx = 0.5_real64
  !$acc parallel loop present(x, y)
  do i = 1, n
    y(i) = x(i) + 1
  end do
  !$acc update self(y)
  call check(all(y == 1.5_real64), "a write through the tensor is seen by an OpenACC kernel")
  xr = 0.5_real64

  ! Three SGD steps on the wrapped arrays, against the same steps on the CPU arrays.
  call make_optim(model, optim, .false.)
  call make_optim(reference, optim_ref, .false.)
  do i = 1, 3
    call torch_train_step(model, optim, [tx], tt, loss)
    call torch_train_step(reference, optim_ref, [rx], rt, loss_ref)
  end do
  call check(abs(loss - loss_ref) <= 1d-12 * abs(loss_ref), "training on the wrapped arrays: the CPU's loss")
  call parameters_of(model, p)
  call parameters_of(reference, p_ref)
  call check(maxval(abs(p - p_ref)) <= 1d-12, "... and the CPU's parameters")
  call torch_delete(tx)
  call torch_delete(ty)
  call torch_delete(tt)
  !$acc end data

  call torch_delete(rx)
  call torch_delete(ry)
  call torch_delete(rt)
  call torch_delete(optim)
  call torch_delete(optim_ref)
  call torch_delete(model)
  call torch_delete(reference)
  call summary()
end program openacc_ftorch
