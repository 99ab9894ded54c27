//===- SpecDriver.cpp - read, check and lower a spec ----------------------===//
#include "tools/SpecDriver.h"

#include <algorithm>

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

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
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

using namespace mlir;

void mlir::ape::registerSpecDialects(DialectRegistry &registry) {
  registry.insert<ApeDialect, arith::ArithDialect, math::MathDialect>();
}

/// One pass over the text with a stack of open brackets. A closing bracket pops back to its
/// opener (a mismatch ends the parse there anyway, so forgiving it only lowers the count);
/// `->` and `>=` are not brackets; strings ("...", with escapes) and // comments are skipped.
/// At a string or a `//` comment starting at text[i]: moves i to its last character (the closing
/// quote, or the end of the line) and returns true, for the text scans before parsing.
static bool skipStringOrComment(llvm::StringRef text, size_t &i) {
  const size_t n = text.size();
  if (text[i] == '"') {  // up to the unescaped closing quote (or the end)
    for (++i; i < n && text[i] != '"'; ++i)
      if (text[i] == '\\')
        ++i;
    return true;
  }
  if (text[i] == '/' && i + 1 < n && text[i + 1] == '/') {
    while (i < n && text[i] != '\n')
      ++i;
    return true;
  }
  return false;
}

LogicalResult mlir::ape::checkNesting(const llvm::SourceMgr &sourceMgr, MLIRContext *context) {
  const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  llvm::StringRef text = buffer->getBuffer();
  llvm::SmallVector<char, 64> open;
  auto closes = [](char opener, char closer) {
    return (opener == '{' && closer == '}') || (opener == '[' && closer == ']') ||
           (opener == '(' && closer == ')') || (opener == '<' && closer == '>');
  };
  for (size_t i = 0, n = text.size(); i < n; ++i) {
    if (skipStringOrComment(text, i))
      continue;
    char ch = text[i];
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

LogicalResult mlir::ape::checkFloatLiterals(const llvm::SourceMgr &sourceMgr, MLIRContext *context) {
  const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  llvm::StringRef text = buffer->getBuffer();
  auto isDigit = [](char c) { return c >= '0' && c <= '9'; };
  // (a digit after one of these is inside a name or a number: %x1e5, @e2e3, 1.5e3's 5)
  auto inToken = [&](char c) {
    return isDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || llvm::StringRef("_$.%@^#!").contains(c);
  };
  for (size_t i = 0, n = text.size(); i < n; ++i) {
    if (skipStringOrComment(text, i))
      continue;
    if (llvm::StringRef("%^#!@").contains(text[i])) {  // a name, '-' and all (%x-1e5, #m-1e5)
      while (i + 1 < n && (llvm::isAlnum(text[i + 1]) || llvm::StringRef("_$.-").contains(text[i + 1])))
        ++i;
      continue;
    }
    if (!isDigit(text[i]) || (i > 0 && inToken(text[i - 1])))
      continue;
    size_t j = i;
    if (text[i] == '0' && i + 1 < n && (text[i + 1] == 'x' || text[i + 1] == 'X')) {  // hex: 0x1e5
      for (j = i + 2; j < n && llvm::isHexDigit(text[j]); ++j) {
      }
    } else {
      while (j < n && isDigit(text[j]))
        ++j;
      const size_t k = j + 1 < n && (text[j + 1] == '+' || text[j + 1] == '-') ? j + 2 : j + 1;
      if (j < n && (text[j] == 'e' || text[j] == 'E') && k < n && isDigit(text[k])) {
        size_t end = k;
        while (end < n && isDigit(text[end]))
          ++end;
        const std::string written = text.slice(i, end).str();
        const std::string meant = text.slice(i, j).str() + ".0" + text.slice(j, end).str();
        auto [line, column] = sourceMgr.getLineAndColumn(llvm::SMLoc::getFromPointer(text.data() + i));
        emitError(FileLineColLoc::get(context, buffer->getBufferIdentifier(), line, column))
            << "'" << written << "' is not a number here: a float needs a '.' (write " << meant
            << "; MLIR reads " << written << " as the integer " << text.slice(i, j) << " followed by a name)";
        return failure();
      }
    }
    i = j - 1;  // (past the number)
  }
  return success();
}

/// A value used before the file defines it, where the file defines it later, is refused before
/// MLIR parses the file. A spec never needs one (a region reads values defined above it; the
/// encoding's body is isolated from above), and MLIR 19's parser frees a region that fails to
/// parse while a forward reference from an earlier region still points into it (llvm-project
/// #107121, fixed in LLVM 21): `%9` used in one q_mod and defined in the next, which then failed,
/// corrupted the heap (apec and ape-opt aborted in malloc). A name never defined is left to MLIR
/// (it has nothing to point into). Strings and comments are skipped; a definition is a block
/// argument `%x : type` inside `^bb(...)`, or a result `%x =`, `%x : 2 =`, `%a, %b =`.
LogicalResult mlir::ape::checkForwardReferences(const llvm::SourceMgr &sourceMgr, MLIRContext *context,
                                                llvm::StringRef splitMarker) {
  const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  llvm::StringRef text = buffer->getBuffer();
  const size_t n = text.size();
  auto nameChar = [](char c) { return llvm::isAlnum(c) || c == '_' || c == '.' || c == '$' || c == '-'; };
  auto skipSpace = [&](size_t k) {
    while (k < n && (text[k] == ' ' || text[k] == '\t' || text[k] == '\n' || text[k] == '\r'))
      ++k;
    return k;
  };
  // With a split marker (ape-opt -split-input-file) every chunk is a file of its own: a name
  // another chunk defines neither excuses nor makes a forward reference. The chunks' first bytes,
  // where MLIR splits (on the marker's text, wherever it stands).
  std::vector<size_t> chunkStarts{0};
  if (!splitMarker.empty())
    for (size_t at = text.find(splitMarker); at != llvm::StringRef::npos; at = text.find(splitMarker, at + 1))
      chunkStarts.push_back(at + splitMarker.size());
  auto chunkOf = [&](const char *p) {
    return std::upper_bound(chunkStarts.begin(), chunkStarts.end(), size_t(p - text.data())) - chunkStarts.begin();
  };
  struct Name {
    llvm::StringRef name;
    bool def;
  };
  std::vector<Name> names;  // in file order
  int header = 0;           // inside a block header's parentheses: their depth
  for (size_t i = 0; i < n; ++i) {
    if (skipStringOrComment(text, i))
      continue;
    const char ch = text[i];
    if (ch == '^') {  // `^bb0(` opens a block header
      size_t k = i + 1;
      while (k < n && nameChar(text[k]))
        ++k;
      if (k > i + 1 && k < n && text[k] == '(' && header == 0) {
        header = 1;
        i = k;
      }
      continue;
    }
    if (header > 0 && (ch == '(' || ch == ')')) {
      header += ch == '(' ? 1 : -1;
      continue;
    }
    if (ch != '%' || (i > 0 && nameChar(text[i - 1])))
      continue;
    size_t e = i + 1;
    while (e < n && nameChar(text[e]))
      ++e;
    if (e == i + 1)
      continue;
    const llvm::StringRef name = text.slice(i, e);
    size_t k = skipSpace(e);
    bool def = false;
    if (header > 0) {
      def = k < n && text[k] == ':';  // a block argument
    } else if (k < n && text[k] == ':') {  // `%x : 2 =`, a result group
      size_t d = skipSpace(k + 1), d0 = d;
      while (d < n && llvm::isDigit(text[d]))
        ++d;
      d = skipSpace(d);
      def = d > d0 && d < n && text[d] == '=' && (d + 1 >= n || text[d + 1] != '=');
    } else {
      while (k < n && text[k] == ',') {  // `%a, %b = ...`
        k = skipSpace(k + 1);
        if (k >= n || text[k] != '%')
          break;
        ++k;
        while (k < n && nameChar(text[k]))
          ++k;
        k = skipSpace(k);
      }
      def = k < n && text[k] == '=' && (k + 1 >= n || text[k + 1] != '=');
    }
    names.push_back({name, def});
    i = e - 1;
  }
  llvm::StringSet<> later;  // the names the chunk defines from here on
  std::vector<bool> forward(names.size(), false);
  for (size_t x = names.size(); x-- > 0;) {
    if (x + 1 < names.size() && chunkOf(names[x].name.data()) != chunkOf(names[x + 1].name.data()))
      later.clear();
    if (names[x].def)
      later.insert(names[x].name);
    else
      forward[x] = later.contains(names[x].name);
  }
  llvm::StringSet<> defined;  // the names the chunk defined above
  for (size_t x = 0; x < names.size(); ++x) {
    if (x > 0 && chunkOf(names[x].name.data()) != chunkOf(names[x - 1].name.data()))
      defined.clear();
    if (names[x].def) {
      defined.insert(names[x].name);
    } else if (forward[x] && !defined.contains(names[x].name)) {
      unsigned line = 0, column = 0;
      std::tie(line, column) = sourceMgr.getLineAndColumn(llvm::SMLoc::getFromPointer(names[x].name.data()));
      emitError(FileLineColLoc::get(context, buffer->getBufferIdentifier(), line, column))
          << "'" << names[x].name << "' is used before it is defined (a region reads only values defined above it)";
      return failure();
    }
  }
  return success();
}

std::unique_ptr<llvm::MemoryBuffer>
mlir::ape::withoutByteOrderMark(std::unique_ptr<llvm::MemoryBuffer> file) {
  llvm::StringRef text = file->getBuffer();
  if (!text.starts_with("\xEF\xBB\xBF"))
    return file;
  return llvm::MemoryBuffer::getMemBufferCopy(text.drop_front(3), file->getBufferIdentifier());
}

/// A spec is UTF-8 text: a UTF-16 file (a byte-order mark FF FE or FE FF, or NUL bytes at every
/// other byte, as Windows tools write) would fail at 1:1 with "unexpected character", and a NUL
/// byte elsewhere is no text (MLIR's lexer skips one in a comment). Each gets an error that says so.
LogicalResult mlir::ape::checkUtf8(const llvm::SourceMgr &sourceMgr, MLIRContext *context) {
  const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  llvm::StringRef text = buffer->getBuffer();
  const bool mark = text.starts_with("\xFF\xFE") || text.starts_with("\xFE\xFF");
  const size_t nul = text.find('\0');
  if (!mark && nul == llvm::StringRef::npos)
    return success();
  int nuls[2] = {0, 0};  // among the first 64 bytes, at even and at odd offsets
  for (size_t i = 0; i < std::min<size_t>(text.size(), 64); ++i)
    nuls[i % 2] += text[i] == '\0';
  const bool alternating = std::max(nuls[0], nuls[1]) >= 8 && std::min(nuls[0], nuls[1]) == 0;
  if (mark || alternating) {
    emitError(FileLineColLoc::get(context, buffer->getBufferIdentifier(), 1, 1))
        << "the file is not UTF-8 text (it looks like UTF-16: "
        << (mark ? "a UTF-16 byte-order mark" : "a NUL at every other byte") << "); save the spec as UTF-8";
    return failure();
  }
  auto [line, column] = sourceMgr.getLineAndColumn(llvm::SMLoc::getFromPointer(text.data() + nul));
  emitError(FileLineColLoc::get(context, buffer->getBufferIdentifier(), line, column))
      << "a NUL byte: a spec is UTF-8 text";
  return failure();
}

/// The values of an encoding's body that nothing reads, warned about at their location: a value is
/// read when an op without results (a component, a region's yield) uses it, or an op whose value is
/// read does (so a param whose only load is unused is not read). A param that an
/// ape.masked_projection names as its position_scale is read by name.
/// The ops of an encoding that something reads: the ops without results (regions, yields) and,
/// transitively, what their operands are computed from.
static llvm::DenseSet<Operation *> readOps(mlir::ape::EncodingOp encoding) {
  llvm::DenseSet<Operation *> read;
  llvm::SmallVector<Operation *> work;
  encoding.getBody().walk([&](Operation *op) {
    if (op->getNumResults() == 0 && read.insert(op).second)
      work.push_back(op);
  });
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && read.insert(def).second)
        work.push_back(def);
  }
  return read;
}

static void warnUnusedValues(ModuleOp module) {
  using namespace mlir::ape;
  for (EncodingOp encoding : module.getOps<EncodingOp>()) {
    llvm::SmallVector<StringRef> byName;
    for (auto m : encoding.getBody().front().getOps<MaskedProjectionOp>())
      if (std::optional<StringRef> sigma = m.getPositionScale())
        byName.push_back(*sigma);
    const llvm::DenseSet<Operation *> read = readOps(encoding);
    for (Operation &op : encoding.getBody().front()) {
      if (op.getNumResults() == 0 || read.contains(&op))
        continue;
      auto name = op.getAttrOfType<StringAttr>("name");
      if (isa<ParamOp>(op) && name && llvm::is_contained(byName, name.getValue()))
        continue;
      InFlightDiagnostic w = op.emitWarning();
      w << "'" << op.getName() << "'";
      if (name)
        w << " \"" << name.getValue() << "\"";
      w << (op.use_empty() ? " is never used" : " is never used (only by values nothing uses)")
        << ": the kernels will not read it";
      if (isa<ParamOp, TokenFeatureOp>(op))
        w << ", and a runtime will neither create, train nor save it";
      w << " (read it in a region, or remove it)";
    }
  }
}

OwningOpRef<ModuleOp> mlir::ape::parseSpec(llvm::SourceMgr &sourceMgr, MLIRContext *context) {
  if (failed(checkUtf8(sourceMgr, context)) || failed(checkNesting(sourceMgr, context)) ||
      failed(checkFloatLiterals(sourceMgr, context)) || failed(checkForwardReferences(sourceMgr, context)))
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
  // So are constant param indices (a computed one the kernels clamp; one the passes fold too).
  WalkResult types = module->walk([](Operation *op) {
    if (isa_and_nonnull<arith::ArithDialect, math::MathDialect>(op->getDialect()) && failed(ape::checkRegionTypes(op)))
      return WalkResult::interrupt();
    if (auto load = dyn_cast<LoadOp>(op); load && failed(checkConstantIndices(load)))
      return WalkResult::interrupt();
    return WalkResult::advance();
  });
  if (types.wasInterrupted())
    return nullptr;
  warnUnusedValues(*module);
  return module;
}

LogicalResult mlir::ape::lowerSpec(ModuleOp module, PassManager &pm) {
  // The params and token features each encoding reads, to say afterwards which its kernel leaves
  // out: those nothing reads once the regions are composed and folded (a later score_mod that
  // ignores the score it is given; a load in a branch a constant decides), which the syntactic
  // warning (warnUnusedValues) cannot see. A runtime would neither create, train nor save them.
  struct Declared {
    std::string encoding, name;
    Location loc;
    bool param;
  };
  std::vector<Declared> declared;
  for (EncodingOp encoding : module.getOps<EncodingOp>()) {
    const llvm::DenseSet<Operation *> read = readOps(encoding);
    for (Operation &op : encoding.getBody().front())
      if (isa<ParamOp, TokenFeatureOp>(op) && read.contains(&op))
        if (auto name = op.getAttrOfType<StringAttr>("name"))
          declared.push_back({encoding.getSymName().str(), name.str(), op.getLoc(), isa<ParamOp>(op)});
  }
  buildApeLoweringPipeline(pm);
  if (failed(pm.run(module)))
    return failure();
  for (const Declared &d : declared) {
    bool kept = false, found = false;
    for (KernelOp kernel : module.getOps<KernelOp>()) {
      if (kernel.getSymName() != d.encoding)
        continue;
      found = true;
      kernel.walk([&](Operation *op) {
        if (isa<ParamOp, TokenFeatureOp>(op) && isa<ParamOp>(op) == d.param)
          if (auto name = op->getAttrOfType<StringAttr>("name"); name && name.getValue() == d.name)
            kept = true;
      });
    }
    if (found && !kept)
      emitWarning(d.loc) << "'" << (d.param ? "ape.param" : "ape.token_feature") << "' \"" << d.name
                         << "\" is not read once the regions are composed (a later score_mod ignores the "
                            "score it is given, or its loads sit in a branch a constant decides): the kernels "
                            "will not read it, and a runtime will neither create, train nor save it";
  }
  return success();
}
