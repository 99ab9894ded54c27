// ape-check's comparisons (see SpecCheck.h).
#include "runtime/SpecCheck.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "ape/cpu/decode.h"
#include "ape/cpu/kernel_call.h"
#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/FiniteDifference.h"
#include "runtime/Manifest.h"

namespace ape {

using at::Tensor;

std::string CheckShape::str() const {
  return std::to_string(B) + "x" + std::to_string(H) + "x" + std::to_string(T) + "x" +
         std::to_string(D);
}

std::vector<CheckShape> fit_grid(const Manifest &man, const std::vector<CheckShape> &asked) {
  std::vector<CheckShape> grid;
  if (asked.empty()) {
    for (CheckShape s : default_grid()) {
      if (man.head_dim_hint) s.D = *man.head_dim_hint;
      if (man.model_dim_hint) {
        if (*man.model_dim_hint % s.D != 0) continue;
        s.H = *man.model_dim_hint / s.D;
      }
      if (man.rotation && !ape_rules::checkRotation(man.rotation->fraction, s.D).empty()) continue;
      grid.push_back(s);
    }
    if (grid.empty())
      throw std::runtime_error("no shape of the default grid fits the encoding (its head_dim / model_dim "
                               "hints or its rotation fraction); give one with --shapes");
    return grid;
  }
  for (const CheckShape &s : asked) {
    const std::string shape = "--shapes " + s.str() + ": ";
    if (man.head_dim_hint && s.D != *man.head_dim_hint)
      throw std::runtime_error(shape + "the spec pins head_dim " + std::to_string(*man.head_dim_hint) +
                               " (give D = " + std::to_string(*man.head_dim_hint) + ")");
    if (man.model_dim_hint && s.H * s.D != *man.model_dim_hint)
      throw std::runtime_error(shape + "the spec pins model_dim " + std::to_string(*man.model_dim_hint) +
                               ", and H x D is " + std::to_string(s.H * s.D));
    if (man.rotation) {
      const std::string why = ape_rules::checkRotation(man.rotation->fraction, s.D);
      if (!why.empty()) throw std::runtime_error(shape + why);
    }
    grid.push_back(s);
  }
  return grid;
}

std::vector<CheckShape> default_grid() {
  return {{1, 1, 1, 16}, {2, 3, 37, 16}, {1, 2, 64, 32}, {2, 2, 150, 64}};
}

std::vector<CheckShape> default_cuda_cells(const Manifest &man) {
  CheckShape s{1, 2, 150, 128};
  // (a pinned head dim: the grid's cells have it already, 128 included)
  if (man.head_dim_hint) return {};
  if (man.model_dim_hint) {
    if (*man.model_dim_hint % s.D != 0) return {};
    s.H = *man.model_dim_hint / s.D;
  }
  if (man.rotation && !ape_rules::checkRotation(man.rotation->fraction, s.D).empty()) return {};
  return {s};
}

bool CheckReport::passed() const {
  if (!problems.empty()) return false;
  for (const CheckRow &r : rows)
    if (!r.pass) return false;
  return true;
}

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

// The inputs of one cell, fp64 masters; params and features in manifest order.
struct Cell {
  CheckShape shape;
  Tensor q, k, v, dout;
  std::vector<Tensor> features, params;
  double scale = 0;
  SpecReference::Site site;   // an attention transition's layer of num_layers
  bool forward_only = false;  // an inference-only kernel: o and lse, no backward
  // k and v of fewer heads than q (grouped-query attention): their heads, else 0 (as AttnArgs).
  int64_t kv_heads() const { return k.size(1) == shape.H ? 0 : k.size(1); }
  std::string label() const {
    return site.num_layers > 0 ? shape.str() + " L" + std::to_string(site.layer) : shape.str();
  }
};

// A param's value for a check. Fixed params (settings such as rope_factor) and derived ones
// (computed from a projection weight at run time; here random N(0, 0.02), like the weight they
// come from) as a model would hold them. Trainable params start from their initialiser and move
// off values where the encoding is degenerate: a zero or small-normal initialiser (tables,
// hidden layers, biases) becomes N(0, max(std, 0.5)), so that its term visibly changes the
// logits; a nonzero deterministic one (ALiBi slopes, KERPLE's p and a, FIRE's c and L) is
// multiplied by |1 + 0.1 N(0, 1)|, which keeps its sign and breaks ties (no clamp or max sits
// exactly at a kink).
Tensor make_param(const ParamSpec &p, int64_t H, int64_t D) {
  const auto shape = p.resolve_shape(H, D);
  if (p.init.derived()) return at::randn(shape, kF64) * 0.02;
  Tensor base = init_param(p, H, D, at::kDouble);
  if (!p.trainable) return base;
  if (p.init.kind == InitSpec::Kind::Zeros || p.init.kind == InitSpec::Kind::Normal ||
      base.abs().max().item<double>() == 0.0)
    return at::randn(shape, kF64) * std::max(p.init.kind == InitSpec::Kind::Normal ? p.init.std : 0.0, 0.5);
  return base * (1.0 + 0.1 * at::randn(shape, kF64)).abs();
}

Cell make_cell(const Manifest &man, const CheckShape &s, uint64_t seed) {
  Cell c;
  c.shape = s;
  at::manual_seed(seed);
  c.q = at::randn({s.B, s.H, s.T, s.D}, kF64);
  c.k = at::randn({s.B, s.H, s.T, s.D}, kF64);
  c.v = at::randn({s.B, s.H, s.T, s.D}, kF64);
  c.dout = at::randn({s.B, s.H, s.T, s.D}, kF64);
  for (int64_t n = 0; n < man.num_features(); ++n) c.features.push_back(at::randn({s.B, s.H, s.T}, kF64));
  for (const ParamSpec &p : man.params) c.params.push_back(make_param(p, s.H, s.D));
  c.scale = man.scale_for(s.D);
  return c;
}

using Outputs = std::map<std::string, Tensor>;  // quantity -> fp64 tensor
constexpr int kSensitivitySigns = 16;  // draws of the params' sensitivity estimate (run_reference)

// The params and features the spec declares that the kernel leaves out (nothing reads them once
// the regions are composed, and apec warns: a later score_mod that ignores the score it is given,
// a load in a branch a constant decides, a scan no region reads). The reference still evaluates
// them: each gets the constant `fill` here (check_kernel makes sure the outputs do not depend on it).
void add_left_out(const SpecReference &ref, const Cell &c, at::ScalarType dtype, double fill,
                  std::map<std::string, Tensor> &feats, std::map<std::string, Tensor> &prms) {
  for (const SpecReference::ParamInfo &p : ref.params()) {
    if (prms.count(p.name)) continue;
    std::vector<int64_t> shape;
    for (const std::string &d : p.shape)
      shape.push_back(abi::parse_dim(d).value_or(abi::Dim{}).resolve(c.shape.H, c.shape.D));
    prms[p.name] = at::full(shape, fill, at::dtype(dtype));
  }
  for (const std::string &f : ref.features())
    if (!feats.count(f)) feats[f] = at::full({c.shape.B, c.shape.H, c.shape.T}, fill, at::dtype(dtype));
}

// The reference in `dtype` (float64 or float32), gradients by autograd; `left_out_fill` the value
// of what the kernel leaves out (add_left_out).
Outputs run_reference(const SpecReference &ref, const Manifest &man, const Cell &c,
                      at::ScalarType dtype, double left_out_fill = 0.375) {
  if (c.forward_only) {  // no gradients: the kernel has no backward
    std::map<std::string, Tensor> feats, prms;
    for (size_t n = 0; n < c.features.size(); ++n) feats[man.features[n].name] = c.features[n].to(dtype);
    for (size_t n = 0; n < c.params.size(); ++n) prms[man.params[n].name] = c.params[n].to(dtype);
    add_left_out(ref, c, dtype, left_out_fill, feats, prms);
    c10::NoGradGuard no_grad;
    const SpecReference::Result r =
        ref.attention(c.q.to(dtype), c.k.to(dtype), c.v.to(dtype), feats, prms, c.scale, c.site);
    return {{"o", r.o.to(at::kDouble)}, {"lse", r.lse.to(at::kDouble)}};
  }
  auto leaf = [&](const Tensor &t, bool grad) {
    return t.to(dtype).detach().clone().set_requires_grad(grad);
  };
  Tensor q = leaf(c.q, true), k = leaf(c.k, true), v = leaf(c.v, true);
  std::vector<Tensor> inputs = {q, k, v};
  std::vector<std::string> names = {"dq", "dk", "dv"};
  std::map<std::string, Tensor> feats, prms;
  for (size_t n = 0; n < c.features.size(); ++n) {
    Tensor f = leaf(c.features[n], true);
    feats[man.features[n].name] = f;
    inputs.push_back(f), names.push_back("dfeature:" + man.features[n].name);
  }
  for (size_t n = 0; n < c.params.size(); ++n) {
    const ParamSpec &p = man.params[n];
    Tensor t = leaf(c.params[n], p.trainable);
    prms[p.name] = t;
    if (p.trainable) inputs.push_back(t), names.push_back("dparam:" + p.name);
  }
  add_left_out(ref, c, dtype, left_out_fill, feats, prms);
  c10::AutoGradMode grad_mode(true);
  SpecReference::Result r = ref.attention(q, k, v, feats, prms, c.scale, c.site);
  Outputs out;
  // Each trainable param's sensitivity to the rounding of Delta_i = dO_i . o_i, which the kernels
  // compute otherwise than sum_j P_ij dP_ij and which reaches the param's gradient as
  // sum_i dDelta_i sum_j P_ij ds_ij/dw: sqrt(sum_i (sum_j P_ij ds_ij/dw)^2) at its largest element
  // (param_floor_scale), estimated as E[(sum_ij r_i P_ij ds_ij/dw)^2] over random signs r per
  // query row (kSensitivitySigns draws; a fixed generator, so that the cell's other draws stay as
  // they are). fp64 only (the floors are taken against the fp64 reference). A param the logits do
  // not reach (value rows) gets 0.
  std::vector<Tensor> trainable;
  std::vector<std::string> trainable_names;
  for (size_t n = 0; n < c.params.size(); ++n)
    if (man.params[n].trainable) trainable.push_back(prms.at(man.params[n].name)), trainable_names.push_back(man.params[n].name);
  if (dtype == at::kDouble && !trainable.empty() && r.s.defined() && r.s.requires_grad()) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0x5e75u);
    const Tensor weight = at::where(at::isfinite(r.s.detach()), r.p.detach(), at::zeros_like(r.p));
    const int64_t B = r.s.size(0), H = r.s.size(1), T = c.q.size(2);
    std::vector<Tensor> sum2(trainable.size());
    for (int n = 0; n < kSensitivitySigns; ++n) {
      const Tensor rows = at::randint(0, 2, {B, H, T}, gen, at::dtype(dtype)).mul_(2).sub_(1);
      const Tensor sign = rows.index_select(2, r.row).mul(weight);
      auto g = torch::autograd::grad({r.s}, trainable, {sign}, /*retain_graph=*/true, /*create_graph=*/false,
                                     /*allow_unused=*/true);
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i].defined()) {
          const Tensor sq = g[i].detach().to(at::kDouble).square();
          sum2[i] = sum2[i].defined() ? sum2[i] + sq : sq;
        }
    }
    for (size_t i = 0; i < trainable.size(); ++i) {
      const double m = sum2[i].defined() ? (sum2[i] / kSensitivitySigns).max().item<double>() : 0.0;
      out["sensitivity:" + trainable_names[i]] = at::scalar_tensor(std::isfinite(m) ? std::sqrt(m) : 0.0, kF64);
    }
  }
  out["o"] = r.o.detach().to(at::kDouble);
  out["lse"] = r.lse.detach().to(at::kDouble);
  auto grads = torch::autograd::grad({r.o}, inputs, {c.dout.to(dtype)}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t n = 0; n < inputs.size(); ++n)
    out[names[n]] = grads[n].defined() ? grads[n].to(at::kDouble) : at::zeros_like(inputs[n], kF64);
  for (size_t n = 0; n < c.params.size(); ++n)  // a fixed param gets no gradient
    if (!man.params[n].trainable) out["dparam:" + man.params[n].name] = at::zeros_like(c.params[n]);
  return out;
}

// One call of the kernel in precision Real; every output NaN-filled first, so that an output the
// kernel does not write is caught.
template <class Real> struct KernelRun {
  static constexpr at::ScalarType kType = std::is_same_v<Real, float> ? at::kFloat : at::kDouble;
  const KernelEntry &entry;
  Tensor q, k, v, o, lse, dout, dq, dk, dv;
  std::vector<Tensor> feat, prm, dfeat, dprm;
  std::vector<const Real *> feat_p, prm_p;
  std::vector<Real *> dfeat_p, dprm_p;
  AttnArgs<Real> args{};

  KernelRun(const KernelEntry &e, const Cell &c) : entry(e) {
    auto cvt = [&](const Tensor &t) { return t.to(kType).contiguous().clone(); };
    q = cvt(c.q), k = cvt(c.k), v = cvt(c.v), dout = cvt(c.dout);
    for (const auto &f : c.features) feat.push_back(cvt(f));
    for (const auto &t : c.params) prm.push_back(cvt(t));
    o = at::empty_like(q), lse = at::empty({c.shape.B, c.shape.H, c.shape.T}, at::dtype(kType));
    dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    for (auto &f : feat) dfeat.push_back(at::empty_like(f)), feat_p.push_back(f.data_ptr<Real>());
    for (auto &t : prm) dprm.push_back(at::empty_like(t)), prm_p.push_back(t.data_ptr<Real>());
    for (auto &t : dfeat) dfeat_p.push_back(t.data_ptr<Real>());
    for (auto &t : dprm) dprm_p.push_back(t.data_ptr<Real>());
    args = backward_args(
        forward_args<Real>({c.shape.B, c.shape.H, c.shape.T, c.shape.D}, c.scale,
                           q.data_ptr<Real>(), k.data_ptr<Real>(), v.data_ptr<Real>(),
                           feat_p.data(), prm_p.data(), o.data_ptr<Real>(), lse.data_ptr<Real>()),
        dout.data_ptr<Real>(), dq.data_ptr<Real>(), dk.data_ptr<Real>(), dv.data_ptr<Real>(),
        dfeat_p.data(), dprm_p.data());
    args.layer = c.site.layer, args.num_layers = c.site.num_layers;
    args.kv_heads = c.kv_heads();
  }
  static void poison(Tensor &t) { t.fill_(std::numeric_limits<Real>::quiet_NaN()); }
  void forward() {
    poison(o), poison(lse);
    entry_forward<Real>(entry)(args);
  }
  void backward() {
    poison(dq), poison(dk), poison(dv);
    for (auto &t : dfeat) poison(t);
    for (auto &t : dprm) poison(t);
    entry_backward<Real>(entry)(args);
  }
  Outputs outputs(const Manifest &man) const {
    auto d = [](const Tensor &t) { return t.to(at::kDouble); };
    Outputs out = {{"o", d(o)}, {"lse", d(lse)}, {"dq", d(dq)}, {"dk", d(dk)}, {"dv", d(dv)}};
    for (size_t n = 0; n < dfeat.size(); ++n) out["dfeature:" + man.features[n].name] = d(dfeat[n]);
    for (size_t n = 0; n < dprm.size(); ++n) out["dparam:" + man.params[n].name] = d(dprm[n]);
    return out;
  }
};

template <class Real> Outputs run_kernel(const KernelEntry &e, const Manifest &man, const Cell &c) {
  KernelRun<Real> run(e, c);
  run.forward();
  if (c.forward_only) return {{"o", run.o.to(at::kDouble)}, {"lse", run.lse.to(at::kDouble)}};
  run.backward();
  return run.outputs(man);
}

// fused_attention through the kernels use_kernels(dtype) installs (the emulated CUDA kernels of
// ape-check --cuda), on float32 copies of the cell's inputs, gradients by autograd: o, dq, dk,
// dv, the features' and trainable params' gradients (fixed params: zero, as the kernels write).
Outputs run_installed(const KernelEntry &e, const Manifest &man, const Cell &c) {
  auto leaf = [](const Tensor &t, bool grad) {
    return t.to(at::kFloat).detach().clone().set_requires_grad(grad);
  };
  Tensor q = leaf(c.q, true), k = leaf(c.k, true), v = leaf(c.v, true);
  std::vector<Tensor> inputs = {q, k, v}, feats, prms;
  std::vector<std::string> names = {"dq", "dk", "dv"};
  for (size_t n = 0; n < c.features.size(); ++n) {
    feats.push_back(leaf(c.features[n], true));
    inputs.push_back(feats.back()), names.push_back("dfeature:" + man.features[n].name);
  }
  for (size_t n = 0; n < c.params.size(); ++n) {
    prms.push_back(leaf(c.params[n], man.params[n].trainable));
    if (man.params[n].trainable) inputs.push_back(prms.back()), names.push_back("dparam:" + man.params[n].name);
  }
  c10::AutoGradMode grad_mode(true);
  const Tensor o = fused_attention(e, q, k, v, feats, prms, c.scale);
  auto grads = torch::autograd::grad({o}, inputs, {c.dout.to(at::kFloat)}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  Outputs out;
  out["o"] = o.detach().to(at::kDouble);
  for (size_t n = 0; n < inputs.size(); ++n)
    out[names[n]] = grads[n].defined() ? grads[n].to(at::kDouble) : at::zeros_like(inputs[n], kF64);
  for (size_t n = 0; n < c.params.size(); ++n)
    if (!man.params[n].trainable) out["dparam:" + man.params[n].name] = at::zeros_like(c.params[n]);
  return out;
}

// The decode schedule of a cell of T tokens (ape/cpu/decode.h, ape-generate's cache): a prompt of
// ceil(T / 2) tokens, two steps of one, the rest in one step. At T = 150: a prompt across the
// first 64-tile boundary, single tokens, and a step of 73 (longer than a query tile) across the
// second.
std::vector<int64_t> decode_steps(int64_t T) {
  std::vector<int64_t> steps = {(T + 1) / 2};
  int64_t left = T - steps[0];
  for (int i = 0; i < 2 && left > 0; ++i) steps.push_back(1), --left;
  if (left > 0) steps.push_back(left);
  return steps;
}

std::string steps_text(const std::vector<int64_t> &steps) {
  std::string s;
  for (int64_t n : steps) s += (s.empty() ? "" : "+") + std::to_string(n);
  return s;
}

// The cell's tokens through the kernel's decode steps in precision Real, `steps` tokens at a time
// into one cache: o and lse of every step's new rows, in order, as [B, H, T, D] and [B, H, T] in
// fp64 (NaN where no step wrote).
// Tokens of capacity a decode check's cache has beyond the cell's, as ape-generate's caches do (its
// row pitch then differs from the tokens decoded).
constexpr int64_t kDecodeSpare = 13;

template <class Real>
Outputs run_decode(const KernelEntry &e, const Cell &c, const std::vector<int64_t> &steps) {
  constexpr at::ScalarType kType = std::is_same_v<Real, float> ? at::kFloat : at::kDouble;
  const CheckShape &s = c.shape;
  auto cvt = [&](const Tensor &t) { return t.to(kType).contiguous(); };
  const Tensor q = cvt(c.q), k = cvt(c.k), v = cvt(c.v);
  std::vector<Tensor> feat, prm;
  std::vector<const Real *> prm_p;
  for (const auto &f : c.features) feat.push_back(cvt(f));
  for (const auto &t : c.params) prm.push_back(cvt(t)), prm_p.push_back(prm.back().data_ptr<Real>());
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  Tensor o = at::full({s.B, s.H, s.T, s.D}, nan, at::dtype(kType));
  Tensor lse = at::full({s.B, s.H, s.T}, nan, at::dtype(kType));
  DecodeCache<Real> cache;
  cache.capacity = s.T + kDecodeSpare;
  int64_t L0 = 0;
  for (int64_t n : steps) {
    auto cut = [&](const Tensor &t) { return t.narrow(2, L0, n).contiguous(); };
    const Tensor qs = cut(q), ks = cut(k), vs = cut(v);
    std::vector<Tensor> fs;
    std::vector<const Real *> fp;
    for (const auto &f : feat) fs.push_back(cut(f)), fp.push_back(fs.back().data_ptr<Real>());
    Tensor os = at::full({s.B, s.H, n, s.D}, nan, at::dtype(kType));
    Tensor ls = at::full({s.B, s.H, n}, nan, at::dtype(kType));
    DecodeArgs<Real> a{};
    a.B = s.B, a.H = s.H, a.n = n, a.D = s.D;
    a.q = qs.data_ptr<Real>(), a.k = ks.data_ptr<Real>(), a.v = vs.data_ptr<Real>();
    a.features = fp.data(), a.params = prm_p.data();
    a.scale = static_cast<Real>(c.scale);
    a.o = os.data_ptr<Real>(), a.lse = ls.data_ptr<Real>();
    a.layer = c.site.layer, a.num_layers = c.site.num_layers;
    a.kv_heads = c.kv_heads();
    if constexpr (std::is_same_v<Real, float>) e.decode->step_f32(cache, a);
    else e.decode->step_f64(cache, a);
    o.narrow(2, L0, n).copy_(os), lse.narrow(2, L0, n).copy_(ls);
    L0 += n;
  }
  return {{"o", o.to(at::kDouble)}, {"lse", lse.to(at::kDouble)}};
}

// What each decode step must give: rows L0 .. L - 1 of the reference over the first L tokens (a
// kernel may read the length: dynamic NTK's base, xPos's centre); an attention transition
// transforms the prompt (the first step) only, as the decode steps do (docs/decoding.md).
Outputs decode_reference(const SpecReference &ref, const Manifest &man, const Cell &c,
                         const std::vector<int64_t> &steps, at::ScalarType dtype) {
  const CheckShape &s = c.shape;
  Tensor o = at::empty({s.B, s.H, s.T, s.D}, kF64), lse = at::empty({s.B, s.H, s.T}, kF64);
  int64_t L0 = 0;
  for (int64_t n : steps) {
    const int64_t L = L0 + n;
    Cell p = c;
    p.shape.T = L;
    p.q = c.q.narrow(2, 0, L), p.k = c.k.narrow(2, 0, L), p.v = c.v.narrow(2, 0, L);
    p.dout = c.dout.narrow(2, 0, L);
    for (auto &f : p.features) f = f.narrow(2, 0, L);
    p.forward_only = true;
    if (L0 > 0) p.site = {0, 0, p.site.round_bf16};  // (a transition transforms the prompt only)
    const Outputs r = run_reference(ref, man, p, dtype);
    o.narrow(2, L0, n).copy_(r.at("o").narrow(2, L0, n));
    lse.narrow(2, L0, n).copy_(r.at("lse").narrow(2, L0, n));
    L0 = L;
  }
  return {{"o", o}, {"lse", lse}};
}

struct Error {
  double max_abs = 0, rel = 0;  // rel = max_abs / max(1, max |ref|); NaN / inf on a mismatch
  double size = 0;              // max |ref| / max(1, max |ref|): the rel of a kernel that wrote zeros
};

// Where the reference is infinite (the -inf lse of a row with no visible key), the kernel must
// give the same value; elsewhere the largest difference (NaN when the kernel gave a NaN). A NaN in
// the reference is never right (a spec computing log(-1) or 0 / 0): the row fails, even where the
// kernel computes the same NaN.
Error compare(const Tensor &got, const Tensor &ref) {
  if (got.sizes() != ref.sizes()) return {INFINITY, INFINITY};
  if (ref.numel() == 0) return {};
  if (at::isnan(ref).any().item<bool>()) return {NAN, NAN};
  const Tensor finite = at::isfinite(ref);
  const Tensor odd = finite.logical_not();
  if (odd.any().item<bool>() && !got.masked_select(odd).eq(ref.masked_select(odd)).all().item<bool>())
    return {INFINITY, INFINITY};
  if (!finite.any().item<bool>()) return {};
  const Tensor diff = (got.masked_select(finite) - ref.masked_select(finite)).abs();
  const double err = at::isnan(diff).any().item<bool>() ? NAN : diff.max().item<double>();
  const double mag = ref.masked_select(finite).abs().max().item<double>();
  return {err, err / std::max(1.0, mag), mag / std::max(1.0, mag)};
}

// The worst row per (quantity, precision): the largest error relative to its tolerance.
struct Table {
  std::vector<CheckRow> rows;
  std::map<std::pair<std::string, std::string>, size_t> at;
  bool verbose = false;
  // Passing rows whose tolerance reached half the reference's size (CheckRow::size): "quantity
  // precision" and their cells, in order; not counted as checks (zeros would pass them too).
  std::vector<std::pair<std::string, std::vector<std::string>>> unresolved;
  void add(CheckRow r) {
    if (r.size > 0 && r.rel <= r.tol && r.tol >= 0.5 * r.size) {  // (a failure is reported as one)
      const std::string key = r.quantity + " " + r.precision;
      for (auto &[k, cells] : unresolved)
        if (k == key) return cells.push_back(r.shape);
      return unresolved.push_back({key, {r.shape}});
    }
    r.pass = r.rel <= r.tol;  // false for NaN
    if (verbose) return rows.push_back(r);
    const auto key = std::make_pair(r.quantity, r.precision);
    auto it = at.find(key);
    if (it == at.end()) {
      at[key] = rows.size();
      rows.push_back(r);
      return;
    }
    CheckRow &old = rows[it->second];
    const bool pass = old.pass && r.pass;
    const double ratio_old = old.rel / old.tol, ratio_new = r.rel / r.tol;
    if (!(ratio_new <= ratio_old) || (!r.pass && old.pass)) old = r;
    old.pass = pass;
  }
};

// What an fp32 param gradient's floor is multiplied by: sqrt of the N = B H T (T+1)/2 query-key
// pairs it sums (the floor was measured on gradients of about unit sensitivity per pair), or the
// param's sensitivity to the rounding of Delta where that is larger (run_reference: a row term
// w C_i with C a cumulative sum up to 150 has sum_ij dS_ij C_i = 0 exactly, and a correct
// kernel's Delta = dO . o, rounded otherwise than the reference's sum_j P_ij dP_ij, left 2.3e-3
// against a floor of 1.2e-3 counted in pairs), times sqrt(D / 16) from head dim 16 up (dS =
// P (dP - Delta), dot products of D terms: at T = 1 and D 240 a gradient exactly 0 came out 3.8e-6
// from that rounding against a floor of 2e-6).
double param_floor_scale(const CheckShape &s, const Outputs &ref, const std::string &quantity) {
  const double pairs = double(s.B) * double(s.H) * double(s.T) * double(s.T + 1) / 2.0;
  double size = std::sqrt(pairs);
  const std::string name = quantity.substr(std::string("dparam:").size());
  if (auto it = ref.find("sensitivity:" + name); it != ref.end()) size = std::max(size, it->second.item<double>());
  return size * std::sqrt(std::max(1.0, double(s.D) / 16.0));
}

// An fp32 row: tolerance max(factor x yardstick, floor), the yardstick (the fp32 reference's own
// error y) taken up to fp32_yardstick_max: a reference that single precision has lost shares the
// kernel's fp32 mistakes (a count of coordinates computed in floats once passed at 15% error).
CheckRow fp32_row(const std::string &q, const std::string &prec, const std::string &cell,
                  const Error &e, const Error &y, double floor, const CheckOptions &opt) {
  const double yard = std::min(y.rel, opt.fp32_yardstick_max);
  CheckRow row{q, prec, cell, e.max_abs, e.rel, y.rel, std::max(opt.fp32_factor * yard, floor)};
  row.size = e.size;  // (a gradient the fp32 tolerance cannot resolve: listed as not checked)
  if (std::isnan(y.rel)) {
    row.tol = opt.fp32_factor * opt.fp32_yardstick_max;
    row.note = "the reference is NaN here (the fp32 one against the fp64 one): the spec computes NaN";
  } else if (!(y.rel <= opt.fp32_yardstick_max)) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "the fp32 reference itself is off by %.2e: single precision loses this quantity, "
                  "so its tolerance stops at %g x %.0e (--fp32-yardstick-max)",
                  y.rel, opt.fp32_factor, opt.fp32_yardstick_max);
    row.note = buf;
  }
  return row;
}

// A bf16 row: tolerance max(bf16_tol, factor x yardstick), the yardstick the reference's own change
// under the kernels' roundings (ReferenceSite::round_bf16; a param gradient's from stochastic
// draws, param_yardsticks), the factor bf16_param_factor for a param gradient and bf16_factor
// elsewhere (CheckOptions, with the measurements). A passing row whose tolerance reaches half the
// reference's normalised size would pass a kernel that wrote zeros too: it goes to the table's
// unresolved list, not counted as a check (Table::add; before, a floor of 4e-3 sqrt(pairs) gave
// param rows tolerances of 0.6-1.2, which gradients of zeros passed). A failing row fails as any
// other. A NaN yardstick leaves the floor.
void bf16_row(Table &table, const std::string &q, const std::string &prec, const std::string &cell,
              const Error &e, const Error &y, const CheckOptions &opt, const std::string &note = "") {
  const double yard = std::isfinite(y.rel) ? y.rel : 0.0;
  const double factor = q.find("dparam:") != std::string::npos ? opt.bf16_param_factor : opt.bf16_factor;
  CheckRow row{q, prec, cell, e.max_abs, e.rel, yard, std::max(opt.bf16_tol, factor * yard)};
  row.note = note;
  row.size = e.size;
  table.add(row);
}

// fp64 central differences of L = sum(o . dO) through the kernel's forward against its backward,
// Richardson-extrapolated, (4 D(h/2) - D(h)) / 3: the truncation error h^2 |L^(3)| / 6 of one
// central difference failed a correct kernel where the third derivative is large (ExPE's n b beside
// xPos at n ~ 600: 1.3e-6 of a gradient of 3,500). The tolerance 1e-6 of max(1e-2, max |gradient|)
// also takes the rounding of L itself, 3 eps sum |o . dO| / h (eps = 2^-52; Richardson's sum of
// four evaluations at h/2 and h has about three times one difference's rounding): a gradient that is
// exactly 0 (a term the softmax cancels) left 1.9e-8 at T = 600, D = 32, against 1e-8.
void finite_differences(const KernelEntry &e, const Manifest &man, const Cell &c, int entries,
                        Table &table) {
  KernelRun<double> base(e, c);
  base.forward();
  base.backward();
  const double h = 1e-5;
  const double noise = 3 * std::ldexp(1.0, -52) * (base.o * base.dout).abs().sum().item<double>() / h;
  KernelRun<double> probe(e, c);
  const Tensor w = base.dout;
  auto loss = [&]() {
    probe.forward();
    return (probe.o * w).sum().item<double>();
  };
  struct Input {
    std::string name;
    Tensor value, grad;
  };
  std::vector<Input> inputs = {{"q", probe.q, base.dq}, {"k", probe.k, base.dk}, {"v", probe.v, base.dv}};
  for (size_t n = 0; n < probe.feat.size(); ++n)
    inputs.push_back({"feature:" + man.features[n].name, probe.feat[n], base.dfeat[n]});
  for (size_t n = 0; n < probe.prm.size(); ++n)
    if (man.params[n].trainable) inputs.push_back({"param:" + man.params[n].name, probe.prm[n], base.dprm[n]});
  for (Input &in : inputs) {
    const Tensor g = in.grad.flatten();
    std::vector<int64_t> picks = {g.abs().argmax().item<int64_t>()};
    for (int r = 1; r < entries && r < g.numel(); ++r) {
      int64_t e2 = at::randint(g.numel(), {1}, at::kLong).item<int64_t>();
      while (std::find(picks.begin(), picks.end(), e2) != picks.end()) e2 = (e2 + 1) % g.numel();
      picks.push_back(e2);
    }
    double *x = in.value.data_ptr<double>();
    const double norm = std::max(1e-2, g.abs().max().item<double>());
    CheckRow row{"fd:" + in.name, "fp64", c.label()};
    row.tol = 1e-6 + noise / norm;
    std::ostringstream note;
    for (int64_t p : picks) {
      const double fd = (4 * central_difference(x, p, h / 2, loss) - central_difference(x, p, h, loss)) / 3;
      const double an = g[p].item<double>();
      const double err = std::abs(fd - an);
      if (!(err <= row.max_abs)) row.max_abs = err;
      note << (note.tellp() ? ", " : "") << "[" << p << "] " << an;
    }
    row.rel = row.max_abs / norm;
    row.note = "entries " + note.str();
    table.add(row);
  }
}

// The cell through the kernel's KV-cache decode steps (decode_steps), fp64 and fp32, against the
// reference over the tokens so far: rows decode:o and decode:lse with the forward's tolerances.
void check_decode(const KernelEntry &entry, const SpecReference &ref, const Manifest &man,
                  const Cell &c, const CheckOptions &opt, Table &table, const std::string &kind = "decode:",
                  const Cell *reference_cell = nullptr, const std::string &label = "") {
  // (kind "grouped-decode:": c with grouped k, v, reference_cell with them repeated to every query
  // head, label naming the key heads: check_grouped)
  const Cell &rc = reference_cell ? *reference_cell : c;
  const std::string cell = label.empty() ? c.label() : label;
  const std::vector<int64_t> steps = decode_steps(c.shape.T);
  const std::string schedule = "decode steps of " + steps_text(steps) + " tokens";
  Outputs d64, d32;
  try {
    if (!entry.decode || !entry.decode->step_f64 || !entry.decode->step_f32)
      throw std::runtime_error("the kernel has no fp64 and fp32 decode steps");
    d64 = run_decode<double>(entry, c, steps);
    d32 = run_decode<float>(entry, c, steps);
  } catch (const std::exception &e) {
    for (const char *q : {"o", "lse"}) {
      CheckRow row{kind + q, "fp64", cell, NAN, NAN, -1, opt.fp64_tol};
      row.note = schedule + ": " + e.what();
      table.add(row);
    }
    return;
  }
  const Outputs r64 = decode_reference(ref, man, rc, steps, at::kDouble);
  const Outputs r32 = decode_reference(ref, man, rc, steps, at::kFloat);
  for (const char *name : {"o", "lse"}) {
    const std::string q = kind + name;
    const Error e64 = compare(d64.at(name), r64.at(name));
    CheckRow row{q, "fp64", cell, e64.max_abs, e64.rel, -1, opt.fp64_tol};
    row.note = schedule;
    table.add(row);
    CheckRow r32row = fp32_row(q, "fp32", cell, compare(d32.at(name), r64.at(name)),
                               compare(r32.at(name), r64.at(name)), opt.fp32_floor, opt);
    r32row.note = r32row.note.empty() ? schedule : schedule + "; " + r32row.note;
    table.add(r32row);
  }
}

// The cell through the emulated CUDA decode steps of `dtype` (CheckOptions::cuda_decode; the
// cell's q, k, v rounded to bf16 already for "bf16"), against the reference over the tokens so
// far: rows decode:o and decode:lse of precision cuda-DTYPE with the CUDA rows' tolerances.
// The references of a cell's CUDA decode rows, computed at the first architecture's rows and
// kept for the others' (they depend on the cell and the dtype only).
struct DecodeReferences {
  bool ready = false;
  Outputs r64, r32, y64;
};

void check_cuda_decode(const SpecReference &ref, const Manifest &man, const Cell &c,
                       const std::string &dtype, const std::string &prec, const CheckOptions &opt, Table &table,
                       DecodeReferences &refs) {
  const bool bf16 = dtype == "bf16";
  const std::vector<int64_t> steps = decode_steps(c.shape.T);
  if (!refs.ready) {
    refs.r64 = decode_reference(ref, man, c, steps, at::kDouble);
    if (!bf16) refs.r32 = decode_reference(ref, man, c, steps, at::kFloat);
    if (bf16) {  // the yardstick: the reference under the kernels' roundings
      Cell rounded = c;
      rounded.site.round_bf16 = true;
      refs.y64 = decode_reference(ref, man, rounded, steps, at::kDouble);
    }
    refs.ready = true;
  }
  const Outputs &r64 = refs.r64, &r32 = refs.r32, &y64 = refs.y64;
  // The split path (FlashDecoding) exists for 16-bit inputs only (the flash forward): bf16 also
  // runs with the keys split in up to 3, rows decode-split:o and decode-split:lse.
  for (const int splits : bf16 ? std::vector<int>{0, 3} : std::vector<int>{0}) {
    const std::string schedule = "decode steps of " + steps_text(steps) + " tokens, keys split " +
                                 (splits ? "in up to " + std::to_string(splits) : std::string("as the device decides"));
    const std::string kind = splits ? "decode-split:" : "decode:";
    Outputs got;
    try {
      const auto [o, lse] = opt.cuda_decode(dtype, c.q, c.k, c.v, c.features, c.params, c.scale, steps, splits);
      got = {{"o", o.to(at::kDouble)}, {"lse", lse.to(at::kDouble)}};
    } catch (const std::exception &e) {
      for (const char *name : {"o", "lse"}) {
        CheckRow row{kind + name, prec, c.label(), NAN, NAN, -1, bf16 ? opt.bf16_tol : opt.fp32_floor};
        row.note = schedule + ": " + e.what();
        table.add(row);
      }
      continue;
    }
    for (const char *name : {"o", "lse"}) {
      const std::string q = kind + name;
      const Error e = compare(got.at(name), r64.at(name));
      if (bf16) {
        bf16_row(table, q, prec, c.label(), e, compare(y64.at(name), r64.at(name)), opt, schedule);
        continue;
      }
      CheckRow row = fp32_row(q, prec, c.label(), e, compare(r32.at(name), r64.at(name)), opt.fp32_floor, opt);
      row.note = row.note.empty() ? schedule : schedule + "; " + row.note;
      table.add(row);
    }
  }
}

// The kernel's fp64 and fp32 rows of the quantities `order` of one cell (k64, k32 against the
// references r64, r32 of shape s), named prefix + quantity: fp64 within fp64_tol, fp32 by the
// yardstick rule (fp32_row), a param gradient's floor scaled by param_floor_scale.
void kernel_rows(Table &table, const std::vector<std::string> &order, const std::string &prefix,
                 const std::string &cell, const CheckShape &s, const Outputs &k64, const Outputs &k32,
                 const Outputs &r64, const Outputs &r32, const CheckOptions &opt) {
  for (const std::string &q : order) {
    const Tensor &want = r64.at(q);
    const Error e64 = compare(k64.at(q), want);
    table.add({prefix + q, "fp64", cell, e64.max_abs, e64.rel, -1, opt.fp64_tol});
    const double floor = q.rfind("dparam:", 0) == 0 ? opt.fp32_param_floor * param_floor_scale(s, r64, q)
                                                    : opt.fp32_floor;
    table.add(fp32_row(prefix + q, "fp32", cell, compare(k32.at(q), want), compare(r32.at(q), want), floor, opt));
  }
}

// The grouped cell of `cells` (check_grouped): the shape (its H the query heads) and the group
// size p, H / p key heads; none where no cell fits.
std::optional<std::pair<CheckShape, int64_t>> grouped_shape(const Manifest &man, const std::vector<CheckShape> &cells) {
  const CheckShape *widest = nullptr;
  for (const CheckShape &s : cells)
    if (s.T > 1 && (!widest || s.H > widest->H || (s.H == widest->H && s.T > widest->T))) widest = &s;
  if (!widest || (man.model_dim_hint && widest->H < 2)) return std::nullopt;
  CheckShape shape = *widest;
  int64_t p = 2;
  if (man.model_dim_hint) {
    while (shape.H % p != 0 || (p * p == shape.H && p < shape.H)) ++p;
  } else {
    p = shape.H == 2 ? 3 : 2;
    shape.H *= p;
  }
  return std::make_pair(shape, p);
}

// dk and dv of a reference over k and v repeated p times (repeat_interleave on heads) summed over
// each group of p: the gradients of the key heads themselves.
Outputs summed_over_groups(Outputs o, int64_t p) {
  if (p <= 1) return o;
  for (const char *g : {"dk", "dv"}) {
    const Tensor t = o.at(g);
    o[g] = t.view({t.size(0), t.size(1) / p, p, t.size(2), t.size(3)}).sum(2);
  }
  return o;
}

// The bf16 yardstick of each trainable param's gradient: a sum over every query-key pair whose
// terms cancel, so that one draw of the rounding (the nearest, as the kernels round) is a poor
// estimate of how far the kernels' sum may stray: ALiBi's learned slopes at 1x2x150x128 measured
// 0.1 to 3.6 times that draw over seeds 1-4, 9.9 on the default grid. Instead the root mean square
// of kParamDraws stochastic roundings' normalised errors (ReferenceSite::stochastic_seed; seeds from
// ape-check's, so a run repeats), divided by sqrt(2): a stochastic rounding's error has twice the
// variance of rounding to nearest (ulp^2 / 6 against ulp^2 / 12 for a uniform fraction), and a sum
// of many such errors twice the variance too. `rc` the reference's cell (k and v of every query
// head), `group` the grouped rows' group size (dk, dv summed; params are per query head already).
constexpr int kParamDraws = 4;
std::map<std::string, double> param_yardsticks(const SpecReference &ref, const Manifest &man, const Cell &rc,
                                               int64_t group, const Outputs &r64, uint64_t seed) {
  std::map<std::string, double> sum_sq;
  std::map<std::string, int> finite;  // the draws whose change is finite
  for (const ParamSpec &p : man.params)
    if (p.trainable) sum_sq["dparam:" + p.name] = 0;
  if (sum_sq.empty()) return sum_sq;
  for (int d = 1; d <= kParamDraws; ++d) {
    Cell drawn = rc;
    drawn.site.round_bf16 = true;
    drawn.site.round_kv_grads = group <= 1;
    drawn.site.stochastic_seed = seed * 7919u + static_cast<uint64_t>(d);
    const Outputs y = run_reference(ref, man, drawn, at::kDouble);
    for (auto &[q, acc] : sum_sq) {
      const double rel = compare(y.at(q), r64.at(q)).rel;
      if (std::isfinite(rel)) acc += rel * rel, ++finite[q];
    }
  }
  for (auto &[q, acc] : sum_sq) acc = finite[q] ? std::sqrt(acc / finite[q] / 2) : NAN;  // (NaN: the floor)
  return sum_sq;
}

// Grouped-query attention (AttnArgs::kv_heads, docs/frameworks.md) at the grid's cell with the
// most heads (T > 1): its H heads times p, k and v of its H heads (groups of p, query head h
// reading key head h / p; p = 2, or 3 where H is 2, so that the group size and the key heads'
// count differ: with groups of 2 from 2 key heads, h / 2 read the right head whether a kernel
// divided by the group size or by the key heads' count), or, where the spec pins model_dim (so
// H), k and v of H / p heads (p the smallest divisor of H above 1 other than sqrt(H); no rows
// where H is 1). Through the kernel's fp64 and fp32 forward and backward (and its decode steps,
// with `decode`), against the reference over k and v repeated to every query head, dk and dv summed
// over each group: rows grouped:QUANTITY and grouped-decode:o, :lse with the tolerances of the rows
// without groups.
void check_grouped(const KernelEntry &entry, const SpecReference &ref, const Manifest &man,
                   const std::vector<CheckShape> &grid, const CheckOptions &opt, Table &table) {
  const auto grouped = grouped_shape(man, grid);
  if (!grouped) return;
  const auto &[shape, p] = *grouped;
  const int64_t kv = shape.H / p;
  Cell c = make_cell(man, shape, opt.seed * 104729u);
  c.k = c.k.narrow(1, 0, kv).contiguous(), c.v = c.v.narrow(1, 0, kv).contiguous();
  Cell repeated = c;
  repeated.k = c.k.repeat_interleave(p, 1), repeated.v = c.v.repeat_interleave(p, 1);
  const std::string label = c.label() + " kv" + std::to_string(kv);
  const Outputs r64 = summed_over_groups(run_reference(ref, man, repeated, at::kDouble), p);
  const Outputs r32 = summed_over_groups(run_reference(ref, man, repeated, at::kFloat), p);
  Outputs k64, k32;
  try {
    k64 = run_kernel<double>(entry, man, c);
    k32 = run_kernel<float>(entry, man, c);
  } catch (const std::exception &e) {
    CheckRow row{"grouped:o", "fp64", label, NAN, NAN, -1, opt.fp64_tol};
    row.note = e.what();
    table.add(row);
    return;
  }
  std::vector<std::string> order = {"o", "lse", "dq", "dk", "dv"};
  for (const FeatureSpec &f : man.features) order.push_back("dfeature:" + f.name);
  for (const ParamSpec &prm : man.params) order.push_back("dparam:" + prm.name);
  kernel_rows(table, order, "grouped:", label, shape, k64, k32, r64, r32, opt);
  // (a kernel without decode steps: its decode rows say so already)
  if (opt.decode && entry.decode && entry.decode->step_f64 && entry.decode->step_f32)
    check_decode(entry, ref, man, c, opt, table, "grouped-decode:", &repeated, label);
}

}  // namespace

CheckReport check_kernel(const KernelEntry &entry, const SpecReference &ref, const CheckOptions &opt) {
  CheckReport report;
  const Manifest &man = manifest_of(entry);
  if (!entry.forward_f64 || !entry.backward_f64 || !entry.forward_f32 || !entry.backward_f32)
    throw std::runtime_error(std::string("kernel ") + entry.name + " lacks fp32 or fp64 kernels");

  // The kernel's interface (manifest) must be the spec's, less what nothing reads once the regions
  // are composed (left out of the kernel, with apec's warning; checked below).
  std::vector<SpecReference::ParamInfo> rp;
  std::vector<std::string> left_out, rf;
  for (const SpecReference::ParamInfo &p : ref.params()) {
    const bool in_kernel = std::any_of(man.params.begin(), man.params.end(),
                                       [&](const ParamSpec &m) { return m.name == p.name; });
    if (in_kernel) rp.push_back(p);
    else left_out.push_back("param '" + p.name + "'");
  }
  for (const std::string &f : ref.features()) {
    const bool in_kernel = std::any_of(man.features.begin(), man.features.end(),
                                       [&](const FeatureSpec &m) { return m.name == f; });
    if (in_kernel) rf.push_back(f);
    else left_out.push_back("token feature '" + f + "'");
  }
  if (rp.size() != man.params.size())
    report.problems.push_back("the spec declares " + std::to_string(rp.size()) +
                              " params, the kernel's manifest " + std::to_string(man.params.size()));
  for (size_t n = 0; n < std::min(rp.size(), man.params.size()); ++n) {
    const ParamSpec &mp = man.params[n];
    std::string shape;
    for (const DimSpec &d : mp.shape) shape += (shape.empty() ? "" : ",") + d.str();
    std::string rshape;
    for (const std::string &d : rp[n].shape) rshape += (rshape.empty() ? "" : ",") + d;
    if (rp[n].name != mp.name || rp[n].trainable != mp.trainable || rshape != shape)
      report.problems.push_back("param " + std::to_string(n) + ": the spec has '" + rp[n].name +
                                "' [" + rshape + "]" + (rp[n].trainable ? " trainable" : "") +
                                ", the kernel '" + mp.name + "' [" + shape + "]" +
                                (mp.trainable ? " trainable" : ""));
  }
  std::vector<std::string> mf;
  for (const FeatureSpec &f : man.features) mf.push_back(f.name);
  if (mf != rf)
    report.problems.push_back("the spec's features differ from the kernel's manifest's");
  if (ref.has_embedding_table() != (entry.embed_table != nullptr))
    report.problems.push_back(std::string("the spec ") + (ref.has_embedding_table() ? "has" : "has no") +
                              " fixed position table, the kernel " +
                              (entry.embed_table ? "has one" : "none"));
  if (ref.has_transition() != man.inference_only)
    report.problems.push_back(std::string("the spec ") +
                              (ref.has_transition() ? "has an" : "has no") +
                              " attention transition, the kernel is " +
                              (man.inference_only ? "inference-only" : "a training kernel"));
  if (!report.problems.empty()) return report;

  const std::vector<CheckShape> grid = fit_grid(man, opt.grid);

  // What the kernel leaves out must not matter: the reference's o and lse the same, bit for bit,
  // with two values of it (a kernel that dropped something the spec reads fails here).
  if (!left_out.empty() && !grid.empty()) {
    std::string names;
    for (const std::string &n : left_out) names += (names.empty() ? "" : ", ") + n;
    const CheckShape &at_shape = *std::max_element(grid.begin(), grid.end(), [](const CheckShape &x, const CheckShape &y) {
      return x.T * x.H * x.B < y.T * y.H * y.B;
    });
    Cell c = make_cell(man, at_shape, opt.seed);
    c.forward_only = true;
    if (man.inference_only) c.site.layer = 0, c.site.num_layers = opt.num_layers;
    const Outputs a = run_reference(ref, man, c, at::kDouble, 0.375), b = run_reference(ref, man, c, at::kDouble, -1.25);
    auto same = [](const Tensor &x, const Tensor &y) {
      return (x.eq(y) | (x.isnan() & y.isnan())).all().item<bool>();
    };
    if (!same(a.at("o"), b.at("o")) || !same(a.at("lse"), b.at("lse")))
      report.problems.push_back("the kernel leaves out " + names +
                                ", but the spec's output depends on it (" + at_shape.str() + ")");
    else
      report.notes.push_back("not in the kernel: " + names +
                             " (nothing reads it once the regions are composed, as apec warns; the spec's output "
                             "does not depend on it, at " + at_shape.str() + ")");
    if (!report.problems.empty()) return report;
  }

  Table table;
  table.verbose = opt.verbose;
  // An inference-only kernel (an attention transition) has no backward: o and lse at every layer
  // of a model of opt.num_layers, the transformed ones and the others.
  const bool forward_only = man.inference_only;
  if (forward_only && opt.num_layers < 1)
    throw std::runtime_error("an attention transition is checked at the layers of a model: "
                             "num_layers must be at least 1");
  double transition_effect = 0;  // the largest change of the fp64 reference's o by a layer
  for (size_t cell = 0; cell < grid.size(); ++cell) {
    Cell base = make_cell(man, grid[cell], opt.seed * 1000003u + cell);
    base.forward_only = forward_only;
    std::vector<Cell> sites;
    if (!forward_only) sites.push_back(base);
    for (int64_t l = 0; forward_only && l < opt.num_layers; ++l) {
      sites.push_back(base);
      sites.back().site = {l, opt.num_layers};
    }
    Tensor plain_o;  // the untransformed reference (no layer), for transition_effect
    if (forward_only) plain_o = run_reference(ref, man, base, at::kDouble).at("o");
    for (const Cell &c : sites) {
      const Outputs r64 = run_reference(ref, man, c, at::kDouble);
      const Outputs r32 = run_reference(ref, man, c, at::kFloat);
      const Outputs k64 = run_kernel<double>(entry, man, c);
      const Outputs k32 = run_kernel<float>(entry, man, c);
      if (forward_only)
        transition_effect = std::max(transition_effect,
                                     (r64.at("o") - plain_o).abs().max().item<double>());
      std::vector<std::string> order = {"o", "lse"};
      if (!forward_only) {
        for (const char *g : {"dq", "dk", "dv"}) order.push_back(g);
        for (const FeatureSpec &f : man.features) order.push_back("dfeature:" + f.name);
        for (const ParamSpec &p : man.params) order.push_back("dparam:" + p.name);
      }
      kernel_rows(table, order, "", c.label(), c.shape, k64, k32, r64, r32, opt);
      if (opt.decode) check_decode(entry, ref, man, c, opt, table);
    }
  }
  if (forward_only) {
    // A check that never reaches a transformed row could not fail: say so.
    if (!(transition_effect > 0))
      report.problems.push_back(
          "not checked: no shape of the grid reaches a row the attention transition transforms at " +
          std::to_string(opt.num_layers) + " layers (the layers from first_layer to layers - 1 - skip_last are "
          "transformed: 4 layers at the least with the defaults, first_layer 1 and skip_last 2; and only where "
          "T >= 5 (layers + divisor_offset)); give longer shapes with --shapes or more --layers");
    report.rows = table.rows;
    return report;
  }
  check_grouped(entry, ref, man, grid, opt, table);
  // The emulated CUDA kernels (CheckOptions::cuda_dtypes), at the cells of their head dims, for
  // every architecture (CheckOptions::cuda_archs) and dtype. `group` > 1: k and v of H / group
  // heads, against the reference over them repeated to every query head, dk and dv summed over
  // each group (rows grouped:QUANTITY; no decode rows).
  // The architectures posed as (sm_80 alone without pose_cuda), and the pose to restore after
  // them, on every way out.
  const std::vector<int> archs = opt.pose_cuda && !opt.cuda_archs.empty() ? opt.cuda_archs : std::vector<int>{80};
  struct PoseBack {
    const CheckOptions &opt;
    ~PoseBack() {
      if (opt.pose_cuda) opt.pose_cuda(0);
    }
  } pose_back{opt};
  auto cuda_rows = [&](const Cell &base, int64_t group, const std::string &prefix, const std::string &label) {
    for (const std::string &dtype : opt.cuda_dtypes) {
      const bool bf16 = dtype == "bf16";
      Cell c = base;
      if (bf16) {  // the kernel's inputs as it reads them, for the reference too
        auto round = [](const Tensor &t) { return t.to(at::kBFloat16).to(at::kDouble); };
        c.q = round(c.q), c.k = round(c.k), c.v = round(c.v), c.dout = round(c.dout);
      }
      Cell rc = c;  // the reference's cell: k and v of every query head
      if (group > 1) rc.k = c.k.repeat_interleave(group, 1), rc.v = c.v.repeat_interleave(group, 1);
      // (the references depend on the cell and the dtype, not on the architecture)
      const Outputs r64 = summed_over_groups(run_reference(ref, man, rc, at::kDouble), group);
      const Outputs r32 = bf16 ? Outputs{} : summed_over_groups(run_reference(ref, man, rc, at::kFloat), group);
      Outputs y64;  // bf16: the yardstick, the reference under the kernels' roundings
      if (bf16) {
        Cell rounded = rc;
        rounded.site.round_bf16 = true;
        rounded.site.round_kv_grads = group <= 1;  // (grouped: each group's sum rounded once, as the kernels)
        y64 = summed_over_groups(run_reference(ref, man, rounded, at::kDouble), group);
        if (group > 1)
          for (const char *g : {"dk", "dv"}) y64[g] = y64.at(g).to(at::kBFloat16).to(at::kDouble);
      }
      // bf16: a trainable param gradient's yardstick from stochastic draws (param_yardsticks)
      std::map<std::string, double> param_yard;
      if (bf16) param_yard = param_yardsticks(ref, man, rc, group, r64, opt.seed);
      DecodeReferences decode_refs;
      for (const int sm : archs) {
        // f32 runs the general path, every architecture's: once, at the first architecture
        // (sm_80's rows are cuda-*, another's smNN-*)
        if (dtype == "f32" && sm != archs.front()) continue;
        if (opt.pose_cuda) opt.pose_cuda(sm);
        const std::string prec = (sm == 80 ? std::string("cuda") : "sm" + std::to_string(sm)) + "-" + dtype;
        Outputs got;
        try {
          opt.use_kernels(dtype);
          got = run_installed(entry, man, c);
          opt.use_kernels("cpu");
        } catch (const std::exception &e) {
          opt.use_kernels("cpu");
          CheckRow row{prefix + "o", prec, label, NAN, NAN, -1, bf16 ? opt.bf16_tol : opt.fp32_floor};
          row.note = e.what();
          table.add(row);
          continue;
        }
        std::vector<std::string> order = {"o", "dq", "dk", "dv"};
        for (const FeatureSpec &f : man.features) order.push_back("dfeature:" + f.name);
        // (a fixed param's gradient is zeros in both: run_installed's and the reference's)
        for (const ParamSpec &p : man.params)
          if (p.trainable) order.push_back("dparam:" + p.name);
        for (const std::string &q : order) {
          const Error e = compare(got.at(q), r64.at(q));
          const CheckShape &s = c.shape;
          if (bf16) {
            Error y = compare(y64.at(q), r64.at(q));
            if (const auto it = param_yard.find(q); it != param_yard.end()) y.rel = it->second;
            bf16_row(table, prefix + q, prec, label, e, y, opt);
            continue;
          }
          const Error y = compare(r32.at(q), r64.at(q));
          const double floor = q.rfind("dparam:", 0) == 0 ? opt.fp32_param_floor * param_floor_scale(s, r64, q)
                                                          : opt.fp32_floor;
          table.add(fp32_row(prefix + q, prec, label, e, y, floor, opt));
        }
        if (group <= 1 && opt.decode && opt.cuda_decode)
          check_cuda_decode(ref, man, c, dtype, prec, opt, table, decode_refs);
      }
    }
  };
  std::vector<CheckShape> cuda_grid = grid, cuda_dims_grid;
  cuda_grid.insert(cuda_grid.end(), opt.cuda_cells.begin(), opt.cuda_cells.end());
  auto cuda_dim = [&](int64_t D) {
    return std::find(opt.cuda_head_dims.begin(), opt.cuda_head_dims.end(), D) != opt.cuda_head_dims.end();
  };
  for (size_t cell = 0; cell < cuda_grid.size() && opt.use_kernels; ++cell) {
    if (!cuda_dim(cuda_grid[cell].D)) continue;
    cuda_dims_grid.push_back(cuda_grid[cell]);
    const Cell base = make_cell(man, cuda_grid[cell], opt.seed * 1000003u + cell);  // the CPU rows' inputs
    cuda_rows(base, 1, "", base.label());
  }
  // Grouped-query attention through the CUDA kernels (the key heads read in place, the group sums)
  // at a cell of theirs, chosen as check_grouped chooses among the grid's.
  if (opt.use_kernels)
    if (const auto grouped = grouped_shape(man, cuda_dims_grid)) {
      const auto &[shape, p] = *grouped;
      Cell c = make_cell(man, shape, opt.seed * 104729u + 1);
      c.k = c.k.narrow(1, 0, shape.H / p).contiguous(), c.v = c.v.narrow(1, 0, shape.H / p).contiguous();
      cuda_rows(c, p, "grouped:", c.label() + " kv" + std::to_string(shape.H / p));
    }

  // Central differences at the partial-tile cell (or the first one).
  CheckShape fd_shape = grid.front();
  for (const CheckShape &s : grid)
    if (s.T > 1 && s.T % 64 != 0) { fd_shape = s; break; }
  finite_differences(entry, man, make_cell(man, fd_shape, opt.seed * 7919u), opt.fd_entries, table);


  if (entry.embed_table) {  // the fixed position table, at the largest cell's sizes
    const CheckShape &s = grid.back();
    const int64_t d = s.H * s.D;
    Tensor got = at::empty({s.T, d}, kF64);
    entry.embed_table(s.T, d, got.data_ptr<double>());
    const Error e = compare(got, ref.embedding_table(s.T, d));
    table.add({"embed_table", "fp64", std::to_string(s.T) + "x" + std::to_string(d), e.max_abs,
               e.rel, -1, 1e-12});
  }
  report.rows = table.rows;
  for (const auto &[key, cells] : table.unresolved) {
    std::string line = key + " (";
    for (size_t n = 0; n < cells.size(); ++n) line += (n ? ", " : "") + cells[n];
    report.unresolved.push_back(line + ")");
  }
  return report;
}

void print_report(std::ostream &os, const CheckReport &report) {
  for (const std::string &n : report.notes) os << "note: " << n << "\n";
  // An interface mismatch, or a check the grid could not make ("not checked: ...").
  for (const std::string &p : report.problems)
    os << (p.rfind("not checked: ", 0) == 0 ? "" : "interface mismatch: ") << p << "\n";
  if (!report.unresolved.empty()) {
    os << "passed but not counted as checks (at these cells the tolerance reaches half the "
          "reference's size: a kernel that wrote zeros would pass too):\n";
    for (const std::string &u : report.unresolved) os << "  " << u << "\n";
  }
  if (report.rows.empty()) return;
  size_t w = 8;
  for (const CheckRow &r : report.rows) w = std::max(w, r.quantity.size());
  char buf[512];
  size_t pw = 4, cw = 12;
  for (const CheckRow &r : report.rows) pw = std::max(pw, r.precision.size()), cw = std::max(cw, r.shape.size());
  std::snprintf(buf, sizeof buf, "%-*s  %-*s  %-*s  %-9s  %-9s  %-9s  %-9s  %s\n", int(w),
                "quantity", int(pw), "prec", int(cw), "worst cell", "max|err|", "rel err", "yardstick", "tolerance",
                "result");
  os << buf;
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2e", v);
    return std::string(b);
  };
  for (const CheckRow &r : report.rows) {
    std::snprintf(buf, sizeof buf, "%-*s  %-*s  %-*s  %-9s  %-9s  %-9s  %-9s  %s", int(w),
                  r.quantity.c_str(), int(pw), r.precision.c_str(), int(cw), r.shape.c_str(), num(r.max_abs).c_str(),
                  num(r.rel).c_str(), r.yardstick < 0 ? "-" : num(r.yardstick).c_str(),
                  num(r.tol).c_str(), r.pass ? "pass" : "FAIL");
    os << buf;
    if (!r.note.empty() && !r.pass) os << "  (" << r.note << ")";
    os << "\n";
  }
}

}  // namespace ape
