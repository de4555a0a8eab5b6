! Device memory from Fortran without a copy and without OpenACC (pytorch-fortran's use case):
! CUDA memory allocated through libcudart (bind(c) to cudaMalloc / cudaMemcpy / cudaFree) is
! wrapped by torch_tensor_from_blob(..., device_memory=.true.); a model runs forward and a training
! step on it, and the results are read back with cudaMemcpy; FTorch's GPU idiom (CUDA model and
! input, output over a host array); then ten Adam steps captured as a CUDA
! graph (torch_train_step(..., cuda_graph=.true.)) on the same buffers, new data copied into them
! before each step. The same runs on the CPU are the reference. Usage: device_memory DATA_DIR [CPU_DIR]
! (simplenet_f64.pt in each: the CUDA model from DATA_DIR, the CPU reference from CPU_DIR, default
! DATA_DIR; a training package exported for each device can stand in the TorchScript file's place).
! Exit status 77: no CUDA device.
module cudart
  use, intrinsic :: iso_c_binding, only: c_int, c_ptr, c_size_t
  implicit none
  integer(c_int), parameter :: cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2
  interface
    integer(c_int) function cudaMalloc(ptr, size) bind(c, name="cudaMalloc")
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), intent(out) :: ptr
      integer(c_size_t), value :: size
    end function cudaMalloc
    integer(c_int) function cudaMemcpy(dst, src, count, kind) bind(c, name="cudaMemcpy")
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: dst, src
      integer(c_size_t), value :: count
      integer(c_int), value :: kind
    end function cudaMemcpy
    integer(c_int) function cudaFree(ptr) bind(c, name="cudaFree")
      import :: c_int, c_ptr
      type(c_ptr), value :: ptr
    end function cudaFree
  end interface
end module cudart

program device_memory
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_loc, c_ptr, c_size_t
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  use device_checks, only: check, make_optim, parameters_of, require, summary
  use cudart
  implicit none
  integer, parameter :: n = 5
  integer(c_size_t), parameter :: nbytes = n * 8
  character(len=1024) :: dir, cpu_dir
  type(c_ptr) :: x_dev, y_dev, t_dev
  real(real64), target :: x(n), y_cpu(n), y_back(n), y_idiom(n), t(n), p_gpu(n * n + n), p_cpu(n * n + n)
  type(torch_model) :: gpu_model, cpu_model
  type(torch_tensor) :: tx, ty, tt, cx, cy, ct, fx, fy, gx, gt, hx, ht
  type(torch_optim) :: gpu_opt, cpu_opt
  real(real64) :: loss_gpu, loss_cpu, graph_losses(10), cpu_losses(10)
  integer :: i, k

  call get_command_argument(1, dir)
  cpu_dir = dir
  if (command_argument_count() >= 2) call get_command_argument(2, cpu_dir)
  if (.not. torch_device_available(torch_kCUDA)) then
    print '(a)', "no CUDA device: skipped"
    stop 77
  end if
  x = [(-1.0d0 + 0.5d0 * (i - 1), i = 1, n)]
  t = [(0.1d0 * i, i = 1, n)]
  call require(cudaMalloc(x_dev, nbytes) == 0 .and. cudaMalloc(y_dev, nbytes) == 0 .and. &
               cudaMalloc(t_dev, nbytes) == 0, "cudaMalloc")
  call require(cudaMemcpy(x_dev, c_loc(x), nbytes, cudaMemcpyHostToDevice) == 0 .and. &
               cudaMemcpy(t_dev, c_loc(t), nbytes, cudaMemcpyHostToDevice) == 0, "cudaMemcpy to the device")

  ! The CUDA buffers as tensors, no copy; the same data on the CPU for the reference.
  call torch_tensor_from_blob(tx, x_dev, 1_c_int, [int(n, c_int64_t)], [1_c_int], torch_kFloat64, torch_kCUDA, &
                              device_memory=.true.)
  call torch_tensor_from_blob(ty, y_dev, 1_c_int, [int(n, c_int64_t)], [1_c_int], torch_kFloat64, torch_kCUDA, &
                              device_memory=.true.)
  call torch_tensor_from_blob(tt, t_dev, 1_c_int, [int(n, c_int64_t)], [1_c_int], torch_kFloat64, torch_kCUDA, &
                              device_memory=.true.)
  call torch_tensor_from_array(cx, x, torch_kCPU)
  call torch_tensor_from_array(cy, y_cpu, torch_kCPU)
  call torch_tensor_from_array(ct, t, torch_kCPU)
  call torch_model_load(gpu_model, trim(dir) // "/simplenet_f64.pt", torch_kCUDA, is_training=.true.)
  call torch_model_load(cpu_model, trim(cpu_dir) // "/simplenet_f64.pt", torch_kCPU, is_training=.true.)

  ! Forward writes into the CUDA buffer y_dev itself. Tolerance against the CPU: cuBLAS and the
  ! CPU's BLAS may order the float64 dot products of length 5 differently, a few ulps of O(1)
  ! values (~1e-16); 1e-12 bounds that with a wide margin, as device_paths.c does.
  call torch_model_forward(gpu_model, [tx], [ty])
  call torch_model_forward(cpu_model, [cx], [cy])
  call require(cudaMemcpy(c_loc(y_back), y_dev, nbytes, cudaMemcpyDeviceToHost) == 0, "cudaMemcpy back")
  call check(maxval(abs(y_back - y_cpu)) <= 1d-12, "forward on CUDA memory wrapped without a copy equals the CPU's")

  ! FTorch's GPU idiom, written as FTorch's docs and MultiGPU example write it: the input copied to
  ! the device by torch_tensor_from_array(..., layout, torch_kCUDA, device_index=0), the output a
  ! tensor over a host array; forward writes the results into the host array.
  y_idiom = -1
  call torch_tensor_from_array(fx, x, [1], torch_kCUDA, device_index=0)
  call torch_tensor_from_array(fy, y_idiom, [1], torch_kCPU)
  call torch_model_forward(gpu_model, [fx], [fy])
  call check(maxval(abs(y_idiom - y_cpu)) <= 1d-12, "FTorch's idiom: CUDA model and input, output in a host array")
  x = x + 1                     ! fx is a device copy: the host array's later values do not reach it
  call torch_model_forward(gpu_model, [fx], [fy])
  call check(maxval(abs(y_idiom - y_cpu)) <= 1d-12, "... the device input is a copy made once")
  x = x - 1
  call torch_delete(fx)
  call torch_delete(fy)

  ! Aliasing both ways: a write through the tensor is in y_dev, a cudaMemcpy into x_dev is in tx.
  ty = 0
  call require(cudaMemcpy(c_loc(y_back), y_dev, nbytes, cudaMemcpyDeviceToHost) == 0, "cudaMemcpy back")
  call check(all(y_back == 0), "ty = 0 zeroes the CUDA buffer (same memory)")
  call require(cudaMemcpy(x_dev, c_loc(t), nbytes, cudaMemcpyHostToDevice) == 0, "cudaMemcpy to the device")
  call torch_tensor_to_array(tx, y_back)
  call check(all(y_back == t), "a cudaMemcpy into the buffer is seen through the tensor")
  call require(cudaMemcpy(x_dev, c_loc(x), nbytes, cudaMemcpyHostToDevice) == 0, "cudaMemcpy to the device")

  ! Three SGD training steps on the wrapped buffers, against the same steps on the CPU.
  call make_optim(gpu_model, gpu_opt, .false.)
  call make_optim(cpu_model, cpu_opt, .false.)
  do i = 1, 3
    call torch_train_step(gpu_model, gpu_opt, [tx], tt, loss_gpu)
    call torch_train_step(cpu_model, cpu_opt, [cx], ct, loss_cpu)
  end do
  call parameters_of(gpu_model, p_gpu)
  call parameters_of(cpu_model, p_cpu)
  call check(abs(loss_gpu - loss_cpu) <= 1d-12 * abs(loss_cpu), "the training loss on the GPU equals the CPU's")
  call check(maxval(abs(p_gpu - p_cpu)) <= 1d-12, "the trained parameters equal the CPU's")

  ! Ten Adam steps as a CUDA graph (3 warm-up steps, then the capture, replayed), the inputs and
  ! targets changed in the device buffers before every step, against ten ordinary steps on the CPU
  ! on the same data. A replay that did not read the buffers, or an update that kept the learning
  ! rate or Adam's bias corrections of the captured step, would leave the CPU's trajectory.
  ! Tolerance: the GPU's and the CPU's float64 kernels round differently in the last bits (~1e-16
  ! relative per step); Adam divides by sqrt(v) + eps, which keeps such differences relative, so ten
  ! steps stay far within 1e-10.
  call fresh_adam()
  do i = 1, 10
    x = [(sin(0.3d0 * i + 0.7d0 * k), k = 1, n)]
    t = [(cos(0.2d0 * i - 0.4d0 * k), k = 1, n)]
    call require(cudaMemcpy(x_dev, c_loc(x), nbytes, cudaMemcpyHostToDevice) == 0 .and. &
                 cudaMemcpy(t_dev, c_loc(t), nbytes, cudaMemcpyHostToDevice) == 0, "cudaMemcpy to the device")
    call torch_train_step(gpu_model, gpu_opt, [tx], tt, graph_losses(i), cuda_graph=.true.)
    call torch_train_step(cpu_model, cpu_opt, [cx], ct, cpu_losses(i))
  end do
  call graph_steps_match_cpu("ten Adam steps as a CUDA graph, new data in the buffers each step: the CPU's losses")

  ! Ten more captured Adam steps, now on tensors that torch owns on the device (no wrapped buffer):
  ! the new data reaches them by `=` of an expression (a CUDA temporary) before each step. The graph
  ! reads its inputs at the addresses it captured, so `=` must write into them and never hand them
  ! other storage (a temporary's storage taken over, say): a replay would then read stale inputs and
  ! leave the CPU's losses. Same tolerance as above.
  call fresh_adam()
  call torch_tensor_from_array(gx, x, [1], torch_kCUDA, device_index=0)
  call torch_tensor_from_array(gt, t, [1], torch_kCUDA, device_index=0)
  do i = 1, 10
    x = [(cos(0.5d0 * i + 0.3d0 * k), k = 1, n)]
    t = [(sin(0.1d0 * i - 0.6d0 * k), k = 1, n)]
    call torch_tensor_from_array(hx, x, [1], torch_kCUDA, device_index=0)
    call torch_tensor_from_array(ht, t, [1], torch_kCUDA, device_index=0)
    gx = hx * 1.0_real64
    gt = ht + 0.0_real64
    call torch_delete(hx)
    call torch_delete(ht)
    call torch_train_step(gpu_model, gpu_opt, [gx], gt, graph_losses(i), cuda_graph=.true.)
    call torch_train_step(cpu_model, cpu_opt, [cx], ct, cpu_losses(i))
  end do
  call graph_steps_match_cpu("ten captured Adam steps on torch-owned CUDA inputs given new values by `=`: the CPU's losses")
  call torch_delete(gx)
  call torch_delete(gt)

  call torch_delete(tx)
  call torch_delete(ty)
  call torch_delete(tt)
  call torch_delete(cx)
  call torch_delete(cy)
  call torch_delete(ct)
  call torch_delete(gpu_opt)
  call torch_delete(cpu_opt)
  call torch_delete(gpu_model)
  call torch_delete(cpu_model)
  call require(cudaFree(x_dev) == 0 .and. cudaFree(y_dev) == 0 .and. cudaFree(t_dev) == 0, "cudaFree")
  call summary()

contains

  ! Both models loaded again from the file, each with a new Adam optimizer.
  subroutine fresh_adam()
    call torch_delete(gpu_opt)
    call torch_delete(cpu_opt)
    call torch_model_load(gpu_model, trim(dir) // "/simplenet_f64.pt", torch_kCUDA, is_training=.true.)
    call torch_model_load(cpu_model, trim(cpu_dir) // "/simplenet_f64.pt", torch_kCPU, is_training=.true.)
    call make_optim(gpu_model, gpu_opt, .true.)
    call make_optim(cpu_model, cpu_opt, .true.)
  end subroutine fresh_adam

  ! The ten captured steps' losses and the parameters they left against the CPU's.
  subroutine graph_steps_match_cpu(what)
    character(len=*), intent(in) :: what
    call parameters_of(gpu_model, p_gpu)
    call parameters_of(cpu_model, p_cpu)
    call check(maxval(abs(graph_losses - cpu_losses) / abs(cpu_losses)) <= 1d-10, what)
    call check(maxval(abs(p_gpu - p_cpu)) <= 1d-10 * maxval(abs(p_cpu)), "... and the CPU's parameters")
  end subroutine graph_steps_match_cpu
end program device_memory
