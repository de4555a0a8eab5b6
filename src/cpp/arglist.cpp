// arglist.cpp - C API for argument lists: build them, read them, and run a model's forward on
// one (models whose forward takes numbers and logicals besides tensors).
#include <cstring>

#include "arglist.hpp"

namespace ftc {
namespace {

const char *kind_name(int kind) {
  switch (kind) {
    case FTC_ARG_TENSOR: return "a tensor";
    case FTC_ARG_INT: return "an integer";
    case FTC_ARG_REAL: return "a real";
    case FTC_ARG_LOGICAL: return "a logical";
    case FTC_ARG_STRING: return "a string";
    default: return "of unknown kind";
  }
}

const ArgItem &item_at(ftc_arglist h, int64_t index) {
  const ArgList &list = arglist_of(h, false);
  const auto n = static_cast<int64_t>(list.size());
  if (index < 0 || index >= n) {
    fail(FTC_ERR_INVALID_ARGUMENT, "item " + std::to_string(index + 1) + " out of range: the list has " +
                                       std::to_string(n) + " item" + (n == 1 ? "" : "s"));
  }
  return list[static_cast<size_t>(index)];
}

[[noreturn]] void wrong_kind(int64_t index, const ArgItem &item, const char *wanted) {
  fail(FTC_ERR_DTYPE, "item " + std::to_string(index + 1) + " is " + kind_name(item.kind) + ", not " + wanted);
}

// A tensor item of one element, as a number (what Python's float()/int()/bool() accept).
c10::Scalar single_value(int64_t index, const ArgItem &item, const char *wanted) {
  const at::Tensor &tensor = item_tensor(item);
  if (tensor.numel() != 1) {
    fail(FTC_ERR_DTYPE, "item " + std::to_string(index + 1) + " is a tensor of shape " +
                            shape_string(tensor.sizes()) + ", not " + wanted + " (only a tensor of one element converts)");
  }
  return tensor.item();
}

template <class Body>
int append(ftc_arglist *h, Body &&fill) {
  return guard([&] {
    ArgItem item;
    fill(item);
    arglist_for_append(h).push_back(std::move(item));
  });
}

}  // namespace

const at::Tensor &item_tensor(const ArgItem &item) {
  if (item.handle != nullptr) {
    if (auto *slot = TensorTable::instance().find(item.handle)) item.value = slot->value;
  }
  return item.value;
}

ArgItem tensor_item(ftc_tensor t, const char *what) {
  ArgItem item;
  item.kind = FTC_ARG_TENSOR;
  auto &slot = tensor_slot(t, what);
  item.value = slot.value;
  if (!slot.life.is_expression()) item.handle = t;
  return item;
}

const ArgList &arglist_of(ftc_arglist h, bool null_is_empty) {
  static const ArgList empty;
  if (h == nullptr && null_is_empty) return empty;
  auto *s = ArgListTable::instance().find(h);
  if (s == nullptr || !s->value) bad_handle(h, "argument list", "argument list");
  return *s->value;
}

ArgList &arglist_for_append(ftc_arglist *h) {
  out_arg(h, "list");
  if (*h == nullptr) replace_handle<ArgListTable>(h, std::make_shared<ArgList>());
  auto *s = ArgListTable::instance().find(*h);
  if (s == nullptr || !s->value) bad_handle(*h, "argument list", "argument list");
  return *s->value;
}

void set_results(ftc_arglist *results, ArgList items) {
  out_arg(results, "results");
  if (*results == nullptr) {
    replace_handle<ArgListTable>(results, std::make_shared<ArgList>(std::move(items)));
    return;
  }
  auto *s = ArgListTable::instance().find(*results);
  if (s == nullptr || !s->value) bad_handle(*results, "argument list", "results list");
  *s->value = std::move(items);
}

std::vector<c10::IValue> ivalues_of(const ArgList &list) {
  std::vector<c10::IValue> values;
  values.reserve(list.size());
  for (const auto &item : list) {
    switch (item.kind) {
      case FTC_ARG_TENSOR: values.emplace_back(item_tensor(item)); break;
      case FTC_ARG_INT: values.emplace_back(item.integer); break;
      case FTC_ARG_REAL: values.emplace_back(item.real); break;
      case FTC_ARG_LOGICAL: values.emplace_back(item.integer != 0); break;
      default: values.emplace_back(item.text); break;
    }
  }
  return values;
}

}  // namespace ftc

extern "C" {

int ftc_arglist_new(ftc_arglist *out) {
  return ftc::guard([&] { ftc::replace_handle<ftc::ArgListTable>(out, std::make_shared<ftc::ArgList>()); });
}

int ftc_arglist_delete(ftc_arglist *l) { return ftc::delete_handle<ftc::ArgListTable>(l); }

void ftc_arglist_release(ftc_arglist l) { ftc::ArgListTable::instance().release(l); }

int ftc_arglist_share(ftc_arglist src, ftc_arglist *dst) {
  return ftc::share<ftc::ArgListTable>(src, dst, "argument list");
}

int ftc_arglist_add_tensor(ftc_arglist *l, ftc_tensor t) {
  return ftc::append(l, [&](ftc::ArgItem &item) { item = ftc::tensor_item(t, "tensor to add"); });
}

int ftc_arglist_add_tensors(ftc_arglist *l, const ftc_tensor *tensors, int64_t n) {
  return ftc::guard([&] {
    ftc::tensors_of(tensors, n, "tensor");  // every handle checked before the list changes
    ftc::ArgList items;
    for (int64_t i = 0; i < n; ++i) items.push_back(ftc::tensor_item(tensors[i], "tensor"));
    auto &list = ftc::arglist_for_append(l);
    list.insert(list.end(), items.begin(), items.end());
  });
}

int ftc_arglist_extend(ftc_arglist *l, ftc_arglist other) {
  return ftc::guard([&] {
    const ftc::ArgList items = ftc::arglist_of(other, false);  // a copy: other may be *l itself
    auto &list = ftc::arglist_for_append(l);
    list.insert(list.end(), items.begin(), items.end());
  });
}

int ftc_arglist_add_int(ftc_arglist *l, int64_t value) {
  return ftc::append(l, [&](ftc::ArgItem &item) {
    item.kind = FTC_ARG_INT;
    item.integer = value;
  });
}

int ftc_arglist_add_real(ftc_arglist *l, double value) {
  return ftc::append(l, [&](ftc::ArgItem &item) {
    item.kind = FTC_ARG_REAL;
    item.real = value;
  });
}

int ftc_arglist_add_logical(ftc_arglist *l, int value) {
  return ftc::append(l, [&](ftc::ArgItem &item) {
    item.kind = FTC_ARG_LOGICAL;
    item.integer = value != 0 ? 1 : 0;
  });
}

int ftc_arglist_add_string(ftc_arglist *l, const char *value, int64_t length) {
  return ftc::append(l, [&](ftc::ArgItem &item) {
    if (length < 0) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "negative string length (" + std::to_string(length) + ")");
    if (length > 0 && value == nullptr) ftc::fail(FTC_ERR_INVALID_ARGUMENT, "string pointer is null");
    item.kind = FTC_ARG_STRING;
    item.text.assign(value == nullptr ? "" : value, static_cast<size_t>(length));
  });
}

int ftc_arglist_clear(ftc_arglist l) {
  return ftc::guard([&] {
    if (l == nullptr) return;
    const_cast<ftc::ArgList &>(ftc::arglist_of(l)).clear();
  });
}

int ftc_arglist_size(ftc_arglist l, int64_t *n) {
  return ftc::guard([&] { ftc::out_arg(n, "n") = static_cast<int64_t>(ftc::arglist_of(l).size()); });
}

int ftc_arglist_kind(ftc_arglist l, int64_t index, int *kind) {
  return ftc::guard([&] {
    auto &out = ftc::out_arg(kind, "kind");
    out = ftc::item_at(l, index).kind;
  });
}

int ftc_arglist_get_tensor(ftc_arglist l, int64_t index, ftc_tensor *out) {
  return ftc::guard([&] {
    ftc::out_arg(out, "out");
    const auto &item = ftc::item_at(l, index);
    if (item.kind != FTC_ARG_TENSOR) ftc::wrong_kind(index, item, "a tensor");
    ftc::install(out, ftc::item_tensor(item));
  });
}

int ftc_arglist_get_int(ftc_arglist l, int64_t index, int64_t *value) {
  return ftc::guard([&] {
    auto &out = ftc::out_arg(value, "value");
    const auto &item = ftc::item_at(l, index);
    if (item.kind == FTC_ARG_INT) {
      out = item.integer;
    } else if (item.kind == FTC_ARG_TENSOR && !ftc::item_tensor(item).is_floating_point()) {
      out = ftc::single_value(index, item, "an integer").toLong();
    } else {
      ftc::wrong_kind(index, item, "an integer");
    }
  });
}

int ftc_arglist_get_real(ftc_arglist l, int64_t index, double *value) {
  return ftc::guard([&] {
    auto &out = ftc::out_arg(value, "value");
    const auto &item = ftc::item_at(l, index);
    if (item.kind == FTC_ARG_REAL) {
      out = item.real;
    } else if (item.kind == FTC_ARG_INT) {
      out = static_cast<double>(item.integer);
    } else if (item.kind == FTC_ARG_TENSOR) {
      out = ftc::single_value(index, item, "a real").toDouble();
    } else {
      ftc::wrong_kind(index, item, "a real");
    }
  });
}

int ftc_arglist_get_logical(ftc_arglist l, int64_t index, int *value) {
  return ftc::guard([&] {
    auto &out = ftc::out_arg(value, "value");
    const auto &item = ftc::item_at(l, index);
    if (item.kind == FTC_ARG_LOGICAL || item.kind == FTC_ARG_INT) {
      out = item.integer != 0 ? 1 : 0;
    } else if (item.kind == FTC_ARG_TENSOR) {
      out = ftc::single_value(index, item, "a logical").toBool() ? 1 : 0;
    } else {
      ftc::wrong_kind(index, item, "a logical");
    }
  });
}

int ftc_arglist_get_string(ftc_arglist l, int64_t index, char *buf, int64_t buflen, int64_t *length) {
  return ftc::guard([&] {
    auto &n = ftc::out_arg(length, "length");
    const auto &item = ftc::item_at(l, index);
    if (item.kind != FTC_ARG_STRING) ftc::wrong_kind(index, item, "a string");
    n = static_cast<int64_t>(item.text.size());
    if (buf != nullptr && buflen > 0) {
      std::memcpy(buf, item.text.data(), static_cast<size_t>(std::min<int64_t>(buflen, n)));
    }
  });
}

}  // extern "C"
