//===- SpecDriver.cpp - read, check and lower a spec ----------------------===//
#include "tools/SpecDriver.h"

#include "dialect/ApeDialect.h"
#include "dialect/ApeOps.h"
#include "dialect/RegionTypes.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/SmallVector.h"

using namespace mlir;

void mlir::ape::registerSpecDialects(DialectRegistry &registry) {
  registry.insert<ApeDialect, arith::ArithDialect, math::MathDialect>();
}

/// One pass over the text with a stack of open brackets. A closing bracket pops back to its
/// opener (a mismatch ends the parse there anyway, so forgiving it only lowers the count);
/// `->` and `>=` are not brackets; strings ("...", with escapes) and // comments are skipped.
LogicalResult mlir::ape::checkNesting(const llvm::SourceMgr &sourceMgr, MLIRContext *context) {
  const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  llvm::StringRef text = buffer->getBuffer();
  llvm::SmallVector<char, 64> open;
  auto closes = [](char opener, char closer) {
    return (opener == '{' && closer == '}') || (opener == '[' && closer == ']') ||
           (opener == '(' && closer == ')') || (opener == '<' && closer == '>');
  };
  for (size_t i = 0, n = text.size(); i < n; ++i) {
    char ch = text[i];
    if (ch == '"') {  // a string: up to the unescaped closing quote (or the end)
      for (++i; i < n && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
      continue;
    }
    if (ch == '/' && i + 1 < n && text[i + 1] == '/') {
      while (i < n && text[i] != '\n')
        ++i;
      continue;
    }
    if (ch == '{' || ch == '[' || ch == '(' || ch == '<') {
      open.push_back(ch);
      if (open.size() <= kMaxNestingDepth)
        continue;
      unsigned line = 0, column = 0;
      std::tie(line, column) =
          sourceMgr.getLineAndColumn(llvm::SMLoc::getFromPointer(text.data() + i));
      emitError(FileLineColLoc::get(context, buffer->getBufferIdentifier(), line, column))
          << "nesting deeper than " << kMaxNestingDepth
          << " levels of '{', '[', '(' or '<' (a spec needs a handful; the parser's stack "
             "would overflow)";
      return failure();
    }
    if (ch == '}' || ch == ']' || ch == ')' || ch == '>') {
      if (ch == '>' && ((i > 0 && text[i - 1] == '-') || (i + 1 < n && text[i + 1] == '=')))
        continue;  // `->` (function types, maps), `>=` (integer sets)
      auto it = llvm::find_if(llvm::reverse(open), [&](char o) { return closes(o, ch); });
      if (it != open.rend())
        open.resize(open.rend() - it - 1);
    }
  }
  return success();
}

OwningOpRef<ModuleOp> mlir::ape::parseSpec(llvm::SourceMgr &sourceMgr, MLIRContext *context) {
  if (failed(checkNesting(sourceMgr, context)))
    return nullptr;
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, context);
  if (!module)
    return nullptr;
  if (module->getOps<EncodingOp>().empty()) {
    const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
    emitError(FileLineColLoc::get(context, buffer->getBufferIdentifier(), 1, 1))
        << "no ape.encoding in this file";
    return nullptr;
  }
  // The region language's types (dialect/RegionTypes.h), checked here where the op still has its
  // place in the file.
  WalkResult types = module->walk([](Operation *op) {
    if (isa<arith::ArithDialect, math::MathDialect>(op->getDialect()) && failed(ape::checkRegionTypes(op)))
      return WalkResult::interrupt();
    return WalkResult::advance();
  });
  if (types.wasInterrupted())
    return nullptr;
  return module;
}

LogicalResult mlir::ape::lowerSpec(ModuleOp module, PassManager &pm) {
  buildApeLoweringPipeline(pm);
  return pm.run(module);
}
