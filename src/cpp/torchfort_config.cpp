// torchfort_config.cpp - TorchFort's YAML configuration: libyaml's document tree turned into a
// Config, every block and key checked against what config.rst allows.
#include "torchfort_config.hpp"

#ifdef FTORCH_HAVE_YAML
#include <yaml.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

namespace tf {

std::string sanitize(const std::string &s) {
  std::string out;
  for (unsigned char c : s)
    if (c != ' ') out += static_cast<char>(std::tolower(c));
  return out;
}

namespace {

// A node of the document, kept independent of libyaml's lifetime.
struct Node {
  enum Kind { kNull, kScalar, kSequence, kMapping } kind = kNull;
  std::string value;                               // scalar
  std::vector<Node> items;                         // sequence
  std::vector<std::pair<std::string, Node>> map;   // mapping, keys as written
  int line = 0;                                    // 1-based
};

#ifdef FTORCH_HAVE_YAML
Node convert(yaml_document_t &doc, yaml_node_t *n, const std::string &file, int depth) {
  Node out;
  if (n == nullptr) return out;
  if (depth > 64) throw ConfigError(file + ": nested too deeply");
  out.line = static_cast<int>(n->start_mark.line) + 1;
  switch (n->type) {
    case YAML_SCALAR_NODE: {
      out.value.assign(reinterpret_cast<const char *>(n->data.scalar.value), n->data.scalar.length);
      const bool plain = n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
      out.kind = (plain && (out.value.empty() || out.value == "~" || sanitize(out.value) == "null")) ? Node::kNull
                                                                                                    : Node::kScalar;
      break;
    }
    case YAML_SEQUENCE_NODE:
      out.kind = Node::kSequence;
      for (yaml_node_item_t *i = n->data.sequence.items.start; i < n->data.sequence.items.top; ++i)
        out.items.push_back(convert(doc, yaml_document_get_node(&doc, *i), file, depth + 1));
      break;
    case YAML_MAPPING_NODE:
      out.kind = Node::kMapping;
      for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; ++p) {
        Node key = convert(doc, yaml_document_get_node(&doc, p->key), file, depth + 1);
        if (key.kind != Node::kScalar)
          throw ConfigError(file + ":" + std::to_string(key.line) + ": a key must be a name");
        out.map.emplace_back(key.value, convert(doc, yaml_document_get_node(&doc, p->value), file, depth + 1));
      }
      break;
    default:
      break;
  }
  return out;
}

Node parse_file(const std::string &filename, std::string &text) {
  std::ifstream in(filename, std::ios::binary);
  if (!in) throw ConfigError(filename + ": cannot open the configuration file (" + std::strerror(errno) + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  text = ss.str();

  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) throw ConfigError(filename + ": out of memory reading it");
  std::unique_ptr<yaml_parser_t, void (*)(yaml_parser_t *)> parser_guard(&parser, yaml_parser_delete);
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char *>(text.data()), text.size());
  yaml_document_t doc;
  if (!yaml_parser_load(&parser, &doc)) {
    std::ostringstream os;
    os << filename << ":" << parser.problem_mark.line + 1 << ": not valid YAML: "
       << (parser.problem ? parser.problem : "unknown problem");
    if (parser.context) os << " " << parser.context;
    throw ConfigError(os.str());
  }
  std::unique_ptr<yaml_document_t, void (*)(yaml_document_t *)> doc_guard(&doc, yaml_document_delete);
  return convert(doc, yaml_document_get_root_node(&doc), filename, 0);
}
#else
Node parse_file(const std::string &filename, std::string &) {
  throw ConfigError(filename + ": this FTorch was built without libyaml, so it cannot read TorchFort configuration "
                    "files (install libyaml's headers, e.g. apt-get install libyaml-dev, and reinstall FTorch)");
}
#endif

std::string join(const std::vector<std::string> &names) {
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

  const Node *find(const std::string &key) {
    allowed_.push_back(key);
    if (node_ == nullptr || node_->kind != Node::kMapping) return nullptr;
    for (const auto &[k, v] : node_->map)
      if (sanitize(k) == sanitize(key)) {
        read_.insert(sanitize(k));
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
    const Node *n = find(key);
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
    const Node *n = find(key);
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
  double real(const std::string &key, double fallback) {
    const Node *n = find(key);
    return n == nullptr ? fallback : to_real(*n, key);
  }
  int64_t integer(const std::string &key, int64_t fallback, bool required = false, int64_t minimum = INT64_MIN) {
    const Node *n = find(key);
    if (n == nullptr) {
      if (required) missing(key);
      return fallback;
    }
    int64_t v = to_integer(*n, key);
    if (v < minimum) fail(*n, where(key) + " must be >= " + std::to_string(minimum) + ", not " + n->value);
    return v;
  }
  bool boolean(const std::string &key, bool fallback) {
    const Node *n = find(key);
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
    const Node *n = find(key);
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

void read_optimizer(Block &b, Config &c) {
  c.has_optimizer = true;
  OptimizerConfig &o = c.optimizer;
  o.type = b.choice("type", {"sgd", "adam"}, "", true);
  Block p = b.block("parameters");
  o.learning_rate = p.real("learning_rate", o.learning_rate);
  o.weight_decay = p.real("weight_decay", o.weight_decay);
  if (o.type == "sgd") {
    o.momentum = p.real("momentum", o.momentum);
    o.dampening = p.real("dampening", o.dampening);
    o.nesterov = p.boolean("nesterov", o.nesterov);
  } else {
    o.beta1 = p.real("beta1", o.beta1);
    o.beta2 = p.real("beta2", o.beta2);
    o.eps = p.real("eps", o.eps);
    o.amsgrad = p.boolean("amsgrad", o.amsgrad);
  }
  p.done();
  Block g = b.block("general");
  c.grad_accumulation_steps = g.integer("grad_accumulation_steps", 1, false, 1);
  c.max_grad_norm = g.real("max_grad_norm", 0);
  g.done();
  b.done();
}

void read_scheduler(Block &b, Config &c) {
  c.has_scheduler = true;
  SchedulerConfig &s = c.scheduler;
  s.type = b.choice("type", {"step", "multistep", "polynomial", "cosine_annealing", "linear"}, "", true);
  Block p = b.block("parameters");
  if (s.type == "step") {
    s.step_size = p.integer("step_size", 0, true, 1);
    s.gamma = p.real("gamma", s.gamma);
  } else if (s.type == "multistep") {
    s.milestones = p.integers("milestones", true);
    for (size_t i = 0; i < s.milestones.size(); ++i) {
      if (s.milestones[i] < 0) throw ConfigError(c.filename + ": lr_scheduler.parameters.milestones must be >= 0");
      if (i > 0 && s.milestones[i] < s.milestones[i - 1])
        throw ConfigError(c.filename + ": lr_scheduler.parameters.milestones must be in increasing order");
    }
    s.gamma = p.real("gamma", s.gamma);
  } else if (s.type == "polynomial") {
    s.total_iters = p.integer("total_iters", 0, true, 1);
    s.power = p.real("power", s.power);
  } else if (s.type == "cosine_annealing") {
    s.t_max = p.integer("T_max", 0, true, 1);
    s.eta_min = p.real("eta_min", s.eta_min);
  } else {
    s.total_iters = p.integer("total_iters", 0, true, 1);
    s.start_factor = p.real("start_factor", s.start_factor);
    s.end_factor = p.real("end_factor", s.end_factor);
  }
  p.done();
  b.done();
}

}  // namespace

Config read_config(const std::string &filename) {
  Config c;
  c.filename = filename;
  Node root = parse_file(filename, c.text);
  if (root.kind == Node::kNull) throw ConfigError(filename + ": the configuration file is empty");
  Block top(&root, "", filename);

  Block general = top.block("general");
  c.report_frequency = general.integer("report_frequency", 0, false, 0);
  c.enable_wandb_hook = general.boolean("enable_wandb_hook", false);
  c.verbose = general.boolean("verbose", false);
  c.enable_cuda_graphs = general.boolean("enable_cuda_graphs", false);
  general.done();

  if (!top.has("model")) top.missing("model", " (a block with type: mlp or torchscript)");
  Block model = top.block("model");
  c.model_type = model.choice("type", {"mlp", "torchscript"}, "", true);
  Block mp = model.block("parameters");
  if (c.model_type == "torchscript") {
    c.model_filename = mp.string("filename", "", true);
  } else {
    c.layer_sizes = mp.integers("layer_sizes", true);
    if (c.layer_sizes.size() < 2)
      throw ConfigError(filename + ": model.parameters.layer_sizes needs at least two sizes (input and output)");
    for (int64_t s : c.layer_sizes)
      if (s < 1) throw ConfigError(filename + ": model.parameters.layer_sizes must be >= 1");
    c.dropout = mp.real("dropout", 0);
    if (c.dropout < 0 || c.dropout > 1)
      throw ConfigError(filename + ": model.parameters.dropout must be in [0, 1]");
    c.flatten_non_batch_dims = mp.boolean("flatten_non_batch_dims", true);
  }
  mp.done();
  model.done();

  if (top.has("loss")) {
    Block loss = top.block("loss");
    c.has_loss = true;
    c.loss_type = loss.choice("type", {"mse", "l1", "torchscript"}, "", true);
    Block lp = loss.block("parameters");
    if (c.loss_type == "torchscript") {
      c.loss_filename = lp.string("filename", "", true);
    } else {
      c.reduction = lp.choice("reduction", {"mean", "sum", "none"}, "mean");
    }
    lp.done();
    loss.done();
  } else {
    top.find("loss");
  }

  if (top.has("optimizer")) {
    Block b = top.block("optimizer");
    read_optimizer(b, c);
  } else {
    top.find("optimizer");
  }
  if (top.has("lr_scheduler")) {
    if (!c.has_optimizer)
      throw ConfigError(filename + ": an lr_scheduler block needs an optimizer block to schedule");
    Block b = top.block("lr_scheduler");
    read_scheduler(b, c);
  } else {
    top.find("lr_scheduler");
  }
  top.find("identifier");  // written by TorchFort into the copy it keeps for the wandb hook
  top.done();
  return c;
}

}  // namespace tf
