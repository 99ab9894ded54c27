//===- CAbiEmitter.cpp - a C ABI library per kernel -----------------------===//
//
// `apec --emit=c-abi` writes OUTDIR/NAME_c_abi/, a folder that builds libape_NAME_c with a C++17
// compiler only (docs/frameworks.md):
//
//   ape_NAME.h            the C header: ape_NAME_args, forward/backward in f32 and f64, error
//                         strings, param sizes, the manifest (types shared in ape/c/abi.h)
//   ape_NAME_c.cpp        the extern "C" functions (checks, strided copies and the exception
//                         barrier live in ape/c/abi_impl.h)
//   NAME_cpu.cpp, ape/*.h the fused CPU kernel and its templates
//   CMakeLists.txt, NAME.manifest.json, README.md
//
//===----------------------------------------------------------------------===//
#include "codegen/EmittedFolder.h"
#include "codegen/EmitterRegistry.h"

#include "llvm/Support/raw_ostream.h"

#include <cctype>

using namespace mlir;
using namespace mlir::ape;
using folder::KernelInputInfo;

namespace {

std::string upper(StringRef s) {
  std::string out;
  for (char ch : s)
    out += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return out;
}

/// ape_NAME.h: the inputs beyond q, k and v (listed in its comment and as enum constants) are
/// filled into codegen/templates/c_abi/ape_NAME.h.
std::string header(const KernelInputInfo &info, StringRef source, bool inferenceOnly) {
  const std::string &n = info.encoding, N = upper(n);
  std::string inputs, enums;
  llvm::raw_string_ostream in(inputs), en(enums);
  if (info.features.empty() && info.params.empty())
    in << " *   (none)\n";
  for (const auto &f : info.features)
    in << " *   features[APE_" << N << "_FEATURE_" << upper(f.ident) << "]: token feature \""
       << f.name << "\", [B, H, T]\n";
  for (const auto &p : info.params)
    in << " *   params[APE_" << N << "_PARAM_" << upper(p.ident) << "]: \"" << p.name << "\" "
       << p.shapeText << ", init " << abi::name(p.init) << (p.trainable ? ", trainable" : ", not trainable")
       << "\n";
  for (const std::string &note : info.outside)
    in << folder::wrap("Not here: " + note + ".", " *   ");
  if (llvm::any_of(info.params, [](const auto &p) { return p.derived.has_value(); }))
    in << " * A projection_term / projection_prefix param is derived from a projection weight (the\n"
       << " * manifest says how: ape_" << n << "_manifest()); the caller computes it and receives its\n"
       << " * gradient.\n";
  inputs.pop_back();  // the template ends the line
  if (!info.features.empty()) {  // each enum on a line; none: no line
    en << "enum {";
    for (auto [i, f] : llvm::enumerate(info.features))
      en << (i ? ", " : " ") << "APE_" << N << "_FEATURE_" << upper(f.ident) << " = " << i;
    en << " };\n";
  }
  if (!info.params.empty()) {
    en << "enum {";
    for (auto [i, p] : llvm::enumerate(info.params))
      en << (i ? ", " : " ") << "APE_" << N << "_PARAM_" << upper(p.ident) << " = " << i;
    en << " };\n";
  }
  return folder::fromTemplate("c_abi/ape_NAME.h",
                              {{"NAME", n},
                               {"UNAME", N},
                               {"SOURCE", source.str()},
                               {"INPUTS", inputs},
                               {"NUM_FEATURES", std::to_string(info.features.size())},
                               {"NUM_PARAMS", std::to_string(info.params.size())},
                               {"ENUMS", enums},
                               {"INFERENCE_NOTE",
                                inferenceOnly
                                    ? " *\n"
                                      " * Inference only (an ape.attention_transition): forward also reads layer and\n"
                                      " * num_layers (the transition transforms some layers' rows of a prompt);\n"
                                      " * backward returns APE_ERROR_NOT_SUPPORTED.\n"
                                    : ""},
                               {"LAYER_FIELDS",
                                inferenceOnly
                                    ? "  int64_t layer, num_layers;  /* the layer (0-based) of a model of num_layers\n"
                                      "                                 layers that forward computes (0, 0: none is\n"
                                      "                                 transformed) */\n"
                                    : ""}});
}

/// ape_NAME_c.cpp: the table of the kernel's inputs filled into
/// codegen/templates/c_abi/ape_NAME_c.cpp.
std::string source(const KernelInputInfo &info, StringRef spec) {
  return folder::fromTemplate("c_abi/ape_NAME_c.cpp",
                              {{"NAME", info.encoding},
                               {"SOURCE", spec.str()},
                               {"KERNEL_INPUTS", folder::kernelInputsDefinition(info)}});
}

std::string cmakeLists(const KernelInputInfo &info, StringRef spec) {
  return folder::fromTemplate(
      "c_abi/CMakeLists.txt",
      {{"NAME", info.encoding},
       {"SOURCE", spec.str()},
       {"CPU_LEVELS", folder::cpuLevelsCMake(info.encoding, "ape_" + info.encoding + "_c")}});
}

std::string readme(const KernelInputInfo &info, StringRef spec, bool inferenceOnly) {
  return folder::fromTemplate(
      "c_abi/README.md",
      {{"NAME", info.encoding},
       {"SOURCE", spec.str()},
       {"INFERENCE_NOTE",
        inferenceOnly ? "\n\nInference only (an attention transition): the args hold `layer` and `num_layers` (before `kv_heads`),\n"
                        "the layer (0-based) of a model of num_layers layers that forward computes; the\n"
                        "backward returns `APE_ERROR_NOT_SUPPORTED`."
                      : ""}});
}

}  // namespace

LogicalResult mlir::ape::emitCAbi(KernelOp kernel, StringRef spec,
                                  std::vector<EmittedFile> &files) {
  FailureOr<KernelInputInfo> info = folder::collectInputs(kernel, {});
  if (failed(info))
    return failure();
  if (failed(folder::addKernelSources(kernel, spec, {"ape/c/abi_impl.h"}, files)))
    return failure();
  const std::string &n = info->encoding;
  files.push_back({"ape_" + n + ".h", header(*info, spec, kernel.getInferenceOnly())});
  files.push_back({"ape_" + n + "_c.cpp", source(*info, spec)});
  files.push_back({"CMakeLists.txt", cmakeLists(*info, spec)});
  files.push_back({"README.md", readme(*info, spec, kernel.getInferenceOnly())});
  return success();
}

void mlir::ape::registerCAbiEmitter() {
  registerEmitter({"c-abi",
                   "OUTDIR/NAME_c_abi/: ape_NAME.h (plain-pointer forward/backward, status\n"
                   "codes) and its library, CMakeLists.txt; builds without MLIR or the APE\n"
                   "runtime (docs/frameworks.md)",
                   [](KernelOp kernel, const EmitOptions &o) {
                     return writeFolder(o.path(kernel.getSymName() + "_c_abi"),
                                        [&](std::vector<EmittedFile> &files) {
                                          return emitCAbi(kernel, o.source, files);
                                        });
                   }});
}
