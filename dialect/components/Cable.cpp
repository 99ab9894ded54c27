//===- Cable.cpp - ape.cable ----------------------------------------------===//
//
// Cable (and K-Cable): a token feature, b_t = -softplus(f_t), its cumulative sum S, and
// B_ij = S_i - S_j (or -log(1 + (S_i - S_j)^2)).
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

LogicalResult CableOp::verify() {
  if (auto k = toDouble(getKappa()))
    if (std::string why = ::ape_rules::kScale.check(*k); !why.empty())
      return emitOpError("kappa ") << why << " (it becomes the encoding's scale)";
  double std = getWeightStd().convertToDouble();
  if (!(std >= 0.0 && isFinite(std)))
    return emitOpError("weight_std must be a non-negative finite number, got ") << std;
  return success();
}

void CableOp::expand(OpBuilder &b) {
  CableOp op = *this;
  Location loc = op.getLoc();
  MLIRContext *ctx = b.getContext();
  auto tokens = TokensType::get(ctx);
  auto feature = b.create<TokenFeatureOp>(loc, tokens, b.getStringAttr("cable"),
                                          op.getWeightStdAttr(), b.getF64FloatAttr(0.0));
  // b_t = -softplus(f_t)
  auto map = b.create<MapOp>(loc, tokens, feature.getResult());
  {
    OpBuilder::InsertionGuard guard(b);
    Block *block = createRegionBlock(b, map.getBody(), {Float32Type::get(ctx)}, loc);
    RegionBuilder rb{b, loc};
    rb.yield(rb.neg(rb.softplus(block->getArgument(0))));
  }
  // S_t = Σ_{u<=t} b_u
  auto scan = b.create<ScanOp>(loc, tokens, map.getResult());
  bool kernel = op.getKernel() == abi::CableKernel::Log1pSq;
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value bb, Value h, Value i, Value j) {
    Value si = rb.load(scan, {bb, h, i});
    Value sj = rb.load(scan, {bb, h, j});
    Value d = rb.sub(si, sj);
    // Cable: B = S_i - S_j;  K-Cable: B = -log(1 + (S_i - S_j)^2)
    return kernel ? rb.neg(rb.log1p(rb.mul(d, d))) : d;
  });
  if (auto kappa = op.getKappaAttr())
    op->getParentOfType<EncodingOp>().setScaleAttr(kappa);
}
