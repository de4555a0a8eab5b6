// torchfort_yaml.hpp - TorchFort's configuration files as libyaml reads them: the document tree
// and a strict reader of its blocks (every key read by name, an unknown or repeated key, a value of
// the wrong kind or a missing required key an error naming the file, the line and what is allowed).
// Shared by the supervised (torchfort_config.cpp) and reinforcement-learning
// (torchfort_rl_config.cpp) configurations.
#pragma once

#include "torchfort_config.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tf {

// A node of the document, kept independent of libyaml's lifetime.
struct Node {
  enum Kind { kNull, kScalar, kSequence, kMapping } kind = kNull;
  std::string value;                               // scalar
  std::vector<Node> items;                         // sequence
  std::vector<std::pair<std::string, Node>> map;   // mapping, keys as written
  int line = 0;                                    // 1-based
};

// The document of a configuration file (text receives the file as read); throws ConfigError.
Node parse_file(const std::string &filename, std::string &text);

inline std::string join(const std::vector<std::string> &names) {
  std::string out;
  for (const auto &n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// A mapping of the configuration (a block or its parameters): keys are read by their sanitized
// names; done() fails on a key nobody read, naming the keys this block allows.
class Block {
 public:
  Block(const Node *node, std::string path, const std::string &file) : node_(node), path_(std::move(path)), file_(file) {
    if (node_ != nullptr && node_->kind != Node::kMapping && node_->kind != Node::kNull)
      fail(*node_, label() + " must be a block of 'key: value' lines");
    if (node_ != nullptr && node_->kind == Node::kMapping) {
      std::map<std::string, int> seen;
      for (const auto &[key, value] : node_->map) {
        auto [it, fresh] = seen.emplace(sanitize(key), value.line);
        if (!fresh) fail(value, label() + ": '" + key + "' is given twice (also on line " + std::to_string(it->second) + ")");
      }
    }
  }

  // The node of `key`, nullptr when absent. A value read from it (value: true) must be written: a
  // key without one (`learning_rate:`, `~`, `null`; a template variable that expanded to nothing)
  // is an error, never the default; a block written without content reads as absent.
  const Node *find(const std::string &key, bool value = false) {
    allowed_.push_back(key);
    if (node_ == nullptr || node_->kind != Node::kMapping) return nullptr;
    for (const auto &[k, v] : node_->map)
      if (sanitize(k) == sanitize(key)) {
        read_.insert(sanitize(k));
        if (v.kind == Node::kNull && value) fail(v, where(key) + " has no value (leave the key out for its default)");
        return v.kind == Node::kNull ? nullptr : &v;
      }
    return nullptr;
  }
  bool has(const std::string &key) {
    const Node *n = find(key);
    allowed_.pop_back();
    return n != nullptr;
  }
  Block block(const std::string &key) { return Block(find(key), path_.empty() ? key : path_ + "." + key, file_); }

  std::string string(const std::string &key, const std::string &fallback, bool required = false) {
    const Node *n = find(key, true);
    if (n == nullptr) {
      if (required) missing(key);
      return fallback;
    }
    if (n->kind != Node::kScalar) fail(*n, where(key) + " must be a single value");
    return n->value;
  }
  // A name among `choices` (compared sanitized, as TorchFort does).
  std::string choice(const std::string &key, const std::vector<std::string> &choices, const std::string &fallback,
                     bool required = false) {
    const Node *n = find(key, true);
    if (n == nullptr) {
      if (required) missing(key, " (one of: " + join(choices) + ")");
      return fallback;
    }
    if (n->kind != Node::kScalar) fail(*n, where(key) + " must be one of: " + join(choices));
    const std::string v = sanitize(n->value);
    if (std::find(choices.begin(), choices.end(), v) == choices.end())
      fail(*n, where(key) + " is '" + n->value + "', which is not one of: " + join(choices));
    return v;
  }
  // A number, at least `minimum` when one is given (NaN never passes such a bound).
  double real(const std::string &key, double fallback, std::optional<double> minimum = std::nullopt) {
    const Node *n = find(key, true);
    if (n == nullptr) return fallback;
    const double v = to_real(*n, key);
    if (minimum && !(v >= *minimum)) {
      char bound[32];
      std::snprintf(bound, sizeof bound, "%g", *minimum);
      fail(*n, where(key) + " must be >= " + bound + ", not " + n->value);
    }
    return v;
  }
  int64_t integer(const std::string &key, int64_t fallback, bool required = false, int64_t minimum = INT64_MIN,
                  int64_t maximum = INT64_MAX) {
    const Node *n = find(key, true);
    if (n == nullptr) {
      if (required) missing(key);
      return fallback;
    }
    int64_t v = to_integer(*n, key);
    if (v < minimum) fail(*n, where(key) + " must be >= " + std::to_string(minimum) + ", not " + n->value);
    if (v > maximum) fail(*n, where(key) + " must be <= " + std::to_string(maximum) + ", not " + n->value);
    return v;
  }
  bool boolean(const std::string &key, bool fallback) {
    const Node *n = find(key, true);
    if (n == nullptr) return fallback;
    const std::string v = n->kind == Node::kScalar ? sanitize(n->value) : "";
    if (v == "true") return true;
    if (v == "false") return false;
    char *end = nullptr;
    errno = 0;
    long long i = std::strtoll(v.c_str(), &end, 10);
    if (!v.empty() && *end == '\0' && errno == 0) return i != 0;
    fail(*n, where(key) + " must be true or false (or an integer, 0 for false), not '" + n->value + "'");
  }
  std::vector<int64_t> integers(const std::string &key, bool required) {
    const Node *n = find(key, true);
    if (n == nullptr) {
      if (required) missing(key, " (a list of integers, e.g. [16, 32, 4])");
      return {};
    }
    std::vector<int64_t> out;
    if (n->kind == Node::kScalar) {
      out.push_back(to_integer(*n, key));
    } else if (n->kind == Node::kSequence) {
      for (const Node &item : n->items) out.push_back(to_integer(item, key));
    } else {
      fail(*n, where(key) + " must be a list of integers, e.g. [16, 32, 4]");
    }
    return out;
  }

  // Every key of the block was read: else the first unknown one is an error.
  void done() {
    if (node_ == nullptr || node_->kind != Node::kMapping) return;
    for (const auto &[k, v] : node_->map)
      if (read_.count(sanitize(k)) == 0) {
        std::string allowed = allowed_.empty() ? "none" : join(allowed_);
        fail(v, "unknown key '" + k + "' in " + label() + " (allowed: " + allowed + ")");
      }
  }

  [[noreturn]] void fail(const Node &n, const std::string &what) const {
    throw ConfigError(file_ + ":" + std::to_string(n.line) + ": " + what);
  }
  [[noreturn]] void missing(const std::string &key, const std::string &hint = "") const {
    int line = node_ != nullptr ? node_->line : 1;
    throw ConfigError(file_ + ":" + std::to_string(line) + ": " + label() + " needs the key '" + key + "'" + hint);
  }
  // A mistake in how this block's values combine (no one key is wrong): its line and path.
  [[noreturn]] void fail_here(const std::string &what) const {
    int line = node_ != nullptr ? node_->line : 1;
    throw ConfigError(file_ + ":" + std::to_string(line) + ": " + label() + ": " + what);
  }
  std::string where(const std::string &key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string label() const { return path_.empty() ? "the configuration" : path_; }

 private:
  double to_real(const Node &n, const std::string &key) const {
    if (n.kind == Node::kScalar) {
      const std::string v = sanitize(n.value);
      char *end = nullptr;
      errno = 0;
      double d = std::strtod(v.c_str(), &end);
      if (!v.empty() && *end == '\0' && errno == 0 && std::isfinite(d)) return d;
    }
    fail(n, where(key) + " must be a number, not '" + n.value + "'");
  }
  int64_t to_integer(const Node &n, const std::string &key) const {
    if (n.kind == Node::kScalar) {
      const std::string v = sanitize(n.value);
      char *end = nullptr;
      errno = 0;
      long long i = std::strtoll(v.c_str(), &end, 10);
      if (!v.empty() && *end == '\0' && errno == 0) return i;
    }
    fail(n, where(key) + " must be an integer, not '" + n.value + "'");
  }

  const Node *node_;
  std::string path_;
  const std::string &file_;
  std::vector<std::string> allowed_;
  std::set<std::string> read_;
};

// A configuration file's document (its name and text into c; an empty file is an error), and its
// general block, read from the top block.
Node open_config(const std::string &filename, GeneralConfig &c);
void read_general(Block &top, GeneralConfig &c);

// The optimizer block (type, parameters, general) and a learning-rate schedule block.
void read_optimizer(Block &b, OptimizerConfig &o, int64_t &grad_accumulation_steps, double &max_grad_norm);
void read_scheduler(Block &b, SchedulerConfig &s, const std::string &file, const std::string &where);

}  // namespace tf
