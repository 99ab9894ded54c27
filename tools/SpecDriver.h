//===- SpecDriver.h - read, check and lower a spec (apec, the fuzzer) ------===//
//
// The front half of apec, shared with the fuzz target (fuzz/apec_fuzzer.cpp) so that the
// fuzzer drives exactly the path a user's spec takes:
//
//   text ──checkNesting──▶ ──parseSourceFile──▶ module (verified) ──lowerSpec──▶ ape.kernel ops
//
// MLIR's parser descends recursively into regions, attributes, types and parentheses, one
// stack frame chain per level (~2 KB); a spec nested a few thousand levels deep overflowed the
// stack (SIGSEGV). No spec needs more than a handful of levels, so the text is scanned first and
// a spec nested deeper than kMaxNestingDepth gets a located error instead.
//
//===----------------------------------------------------------------------===//
#ifndef APE_TOOLS_SPECDRIVER_H
#define APE_TOOLS_SPECDRIVER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/Support/SourceMgr.h"

namespace mlir {
class MLIRContext;
class PassManager;
} // namespace mlir

namespace mlir::ape {

/// The deepest nesting of brackets ({ [ ( <, in any mix) a spec may use. A spec uses about 6
/// (encoding, region, op, attribute dictionary, array, type); the parser's stack holds
/// thousands. Closing brackets, strings and comments are understood; `->` is not a bracket.
constexpr unsigned kMaxNestingDepth = 256;

/// The dialects a spec may use: ape, arith, math.
void registerSpecDialects(mlir::DialectRegistry &registry);

/// Reports, at the first bracket that opens level kMaxNestingDepth + 1 of the main buffer of
/// `sourceMgr`, "nesting deeper than N levels" through `context`'s diagnostic engine.
mlir::LogicalResult checkNesting(const llvm::SourceMgr &sourceMgr, mlir::MLIRContext *context);

/// Reports the first use of a value name that the main buffer has not defined above it (a spec
/// never needs one; MLIR 19's parser corrupted the heap on one into a region that then failed).
/// A non-empty `splitMarker` (ape-opt -split-input-file) checks each chunk between markers alone.
mlir::LogicalResult checkForwardReferences(const llvm::SourceMgr &sourceMgr, mlir::MLIRContext *context,
                                           llvm::StringRef splitMarker = {});

/// `file` without a UTF-8 byte-order mark at its start (editors on Windows write one; MLIR's
/// lexer does not skip it), columns then counted as an editor shows them. Any other file as is.
std::unique_ptr<llvm::MemoryBuffer> withoutByteOrderMark(std::unique_ptr<llvm::MemoryBuffer> file);

/// A spec is UTF-8 text: a UTF-16 file or a NUL byte is refused, saying so.
mlir::LogicalResult checkUtf8(const llvm::SourceMgr &sourceMgr, mlir::MLIRContext *context);

/// A number with an exponent and no '.' (1e5, 2E-3) is refused at its place, saying to write
/// 1.0e5: MLIR's lexer reads a float only with a '.', and took 1e5 as the integer 1 before an
/// identifier e5 ("expected '}' in attribute dictionary", or "Dialect '' not found for custom op
/// 'e400'" in a region).
mlir::LogicalResult checkFloatLiterals(const llvm::SourceMgr &sourceMgr, mlir::MLIRContext *context);

/// checkNesting and checkForwardReferences, then parses and verifies the main buffer; null (with diagnostics emitted)
/// when the spec is malformed, is not UTF-8 (UTF-16, by its byte-order mark or its NUL bytes) or
/// holds no ape.encoding. A value of an encoding that nothing uses (a param, a token feature, rows
/// or a token sequence that no region reads) gets a warning: the lowering drops it, so a trainable
/// one would not be trained, saved or given to the kernels.
mlir::OwningOpRef<mlir::ModuleOp> parseSpec(llvm::SourceMgr &sourceMgr,
                                            mlir::MLIRContext *context);

/// Runs the whole lowering (expand, push-override, fast-math, fuse, differentiate, schedule) on `module`
/// with `pm` (which may carry MLIR's pass-manager options); the module then holds one
/// ape.kernel per encoding.
mlir::LogicalResult lowerSpec(mlir::ModuleOp module, mlir::PassManager &pm);

} // namespace mlir::ape

#endif // APE_TOOLS_SPECDRIVER_H
