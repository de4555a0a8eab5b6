// rng_state.hpp - the states of the default random generators (the CPU's and each CUDA device's,
// as torch.get_rng_state and torch.cuda.get_rng_state_all give them), kept by checkpoints: a run
// resumed from one draws the random numbers (dropout masks, exploration noise) that the run which
// wrote it would have drawn next, so that the resumed run repeats it bit for bit.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "internal.hpp"

namespace ftc {

struct RngStates {
  at::Tensor cpu;
  std::vector<at::Tensor> cuda;  // per CUDA device, in device order
};

inline RngStates rng_states() {
  RngStates s;
  {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(g.mutex());
    s.cpu = g.get_state();
  }
  const auto n = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < n; ++i) {
    at::Generator g = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(g.mutex());
    s.cuda.push_back(g.get_state());
  }
  return s;
}

// Fails (FTC_ERR_IO, naming file) unless states can be restored here: states of this LibTorch's
// sizes. The CUDA devices both have are restored (a checkpoint of a CPU run loads on a GPU
// machine, a GPU run's on a CPU).
inline void check_rng_states(const RngStates &s, const std::string &file) {
  const auto here = rng_states();
  const auto bad = [&](const std::string &what) {
    fail(FTC_ERR_IO, "'" + file + "': its random generator state is damaged or of another LibTorch (" + what + ")");
  };
  if (!s.cpu.defined() || s.cpu.scalar_type() != at::kByte || s.cpu.numel() != here.cpu.numel()) bad("CPU");
  for (size_t i = 0; i < s.cuda.size() && i < here.cuda.size(); ++i) {
    if (s.cuda[i].scalar_type() != at::kByte || s.cuda[i].numel() != here.cuda[i].numel()) bad("CUDA");
  }
}

inline void set_rng_states(const RngStates &s) {
  {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(s.cpu);
  }
  const auto n = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(s.cuda.size()); ++i) {
    at::Generator g = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(s.cuda[static_cast<size_t>(i)]);
  }
}

// In an archive under prefix: prefix + "cpu", prefix + "cuda_count", prefix + "cuda.<i>".
inline void write_rng_states(torch::serialize::OutputArchive &archive, const std::string &prefix,
                             const RngStates &s) {
  archive.write(prefix + "cpu", s.cpu);
  archive.write(prefix + "cuda_count", c10::IValue(static_cast<int64_t>(s.cuda.size())));
  for (size_t i = 0; i < s.cuda.size(); ++i) archive.write(prefix + "cuda." + std::to_string(i), s.cuda[i]);
}

// The states under prefix (tensors back on the CPU, whatever device the archive was loaded to),
// none where the archive has none (written before checkpoints kept them).
inline std::optional<RngStates> read_rng_states(torch::serialize::InputArchive &archive, const std::string &prefix,
                                                const std::string &file) {
  RngStates s;
  if (!archive.try_read(prefix + "cpu", s.cpu)) return std::nullopt;
  s.cpu = s.cpu.cpu();
  c10::IValue count;
  if (!archive.try_read(prefix + "cuda_count", count) || !count.isInt()) {
    fail(FTC_ERR_IO, "'" + file + "': its random generator state is incomplete");
  }
  for (int64_t i = 0; i < count.toInt(); ++i) {
    at::Tensor t;
    if (!archive.try_read(prefix + "cuda." + std::to_string(i), t)) {
      fail(FTC_ERR_IO, "'" + file + "': its random generator state is incomplete");
    }
    s.cuda.push_back(t.cpu());
  }
  check_rng_states(s, file);
  return s;
}

// The states as bytes (to pass over a communicator) and back.
inline std::string rng_bytes(const RngStates &s) {
  torch::serialize::OutputArchive archive;
  write_rng_states(archive, "", s);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

inline at::Tensor bytes_tensor(const std::string &bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte));
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

inline RngStates rng_from_bytes(const at::Tensor &bytes, const std::string &file) {
  const at::Tensor b = bytes.cpu().contiguous();
  std::istringstream in(std::string(static_cast<const char *>(b.data_ptr()), static_cast<size_t>(b.numel())));
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(in);
  } catch (const c10::Error &) {
    fail(FTC_ERR_IO, "'" + file + "': its random generator state is damaged");
  }
  auto s = read_rng_states(archive, "", file);
  if (!s) fail(FTC_ERR_IO, "'" + file + "': its random generator state is damaged");
  return *s;
}

}  // namespace ftc
