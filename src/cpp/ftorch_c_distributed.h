/* ftorch_c_distributed.h - data-parallel training and collectives across ranks.
 *
 * FTorch never links an MPI (or NCCL) library: the caller provides the collectives as function
 * pointers over its own communicator (src/fortran/mpi/ftorch_mpi.fypp does so with the MPI the
 * consumer builds with), and this layer does everything else: staging of tensors, bucketing of
 * gradients, weighting, consistency checks, failure propagation, checkpoints. */
#ifndef FTORCH_C_DISTRIBUTED_H
#define FTORCH_C_DISTRIBUTED_H

#include <stdint.h>
#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"
#include "ftorch_c_model.h"
#include "ftorch_c_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ftc_comm_s *ftc_comm;
typedef struct ftc_ddp_s *ftc_ddp;

/* The caller's collectives. `ctx` is the value given to ftc_comm_new (it identifies the caller's
 * communicator). Buffers hold `count` (<= INT32_MAX) contiguous elements of `dtype` (an
 * ftc_dtype; FTC_UINT8 for bytes and booleans), in host memory unless the communicator was
 * created device-aware. `op` is an ftc_collective_op other than FTC_OP_MEAN. Each returns 0 on
 * success, else non-zero with a NUL-terminated reason written into msg (msglen bytes). They are
 * called on the thread that called FTorch, in the same order on every rank. */
typedef int (*ftc_allreduce_fn)(int64_t ctx, void *buf, int64_t count, int dtype, int op, char *msg, int64_t msglen);
typedef int (*ftc_broadcast_fn)(int64_t ctx, void *buf, int64_t count, int dtype, int root, char *msg, int64_t msglen);
/* recv receives size * count elements: rank r's send buffer at offset r * count. */
typedef int (*ftc_allgather_fn)(int64_t ctx, const void *send, void *recv, int64_t count, int dtype, char *msg,
                                int64_t msglen);
typedef int (*ftc_barrier_fn)(int64_t ctx, char *msg, int64_t msglen);
/* Called once when the last handle to the communicator goes away (may be NULL). */
typedef void (*ftc_comm_free_fn)(int64_t ctx);

/* New communicator of `size` ranks, this one being `rank`, over the caller's collectives.
 * device_aware: buffers of CUDA tensors may be handed to the collectives as they are (CUDA-aware
 * MPI); otherwise they are staged through host memory. If *out is not null it is deleted first. */
FTC_API int ftc_comm_new(ftc_comm *out, int64_t ctx, int rank, int size, int device_aware,
                         ftc_allreduce_fn allreduce, ftc_broadcast_fn broadcast, ftc_allgather_fn allgather,
                         ftc_barrier_fn barrier, ftc_comm_free_fn free_fn);
FTC_API int ftc_comm_delete(ftc_comm *c);
FTC_API void ftc_comm_release(ftc_comm c); /* see ftc_tensor_release */
FTC_API int ftc_comm_share(ftc_comm src, ftc_comm *dst);
FTC_API int ftc_comm_rank(ftc_comm c, int *rank);
FTC_API int ftc_comm_size(ftc_comm c, int *size);
/* Collective calls made through this communicator so far (each call of a caller's function). */
FTC_API int ftc_comm_collective_count(ftc_comm c, int64_t *count);

/* Collectives on tensors. allreduce and broadcast work in place (the tensor's memory, e.g. the
 * Fortran array it wraps, receives the result); every rank passes a tensor of the same shape and
 * dtype (checked). allgather: *out = the inputs of all ranks concatenated along dimension 0 (a
 * 0-d input counts as shape [1]); a constructed *out of that shape receives the values in place. */
FTC_API int ftc_allreduce(ftc_comm c, ftc_tensor t, int op);
FTC_API int ftc_broadcast(ftc_comm c, ftc_tensor t, int root);
FTC_API int ftc_allgather(ftc_comm c, ftc_tensor *out, ftc_tensor in);
FTC_API int ftc_barrier(ftc_comm c);

/* Data parallelism for a model and (optionally, may be NULL) its optimizer. Checks that every
 * rank has the same model (names, shapes, dtypes), broadcasts parameters and buffers from rank 0,
 * splits the parameters into buckets of at most bucket_bytes (c10d's bucket assignment) and
 * attaches itself to the optimizer: from then on, its steps, clipping and ftc_train_step average
 * the gradients across ranks first (once per change of the gradients). */
FTC_API int ftc_ddp_new(ftc_ddp *out, ftc_comm c, ftc_model m, ftc_optim o, int64_t bucket_bytes);
/* Detaches from the optimizer when the last handle goes. */
FTC_API int ftc_ddp_delete(ftc_ddp *d);
FTC_API void ftc_ddp_release(ftc_ddp d);
FTC_API int ftc_ddp_share(ftc_ddp src, ftc_ddp *dst);
/* This rank's weight in the average of gradients and losses (default 1: every rank counts the
 * same, as PyTorch's DDP; give the local batch size when batches differ). Must be > 0. */
FTC_API int ftc_ddp_set_weight(ftc_ddp d, double weight);
/* Average the gradients now. failed != 0: this rank failed to compute its gradients; every rank
 * then returns FTC_ERR_DISTRIBUTED and no gradient changes. loss (may be NULL): in, this rank's
 * loss; out, the weighted mean over ranks. */
FTC_API int ftc_ddp_sync(ftc_ddp d, int failed, double *loss);
FTC_API int ftc_ddp_bucket_count(ftc_ddp d, int64_t *count);
/* Parameters and buffers of rank 0 to every rank (done by ftc_ddp_new). */
FTC_API int ftc_ddp_broadcast_parameters(ftc_ddp d);

/* Checkpoints of data-parallel runs: rank 0 writes (ftc_checkpoint_save) and every rank returns
 * its status; on load every rank reads the file, then the ranks check they all succeeded and
 * hold the same parameters and step. */
FTC_API int ftc_comm_checkpoint_save(ftc_comm c, const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s,
                                     int64_t step);
FTC_API int ftc_comm_checkpoint_load(ftc_comm c, const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s,
                                     int64_t *step);

#ifdef __cplusplus
}
#endif
#endif
