!> A TorchFort program (module torchfort, unchanged API): trains each configuration named in
!> DIR/configs.txt on fixed data and writes its losses and final inference to DIR/<name>.out and the
!> model to DIR/<name>.pt (tests/test_torchfort.py compares them with PyTorch); then resumes a
!> checkpoint bit for bit, reloads a saved model, trains through tensor lists and checks the errors.
program test_torchfort
  use, intrinsic :: iso_fortran_env, only: real32, real64, int32, int64
  use torchfort
  use testing, only: check, summary
  implicit none

  integer, parameter :: nsteps = 8, nbatch = 6
  character(len=512) :: dir
  character(len=64) :: name, first
  real(real32) :: x(4, nbatch), y(3, nbatch), out(3, nbatch), out2(3, nbatch), loss, losses(nsteps)
  real(real64) :: xd(4, nbatch), yd(3, nbatch), outd(3, nbatch), lossd, lossesd(nsteps)
  real(real32) :: l1(4), l2(4), big(4, 2 * nbatch)
  integer :: i, j, b, u, ios, res
  integer(int64) :: st, si
  integer(int32) :: st32, si32
  type(torchfort_tensor_list) :: inputs, labels, outputs

  call get_command_argument(1, dir)
  do b = 1, nbatch
    do i = 1, 4
      x(i, b) = real(mod(i * 7 + b * 3, 11) - 5, real32) / 8.0
    end do
    do j = 1, 3
      y(j, b) = real(mod(j * 5 + b * 2, 7) - 3, real32) / 4.0
    end do
  end do
  xd = real(x, real64)
  yd = real(y, real64)

  ! Each configuration: 8 training steps, then inference, then the model saved.
  first = ""
  open (newunit=u, file=trim(dir)//"/configs.txt", status="old", action="read")
  do
    read (u, '(a)', iostat=ios) name
    if (ios /= 0) exit
    if (first == "") first = name
    call check(torchfort_set_manual_seed(1234) == TORCHFORT_RESULT_SUCCESS, "seed")
    res = torchfort_create_model(trim(name), trim(dir)//"/"//trim(name)//".yaml", TORCHFORT_DEVICE_CPU)
    call check(res == TORCHFORT_RESULT_SUCCESS, "create "//trim(name))
    if (name(1:2) == "f8") then  ! a float64 TorchScript model
      do i = 1, nsteps
        res = torchfort_train(trim(name), xd, yd, lossd)
        lossesd(i) = lossd
      end do
      call check(res == TORCHFORT_RESULT_SUCCESS, "train "//trim(name))
      res = torchfort_inference(trim(name), xd, outd)
      call check(res == TORCHFORT_RESULT_SUCCESS, "inference "//trim(name))
      call write_out(trim(dir)//"/"//trim(name)//".out", lossesd, reshape(outd, [3 * nbatch]))
    else
      do i = 1, nsteps
        res = torchfort_train(trim(name), x, y, loss)
        losses(i) = loss
      end do
      call check(res == TORCHFORT_RESULT_SUCCESS, "train "//trim(name))
      res = torchfort_inference(trim(name), x, out)
      call check(res == TORCHFORT_RESULT_SUCCESS, "inference "//trim(name))
      call write_out(trim(dir)//"/"//trim(name)//".out", real(losses, real64), real(reshape(out, [3 * nbatch]), real64))
    end if
    call check(torchfort_save_model(trim(name), trim(dir)//"/"//trim(name)//".pt") == TORCHFORT_RESULT_SUCCESS, &
               "save_model "//trim(name))
  end do
  close (u)

  ! A checkpoint resumes bit for bit, into a model that started from other weights.
  call check(torchfort_set_manual_seed(1) == 0, "seed")
  call check(torchfort_create_model("r1", trim(dir)//"/"//trim(first)//".yaml", TORCHFORT_DEVICE_CPU) == 0, "create r1")
  do i = 1, 3
    res = torchfort_train("r1", x, y, loss)
  end do
  res = torchfort_inference("r1", x, out)  ! one inference step counted
  call check(torchfort_save_checkpoint("r1", trim(dir)//"/ckpt") == 0, "save_checkpoint")
  do i = 1, 4
    res = torchfort_train("r1", x, y, l1(i))
  end do
  call check(torchfort_set_manual_seed(99) == 0, "seed")
  call check(torchfort_create_model("r2", trim(dir)//"/"//trim(first)//".yaml", TORCHFORT_DEVICE_CPU) == 0, "create r2")
  call check(torchfort_load_checkpoint("r2", trim(dir)//"/ckpt", st, si) == 0, "load_checkpoint")
  call check(st == 3 .and. si == 1, "checkpoint step counters")
  do i = 1, 4
    res = torchfort_train("r2", x, y, l2(i))
  end do
  call check(all(l1 == l2), "resumed training equals uninterrupted training bit for bit")
  ! With dropout too: the checkpoint restores the random generators, so the masks go on as they would have.
  call check(torchfort_set_manual_seed(3) == 0, "seed")
  call check(torchfort_create_model("d1", trim(dir)//"/adam_dropout.yaml", TORCHFORT_DEVICE_CPU) == 0, "create d1")
  res = torchfort_train("d1", x, y, loss)
  call check(torchfort_save_checkpoint("d1", trim(dir)//"/ckpt_dropout") == 0, "save_checkpoint d1")
  do i = 1, 4
    res = torchfort_train("d1", x, y, l1(i))
  end do
  call check(torchfort_set_manual_seed(98) == 0, "seed")
  call check(torchfort_create_model("d2", trim(dir)//"/adam_dropout.yaml", TORCHFORT_DEVICE_CPU) == 0, "create d2")
  call check(torchfort_load_checkpoint("d2", trim(dir)//"/ckpt_dropout", st, si) == 0, "load_checkpoint d2")
  do i = 1, 4
    res = torchfort_train("d2", x, y, l2(i))
  end do
  call check(all(l1 == l2), "with dropout, resumed training equals uninterrupted training bit for bit")
  call check(torchfort_load_checkpoint("r2", trim(dir)//"/ckpt", st32, si32) == 0, &
             "load_checkpoint with default-integer counters")
  call check(st32 == 3 .and. si32 == 1, "default-integer counters")
  ! torchfort_wandb_log: every kind of value with either kind of step (the hook is off for r2:
  ! nothing is written, tests/test_torchfort.py checks the log of a model with it on).
  call check(torchfort_wandb_log("r2", "m", 3_int64, 1_int32) == 0 .and. torchfort_wandb_log("r2", "m", 3_int32, 1_int32) == 0 &
             .and. torchfort_wandb_log("r2", "m", 3_int64, 1.0_real32) == 0 &
             .and. torchfort_wandb_log("r2", "m", 3_int32, 1.0_real32) == 0 &
             .and. torchfort_wandb_log("r2", "m", 3_int64, 1.0_real64) == 0 &
             .and. torchfort_wandb_log("r2", "m", 3_int32, 1.0_real64) == 0, &
             "torchfort_wandb_log: int, float and double values with int64 or int32 steps")
  call check(torchfort_load_checkpoint("r2", trim(dir)//"/no_such_dir", st, si) == TORCHFORT_RESULT_INVALID_USAGE, &
             "a missing checkpoint directory is INVALID_USAGE")
  ! Counters beyond 32 bits (ckpt_big, written by tests/test_torchfort.py): the default-integer
  ! form says so rather than wrapping them; the int64 form gives them.
  call check(torchfort_create_model("big", trim(dir)//"/"//trim(first)//".yaml", TORCHFORT_DEVICE_CPU) == 0, &
             "create big")
  call check(torchfort_load_checkpoint("big", trim(dir)//"/ckpt_big", st32, si32) == TORCHFORT_RESULT_INVALID_USAGE, &
             "default-integer counters that cannot hold the checkpoint's are INVALID_USAGE")
  call check(torchfort_load_checkpoint("big", trim(dir)//"/ckpt_big", st, si) == 0 .and. st == 2_int64**40, &
             "int64 counters hold them")
  ! ... and within an accumulation cycle (sgd_multistep_accum of tests/test_torchfort.py: 2 calls
  ! per optimizer step): the gradient of call 3 is part of the step taken at call 4.
  call check(torchfort_create_model("a1", trim(dir)//"/sgd_multistep_accum.yaml", TORCHFORT_DEVICE_CPU) == 0, &
             "create a1")
  do i = 1, 3
    res = torchfort_train("a1", x, y, loss)
  end do
  call check(torchfort_save_checkpoint("a1", trim(dir)//"/ckpt_accum") == 0, "save_checkpoint within a cycle")
  do i = 1, 4
    res = torchfort_train("a1", x, y, l1(i))
  end do
  call check(torchfort_set_manual_seed(98) == 0, "seed")
  call check(torchfort_create_model("a2", trim(dir)//"/sgd_multistep_accum.yaml", TORCHFORT_DEVICE_CPU) == 0, &
             "create a2")
  call check(torchfort_load_checkpoint("a2", trim(dir)//"/ckpt_accum", st, si) == 0, "load_checkpoint a2")
  do i = 1, 4
    res = torchfort_train("a2", x, y, l2(i))
  end do
  call check(st == 3 .and. all(l1 == l2), &
             "a checkpoint taken within an accumulation cycle resumes it bit for bit")

  ! A saved model loads into another model of the same configuration.
  call check(torchfort_set_manual_seed(7) == 0, "seed")
  call check(torchfort_create_model("lm", trim(dir)//"/"//trim(first)//".yaml", TORCHFORT_DEVICE_CPU) == 0, "create lm")
  call check(torchfort_load_model("lm", trim(dir)//"/"//trim(first)//".pt") == 0, "load_model")
  call check(torchfort_inference("lm", x, out2) == 0, "inference lm")
  call check(torchfort_inference(trim(first), x, out) == 0, "inference again")
  call check(all(out == out2), "a loaded model computes what the saved one did")

  ! Tensor lists: the same first step as the array form.
  call check(torchfort_set_manual_seed(1234) == 0, "seed")
  call check(torchfort_create_model("ma", trim(dir)//"/"//trim(first)//".yaml", TORCHFORT_DEVICE_CPU) == 0, "create ma")
  call check(torchfort_tensor_list_create(inputs) == 0, "list create")
  call check(torchfort_tensor_list_create(labels) == 0, "list create")
  call check(torchfort_tensor_list_create(outputs) == 0, "list create")
  call check(torchfort_tensor_list_add_tensor(inputs, x) == 0, "add input")
  call check(torchfort_tensor_list_add_tensor(labels, y) == 0, "add label")
  call check(torchfort_tensor_list_add_tensor(outputs, out2) == 0, "add output")
  call check(torchfort_train_multiarg("ma", inputs, labels, loss) == 0, "train_multiarg")
  call read_first_loss(trim(dir)//"/"//trim(first)//".out", lossd)
  call check(loss == real(lossd, real32), "train_multiarg: first loss equals that of train")
  call check(torchfort_inference_multiarg("ma", inputs, outputs) == 0, "inference_multiarg")
  call check(torchfort_inference("ma", x, out) == 0, "inference ma")
  call check(all(out == out2), "inference_multiarg fills the array of the list")
  call check(torchfort_tensor_list_add_tensor(inputs, big(:, 1:2 * nbatch:2)) == TORCHFORT_RESULT_INVALID_USAGE, &
             "a non-contiguous array is refused by a tensor list (it keeps a reference)")
  call check(torchfort_tensor_list_destroy(inputs) == 0 .and. torchfort_tensor_list_destroy(labels) == 0 .and. &
             torchfort_tensor_list_destroy(outputs) == 0, "list destroy")

  ! Errors: the result codes of TorchFort, nothing stops the program.
  call check(torchfort_train("no_such_model", x, y, loss) == TORCHFORT_RESULT_INVALID_USAGE, "unknown model name")
  call check(torchfort_inference(trim(first), x, out(:, 1:5)) == TORCHFORT_RESULT_INVALID_USAGE, &
             "an output array of the wrong size")
  call check(torchfort_train(trim(first), x(1:3, :), y, loss) == TORCHFORT_RESULT_INVALID_USAGE, &
             "an input of the wrong shape")
  call check(torchfort_create_model(trim(first), trim(dir)//"/"//trim(first)//".yaml", -1) == &
             TORCHFORT_RESULT_INVALID_USAGE, "a name in use")
  call check(torchfort_create_model("bad1", trim(dir)//"/bad_key.yaml", -1) == TORCHFORT_RESULT_INVALID_USAGE, &
             "an unknown configuration key")
  call check(torchfort_create_model("bad2", trim(dir)//"/missing.yaml", -1) == TORCHFORT_RESULT_INVALID_USAGE, &
             "a missing configuration file")
  call check(torchfort_create_model("noopt", trim(dir)//"/no_optimizer.yaml", -1) == 0, "create without optimizer")
  call check(torchfort_train("noopt", x, y, loss) == TORCHFORT_RESULT_INVALID_USAGE, "training needs an optimizer")
  call check(torchfort_inference("noopt", x, out) == 0, "inference works without optimizer")
  call summary()

contains

  subroutine write_out(path, l, o)
    character(len=*), intent(in) :: path
    real(real64), intent(in) :: l(:), o(:)
    integer :: v, k
    open (newunit=v, file=path, status="replace", action="write")
    do k = 1, size(l)
      write (v, '(es25.17)') l(k)
    end do
    do k = 1, size(o)
      write (v, '(es25.17)') o(k)
    end do
    close (v)
  end subroutine write_out

  subroutine read_first_loss(path, value)
    character(len=*), intent(in) :: path
    real(real64), intent(out) :: value
    integer :: v
    open (newunit=v, file=path, status="old", action="read")
    read (v, *) value
    close (v)
  end subroutine read_first_loss

end program test_torchfort
