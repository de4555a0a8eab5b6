// distributed.cpp - communicators over the caller's collectives, collectives on tensors, data
// parallelism (bucketed gradient averaging attached to an optimizer) and checkpoints of
// data-parallel runs. No collective algorithm lives here: every reduction, broadcast and gather is
// one call of the caller's MPI (or other) function on a contiguous buffer.
#include <ATen/DeviceAccelerator.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

#include "comm.hpp"
#include "ftorch_c_train.h"

namespace ftc {

namespace {

// buf summed over the ranks, in place (buf: a wire_buffer).
void sum_across(Comm &c, const at::Tensor &buf) {
  settle(buf);
  c.allreduce(buf.data_ptr(), buf.numel(), wire_dtype(buf.scalar_type()), buf.element_size(), FTC_OP_SUM);
}

// The values of `buffer` into t (nothing to do when the buffer is t's own memory). Tensors
// changed behind autograd's back get a new version, so that a graph that saved them notices.
void land(const at::Tensor &t, const at::Tensor &buffer) {
  at::NoGradGuard no_grad;
  if (buffer.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
    t.unsafeGetTensorImpl()->bump_version();
  } else {
    t.copy_(buffer);
  }
}

std::hash<std::string> hasher;

// Every rank must call a tensor collective with the same shape, dtype and option (op or root):
// checked with one gather, so a mismatch is a clear error on every rank, never a corruption.
void require_agreement(Comm &c, const at::Tensor &t, int64_t option, const char *what) {
  const std::string shape = shape_string(t.sizes());
  const std::vector<int64_t> mine = {static_cast<int64_t>(t.scalar_type()), static_cast<int64_t>(hasher(shape)),
                                     option};
  const auto all = c.gather_values(mine);
  for (int r = 0; r < c.size; ++r) {
    if (all[3 * r] != mine[0] || all[3 * r + 1] != mine[1] || all[3 * r + 2] != mine[2]) {
      fail(FTC_ERR_DISTRIBUTED, std::string(what) + ": the ranks disagree (rank " + std::to_string(c.rank) +
                                    " passed a " + c10::toString(t.scalar_type()) + " tensor of shape " + shape +
                                    " with option " + std::to_string(option) + "; rank " + std::to_string(r) +
                                    " passed something else): every rank must pass the same shape, dtype and "
                                    "operation");
    }
  }
}

// ---------------------------------------------------------------------------- data parallelism

// FTORCH_DDP_DIRECT_BYTES: gradients of at least this many bytes are all-reduced in their own
// memory instead of packed into a bucket (default 1 MiB; a positive integer).
int64_t direct_bytes_setting() {
  const char *env = std::getenv("FTORCH_DDP_DIRECT_BYTES");
  if (env == nullptr || *env == '\0') return int64_t{1} << 20;
  char *end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 1) {
    fail(FTC_ERR_INVALID_ARGUMENT, std::string("FTORCH_DDP_DIRECT_BYTES must be a positive number of bytes, not '") +
                                       env + "'");
  }
  return static_cast<int64_t>(v);
}

struct DataParallel final : GradientSync {
  std::shared_ptr<Comm> comm;
  std::shared_ptr<torch::jit::Module> module;  // keeps the parameters' owner alive
  std::vector<at::Tensor> params, buffers;
  std::vector<std::string> names;
  std::vector<std::vector<size_t>> buckets;  // parameter indices, by c10d's bucket assignment
  std::vector<at::Tensor> flat;              // one flat buffer per bucket, made on first use
  std::vector<int64_t> offset;               // of each packed parameter in its bucket's buffer
  std::vector<int64_t> flat_numel;           // elements of each bucket's buffer (its packed parameters)
  std::vector<bool> direct;                  // reduced in its own memory, not packed (see average)
  int64_t bucket_bytes = 0;
  double weight = 1;
  std::weak_ptr<Optim> optim;
  bool fresh = false;  // gradients averaged since the last optimizer update

  double reduce(double local_loss) override { return average(false, local_loss); }
  void before_update() override {
    if (!fresh) average(false, 0.0);
  }
  void after_update() override { fresh = false; }
  void report_failure() noexcept override {
    try {
      average(true, 0.0);
    } catch (...) {
      // The failure being reported is the one that propagates.
    }
  }

  // Averages the gradients (weights w_r / sum w) and the loss; see ftc_ddp_sync. A gradient that
  // is not contiguous (a view, a Fortran layout) is read through reshape and written in place.
  double average(bool failed, double local_loss) {
    at::NoGradGuard no_grad;
    const size_t n = params.size();
    // One small reduction first: failures, weights, loss and which parameters have gradients.
    std::vector<double> control(3 + n, 0.0);
    control[0] = failed ? 1 : 0;
    control[1] = weight;
    control[2] = weight * local_loss;
    for (size_t i = 0; i < n; ++i) control[3 + i] = has_gradient(i) ? 1 : 0;
    comm->allreduce(control.data(), static_cast<int64_t>(control.size()), FTC_FLOAT64, sizeof(double),
                    FTC_OP_SUM);
    if (control[0] > 0) {
      fail(FTC_ERR_DISTRIBUTED, failed ? "this rank failed before averaging the gradients (the other ranks were told)"
                                       : std::to_string(static_cast<int64_t>(control[0])) +
                                             " rank(s) failed before averaging the gradients of this step (see "
                                             "their errors); the gradients were left unchanged");
    }
    // Every gradient enters the sum already scaled by its rank's share w_r / sum_s w_s, so the
    // all-reduce's sum is the average: one pass over each gradient besides the all-reduce.
    //  - A large gradient (direct[i]: at least direct_bytes) is reduced in its own memory, one
    //    all-reduce each: no copy, and the pass is made while backward's output is still warm.
    //  - Small ones are packed into their bucket's flat buffer (one all-reduce per bucket); each
    //    then becomes its place in the buffer (no copy back): backward accumulates into it until
    //    zero_grad drops it, and a gradient still there next time is scaled in place (DDP's
    //    gradient_as_bucket_view).
    // Which collectives run depends only on the shapes and dtypes, which every rank has checked.
    // On one rank the gradients already are the average: nothing to do.
    if (comm->size == 1) {
      fresh = true;
      return local_loss;
    }
    const double share = weight / control[1];
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (const size_t i : buckets[b]) {
        if (direct[i]) reduce_in_place(i, control[3 + i] > 0, share);
      }
      if (flat_numel[b] == 0) continue;
      if (!flat[b].defined()) {
        const auto &p = params[buckets[b].front()];
        flat[b] = at::empty({flat_numel[b]},
                            p.options().device(comm->device_aware ? p.device() : c10::Device(c10::kCPU)));
      }
      at::Tensor &buf = flat[b];
      for (const size_t i : buckets[b]) {
        if (direct[i]) continue;
        at::Tensor slice = buf.narrow(0, offset[i], params[i].numel());
        if (!has_gradient(i)) {
          slice.zero_();
          continue;
        }
        const at::Tensor &grad = params[i].grad();
        if (in_bucket(grad, slice)) {
          if (share != 1) slice.mul_(share);
        } else if (share == 1 || grad.device() != slice.device()) {
          // A bucket in host memory for device gradients (a communicator that is not
          // device-aware): copied across, then scaled there (mul_out cannot write across devices).
          slice.copy_(grad.reshape({-1}));
          if (share != 1) slice.mul_(share);
        } else {
          at::mul_out(slice, grad.reshape({-1}), share);
        }
      }
      sum_across(*comm, buf);
      for (const size_t i : buckets[b]) {
        auto &p = params[i];
        // Frozen here, or no rank produced a gradient: left as it is (undefined stays undefined).
        if (direct[i] || !p.requires_grad() || control[3 + i] == 0) continue;
        at::Tensor values = buf.narrow(0, offset[i], p.numel()).view(p.sizes());
        if (in_bucket(p.grad(), values)) continue;
        if (p.device() == buf.device() && p.is_contiguous()) {
          // The same memory as a tensor of its own, not an autograd view (the optimizers'
          // zero_grad detaches gradients in place, which a view refuses).
          p.mutable_grad() = at::empty({0}, values.options()).set_(values.storage(), values.storage_offset(),
                                                                   values.sizes(), values.strides());
        } else {
          if (!p.grad().defined()) p.mutable_grad() = at::empty_like(p);
          p.mutable_grad().copy_(values);
        }
      }
    }
    fresh = true;
    return control[2] / control[1];
  }

  bool has_gradient(size_t i) const { return params[i].requires_grad() && params[i].grad().defined(); }

  // All-reduce of parameter i's gradient in its own memory (scaled by share first), or through
  // wire_buffer's copy where the caller's collectives cannot reach it in place. A rank without a
  // gradient contributes zeros when another rank has one (any_rank), and keeps the average as its
  // gradient unless its parameter is frozen here.
  void reduce_in_place(size_t i, bool any_rank, double share) {
    if (!any_rank) return;  // no rank has a gradient: every rank skips it alike
    auto &p = params[i];
    const bool own = has_gradient(i);
    const at::Tensor grad = own ? p.grad() : at::zeros_like(p, at::MemoryFormat::Contiguous);
    const at::Tensor buf = wire_buffer(*comm, grad);
    if (own && share != 1) buf.mul_(share);
    sum_across(*comm, buf);
    land(grad, buf);
    if (!own && p.requires_grad()) p.mutable_grad() = grad;
  }

  // Whether a gradient is (still) its place in a bucket.
  static bool in_bucket(const at::Tensor &grad, const at::Tensor &place) {
    return grad.defined() && grad.data_ptr() == place.data_ptr() && grad.is_contiguous() &&
           grad.numel() == place.numel() && grad.device() == place.device();
  }

  // Parameters and buffers of rank 0 to every rank, in buckets of flat buffers.
  void broadcast_parameters() {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> all = params;
    all.insert(all.end(), buffers.begin(), buffers.end());
    if (all.empty()) return;
    const auto groups = std::get<0>(c10d::compute_bucket_assignment_by_size(all, {static_cast<size_t>(bucket_bytes)}));
    for (const auto &group : groups) {
      std::vector<at::Tensor> pieces;
      for (const size_t i : group) pieces.push_back(wire_buffer(*comm, all[i]).reshape({-1}));
      at::Tensor buf = at::cat(pieces);
      settle(buf);
      comm->broadcast(buf.data_ptr(), buf.numel(), wire_dtype(buf.scalar_type()), buf.element_size(), 0);
      if (comm->rank == 0) continue;
      int64_t at_ = 0;
      for (const size_t i : group) {
        all[i].copy_(buf.narrow(0, at_, all[i].numel()).view(all[i].sizes()));
        at_ += all[i].numel();
      }
    }
  }

  // Same model on every rank: parameter and buffer names, shapes and dtypes.
  void require_same_model() {
    std::string description;
    int64_t values = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      description += names[i] + shape_string(params[i].sizes()) + c10::toString(params[i].scalar_type()) + ";";
      values += params[i].numel();
    }
    for (const auto &b : buffers) description += "buffer" + shape_string(b.sizes()) + c10::toString(b.scalar_type());
    const std::vector<int64_t> mine = {static_cast<int64_t>(params.size()), static_cast<int64_t>(buffers.size()),
                                       values, static_cast<int64_t>(hasher(description))};
    const auto all = comm->gather_values(mine);
    std::string differing;
    for (int r = 1; r < comm->size; ++r) {
      if (!std::equal(all.begin() + 4 * r, all.begin() + 4 * r + 4, all.begin())) {
        differing += "; rank " + std::to_string(r) + " has " + std::to_string(all[4 * r]) + " parameters (" +
                     std::to_string(all[4 * r + 2]) + " values) and " + std::to_string(all[4 * r + 1]) + " buffers";
      }
    }
    if (!differing.empty()) {
      fail(FTC_ERR_DISTRIBUTED, "the model differs across ranks: rank 0 has " + std::to_string(all[0]) +
                                    " parameters (" + std::to_string(all[2]) + " values) and " +
                                    std::to_string(all[1]) + " buffers" + differing +
                                    " (or the same counts with other names, shapes or dtypes); every rank must load "
                                    "the same model");
    }
  }

  void detach() noexcept {
    if (auto o = optim.lock()) {
      if (o->sync.get() == this) o->sync.reset();
    }
  }
};

// What a ftc_ddp handle holds: the last handle going away detaches the optimizer.
struct DataParallelRef {
  std::shared_ptr<DataParallel> ddp;
  ~DataParallelRef() {
    if (ddp) ddp->detach();
  }
};

using DdpTable = HandleTable<std::shared_ptr<DataParallelRef>>;

DataParallel &ddp_of(ftc_ddp h) {
  auto *s = DdpTable::instance().find(h);
  if (s == nullptr || !s->value || !s->value->ddp) bad_handle(h, "data-parallel wrapper", "data-parallel wrapper");
  return *s->value->ddp;
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
    auto &comm = *ftc::comm_of(c);
    const at::Tensor &x = ftc::tensor_of(t, "tensor");
    if (op < FTC_OP_SUM || op > FTC_OP_MIN) {
      ftc::fail_unknown(ftc::ftc_collective_op_table, op);
    }
    if (op == FTC_OP_MEAN && !at::isFloatingType(x.scalar_type())) {
      ftc::fail(FTC_ERR_DTYPE, "the mean over ranks needs a floating-point tensor (this one is " +
                                   std::string(c10::toString(x.scalar_type())) + "; use the sum)");
    }
    const int dtype = ftc::wire_dtype(x.scalar_type());
    ftc::require_agreement(comm, x, op, "allreduce");
    at::Tensor buf = ftc::wire_buffer(comm, x);
    ftc::settle(buf);
    comm.allreduce(buf.data_ptr(), buf.numel(), dtype, buf.element_size(),
                   op == FTC_OP_MEAN ? FTC_OP_SUM : op);
    if (op == FTC_OP_MEAN) {
      at::NoGradGuard no_grad;
      buf.div_(comm.size);
    }
    ftc::land(x, buf);
  });
}

int ftc_broadcast(ftc_comm c, ftc_tensor t, int root) {
  return ftc::guard([&] {
    auto &comm = *ftc::comm_of(c);
    const at::Tensor &x = ftc::tensor_of(t, "tensor");
    if (root < 0 || root >= comm.size) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                "root rank " + std::to_string(root) + " is not in 0.." + std::to_string(comm.size - 1));
    }
    const int dtype = ftc::wire_dtype(x.scalar_type());
    ftc::require_agreement(comm, x, root, "broadcast");
    at::Tensor buf = ftc::wire_buffer(comm, x);
    ftc::settle(buf);
    comm.broadcast(buf.data_ptr(), buf.numel(), dtype, buf.element_size(), root);
    if (comm.rank != root) ftc::land(x, buf);
  });
}

int ftc_allgather(ftc_comm c, ftc_tensor *out, ftc_tensor in) {
  return ftc::guard([&] {
    auto &comm = *ftc::comm_of(c);
    ftc::out_arg(out, "output tensor");
    const at::Tensor &x = ftc::tensor_of(in, "input tensor");
    const int dtype = ftc::wire_dtype(x.scalar_type());
    ftc::require_agreement(comm, x, 0, "allgather");
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

int ftc_ddp_new(ftc_ddp *out, ftc_comm c, ftc_model m, ftc_optim o, int64_t bucket_bytes) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    auto ddp = std::make_shared<ftc::DataParallel>();
    ddp->comm = ftc::comm_of(c);
    ddp->module = ftc::module_ptr(m);
    std::shared_ptr<ftc::Optim> optim = o != nullptr ? ftc::optim_ptr(o) : nullptr;
    if (bucket_bytes < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the bucket size must be positive");
    ddp->bucket_bytes = bucket_bytes;
    for (const auto &p : ddp->module->named_parameters()) {
      ddp->names.push_back(p.name);
      ddp->params.push_back(p.value);
    }
    for (const auto &b : ddp->module->named_buffers()) ddp->buffers.push_back(b.value);
    if (optim) {
      if (optim->sync) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the optimizer is already data-parallel");
      for (size_t k = 0; k < optim->params.size(); ++k) {
        const auto *impl = optim->params[k].unsafeGetTensorImpl();
        const bool found = std::any_of(ddp->params.begin(), ddp->params.end(),
                                       [&](const at::Tensor &p) { return p.unsafeGetTensorImpl() == impl; });
        if (!found) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "parameter " + std::to_string(k + 1) +
                                                  " of the optimizer is not a parameter of the model: a data-parallel "
                                                  "optimizer may only update the model's parameters");
        }
      }
    }
    ddp->require_same_model();
    if (!ddp->params.empty()) {
      ddp->buckets = std::get<0>(
          c10d::compute_bucket_assignment_by_size(ddp->params, {static_cast<size_t>(bucket_bytes)}));
    }
    // Large gradients are reduced in their own memory: copying one costs more than the latency
    // of one more all-reduce (FTORCH_DDP_DIRECT_BYTES sets the size, default 1 MiB).
    const int64_t direct_bytes = ftc::direct_bytes_setting();
    ddp->offset.assign(ddp->params.size(), 0);
    ddp->direct.assign(ddp->params.size(), false);
    for (const auto &bucket : ddp->buckets) {
      int64_t at_ = 0;
      for (const size_t i : bucket) {
        const auto &p = ddp->params[i];
        ddp->direct[i] = p.numel() * static_cast<int64_t>(p.element_size()) >= direct_bytes;
        if (ddp->direct[i]) continue;
        ddp->offset[i] = at_;
        at_ += p.numel();
      }
      ddp->flat_numel.push_back(at_);
    }
    ddp->flat.resize(ddp->buckets.size());
    ddp->broadcast_parameters();
    if (optim) {
      optim->sync = ddp;
      ddp->optim = optim;
    }
    auto ref = std::make_shared<ftc::DataParallelRef>();
    ref->ddp = std::move(ddp);
    ftc::replace_handle<ftc::DdpTable>(out, std::move(ref));
  });
}

int ftc_ddp_delete(ftc_ddp *d) { return ftc::delete_handle<ftc::DdpTable>(d); }
void ftc_ddp_release(ftc_ddp d) { ftc::DdpTable::instance().release(d); }
int ftc_ddp_share(ftc_ddp src, ftc_ddp *dst) { return ftc::share<ftc::DdpTable>(src, dst, "data-parallel wrapper"); }

int ftc_ddp_set_weight(ftc_ddp d, double weight) {
  return ftc::guard([&] {
    auto &ddp = ftc::ddp_of(d);
    if (!(weight > 0) || !std::isfinite(weight)) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "a rank's weight must be positive and finite, not " + std::to_string(weight));
    }
    ddp.weight = weight;
  });
}

int ftc_ddp_sync(ftc_ddp d, int failed, double *loss) {
  return ftc::guard([&] {
    auto &ddp = ftc::ddp_of(d);
    const double global = ddp.average(failed != 0, loss != nullptr ? *loss : 0.0);
    if (loss != nullptr) *loss = global;
  });
}

int ftc_ddp_bucket_count(ftc_ddp d, int64_t *count) {
  return ftc::guard([&] { ftc::out_arg(count, "count") = static_cast<int64_t>(ftc::ddp_of(d).buckets.size()); });
}

int ftc_ddp_broadcast_parameters(ftc_ddp d) {
  return ftc::guard([&] { ftc::ddp_of(d).broadcast_parameters(); });
}

int ftc_comm_checkpoint_save(ftc_comm c, const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s,
                             int64_t step) {
  return ftc::guard([&] {
    auto &comm = *ftc::comm_of(c);
    int64_t status = FTC_OK;
    std::string message;
    if (comm.rank == 0) {
      status = ftc_checkpoint_save(filename, m, o, s, step);
      if (status != FTC_OK) message = ftc::last_error_message();
    }
    comm.broadcast(&status, 1, FTC_INT64, sizeof(status), 0);
    if (status != FTC_OK) {
      ftc::fail(static_cast<int>(status),
                comm.rank == 0 ? message
                               : "rank 0 could not write the checkpoint (see its error); nothing was written");
    }
  });
}

int ftc_comm_checkpoint_load(ftc_comm c, const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s,
                             int64_t *step) {
  return ftc::guard([&] {
    auto &comm = *ftc::comm_of(c);
    // Stage on every rank, agree, then apply everywhere or nowhere. Each local phase runs in the
    // error boundary of its own, so that a rank that fails still takes part in the agreement.
    std::shared_ptr<ftc::StagedCheckpoint> staged;
    const int status = ftc::guard([&] { staged = ftc::stage_checkpoint(filename, m, o, s); });
    std::string message = status != FTC_OK ? ftc::last_error_message() : std::string();
    const int64_t saved_step = staged ? ftc::staged_step(*staged) : 0;
    const int64_t digest = staged ? ftc::staged_digest(*staged) : 0;
    const auto all = comm.gather_values({status, saved_step, digest});
    const std::string failed = ftc::ranks_where(comm, [&](int r) { return all[3 * r] != FTC_OK; });
    const std::string differ = ftc::ranks_where(comm, [&](int r) {
      return all[0] == FTC_OK && all[3 * r] == FTC_OK && (all[3 * r + 1] != all[1] || all[3 * r + 2] != all[2]);
    });
    const std::string nothing = "; nothing was loaded on any rank";
    if (status != FTC_OK) ftc::fail(status, message + nothing);
    if (!failed.empty()) {
      ftc::fail(FTC_ERR_DISTRIBUTED, "rank(s) " + failed + " could not load the checkpoint (see their errors)" + nothing);
    }
    if (!differ.empty()) {
      ftc::fail(FTC_ERR_DISTRIBUTED, "rank(s) " + differ +
                                         " read a checkpoint that differs from rank 0's (step or parameters): every rank "
                                         "must read the same file" + nothing);
    }
    std::shared_ptr<ftc::CheckpointUndo> undo;
    const int applied = ftc::guard([&] { undo = ftc::apply_checkpoint(*staged); });
    if (applied != FTC_OK) message = ftc::last_error_message();
    const auto results = comm.gather_values({applied});
    const std::string failed_apply = ftc::ranks_where(comm, [&](int r) { return results[static_cast<size_t>(r)] != FTC_OK; });
    if (!failed_apply.empty()) {
      if (undo) ftc::undo_checkpoint(*undo, *staged);  // a rank that failed to apply has undone itself
      if (applied != FTC_OK) ftc::fail(applied, message + nothing);
      ftc::fail(FTC_ERR_DISTRIBUTED, "rank(s) " + failed_apply + " could not apply the checkpoint (see their errors)" +
                                         "; every rank was put back as it was");
    }
    if (step != nullptr) *step = saved_step;
  });
}

}  // extern "C"
