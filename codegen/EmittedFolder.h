//===- EmittedFolder.h - shared by the self-contained library emitters ----===//
//
// Private to codegen/: what `apec --emit=torch-library` (TorchLibraryEmitter.cpp) and
// `apec --emit=c-abi` (CAbiEmitter.cpp) share. Both write a folder that builds without MLIR or
// the APE runtime: the generated CPU kernel, the kernel templates it includes (embedded in apec
// at build time), the manifest, and a table of the kernel's inputs (kernels/include/ape/
// contract/kernel_inputs.h) that the library checks its arguments against.
//
//===----------------------------------------------------------------------===//
#ifndef APE_CODEGEN_EMITTEDFOLDER_H
#define APE_CODEGEN_EMITTEDFOLDER_H

#include "codegen/Emitters.h"

#include "llvm/ADT/StringSet.h"

#include <optional>
#include <string>
#include <vector>

namespace mlir::ape::folder {

/// The inputs of a kernel beyond q, k and v, in manifest order, each with a C identifier
/// (unique, not one of the reserved names) for argument lists and enum constants.
struct KernelInputInfo {
  struct Feature {
    std::string name, ident;
  };
  struct Param {
    std::string name, ident;
    SmallVector<abi::Dim> dims;  // "heads", "head_dim" or a size
    std::string shapeText;       // "[heads, head_dim]"
    bool trainable;
    abi::InitKind init;
    /// For a param computed from a projection weight (init projection_term or
    /// projection_prefix): which weight ('q', 'k', 'v'), how many columns, and the init's
    /// start/step (term) or scale (prefix). Absent for every other param.
    struct Derived {
      abi::Projection projection;
      int64_t columns;
      double start = 0, step = 0, scale = 1;
    };
    std::optional<Derived> derived;
    /// A fixed param's values (ParamOp's value range: ape_rules::Range), absent where any go.
    std::optional<::ape_rules::Range> range;
    /// The init's argument: a constant's value, a normal's std (0 for the other kinds).
    double initArg = 0;
  };
  std::string encoding;
  SmallVector<Feature> features;
  SmallVector<Param> params;
  std::optional<double> scale;  // absent: 1/sqrt(D)
  /// What the encoding does outside the attention kernels, which the caller must do itself
  /// (absolute positions added to the token embedding, an override's masked projections): one
  /// sentence each, for the generated headers (none: empty).
  SmallVector<std::string> outside;
};

/// `text` in lines of at most `width` characters, each starting with `prefix` and ending with '\n'.
std::string wrap(StringRef text, StringRef prefix, size_t width = 96);

/// Collects the features and params of `kernel`; identifiers avoid `reserved`.
FailureOr<KernelInputInfo> collectInputs(KernelOp kernel, ArrayRef<StringRef> reserved);

/// `name` made a C identifier that is not in `taken` (then added to it).
std::string uniqueIdentifier(StringRef name, llvm::StringSet<> &taken);

/// The C++ definition of `const ape::KernelInputs &kernel_inputs()` for `info` (to be placed
/// in an anonymous namespace after a declaration of ape_kernel_entry_<encoding>()).
std::string kernelInputsDefinition(const KernelInputInfo &info);

/// Appends to `files`: NAME_cpu.cpp (the CPU kernel), NAME.manifest.json, the embedded
/// templates named in `templates` (paths under kernels/include, e.g. "ape/torch/ops.h") and
/// every template that they or the kernel include.
LogicalResult addKernelSources(KernelOp kernel, StringRef source, ArrayRef<StringRef> templates,
                               std::vector<EmittedFile> &files);

/// Appends to `files` the embedded templates named in `templates` and every template they
/// include, except those `files` already holds; an unknown template is an error on `kernel`.
LogicalResult addTemplates(KernelOp kernel, ArrayRef<std::string> templates,
                           std::vector<EmittedFile> &files);

/// The CMake lines that compile the kernel NAME_cpu.cpp of a folder into `target` once per
/// instruction-set level (kernels/include/ape/cpu/dispatch.h): on x86-64 with GCC or Clang two
/// generated wrappers add the AVX2 and AVX-512 units, and every unit learns the set of levels
/// (APE_KERNEL_LEVELS). To be placed after add_library(target ...): a folder's CMakeLists.txt
/// template has it as @CPU_LEVELS@ on a line of its own (the text has no final newline).
std::string cpuLevelsCMake(StringRef name, StringRef target);

/// `text` with every @KEY@ replaced by its value in `vars` (values are not scanned again; an
/// '@' that does not start a key of `vars` stays).
std::string substitute(StringRef text, ArrayRef<std::pair<StringRef, std::string>> vars);

/// The template codegen/templates/`name` (embedded in apec at build time) with its @KEY@s
/// replaced by `vars`. Every @KEY@ (upper case) of the template must be in `vars` and every
/// entry of `vars` must be used: a mismatch is a bug in apec and aborts it.
std::string fromTemplate(StringRef name, ArrayRef<std::pair<StringRef, std::string>> vars);

/// `x` as a C/C++ double literal that reads back exactly (finite x).
std::string cDouble(double x);

/// `s` as a C/C++ string literal, quotes included.
std::string cString(StringRef s);

}  // namespace mlir::ape::folder

#endif  // APE_CODEGEN_EMITTEDFOLDER_H
