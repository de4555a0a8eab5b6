// node_shared.cpp - node-shared models: one model for the ranks of a communicator, held by its rank
// 0 (the leader). Forward and the training step gather every rank's batch to the leader, run once on
// the batches concatenated in rank order, and scatter each rank's rows of the results back. Every
// step of the protocol is collective and every rank reaches the same verdict, so a failure anywhere
// ends the call on every rank instead of leaving some waiting.
#include <chrono>
#include <cstring>
#include <functional>

#include "comm.hpp"
#include "ftorch_c_train.h"

namespace ftc {

struct NodeShared {
  std::shared_ptr<Comm> comm;
  c10::Device device{c10::kCPU};  // where the leader runs the model
  bool leader() const { return comm->rank == 0; }
};

Model *shared_model(ftc_model m) {
  auto *s = ModelTable::instance().find(m);
  return s != nullptr && s->value && s->value->shared ? s->value.get() : nullptr;
}

void require_model_here(const Model &model) {
  if (model.shared && !model.shared->leader()) {
    fail(FTC_ERR_INVALID_ARGUMENT,
         "this rank (rank " + std::to_string(model.shared->comm->rank) +
             " of the model's communicator) does not hold the node-shared model: its parameters, optimizers, saves "
             "and checkpoints live on rank 0 of that communicator (torch_model_is_leader says which rank that is); "
             "here only forward and torch_train_step run, with the other ranks");
  }
}

namespace {

constexpr size_t kMaxTensors = 16, kMaxDims = 8;
// A header: [status, operation, count, then per tensor (dtype, ndim, sizes...)].
constexpr size_t kStatus = 0, kOperation = 1, kCount = 2, kTensors = 3;
constexpr size_t kPerTensor = 2 + kMaxDims;
constexpr size_t kHeader = kTensors + kMaxTensors * kPerTensor;
constexpr size_t kMessage = 1024;
enum Operation : int64_t { kForward = 1, kTrainStep = 2 };

// The description of tensor i in header h: dtype (c10's number), ndim, sizes.
const int64_t *tensor_in(const int64_t *h, size_t i) { return h + kTensors + i * kPerTensor; }
// Rank r's header among every rank's.
const int64_t *header_of(const std::vector<int64_t> &all, int r) { return &all[static_cast<size_t>(r) * kHeader]; }
int64_t batch_of(const std::vector<int64_t> &all, int r) { return tensor_in(header_of(all, r), 0)[2]; }

// The tensors a rank brings (or the leader returns), as the other ranks need to know them before
// any data moves.
std::vector<int64_t> describe(int status, Operation op, const std::vector<at::Tensor> &tensors) {
  std::vector<int64_t> h(kHeader, 0);
  h[kStatus] = status;
  h[kOperation] = op;
  if (status != FTC_OK) return h;
  h[kCount] = static_cast<int64_t>(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    int64_t *d = &h[kTensors + i * kPerTensor];
    d[0] = static_cast<int64_t>(tensors[i].scalar_type());
    d[1] = tensors[i].dim();
    for (int64_t k = 0; k < tensors[i].dim(); ++k) d[2 + k] = tensors[i].size(k);
  }
  return h;
}

c10::ScalarType described_type(const int64_t *d) { return static_cast<c10::ScalarType>(d[0]); }

// What each tensor may be: batched along dimension 0, a dtype the collectives carry, within the
// header's room.
void check_batched(const std::vector<at::Tensor> &tensors, const char *what) {
  if (tensors.empty() || tensors.size() > kMaxTensors) {
    fail(FTC_ERR_INVALID_ARGUMENT, "a call of a node-shared model moves 1 to " + std::to_string(kMaxTensors) +
                                       " tensors each way (" + what + "s), not " + std::to_string(tensors.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto &t = tensors[i];
    if (t.dim() < 1 || t.dim() > static_cast<int64_t>(kMaxDims)) {
      fail(FTC_ERR_SHAPE, std::string(what) + " " + std::to_string(i + 1) + " has " + std::to_string(t.dim()) +
                              " dimensions: a node-shared model needs 1 to " + std::to_string(kMaxDims) +
                              ", the first (the first Fortran index) being the batch");
    }
    wire_dtype(t.scalar_type());
    if (t.size(0) != tensors[0].size(0)) {
      fail(FTC_ERR_SHAPE, std::string(what) + " " + std::to_string(i + 1) + " has a batch of " +
                              std::to_string(t.size(0)) + " (dimension 1 of the Fortran array) and " + what + " 1 of " +
                              std::to_string(tensors[0].size(0)) + ": the tensors of a node-shared call share the batch");
    }
  }
}

int64_t row_elements(const int64_t *d) {
  int64_t n = 1;
  for (int64_t k = 1; k < d[1]; ++k) n *= d[2 + k];
  return n;
}

std::string described_shape(const int64_t *d) {
  return shape_string(c10::IntArrayRef(d + 2, static_cast<size_t>(d[1])));
}

// Every rank's description, and the verdict every rank reaches on them: a rank that failed ends the
// call everywhere (its own error there, FTC_ERR_DISTRIBUTED naming it elsewhere), and so do
// tensors that differ in anything but their batch size.
std::vector<int64_t> agree(Comm &comm, int status, const std::string &message, Operation op,
                           const std::vector<at::Tensor> &mine, const char *what) {
  const auto all = comm.gather_values(describe(status, op, mine));
  if (status != FTC_OK) fail(status, message + " (the other ranks of the node-shared model were told)");
  const std::string failed = ranks_where(comm, [&](int r) { return header_of(all, r)[kStatus] != FTC_OK; });
  if (!failed.empty()) {
    fail(FTC_ERR_DISTRIBUTED, "rank(s) " + failed + " of the node-shared model failed before it ran (see their "
                              "errors); nothing ran");
  }
  const std::string other = ranks_where(comm, [&](int r) { return header_of(all, r)[kOperation] != op; });
  if (!other.empty()) {
    fail(FTC_ERR_DISTRIBUTED, "rank(s) " + other + " called " + (op == kForward ? "torch_train_step" : "forward") +
                                  " of the node-shared model where this rank called " +
                                  (op == kForward ? "forward" : "torch_train_step") +
                                  ": every rank makes the same call; nothing ran");
  }
  const int64_t *first = header_of(all, 0);
  for (int r = 1; r < comm.size; ++r) {
    const int64_t *h = header_of(all, r);
    if (h[kCount] != first[kCount]) {
      fail(FTC_ERR_INVALID_ARGUMENT, "rank " + std::to_string(r) + " passed " + std::to_string(h[kCount]) + " " +
                                         what + "s and rank 0 " + std::to_string(first[kCount]) +
                                         ": every rank of a node-shared model passes the same number");
    }
    for (size_t i = 0; i < static_cast<size_t>(h[kCount]); ++i) {
      const int64_t *a = tensor_in(first, i), *b = tensor_in(h, i);
      bool same = a[0] == b[0] && a[1] == b[1];
      for (int64_t k = 1; same && k < a[1]; ++k) same = a[2 + k] == b[2 + k];
      if (!same) {
        fail(FTC_ERR_SHAPE, std::string(what) + " " + std::to_string(i + 1) + " is a " +
                                dtype_name(described_type(b)) + " tensor of shape " + described_shape(b) + " on rank " +
                                std::to_string(r) + " and a " + dtype_name(described_type(a)) + " one of shape " +
                                described_shape(a) + " on rank 0: the ranks of a node-shared model may differ only "
                                "in the batch size (dimension 1 of the Fortran array)");
      }
    }
  }
  return all;
}

// Rank r's element count of tensor i of every rank's headers (the same on every rank).
std::vector<int64_t> counts_of(const Comm &comm, const std::vector<int64_t> &all, size_t i) {
  std::vector<int64_t> counts(static_cast<size_t>(comm.size));
  for (int r = 0; r < comm.size; ++r) {
    const int64_t *d = tensor_in(header_of(all, r), i);
    counts[r] = d[2] * row_elements(d);
  }
  return counts;
}

// The leader's buffers for every rank's tensors concatenated along dimension 0.
std::vector<at::Tensor> gather_buffers(const Comm &comm, const std::vector<int64_t> &all) {
  std::vector<at::Tensor> buffers;
  const int64_t *first = header_of(all, 0);
  for (size_t i = 0; i < static_cast<size_t>(first[kCount]); ++i) {
    const int64_t *d = tensor_in(first, i);
    std::vector<int64_t> sizes(d + 2, d + 2 + d[1]);
    sizes[0] = 0;
    for (int r = 0; r < comm.size; ++r) sizes[0] += tensor_in(header_of(all, r), i)[2];
    buffers.push_back(at::empty(sizes, at::TensorOptions().dtype(described_type(d))));
  }
  return buffers;
}

// Every rank's tensors into the leader's buffers (empty elsewhere).
void gather_batches(Comm &comm, const std::vector<int64_t> &all, const std::vector<at::Tensor> &mine,
                    const std::vector<at::Tensor> &buffers) {
  for (size_t i = 0; i < mine.size(); ++i) {
    const at::Tensor &send = mine[i];  // (host memory, contiguous: made so in the local phase)
    comm.gatherv(send.data_ptr(), send.numel(), comm.rank == 0 ? buffers[i].data_ptr() : nullptr,
                 counts_of(comm, all, i), wire_dtype(send.scalar_type()), 0);
  }
}

// The leader's verdict (status, extra values, message) to every rank.
std::vector<int64_t> from_leader(Comm &comm, std::vector<int64_t> values, std::string &message) {
  comm.broadcast(values.data(), static_cast<int64_t>(values.size()), FTC_INT64, sizeof(int64_t), 0);
  if (values[0] != FTC_OK) {
    std::vector<char> text(kMessage, '\0');
    if (comm.rank == 0) std::memcpy(text.data(), message.data(), std::min(message.size(), kMessage - 1));
    comm.broadcast(text.data(), static_cast<int64_t>(kMessage), FTC_UINT8, 1, 0);
    if (comm.rank != 0) message.assign(text.data());
  }
  return values;
}

// A failure of the leader, on every rank.
void leader_failed(const Comm &comm, int64_t status, const std::string &message) {
  if (comm.rank == 0) fail(static_cast<int>(status), message + " (the other ranks of the node-shared model were told)");
  fail(FTC_ERR_DISTRIBUTED, "the node-shared model failed on its leader (rank 0): " + message);
}

// The leader's phase of a call: work only it does, its failure told to every rank.
template <class Fn>
void on_leader(Comm &comm, Fn &&fn) {
  std::string message;
  const int status = comm.rank == 0 ? local(message, std::forward<Fn>(fn)) : FTC_OK;
  const auto verdict = from_leader(comm, {status}, message);
  if (verdict[0] != FTC_OK) leader_failed(comm, verdict[0], message);
}

// This rank's arguments (resolved within the call, so that a rank whose arguments are bad still
// takes part), checked, agreed on by every rank, and gathered into the leader's buffers.
template <class Resolve>
std::vector<at::Tensor> gathered(Comm &comm, Operation op, Resolve &&resolve, const char *what,
                                 std::vector<int64_t> &all) {
  std::vector<at::Tensor> mine;
  std::string message;
  const int status = local(message, [&] {
    mine = resolve();
    check_batched(mine, what);
    for (auto &t : mine) t = t.to(c10::kCPU).contiguous();  // what the gather sends
  });
  all = agree(comm, status, message, op, mine, what);
  std::vector<at::Tensor> buffers;
  on_leader(comm, [&] { buffers = gather_buffers(comm, all); });
  gather_batches(comm, all, mine, buffers);
  return buffers;
}

}  // namespace

c10::IValue shared_forward(Model &model, const std::function<std::vector<c10::IValue>()> &resolve,
                           int requires_grad) {
  auto &comm = *model.shared->comm;
  std::vector<int64_t> all;
  const auto batches = gathered(comm, kForward, [&] {
    if (requires_grad != 0) {
      fail(FTC_ERR_INVALID_ARGUMENT, "a node-shared model runs forward without a graph (requires_grad off): its "
                                     "outputs come from another rank; train it with torch_train_step");
    }
    std::vector<at::Tensor> tensors;
    const auto args = resolve();
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].isTensor()) {
        fail(FTC_ERR_INVALID_ARGUMENT, "argument " + std::to_string(i + 1) + " is a " + args[i].tagKind() +
                                           ": a node-shared model takes tensors only");
      }
      tensors.push_back(args[i].toTensor());
    }
    return tensors;
  }, "input", all);

  // The leader runs the model on everything and tells every rank what came out.
  int64_t batch = 0;
  for (int r = 0; r < comm.size; ++r) batch += batch_of(all, r);
  std::vector<at::Tensor> results;
  std::string message;
  int status = FTC_OK;
  if (comm.rank == 0) {
    status = local(message, [&] {
      std::vector<c10::IValue> values;
      for (const auto &t : batches) values.emplace_back(t.to(model.shared->device));
      const auto out = forward_here(model, std::move(values), 0);
      std::vector<c10::IValue> items;
      if (out.isTensor()) {
        items.push_back(out);
      } else if (out.isTuple()) {
        items = out.toTupleRef().elements().vec();
      } else if (out.isList()) {
        items = out.toListRef().vec();
      } else {
        fail(FTC_ERR_INVALID_ARGUMENT, std::string("the model returned a ") + out.tagKind() +
                                           "; a node-shared model returns a Tensor, or a tuple or list of them");
      }
      for (const auto &v : items) {
        if (!v.isTensor()) {
          fail(FTC_ERR_INVALID_ARGUMENT, std::string("the model returned a ") + v.tagKind() +
                                             " among its outputs; a node-shared model returns tensors");
        }
        results.push_back(v.toTensor());
      }
      check_batched(results, "output");
      for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].size(0) != batch) {
          fail(FTC_ERR_SHAPE, "output " + std::to_string(i + 1) + " has " + std::to_string(results[i].size(0)) +
                                  " rows along dimension 1 where the ranks' batches have " + std::to_string(batch) +
                                  " in all: a node-shared model must keep the batch as the first dimension of each "
                                  "output");
        }
        results[i] = results[i].to(c10::kCPU).contiguous();  // what the scatter sends
      }
    });
  }
  const auto out = from_leader(comm, describe(status, kForward, results), message);
  if (out[kStatus] != FTC_OK) leader_failed(comm, out[kStatus], message);

  // Each rank's rows of each output.
  std::vector<c10::IValue> rows;
  for (size_t i = 0; i < static_cast<size_t>(out[kCount]); ++i) {
    const int64_t *d = tensor_in(out.data(), i);
    const int64_t row = row_elements(d);
    std::vector<int64_t> counts(static_cast<size_t>(comm.size));
    for (int r = 0; r < comm.size; ++r) counts[r] = batch_of(all, r) * row;
    std::vector<int64_t> sizes(d + 2, d + 2 + d[1]);
    sizes[0] = batch_of(all, comm.rank);
    at::Tensor recv = at::empty(sizes, at::TensorOptions().dtype(described_type(d)));
    comm.scatterv(comm.rank == 0 ? results[i].data_ptr() : nullptr, counts, recv.data_ptr(), recv.numel(),
                  wire_dtype(recv.scalar_type()), 0);
    rows.emplace_back(recv);
  }
  if (rows.size() == 1) return rows[0];
  return c10::ivalue::Tuple::create(std::move(rows));
}

double shared_train_step(Model &model, ftc_optim o, ftc_scheduler s,
                         const std::function<std::vector<at::Tensor>()> &resolve, int loss_kind, int reduction,
                         double max_grad_norm) {
  auto &comm = *model.shared->comm;
  const auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> all;
  // (A leader whose optimizer is data-parallel over the leaders tells them when its group fails
  // before the step: see before_reduced_step.)
  const ftc_optim leader_optim = comm.rank == 0 ? o : nullptr;
  auto batches = before_reduced_step(leader_optim, [&] {
    return gathered(comm, kTrainStep, resolve, "input and target tensor", all);
  });
  double value = 0;
  std::string message;
  int status = FTC_OK;
  if (comm.rank == 0) {
    status = local(message, [&] {
      TrainStep step = before_reduced_step(leader_optim, [&] {
        for (auto &t : batches) t = t.to(model.shared->device);
        at::Tensor target = batches.back();
        batches.pop_back();
        return train_step_for(model, o, s, std::move(batches), std::move(target), loss_kind, reduction,
                              max_grad_norm);
      });
      value = run_train_step(step);
      finish_train_step(step, value, start, nullptr, nullptr);
    });
  }
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(value));
  const auto out = from_leader(comm, {status, bits}, message);
  if (out[0] != FTC_OK) leader_failed(comm, out[0], message);
  std::memcpy(&value, &out[1], sizeof(value));
  return value;
}

}  // namespace ftc

extern "C" {

int ftc_model_load_shared(ftc_model *out, ftc_comm c, const char *filename, int device_type, int device_index,
                          int requires_grad, int is_training) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    auto shared = std::make_shared<ftc::NodeShared>();
    shared->comm = ftc::comm_of(c);
    auto &comm = *shared->comm;
    if (!comm.rooted()) {
      ftc::fail(FTC_ERR_INVALID_ARGUMENT, "this communicator was made without gatherv/scatterv functions, which a "
                                          "node-shared model needs (make it with torch_comm_init of module ftorch_mpi, "
                                          "or pass them to ftc_comm_new)");
    }
    std::shared_ptr<ftc::Model> model;
    std::string message;
    int status = FTC_OK;
    if (comm.rank == 0) {
      status = ftc::local(message, [&] {
        shared->device = ftc::device(device_type, device_index);
        model = ftc::load_model(filename, device_type, device_index, requires_grad, is_training);
      });
    }
    const int training = model && !model->compiled && model->module.is_training() ? 1 : 0;
    const auto verdict = ftc::from_leader(comm, {status, training}, message);
    if (verdict[0] != FTC_OK) {
      if (comm.rank == 0) ftc::fail(status, message + " (the other ranks of the node-shared model were told)");
      ftc::fail(FTC_ERR_DISTRIBUTED, "the leader (rank 0) could not load the node-shared model: " + message);
    }
    if (comm.rank != 0) {
      // The other ranks hold no module: an empty one that knows the leader's mode.
      model = std::make_shared<ftc::Model>();
      model->module = torch::jit::Module(c10::QualifiedName("__torch__.ftorch.NodeSharedModel"));
      model->module.register_attribute("training", c10::BoolType::get(), c10::IValue(verdict[1] != 0));
    }
    model->shared = std::move(shared);
    ftc::replace_handle<ftc::ModelTable>(out, std::move(model));
  });
}

int ftc_model_is_leader(ftc_model m, int *leader) {
  return ftc::guard([&] {
    const auto &model = ftc::any_model_of(m);
    ftc::out_arg(leader, "leader") = !model.shared || model.shared->leader() ? 1 : 0;
  });
}

}  // extern "C"
