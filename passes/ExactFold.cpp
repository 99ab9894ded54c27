//===- ExactFold.cpp - fold constant float arithmetic in double ------------===//
//
// The regions compute in f32 types that the code generators write at the kernel's precision
// (float, or double for fp64 kernels); a constant the canonicalizer folds takes the op's f32
// type, rounded, and an fp64 kernel then computes with the rounded value. Here every f32
// arith/math op whose operands are all constants is evaluated in double first, the result kept
// exact (RegionBuilder::f32's rule: arith.constant where f32 holds it, else ape.constant).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "dialect/RegionBuilder.h"
#include "ape/contract/float_math.h"
#include "ape/contract/value_rules.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <optional>

namespace mlir::ape {
#define GEN_PASS_DEF_APEEXACTFOLD
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;
namespace float_math = ::ape::float_math;

namespace {

// The value of a constant operand as a double: an f32 arith.constant, an ape.constant, or an
// integer arith.constant (the operand of sitofp / uitofp).
std::optional<double> constantValue(Value v, bool unsignedInt = false) {
  Operation *def = v.getDefiningOp();
  // Through the integer casts of an index constant (RegionBuilder::toF32's index_cast, then
  // sitofp): exact, as the canonicalizer would fold them, and then the float op in f32.
  while (def && isa<arith::IndexCastOp, arith::IndexCastUIOp, arith::ExtSIOp, arith::ExtUIOp>(def) &&
         !def->getOperand(0).getType().isInteger(1)) {
    if (isa<arith::IndexCastUIOp, arith::ExtUIOp>(def)) unsignedInt = true;
    def = def->getOperand(0).getDefiningOp();
  }
  if (!def) return std::nullopt;
  if (auto c = dyn_cast<ConstantOp>(def)) return c.getValue().convertToDouble();
  auto c = dyn_cast<arith::ConstantOp>(def);
  if (!c) return std::nullopt;
  if (auto f = dyn_cast<FloatAttr>(c.getValue())) return f.getValueAsDouble();
  if (auto i = dyn_cast<IntegerAttr>(c.getValue())) {
    if (i.getType().isInteger(1)) return std::nullopt;  // (i1: MLIR's -1 for true; not folded here)
    return unsignedInt ? static_cast<double>(i.getValue().getZExtValue())
                       : static_cast<double>(i.getValue().getSExtValue());
  }
  return std::nullopt;
}

// `op` in double on constant operands; nullopt for an op this does not fold.
std::optional<double> evaluate(Operation *op) {
  if (op->getNumResults() != 1 || !op->getResult(0).getType().isF32()) return std::nullopt;
  const bool unsignedInt = isa<arith::UIToFPOp>(op);
  llvm::SmallVector<double, 2> x;
  for (Value v : op->getOperands()) {
    auto c = constantValue(v, unsignedInt);
    if (!c) return std::nullopt;
    x.push_back(*c);
  }
  using R = std::optional<double>;
  auto un = [&](double (*f)(double)) -> R { return x.size() == 1 ? R(f(x[0])) : std::nullopt; };
  auto bin = [&](auto f) -> R { return x.size() == 2 ? R(f(x[0], x[1])) : std::nullopt; };
  // Only ops the code generators translate (an op they refuse stays, to be refused).
  return llvm::TypeSwitch<Operation *, R>(op)
      .Case([&](arith::AddFOp) { return bin([](double a, double b) { return a + b; }); })
      .Case([&](arith::SubFOp) { return bin([](double a, double b) { return a - b; }); })
      .Case([&](arith::MulFOp) { return bin([](double a, double b) { return a * b; }); })
      .Case([&](arith::DivFOp) { return bin([](double a, double b) { return a / b; }); })
      .Case([&](arith::NegFOp) { return un([](double a) { return -a; }); })
      // The kernels' own rules (NaN, and b on ties: maximumf(+0, -0) is -0).
      .Case([&](arith::MaxNumFOp) { return bin(float_math::maxnum<double>); })
      .Case([&](arith::MinNumFOp) { return bin(float_math::minnum<double>); })
      .Case([&](arith::MaximumFOp) { return bin(float_math::maximum<double>); })
      .Case([&](arith::MinimumFOp) { return bin(float_math::minimum<double>); })
      .Case<arith::SIToFPOp, arith::UIToFPOp>([&](Operation *) { return x.size() == 1 ? R(x[0]) : std::nullopt; })
      .Case([&](math::ExpOp) { return un([](double a) { return std::exp(a); }); })
      .Case([&](math::Exp2Op) { return un([](double a) { return std::exp2(a); }); })
      .Case([&](math::LogOp) { return un([](double a) { return std::log(a); }); })
      .Case([&](math::Log2Op) { return un([](double a) { return std::log2(a); }); })
      .Case([&](math::Log1pOp) { return un([](double a) { return std::log1p(a); }); })
      .Case([&](math::SqrtOp) { return un([](double a) { return std::sqrt(a); }); })
      .Case([&](math::PowFOp) { return bin([](double a, double b) { return std::pow(a, b); }); })
      .Case([&](math::SinOp) { return un([](double a) { return std::sin(a); }); })
      .Case([&](math::CosOp) { return un([](double a) { return std::cos(a); }); })
      .Case([&](math::TanhOp) { return un([](double a) { return std::tanh(a); }); })
      .Case([&](math::AbsFOp) { return un([](double a) { return std::fabs(a); }); })
      .Case([&](math::FloorOp) { return un([](double a) { return std::floor(a); }); })
      .Case([&](math::CeilOp) { return un([](double a) { return std::ceil(a); }); })
      .Case([&](math::TruncOp) { return un([](double a) { return std::trunc(a); }); })
      .Case([&](math::RoundOp) { return un([](double a) { return std::round(a); }); })
      .Default([](Operation *) { return std::nullopt; });
}

struct ApeExactFoldPass : public mlir::ape::impl::ApeExactFoldBase<ApeExactFoldPass> {
  void runOnOperation() override {
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    (void)foldConstantsExactly(getOperation());
  }
};

} // namespace

static int foldAll(llvm::ArrayRef<Operation *> ops) {
  int folded = 0;
  for (Operation *op : ops) {
    const std::optional<double> v = evaluate(op);
    // A NaN or a value past f32's range stays an op here (ape.constant holds finite f32 values
    // only; the canonicalizer folds those to their f32 NaN / inf, which is exact).
    if (!v || !ape_rules::kFiniteF32.check(*v).empty()) continue;
    // A value_rows index region takes no ape.constant: there only values f32 holds.
    if (op->getParentOfType<ValueRowsOp>() && static_cast<double>(static_cast<float>(*v)) != *v) continue;
    OpBuilder b(op);
    RegionBuilder rb{b, op->getLoc()};
    Value c = rb.f32(*v);
    op->getResult(0).replaceAllUsesWith(c);
    op->erase();
    ++folded;
  }
  return folded;
}

// In order: a folded result may make its users' operands all constant.
int mlir::ape::foldConstantsExactly(Operation *root) {
  llvm::SmallVector<Operation *> ops;
  root->walk([&](Operation *op) { ops.push_back(op); });
  return foldAll(ops);
}

int mlir::ape::foldConstantsExactly(Region &region) {
  llvm::SmallVector<Operation *> ops;
  region.walk([&](Operation *op) { ops.push_back(op); });
  return foldAll(ops);
}
