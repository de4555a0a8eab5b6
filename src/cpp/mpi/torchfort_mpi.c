/* torchfort_mpi.c - TorchFort's distributed models (torchfort_create_distributed_model) and
 * reinforcement-learning systems (torchfort_rl_*_create_distributed_system), and their Fortran
 * forms, over the caller's MPI. Shipped as source and compiled in the consumer's build with the
 * consumer's MPI (CMake: link FTorch::torchfort_mpi; otherwise compile
 * `python -m ftorch --torchfort-mpi-source` with mpicc and link it into the program): the library
 * itself links no MPI. It duplicates the caller's communicator and hands FTorch its collectives
 * (ftc_comm_new); FTorch does the rest (parameters broadcast from rank 0, gradients and losses
 * averaged over the ranks, failures reported to every rank). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ftorch_c.h"
#include "torchfort.h"
#include "torchfort_rl.h"

typedef struct {
  MPI_Comm comm;
} tf_mpi_context;

static MPI_Comm comm_of(int64_t ctx) { return ((tf_mpi_context *)(intptr_t)ctx)->comm; }

static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case FTC_UINT8: return MPI_UINT8_T;
    case FTC_INT8: return MPI_INT8_T;
    case FTC_INT16: return MPI_INT16_T;
    case FTC_INT32: return MPI_INT32_T;
    case FTC_INT64: return MPI_INT64_T;
    case FTC_FLOAT32: return MPI_FLOAT;
    case FTC_FLOAT64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(int op) {
  switch (op) {
    case FTC_OP_SUM: return MPI_SUM;
    case FTC_OP_MAX: return MPI_MAX;
    case FTC_OP_MIN: return MPI_MIN;
    default: return MPI_OP_NULL;
  }
}

/* 0, or the MPI error's text in msg. */
static int status_of(int err, const char *what, char *msg, int64_t msglen) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (err == MPI_SUCCESS) return 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", err);
  snprintf(msg, (size_t)msglen, "%s failed: %s", what, text);
  return 1;
}

static int check_args(MPI_Datatype type, int64_t count, char *msg, int64_t msglen) {
  if (type == MPI_DATATYPE_NULL) {
    snprintf(msg, (size_t)msglen, "torchfort_mpi.c: a data type MPI has no type for");
    return 1;
  }
  if (count > INT32_MAX) {
    snprintf(msg, (size_t)msglen, "torchfort_mpi.c: more than 2^31-1 elements in one collective");
    return 1;
  }
  return 0;
}

static int tf_allreduce(int64_t ctx, void *buf, int64_t count, int dtype, int op, char *msg, int64_t msglen) {
  MPI_Datatype type = mpi_type(dtype);
  if (check_args(type, count, msg, msglen)) return 1;
  if (mpi_op(op) == MPI_OP_NULL) {
    snprintf(msg, (size_t)msglen, "torchfort_mpi.c: unknown reduction %d", op);
    return 1;
  }
  return status_of(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, mpi_op(op), comm_of(ctx)), "MPI_Allreduce",
                   msg, msglen);
}

static int tf_broadcast(int64_t ctx, void *buf, int64_t count, int dtype, int root, char *msg, int64_t msglen) {
  MPI_Datatype type = mpi_type(dtype);
  if (check_args(type, count, msg, msglen)) return 1;
  return status_of(MPI_Bcast(buf, (int)count, type, root, comm_of(ctx)), "MPI_Bcast", msg, msglen);
}

static int tf_allgather(int64_t ctx, const void *send, void *recv, int64_t count, int dtype, char *msg,
                        int64_t msglen) {
  MPI_Datatype type = mpi_type(dtype);
  if (check_args(type, count, msg, msglen)) return 1;
  return status_of(MPI_Allgather((void *)send, (int)count, type, recv, (int)count, type, comm_of(ctx)),
                   "MPI_Allgather", msg, msglen);
}

static int tf_barrier(int64_t ctx, char *msg, int64_t msglen) {
  return status_of(MPI_Barrier(comm_of(ctx)), "MPI_Barrier", msg, msglen);
}

static void tf_free(int64_t ctx) {
  tf_mpi_context *c = (tf_mpi_context *)(intptr_t)ctx;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&c->comm);
  free(c);
}

/* FTorch's communicator over a duplicate of mpi_comm; NULL (after printing why, for fn) if MPI or
 * FTorch refuses. */
static ftc_comm new_comm(MPI_Comm mpi_comm, const char *fn) {
  tf_mpi_context *c = (tf_mpi_context *)malloc(sizeof *c);
  ftc_comm comm = NULL;
  int rank = 0, size = 0;
  if (c == NULL) return NULL;
  if (MPI_Comm_dup(mpi_comm, &c->comm) != MPI_SUCCESS || MPI_Comm_rank(c->comm, &rank) != MPI_SUCCESS ||
      MPI_Comm_size(c->comm, &size) != MPI_SUCCESS) {
    fprintf(stderr, "TORCHFORT::ERROR: %s: the MPI communicator is not usable\n", fn);
    free(c);
    return NULL;
  }
  if (ftc_comm_new(&comm, (int64_t)(intptr_t)c, rank, size, 0, tf_allreduce, tf_broadcast, tf_allgather, tf_barrier,
                   NULL, NULL, tf_free) != FTC_OK) {
    fprintf(stderr, "TORCHFORT::ERROR: %s: %s\n", fn, ftc_last_error());
    tf_free((int64_t)(intptr_t)c);
    return NULL;
  }
  return comm;
}

torchfort_result_t torchfort_create_distributed_model(const char *name, const char *config_fname, MPI_Comm mpi_comm,
                                                      int device) {
  ftc_comm comm = new_comm(mpi_comm, "torchfort_create_distributed_model");
  torchfort_result_t result;
  if (comm == NULL) return TORCHFORT_RESULT_MPI_ERROR;
  result = ftc_torchfort_create_distributed(name, config_fname, comm, device);
  ftc_comm_delete(&comm); /* the model keeps its own reference */
  return result;
}

torchfort_result_t torchfort_create_distributed_model_F(const char *name, const char *config_fname, int mpi_comm_f,
                                                        int device) {
  return torchfort_create_distributed_model(name, config_fname, MPI_Comm_f2c((MPI_Fint)mpi_comm_f), device);
}

/* A distributed RL system made by create (ftc_torchfort_rl_*_create_distributed) over mpi_comm. */
typedef torchfort_result_t (*rl_create_fn)(const char *, const char *, ftc_comm, int, int);
static torchfort_result_t create_rl_system(rl_create_fn create, const char *fn, const char *name,
                                           const char *config_fname, MPI_Comm mpi_comm, int model_device,
                                           int rb_device) {
  ftc_comm comm = new_comm(mpi_comm, fn);
  torchfort_result_t result;
  if (comm == NULL) return TORCHFORT_RESULT_MPI_ERROR;
  result = create(name, config_fname, comm, model_device, rb_device);
  ftc_comm_delete(&comm); /* the system keeps its own reference */
  return result;
}

torchfort_result_t torchfort_rl_off_policy_create_distributed_system(const char *name, const char *config_fname,
                                                                     MPI_Comm mpi_comm, int model_device,
                                                                     int rb_device) {
  return create_rl_system(ftc_torchfort_rl_off_policy_create_distributed,
                          "torchfort_rl_off_policy_create_distributed_system", name, config_fname, mpi_comm,
                          model_device, rb_device);
}

torchfort_result_t torchfort_rl_off_policy_create_distributed_system_F(const char *name, const char *config_fname,
                                                                       int mpi_comm_f, int model_device,
                                                                       int rb_device) {
  return torchfort_rl_off_policy_create_distributed_system(name, config_fname, MPI_Comm_f2c((MPI_Fint)mpi_comm_f),
                                                           model_device, rb_device);
}

torchfort_result_t torchfort_rl_on_policy_create_distributed_system(const char *name, const char *config_fname,
                                                                    MPI_Comm mpi_comm, int model_device,
                                                                    int rb_device) {
  return create_rl_system(ftc_torchfort_rl_on_policy_create_distributed,
                          "torchfort_rl_on_policy_create_distributed_system", name, config_fname, mpi_comm,
                          model_device, rb_device);
}

torchfort_result_t torchfort_rl_on_policy_create_distributed_system_F(const char *name, const char *config_fname,
                                                                      int mpi_comm_f, int model_device,
                                                                      int rb_device) {
  return torchfort_rl_on_policy_create_distributed_system(name, config_fname, MPI_Comm_f2c((MPI_Fint)mpi_comm_f),
                                                          model_device, rb_device);
}
