// checkpoint.cpp - checkpoints of a model, its optimizer and scheduler: one file written
// atomically (next to the target, then renamed over it), read back and checked against the objects
// before anything changes, applied all or nothing; and, over a communicator, the same for every rank
// of a data-parallel run (rank 0 writes; every rank stages, they agree, then all apply or none).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <sstream>
#include <thread>

#include "comm.hpp"
#include "ftorch_c_checkpoint.h"
#include "rng_state.hpp"

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

// Every object given (not null) must be live, before any file is touched; a scheduler comes with
// its own optimizer (a checkpoint pairs them: the schedule's rate is the optimizer's).
void require_objects(ftc_model m, ftc_optim o, ftc_scheduler s) {
  if (m != nullptr) ftc::model_of(m);
  if (o != nullptr) ftc::optim_of(o);
  if (s != nullptr) ftc::scheduler_of(s);
  if (s != nullptr && o == nullptr) {
    // (Its state without the optimizer's learning rate would resume a chained schedule, a cosine's
    // say, from whatever rate the optimizer has now.)
    ftc::fail(FTC_ERR_INVALID_ARGUMENT,
              "a scheduler is saved and restored with the optimizer whose learning rate it sets: pass that "
              "optimizer too");
  }
  if (s != nullptr && o != nullptr && ftc::scheduler_of(s).optim.get() != &ftc::optim_of(o)) {
    ftc::fail(FTC_ERR_INVALID_ARGUMENT,
              "the scheduler drives another optimizer than the one given: a checkpoint keeps an optimizer with "
              "its own scheduler");
  }
}

// A scheduler's settings (those of its kind), named as torch.optim.lr_scheduler names them: a
// checkpoint keeps them, and resumes only into a scheduler with the same ones (a schedule resumed
// with another T_max, milestones or mode would go on differently from the one saved).
std::vector<std::pair<std::string, double>> scheduler_settings(const ftc::Scheduler &s) {
  switch (s.kind) {
    case FTC_SCHED_STEP:
      return {{"step_size", static_cast<double>(s.step_lr.step_size)}, {"gamma", s.step_lr.gamma}};
    case FTC_SCHED_MULTISTEP: {
      std::vector<std::pair<std::string, double>> v{{"gamma", s.multistep.gamma}};
      for (size_t i = 0; i < s.milestones.size(); ++i) {
        v.emplace_back("milestones[" + std::to_string(i) + "]", static_cast<double>(s.milestones[i]));
      }
      return v;
    }
    case FTC_SCHED_EXPONENTIAL:
      return {{"gamma", s.exponential_gamma}};
    case FTC_SCHED_COSINE:
      return {{"T_max", static_cast<double>(s.cosine.t_max)}, {"eta_min", s.cosine.eta_min}};
    case FTC_SCHED_LINEAR:
      return {{"start_factor", s.linear.start_factor},
              {"end_factor", s.linear.end_factor},
              {"total_iters", static_cast<double>(s.linear.total_iters)}};
    case FTC_SCHED_PLATEAU:
      return {{"mode", static_cast<double>(s.plateau.mode)},
              {"factor", s.plateau.factor},
              {"patience", static_cast<double>(s.plateau.patience)},
              {"threshold", s.plateau.threshold},
              {"threshold_mode", static_cast<double>(s.plateau.threshold_mode)},
              {"cooldown", static_cast<double>(s.plateau.cooldown)},
              {"min_lr", s.plateau.min_lr},
              {"eps", s.plateau.eps}};
    default:
      return {};
  }
}

std::string setting_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

namespace ftc {

// A temporary file name next to `file`, unique per host, process and thread.
std::string temporary_name(const std::string &file) {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::ostringstream os;
  os << file << ".tmp." << host << "." << ::getpid() << "." << std::hash<std::thread::id>{}(std::this_thread::get_id());
  return os.str();
}

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
  std::optional<RngStates> rng;  // none in checkpoints of other layouts or before they kept it
};

// What applying a checkpoint replaced, to put back.
struct CheckpointUndo {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, previous value)
  std::string optim_state;  // serialized; empty when no optimizer
  int64_t optim_steps = 0;
  std::vector<double> sched_state;
  std::optional<RngStates> rng;
};

// stage_checkpoint for one of `ranks` processes checkpointing together (0 of 1: a process alone).
static std::shared_ptr<StagedCheckpoint> stage_checkpoint_of_rank(const char *filename, ftc_model m, ftc_optim o,
                                                                  ftc_scheduler s, int rank, int ranks) {
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
      // The buffers by name, both ways (checkpoints before their names were kept: those of this
      // model must be there).
      if (archive.try_read("model.buffers", value)) {
        std::vector<std::string> saved_buffers, my_buffers;
        for (const auto &n : value.toListRef()) saved_buffers.push_back(n.toStringRef());
        for (const auto &b : module.named_buffers()) my_buffers.push_back(b.name);
        std::sort(saved_buffers.begin(), saved_buffers.end());
        std::sort(my_buffers.begin(), my_buffers.end());
        std::vector<std::string> extra;
        std::set_difference(saved_buffers.begin(), saved_buffers.end(), my_buffers.begin(), my_buffers.end(),
                            std::back_inserter(extra));
        if (!extra.empty()) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint is of a different model: it has buffer " + extra.front() +
                                                  ", which this model has not");
        }
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
      // Its settings (checkpoints before they were kept: not checked).
      if (archive.try_read("scheduler.settings", value)) {
        const auto mine = scheduler_settings(ftc::scheduler_of(s));
        std::vector<double> saved;
        for (const auto &v : value.toListRef()) saved.push_back(v.toDouble());
        if (saved.size() != mine.size()) {
          ftc::fail(FTC_ERR_INVALID_ARGUMENT, "the checkpoint's scheduler has " + std::to_string(saved.size()) +
                                                  " settings, the one given to resume into " +
                                                  std::to_string(mine.size()) +
                                                  " (other milestones): construct it with the checkpoint's settings");
        }
        for (size_t i = 0; i < mine.size(); ++i) {
          if (saved[i] != mine[i].second) {
            ftc::fail(FTC_ERR_INVALID_ARGUMENT,
                      "the checkpoint's scheduler has " + mine[i].first + " = " + setting_text(saved[i]) +
                          ", the one given to resume into " + setting_text(mine[i].second) +
                          ": construct it with the checkpoint's settings, or it would go on with another schedule");
          }
        }
      }
    }
    archive.read("step", value);
    st.step = value.toInt();
    // The random generators: restored where the checkpoint was written by as many processes
    // (each rank's own state; a single process's is rank 0's of one).
    if (archive.try_read("rng.ranks", value)) {
      if (value.toInt() == ranks) {
        at::Tensor bytes;
        if (!archive.try_read("rng.rank." + std::to_string(rank), bytes)) {
          ftc::fail(FTC_ERR_IO, "'" + file + "': its random generator state is incomplete");
        }
        st.rng = rng_from_bytes(bytes, file);
      }
    } else if (ranks == 1) {
      st.rng = read_rng_states(archive, "rng.", file);
    }

  return staged;
}

std::shared_ptr<StagedCheckpoint> stage_checkpoint(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s) {
  return stage_checkpoint_of_rank(filename, m, o, s, 0, 1);
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
      load_optimizer_state(*opt.opt, restore);
      opt.steps = undo.optim_steps;
    }
    if (st.s != nullptr && !undo.sched_state.empty()) scheduler_of(st.s).set_state(undo.sched_state);
    if (undo.rng) set_rng_states(*undo.rng);
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
  if (st.rng) undo->rng = rng_states();
  try {
    if (st.o != nullptr) {
      auto &opt = optim_of(st.o);
      load_optimizer_state(*opt.opt, st.optim_state);
      opt.steps = st.optim_steps;
    }
    if (st.s != nullptr) scheduler_of(st.s).set_state(st.sched_state);  // size and kind checked when staged
    at::NoGradGuard no_grad;
    for (auto &c : st.copies) c.first.copy_(c.second);
    if (st.rng) set_rng_states(*st.rng);
  } catch (...) {
    undo_checkpoint(*undo, st);
    throw;
  }
  return undo;
}

}  // namespace ftc

namespace {

// Writes the checkpoint; rank_rng: each rank's random generator states (rng_bytes) when ranks
// checkpoint together, else null (this process's own).
void save_checkpoint(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t step,
                     const std::vector<at::Tensor> *rank_rng) {
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
  if (s != nullptr) {
    archive.write("scheduler.state", c10::IValue(ftc::scheduler_of(s).state()));
    std::vector<double> settings;
    for (const auto &[name, v] : scheduler_settings(ftc::scheduler_of(s))) settings.push_back(v);
    archive.write("scheduler.settings", c10::IValue(settings));
  }
  if (rank_rng == nullptr) {
    ftc::write_rng_states(archive, "rng.", ftc::rng_states());
  } else {
    archive.write("rng.ranks", c10::IValue(static_cast<int64_t>(rank_rng->size())));
    for (size_t r = 0; r < rank_rng->size(); ++r) archive.write("rng.rank." + std::to_string(r), (*rank_rng)[r]);
  }

  // Write next to the target and rename over it: a crash leaves the previous file intact.
  const std::string tmp = ftc::temporary_name(file);
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
}

}  // namespace

extern "C" {

int ftc_checkpoint_save(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t step) {
  return ftc::guard([&] { save_checkpoint(filename, m, o, s, step, nullptr); });
}

int ftc_checkpoint_load(const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s, int64_t *step) {
  return ftc::guard([&] {
    // Read and check everything first; change the objects only once all of it fits.
    auto staged = ftc::stage_checkpoint(filename, m, o, s);
    ftc::apply_checkpoint(*staged);
    if (step != nullptr) *step = staged->step;
  });
}

int ftc_comm_checkpoint_save(ftc_comm c, const char *filename, ftc_model m, ftc_optim o, ftc_scheduler s,
                             int64_t step) {
  return ftc::guard([&] {
    auto &comm = *ftc::comm_of(c);
    // Every rank's random generator states to rank 0. Read in an error boundary of its own, so
    // that a rank failing there still joins the exchange of lengths, which tells every rank.
    std::string mine;
    const int read = ftc::guard([&] { mine = ftc::rng_bytes(ftc::rng_states()); });
    if (read != FTC_OK) mine.clear();
    const std::string read_message = read != FTC_OK ? ftc::last_error_message() : std::string();
    const auto lengths = comm.gather_values({read, static_cast<int64_t>(mine.size())});
    const std::string unread = ftc::ranks_where(comm, [&](int r) { return lengths[2 * r] != FTC_OK; });
    if (read != FTC_OK) ftc::fail(read, read_message + "; nothing was written");
    if (!unread.empty()) {
      ftc::fail(FTC_ERR_DISTRIBUTED, "rank(s) " + unread + " could not read their random generators (see their "
                                                              "errors); nothing was written");
    }
    // Padded to the longest (the same on every rank of one LibTorch), to rank 0 alone where the
    // communicator has gatherv, else to every rank.
    int64_t longest = 0;
    for (int r = 0; r < comm.size; ++r) longest = std::max(longest, lengths[2 * static_cast<size_t>(r) + 1]);
    const int64_t words = (longest + 7) / 8;
    std::vector<int64_t> padded(static_cast<size_t>(words), 0), all(static_cast<size_t>(words * comm.size));
    std::memcpy(padded.data(), mine.data(), mine.size());
    if (comm.rooted()) {
      comm.gatherv(padded.data(), words, all.data(), std::vector<int64_t>(static_cast<size_t>(comm.size), words),
                   FTC_INT64, 0);
    } else {
      comm.allgather(padded.data(), all.data(), words, FTC_INT64, sizeof(int64_t));
    }
    int64_t status = FTC_OK;
    std::string message;
    if (comm.rank == 0) {
      std::vector<at::Tensor> rank_rng;
      for (int r = 0; r < comm.size; ++r) {
        const auto *bytes = reinterpret_cast<const char *>(all.data() + static_cast<size_t>(r) * words);
        const auto length = static_cast<size_t>(lengths[2 * static_cast<size_t>(r) + 1]);
        rank_rng.push_back(ftc::bytes_tensor(std::string(bytes, length)));
      }
      status = ftc::guard([&] { save_checkpoint(filename, m, o, s, step, &rank_rng); });
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
    const int status = ftc::guard([&] { staged = ftc::stage_checkpoint_of_rank(filename, m, o, s, comm.rank, comm.size); });
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
