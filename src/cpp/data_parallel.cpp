// data_parallel.cpp - data parallelism: the gradients of a model’s parameters, packed into buckets
// (or reduced in their own memory when large), averaged across the ranks of a communicator before
// the optimizer it is attached to steps; parameters broadcast from rank 0.
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm.hpp"
#include "ftorch_c_data_parallel.h"

namespace ftc {

namespace {


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
  std::vector<std::string> names, buffer_names;
  std::vector<std::vector<size_t>> buckets;  // parameter indices, by c10d's bucket assignment
  std::vector<at::Tensor> flat;              // one flat buffer per bucket, made on first use
  std::vector<int64_t> offset;               // of each packed parameter in its bucket's buffer
  std::vector<int64_t> flat_numel;           // elements of each bucket's buffer (its packed parameters)
  std::vector<bool> direct;                  // reduced in its own memory, not packed (see average)
  int64_t bucket_bytes = 0;
  double weight = 1;
  std::weak_ptr<Optim> optim;
  bool fresh = false;  // gradients averaged since the last optimizer update
  // After an explicit ftc_ddp_sync the program's own code runs before the update, and may change
  // the gradients (a backward after the sync, another micro-batch): each gradient as the sync left
  // it (held, so that its memory cannot become another gradient) and its version counter, which
  // backward's accumulation and zeroing in place advance.
  std::vector<at::Tensor> synced;
  std::vector<int64_t> synced_version;
  // Buffers that a forward changes (BatchNorm's running statistics) change by each rank's own
  // batch: after an update whose average saw a buffer changed on any rank, rank 0's are broadcast
  // (PyTorch's DDP broadcasts them before each forward), so that every rank holds the same model
  // and a resumed run (every rank starting from rank 0's) continues as the uninterrupted one.
  // Unchanged buffers cost nothing: the flag rides on the average's control reduction.
  std::vector<int64_t> buffer_version;  // of each buffer, when last broadcast
  bool buffers_pending = false;

  double reduce(double local_loss) override { return average(false, local_loss); }
  // An average made here (clipping, then the step; or a step after the program's own backward)
  // is remembered as an explicit sync is: the program may run a backward between clipping and the
  // step, whose new gradients the step must then average again.
  void before_update() override {
    if (fresh && !changed_since_sync()) return;
    average(false, 0.0);
    remember_gradients();
  }
  void after_update() override {
    fresh = false;
    synced.clear();
    if (buffers_pending) broadcast_buffers();
  }

  // ftc_ddp_sync: average now, and remember the gradients it left.
  double sync(bool failed, double local_loss) {
    const double global = average(failed, local_loss);
    remember_gradients();
    return global;
  }
  void remember_gradients() {
    synced.clear();
    synced_version.clear();
    for (const auto &p : params) {
      synced.push_back(p.grad());
      synced_version.push_back(p.grad().defined() ? p.grad()._version() : -1);
    }
  }

  // Whether the gradients changed on any rank since an explicit sync (false after the averages the
  // library makes itself, with nothing run between them and the update). Every rank decides alike
  // (one small reduction), so that all average again or none does.
  bool changed_since_sync() {
    if (synced.empty()) return false;
    double changed = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor &g = params[i].grad();
      if (g.unsafeGetTensorImpl() != synced[i].unsafeGetTensorImpl() ||
          (g.defined() && g._version() != synced_version[i])) {
        changed = 1;
        break;
      }
    }
    synced.clear();
    if (comm->size > 1) comm->allreduce(&changed, 1, FTC_FLOAT64, sizeof(double), FTC_OP_MAX);
    return changed > 0;
  }
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
    synced.clear();  // (this average supersedes an earlier explicit sync)
    const size_t n = params.size();
    // One small reduction first: failures, weights, loss and which parameters have gradients.
    std::vector<double> control(4 + n, 0.0);
    control[0] = failed ? 1 : 0;
    control[1] = weight;
    control[2] = weight * local_loss;
    for (size_t i = 0; i < n; ++i) control[3 + i] = has_gradient(i) ? 1 : 0;
    control[3 + n] = buffers_changed() ? 1 : 0;
    comm->allreduce(control.data(), static_cast<int64_t>(control.size()), FTC_FLOAT64, sizeof(double),
                    FTC_OP_SUM);
    buffers_pending = buffers_pending || (control[3 + n] > 0 && comm->size > 1);
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
        // No rank produced a gradient, or none here and frozen here: left as it is (undefined
        // stays undefined).
        if (direct[i] || control[3 + i] == 0 || (!p.grad().defined() && !p.requires_grad())) continue;
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

  // Any gradient the optimizer will step with: also that of a parameter frozen after its backward
  // (LibTorch's optimizers step every parameter with a gradient, frozen or not).
  bool has_gradient(size_t i) const { return params[i].grad().defined(); }

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

  bool buffers_changed() const {
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i]._version() != buffer_version[i]) return true;
    }
    return false;
  }
  void remember_buffers() {
    buffer_version.clear();
    for (const auto &b : buffers) buffer_version.push_back(b._version());
    buffers_pending = false;
  }

  // Parameters and buffers of rank 0 to every rank.
  void broadcast_parameters() {
    std::vector<at::Tensor> all = params;
    all.insert(all.end(), buffers.begin(), buffers.end());
    broadcast_from_rank_0(all);
    remember_buffers();
  }
  void broadcast_buffers() {
    broadcast_from_rank_0(buffers);
    remember_buffers();
  }

  // Tensors of rank 0 to every rank, in buckets of flat buffers.
  void broadcast_from_rank_0(std::vector<at::Tensor> &all) {
    at::NoGradGuard no_grad;
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

  // Same model on every rank (parameter and buffer names, shapes and dtypes) and the same bucketing
  // (bucket size, FTORCH_DDP_DIRECT_BYTES): which collectives each average and broadcast run
  // follows from them. One gather, which also carries the status of this rank's local checks
  // (see local): a rank that failed them fails the call on every rank.
  void require_same_model(int status, const std::string &message, int64_t direct_bytes) {
    constexpr size_t kFields = 7;
    std::vector<int64_t> mine(kFields, 0);
    mine[0] = status;
    if (status == FTC_OK) {
      std::string description;
      int64_t values = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        description += names[i] + shape_string(params[i].sizes()) + c10::toString(params[i].scalar_type()) + ";";
        values += params[i].numel();
      }
      for (size_t i = 0; i < buffers.size(); ++i) {
        description += buffer_names[i] + shape_string(buffers[i].sizes()) + c10::toString(buffers[i].scalar_type()) + ";";
      }
      mine = {status, static_cast<int64_t>(params.size()), static_cast<int64_t>(buffers.size()), values,
              digest_of(description), bucket_bytes, direct_bytes};
    }
    const auto all = comm->gather_values(mine);
    const auto field = [&](int r, size_t k) { return all[kFields * static_cast<size_t>(r) + k]; };
    fail_if_any_rank_failed(*comm, status, message, [&](int r) { return field(r, 0); }, "torch_ddp_init");
    std::string differing;
    for (int r = 1; r < comm->size; ++r) {
      if (!std::equal(all.begin() + kFields * r + 1, all.begin() + kFields * r + 5, all.begin() + 1)) {
        differing += "; rank " + std::to_string(r) + " has " + std::to_string(field(r, 1)) + " parameters (" +
                     std::to_string(field(r, 3)) + " values) and " + std::to_string(field(r, 2)) + " buffers";
      }
    }
    if (!differing.empty()) {
      fail(FTC_ERR_DISTRIBUTED, "the model differs across ranks: rank 0 has " + std::to_string(field(0, 1)) +
                                    " parameters (" + std::to_string(field(0, 3)) + " values) and " +
                                    std::to_string(field(0, 2)) + " buffers" + differing +
                                    " (or the same counts with other names, shapes or dtypes); every rank must load "
                                    "the same model");
    }
    for (int r = 1; r < comm->size; ++r) {
      if (field(r, 5) != field(0, 5) || field(r, 6) != field(0, 6)) {
        fail(FTC_ERR_DISTRIBUTED,
             "the ranks bucket the gradients differently: rank " + std::to_string(r) + " has a bucket size of " +
                 std::to_string(field(r, 5)) + " bytes and FTORCH_DDP_DIRECT_BYTES " + std::to_string(field(r, 6)) +
                 ", rank 0 " + std::to_string(field(0, 5)) + " and " + std::to_string(field(0, 6)) +
                 "; every rank must pass the same bucket_mb and see the same FTORCH_DDP_DIRECT_BYTES (the "
                 "averages run the same collectives on every rank)");
      }
    }
  }

  void detach() noexcept {
    if (auto o = optim.lock()) {
      if (o->sync.get() == this) o->sync.reset();
    }
  }
};

// What a ftc_ddp handle holds. Only ftc_ddp_delete of the last handle detaches the optimizer: a
// handle released otherwise (a Fortran variable finalized at the end of the routine that set data
// parallelism up, on the compilers that finalize it) leaves the optimizer data-parallel, which
// keeps the wrapper alive (Optim::sync), so that training does not fall back to local steps
// depending on what a compiler finalizes.
struct DataParallelRef {
  std::shared_ptr<DataParallel> ddp;
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

int ftc_ddp_new(ftc_ddp *out, ftc_comm c, ftc_model m, ftc_optim o, int64_t bucket_bytes) {
  return ftc::guard([&] {
    auto ddp = std::make_shared<ftc::DataParallel>();
    ddp->comm = ftc::comm_of(c);
    // This rank's checks, then one agreement of every rank (see require_same_model).
    std::shared_ptr<ftc::Optim> optim;
    int64_t direct_bytes = 0;
    std::string message;
    const int status = ftc::local(message, [&] {
      ftc::out_arg(out, "out");
      ddp->module = ftc::module_ptr(m);
      if (o != nullptr) optim = ftc::optim_ptr(o);
      if (bucket_bytes < 1) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the bucket size must be positive");
      ddp->bucket_bytes = bucket_bytes;
      for (const auto &p : ddp->module->named_parameters()) {
        ddp->names.push_back(p.name);
        ddp->params.push_back(p.value);
      }
      for (const auto &b : ddp->module->named_buffers()) {
        ddp->buffer_names.push_back(b.name);
        ddp->buffers.push_back(b.value);
      }
      if (optim) {
        if (optim->sync) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the optimizer is already data-parallel");
        for (size_t k = 0; k < optim->params.size(); ++k) {
          const auto *impl = optim->params[k].unsafeGetTensorImpl();
          const bool found = std::any_of(ddp->params.begin(), ddp->params.end(),
                                         [&](const at::Tensor &p) { return p.unsafeGetTensorImpl() == impl; });
          if (!found) {
            ftc::fail(FTC_ERR_INVALID_ARGUMENT, "parameter " + std::to_string(k + 1) +
                                                    " of the optimizer is not a parameter of the model: a "
                                                    "data-parallel optimizer may only update the model's parameters");
          }
        }
      }
      // Large gradients are reduced in their own memory: copying one costs more than the latency
      // of one more all-reduce (FTORCH_DDP_DIRECT_BYTES sets the size, default 1 MiB).
      direct_bytes = ftc::direct_bytes_setting();
    });
    ddp->require_same_model(status, message, direct_bytes);
    if (!ddp->params.empty()) {
      ddp->buckets = std::get<0>(
          c10d::compute_bucket_assignment_by_size(ddp->params, {static_cast<size_t>(bucket_bytes)}));
    }
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

int ftc_ddp_delete(ftc_ddp *d) {
  if (d != nullptr) {
    auto *s = ftc::DdpTable::instance().find(*d);
    if (s != nullptr && s->value && s->value.use_count() == 1 && s->value->ddp) s->value->ddp->detach();
  }
  return ftc::delete_handle<ftc::DdpTable>(d);
}
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
    const double global = ddp.sync(failed != 0, loss != nullptr ? *loss : 0.0);
    if (loss != nullptr) *loss = global;
  });
}

int ftc_ddp_bucket_count(ftc_ddp d, int64_t *count) {
  return ftc::guard([&] { ftc::out_arg(count, "count") = static_cast<int64_t>(ftc::ddp_of(d).buckets.size()); });
}

int ftc_ddp_broadcast_parameters(ftc_ddp d) {
  return ftc::guard([&] { ftc::ddp_of(d).broadcast_parameters(); });
}

}  // extern "C"
