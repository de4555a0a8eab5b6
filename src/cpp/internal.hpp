// internal.hpp - what every translation unit of the C layer shares: handle types, the error
// boundary, argument checks and the mapping of FTorch enumerators to c10 types.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "enum_names.hpp"
#include "ftorch_c.h"

namespace ftc {

// What a data-parallel wrapper (data_parallel.cpp) does around the updates of its optimizer.
struct GradientSync {
  virtual ~GradientSync() = default;
  // Average the gradients across ranks now, and the loss weighted as the gradients are; returns
  // the global loss (every rank gets the same value).
  virtual double reduce(double local_loss) = 0;
  // Before the optimizer reads gradients (step, clipping): reduce them unless they have not
  // changed since the last reduce.
  virtual void before_update() = 0;
  // After the optimizer's update, or the gradients zeroed: the next update reduces again (a
  // reduce before zero_grad, to log the loss after a step, says nothing of the next gradients).
  virtual void after_update() = 0;
  // This rank failed before reaching its reduce: take part in it with a failure flag, so that the
  // other ranks fail with a clear error instead of waiting forever. Never throws.
  virtual void report_failure() noexcept = 0;
};

struct TrainGraph;  // graph_step.cpp

// An optimizer and the parameters it updates; shared with the schedulers that drive it.
struct Optim {
  int kind = 0;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::vector<at::Tensor> params;
  int64_t steps = 0;  // optimizer steps taken (also counted by train steps)
  // Train steps (ftc_train_step) since their progress log last read them, and their wall time:
  // per optimizer, so that runs training several models keep their logs apart.
  int64_t window_steps = 0;
  double window_seconds = 0;
  std::shared_ptr<GradientSync> sync;  // set while the optimizer is data-parallel
  std::shared_ptr<TrainGraph> graph;   // the training step captured as a CUDA graph, once warmed up
  // PyTorch's group["initial_lr"]: the rate when the first scheduler over it was made, the base of
  // every scheduler's closed forms (a cosine schedule's restarts) even after another changed it.
  std::optional<double> initial_lr;
  // The last model a training step found this optimizer updating (train.cpp trains_model): the check
  // runs once per model, and a freed model (even one whose memory a new model reuses) is checked anew.
  std::optional<c10::weak_intrusive_ptr<c10::ivalue::Object>> trains;
};

// The gradients of some optimizers' parameters as they are (an undefined one as undefined), to
// put back: see reduced_step. Nothing is copied where no gradient is defined (a step that starts
// with zero_grad, the first step of an accumulation cycle).
class GradientsBefore {
 public:
  explicit GradientsBefore(const std::vector<Optim *> &optims) {
    for (const Optim *o : optims) {
      for (const auto &p : o->params) kept_.emplace_back(p, p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
  }
  void restore() noexcept {
    try {
      for (auto &[p, g] : kept_) p.mutable_grad() = g;
    } catch (...) {
      // (assigning a gradient allocates nothing: not reached)
    }
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;
};

// One training step's forward, loss and backward (body returns the local loss value), then, for
// data-parallel optimizers, the gradients averaged across ranks (the first optimizer's average
// also carries the loss and every rank's failure). A failure in body is reported to the other
// ranks before it propagates. On a failure anywhere every rank's gradients are put back as they
// were before body: a healthy rank learns of another's failure in the average, after its own
// backward, whose gradients would otherwise stay in an accumulation cycle (and count twice when
// the step is retried). Returns the (global) loss.
// (Within an accumulation cycle the copy costs one gradient's memory per parameter for the step.)
template <class Body>
double reduced_step(const std::vector<Optim *> &optims, Body &&body) {
  if (optims.empty() || !optims[0]->sync) return body();
  std::optional<GradientsBefore> before;
  double local = 0;
  try {
    before.emplace(optims);  // (out of memory here is this rank's failure too)
    local = body();
  } catch (...) {
    if (before) before->restore();
    optims[0]->sync->report_failure();
    throw;
  }
  try {
    const double global = optims[0]->sync->reduce(local);
    for (size_t i = 1; i < optims.size(); ++i) {
      if (optims[i]->sync) optims[i]->sync->reduce(0.0);
    }
    return global;
  } catch (...) {
    before->restore();
    throw;
  }
}
template <class Body>
double reduced_step(Optim &opt, Body &&body) {
  return reduced_step(std::vector<Optim *>{&opt}, std::forward<Body>(body));
}

// Tells the other ranks of a data-parallel optimizer o (any handle, or null) that this rank failed
// before its step's reduced_step. Never throws.
void report_failure_to_ranks(ftc_optim o) noexcept;

// The part of a training step before its reduced_step (resolving and checking the arguments,
// moving the batch): a failure there reaches the other ranks of a data-parallel optimizer o,
// which would otherwise wait in the step's average forever (and pair it with this rank's next).
template <class Prepare>
auto before_reduced_step(ftc_optim o, Prepare &&prepare) -> decltype(prepare()) {
  try {
    return prepare();
  } catch (...) {
    report_failure_to_ranks(o);
    throw;
  }
}

// An optimizer's state replaced by a saved one, as PyTorch's load_state_dict does: a parameter
// without state in the archive has none afterwards (LibTorch's own load keeps whatever state such
// a parameter had, so rolling back to a checkpoint taken before the first step would keep the
// moments of the steps since). Every load of an optimizer goes through one of these.
inline void load_optimizer_state(torch::optim::Optimizer &opt, torch::serialize::InputArchive &archive) {
  opt.state().clear();
  opt.load(archive);
}
inline void load_optimizer_state(torch::optim::Optimizer &opt, const std::string &file, const c10::Device &device) {
  torch::serialize::InputArchive archive;
  archive.load_from(file, device);
  load_optimizer_state(opt, archive);
}

// Before an update reads the gradients of opt (step, clipping), and after it.
inline void before_update(Optim &opt) {
  if (opt.sync) opt.sync->before_update();
}
inline void after_update(Optim &opt) {
  if (opt.sync) opt.sync->after_update();
}

// A learning-rate schedule with PyTorch's semantics (recursive forms, as torch.optim.lr_scheduler).
struct Scheduler {
  int kind = 0;
  std::shared_ptr<Optim> optim;
  // The schedule's settings: those of its kind are set (ftorch_c_optim.h).
  ftc_step_lr_options step_lr = FTC_STEP_LR_OPTIONS_DEFAULTS;
  ftc_multistep_lr_options multistep = FTC_MULTISTEP_LR_OPTIONS_DEFAULTS;
  std::vector<int64_t> milestones;
  double exponential_gamma = 0;
  ftc_cosine_lr_options cosine = FTC_COSINE_LR_OPTIONS_DEFAULTS;
  ftc_linear_lr_options linear = FTC_LINEAR_LR_OPTIONS_DEFAULTS;
  ftc_plateau_options plateau = FTC_PLATEAU_OPTIONS_DEFAULTS;
  double base_lr = 0;
  double last_lr = 0;  // the rate this schedule last set (get_last_lr)
  int64_t last_epoch = -1;
  int64_t step_count = 0;
  // reduce-on-plateau
  double best = 0;
  int64_t num_bad_epochs = 0;
  int64_t cooldown_counter = 0;

  void step(bool has_metric, double metric);  // advance, then last_lr
  void advance(bool has_metric, double metric);
  // State as numbers, in a fixed order, for checkpoints.
  std::vector<double> state() const;
  void set_state(const std::vector<double> &values);
};

// Checkpoints (checkpoint.cpp) in two phases, so that ranks can agree before any of them changes:
// stage reads and checks a file against the objects (nothing changes); apply changes them all or,
// failing part way, none (and returns what undo_checkpoint puts back).
struct StagedCheckpoint;
struct CheckpointUndo;
std::shared_ptr<StagedCheckpoint> stage_checkpoint(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s);
int64_t staged_step(const StagedCheckpoint &st);
int64_t staged_digest(const StagedCheckpoint &st);  // of the model values the file holds
std::shared_ptr<CheckpointUndo> apply_checkpoint(StagedCheckpoint &st);
void undo_checkpoint(CheckpointUndo &undo, const StagedCheckpoint &st) noexcept;

double get_lr(const Optim &o);

// The value of a checkpoint's "format" entry (checkpoint.cpp writes it; model.cpp refuses to load such a
// file as a model; python/ftorch/_inspect.py recognizes it).
constexpr const char *kCheckpointFormat = "ftorch-checkpoint-1";
// A temporary file name next to `file`, unique per host, process and thread: a file is written
// there and then renamed over `file` (checkpoint.cpp).
std::string temporary_name(const std::string &file);
void set_lr(Optim &o, double lr);

}  // namespace ftc

namespace ftc {

// An error we raise ourselves, with the status it maps to.
class Error : public std::runtime_error {
 public:
  Error(int status, const std::string &msg) : std::runtime_error(msg), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

[[noreturn]] inline void fail(int status, const std::string &msg) { throw Error(status, msg); }

// An enumerator value none of whose names matches: Error(status) "unknown <noun> <value> (one of:
// NAME (value), ...)", the names from the generated table (enum_names.hpp).
[[noreturn]] void fail_unknown(const EnumTable &table, int value, int status = FTC_ERR_INVALID_ARGUMENT);
// "NAME (value), ..." of a table's enumerators, those `accepted` keeps when given.
std::string enum_choices(const EnumTable &table, bool (*accepted)(int) = nullptr);
// The name of an enumerator without `prefix` ("ADAM" for FTC_OPTIM_ADAM with "FTC_OPTIM_"), or its
// number when the table has no such value.
std::string enum_name(const EnumTable &table, int value, const char *prefix);

// A forward that LibTorch (or the TorchScript interpreter) failed: Error whose first line is the
// reason in Fortran's terms, with the status it implies (FTC_ERR_SHAPE, _DTYPE, _DEVICE, else
// _TORCH), then each input's shape, dtype and device, then the full text (its traceback).
[[noreturn]] void forward_failed(const std::exception &e, const std::vector<c10::IValue> &args);

void set_last_error(std::string msg) noexcept;
std::string last_error_message();
const std::string &last_error_ref() noexcept;
// Throws Error(FTC_ERR_VERSION) when the loaded LibTorch is not the one we were built with:
// checked once per process (check_runtime), then one flag read inline on every call.
inline std::atomic<bool> runtime_checked{false};
void check_runtime();
inline void require_runtime() {
  if (!runtime_checked.load(std::memory_order_relaxed)) check_runtime();
}

// Whether TorchScript's graph executor optimizes (profiles, specializes, differentiates
// symbolically) the models we run. Off by default: every call then runs the same operators,
// so results do not depend on how many calls came before (bit-identical checkpoint resume).
std::atomic<bool> &jit_optimize();
// Applies jit_optimize() to the calling thread's graph executor (LibTorch's per-thread setting,
// which TorchScript run by anyone in this thread reads) before FTorch runs TorchScript, and leaves
// it so: setting it runs a debug-log check costing about as much as the rest of a small forward's
// overhead, so it is set only when it differs, and not set back after every call.
void apply_jit_optimize();

// The C boundary: run body, translate every exception into a status and a thread-local message.
}  // namespace ftc

#include "handles.hpp"

namespace ftc {

// Every temporary tensor the body read (see tensor_of) is released when it returns, whether it
// succeeded or failed: this is the one place where expressions passed as arguments are freed.
// The status of the exception being handled, its message made this thread's last error (guard's
// catch: LibTorch's errors without their C++ backtrace).
int report_exception() noexcept;

template <class Body>
int guard(Body &&body) noexcept {
  ThreadState *ts = nullptr;
  size_t mark = 0;
  try {
    ts = &thread_state();
    if (ts->held_rhs != nullptr) release_held(*ts);
    mark = ts->consumed.size();
    require_runtime();
    body();
    if (!ts->last_error.empty()) ts->last_error.clear();
    if (ts->consumed.size() != mark) release_consumed(*ts, mark);
    return FTC_OK;
  } catch (...) {
    if (ts != nullptr) release_consumed(*ts, mark);
    return report_exception();
  }
}



// *dst = a second handle to the object of src (an unconstructed src makes dst unconstructed too).
template <class Table, class Handle>
int share(Handle src, Handle *dst, const char *kind) {
  return guard([&] {
    auto *s = Table::instance().find(src);
    if (s == nullptr && src != nullptr) bad_handle(src, kind, (std::string("source ") + kind).c_str());
    if (dst == nullptr) fail(FTC_ERR_INVALID_ARGUMENT, "output handle pointer is null");
    if (s == nullptr) {
      delete_handle<Table>(dst);
    } else if (*dst != src) {
      replace_handle<Table>(dst, s->value);
    }
  });
}

// *p for an output argument, or an error naming it when the caller passed a null pointer.
template <class T>
T &out_arg(T *p, const char *what) {
  if (p == nullptr) fail(FTC_ERR_INVALID_ARGUMENT, std::string("output argument '") + what + "' is a null pointer");
  return *p;
}

// `=` into a constructed tensor (math.cpp): the values land in its memory, and it takes the
// history of r when autograd records. If anything else still refers to that memory (a graph that
// saved it, a detached copy), the two are parted first, so nothing saved changes (see
// part_from_others); parameters (Lifetime is_parameter: model and optimizer parameters), views, leaves with
// autograd state and memory a Fortran pointer points into (expose_memory) are written in place.
// Values that the conversion to the tensor's dtype would change are an error (check_lossless);
// memory of r that overlaps the tensor's is read before any of it is written.
void assign_into(TensorTable::Slot &slot, const at::Tensor &r);

// Converting `values` to dtype `to` must not change them: floating or complex values into an
// integer or bool dtype, complex into real, and integers outside the range of a narrower integer
// dtype are Error(FTC_ERR_DTYPE) naming `into` (what receives them) and the explicit conversion
// (torch_tensor_to). float64 into float32 rounds, as Fortran's real() does. (tensor.cpp)
void check_lossless(const at::Tensor &values, c10::ScalarType to, const char *into);
// A TorchScript module written to `file`: in eval() mode when as_inference, as a model for
// inference (a Python user's torch.jit.load then runs dropout and batch norm as at inference),
// each submodule's mode restored after, parents first (train() sets a module's children too); a
// write failure is FTC_ERR_IO. (model.cpp)
void save_module(torch::jit::Module &module, const std::string &file, bool as_inference);
// The same for a scalar filled into a tensor of dtype `to`.
void check_lossless(const c10::Scalar &value, c10::ScalarType to, const char *into);

// dst's values = src's (same shape), as dst.copy_(src) but without autograd history: between
// pageable host memory (a Fortran array) and a CUDA device through page-locked staging buffers in
// chunks, the host-side copy of one chunk overlapping the DMA of another, so that FTorch's GPU
// idiom (host arrays copied to the GPU and back at every forward) moves data at the bus's speed
// (transfer.cpp; FTORCH_STAGING_CHUNK_MIB, 0 turns it off). A small CPU copy between tensors of
// one dtype with the elements in the same places is one memmove and a version bump; anything else
// is LibTorch's copy_.
void copy_values(at::Tensor &dst, const at::Tensor &src);
// Whether writing l element by element could change elements of r not yet read: their memory
// overlaps, other than as the same elements in the same places.
bool memory_overlaps(const at::Tensor &l, const at::Tensor &r);

// A Fortran pointer now points into t's memory (a no-copy view, a captured CUDA graph's input):
// from here on `=` into any tensor over that memory writes in place, so the pointer keeps seeing
// the tensor it came from and never outlives the memory (handles.cpp).
void expose_memory(TensorTable::Slot &slot);
// Whether a pointer into t's memory was handed out (through any tensor over the same storage).
bool memory_exposed(const at::Tensor &t);

// `=` into t: an error when t was saved for backward by a custom function whose forward runs on
// this thread (backward would keep the old values) (function.cpp).
void check_not_saved_for_backward(const at::Tensor &t);

// Result `index` (0-based) of a model or a Python function (`source` says which, for the shape
// error) written into an output tensor as `=` does: into its memory (an aliased Fortran array
// receives it), carrying the graph when one was recorded. The shapes must match.
void store_result(ftc_tensor out, int index, const at::Tensor &result, const char *source);
// The results written into outputs[0..n) as store_result does, every one checked (shape, a lossless
// dtype) before any is written: a failure leaves every output as it was.
void store_results(const ftc_tensor *outputs, const std::vector<at::Tensor> &results, const char *source);

// A training step's arguments, resolved and checked (train.cpp); its parts are shared by the
// eager step and its CUDA-graph form (graph_step.cpp).
struct TrainingPackage;  // train_package.cpp

// A model loaded from a file (TorchScript, training package or AOTInductor package): ftc_model_load.
std::shared_ptr<Model> load_model(const char *filename, int device_type, int device_index, int requires_grad,
                                  int is_training);
// forward(args...) of a model held by this process (graph recorded when requires_grad).
c10::IValue forward_here(Model &model, std::vector<c10::IValue> args, int requires_grad);
// Node-shared models (node_shared.cpp): forward, collective over the model's communicator (this
// rank's rows of the results); fails on a rank that does not hold the model (model_of).
// `resolve` gives this rank's arguments within the collective (a rank whose arguments are bad
// still takes part, with its error).
c10::IValue shared_forward(Model &model, const std::function<std::vector<c10::IValue>()> &resolve,
                           int requires_grad);
// The model of handle m if it is node-shared (else null: the caller's usual path reports a bad handle).
Model *shared_model(ftc_model m);
void require_model_here(const Model &model);

struct TrainStep {
  std::vector<at::Tensor> inputs;
  torch::jit::Module *module = nullptr;
  TrainingPackage *package = nullptr;  // the model's training package, if it is one
  Optim *opt = nullptr;
  Scheduler *sched = nullptr;
  at::Tensor target;
  int loss_kind = 0, reduction = 0;
  double max_grad_norm = 0;
};
TrainStep train_step_of(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs,
                        ftc_tensor target, int loss_kind, int reduction, double max_grad_norm);
// The same for a model and tensors already resolved.
TrainStep train_step_for(Model &model, ftc_optim o, ftc_scheduler s, std::vector<at::Tensor> inputs,
                         at::Tensor target, int loss_kind, int reduction, double max_grad_norm);
// The step's update: a training package's compiled step where it applies, else eager_train_step;
// the (global) loss value.
double run_train_step(TrainStep &step);
// ftc_train_step of a node-shared model (collective): the leader steps on every rank's batch;
// the loss value on every rank.
// (resolve: this rank's inputs, then its target)
double shared_train_step(Model &model, ftc_optim o, ftc_scheduler s,
                         const std::function<std::vector<at::Tensor>()> &resolve, int loss_kind, int reduction,
                         double max_grad_norm);
// Forward (autograd on), the loss against the target, backward; the loss value (detached).
at::Tensor step_loss(TrainStep &step);
// zero_grad, step_loss (averaged across ranks for a data-parallel optimizer), clipping, the
// optimizer's update; the (global) loss value.
double eager_train_step(TrainStep &step);
// After either form of the step: the step count, the scheduler (fed the loss), the outputs.
void finish_train_step(TrainStep &step, double value, std::chrono::steady_clock::time_point start, double *loss,
                       double *seconds);

// A LibTorch loss computed by kind (ftorch_c_loss.h), shared by ftc_loss and the train step.
at::Tensor compute_loss(int kind, const at::Tensor &input, const at::Tensor &target, const at::Tensor &weight,
                        const at::Tensor &pos_weight, const ftc_loss_options &options);

// FTorch dtype enumerator -> c10 scalar type (int8/16/32/64, float32/64 only), and a tensor's
// c10 type -> its FTorch code (Error(FTC_ERR_DTYPE) for a type without one): one mapping
// (runtime.cpp), checked against the enumerators at compile time.
c10::ScalarType scalar_type(int dtype);
int dtype_code(c10::ScalarType type);
// FTorch device enumerator + index -> a device that is available, or Error(FTC_ERR_DEVICE).
c10::Device device(int device_type, int device_index);
// c10 device type -> FTorch enumerator.
int device_type_code(c10::DeviceType type);

std::string shape_string(c10::IntArrayRef sizes);
// PyTorch's name of a dtype (float64, int8, ...), for messages (tensor.cpp).
std::string dtype_name(c10::ScalarType t);

// ---- user callbacks (custom functions, hooks, gradcheck functions, checkpointed segments;
// callbacks.cpp)

// A callback's status: Error(FTC_ERR_CALLBACK) naming `what`, with the message it set, if not OK.
void check_callback(int status, const std::string &what);
// The same with `what` made by make_what() only on failure (callbacks run on every step).
[[noreturn]] void callback_failed(int status, const std::string &what);
template <class MakeWhat>
void check_callback_lazy(int status, MakeWhat &&make_what) {
  if (status != FTC_OK) callback_failed(status, make_what());
}

// Handles given to a callback for the duration of the call, or slots for the handles it returns
// (whatever is still there is freed when this goes away; take_callback_result empties a slot).
struct CallbackHandles {
  std::vector<ftc_tensor> handles;
  CallbackHandles() = default;
  CallbackHandles(const CallbackHandles &) = delete;
  CallbackHandles &operator=(const CallbackHandles &) = delete;
  ~CallbackHandles();
  ftc_tensor add(const at::Tensor &t);
};

// The tensor of a handle a callback produced (undefined for null), the handle freed and nulled;
// an invalid handle is an error naming make_what() (made only then).
template <class MakeWhat>
at::Tensor take_callback_result_lazy(ftc_tensor &h, MakeWhat &&make_what) {
  if (h == nullptr) return at::Tensor();
  auto *s = TensorTable::instance().find(h);
  if (s == nullptr) bad_handle(h, "tensor", make_what().c_str());
  at::Tensor t = s->value;
  TensorTable::instance().release(h);
  h = nullptr;
  return t;
}
inline at::Tensor take_callback_result(ftc_tensor &h, const char *what) {
  return take_callback_result_lazy(h, [what] { return std::string(what); });
}

// Run fn (a gradcheck function or a checkpointed segment) on inputs: its n_outputs results, each
// constructed, or an error naming `what`.
std::vector<at::Tensor> run_segment(ftc_segment_fn fn, void *data, const std::vector<at::Tensor> &inputs,
                                    int n_outputs, const std::string &what);

// A result into *out as `=` does when *out is constructed (same shape: its memory receives the
// values, the graph is carried), else as a new handle.
void store_result(ftc_tensor *out, const at::Tensor &value, const std::string &what);

}  // namespace ftc
