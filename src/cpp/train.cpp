// train.cpp - C API for the one-call training step and for checkpoints.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <thread>

#include "internal.hpp"
#include "train_package.hpp"

namespace {


std::string shapes_of(const std::vector<at::Tensor> &tensors) {
  std::string s;
  for (const auto &t : tensors) s += ftc::shape_string(t.sizes()) + ";";
  return s;
}

void fsync_path(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string directory_of(const std::string &file) {
  const auto slash = file.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : file.substr(0, slash));
}

// Every object given (not null) must be live, before any file is touched.
void require_objects(ftc_model m, ftc_optim o, ftc_scheduler s) {
  if (m != nullptr) ftc::model_of(m);
  if (o != nullptr) ftc::optim_of(o);
  if (s != nullptr) ftc::scheduler_of(s);
}

// A temporary file name next to `file`, unique per host, process and thread.
std::string temporary_name(const std::string &file) {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::ostringstream os;
  os << file << ".tmp." << host << "." << ::getpid() << "." << std::hash<std::thread::id>{}(std::this_thread::get_id());
  return os.str();
}

}  // namespace

namespace ftc {

// A checkpoint read and checked against the objects it is for, nothing changed yet.
struct StagedCheckpoint {
  ftc_model m = nullptr;
  ftc_optim o = nullptr;
  ftc_scheduler s = nullptr;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, value): parameters, buffers
  torch::serialize::InputArchive optim_state;
  int64_t optim_steps = 0;
  std::vector<double> sched_state;
  int64_t step = 0;
};

// What applying a checkpoint replaced, to put back.
struct CheckpointUndo {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, previous value)
  std::string optim_state;  // serialized; empty when no optimizer
  int64_t optim_steps = 0;
  std::vector<double> sched_state;
};

std::shared_ptr<StagedCheckpoint> stage_checkpoint(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s) {
  auto staged = std::make_shared<StagedCheckpoint>();
  StagedCheckpoint &st = *staged;
  st.m = m;
  st.o = o;
  st.s = s;
    require_objects(m, o, s);
    if (filename == nullptr || filename[0] == '\0') ftc::fail(FTC_ERR_INVALID_ARGUMENT, "file name is empty");
    const std::string file(filename);
    // Tensors are mapped to the model's device (a checkpoint written on a GPU loads on a CPU).
    std::optional<c10::Device> device;
    if (m != nullptr) {
      for (const auto &p : ftc::model_of(m).parameters()) {
        device = p.device();
        break;
      }
    } else if (o != nullptr && !ftc::optim_of(o).params.empty()) {
      device = ftc::optim_of(o).params.front().device();
    }
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(file, device);
    } catch (const c10::Error &e) {
      ftc::fail(FTC_ERR_IO, "cannot read checkpoint '" + file + "' (missing, truncated or not a checkpoint): " +
                                e.what_without_backtrace());
    }
    c10::IValue value;
    if (!archive.try_read("format", value) || !value.isString() || value.toStringRef() != ftc::kCheckpointFormat) {
      ftc::fail(FTC_ERR_IO, "'" + file + "' is not an FTorch checkpoint");
    }

    // Read and check everything first; change the objects only once all of it fits.
        if (m != nullptr) {
      auto &module = ftc::model_of(m);
      if (!archive.try_read("model.parameters", value)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint holds no model");
      std::vector<std::string> names;
      for (const auto &n : value.toListRef()) names.push_back(n.toStringRef());
      std::vector<std::string> mine;
      for (const auto &p : module.named_parameters()) mine.push_back(p.name);
      if (names != mine) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint is of a different model: it has " +
                                                std::to_string(names.size()) + " parameters (" +
                                                (names.empty() ? std::string() : names.front()) + ", ...), this model " +
                                                std::to_string(mine.size()) + " (" +
                                                (mine.empty() ? std::string() : mine.front()) + ", ...)");
      }
      for (const auto &p : module.named_parameters()) {
        at::Tensor t;
        archive.read("model.parameter." + p.name, t);
        if (t.sizes() != p.value.sizes()) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint is of a different model: parameter " + p.name +
                                                  " has shape " + ftc::shape_string(t.sizes()) + " there and " +
                                                  ftc::shape_string(p.value.sizes()) + " here");
        }
        st.copies.emplace_back(p.value, t);
      }
      for (const auto &b : module.named_buffers()) {
        at::Tensor t;
        if (!archive.try_read("model.buffer." + b.name, t, /*is_buffer=*/true)) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint is of a different model: it has no buffer " + b.name);
        }
        if (t.sizes() != b.value.sizes()) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint is of a different model: buffer " + b.name + " has shape " +
                                                  ftc::shape_string(t.sizes()) + " there and " +
                                                  ftc::shape_string(b.value.sizes()) + " here");
        }
        st.copies.emplace_back(b.value, t);
      }
    }
    if (o != nullptr) {
      auto &opt = ftc::optim_of(o);
      if (!archive.try_read("optimizer.kind", value)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint holds no optimizer");
      if (value.toInt() != opt.kind) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                  "the checkpoint's optimizer is " +
                      ftc::enum_name(ftc::ftc_optim_kind_table, static_cast<int>(value.toInt()), "FTC_OPTIM_") +
                      ", the one given to resume into is " +
                      ftc::enum_name(ftc::ftc_optim_kind_table, opt.kind, "FTC_OPTIM_") +
                      ": construct an optimizer of the checkpoint's kind (with its options) to resume");
      }
      archive.read("optimizer.shapes", value);
      if (value.toStringRef() != shapes_of(opt.params)) {
        ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint's optimizer has parameters of other shapes");
      }
      archive.read("optimizer.steps", value);
      st.optim_steps = value.toInt();
      archive.read("optimizer.state", st.optim_state);
    }
    if (s != nullptr) {
      if (!archive.try_read("scheduler.state", value)) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint holds no scheduler");
      for (const auto &v : value.toListRef()) st.sched_state.push_back(v.toDouble());
      const auto expected = ftc::scheduler_of(s).state().size();
      if (st.sched_state.size() != expected || static_cast<int>(st.sched_state[0]) != ftc::scheduler_of(s).kind) {
        const int saved = st.sched_state.empty() ? -1 : static_cast<int>(st.sched_state[0]);
        ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                  "the checkpoint's scheduler is " + ftc::enum_name(ftc::ftc_scheduler_kind_table, saved, "FTC_SCHED_") +
                      ", the one given to resume into is " +
                      ftc::enum_name(ftc::ftc_scheduler_kind_table, ftc::scheduler_of(s).kind, "FTC_SCHED_") +
                      ": construct a scheduler of the checkpoint's kind to resume");
      }
    }
    archive.read("step", value);
    st.step = value.toInt();

  return staged;
}

int64_t staged_step(const StagedCheckpoint &st) { return st.step; }

int64_t staged_digest(const StagedCheckpoint &st) {
  std::string bytes;
  for (const auto &c : st.copies) {
    const at::Tensor v = c.second.detach().to(c10::kCPU).contiguous();
    bytes.append(static_cast<const char *>(v.data_ptr()), static_cast<size_t>(v.numel()) * v.element_size());
  }
  return static_cast<int64_t>(std::hash<std::string>{}(bytes));
}

void undo_checkpoint(CheckpointUndo &undo, const StagedCheckpoint &st) noexcept {
  try {
    at::NoGradGuard no_grad;
    for (auto &c : undo.copies) c.first.copy_(c.second);
    if (st.o != nullptr && !undo.optim_state.empty()) {
      auto &opt = optim_of(st.o);
      std::stringstream previous(undo.optim_state);
      torch::serialize::InputArchive restore;
      restore.load_from(previous);
      opt.opt->load(restore);
      opt.steps = undo.optim_steps;
    }
    if (st.s != nullptr && !undo.sched_state.empty()) scheduler_of(st.s).set_state(undo.sched_state);
  } catch (...) {
  }
}

std::shared_ptr<CheckpointUndo> apply_checkpoint(StagedCheckpoint &st) {
  auto undo = std::make_shared<CheckpointUndo>();
  // Everything the checkpoint replaces is kept first, so that a failure part way (LibTorch
  // validates the optimizer state only while loading it) puts every object back as it was.
  {
    at::NoGradGuard no_grad;
    for (const auto &c : st.copies) undo->copies.emplace_back(c.first, c.first.clone());
  }
  if (st.o != nullptr) {
    auto &opt = optim_of(st.o);
    std::stringstream previous;
    torch::serialize::OutputArchive snapshot;
    opt.opt->save(snapshot);
    snapshot.save_to(previous);
    undo->optim_state = previous.str();
    undo->optim_steps = opt.steps;
  }
  if (st.s != nullptr) undo->sched_state = scheduler_of(st.s).state();
  try {
    if (st.o != nullptr) {
      auto &opt = optim_of(st.o);
      opt.opt->load(st.optim_state);
      opt.steps = st.optim_steps;
    }
    if (st.s != nullptr) scheduler_of(st.s).set_state(st.sched_state);  // size and kind checked when staged
    at::NoGradGuard no_grad;
    for (auto &c : st.copies) c.first.copy_(c.second);
  } catch (...) {
    undo_checkpoint(*undo, st);
    throw;
  }
  return undo;
}

TrainStep train_step_of(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs,
                        ftc_tensor target, int loss_kind, int reduction, double max_grad_norm) {
  take_temporaries({target});
  auto values = tensors_of(inputs, n_inputs, "input tensor");
  if (any_model_of(m).shared) {
    fail(FTC_ERR_INVALID_ARGUMENT, "a node-shared model trains with torch_train_step without cuda_graph (the leader "
                                   "steps on every rank's batch); a CUDA-graph step needs a model of this process");
  }
  return train_step_for(any_model_of(m), o, s, std::move(values), tensor_of(target, "target tensor"), loss_kind,
                        reduction, max_grad_norm);
}

TrainStep train_step_for(Model &model, ftc_optim o, ftc_scheduler s, std::vector<at::Tensor> inputs,
                         at::Tensor target, int loss_kind, int reduction, double max_grad_norm) {
  TrainStep step;
  step.inputs = std::move(inputs);
  step.module = &module_of(model);
  step.package = model.package.get();
  step.opt = &optim_of(o);
  step.sched = s != nullptr ? &scheduler_of(s) : nullptr;
  step.target = std::move(target);
  if (reduction == 0) fail(FTC_ERR_INVALID_ARGUMENT, "a training step needs a reduced loss (mean or sum)");
  step.loss_kind = loss_kind;
  step.reduction = reduction;
  step.max_grad_norm = max_grad_norm;
  return step;
}

double run_train_step(TrainStep &step) {
  const auto compiled = compiled_train_step(step);
  return compiled ? *compiled : eager_train_step(step);
}

at::Tensor step_loss(TrainStep &step) {
  apply_jit_optimize();
  at::AutoGradMode grad(true);
  std::vector<c10::IValue> args(step.inputs.begin(), step.inputs.end());
  c10::IValue result;
  try {
    result = step.module->forward(args);
  } catch (const std::exception &e) {
    forward_failed(e, args);
  }
  at::Tensor output;
  if (result.isTensor()) {
    output = result.toTensor();
  } else if (result.isTuple() && !result.toTupleRef().elements().empty() &&
             result.toTupleRef().elements()[0].isTensor()) {
    output = result.toTupleRef().elements()[0].toTensor();  // the first output is the prediction
  } else {
    fail(FTC_ERR_INVALID_ARGUMENT, std::string("the model returned a ") + result.tagKind() +
                                       "; a training step needs a Tensor (or a tuple starting with one)");
  }
  ftc_loss_options options = FTC_LOSS_OPTIONS_DEFAULTS;
  options.reduction = step.reduction;
  at::Tensor l = compute_loss(step.loss_kind, output, step.target, {}, {}, options);
  l.backward();
  return l.detach();
}

double eager_train_step(TrainStep &step) {
  Optim &opt = *step.opt;
  // Data-parallel: gradients and the loss are averaged across ranks before clipping and the
  // update, and the (global) loss feeds the scheduler, so every rank takes the same step.
  const double value = reduced_step(opt, [&] {
    opt.opt->zero_grad();
    return step_loss(step).item<double>();
  });
  if (step.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(opt.params, step.max_grad_norm);
  opt.opt->step();
  after_update(opt);
  return value;
}

void finish_train_step(TrainStep &step, double value, std::chrono::steady_clock::time_point start, double *loss,
                       double *seconds) {
  ++step.opt->steps;
  if (step.sched != nullptr) step.sched->step(true, value);
  if (loss != nullptr) *loss = value;  // optional outputs: null means "not wanted"
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  step.opt->window_steps += 1;
  step.opt->window_seconds += elapsed;
  if (seconds != nullptr) *seconds = elapsed;
}

}  // namespace ftc

extern "C" {

int ftc_train_step(ftc_model m, ftc_optim o, ftc_scheduler s, const ftc_tensor *inputs, int n_inputs, ftc_tensor target,
                   int loss_kind, int reduction, double max_grad_norm, double *loss, double *seconds) {
  return ftc::guard([&] {
    ftc::note_step();
    const auto start = std::chrono::steady_clock::now();
    ftc::take_temporaries({target});
    ftc::take_temporaries(inputs, n_inputs);
    if (auto *model = ftc::shared_model(m)) {
      const double value = ftc::shared_train_step(*model, o, s, [&] {
        auto tensors = ftc::tensors_of(inputs, n_inputs, "input tensor");
        tensors.push_back(ftc::tensor_of(target, "target tensor"));
        return tensors;
      }, loss_kind, reduction, max_grad_norm);
      if (loss != nullptr) *loss = value;
      if (seconds != nullptr) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return;
    }
    ftc::TrainStep step = ftc::train_step_of(m, o, s, inputs, n_inputs, target, loss_kind, reduction, max_grad_norm);
    ftc::finish_train_step(step, ftc::run_train_step(step), start, loss, seconds);
  });
}

int ftc_checkpoint_save(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t step) {
  return ftc::guard([&] {
    require_objects(m, o, s);
    if (filename == nullptr || filename[0] == '\0') ftc::fail(FTC_ERR_INVALID_ARGUMENT, "file name is empty");
    const std::string file(filename);
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(std::string(ftc::kCheckpointFormat)));
    archive.write("step", c10::IValue(step));
    if (m != nullptr) {
      auto &module = ftc::model_of(m);
      std::vector<std::string> names;
      for (const auto &p : module.named_parameters()) {
        names.push_back(p.name);
        archive.write("model.parameter." + p.name, p.value);
      }
      std::vector<std::string> buffer_names;
      for (const auto &b : module.named_buffers()) {
        buffer_names.push_back(b.name);
        archive.write("model.buffer." + b.name, b.value, /*is_buffer=*/true);
      }
      archive.write("model.parameters", c10::IValue(names));
      archive.write("model.buffers", c10::IValue(buffer_names));
    }
    if (o != nullptr) {
      auto &opt = ftc::optim_of(o);
      archive.write("optimizer.kind", c10::IValue(static_cast<int64_t>(opt.kind)));
      archive.write("optimizer.shapes", c10::IValue(shapes_of(opt.params)));
      archive.write("optimizer.steps", c10::IValue(opt.steps));
      torch::serialize::OutputArchive state;
      opt.opt->save(state);
      archive.write("optimizer.state", state);
    }
    if (s != nullptr) archive.write("scheduler.state", c10::IValue(ftc::scheduler_of(s).state()));

    // Write next to the target and rename over it: a crash leaves the previous file intact.
    const std::string tmp = temporary_name(file);
    try {
      archive.save_to(tmp);
    } catch (const c10::Error &e) {
      std::remove(tmp.c_str());
      ftc::fail(FTC_ERR_IO, "cannot write checkpoint '" + file + "': " + e.what_without_backtrace());
    }
    fsync_path(tmp);
    if (std::rename(tmp.c_str(), file.c_str()) != 0) {
      std::remove(tmp.c_str());
      ftc::fail(FTC_ERR_IO, "cannot rename the checkpoint into place at '" + file + "'");
    }
    fsync_path(directory_of(file));
  });
}

int ftc_checkpoint_load(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t *step) {
  return ftc::guard([&] {
    // Read and check everything first; change the objects only once all of it fits.
    auto staged = ftc::stage_checkpoint(filename, m, o, s);
    ftc::apply_checkpoint(*staged);
    if (step != nullptr) *step = staged->step;
  });
}

}  // extern "C"
