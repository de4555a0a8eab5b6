// loss.cpp - C API for loss functions, with torch.nn.functional's semantics and options.
#include "internal.hpp"

namespace {

const char *loss_name(int kind) {
  switch (kind) {
    case FTC_LOSS_MSE: return "MSE";
    case FTC_LOSS_L1: return "L1";
    case FTC_LOSS_HUBER: return "Huber";
    case FTC_LOSS_SMOOTH_L1: return "SmoothL1";
    case FTC_LOSS_CROSS_ENTROPY: return "cross entropy";
    case FTC_LOSS_NLL: return "NLL";
    case FTC_LOSS_BCE_WITH_LOGITS: return "BCE with logits";
    default: ftc::fail_unknown(ftc::ftc_loss_kind_table, kind);
  }
}

std::optional<at::Tensor> optional_tensor(const at::Tensor &t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace

namespace ftc {

at::Tensor compute_loss(int kind, const at::Tensor &input, const at::Tensor &target, const at::Tensor &weight,
                        const at::Tensor &pos_weight, const ftc_loss_options &options) {
  const char *name = loss_name(kind);
  const int reduction = options.reduction;
  const int64_t ignore_index = options.ignore_index;
  const double label_smoothing = options.label_smoothing;
  if (reduction < FTC_REDUCTION_NONE || reduction > FTC_REDUCTION_SUM) fail_unknown(ftc_reduction_table, reduction);
  const bool elementwise = kind != FTC_LOSS_CROSS_ENTROPY && kind != FTC_LOSS_NLL;
  if (elementwise && input.sizes() != target.sizes()) {
    // PyTorch would broadcast here (with a warning); a silent broadcast of a loss is a bug.
    fail(FTC_ERR_INVALID_ARGUMENT, std::string(name) + " loss: input shape " + shape_string(input.sizes()) +
                                       " differs from target shape " + shape_string(target.sizes()));
  }
  switch (kind) {
    case FTC_LOSS_MSE: return at::mse_loss(input, target, reduction);
    case FTC_LOSS_L1: return at::l1_loss(input, target, reduction);
    case FTC_LOSS_HUBER:
      if (!(options.delta > 0)) fail(FTC_ERR_INVALID_ARGUMENT, "Huber loss: delta must be positive");
      return at::huber_loss(input, target, reduction, options.delta);
    case FTC_LOSS_SMOOTH_L1:
      if (!(options.beta >= 0)) fail(FTC_ERR_INVALID_ARGUMENT, "SmoothL1 loss: beta must be non-negative");
      return at::smooth_l1_loss(input, target, reduction, options.beta);
    case FTC_LOSS_CROSS_ENTROPY:
      if (!(label_smoothing >= 0 && label_smoothing <= 1)) {
        fail(FTC_ERR_INVALID_ARGUMENT, "cross entropy: label_smoothing must be in [0, 1]");
      }
      return at::cross_entropy_loss(input, target, optional_tensor(weight), reduction, ignore_index, label_smoothing);
    case FTC_LOSS_NLL:
      return at::nll_loss_nd(input, target, optional_tensor(weight), reduction, ignore_index);
    case FTC_LOSS_BCE_WITH_LOGITS:
      return at::binary_cross_entropy_with_logits(input, target, optional_tensor(weight), optional_tensor(pos_weight),
                                                  reduction);
    default: loss_name(kind);
  }
  return {};
}

}  // namespace ftc

extern "C" {

int ftc_loss(int kind, ftc_tensor input, ftc_tensor target, ftc_tensor weight, ftc_tensor pos_weight,
             const ftc_loss_options *options, ftc_tensor *out) {
  return ftc::guard([&] {
    ftc::take_temporaries({input, target, weight, pos_weight});
    const at::Tensor &x = ftc::tensor_of(input, "input tensor");
    const at::Tensor &y = ftc::tensor_of(target, "target tensor");
    const at::Tensor w = weight != nullptr ? ftc::tensor_of(weight, "weight tensor") : at::Tensor();
    const at::Tensor pw = pos_weight != nullptr ? ftc::tensor_of(pos_weight, "pos_weight tensor") : at::Tensor();
    ftc::out_arg(out, "out");
    if (options == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "options is a null pointer (start from FTC_LOSS_OPTIONS_DEFAULTS)");
    at::Tensor l = ftc::compute_loss(kind, x, y, w, pw, *options);
    // Into *out as `=` does when it is constructed, else a new handle.
    if (auto *slot = ftc::TensorTable::instance().find(*out)) {
      ftc::assign_into(*slot, l);
    } else {
      *out = ftc::new_tensor_handle(std::move(l));
    }
  });
}

}  // extern "C"
