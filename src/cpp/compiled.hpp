// compiled.hpp - AOTInductor packages (.pt2): recognised by content, loaded, run.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace ftc {

class CompiledModel;

// Whether `file` is a .pt2 archive (a zip whose archive_format record says "pt2"), whatever its name.
bool is_pt2_archive(const std::string &file);

// The AOTInductor model of a .pt2 package, for `device` (which must be the device it was compiled for).
std::shared_ptr<CompiledModel> load_compiled(const std::string &file, const c10::Device &device);

// Run it on tensors (in the row-major layout the compiled code expects: a copy only when the
// memory layout differs, as for Fortran arrays of several non-unit dimensions). The
// results are new tensors; no graph is recorded.
std::vector<at::Tensor> run_compiled(CompiledModel &model, std::vector<at::Tensor> inputs);

}  // namespace ftc
