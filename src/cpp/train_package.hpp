// train_package.hpp - training packages (`python -m ftorch export MODEL --train FILE.pt2`): a
// model's forward and backward compiled by AOTInductor, its parameters and buffers owned here.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "internal.hpp"

namespace ftc {

struct TrainingPackage;

// Whether `file` is a training package (a .pt2 archive with FTorch's training record).
bool is_training_package(const std::string &file);

// The model of a training package on `device`: a TorchScript module built here, holding the
// package's parameters and buffers (under their names in the exported model), whose forward calls
// the compiled code, recording one autograd node whose backward is the compiled backward. So every
// procedure made for TorchScript models (parameters, optimizers, training steps, autograd through
// the outputs, checkpoints, data-parallel training) works on it unchanged. `requires_grad`: the
// parameters require grad (those the exporter saw frozen stay frozen); `is_training`: 1 train,
// 0 eval, < 0 the mode the model was exported in (training).
std::shared_ptr<Model> load_training_package(const std::string &file, const c10::Device &device, bool requires_grad,
                                             int is_training);

// forward of a training package's model on tensors, in the module's mode, without the TorchScript
// interpreter its module's forward goes through (the same operator, called directly); a graph is
// recorded when requires_grad.
std::vector<at::Tensor> package_forward(const Model &model, std::vector<at::Tensor> inputs, bool requires_grad);

// The compiled model that a forward of a training package's model without gradients runs
// directly, as an inference package's (its state bound, checked to be current): the package's
// inference model when the call records no graph (requires_grad 0) and the forward changes
// nothing (eval mode, or a training mode that computes the same); null otherwise (package_forward).
CompiledModel *package_inference(const Model &model, int requires_grad);

// Write the model's current parameters and buffers: an updated package when `file` ends in ".pt2"
// (the compiled code of the loaded package, the new state), else the state_dict that Python's
// torch.load reads (a dict of name -> tensor, on the CPU).
void save_training_package(const Model &model, const std::string &file);

// torch_train_step of a training package as the one compiled graph the package holds (forward,
// MSE loss, backward, clipping, Adam's or AdamW's update, in place), when the step is one it
// computes: MSE loss with mean or sum reduction, Adam or AdamW without amsgrad, the optimizer
// updating exactly the model's parameters (all trainable, in the model's order, one step count),
// not data-parallel, the model in training mode, inputs and target of the exported shapes and
// dtype. The loss value; nothing when the step is another (the caller takes the eager step,
// which gives the same values).
std::optional<double> compiled_train_step(TrainStep &step);

}  // namespace ftc
