//===- ApeOps.cpp - verifiers and builders of the ape ops -----------------===//
//
// Every check here reports at the location of the offending op, so a bad
// spec gets `file:line:col: error: ...` from any tool that parses it.
//
//===----------------------------------------------------------------------===//
#include "dialect/ApeOps.h"
#include "dialect/ComponentSupport.h"
#include "ape/contract/value_rules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

using namespace mlir;
using namespace mlir::ape;
using namespace mlir::ape::component;

/// `@name` of an encoding or kernel. A name written with a character MLIR's symbol syntax ends
/// at (`@sliding-alibi`) would otherwise fail later, at the '-', as "expected '{' to begin a
/// region"; the name's own rule (verifyContainer) is said here instead.
static ParseResult parseContainerName(OpAsmParser &parser, StringAttr &name) {
  llvm::SMLoc at = parser.getCurrentLocation();
  if (parser.parseSymbolName(name))
    return failure();
  // (a '-' right after the name, as written: `@sliding-alibi`, not `@sliding -alibi`)
  const char *next = parser.getCurrentLocation().getPointer();
  if (next && *next == '-' && at.getPointer() && next == at.getPointer() + 1 + name.size()) {
    std::string written(name.getValue());
    for (; *next && (std::isalnum(static_cast<unsigned char>(*next)) || *next == '_' ||
                     *next == '-' || *next == '.' || *next == '$');
         ++next)
      written += *next;
    return parser.emitError(at, "name @")
           << written << " must be an identifier: a letter or '_' then letters, digits or '_'";
  }
  return success();
}

static void printContainerName(OpAsmPrinter &printer, Operation *, StringAttr name) {
  printer.printSymbolName(name.getValue());
}

namespace mlir::ape {
/// The float (F64Attr) arguments of the ape ops, by name (ApeOps.td); no op has an argument of
/// another type by one of these names.
static constexpr llvm::StringLiteral kFloatArgs[] = {
    "a_init", "alpha", "base", "beta", "beta_fast", "beta_slow", "bias", "c", "factor", "fraction",
    "gamma", "high_freq_factor", "kappa", "l_init", "low_freq_factor", "max", "min", "p_init",
    "scale", "scale_base", "start", "std", "step", "theta", "theta1", "theta2", "value",
    "weight_std"};

/// MLIR reads a whole number (`64`) as an i64. The float arguments of `attrs` given one take it
/// as that number: exactly, or an error that says how to write it.
static ParseResult takeWholeNumbers(OpAsmParser &parser, llvm::SMLoc loc, NamedAttrList &attrs) {
  for (StringRef arg : kFloatArgs) {
    auto whole = dyn_cast_or_null<IntegerAttr>(attrs.get(arg));
    if (!whole || whole.getType().isInteger(1))
      continue;
    const llvm::APInt &v = whole.getValue();
    // `200 : i8` and `-56 : i8` are stored as the same bits: a signless integer narrower than the
    // default i64 with its top bit set could be either, so it is not guessed at.
    if (whole.getType().isSignlessInteger() && v.getBitWidth() < 64 && v.isNegative())
    {
      std::string type;
      llvm::raw_string_ostream(type) << whole.getType();
      return parser.emitError(loc) << "argument '" << arg << "' = " << v.getSExtValue() << " or "
                                   << v.getZExtValue() << " : " << type
                                   << " (a signless integer holds the bits of both); write it as a "
                                      "float, or as a plain number (an i64)";
    }
    llvm::APFloat f(llvm::APFloat::IEEEdouble());
    bool inexact = f.convertFromAPInt(v, !whole.getType().isUnsignedInteger(),
                                      llvm::APFloat::rmNearestTiesToEven) != llvm::APFloat::opOK;
    double d = f.convertToDouble();
    if (inexact) {
      std::string shown;
      llvm::raw_string_ostream os(shown);
      char as_float[40];
      std::snprintf(as_float, sizeof as_float, "%.17g", d);
      os << "argument '" << arg << "' = ";
      v.print(os, !whole.getType().isUnsignedInteger());
      os << " is not exactly a double; write it as a float (`" << as_float
         << (std::strpbrk(as_float, ".e") ? "" : ".0") << " : f64`)";
      return parser.emitError(loc, shown);
    }
    attrs.set(arg, parser.getBuilder().getF64FloatAttr(d));
  }
  return success();
}

/// The parser of an op whose form is its attribute dictionary alone (Ape_AttrDictForm).
/// With `withKeyword`, the dictionary is written after an `attributes` keyword
/// (attr-dict-with-keyword), as an op with a region writes it.
ParseResult parseAttrDictOp(
    OpAsmParser &parser, OperationState &result,
    llvm::LogicalResult (*verifyInherentAttrs)(OperationName, NamedAttrList &,
                                               llvm::function_ref<InFlightDiagnostic()>),
    bool withKeyword = false) {
  llvm::SMLoc loc = parser.getCurrentLocation();
  if ((withKeyword ? parser.parseOptionalAttrDictWithKeyword(result.attributes)
                   : parser.parseOptionalAttrDict(result.attributes)) ||
      takeWholeNumbers(parser, loc, result.attributes))
    return failure();
  return verifyInherentAttrs(result.name, result.attributes,
                             [&]() { return parser.emitError(loc); });
}

/// The attribute dictionary of `op` less `elided` and the arguments at their default value (as
/// the generated printers print it): the defaults are those of a fresh op of its name.
void printAttrDictOp(OpAsmPrinter &printer, Operation *op, llvm::ArrayRef<StringRef> elided,
                     bool withKeyword = false) {
  OperationState state(op->getLoc(), op->getName());
  Operation *fresh = Operation::create(state);
  DictionaryAttr defaults = fresh->getAttrDictionary();
  fresh->destroy();
  llvm::SmallVector<StringRef> skip(elided);
  for (NamedAttribute a : op->getAttrs())
    if (defaults.get(a.getName()) == a.getValue())
      skip.push_back(a.getName().getValue());
  if (withKeyword)
    printer.printOptionalAttrDictWithKeyword(op->getAttrs(), skip);
  else
    printer.printOptionalAttrDict(op->getAttrs(), skip);
}

/// `$body (grad $grad)?` or `(table $table)?`: a region, then an optional keyword and region.
static ParseResult parseRegions(OpAsmParser &parser, OperationState &result, bool bodyFirst,
                                StringRef optionalKeyword, bool emptyBodyGetsBlock = false) {
  if (bodyFirst) {
    Region *body = result.addRegion();
    if (parser.parseRegion(*body))
      return failure();
    if (emptyBodyGetsBlock && body->empty())
      body->emplaceBlock();
  }
  if (!optionalKeyword.empty()) {
    Region *optional = result.addRegion();
    if (succeeded(parser.parseOptionalKeyword(optionalKeyword)) && parser.parseRegion(*optional))
      return failure();
  }
  return success();
}

static void printOptionalRegion(OpAsmPrinter &printer, StringRef keyword, Region &region) {
  if (!region.empty()) {
    printer << ' ' << keyword << ' ';
    printer.printRegion(region);
  }
}
} // namespace mlir::ape

#define GET_OP_CLASSES
#include "dialect/ApeInterfaces.cpp.inc"
#include "dialect/ApeOps.cpp.inc"

SmallVector<abi::Dim> mlir::ape::getDims(ParamOp param) {
  SmallVector<abi::Dim> dims;
  for (Attribute a : param.getShape())
    dims.push_back(abi::parse_dim(cast<StringAttr>(a).getValue()).value_or(abi::Dim{}));
  return dims;
}

ParamOp mlir::ape::createParam(OpBuilder &b, Location loc, StringRef name,
                               ArrayRef<StringRef> shape, abi::InitKind init, bool trainable) {
  OperationState state(loc, ParamOp::getOperationName());
  state.addTypes(ParamType::get(b.getContext()));
  state.addAttribute(ParamOp::getNameAttrName(state.name), b.getStringAttr(name));
  state.addAttribute(ParamOp::getShapeAttrName(state.name), b.getStrArrayAttr(shape));
  state.addAttribute(ParamOp::getInitAttrName(state.name), b.getStringAttr(abi::name(init)));
  if (trainable)
    state.addAttribute(ParamOp::getTrainableAttrName(state.name), b.getUnitAttr());
  return cast<ParamOp>(b.create(state));
}

/// A param shape [rows, "heads", "head_dim"] (a relative table, a sinusoidal table), rows a
/// positive integer.
static bool isRowTable(ArrayRef<abi::Dim> d) {
  using K = abi::Dim::Kind;
  return d.size() == 3 && d[0].is(K::Fixed) && d[0].value > 0 && d[1].is(K::Heads) &&
         d[2].is(K::HeadDim);
}

bool mlir::ape::isAllowedInRegion(Operation *op) {
  llvm::StringRef ns = op->getDialect() ? op->getDialect()->getNamespace() : "";
  if (ns == "arith" || ns == "math")
    return true;
  return isa<LoadOp, DimOp, YieldOp, ConstantOp>(op);
}

bool component::isFinite(double v) { return std::isfinite(v); }

/// A number as a diagnostic shows it: shortest form, "0.5" rather than "5.000000e-01".
std::string component::num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// Every f64 attribute of `op` (a component or a generic form) must fit the kernels' f32: its
/// value is written into f32 code (1e308 would become inf there).
static LogicalResult verifyF32Attributes(Operation *op) {
  for (NamedAttribute a : op->getAttrs())
    if (auto f = dyn_cast<FloatAttr>(a.getValue()))
      if (std::string why = ::ape_rules::kFiniteF32.check(f.getValueAsDouble()); !why.empty())
        return op->emitOpError("attribute '") << a.getName().getValue() << "' " << why;
  return success();
}

/// An integer attribute within [lo, hi], or a located error naming it.
LogicalResult component::verifyIntRange(Operation *op, StringRef name, int64_t v, int64_t lo,
                                         int64_t hi) {
  if (v < lo || v > hi)
    return op->emitOpError(name) << " must be in [" << lo << ", " << hi << "], got " << v;
  return success();
}

std::optional<double> component::toDouble(std::optional<llvm::APFloat> v) {
  if (!v)
    return std::nullopt;
  return v->convertToDouble();
}

//===----------------------------------------------------------------------===//
// Containers
//===----------------------------------------------------------------------===//

void EncodingOp::build(OpBuilder &builder, OperationState &state, StringRef name) {
  state.addAttribute(getSymNameAttrName(state.name), builder.getStringAttr(name));
  Region *body = state.addRegion();
  body->push_back(new Block());
}

/// Checks shared by ape.encoding and ape.kernel: the body is one block of
/// container-level ops, parameter and feature names are unique, scale > 0.
static LogicalResult verifyContainer(Operation *op, Region &body,
                                     std::optional<double> scale) {
  // The name becomes a C identifier, a file name and the runtime's encoding name.
  StringRef name = SymbolTable::getSymbolName(op).getValue();
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') ||
      !llvm::all_of(name, [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
      })) {
    std::string escaped;  // as it was written: a quote or a control character escaped
    llvm::raw_string_ostream os(escaped);
    llvm::printEscapedString(name, os);
    return op->emitOpError("name @\"") << escaped
           << "\" must be an identifier: a letter or '_' then letters, digits or '_'";
  }
  // Names the emitted C++ could not keep: the macros compilers and C libraries predefine (an
  // identifier handed on by a macro is expanded first), the ones C++ reserves, and a name that
  // is another encoding's level entry point (ape_kernel_entry_NAME_level).
  static constexpr const char *kMacros[] = {"linux", "unix", "i386", "sun", "errno", "NULL", "EOF",
                                            "assert", "stdin", "stdout", "stderr", "offsetof",
                                            "BUFSIZ", "CHAR_BIT", "INFINITY", "NAN"};
  if (llvm::is_contained(kMacros, name) || name.starts_with("__") ||
      (name.size() > 1 && name[0] == '_' && std::isupper(static_cast<unsigned char>(name[1]))))
    return op->emitOpError("name @") << name
           << " is a name C or C++ compilers define as a macro or reserve; choose another";
  if (name.ends_with("_level"))
    return op->emitOpError("name @") << name
           << " ends in \"_level\", which names the CPU kernels' level entry points; choose another";
  if (body.empty())
    return op->emitOpError("needs a body block (write `{\n}` for NoPE)");
  if (scale)
    if (std::string why = ::ape_rules::kScale.check(*scale); !why.empty())
      return op->emitOpError("scale ") << why;
  // Before the nested ops' own verifiers (this reads only their attribute dictionaries): an f32
  // attribute out of range is named as such rather than by the op's own range check.
  for (Operation &inner : body.front())
    if (failed(verifyF32Attributes(&inner)))
      return failure();
  return success();
}

/// The ops of an encoding or kernel body, together (from verifyRegions: each op verified, so
/// their attributes are present and typed).
static LogicalResult verifyContainerBody(Region &body) {
  llvm::StringSet<> params, features;
  for (Operation &inner : body.front()) {
    if (auto p = dyn_cast<ParamOp>(inner))
      if (!params.insert(p.getName()).second)
        return p.emitOpError("duplicate param name \"") << p.getName() << "\"";
    if (auto f = dyn_cast<TokenFeatureOp>(inner))
      if (!features.insert(f.getName()).second)
        return f.emitOpError("duplicate token feature name \"") << f.getName() << "\"";
    if (isa<LoadOp, DimOp, YieldOp, ConstantOp>(inner))
      return inner.emitOpError("is only allowed inside a map, q_mod, k_mod or score_mod region");
    if (inner.getDialect() && !isa<ApeDialect>(inner.getDialect()))
      return inner.emitOpError("is not an ape op; arith/math ops belong inside regions");
  }
  return success();
}

/// Every attribute of `op` without a dialect prefix is one it declares: MLIR keeps any other as a
/// discardable attribute that nothing reads, so a misspelt argument (`{bsae = 5e5}` for `base`)
/// would compile to the default silently. Attributes with a dialect prefix are their dialect's.
static LogicalResult verifyKnownAttributes(Operation *op) {
  for (NamedAttribute a : op->getDiscardableAttrs()) {
    StringRef name = a.getName().getValue();
    if (name.contains('.'))
      continue;
    std::string known, nearest;
    unsigned best = 3;  // suggest a declared name at most two edits away
    if (std::optional<RegisteredOperationName> info = op->getRegisteredInfo())
      for (StringAttr k : info->getAttributeNames()) {
        if (k.getValue() == "sym_name")
          continue;
        known += (known.empty() ? "" : ", ") + k.getValue().str();
        unsigned d = name.edit_distance(k.getValue(), true, best);
        if (d < best)
          best = d, nearest = k.getValue().str();
      }
    InFlightDiagnostic diag = op->emitOpError("has no attribute '") << name << "'";
    if (!nearest.empty())
      diag << " (did you mean '" << nearest << "'?)";
    diag << (known.empty() ? std::string(": it takes none") : "; its attributes: " + known);
    return diag;
  }
  return success();
}

/// Checks the optional shape hints of an encoding or kernel.
static LogicalResult verifyShapeHints(Operation *op, std::optional<uint64_t> headDim,
                                      std::optional<uint64_t> modelDim) {
  auto asInt = [](std::optional<uint64_t> v) { return static_cast<int64_t>(*v); };
  if (headDim && failed(verifyIntRange(op, "head_dim", asInt(headDim), 1, ::ape_rules::kMaxDim)))
    return failure();
  if (modelDim &&
      failed(verifyIntRange(op, "model_dim", asInt(modelDim), 1, ::ape_rules::kMaxDim)))
    return failure();
  if (headDim && modelDim && asInt(modelDim) % asInt(headDim) != 0)
    return op->emitOpError("model_dim ") << asInt(modelDim) << " is not a multiple of head_dim "
                                         << asInt(headDim);
  return success();
}

/// With a head_dim hint, the rotated coordinates fraction·head_dim must be an even whole number
/// of at least 2 (the runtime checks a model's head_dim with the same rule).
static LogicalResult checkRotationDims(Operation *op, double fraction,
                                       std::optional<int64_t> headDim) {
  if (!headDim)
    return success();
  if (std::string why = ::ape_rules::checkRotation(fraction, *headDim); !why.empty())
    return op->emitOpError(why);
  return success();
}

/// The prob site of an encoding or kernel: at most one ape.attention_transition, and not with
/// ape.value_rows (whose per-row masses the fused transition does not carry).
static LogicalResult verifyProbSite(Region &body) {
  AttentionTransitionOp transition;
  ValueRowsOp valueRows;
  for (Operation &op : body.front()) {
    if (auto t = dyn_cast<AttentionTransitionOp>(op)) {
      if (transition)
        return t.emitOpError("an encoding takes at most one attention transition");
      transition = t;
    }
    if (auto v = dyn_cast<ValueRowsOp>(op))
      valueRows = v;
  }
  if (transition && valueRows)
    return transition.emitOpError("does not combine with ape.value_rows yet (the fused kernel "
                                  "does not carry the value rows' masses through the transition)");
  return success();
}

LogicalResult EncodingOp::verify() {
  if (failed(verifyContainer(*this, getBody(), toDouble(getScale()))) ||
      failed(verifyShapeHints(*this, getHeadDim(), getModelDim())))
    return failure();
  return success();
}

LogicalResult EncodingOp::verifyRegions() {
  // (ParamOp's own verifier names its init arguments first.)
  WalkResult unknown = (*this)->walk([](Operation *op) {
    return failed(verifyKnownAttributes(op)) ? WalkResult::interrupt() : WalkResult::advance();
  });
  if (unknown.wasInterrupted())
    return failure();
  if (failed(verifyContainerBody(getBody())))
    return failure();
  std::optional<int64_t> headDim, modelDim;
  if (auto v = getHeadDim())
    headDim = static_cast<int64_t>(*v);
  if (auto v = getModelDim())
    modelDim = static_cast<int64_t>(*v);
  unsigned rotary = 0, overrides = 0, embeddings = 0;
  std::optional<double> kappa;
  for (Operation &op : getBody().front()) {
    if (isa<RotaryOp, XposOp>(op) && ++rotary > 1)
      return op.emitOpError("an encoding takes at most one rotation (ape.rotary or ape.xpos)");
    if (isa<OverrideOp, MaskedProjectionOp>(op) && ++overrides > 1)
      return op.emitOpError("an encoding takes at most one override of the projection input");
    if (isa<AbsoluteOp, PositionEmbeddingOp>(op) && ++embeddings > 1)
      return op.emitOpError("an encoding takes at most one absolute position embedding");
    if (auto rot = dyn_cast<RotaryOp>(op))
      if (failed(checkRotationDims(rot, rot.getFraction().convertToDouble(), headDim)))
        return failure();
    if (isa<XposOp>(op) && failed(checkRotationDims(&op, 1.0, headDim)))  // every pair rotates
      return failure();
    if (auto ov = dyn_cast<OverrideOp>(op)) {
      if (modelDim && *modelDim >= 0 && ov.getL() >= static_cast<uint64_t>(*modelDim))
        return ov.emitOpError("l = ") << ov.getL() << " overwrites the whole input: it must be "
                                      << "less than the encoding's model_dim " << *modelDim;
    }
    if (auto cable = dyn_cast<CableOp>(op)) {
      if (auto k = toDouble(cable.getKappa())) {
        std::optional<double> other = kappa ? kappa : toDouble(getScale());
        if (other && *other != *k)
          return cable.emitOpError("kappa ") << *k << " conflicts with the logit scale "
                                              << *other << " set elsewhere in the encoding";
        kappa = *k;
      }
    }
    if (isa<KernelOp>(op))
      return op.emitOpError("cannot be nested in an encoding");
  }
  return verifyProbSite(getBody());
}

LogicalResult KernelOp::verifyRegions() {
  if (failed(verifyContainerBody(getBody())))
    return failure();
  unsigned q = 0, k = 0, s = 0, projections = 0, embeddings = 0;
  for (Operation &op : getBody().front()) {
    if (isa<QModOp>(op) && ++q > 1)
      return op.emitOpError("a kernel holds at most one q_mod (fuse composes them)");
    if (isa<KModOp>(op) && ++k > 1)
      return op.emitOpError("a kernel holds at most one k_mod (fuse composes them)");
    if (isa<ScoreModOp>(op) && ++s > 1)
      return op.emitOpError("a kernel holds at most one score_mod (fuse composes them)");
    // The manifest has room for one of each (a second would be dropped silently).
    if (isa<MaskedProjectionOp>(op) && ++projections > 1)
      return op.emitOpError("a kernel holds at most one masked projection");
    if (isa<PositionEmbeddingOp>(op) && ++embeddings > 1)
      return op.emitOpError("a kernel holds at most one position embedding");
    if (isa<AttentionTransitionOp>(op) && !getInferenceOnly())
      return op.emitOpError("is inference-only (it has no derivative), so it cannot be part of a "
                            "training kernel: mark the kernel `inference_only` (-ape-fuse does), "
                            "which gives it no backward");
    if (getInferenceOnly() && isa<MapOp, QModOp, KModOp, ScoreModOp>(op) &&
        !op.getRegion(1).empty())
      return op.emitOpError("has a grad region in an inference_only kernel: such a kernel has no "
                            "backward (-ape-differentiate leaves it alone)");
  }
  // inference_only means "no backward because of a transition": without one the kernel entry
  // would instantiate a backward the functor does not have.
  if (getInferenceOnly() && !llvm::any_of(getBody().front(), [](Operation &op) {
        return isa<AttentionTransitionOp>(op);
      }))
    return emitOpError("is inference_only but holds no ape.attention_transition (only a transition "
                       "makes a kernel inference-only)");
  return verifyProbSite(getBody());
}

LogicalResult KernelOp::verify() {
  if (failed(verifyContainer(*this, getBody(), toDouble(getScale()))) ||
      failed(verifyShapeHints(*this, getHeadDim(), getModelDim())))
    return failure();
  // One pass (online softmax) to three (statistics first); tiles the templates can hold.
  for (auto [name, v, hi] : {std::tuple{"passes", getPasses(), int64_t(3)},
                             std::tuple{"tile_q", getTileQ(), kMaxTile},
                             std::tuple{"tile_k", getTileK(), kMaxTile}})
    if (v && failed(verifyIntRange(*this, name, static_cast<int64_t>(*v), 1, hi)))
      return failure();
  if (std::optional<StringRef> bias = getScoreBias();
      bias && *bias != "distance" && *bias != "row_col" && *bias != "features")
    return emitOpError("score_bias must be \"distance\", \"row_col\" or \"features\", got \"") << *bias << "\"";
  return success();
}

//===----------------------------------------------------------------------===//
// Named components: each in dialect/components/NAME.cpp (verifier and expansion)
//===----------------------------------------------------------------------===//

/// Shared by ape.override and ape.masked_projection.
static LogicalResult verifyOverrideValues(Operation *op, abi::OverrideKind kind, int64_t l,
                                          double start, double theta, double theta1,
                                          double theta2) {
  if (l < 1 || l > ::ape_rules::kMaxDim)
    return op->emitOpError("l (the number of overwritten inputs) must be in [1, ")
           << ::ape_rules::kMaxDim << "], got " << l;
  if (!isFinite(start))
    return op->emitOpError("start must be finite, got ") << start;
  if (kind == abi::OverrideKind::Expe && !(theta != 0.0 && isFinite(theta)))
    return op->emitOpError("theta must be a non-zero finite number, got ") << theta;
  if (kind == abi::OverrideKind::Exqpe && !(isFinite(theta1) && theta2 != 0.0 && isFinite(theta2)))
    return op->emitOpError("theta1 must be finite and theta2 a non-zero finite number, got ")
           << num(theta1) << " and " << num(theta2);
  return success();
}

LogicalResult OverrideOp::verify() {
  return verifyOverrideValues(*this, getKind(), getL(), getStart().convertToDouble(),
                              getTheta().convertToDouble(), getTheta1().convertToDouble(),
                              getTheta2().convertToDouble());
}

//===----------------------------------------------------------------------===//
// Generic forms
//===----------------------------------------------------------------------===//

static LogicalResult verifyInContainer(Operation *op);

LogicalResult AttentionTransitionOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  // Layer counts and offsets up to the runtime's deepest model (ape-train --layers <= 1024).
  // first_layer >= 1: layer l's first interval starts at s = (l+1)I, and its window [s-2I, s)
  // must lie in the row.
  if (failed(verifyIntRange(*this, "divisor_offset", getDivisorOffset(), 1, 1024)) ||
      failed(verifyIntRange(*this, "first_layer", getFirstLayer(), 1, 1024)) ||
      failed(verifyIntRange(*this, "skip_last", getSkipLast(), 0, 1024)) ||
      failed(verifyIntRange(*this, "intervals", getIntervals(), 1, 64)))
    return failure();
  double alpha = getAlpha().convertToDouble(), beta = getBeta().convertToDouble();
  if (!(alpha > 0.0 && isFinite(alpha)))
    return emitOpError("alpha (bound = alpha / e) must be a positive finite number, got ")
           << num(alpha);
  if (!(beta >= 0.0 && beta <= 1.0))
    return emitOpError("beta (the share of the removed mass given back) must be in [0, 1], got ")
           << num(beta);
  return success();
}

static LogicalResult verifyInContainer(Operation *op) {
  if (!isa_and_nonnull<EncodingOp, KernelOp>(op->getParentOp()))
    return op->emitOpError("must be directly inside an ape.encoding or ape.kernel");
  return success();
}

std::optional<::ape_rules::Range> mlir::ape::getValueRange(ParamOp param) {
  auto min = toDouble(param.getMin()), max = toDouble(param.getMax());
  if (!min || !max)
    return std::nullopt;
  return ::ape_rules::Range{*min, *max, param.getInteger()};
}

void mlir::ape::setValueRange(ParamOp param, const ::ape_rules::Range &range) {
  Builder b(param.getContext());
  param.setMinAttr(b.getF64FloatAttr(range.min));
  param.setMaxAttr(b.getF64FloatAttr(range.max));
  param.setInteger(range.integer);
}

/// A declared value range: both bounds, min <= max, on a fixed constant param holding a value
/// inside it.
static LogicalResult verifyValueRange(ParamOp param) {
  if (!param.getMin() && !param.getMax() && !param.getInteger())
    return success();
  if (!param.getMin() || !param.getMax())
    return param.emitOpError("a value range needs both `min` and `max` (f64)");
  if (param.getTrainable() || param.getInit() != abi::InitKind::Constant)
    return param.emitOpError("a value range applies to a fixed param (init \"constant\", not "
                             "trainable): the values a runtime may set");
  ::ape_rules::Range range = *getValueRange(param);
  if (!(range.min <= range.max))
    return param.emitOpError("min ") << num(range.min) << " exceeds max " << num(range.max);
  if (auto value = toDouble(param.getValue()))
    if (std::string why = range.check(*value); !why.empty())
      return param.emitOpError("value ") << why;
  return success();
}

/// Whether `param` carries init argument `arg` (its attribute is set).
static bool hasInitArg(ParamOp param, abi::InitArg arg) {
  switch (arg) {
  case abi::InitArg::Std: return bool(param.getStdAttr());
  case abi::InitArg::Value: return bool(param.getValueAttr());
  case abi::InitArg::Projection: return bool(param.getProjectionAttr());
  case abi::InitArg::Columns: return bool(param.getColumnsAttr());
  case abi::InitArg::Start: return bool(param.getStartAttr());
  case abi::InitArg::Step: return bool(param.getStepAttr());
  case abi::InitArg::Scale: return bool(param.getScaleAttr());
  }
  return false;
}

LogicalResult ConstantOp::verify() {
  if (std::string why = ::ape_rules::kFiniteF32.check(getValue().convertToDouble()); !why.empty())
    return emitOpError("value ") << why << " (kernels compute in f32)";
  return success();
}

/// A param's or token feature's name: it becomes a key of the manifest, a string and a comment of
/// the emitted C++ and Python, and a torch argument name, so it takes plain characters only.
static LogicalResult verifyInputName(Operation *op, StringRef name) {
  if (name.empty())
    return op->emitOpError("needs a non-empty name");
  if (name.size() > 64 || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') ||
      !llvm::all_of(name, [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
      }))
  {
    std::string shown;  // escaped: the name may hold a newline or bytes that are not text
    llvm::raw_string_ostream os(shown);
    llvm::printEscapedString(name.take_front(64), os);
    return op->emitOpError("name \"")
           << shown << (name.size() > 64 ? "...\"" : "\"")
           << " must be a letter or '_', then letters, digits, '_', '-' or '.' (at most 64 characters)";
  }
  return success();
}

/// The generated form (`$name $shape init = $init (trainable)? attr-dict`), by hand for one
/// thing: a float argument written as a whole number (`{value = 64}`, which MLIR reads as an
/// i64) is taken as that number, as a reader would (takeWholeNumbers).
ParseResult ParamOp::parse(OpAsmParser &parser, OperationState &result) {
  StringAttr name;
  ArrayAttr shape;
  StringAttr init;
  Type none = parser.getBuilder().getType<NoneType>();
  if (parser.parseCustomAttributeWithFallback(name, none) ||
      parser.parseCustomAttributeWithFallback(shape, none) || parser.parseKeyword("init") ||
      parser.parseEqual() || parser.parseCustomAttributeWithFallback(init, none))
    return failure();
  Properties &props = result.getOrAddProperties<Properties>();
  props.name = name;
  props.shape = shape;
  props.init = init;
  if (succeeded(parser.parseOptionalKeyword("trainable")))
    props.trainable = parser.getBuilder().getUnitAttr();
  llvm::SMLoc loc = parser.getCurrentLocation();
  if (parser.parseOptionalAttrDict(result.attributes) ||
      takeWholeNumbers(parser, loc, result.attributes))
    return failure();
  if (failed(verifyInherentAttrs(result.name, result.attributes,
                                 [&]() { return parser.emitError(loc); })))
    return failure();
  result.addTypes(parser.getBuilder().getType<ParamType>());
  return success();
}

/// The generated forms of the encoding and the position embedding, by hand for one thing: float
/// arguments given whole numbers (takeWholeNumbers).
ParseResult EncodingOp::parse(OpAsmParser &parser, OperationState &result) {
  StringAttr name;
  if (parseContainerName(parser, name))
    return failure();
  result.getOrAddProperties<Properties>().sym_name = name;
  if (parseAttrDictOp(parser, result, &EncodingOp::verifyInherentAttrs, /*withKeyword=*/true))
    return failure();
  return parseRegions(parser, result, /*bodyFirst=*/true, "", /*emptyBodyGetsBlock=*/true);
}

void EncodingOp::print(OpAsmPrinter &printer) {
  printer << ' ';
  printContainerName(printer, *this, getSymNameAttr());
  printAttrDictOp(printer, *this, {"sym_name"}, /*withKeyword=*/true);
  printer << ' ';
  printer.printRegion(getBody());
}

ParseResult PositionEmbeddingOp::parse(OpAsmParser &parser, OperationState &result) {
  if (parseAttrDictOp(parser, result, &PositionEmbeddingOp::verifyInherentAttrs))
    return failure();
  return parseRegions(parser, result, /*bodyFirst=*/false, "table");
}

void PositionEmbeddingOp::print(OpAsmPrinter &printer) {
  printAttrDictOp(printer, *this, {});
  printOptionalRegion(printer, "table", getTable());
}

ParseResult TokenFeatureOp::parse(OpAsmParser &parser, OperationState &result) {
  StringAttr name;
  if (parser.parseCustomAttributeWithFallback(name, parser.getBuilder().getType<NoneType>()))
    return failure();
  result.getOrAddProperties<Properties>().name = name;
  if (parseAttrDictOp(parser, result, &TokenFeatureOp::verifyInherentAttrs))
    return failure();
  result.addTypes(parser.getBuilder().getType<TokensType>());
  return success();
}

void TokenFeatureOp::print(OpAsmPrinter &printer) {
  printer << ' ';
  printer.printAttributeWithoutType(getNameAttr());
  printAttrDictOp(printer, *this, {"name"});
}

void ParamOp::print(OpAsmPrinter &printer) {
  printer << ' ';
  printer.printAttributeWithoutType(getNameAttr());
  printer << ' ';
  printer.printAttributeWithoutType(getShapeAttr());
  printer << " init = ";
  printer.printAttributeWithoutType(getInitAttr());
  if (getTrainableAttr())
    printer << " trainable";
  printAttrDictOp(printer, *this, {"name", "shape", "init", "trainable"});
}

LogicalResult ParamOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  if (failed(verifyInputName(*this, getName())))
    return failure();
  if (getShape().empty())
    return emitOpError("needs at least one dimension");
  int64_t elements = 1;  // of the integer dimensions
  for (Attribute a : getShape()) {
    StringRef dim = cast<StringAttr>(a).getValue();
    std::optional<abi::Dim> d = abi::parse_dim(dim);
    if (!d)
      return emitOpError("dimension \"")
             << dim << "\" is not \"heads\", \"head_dim\" or a positive integer";
    if (d->is(abi::Dim::Kind::Fixed)) {
      if (d->value > ::ape_rules::kMaxDim)
        return emitOpError("dimension ") << dim << " exceeds " << ::ape_rules::kMaxDim;
      elements *= d->value;
      if (elements > ::ape_rules::kMaxParamElements)
        return emitOpError("integer dimensions of ") << elements << "+ elements exceed "
                                                     << ::ape_rules::kMaxParamElements;
    }
  }
  // Every argument is declared (the init arguments, the value range, `shared`): a misspelt one
  // would otherwise be ignored.
  for (NamedAttribute a : (*this)->getDiscardableAttrs()) {
    std::string known, nearest;
    unsigned best = 3;  // as verifyKnownAttributes: a declared name at most two edits away
    auto consider = [&](StringRef k) {
      unsigned d = a.getName().getValue().edit_distance(k, true, best);
      if (d < best)
        best = d, nearest = k.str();
    };
    for (abi::InitArg arg : abi::kInitArgs) {
      known += std::string(abi::name(arg)) + ", ";
      consider(abi::name(arg));
    }
    for (StringRef k : {"min", "max", "integer", "shared"})
      consider(k);
    InFlightDiagnostic diag = emitOpError("has no attribute '") << a.getName().getValue() << "'";
    if (!nearest.empty())
      diag << " (did you mean '" << nearest << "'?)";
    diag << "; its attributes: " << known << "min, max, integer and shared";
    return diag;
  }
  if (failed(verifyValueRange(*this)))
    return failure();
  // The init arguments: exactly those the kind needs (one table, abi::init_arg_use).
  const abi::InitKind init = getInit();
  const std::string kind = "init \"" + std::string(abi::name(init)) + "\"";
  for (abi::InitArg arg : abi::kInitArgs) {
    bool has = hasInitArg(*this, arg);
    bool needed = abi::init_arg_use(init, arg) == abi::ArgUse::Required;
    if (needed && !has) {
      std::string type = arg == abi::InitArg::Columns      ? "i64"
                         : arg == abi::InitArg::Projection ? abi::allowed<abi::Projection>()
                                                           : "f64";
      return emitOpError(kind) << " needs a `" << abi::name(arg) << "` attribute (" << type << ")";
    }
    if (!needed && has)
      return emitOpError(kind) << " takes no `" << abi::name(arg) << "` attribute";
  }
  if (abi::is_derived(init) && getShared())
    return emitOpError(kind) << " is derived from a per-layer projection: it cannot be `shared`";
  SmallVector<abi::Dim> dims = getDims(*this);
  using K = abi::Dim::Kind;
  switch (init) {
  case abi::InitKind::Normal:
    if (!(getStd()->convertToDouble() >= 0.0 && isFinite(getStd()->convertToDouble())))
      return emitOpError("init \"normal\" needs a non-negative `std` attribute (f64)");
    return success();
  case abi::InitKind::AlibiSlopes:
    if (dims.size() != 1 || !dims[0].is(K::Heads))
      return emitOpError("init \"alibi_slopes\" needs shape [\"heads\"]");
    return success();
  case abi::InitKind::Sinusoidal:  // [rows, "heads", "head_dim"]: PE[r, h·head_dim + c]
    if (!isRowTable(dims))
      return emitOpError("init \"sinusoidal\" needs shape [rows, \"heads\", \"head_dim\"]");
    return success();
  case abi::InitKind::ProjectionTerm:
  case abi::InitKind::ProjectionPrefix: {
    int64_t columns = static_cast<int64_t>(*getColumns());
    if (columns < 1 || columns > ::ape_rules::kMaxDim)
      return emitOpError(kind) << " needs a `columns` attribute in [1, " << ::ape_rules::kMaxDim << "], got "
                               << columns;
    if (init == abi::InitKind::ProjectionTerm &&
        (dims.size() != 2 || !dims[0].is(K::Heads) || !dims[1].is(K::HeadDim)))
      return emitOpError("init \"projection_term\" needs shape [\"heads\", \"head_dim\"]");
    if (init == abi::InitKind::ProjectionPrefix &&
        (!isRowTable(dims) || dims[0].value != columns))
      return emitOpError("init \"projection_prefix\" needs shape [\"")
             << columns << "\", \"heads\", \"head_dim\"]";
    return success();
  }
  default:
    return success();
  }
}

LogicalResult TokenFeatureOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  if (failed(verifyInputName(*this, getName())))
    return failure();
  double std = getWeightStd().convertToDouble();
  if (!(std >= 0.0 && isFinite(std)))
    return emitOpError("weight_std must be a non-negative finite number, got ") << std;
  if (!isFinite(getBias().convertToDouble()))
    return emitOpError("bias must be finite");
  return success();
}

/// "f32, index, ...": types as a spec writes them (a diagnostic would quote each one).
static std::string typeList(TypeRange types) {
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::interleaveComma(types, os);
  return text;
}

/// Checks a region's block arguments and the types its ape.yield returns.
static LogicalResult verifyRegionSignature(Operation *op, Region &region, StringRef what,
                                           ArrayRef<Type> args, ArrayRef<Type> results,
                                           StringRef argLegend) {
  if (region.empty())
    return op->emitOpError(what) << " region must have one block";
  Block &block = region.front();
  if (block.getNumArguments() != args.size() ||
      !llvm::equal(block.getArgumentTypes(), args)) {
    // The types it got, so that one wrong type is seen (not only a count that may be right).
    return op->emitOpError(what) << " region must take " << argLegend << ", got ("
                                 << block.getNumArguments()
                                 << " argument(s): " << typeList(block.getArgumentTypes()) << ")";
  }
  // A bound on a spec's regions, far above what an encoding needs (tens of ops): the emitted
  // kernels are one C++ expression chain per region, which the C++ compiler takes time and memory
  // to optimise. (The analyses of the fused kernel, analysis/KernelFacts.cpp, walk def-use cones
  // without recursion: fused chains of 120,000 ops compile, test/lit/Tools/apec-long-chains.test.)
  constexpr size_t kMaxRegionOps = 10000;
  if (size_t n = block.getOperations().size();
      n > kMaxRegionOps && isa_and_nonnull<EncodingOp>(op->getParentOp()))
    return op->emitOpError(what) << " region has " << n << " ops; at most " << kMaxRegionOps
                                 << " are allowed";
  for (Operation &inner : block)
    if (!isAllowedInRegion(&inner))
      return inner.emitOpError("is not allowed in a ")
             << op->getName().stripDialect()
             << " region (use arith/math ops, ape.load, ape.dim and ape.yield)";
  // An empty block has no terminator (getTerminator() would read past the list).
  auto yield = block.empty() ? YieldOp() : dyn_cast<YieldOp>(block.getTerminator());
  if (!yield)
    return op->emitOpError(what) << " region must end with ape.yield";
  if (!llvm::equal(yield.getValues().getTypes(), results)) {
    return yield.emitOpError("must yield ")
           << results.size() << " value(s) of type f32 in a " << op->getName().stripDialect()
           << " " << what << " region, got " << yield.getValues().size() << " ("
           << typeList(yield.getValues().getTypes()) << ")";
  }
  return success();
}

static unsigned countLoads(Region &region) {
  unsigned n = 0;
  region.walk([&](LoadOp) { ++n; });
  return n;
}

LogicalResult MapOp::verify() { return verifyInContainer(*this); }
LogicalResult MapOp::verifyRegions() {
  Type f32 = Float32Type::get(getContext());
  if (failed(verifyRegionSignature(*this, getBody(), "body", {f32}, {f32}, "(f32)")))
    return failure();
  if (!getGrad().empty())
    return verifyRegionSignature(*this, getGrad(), "grad", {f32, f32}, {f32}, "(x: f32, g: f32)");
  return success();
}

template <typename OpT> static LogicalResult verifyQKMod(OpT op) {
  if (failed(verifyInContainer(op)))
    return failure();
  double f = op.getFraction().convertToDouble();
  if (!(f > 0.0 && f <= 1.0))
    return op.emitOpError("fraction must be in (0, 1], got ") << f;
  return success();
}

template <typename OpT> static LogicalResult verifyQKModRegions(OpT op) {
  MLIRContext *ctx = op.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  if (failed(verifyRegionSignature(op, op.getBody(), "body", {f32, f32, idx, idx, idx}, {f32},
                                   "(x: f32, y: f32, c: index, t: index, h: index)")))
    return failure();
  if (op.getGrad().empty())
    return success();
  SmallVector<Type> results(2 + countLoads(op.getBody()), f32);
  return verifyRegionSignature(op, op.getGrad(), "grad", {f32, f32, idx, idx, idx, f32},
                               results, "(x: f32, y: f32, c: index, t: index, h: index, g: f32)");
}

LogicalResult QModOp::verify() { return verifyQKMod(*this); }
LogicalResult QModOp::verifyRegions() { return verifyQKModRegions(*this); }
LogicalResult KModOp::verify() { return verifyQKMod(*this); }
LogicalResult KModOp::verifyRegions() { return verifyQKModRegions(*this); }

LogicalResult ScoreModOp::verify() { return verifyInContainer(*this); }
LogicalResult ScoreModOp::verifyRegions() {
  MLIRContext *ctx = getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  if (failed(verifyRegionSignature(*this, getBody(), "body", {f32, idx, idx, idx, idx}, {f32},
                                   "(s: f32, b: index, h: index, i: index, j: index)")))
    return failure();
  if (getGrad().empty())
    return success();
  SmallVector<Type> results(1 + countLoads(getBody()), f32);
  return verifyRegionSignature(*this, getGrad(), "grad", {f32, idx, idx, idx, idx, f32}, results,
                               "(s: f32, b: index, h: index, i: index, j: index, g: f32)");
}

LogicalResult LoadOp::verify() {
  Operation *parent = (*this)->getParentOp();
  if (!isa_and_nonnull<MapOp, QModOp, KModOp, ScoreModOp>(parent))
    return emitOpError("is only allowed inside a q_mod, k_mod or score_mod region, or in a map "
                       "(of token sequences)");
  if (isa<TokensType>(getSource().getType())) {
    if (getIndices().size() != 3)
      return emitOpError("of a token sequence takes 3 indices [batch, head, token], got ")
             << getIndices().size();
    // A kernel keeps the token sequences of one (batch, head) slice, each value at its
    // query row i or key column j: exactly the reads a score_mod's arguments name.
    if (!isa<ScoreModOp>(parent))
      return emitOpError("of a token sequence is only allowed in an ape.score_mod (as [%b, %h, %i] "
                         "or [%b, %h, %j]), not in ")
             << parent->getName();
    Block *block = (*this)->getBlock();
    auto idx = getIndices();
    if (block->getNumArguments() < 5 ||
        idx[0] != block->getArgument(1) || idx[1] != block->getArgument(2) ||
        (idx[2] != block->getArgument(3) && idx[2] != block->getArgument(4)))
      return emitOpError("of a token sequence must read [%b, %h, %i] or [%b, %h, %j] with the "
                         "arguments of the enclosing ape.score_mod");
    return success();
  }
  if (isa<RowsType>(getSource().getType())) {
    if (getIndices().size() != 4)
      return emitOpError("of rows takes 4 indices [batch, head, token, row], got ")
             << getIndices().size();
    auto rows = getSource().getDefiningOp<RelRowsOp>();
    Block *block = (*this)->getBlock();
    auto idx = getIndices();
    bool query = !rows || rows.getSide() == abi::Side::Q;
    if (!isa<ScoreModOp>(parent))
      return emitOpError("of rows is only allowed in an ape.score_mod, not in ") << parent->getName();
    if (block->getNumArguments() < 5 ||
        idx[0] != block->getArgument(1) || idx[1] != block->getArgument(2) ||
        idx[2] != block->getArgument(query ? 3 : 4))
      return emitOpError("of ") << (query ? "query" : "key") << " rows must read "
                                << (query ? "[%b, %h, %i, %r]" : "[%b, %h, %j, %r]")
                                << " with the arguments of the enclosing ape.score_mod";
    return success();
  }
  if (isa<MapOp>(parent))
    return emitOpError("of a param is not allowed inside ape.map (maps are pure functions of "
                       "their input); load it in a q_mod, k_mod or score_mod");
  if (auto param = getSource().getDefiningOp<ParamOp>())
    if (param.getShape().size() != getIndices().size())
      return emitOpError("of param \"")
             << param.getName() << "\" takes " << param.getShape().size()
             << " index(es), one per dimension, got " << getIndices().size();
  return success();
}

LogicalResult mlir::ape::checkConstantIndices(LoadOp load) {
  auto param = load.getSource().getDefiningOp<ParamOp>();
  if (!param || param.getShape().size() != load.getIndices().size())
    return success();
  // A computed index is clamped to its dimension by the kernels; a constant one outside it is a
  // mistake known now. Symbolic dimensions are known when the container pins them.
  Operation *container = param->getParentOp();
  auto hint = [&](StringRef attr) -> std::optional<int64_t> {
    if (auto a = container ? container->getAttrOfType<IntegerAttr>(attr) : IntegerAttr())
      return a.getInt();
    return std::nullopt;
  };
  std::optional<int64_t> headDim = hint("head_dim"), modelDim = hint("model_dim");
  SmallVector<abi::Dim> dims = getDims(param);
  for (auto [k, index] : llvm::enumerate(load.getIndices())) {
    llvm::APInt c;
    if (!matchPattern(index, m_ConstantInt(&c)))
      continue;
    int64_t v = c.getSExtValue();
    std::optional<int64_t> size;
    if (dims[k].is(abi::Dim::Kind::Fixed))
      size = dims[k].value;
    else if (dims[k].is(abi::Dim::Kind::HeadDim))
      size = headDim;
    else if (headDim && modelDim && *headDim > 0)
      size = *modelDim / *headDim;
    if (v < 0 || (size && v >= *size))
      return load.emitOpError("index ") << k << " of param \"" << param.getName() << "\" is the constant "
                                        << v << ", outside its dimension \"" << dims[k].str() << "\""
                                        << (size && !dims[k].is(abi::Dim::Kind::Fixed)
                                                ? " (" + std::to_string(*size) + " here)"
                                                : std::string())
                                        << ": valid indices are 0 to "
                                        << (size ? std::to_string(*size - 1) : dims[k].str() + " - 1");
  }
  return success();
}

LogicalResult DimOp::verify() {
  if (!isa_and_nonnull<MapOp, QModOp, KModOp, ScoreModOp>((*this)->getParentOp()))
    return emitOpError("is only allowed inside a map, q_mod, k_mod or score_mod region");
  return success();
}

LogicalResult MaskedProjectionOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  if (failed(verifyOverrideValues(*this, getKind(), getL(), getStart().convertToDouble(),
                                  getTheta().convertToDouble(), getTheta1().convertToDouble(),
                                  getTheta2().convertToDouble())))
    return failure();
  // σ is read by the runtime from the param it names: a fixed scalar of the same container
  // (the manifest's rule, runtime/Manifest.cpp).
  if (auto sigma = getPositionScale()) {
    for (Operation &op : *(*this)->getBlock())
      if (auto p = dyn_cast<ParamOp>(op); p && p.getName() == *sigma) {
        SmallVector<abi::Dim> dims = getDims(p);
        if (p.getTrainable() || p.getInit() != abi::InitKind::Constant || dims.size() != 1 ||
            dims[0] != abi::Dim{abi::Dim::Kind::Fixed, 1})
          return emitOpError("position_scale \"")
                 << *sigma << "\" must name a fixed param of shape [\"1\"] (init \"constant\", "
                 << "not trainable)";
        return success();
      }
    return emitOpError("position_scale \"") << *sigma << "\" names no ape.param of this "
                                           << (*this)->getParentOp()->getName().stripDialect();
  }
  return success();
}

LogicalResult RelRowsOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  auto table = getTable().getDefiningOp<ParamOp>();
  if (!table || !isRowTable(getDims(table)))
    return emitOpError("table must be an ape.param of shape [rows, \"heads\", \"head_dim\"] "
                       "with an integer number of rows");
  if (Value bias = getBias()) {
    auto param = bias.getDefiningOp<ParamOp>();
    SmallVector<abi::Dim> d = param ? getDims(param) : SmallVector<abi::Dim>{};
    if (d.size() != 2 || !d[0].is(abi::Dim::Kind::Heads) || !d[1].is(abi::Dim::Kind::HeadDim))
      return emitOpError("bias must be an ape.param of shape [\"heads\", \"head_dim\"]");
  }
  return success();
}

LogicalResult ValueRowsOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  auto param = getTable().getDefiningOp<ParamOp>();
  if (!param || !isRowTable(getDims(param)))
    return emitOpError("table must be an ape.param of shape [rows, \"heads\", \"head_dim\"] "
                       "with an integer number of rows");
  return success();
}

LogicalResult ValueRowsOp::verifyRegions() {
  Type idx = IndexType::get(getContext());
  if (getIndex().empty() || getIndex().front().getNumArguments() != 4 ||
      !llvm::all_of(getIndex().front().getArgumentTypes(), [&](Type t) { return t == idx; }))
    return emitOpError("index region must take (b: index, h: index, i: index, j: index)");
  for (Operation &inner : getIndex().front()) {
    if (isa<LoadOp, DimOp, ConstantOp>(inner) || !isAllowedInRegion(&inner))
      return inner.emitOpError("is not allowed in a value_rows index region (use arith ops on "
                               "index values)");
  }
  Block &index = getIndex().front();
  auto yield = index.empty() ? YieldOp() : dyn_cast<YieldOp>(index.getTerminator());
  if (!yield || yield.getValues().size() != 1 || yield.getValues()[0].getType() != idx)
    return emitOpError("index region must yield one index (the row)");
  return success();
}

LogicalResult PositionEmbeddingOp::verify() {
  if (failed(verifyInContainer(*this)))
    return failure();
  if (getLearned()) {
    if (!getMaxLength() || static_cast<int64_t>(*getMaxLength()) < 1)
      return emitOpError("learned needs a positive `max_length`");
    if (std::string why = ::ape_rules::kLength.check(static_cast<double>(*getMaxLength())); !why.empty())
      return emitOpError("max_length ") << why;
    if (!getTable().empty())
      return emitOpError("is learned or has a table region, not both");
    double std = getStd().convertToDouble();
    if (!(std >= 0.0 && isFinite(std)))
      return emitOpError("std must be a non-negative finite number, got ") << std;
  } else if (getTable().empty()) {
    return emitOpError("needs `learned` or a table region");
  }
  return success();
}

LogicalResult PositionEmbeddingOp::verifyRegions() {
  if (getTable().empty())
    return success();
  MLIRContext *ctx = getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  if (failed(verifyRegionSignature(*this, getTable(), "table", {idx, idx, idx}, {f32},
                                   "(n: index, c: index, d: index)")))
    return failure();
  WalkResult r = getTable().walk([&](Operation *op) {
    if (isa<LoadOp, DimOp>(op)) {
      op->emitOpError("is not allowed in a position_embedding table (the table is a closed "
                      "form of (n, c, d); a trained table is `learned`)");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(r.wasInterrupted());
}
