//===- ManifestEmitter.cpp - the manifest (JSON) of a kernel --------------===//
//
// The manifest tells a runtime what the generated kernel needs beyond q, k
// and v: the token features it computes from the block input, the params it
// creates (shapes, initialisers, trainable or derived), the masked
// projection, the logit scale and the schedule. Its schema is documented in
// docs/internals.md, section 3.
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitterRegistry.h"

#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace mlir::ape;

LogicalResult mlir::ape::emitManifest(KernelOp kernel, StringRef source, raw_ostream &os) {
  llvm::json::Array features, params;
  llvm::json::Value override = nullptr, embedding = nullptr;
  for (Operation &op : kernel.getBody().front()) {
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      features.push_back(llvm::json::Object{{"name", f.getName()},
                                            {"weight_std", f.getWeightStd().convertToDouble()},
                                            {"bias", f.getBias().convertToDouble()}});
    } else if (auto p = dyn_cast<ParamOp>(op)) {
      llvm::json::Array shape;
      for (const abi::Dim &d : getDims(p)) {  // symbols stay strings, sizes become integers
        if (d.is(abi::Dim::Kind::Fixed))
          shape.push_back(d.value);
        else
          shape.push_back(d.str());
      }
      // The kind and the arguments it takes (abi::init_arg_use; the verifier admits no other).
      llvm::json::Object init{{"kind", nameOf(p.getInit())}};
      auto f64 = [](std::optional<llvm::APFloat> v) -> llvm::json::Value {
        return v ? llvm::json::Value(v->convertToDouble()) : llvm::json::Value(nullptr);
      };
      for (abi::InitArg arg : abi::kInitArgs) {
        llvm::json::Value v = nullptr;
        switch (arg) {
        case abi::InitArg::Std: v = f64(p.getStd()); break;
        case abi::InitArg::Value: v = f64(p.getValue()); break;
        case abi::InitArg::Projection:
          if (auto proj = p.getProjection())
            v = nameOf(*proj);
          break;
        case abi::InitArg::Columns:
          if (auto cols = p.getColumns())
            v = static_cast<int64_t>(*cols);
          break;
        case abi::InitArg::Start: v = f64(p.getStart()); break;
        case abi::InitArg::Step: v = f64(p.getStep()); break;
        case abi::InitArg::Scale: v = f64(p.getScale()); break;
        }
        if (v.kind() != llvm::json::Value::Null)
          init[nameOf(arg)] = std::move(v);
      }
      llvm::json::Object param{{"name", p.getName()},
                               {"shape", std::move(shape)},
                               {"init", std::move(init)},
                               {"trainable", p.getTrainable()},
                               {"per_layer", !p.getShared()}};
      if (std::optional<ape_rules::Range> range = getValueRange(p))
        param["range"] = llvm::json::Object{
            {"min", range->min}, {"max", range->max}, {"integer", range->integer}};
      params.push_back(std::move(param));
    } else if (auto m = dyn_cast<MaskedProjectionOp>(op)) {
      llvm::json::Value sigma = nullptr;
      if (auto s = m.getPositionScale())
        sigma = *s;
      override = llvm::json::Object{{"l", m.getL()},
                                    {"targets", nameOf(m.getTargets())},
                                    {"kind", nameOf(m.getKind())},
                                    {"start", m.getStart().convertToDouble()},
                                    {"theta", m.getTheta().convertToDouble()},
                                    {"theta1", m.getTheta1().convertToDouble()},
                                    {"theta2", m.getTheta2().convertToDouble()},
                                    {"position_scale", std::move(sigma)}};
    } else if (auto e = dyn_cast<PositionEmbeddingOp>(op)) {
      llvm::json::Object emb{{"kind", e.getLearned() ? "learned" : "table"},
                             {"scale_embedding", e.getScaleEmbedding()}};
      if (e.getLearned()) {
        emb["max_length"] = static_cast<int64_t>(*e.getMaxLength());
        emb["std"] = e.getStd().convertToDouble();
      }
      embedding = std::move(emb);
    }
  }
  // The rotation of q/k pairs (rotary, xPos): a runtime checks that its head_dim rotates what
  // the spec says (ape_rules::checkRotation).
  llvm::json::Value rotation = nullptr;
  for (Operation &op : kernel.getBody().front())
    if (auto q = dyn_cast<QModOp>(op); q && q.getPairing() != abi::Pairing::None)
      rotation = llvm::json::Object{{"pairing", nameOf(q.getPairing())},
                                    {"fraction", q.getFraction().convertToDouble()}};
  // The prob site: an attention transition (inference only: the kernel has no backward).
  llvm::json::Value transition = nullptr;
  for (Operation &op : kernel.getBody().front())
    if (auto t = dyn_cast<AttentionTransitionOp>(op))
      transition = llvm::json::Object{{"divisor_offset", t.getDivisorOffset()},
                                      {"first_layer", t.getFirstLayer()},
                                      {"skip_last", t.getSkipLast()},
                                      {"intervals", t.getIntervals()},
                                      {"alpha", t.getAlpha().convertToDouble()},
                                      {"beta", t.getBeta().convertToDouble()}};
  llvm::json::Value scale = nullptr;
  if (auto s = kernel.getScale())
    scale = s->convertToDouble();
  auto opt = [](std::optional<uint64_t> v) -> llvm::json::Value {
    return v ? llvm::json::Value(static_cast<int64_t>(*v)) : llvm::json::Value(nullptr);
  };
  auto hint = [](std::optional<uint64_t> v) -> llvm::json::Value {
    return v ? llvm::json::Value(static_cast<int64_t>(*v)) : llvm::json::Value(nullptr);
  };
  llvm::json::Object manifest{
      {"encoding", kernel.getSymName()},
      {"head_dim", hint(kernel.getHeadDim())},
      {"model_dim", hint(kernel.getModelDim())},
      {"source", source},
      {"generator", "apec"},
      {"scale", std::move(scale)},
      {"causal", kernel.getCausal()},
      {"passes", opt(kernel.getPasses())},
      {"tile_q", opt(kernel.getTileQ())},
      {"tile_k", opt(kernel.getTileK())},
      {"features", std::move(features)},
      {"params", std::move(params)},
      {"override", std::move(override)},
      {"embedding", std::move(embedding)},
      {"rotation", std::move(rotation)},
      {"transition", std::move(transition)},
      {"inference_only", kernel.getInferenceOnly()},
      {"grads", kernel.getInferenceOnly()
                    ? llvm::json::Array{}
                    : llvm::json::Array{"q", "k", "v", "features", "params"}}};
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(manifest))) << "\n";
  return success();
}

void mlir::ape::registerManifestEmitter() {
  registerEmitter({"manifest",
                   "OUTDIR/NAME.manifest.json: inputs, params, features, projection, schedule",
                   [](KernelOp kernel, const EmitOptions &o) {
                     return writeFile(o.path(kernel.getSymName() + ".manifest.json"),
                                      [&](raw_ostream &os) {
                                        return emitManifest(kernel, o.source, os);
                                      });
                   },
                   kEmitByDefault});
}
