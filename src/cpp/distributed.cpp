// distributed.cpp - communicators over the caller's collectives and collectives on tensors
// (data parallelism: data_parallel.cpp; checkpoints of data-parallel runs: checkpoint.cpp). No
// collective algorithm lives here: every reduction, broadcast and gather is one call of the
// caller's MPI (or other) function on a contiguous buffer.
#include <string>

#include "comm.hpp"

namespace ftc {

namespace {

// Every rank must call a tensor collective with the same shape, dtype and option (op or root):
// checked with one gather, so a mismatch is a clear error on every rank, never a corruption. The
// gather also carries the status of this rank's local checks (see local): a rank whose tensor or
// arguments were refused fails the call on every rank.
void require_agreement(Comm &c, int status, const std::string &message, const at::Tensor &t, int64_t option,
                       const char *what) {
  const bool ok = status == FTC_OK;
  const std::string shape = ok ? shape_string(t.sizes()) : std::string();
  const std::vector<int64_t> mine = {status, ok ? static_cast<int64_t>(t.scalar_type()) : -1,
                                     ok ? digest_of(shape) : 0, option};
  const auto all = c.gather_values(mine);
  fail_if_any_rank_failed(c, status, message, [&](int r) { return all[4 * r]; }, what);
  for (int r = 0; r < c.size; ++r) {
    if (all[4 * r + 1] != mine[1] || all[4 * r + 2] != mine[2] || all[4 * r + 3] != mine[3]) {
      fail(FTC_ERR_DISTRIBUTED, std::string(what) + ": the ranks disagree (rank " + std::to_string(c.rank) +
                                    " passed a " + c10::toString(t.scalar_type()) + " tensor of shape " + shape +
                                    " with option " + std::to_string(option) + "; rank " + std::to_string(r) +
                                    " passed something else): every rank must pass the same shape, dtype and "
                                    "operation");
    }
  }
}

}  // namespace
}  // namespace ftc

extern "C" {

int ftc_comm_new(ftc_comm *out, int64_t ctx, int rank, int size, int device_aware, ftc_allreduce_fn allreduce,
                 ftc_broadcast_fn broadcast, ftc_allgather_fn allgather, ftc_barrier_fn barrier,
                 ftc_gatherv_fn gatherv, ftc_scatterv_fn scatterv, ftc_comm_free_fn free_fn) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    auto c = std::make_shared<ftc::Comm>();
    c->free_fn = free_fn;  // from here on, the caller's communicator is released whatever fails
    c->ctx = ctx;
    if (allreduce == nullptr || broadcast == nullptr || allgather == nullptr || barrier == nullptr) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a collective function pointer is null");
    }
    if (size < 1 || rank < 0 || rank >= size) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks is not a valid position");
    }
    c->rank = rank;
    c->size = size;
    c->device_aware = device_aware != 0;
    c->allreduce_fn = allreduce;
    c->broadcast_fn = broadcast;
    c->allgather_fn = allgather;
    c->barrier_fn = barrier;
    if ((gatherv == nullptr) != (scatterv == nullptr)) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "gatherv and scatterv come together: pass both or neither");
    }
    c->gatherv_fn = gatherv;
    c->scatterv_fn = scatterv;
    ftc::replace_handle<ftc::CommTable>(out, std::move(c));
  });
}

int ftc_comm_delete(ftc_comm *c) { return ftc::delete_handle<ftc::CommTable>(c); }
void ftc_comm_release(ftc_comm c) { ftc::CommTable::instance().release(c); }
int ftc_comm_share(ftc_comm src, ftc_comm *dst) { return ftc::share<ftc::CommTable>(src, dst, "communicator"); }

int ftc_comm_rank(ftc_comm c, int *rank) {
  return ftc::guard([&] { ftc::out_arg(rank, "rank") = ftc::comm_of(c)->rank; });
}

int ftc_comm_size(ftc_comm c, int *size) {
  return ftc::guard([&] { ftc::out_arg(size, "size") = ftc::comm_of(c)->size; });
}

int ftc_comm_collective_count(ftc_comm c, int64_t *count) {
  return ftc::guard([&] { ftc::out_arg(count, "count") = ftc::comm_of(c)->calls.load(); });
}

int ftc_allreduce(ftc_comm c, ftc_tensor t, int op) {
  return ftc::guard([&] {
    ftc::take_temporaries({t});  // (released even when the communicator is bad)
    auto &comm = *ftc::comm_of(c);
    at::Tensor x;
    int dtype = 0;
    std::string message;
    const int status = ftc::local(message, [&] {
      x = ftc::tensor_of(t, "tensor");
      if (op < FTC_OP_SUM || op > FTC_OP_MIN) {
        ftc::fail_unknown(ftc::ftc_collective_op_table, op);
      }
      if (op == FTC_OP_MEAN && !at::isFloatingType(x.scalar_type())) {
        ftc::fail(FTC_ERR_DTYPE, "the mean over ranks needs a floating-point tensor (this one is " +
                                     std::string(c10::toString(x.scalar_type())) + "; use the sum)");
      }
      dtype = ftc::wire_dtype(x.scalar_type());
    });
    ftc::require_agreement(comm, status, message, x, op, "allreduce");
    at::Tensor buf = ftc::wire_buffer(comm, x);
    ftc::settle(buf);
    // (logical tensors: the sum is an OR, as in PyTorch's c10d; adding bytes would leave a 2 in a
    // bool, or wrap to 0 on 256 ranks)
    const int wire_op = x.scalar_type() == c10::kBool && op == FTC_OP_SUM ? FTC_OP_MAX
                        : op == FTC_OP_MEAN                                 ? FTC_OP_SUM
                                                                            : op;
    comm.allreduce(buf.data_ptr(), buf.numel(), dtype, buf.element_size(), wire_op);
    if (op == FTC_OP_MEAN) {
      at::NoGradGuard no_grad;
      buf.div_(comm.size);
    }
    ftc::land(x, buf);
  });
}

int ftc_broadcast(ftc_comm c, ftc_tensor t, int root) {
  return ftc::guard([&] {
    ftc::take_temporaries({t});  // (released even when the communicator is bad)
    auto &comm = *ftc::comm_of(c);
    at::Tensor x;
    int dtype = 0;
    std::string message;
    const int status = ftc::local(message, [&] {
      x = ftc::tensor_of(t, "tensor");
      if (root < 0 || root >= comm.size) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                  "root rank " + std::to_string(root) + " is not in 0.." + std::to_string(comm.size - 1));
      }
      dtype = ftc::wire_dtype(x.scalar_type());
    });
    ftc::require_agreement(comm, status, message, x, root, "broadcast");
    at::Tensor buf = ftc::wire_buffer(comm, x);
    ftc::settle(buf);
    comm.broadcast(buf.data_ptr(), buf.numel(), dtype, buf.element_size(), root);
    if (comm.rank != root) ftc::land(x, buf);
  });
}

int ftc_allgather(ftc_comm c, ftc_tensor *out, ftc_tensor in) {
  return ftc::guard([&] {
    ftc::take_temporaries({in});  // (released even when the communicator is bad)
    auto &comm = *ftc::comm_of(c);
    at::Tensor x;
    int dtype = 0;
    std::string message;
    const int status = ftc::local(message, [&] {
      ftc::out_arg(out, "output tensor");
      x = ftc::tensor_of(in, "input tensor");
      dtype = ftc::wire_dtype(x.scalar_type());
    });
    ftc::require_agreement(comm, status, message, x, 0, "allgather");
    at::Tensor send = ftc::wire_buffer(comm, x);
    auto sizes = x.dim() == 0 ? std::vector<int64_t>{1} : x.sizes().vec();
    sizes[0] *= comm.size;
    at::Tensor recv = at::empty(sizes, send.options());
    ftc::settle(send);
    comm.allgather(send.data_ptr(), recv.data_ptr(), send.numel(), dtype, send.element_size());
    ftc::store_result(out, recv.to(x.device()), "allgather");
  });
}

int ftc_barrier(ftc_comm c) {
  return ftc::guard([&] { ftc::comm_of(c)->barrier(); });
}

}  // extern "C"
