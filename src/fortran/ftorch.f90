!> Umbrella module: `use ftorch` gives the whole FTorch interface. It only re-exports.
module ftorch
  use ftorch_types, only: ftorch_int, torch_kInt8, torch_kInt16, torch_kInt32, torch_kInt64, &
                          torch_kFloat32, torch_kFloat64, torch_kBool, torch_kBFloat16, torch_kUInt8, torch_kFloat16, &
                          torch_kNone, torch_kMean, torch_kSum
  use ftorch_devices, only: torch_kCPU, torch_kCUDA, torch_kHIP, torch_kXPU, torch_kMPS
  use ftorch_errors, only: FTORCH_OK, FTORCH_ERR_INVALID_ARGUMENT, FTORCH_ERR_NULL_HANDLE, FTORCH_ERR_DTYPE, &
                           FTORCH_ERR_DEVICE, FTORCH_ERR_IO, FTORCH_ERR_TORCH, FTORCH_ERR_VERSION, &
                           FTORCH_ERR_INTERNAL, FTORCH_ERR_CALLBACK, FTORCH_ERR_DISTRIBUTED, FTORCH_ERR_PYTHON, &
                           FTORCH_ERR_SHAPE, torch_catch_begin, &
                           torch_catch_end, ftorch_last_error
  use ftorch_runtime, only: ftorch_version, ftorch_torch_version, ftorch_runtime_torch_version, &
                            ftorch_check_runtime, torch_device_available, ftorch_live_handles, torch_manual_seed
  use ftorch_callbacks, only: ftorch_callbacks_registered
  use ftorch_tensor_type, only: torch_tensor, torch_tensor_from_array, torch_tensor_from_blob, torch_tensor_empty, &
                                torch_tensor_zeros, torch_tensor_ones, torch_tensor_delete, torch_tensor_get_rank, &
                                torch_tensor_get_shape, torch_tensor_get_stride, torch_tensor_get_dtype, &
                                torch_tensor_get_device_type, torch_tensor_get_device_index, &
                                torch_tensor_requires_grad, torch_tensor_print, torch_tensor_zero, torch_tensor_to, &
                                torch_tensor_data_pointer, torch_tensor_to_array, torch_tensor_zero_grad
  use ftorch_math, only: assignment(=), operator(+), operator(-), operator(*), operator(/), operator(**), &
                         torch_tensor_sum, torch_tensor_mean, torch_sum, torch_mean, torch_matmul, torch_reshape, &
                         torch_permute, torch_transpose, torch_exp, torch_log, torch_sqrt, torch_abs, torch_sin, &
                         torch_cos, torch_tanh, torch_sigmoid, torch_relu, torch_clone, torch_detach, torch_result, &
                         torch_assign
  use ftorch_autograd, only: torch_tensor_backward, torch_tensor_get_gradient, torch_tensor_set_requires_grad, &
                             torch_tensor_is_leaf, torch_no_grad_begin, torch_no_grad_end, torch_enable_grad_begin, &
                             torch_enable_grad_end, torch_inference_mode_begin, torch_inference_mode_end, &
                             torch_grad_enabled, torch_inference_mode_enabled, torch_tensor_set_gradient, &
                             torch_grad_hook, torch_tensor_register_hook, torch_tensor_remove_hook, &
                             torch_autograd_set_detect_anomaly, torch_autograd_detect_anomaly_enabled
  use ftorch_function, only: torch_function, torch_function_ctx, torch_function_forward, torch_function_backward, &
                             torch_tensor_function, torch_function_define, torch_function_apply
  use ftorch_saved_tensors, only: torch_pack_hook, torch_unpack_hook, torch_saved_tensors_hooks_begin, &
                                  torch_saved_tensors_to_cpu_begin, torch_saved_tensors_to_files_begin, &
                                  torch_saved_tensors_hooks_end, torch_saved_tensors_files, torch_checkpoint_segment
  use ftorch_functional, only: torch_autograd_grad, torch_autograd_jacobian, torch_autograd_jvp, torch_autograd_vjp, &
                               torch_gradcheck, torch_gradcheck_result
  use ftorch_model, only: torch_model, torch_model_load, torch_model_forward, torch_model_save, &
                          torch_model_is_training, torch_model_print_parameters, torch_model_delete, &
                          torch_model_parameters, torch_model_parameter_count, torch_model_parameter, &
                          torch_model_parameter_name, torch_model_num_parameters, torch_model_freeze, &
                          torch_model_unfreeze, torch_jit_set_optimize
  use ftorch_optim, only: torch_optim, torch_optim_SGD, torch_optim_Adam, torch_optim_AdamW, torch_optim_RMSprop, &
                          torch_optim_Adagrad, torch_optim_LBFGS, torch_optim_step, torch_optim_step_closure, &
                          torch_optim_zero_grad, torch_optim_delete, torch_optim_get_learning_rate, &
                          torch_optim_set_learning_rate, torch_optim_step_count, torch_optim_clip_grad_norm, &
                          torch_optim_clip_grad_value, torch_closure, torch_scheduler, torch_scheduler_step_lr, &
                          torch_scheduler_multistep_lr, torch_scheduler_exponential_lr, &
                          torch_scheduler_cosine_annealing_lr, torch_scheduler_reduce_on_plateau, &
                          torch_scheduler_linear_lr, torch_scheduler_step, torch_scheduler_get_last_lr, &
                          torch_scheduler_delete
  use ftorch_loss, only: torch_loss_mse, torch_loss_cross_entropy, torch_loss_l1, torch_loss_huber, &
                         torch_loss_smooth_l1, torch_loss_nll, torch_loss_bce_with_logits, torch_kMSELoss, &
                         torch_kL1Loss, torch_kHuberLoss, torch_kSmoothL1Loss, torch_kCrossEntropyLoss, torch_kNLLLoss, &
                         torch_kBCEWithLogitsLoss
  use ftorch_distributed, only: torch_comm, torch_comm_rank, torch_comm_size, torch_comm_delete, &
                                torch_comm_collective_count, torch_allreduce, torch_broadcast, torch_allgather, &
                                torch_barrier, torch_kReduceSum, torch_kReduceMean, torch_kReduceMax, torch_kReduceMin
  use ftorch_node_shared, only: torch_model_load_shared, torch_model_is_leader
  use ftorch_data_parallel, only: torch_ddp, torch_ddp_init, torch_ddp_delete, torch_ddp_set_weight, &
                                  torch_ddp_sync_gradients, torch_ddp_bucket_count, torch_ddp_broadcast_parameters
  use ftorch_checkpoint, only: torch_checkpoint_save, torch_checkpoint_load
  use ftorch_train, only: torch_train_step
  use ftorch_arglist, only: torch_arglist, torch_arglist_add, torch_arglist_get, torch_arglist_size, &
                            torch_arglist_kind, torch_arglist_clear, torch_arglist_delete, torch_kArgTensor, &
                            torch_kArgInt, torch_kArgReal, torch_kArgLogical, torch_kArgString
  use ftorch_python, only: torch_pymodule, torch_pymodule_load, torch_pymodule_call, torch_pymodule_delete, &
                           torch_python_loaded, torch_python_initialize
  implicit none
  private
  public :: ftorch_int, torch_kInt8, torch_kInt16, torch_kInt32, torch_kInt64, torch_kFloat32, torch_kFloat64, &
            torch_kBool, torch_kBFloat16, torch_kUInt8, torch_kFloat16, torch_kNone, torch_kMean, torch_kSum
  public :: torch_kCPU, torch_kCUDA, torch_kHIP, torch_kXPU, torch_kMPS
  public :: FTORCH_OK, FTORCH_ERR_INVALID_ARGUMENT, FTORCH_ERR_NULL_HANDLE, FTORCH_ERR_DTYPE, FTORCH_ERR_DEVICE, &
            FTORCH_ERR_IO, FTORCH_ERR_TORCH, FTORCH_ERR_VERSION, FTORCH_ERR_INTERNAL, FTORCH_ERR_CALLBACK, &
            FTORCH_ERR_DISTRIBUTED, FTORCH_ERR_PYTHON, FTORCH_ERR_SHAPE, torch_catch_begin, &
            torch_catch_end, ftorch_last_error
  public :: ftorch_version, ftorch_torch_version, ftorch_runtime_torch_version, ftorch_check_runtime, &
            torch_device_available, ftorch_live_handles, ftorch_callbacks_registered, torch_manual_seed
  public :: torch_tensor, torch_tensor_from_array, torch_tensor_from_blob, torch_tensor_empty, torch_tensor_zeros, &
            torch_tensor_ones, torch_tensor_delete, torch_tensor_get_rank, torch_tensor_get_shape, &
            torch_tensor_get_stride, torch_tensor_get_dtype, torch_tensor_get_device_type, &
            torch_tensor_get_device_index, torch_tensor_requires_grad, torch_tensor_print, torch_tensor_zero, &
            torch_tensor_to, torch_tensor_data_pointer, torch_tensor_to_array, torch_tensor_zero_grad
  public :: assignment(=), operator(+), operator(-), operator(*), operator(/), operator(**), &
            torch_tensor_sum, torch_tensor_mean, torch_sum, torch_mean, torch_matmul, torch_reshape, torch_permute, &
            torch_transpose, torch_exp, torch_log, torch_sqrt, torch_abs, torch_sin, torch_cos, torch_tanh, &
            torch_sigmoid, torch_relu, torch_clone, torch_detach, torch_result, torch_assign
  public :: torch_tensor_backward, torch_tensor_get_gradient, torch_tensor_set_requires_grad, torch_tensor_is_leaf, &
            torch_no_grad_begin, torch_no_grad_end, torch_enable_grad_begin, torch_enable_grad_end, &
            torch_inference_mode_begin, torch_inference_mode_end, torch_grad_enabled, torch_inference_mode_enabled, &
            torch_tensor_set_gradient, torch_grad_hook, torch_tensor_register_hook, torch_tensor_remove_hook, &
            torch_autograd_set_detect_anomaly, torch_autograd_detect_anomaly_enabled
  public :: torch_function, torch_function_ctx, torch_function_forward, torch_function_backward, &
            torch_tensor_function, torch_function_define, torch_function_apply, torch_pack_hook, torch_unpack_hook, &
            torch_saved_tensors_hooks_begin, torch_saved_tensors_to_cpu_begin, torch_saved_tensors_to_files_begin, &
            torch_saved_tensors_hooks_end, torch_saved_tensors_files, torch_checkpoint_segment
  public :: torch_autograd_grad, torch_autograd_jacobian, torch_autograd_jvp, torch_autograd_vjp, torch_gradcheck, &
            torch_gradcheck_result
  public :: torch_model, torch_model_load, torch_model_forward, torch_model_save, torch_model_is_training, &
            torch_model_print_parameters, torch_model_delete, torch_model_parameters, torch_model_parameter_count, &
            torch_model_parameter, torch_model_parameter_name, torch_model_num_parameters, torch_model_freeze, &
            torch_model_unfreeze, torch_jit_set_optimize
  public :: torch_optim, torch_optim_SGD, torch_optim_Adam, torch_optim_AdamW, torch_optim_RMSprop, &
            torch_optim_Adagrad, torch_optim_LBFGS, torch_optim_step, torch_optim_step_closure, torch_optim_zero_grad, &
            torch_optim_delete, torch_optim_get_learning_rate, torch_optim_set_learning_rate, torch_optim_step_count, &
            torch_optim_clip_grad_norm, torch_optim_clip_grad_value, torch_closure
  public :: torch_scheduler, torch_scheduler_step_lr, torch_scheduler_multistep_lr, torch_scheduler_exponential_lr, &
            torch_scheduler_cosine_annealing_lr, torch_scheduler_reduce_on_plateau, torch_scheduler_linear_lr, &
            torch_scheduler_step, torch_scheduler_get_last_lr, torch_scheduler_delete
  public :: torch_loss_mse, torch_loss_cross_entropy, torch_loss_l1, torch_loss_huber, torch_loss_smooth_l1, &
            torch_loss_nll, torch_loss_bce_with_logits, torch_kMSELoss, torch_kL1Loss, torch_kHuberLoss, &
            torch_kSmoothL1Loss, torch_kCrossEntropyLoss, torch_kNLLLoss, torch_kBCEWithLogitsLoss
  public :: torch_comm, torch_comm_rank, torch_comm_size, torch_comm_delete, torch_comm_collective_count, &
            torch_allreduce, torch_broadcast, torch_allgather, torch_barrier, torch_ddp, torch_ddp_init, &
            torch_ddp_delete, torch_ddp_set_weight, torch_ddp_sync_gradients, torch_ddp_bucket_count, &
            torch_ddp_broadcast_parameters, torch_model_load_shared, torch_model_is_leader, &
            torch_kReduceSum, torch_kReduceMean, torch_kReduceMax, torch_kReduceMin
  public :: torch_train_step, torch_checkpoint_save, torch_checkpoint_load
  public :: torch_arglist, torch_arglist_add, torch_arglist_get, torch_arglist_size, torch_arglist_kind, &
            torch_arglist_clear, torch_arglist_delete, torch_kArgTensor, torch_kArgInt, torch_kArgReal, &
            torch_kArgLogical, torch_kArgString
  public :: torch_pymodule, torch_pymodule_load, torch_pymodule_call, torch_pymodule_delete, torch_python_loaded, &
            torch_python_initialize
  public :: torch_delete

  !> Free any FTorch object.
  interface torch_delete
    module procedure torch_tensor_delete, torch_model_delete, torch_optim_delete, torch_scheduler_delete, &
                     torch_comm_delete, torch_ddp_delete, torch_arglist_delete, torch_pymodule_delete
  end interface torch_delete
end module ftorch
