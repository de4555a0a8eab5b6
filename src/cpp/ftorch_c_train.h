/* ftorch_c_train.h - one-call training step and checkpoints (model + optimizer + scheduler). */
#ifndef FTORCH_C_TRAIN_H
#define FTORCH_C_TRAIN_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"
#include "ftorch_c_model.h"
#include "ftorch_c_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* zero_grad, forward(inputs), loss(output 1, target), backward, clip (max_grad_norm > 0),
 * optimizer step, scheduler step (if given; fed the loss for reduce-on-plateau). *loss receives
 * the loss value, *seconds the wall time of the step. loss_kind as in ftorch_c_loss.h. */
FTC_API int ftc_train_step(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs,
                           ftc_tensor target, int loss_kind, int reduction, double max_grad_norm, double *loss,
                           double *seconds);

/* ftc_train_step as a CUDA graph (model, optimizer, inputs and target on one CUDA device): the
 * first 3 steps are a warm-up (more if TorchScript's profiled runs were raised; the last runs the
 * work to capture, uncaptured), the next is captured -- forward, loss, backward, clipping and the
 * update -- and that step and every later one replays the capture on the same buffers (write new
 * data into the inputs' and target's memory between steps). Another input or target buffer,
 * shape, loss, clipping or optimizer setting, or an optimizer state replaced by a checkpoint, warms
 * up and captures again; a failed capture fails the later steps of the same key at once. The optimizer: SGD, Adam or AdamW, one parameter group, not data-parallel;
 * its learning rate (schedulers) and step counts are read at each step. Needs a CUDA build of
 * torch (FTC_ERR_DEVICE otherwise). With the environment variable FTORCH_CUDA_GRAPHS=eager the
 * same steps run without capturing (any device), to compare with and without graphs. */
FTC_API int ftc_train_step_cuda_graph(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs,
                                      int n_inputs, ftc_tensor target, int loss_kind, int reduction,
                                      double max_grad_norm, double *loss, double *seconds);

/* Write model parameters and buffers, optimizer state, scheduler state and a step counter to
 * one file, atomically (a temporary file renamed over the target, named after the host, process
 * and thread). Any of m, o, s may be NULL (absent). A binding whose caller passed an object that
 * is not constructed passes FTC_UNCONSTRUCTED instead: an error, never "absent" (also for the
 * scheduler of ftc_train_step). */
#define FTC_UNCONSTRUCTED ((void *)~(uintptr_t)0)
FTC_API int ftc_checkpoint_save(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t step);
/* Restore what ftc_checkpoint_save wrote into objects of the same structure; checks that the
 * checkpoint matches (parameter names and shapes, optimizer kind) before changing anything. */
FTC_API int ftc_checkpoint_load(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t *step);

#ifdef __cplusplus
}
#endif
#endif
