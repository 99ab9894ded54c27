//===- ReferenceEmitter.cpp - the spec's regions as data (--emit=reference) -===//
//
// Writes an encoding as a JSON expression graph, taken after -ape-expand and
// -ape-push-override and before -ape-fuse: every component's regions as they
// are, in spec order, unfused, undifferentiated. `ape-check` (runtime side, no
// MLIR) evaluates it with LibTorch ops on the materialised T x T logits and
// differentiates it with torch autograd, an independent path to the same
// numbers the fused kernel computes (docs/ape-check.md):
//
//   {"format": "ape-reference/1", "encoding", "source", "scale", "causal",
//    "params":     [{"name", "shape", "trainable"}],              spec order
//    "features":   [{"name"}],                                    spec order
//    "tokens":     [{"op": "feature", "feature": n}               the token program, in order:
//                   | {"op": "map", "input": slot, "body": R}     slot k is the k-th entry
//                   | {"op": "scan", "input": slot}],
//    "rel_rows":   [{"side": "q"|"k", "table": param, "bias": param|null}],
//    "q_mods", "k_mods": [{"pairing", "fraction", "body": R}],    applied in order
//    "score_mods": [R],                                           chained in order
//    "value_rows": {"table": param, "index": R} | null,
//    "embedding":  {"table": R} | null,                           a fixed position table
//    "transition": {"divisor_offset", "first_layer", "skip_last",  the post-softmax site
//                   "intervals", "alpha", "beta"} | null}          (inference only)
//
// A region R is {"args": n, "ops": [...], "yield": [ids]}: the block arguments
// are values 0..n-1 and op k defines value n+k. An op is {"op": its MLIR name,
// "type": "f32"|"index"|"i64"|"i1"|..., "operands": [ids]} plus, by kind:
// "value" (arith.constant, ape.constant; a number, or "inf", "-inf", "nan"),
// "predicate" (arith.cmpf / cmpi, MLIR's spelling), "which" (ape.dim), and
// "source" (ape.load: {"kind": "param", "param": n} | {"kind": "tokens",
// "slot": n} | {"kind": "rows", "rows": n}).
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitterRegistry.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ape;

namespace {

/// A real number for JSON, which has no infinities or NaN: those become strings.
llvm::json::Value real(double v) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v > 0 ? "inf" : "-inf";
  return v;
}

std::string typeName(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

/// Where the container-level values of the encoding live in the JSON.
struct Layout {
  DenseMap<Value, unsigned> param, slot, rows;
};

FailureOr<llvm::json::Value> region(Region &r, const Layout &layout) {
  if (r.empty())
    return llvm::json::Value(nullptr);
  Block &block = r.front();
  DenseMap<Value, unsigned> id;
  for (BlockArgument a : block.getArguments())
    id[a] = id.size();
  llvm::json::Array ops;
  for (Operation &op : block.without_terminator()) {
    if (op.getNumResults() != 1 || op.getNumRegions() != 0)
      return op.emitOpError("cannot be written as reference data (one result, no regions)");
    llvm::json::Array operands;  // a load's operands are its indices (its source is below)
    auto load = dyn_cast<LoadOp>(op);
    for (Value v : load ? load.getIndices() : op.getOperands()) {
      auto it = id.find(v);
      if (it == id.end())
        return op.emitOpError("uses a value defined outside its region");
      operands.push_back(it->second);
    }
    llvm::json::Object o{{"op", op.getName().getStringRef()},
                         {"type", typeName(op.getResult(0).getType())},
                         {"operands", std::move(operands)}};
    if (auto c = dyn_cast<arith::ConstantOp>(op)) {
      if (auto f = dyn_cast<FloatAttr>(c.getValue()))
        o["value"] = real(f.getValueAsDouble());
      else if (auto i = dyn_cast<IntegerAttr>(c.getValue()))
        o["value"] = c.getType().isInteger(1) ? llvm::json::Value(i.getValue().getBoolValue())
                                              : llvm::json::Value(i.getInt());
      else
        return op.emitOpError("has a constant that is neither a number nor a boolean");
    } else if (auto c = dyn_cast<ConstantOp>(op)) {
      o["value"] = real(c.getValue().convertToDouble());
    } else if (auto c = dyn_cast<arith::CmpFOp>(op)) {
      o["predicate"] = arith::stringifyCmpFPredicate(c.getPredicate());
    } else if (auto c = dyn_cast<arith::CmpIOp>(op)) {
      o["predicate"] = arith::stringifyCmpIPredicate(c.getPredicate());
    } else if (auto d = dyn_cast<DimOp>(op)) {
      o["which"] = nameOf(d.getWhich());
    } else if (load) {
      Value src = load.getSource();
      if (auto it = layout.param.find(src); it != layout.param.end())
        o["source"] = llvm::json::Object{{"kind", "param"}, {"param", it->second}};
      else if (auto it = layout.slot.find(src); it != layout.slot.end())
        o["source"] = llvm::json::Object{{"kind", "tokens"}, {"slot", it->second}};
      else if (auto it = layout.rows.find(src); it != layout.rows.end())
        o["source"] = llvm::json::Object{{"kind", "rows"}, {"rows", it->second}};
      else
        return load.emitOpError("loads a value the encoding does not define");
    }
    id[op.getResult(0)] = id.size();
    ops.push_back(std::move(o));
  }
  llvm::json::Array yields;
  for (Value v : block.getTerminator()->getOperands()) {
    auto it = id.find(v);
    if (it == id.end())
      return block.getTerminator()->emitOpError("yields a value defined outside its region");
    yields.push_back(it->second);
  }
  return llvm::json::Value(llvm::json::Object{{"args", block.getNumArguments()},
                                              {"ops", std::move(ops)},
                                              {"yield", std::move(yields)}});
}

} // namespace

LogicalResult mlir::ape::emitReference(EncodingOp enc, StringRef source, raw_ostream &os) {
  Layout layout;
  llvm::json::Array params, features, tokens, rels, qmods, kmods, smods;
  llvm::json::Value valueRows = nullptr, embedding = nullptr, transition = nullptr;
  DenseMap<Operation *, unsigned> featureIndex;
  for (Operation &op : enc.getBody().front()) {
    if (auto p = dyn_cast<ParamOp>(op)) {
      layout.param[p] = params.size();
      llvm::json::Array shape;
      for (StringRef dim : p.getShape().getAsValueRange<StringAttr>())
        shape.push_back(dim);
      params.push_back(llvm::json::Object{
          {"name", p.getName()}, {"shape", std::move(shape)}, {"trainable", p.getTrainable()}});
    } else if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      layout.slot[f] = tokens.size();
      tokens.push_back(llvm::json::Object{{"op", "feature"}, {"feature", features.size()}});
      features.push_back(llvm::json::Object{{"name", f.getName()}});
    } else if (auto m = dyn_cast<MapOp>(op)) {
      auto body = region(m.getBody(), layout);
      if (failed(body))
        return failure();
      unsigned input = layout.slot.lookup(m.getInput());
      layout.slot[m] = tokens.size();
      tokens.push_back(
          llvm::json::Object{{"op", "map"}, {"input", input}, {"body", std::move(*body)}});
    } else if (auto s = dyn_cast<ScanOp>(op)) {
      unsigned input = layout.slot.lookup(s.getInput());
      layout.slot[s] = tokens.size();
      tokens.push_back(llvm::json::Object{{"op", "scan"}, {"input", input}});
    } else if (auto r = dyn_cast<RelRowsOp>(op)) {
      layout.rows[r] = rels.size();
      llvm::json::Value bias = nullptr;
      if (r.getBias())
        bias = layout.param.lookup(r.getBias());
      rels.push_back(llvm::json::Object{
          {"side", nameOf(r.getSide())},
          {"table", layout.param.lookup(r.getTable())},
          {"bias", bias}});
    } else if (isa<QModOp, KModOp>(op)) {
      auto body = region(op.getRegion(0), layout);
      if (failed(body))
        return failure();
      StringRef pairing = nameOf(isa<QModOp>(op) ? cast<QModOp>(op).getPairing()
                                                 : cast<KModOp>(op).getPairing());
      double fraction = isa<QModOp>(op) ? cast<QModOp>(op).getFraction().convertToDouble()
                                        : cast<KModOp>(op).getFraction().convertToDouble();
      (isa<QModOp>(op) ? qmods : kmods)
          .push_back(llvm::json::Object{
              {"pairing", pairing}, {"fraction", fraction}, {"body", std::move(*body)}});
    } else if (auto s = dyn_cast<ScoreModOp>(op)) {
      auto body = region(s.getBody(), layout);
      if (failed(body))
        return failure();
      smods.push_back(std::move(*body));
    } else if (auto v = dyn_cast<ValueRowsOp>(op)) {
      if (valueRows.kind() != llvm::json::Value::Null)
        return v.emitOpError("an encoding takes at most one ape.value_rows");
      auto index = region(v.getIndex(), layout);
      if (failed(index))
        return failure();
      valueRows = llvm::json::Object{{"table", layout.param.lookup(v.getTable())},
                                     {"index", std::move(*index)}};
    } else if (auto e = dyn_cast<PositionEmbeddingOp>(op)) {
      if (!e.getTable().empty()) {
        auto table = region(e.getTable(), layout);
        if (failed(table))
          return failure();
        embedding = llvm::json::Object{{"table", std::move(*table)}};
      }
    } else if (auto t = dyn_cast<AttentionTransitionOp>(op)) {
      // The post-softmax site: its attributes as the spec states them; the reference applies
      // the spec's steps to the materialised weights (runtime/SpecReference.cpp).
      if (transition.kind() != llvm::json::Value::Null)
        return t.emitOpError("an encoding takes at most one ape.attention_transition");
      transition = llvm::json::Object{{"divisor_offset", int64_t(t.getDivisorOffset())},
                                      {"first_layer", int64_t(t.getFirstLayer())},
                                      {"skip_last", int64_t(t.getSkipLast())},
                                      {"intervals", int64_t(t.getIntervals())},
                                      {"alpha", t.getAlpha().convertToDouble()},
                                      {"beta", t.getBeta().convertToDouble()}};
    } else if (!isa<MaskedProjectionOp>(op)) {
      // The masked projection acts before the kernel (the runtime projects x̃[..., l:]); the
      // kernel receives its result as q and k. Anything else was left by an earlier pass.
      return op.emitOpError("is not a generic form: the reference is written after "
                            "-ape-expand and -ape-push-override");
    }
  }
  llvm::json::Value scale = nullptr;
  if (auto s = enc.getScale())
    scale = s->convertToDouble();
  llvm::json::Object doc{{"format", "ape-reference/1"},
                         {"encoding", enc.getSymName()},
                         {"source", source},
                         {"scale", std::move(scale)},
                         {"causal", true},
                         {"params", std::move(params)},
                         {"features", std::move(features)},
                         {"tokens", std::move(tokens)},
                         {"rel_rows", std::move(rels)},
                         {"q_mods", std::move(qmods)},
                         {"k_mods", std::move(kmods)},
                         {"score_mods", std::move(smods)},
                         {"value_rows", std::move(valueRows)},
                         {"embedding", std::move(embedding)},
                         {"transition", std::move(transition)}};
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(doc))) << "\n";
  return success();
}

void mlir::ape::registerReferenceEmitter() {
  registerEmitter(
      {"reference",
       "OUTDIR/NAME.reference.json: the encoding's regions as data after expand\n"
       "and push-override, unfused and undifferentiated (ape-check's reference;\n"
       "docs/ape-check.md)",
       [](EncodingOp encoding, const EmitOptions &o) {
         std::string json;  // computed first: an encoding it cannot take writes no file
         llvm::raw_string_ostream os(json);
         if (failed(emitReference(encoding, o.source, os)))
           return failure();
         return writeFile(o.path(encoding.getSymName() + ".reference.json"),
                          [&](raw_ostream &out) {
                            out << json;
                            return success();
                          });
       }});
}
