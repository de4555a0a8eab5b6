// torchfort_config.cpp - TorchFort's YAML configuration: libyaml's document tree turned into a
// Config, every block and key checked against what config.rst allows.
#include "torchfort_yaml.hpp"

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

#ifdef FTORCH_HAVE_YAML
namespace {
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
}  // namespace

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

void read_optimizer(Block &b, OptimizerConfig &o, int64_t &grad_accumulation_steps, double &max_grad_norm) {
  o.type = b.choice("type", {"sgd", "adam"}, "", true);
  Block p = b.block("parameters");
  // (the bounds torch.optim checks: a negative rate is gradient ascent, a negative decay grows the
  // weights; LibTorch would refuse them only when the model is made, as an internal error)
  o.learning_rate = p.real("learning_rate", o.learning_rate, 0.0);
  o.weight_decay = p.real("weight_decay", o.weight_decay, 0.0);
  if (o.type == "sgd") {
    o.momentum = p.real("momentum", o.momentum, 0.0);
    o.dampening = p.real("dampening", o.dampening);
    o.nesterov = p.boolean("nesterov", o.nesterov);
    if (o.nesterov && !(o.momentum > 0 && o.dampening == 0))
      p.fail_here("nesterov needs a momentum > 0 and no dampening (as torch.optim.SGD)");
  } else {
    o.beta1 = p.real("beta1", o.beta1, 0.0);
    o.beta2 = p.real("beta2", o.beta2, 0.0);
    if (!(o.beta1 < 1) || !(o.beta2 < 1)) p.fail_here("beta1 and beta2 must be in [0, 1)");
    o.eps = p.real("eps", o.eps, 0.0);
    o.amsgrad = p.boolean("amsgrad", o.amsgrad);
  }
  p.done();
  Block g = b.block("general");
  grad_accumulation_steps = g.integer("grad_accumulation_steps", 1, false, 1);
  max_grad_norm = g.real("max_grad_norm", 0, 0.0);  // (0: no clipping)
  g.done();
  b.done();
}

// A schedule's periods count steps as LibTorch's schedulers do (unsigned 32-bit, cosine annealing
// doubling its period): beyond this they would wrap around to a short period, or to none.
constexpr int64_t kMaxPeriod = INT32_MAX;

void read_scheduler(Block &b, SchedulerConfig &s, const std::string &file, const std::string &where) {
  s.type = b.choice("type", {"step", "multistep", "polynomial", "cosine_annealing", "linear"}, "", true);
  Block p = b.block("parameters");
  if (s.type == "step") {
    s.step_size = p.integer("step_size", 0, true, 1, kMaxPeriod);
    s.gamma = p.real("gamma", s.gamma, 0.0);  // (a negative factor would make the rate negative: ascent)
  } else if (s.type == "multistep") {
    s.milestones = p.integers("milestones", true);
    for (size_t i = 0; i < s.milestones.size(); ++i) {
      // (milestone 0: PyTorch decays at construction, this schedule's first rate is the optimizer's)
      if (s.milestones[i] < 1) throw ConfigError(file + ": " + where + ".parameters.milestones must be >= 1");
      // (a repeated milestone is refused: PyTorch decays gamma^k there, TorchFort once)
      if (i > 0 && s.milestones[i] <= s.milestones[i - 1])
        throw ConfigError(file + ": " + where + ".parameters.milestones must be strictly increasing (a repeated "
                          "milestone has no agreed meaning: give the combined gamma another way)");
    }
    s.gamma = p.real("gamma", s.gamma, 0.0);
  } else if (s.type == "polynomial") {
    s.total_iters = p.integer("total_iters", 0, true, 1, kMaxPeriod);
    s.power = p.real("power", s.power, 0.0);  // (a negative power: a growing, then infinite rate)
  } else if (s.type == "cosine_annealing") {
    s.t_max = p.integer("T_max", 0, true, 1, kMaxPeriod);
    s.eta_min = p.real("eta_min", s.eta_min, 0.0);  // (the rate reaches eta_min: never negative)
  } else {
    s.total_iters = p.integer("total_iters", 0, true, 1, kMaxPeriod);
    s.start_factor = p.real("start_factor", s.start_factor);
    s.end_factor = p.real("end_factor", s.end_factor);
    // (as PyTorch's LinearLR: a start of 0 would make the second rate 0 * inf)
    if (!(s.start_factor > 0 && s.start_factor <= 1) || !(s.end_factor >= 0 && s.end_factor <= 1))
      throw ConfigError(file + ": " + where + ".parameters: start_factor must be in (0, 1] and end_factor in [0, 1]");
  }
  p.done();
  b.done();
}

Node open_config(const std::string &filename, GeneralConfig &c) {
  c.filename = filename;
  Node root = parse_file(filename, c.text);
  if (root.kind == Node::kNull) throw ConfigError(filename + ": the configuration file is empty");
  return root;
}

void read_general(Block &top, GeneralConfig &c) {
  Block general = top.block("general");
  c.report_frequency = general.integer("report_frequency", 0, false, 0);
  c.enable_wandb_hook = general.boolean("enable_wandb_hook", false);
  c.verbose = general.boolean("verbose", false);
  c.enable_cuda_graphs = general.boolean("enable_cuda_graphs", false);
  general.done();
}

Config read_config(const std::string &filename) {
  Config c;
  Node root = open_config(filename, c);
  Block top(&root, "", filename);
  read_general(top, c);

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
    c.has_optimizer = true;
    read_optimizer(b, c.optimizer, c.grad_accumulation_steps, c.max_grad_norm);
  } else {
    top.find("optimizer");
  }
  if (top.has("lr_scheduler")) {
    if (!c.has_optimizer)
      throw ConfigError(filename + ": an lr_scheduler block needs an optimizer block to schedule");
    Block b = top.block("lr_scheduler");
    c.has_scheduler = true;
    read_scheduler(b, c.scheduler, filename, "lr_scheduler");
  } else {
    top.find("lr_scheduler");
  }
  top.find("identifier");  // written by TorchFort into the copy it keeps for the wandb hook
  top.done();
  return c;
}

}  // namespace tf
