// Manifest parsing and validation. Every error names the manifest and the JSON path at fault.
#include "runtime/Manifest.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ape {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string &what, const std::string &path, const std::string &msg) {
  throw std::runtime_error("manifest of '" + what + "': " + path + ": " + msg);
}

const char *type_name(const json &j) { return j.type_name(); }

double get_number(const json &obj, const char *key, double dflt, const std::string &what,
                  const std::string &path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_number())
    fail(what, path + "." + key, std::string("expected a number, got ") + type_name(*it));
  double v = it->get<double>();
  if (!std::isfinite(v)) fail(what, path + "." + key, "must be finite");
  return v;
}

bool get_bool(const json &obj, const char *key, bool dflt, const std::string &what,
              const std::string &path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    fail(what, path + "." + key, std::string("expected true or false, got ") + type_name(*it));
  return it->get<bool>();
}

std::string get_string(const json &obj, const char *key, const std::string &what,
                       const std::string &path, bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) fail(what, path + "." + key, "missing (a string is required)");
    return {};
  }
  if (!it->is_string())
    fail(what, path + "." + key, std::string("expected a string, got ") + type_name(*it));
  return it->get<std::string>();
}

int64_t get_int(const json &obj, const char *key, const std::string &what, const std::string &path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) fail(what, path + "." + key, "missing (an integer is required)");
  // Integers beyond ±2^53 are refused (no manifest needs them; converting a larger double or an
  // unsigned above INT64_MAX to int64 would be undefined or wrap).
  constexpr double kExact = 9007199254740992.0;  // 2^53
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(kExact))
    fail(what, path + "." + key, "integer " + it->dump() + " out of range");
  if (!it->is_number_integer()) {
    // Accept 8.0 written as a float, reject 8.5.
    const double v = it->is_number_float() ? it->get<double>() : 0.5;
    if (std::floor(v) == v && std::fabs(v) <= kExact) return static_cast<int64_t>(v);
    fail(what, path + "." + key, std::string("expected an integer, got ") + it->dump());
  }
  return it->get<int64_t>();
}

InitSpec parse_init(const json &j, const std::string &what, const std::string &path) {
  InitSpec init;
  std::string kind;
  if (j.is_string()) {
    kind = j.get<std::string>();
  } else if (j.is_object()) {
    kind = get_string(j, "kind", what, path);
  } else {
    fail(what, path, std::string("expected an object {\"kind\": ...}, got ") + type_name(j));
  }
  static const json empty = json::object();
  const json &o = j.is_object() ? j : empty;
  std::optional<InitSpec::Kind> parsed = abi::parse_init_kind(kind);
  if (!parsed)
    fail(what, path + ".kind", "unknown init kind \"" + kind + "\" (expected " +
                                   abi::allowed<abi::InitKind>() + ")");
  init.kind = *parsed;
  switch (init.kind) {
    case InitSpec::Kind::Normal:
      init.std = get_number(o, "std", 0.02, what, path);
      if (init.std < 0) fail(what, path + ".std", "must be >= 0");
      break;
    case InitSpec::Kind::Constant:
      if (!o.contains("value")) fail(what, path + ".value", "missing (constant init needs a value)");
      init.value = get_number(o, "value", 0.0, what, path);
      break;
    case InitSpec::Kind::ProjectionTerm:
    case InitSpec::Kind::ProjectionPrefix:
      init.projection = get_string(o, "projection", what, path);
      if (!abi::parse_projection(init.projection))
        fail(what, path + ".projection",
             "expected " + abi::allowed<abi::Projection>() + ", got \"" + init.projection + "\"");
      init.columns = get_int(o, "columns", what, path);
      if (init.columns <= 0 || init.columns > ape_rules::kMaxDim) fail(what, path + ".columns", "must be in [1, 65536]");
      if (init.kind == InitSpec::Kind::ProjectionTerm) {
        init.start = get_number(o, "start", 0.0, what, path);
        init.step = get_number(o, "step", 0.0, what, path);
      } else {
        if (!o.contains("scale")) fail(what, path + ".scale", "missing (projection_prefix needs a scale)");
        init.scale = get_number(o, "scale", 1.0, what, path);
      }
      break;
    default: break;  // zeros, ones, alibi_slopes, sinusoidal: no argument
  }
  return init;
}

}  // namespace

std::string InitSpec::str() const {
  std::ostringstream s;
  s << abi::name(kind);
  switch (kind) {
    case Kind::Normal: s << "(std=" << std << ")"; break;
    case Kind::Constant: s << "(" << value << ")"; break;
    case Kind::ProjectionTerm:
      s << "(" << projection << ", columns=" << columns << ", start=" << start << ", step=" << step << ")";
      break;
    case Kind::ProjectionPrefix: s << "(" << projection << ", columns=" << columns << ", scale=" << scale << ")"; break;
    default: break;  // no argument
  }
  return s.str();
}

std::vector<int64_t> ParamSpec::resolve_shape(int64_t heads, int64_t head_dim) const {
  std::vector<int64_t> out;
  for (const auto &d : shape) out.push_back(d.resolve(heads, head_dim));
  return out;
}

int64_t ParamSpec::numel(int64_t heads, int64_t head_dim) const {
  int64_t n = 1;
  for (const auto &d : shape) n *= d.resolve(heads, head_dim);
  return n;
}

int64_t Manifest::param_index(const std::string &name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

std::vector<double> OverrideSpec::positions(int64_t T) const {
  std::vector<double> p(static_cast<size_t>(std::max<int64_t>(T, 0) * l));
  for (int64_t n = 0; n < T; ++n)
    for (int64_t j = 0; j < l; ++j) {
      double v;
      if (kind == Kind::Expe) {
        v = start + theta * double(n + j);
      } else {
        const int64_t count = n / l + (j <= n % l ? 1 : 0);  // c_j(n)
        v = start + double(j) * theta1 + theta2 * double(count);
      }
      p[n * l + j] = v;
    }
  return p;
}

double Manifest::scale_for(int64_t head_dim) const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

namespace {

// $.features: the token features, in order. `names` collects every feature and param name.
std::vector<FeatureSpec> parse_features(const json &arr, const std::string &what, std::set<std::string> &names) {
  if (!arr.is_array()) fail(what, "$.features", std::string("expected an array, got ") + type_name(arr));
  std::vector<FeatureSpec> out;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json &f = arr[i];
    std::string path = "$.features[" + std::to_string(i) + "]";
    if (!f.is_object()) fail(what, path, std::string("expected an object, got ") + type_name(f));
    FeatureSpec fs;
    fs.name = get_string(f, "name", what, path);
    fs.weight_std = get_number(f, "weight_std", 0.02, what, path);
    fs.bias = get_number(f, "bias", 0.0, what, path);
    if (fs.weight_std < 0) fail(what, path + ".weight_std", "must be >= 0");
    if (!names.insert("feature:" + fs.name).second)
      fail(what, path + ".name", "duplicate feature \"" + fs.name + "\"");
    out.push_back(fs);
  }
  return out;
}

// A param's $.params[i].shape: symbols ("heads", "head_dim") and sizes, within the verifier's limits.
std::vector<DimSpec> parse_shape(const json &p, const std::string &what, const std::string &path) {
  std::vector<DimSpec> shape;
  auto sh = p.find("shape");
  if (sh == p.end() || !sh->is_array())
    fail(what, path + ".shape", "missing or not an array (e.g. [\"heads\", \"head_dim\"])");
  int64_t fixed_elements = 1;
  for (size_t k = 0; k < sh->size(); ++k) {
    const json &d = (*sh)[k];
    std::string dpath = path + ".shape[" + std::to_string(k) + "]";
    DimSpec ds;
    if (d.is_string()) {  // a symbol, or a size written as a string, e.g. "1" or "16"
      std::string s = d.get<std::string>();
      std::optional<DimSpec> parsed = abi::parse_dim(s);
      if (!parsed)
        fail(what, dpath, "unknown shape symbol \"" + s + "\" (expected \"heads\", \"head_dim\" or a positive integer)");
      ds = *parsed;
    } else if (d.is_number_integer() && d.get<int64_t>() > 0) {
      ds.kind = DimSpec::Kind::Fixed;
      ds.value = d.get<int64_t>();
    } else {
      fail(what, dpath, "expected \"heads\", \"head_dim\" or a positive integer, got " + d.dump());
    }
    if (ds.kind == DimSpec::Kind::Fixed) {  // the verifier's limits (ape/contract/value_rules.h)
      if (ds.value > ape_rules::kMaxDim)
        fail(what, dpath, std::to_string(ds.value) + " exceeds " + std::to_string(ape_rules::kMaxDim));
      fixed_elements *= ds.value;
      if (fixed_elements > ape_rules::kMaxParamElements)
        fail(what, path + ".shape", "the integer dimensions hold more than " +
                                        std::to_string(ape_rules::kMaxParamElements) + " elements");
    }
    shape.push_back(ds);
  }
  return shape;
}

// A fixed param's value range, $.params[i].range, checked against the param's init.
void parse_range(const json &p, const std::string &what, const std::string &path, ParamSpec &ps) {
  if (auto r = p.find("range"); r != p.end() && !r->is_null()) {
    const std::string rp = path + ".range";
    if (!r->is_object()) fail(what, rp, std::string("expected an object {min, max, integer}, got ") + type_name(*r));
    if (!r->contains("min") || !r->contains("max")) fail(what, rp, "needs both min and max");
    ape_rules::Range range{get_number(*r, "min", 0.0, what, rp), get_number(*r, "max", 0.0, what, rp),
                           get_bool(*r, "integer", false, what, rp)};
    if (!(range.min <= range.max)) fail(what, rp, "min exceeds max");
    if (!ps.fixed()) fail(what, rp, "a value range applies to a fixed param (not trainable, not derived)");
    if (ps.init.kind == InitSpec::Kind::Constant)
      if (std::string why = range.check(ps.init.value); !why.empty()) fail(what, path + ".init.value", why);
    ps.range = range;
  }
}

// One entry of $.params (at `path`): its shape, init, flags and range, and the shapes its init
// requires.
ParamSpec parse_param(const json &p, const std::string &what, const std::string &path, std::set<std::string> &names) {
  if (!p.is_object()) fail(what, path, std::string("expected an object, got ") + type_name(p));
  ParamSpec ps;
  ps.name = get_string(p, "name", what, path);
  if (!names.insert("param:" + ps.name).second)
    fail(what, path + ".name", "duplicate param \"" + ps.name + "\"");
  ps.shape = parse_shape(p, what, path);
  auto init = p.find("init");
  if (init == p.end()) fail(what, path + ".init", "missing");
  ps.init = parse_init(*init, what, path + ".init");
  ps.trainable = get_bool(p, "trainable", false, what, path);
  ps.per_layer = get_bool(p, "per_layer", true, what, path);
  parse_range(p, what, path, ps);
  if (ps.init.kind == InitSpec::Kind::ProjectionTerm) {
    if (ps.shape.size() != 2 || ps.shape[0].kind != DimSpec::Kind::Heads ||
        ps.shape[1].kind != DimSpec::Kind::HeadDim)
      fail(what, path + ".shape", "a projection_term param must have shape [\"heads\", \"head_dim\"]");
    if (!ps.per_layer)
      fail(what, path + ".per_layer", "a projection_term param comes from a per-layer projection; it cannot be shared");
  }
  if (ps.init.kind == InitSpec::Kind::ProjectionPrefix) {
    if (ps.shape.size() != 3 || ps.shape[0].kind != DimSpec::Kind::Fixed ||
        ps.shape[0].value != ps.init.columns || ps.shape[1].kind != DimSpec::Kind::Heads ||
        ps.shape[2].kind != DimSpec::Kind::HeadDim)
      fail(what, path + ".shape",
           "a projection_prefix param must have shape [columns, \"heads\", \"head_dim\"] = [" +
               std::to_string(ps.init.columns) + ", \"heads\", \"head_dim\"]");
    if (!ps.per_layer)
      fail(what, path + ".per_layer", "a projection_prefix param comes from a per-layer projection; it cannot be shared");
  }
  if (ps.init.kind == InitSpec::Kind::Sinusoidal &&
      (ps.shape.size() != 3 || ps.shape[0].kind != DimSpec::Kind::Fixed ||
       ps.shape[1].kind != DimSpec::Kind::Heads || ps.shape[2].kind != DimSpec::Kind::HeadDim))
    fail(what, path + ".shape", "sinusoidal needs shape [rows, \"heads\", \"head_dim\"]");
  if (ps.init.kind == InitSpec::Kind::AlibiSlopes &&
      (ps.shape.size() != 1 || ps.shape[0].kind != DimSpec::Kind::Heads))
    fail(what, path + ".shape", "alibi_slopes needs shape [\"heads\"]");
  return ps;
}

// $.override: ExPE's or ExQPE's position override; its position_scale names a param of `m`.
OverrideSpec parse_override(const json &oj, const Manifest &m, const std::string &what) {
  if (!oj.is_object()) fail(what, "$.override", std::string("expected an object {l, targets}, got ") + type_name(oj));
  const std::string op = "$.override";
  OverrideSpec o;
  o.l = get_int(oj, "l", what, op);
  if (o.l <= 0 || o.l > ape_rules::kMaxDim) fail(what, op + ".l", "must be in [1, " + std::to_string(ape_rules::kMaxDim) + "]");
  o.targets = get_string(oj, "targets", what, op);
  std::optional<abi::Targets> targets = abi::parse_targets(o.targets);
  if (!targets)
    fail(what, op + ".targets", "expected " + abi::allowed<abi::Targets>() + ", got \"" + o.targets + "\"");
  o.q = o.k = true;
  o.v = *targets == abi::Targets::Qkv;
  // "kind" is absent in manifests that predate ExQPE: those are ExPE.
  const std::string kind = get_string(oj, "kind", what, op, /*required=*/false);
  const bool explicit_kind = !kind.empty();
  std::optional<OverrideSpec::Kind> parsed_kind =
      kind.empty() ? OverrideSpec::Kind::Expe : abi::parse_override_kind(kind);
  if (!parsed_kind)
    fail(what, op + ".kind", "expected " + abi::allowed<abi::OverrideKind>() + ", got \"" + kind + "\"");
  o.kind = *parsed_kind;
  // The position values are needed by the runtime for "qkv" (the value path); with an explicit
  // kind they are always required, so a manifest describes its positions completely.
  const bool need = explicit_kind || o.v;
  auto number = [&](const char *key) {
    if (need && (!oj.contains(key) || oj.at(key).is_null()))
      fail(what, op + "." + key,
           std::string("missing (an ") + std::string(abi::name(o.kind)) +
               " override" + (o.v ? " with targets \"qkv\"" : "") + " needs a number)");
    return get_number(oj, key, 0.0, what, op);
  };
  o.start = get_number(oj, "start", 0.0, what, op);
  if (o.kind == OverrideSpec::Kind::Expe) {
    o.theta = number("theta");
  } else {
    o.theta1 = number("theta1");
    o.theta2 = number("theta2");
  }
  o.position_scale = get_string(oj, "position_scale", what, op, /*required=*/false);
  if (oj.contains("position_scale") && !oj.at("position_scale").is_null()) {
    const int64_t idx = m.param_index(o.position_scale);
    if (idx < 0)
      fail(what, op + ".position_scale", "names no param: \"" + o.position_scale + "\" is not in $.params");
    const ParamSpec &ps = m.params[idx];
    bool one = true;
    for (const auto &d : ps.shape) one = one && d.kind == DimSpec::Kind::Fixed && d.value == 1;
    if (!ps.fixed() || !one)
      fail(what, op + ".position_scale",
           "param \"" + o.position_scale + "\" must be a fixed (not trainable, not derived) param of shape [1]");
  }
  return o;
}

// $.rotation: the pairing of a rotation's dimensions and the fraction rotated.
RotationSpec parse_rotation(const json &j, const std::string &what) {
  const std::string rp = "$.rotation";
  if (!j.is_object()) fail(what, rp, std::string("expected null or an object {pairing, fraction}, got ") + type_name(j));
  RotationSpec r;
  r.pairing = get_string(j, "pairing", what, rp);
  if (!abi::parse_rotation_pairing(r.pairing))
    fail(what, rp + ".pairing", "expected \"half\" or \"interleaved\", got \"" + r.pairing + "\"");
  r.fraction = get_number(j, "fraction", 1.0, what, rp);
  if (!(r.fraction > 0 && r.fraction <= 1)) fail(what, rp + ".fraction", "must be in (0, 1]");
  return r;
}

// $.embedding: an absolute encoding's table or learned embedding.
EmbeddingSpec parse_embedding(const json &j, const std::string &what) {
  const std::string ep = "$.embedding";
  if (!j.is_object())
    fail(what, ep, std::string("expected null or an object {\"kind\": \"table\" | \"learned\", ...}, got ") +
                       type_name(j));
  EmbeddingSpec e;
  const std::string kind = get_string(j, "kind", what, ep);
  std::optional<EmbeddingSpec::Kind> parsed_kind = abi::parse_embedding_kind(kind);
  if (parsed_kind == EmbeddingSpec::Kind::Table) {
    e.kind = EmbeddingSpec::Kind::Table;
  } else if (parsed_kind == EmbeddingSpec::Kind::Learned) {
    e.kind = EmbeddingSpec::Kind::Learned;
    e.max_length = get_int(j, "max_length", what, ep);
    if (e.max_length <= 0 || e.max_length > ape_rules::kMaxLength)
      fail(what, ep + ".max_length", "must be in [1, " + std::to_string(ape_rules::kMaxLength) + "]");
    e.std = get_number(j, "std", 0.02, what, ep);
    if (e.std < 0) fail(what, ep + ".std", "must be >= 0");
  } else {
    fail(what, ep + ".kind", "expected \"table\" or \"learned\", got \"" + kind + "\"");
  }
  e.scale_embedding = get_bool(j, "scale_embedding", false, what, ep);
  return e;
}

}  // namespace

Manifest Manifest::parse(const std::string &text, const std::string &what_in) {
  std::string what = what_in;
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error &e) {
    throw std::runtime_error("manifest of '" + what + "': not valid JSON: " + e.what());
  }
  if (!root.is_object())
    fail(what, "$", std::string("expected a JSON object, got ") + type_name(root));

  Manifest m;
  m.encoding = get_string(root, "encoding", what, "$");
  if (m.encoding.empty()) fail(what, "$.encoding", "must not be empty");
  if (what == "<manifest>") what = m.encoding;
  m.source = get_string(root, "source", what, "$", /*required=*/false);
  m.causal = get_bool(root, "causal", true, what, "$");
  m.inference_only = get_bool(root, "inference_only", false, what, "$");
  if (auto it = root.find("transition"); it != root.end() && !it->is_null()) {
    if (!it->is_object()) fail(what, "$.transition", std::string("expected null or an object, got ") + it->dump());
    TransitionAttrs t;
    t.divisor_offset = get_int(*it, "divisor_offset", what, "$.transition");
    t.first_layer = get_int(*it, "first_layer", what, "$.transition");
    t.skip_last = get_int(*it, "skip_last", what, "$.transition");
    t.intervals = get_int(*it, "intervals", what, "$.transition");
    t.alpha = get_number(*it, "alpha", t.alpha, what, "$.transition");
    t.beta = get_number(*it, "beta", t.beta, what, "$.transition");
    m.transition = t;
  }

  if (auto it = root.find("scale"); it != root.end() && !it->is_null()) {
    if (!it->is_number()) fail(what, "$.scale", std::string("expected null or a number, got ") + it->dump());
    double s = it->get<double>();
    if (std::string why = ::ape_rules::kScale.check(s); !why.empty()) fail(what, "$.scale", why);
    m.scale = s;
  }

  for (const char *key : {"head_dim", "model_dim"}) {
    if (auto it = root.find(key); it != root.end() && !it->is_null()) {
      const int64_t v = get_int(root, key, what, "$");
      if (v <= 0) fail(what, std::string("$.") + key, "must be > 0");
      (key[0] == 'h' ? m.head_dim_hint : m.model_dim_hint) = v;
    }
  }

  std::set<std::string> names;  // every feature and param name, each once
  auto section = [&](const char *key) -> const json * {
    auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json *f = section("features")) m.features = parse_features(*f, what, names);
  if (const json *ps = section("params")) {
    if (!ps->is_array()) fail(what, "$.params", std::string("expected an array, got ") + type_name(*ps));
    for (size_t i = 0; i < ps->size(); ++i)
      m.params.push_back(parse_param((*ps)[i], what, "$.params[" + std::to_string(i) + "]", names));
  }
  if (const json *o = section("override")) m.override_ = parse_override(*o, m, what);
  if (const json *r = section("rotation")) m.rotation = parse_rotation(*r, what);
  if (const json *e = section("embedding")) m.embedding = parse_embedding(*e, what);
  return m;
}

std::string transition_noop_note(const Manifest &m, int64_t layers) {
  if (!m.transition) return "";
  const int64_t first = std::max<int64_t>(m.transition->first_layer, 1), last = layers - 1 - m.transition->skip_last;
  if (first <= last && m.transition->intervals > 0) return "";
  return m.encoding + "'s attention transition transforms layers " + std::to_string(first) + " to N-1-" +
         std::to_string(m.transition->skip_last) + " of N; this model has " + std::to_string(layers) +
         (layers == 1 ? " layer" : " layers") + ", so none: its results are the encoding's without the transition "
         "(a model of at least " + std::to_string(first + 1 + m.transition->skip_last) + " layers has one)";
}

std::string inference_only_message(const std::string &encoding) {
  return "encoding '" + encoding + "' is inference-only (an ape.attention_transition, which has no "
         "derivative): it cannot be trained; train a model without it (e.g. rope) and evaluate that "
         "checkpoint with --encoding " + encoding;
}

std::vector<double> alibi_slopes(int64_t heads) {
  if (heads <= 0) throw std::invalid_argument("alibi_slopes: heads must be > 0");
  return abi::alibi_slopes(heads);
}

}  // namespace ape
