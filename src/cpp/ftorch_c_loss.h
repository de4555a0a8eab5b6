/* ftorch_c_loss.h - loss functions (torch.nn.functional equivalents). */
#ifndef FTORCH_C_LOSS_H
#define FTORCH_C_LOSS_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* enum ftc_loss_kind: see ftorch_c_enums.h. */

/* Loss of input against target into *out: stored as ftc_tensor_assign does when *out is a live
 * tensor, else a new handle. reduction: 0 none, 1 mean, 2 sum.
 * weight (class weights for cross entropy/NLL, element weights for BCE) and pos_weight may be
 * NULL; param is Huber's delta or SmoothL1's beta; ignore_index applies to cross entropy/NLL
 * with class-index targets. */
FTC_API int ftc_loss(int kind, ftc_tensor input, ftc_tensor target, ftc_tensor weight, ftc_tensor pos_weight,
                     int reduction, int64_t ignore_index, double param, double label_smoothing, ftc_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
