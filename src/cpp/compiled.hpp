// compiled.hpp - AOTInductor packages (.pt2): recognised by content, loaded, run.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ftc {

class CompiledModel;

// What a package takes, as `python -m ftorch export` records it in the package's metadata
// (key "ftorch_inputs"): per input its dtype and, per dimension, a size or a named range (a name
// shared by several dimensions is one size). FTorch checks a call against these itself, in place
// of AOTInductor's generated input checks (which build a std::stringstream on every call).
struct DimRule {
  std::string name;  // empty: a static size (lo == hi)
  int64_t lo = 0;
  int64_t hi = -1;  // -1: no upper bound
};
struct InputRule {
  c10::ScalarType dtype;
  std::vector<DimRule> dims;
};

// The rules of a "v1;dtype[dim,dim,...];..." text (a dim being a size or "name:lo:hi", hi -1:
// unbounded), e.g. "v1;float32[batch:1:4096,5]"; nothing when it does not parse.
std::optional<std::vector<InputRule>> parse_rules(const std::string &text);

// The inputs against rules: count, dtype, rank, each size (a named size equal wherever it
// appears); an error naming the input otherwise.
void check_inputs(const std::vector<InputRule> &rules, const std::vector<at::Tensor> &inputs);

// Whether `file` is a .pt2 archive (a zip whose archive_format record says "pt2"), whatever its name.
bool is_pt2_archive(const std::string &file);

// The AOTInductor model `name` of a .pt2 package (empty: "model", else the only one), for
// `device` (which must be the device it was compiled for).
std::shared_ptr<CompiledModel> load_compiled(const std::string &file, const c10::Device &device,
                                             const std::string &name = "");

// The records of a zip archive written by PyTorch (the top directory dropped), or nothing when
// the file is not one.
std::vector<std::string> archive_records(const std::string &file, std::string *archive_format = nullptr);

// The input rules a package records (null when it records none).
const std::vector<InputRule> *input_rules(const CompiledModel &model);

// Bind `tensors` to the model's constants whose exported names are `names` (`names[k]` to
// `tensors[k]`; a name the compiled code does not read is passed over), user-managed: the compiled
// code reads their memory where it is, without a copy. The model keeps the addresses of the
// elements of `tensors` and the memory they point to: the vector must stay unchanged while the model
// lives, and a tensor whose memory moved must be bound again (this call again) before the next run.
void bind_constants(CompiledModel &model, const std::vector<std::string> &names, std::vector<at::Tensor> &tensors);

// Run it on tensors (in the row-major layout the compiled code expects: a copy only when the
// memory layout differs, as for Fortran arrays of several non-unit dimensions). The
// results are new tensors; no graph is recorded.
std::vector<at::Tensor> run_compiled(CompiledModel &model, std::vector<at::Tensor> inputs);

}  // namespace ftc
