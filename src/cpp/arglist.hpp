// arglist.hpp - the items of an argument list (ftorch_c_arglist.h), shared by model forward
// calls (arglist.cpp) and Python calls (python.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ftorch_c_arglist.h"
#include "internal.hpp"

namespace ftc {

struct ArgItem {
  int kind = FTC_ARG_INT;
  // A tensor item added from a named tensor refers to its handle while that lives (so that the
  // list sees what `t = ...` and writes to the wrapped array do later, as the Fortran program
  // does) and keeps its value as last read, which it uses once the tensor is deleted; items from
  // expressions and results of calls have only the value.
  ftc_tensor handle = nullptr;
  mutable at::Tensor value;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // strings; the logical value is `integer`
};

// The tensor of a tensor item, now.
const at::Tensor &item_tensor(const ArgItem &item);
// A tensor item for handle t: by reference for a named tensor, the value for an expression.
ArgItem tensor_item(ftc_tensor t, const char *what);

using ArgList = std::vector<ArgItem>;
using ArgListTable = HandleTable<std::shared_ptr<ArgList>>;

// The list of a handle; a null handle is an empty list when null_is_empty, an error otherwise.
const ArgList &arglist_of(ftc_arglist h, bool null_is_empty = true);
// The list behind *h, made new and empty when *h is null.
ArgList &arglist_for_append(ftc_arglist *h);
// *results gets `items` as its items: a new list when *results is null, else that list overwritten
// (every handle to it sees them). Used by every call that returns into a results list.
void set_results(ftc_arglist *results, ArgList items);
// The items as TorchScript values (tensor, int, float, bool, str).
std::vector<c10::IValue> ivalues_of(const ArgList &list);

}  // namespace ftc
