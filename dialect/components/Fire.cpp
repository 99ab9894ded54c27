//===- Fire.cpp - ape.fire ------------------------------------------------===//
//
// FIRE: a 1 -> hidden -> heads MLP of the normalised log distance, evaluated in a score_mod.
//
//===----------------------------------------------------------------------===//
#include "dialect/ComponentSupport.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>
#include <string>

using namespace mlir;
using namespace mlir::ape;
using namespace mlir::ape::component;

// FIRE: MLP_h(ψ(Δ) / (ψ(max(i, l_init·L)) + 1e-6)), ψ(x) = ln(|c·x| + 1), ReLU hidden layer.

LogicalResult FireOp::verify() {
  if (getHidden() < 1 || getHidden() > ::ape_rules::kMaxFireHidden)
    return emitOpError("hidden must be in [1, ") << ::ape_rules::kMaxFireHidden << "], got "
                                                 << getHidden();
  double c = getC().convertToDouble(), l = getLInit().convertToDouble();
  if (!(c > 0.0 && isFinite(c)))
    return emitOpError("c must be a positive finite number, got ") << num(c);
  if (!(l >= 1.0 && isFinite(l)))
    return emitOpError("l_init must be a finite number >= 1, got ") << num(l);
  return success();
}

void FireOp::expand(OpBuilder &b) {
  FireOp op = *this;
  Location loc = op.getLoc();
  int64_t hidden = op.getHidden();
  std::string width = std::to_string(hidden);
  ParamOp c = newParam(b, loc, "fire_c", {"1"}, abi::InitKind::Constant, true);
  c.setValueAttr(op.getCAttr());
  ParamOp lMult = newParam(b, loc, "fire_l_mult", {"1"}, abi::InitKind::Constant, true);
  lMult.setValueAttr(b.getF64FloatAttr(1.0));
  ParamOp w1 = newParam(b, loc, "fire_w1", {width}, abi::InitKind::Normal, true);
  w1.setStdAttr(b.getF64FloatAttr(1.0));
  ParamOp b1 = newParam(b, loc, "fire_b1", {width}, abi::InitKind::Zeros, true);
  ParamOp w2 = newParam(b, loc, "fire_w2", {width, "heads"}, abi::InitKind::Normal, true);
  w2.setStdAttr(b.getF64FloatAttr(0.1));
  ParamOp b2 = newParam(b, loc, "fire_b2", {"heads"}, abi::InitKind::Zeros, true);
  double lInit = op.getLInit().convertToDouble();
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value cv = rb.load(c, {rb.idx(0)});
    Value lv = rb.load(lMult, {rb.idx(0)});
    auto psi = [&](Value x) { return rb.log1p(rb.absf(rb.mul(cv, x))); };
    Value d = rb.toF32(distance(rb, i, j));
    Value norm = rb.maxf(rb.toF32(i), rb.mul(rb.f32(lInit), lv));
    Value x = rb.div(psi(d), rb.add(psi(norm), rb.f32(1e-6)));
    SmallVector<Value> terms;
    for (int64_t k = 0; k < hidden; ++k) {
      Value kk = rb.idx(k);
      Value pre = rb.add(rb.mul(rb.load(w1, {kk}), x), rb.load(b1, {kk}));
      Value act = rb.relu(pre);  // (relu'(0) = 0, as PyTorch's: b1 = 0 puts the diagonal there)
      terms.push_back(rb.mul(rb.load(w2, {kk, h}), act));
    }
    // A balanced sum keeps every weight's gradient path short.
    while (terms.size() > 1) {
      SmallVector<Value> next;
      for (size_t k = 0; k + 1 < terms.size(); k += 2)
        next.push_back(rb.add(terms[k], terms[k + 1]));
      if (terms.size() % 2)
        next.push_back(terms.back());
      terms = std::move(next);
    }
    return rb.add(terms.front(), rb.load(b2, {h}));
  });
}
