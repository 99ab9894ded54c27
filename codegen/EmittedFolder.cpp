//===- EmittedFolder.cpp - shared by the self-contained library emitters --===//
#include "codegen/EmittedFolder.h"

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/raw_ostream.h"

#include <cctype>
#include <cstdio>

using namespace mlir;
using namespace mlir::ape;

namespace {
struct EmbeddedFile {
  const char *path;
  const char *text;
};
// {"ape/cpu/attention.h", R"(...)"}, ...: kernels/include/ape/*.h that the folders copy,
// written by codegen/EmbedFiles.cmake (see codegen/CMakeLists.txt).
const EmbeddedFile kTemplates[] = {
#include "LibraryTemplates.inc"
};
// {"torch_library/CMakeLists.txt", R"(...)"}, ...: the files of codegen/templates/ that the
// emitters fill in (fromTemplate).
const EmbeddedFile kFolderTemplates[] = {
#include "FolderTemplates.inc"
};
}  // namespace

std::string folder::uniqueIdentifier(StringRef name, llvm::StringSet<> &taken) {
  std::string id;
  for (char ch : name)
    id += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  if (id.empty() || std::isdigit(static_cast<unsigned char>(id[0])))
    id = "_" + id;
  // Compared ignoring case: the C ABI also spells identifiers in upper case.
  while (taken.contains(StringRef(id).lower()))
    id += "_";
  taken.insert(StringRef(id).lower());
  return id;
}

FailureOr<folder::KernelInputInfo> folder::collectInputs(KernelOp kernel,
                                                          ArrayRef<StringRef> reserved) {
  KernelInputInfo info;
  info.encoding = kernel.getSymName().str();
  if (auto s = kernel.getScale())
    info.scale = s->convertToDouble();
  llvm::StringSet<> taken;
  for (StringRef r : reserved)
    taken.insert(r.lower());
  for (Operation &op : kernel.getBody().front()) {
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      info.features.push_back({f.getName().str(), uniqueIdentifier(f.getName(), taken)});
    } else if (auto p = dyn_cast<ParamOp>(op)) {
      KernelInputInfo::Param param{p.getName().str(), uniqueIdentifier(p.getName(), taken),
                                   {}, "[", p.getTrainable(), p.getInit()};
      for (auto [i, dim] : llvm::enumerate(getDims(p))) {
        param.dims.push_back(dim);
        param.shapeText += (i ? ", " : "") + dim.str();
      }
      param.shapeText += "]";
      if (abi::is_derived(p.getInit())) {
        // The verifier (ParamOp::verify) guarantees the arguments of each kind.
        auto f64 = [](std::optional<APFloat> v, double fallback) {
          return v ? v->convertToDouble() : fallback;
        };
        KernelInputInfo::Param::Derived d{*p.getProjection(),
                                          static_cast<int64_t>(*p.getColumns())};
        d.start = f64(p.getStart(), 0.0);
        d.step = f64(p.getStep(), 0.0);
        d.scale = f64(p.getScale(), 1.0);
        param.derived = d;
      }
      param.range = getValueRange(p);
      if (auto v = p.getValue())
        param.initArg = v->convertToDouble();
      else if (auto sd = p.getStd())
        param.initArg = sd->convertToDouble();
      if (param.dims.size() > 8)
        return p.emitOpError("has ") << param.dims.size()
                                     << " dimensions; the generated libraries take at most 8";
      info.params.push_back(std::move(param));
    } else if (auto e = dyn_cast<PositionEmbeddingOp>(op)) {
      info.outside.push_back(
          std::string("absolute positions are added to the token embedding (") +
          (e.getLearned() ? "a learned table" : "a closed-form table") +
          "), not in attention: these kernels compute the attention alone, so add the embedding to "
          "the model's input yourself (the manifest's \"embedding\" says how)");
    } else if (isa<MaskedProjectionOp>(op)) {
      info.outside.push_back(
          "the override projects q/k (and v) from part of the input only: compute q, k and v "
          "with the manifest's \"override\" before calling these kernels");
    }
  }
  return info;
}

std::string folder::wrap(StringRef text, StringRef prefix, size_t width) {
  std::string out, line;
  SmallVector<StringRef> words;
  text.split(words, ' ', -1, /*KeepEmpty=*/false);
  for (StringRef w : words) {
    if (!line.empty() && prefix.size() + line.size() + 1 + w.size() > width) {
      out += prefix.str() + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w.str();
  }
  if (!line.empty())
    out += prefix.str() + line + "\n";
  return out;
}

std::string folder::substitute(StringRef text,
                               ArrayRef<std::pair<StringRef, std::string>> vars) {
  std::string out;
  while (!text.empty()) {
    size_t at = text.find('@');
    out += text.take_front(at).str();
    if (at == StringRef::npos)
      break;
    StringRef tail = text.drop_front(at + 1);
    size_t end = tail.find('@');
    const auto *var = end == StringRef::npos ? vars.end() : llvm::find_if(vars, [&](const auto &v) {
      return v.first == tail.take_front(end);
    });
    if (var != vars.end()) {  // @KEY@
      out += var->second;
      text = tail.drop_front(end + 1);
    } else {  // a lone '@'
      out += '@';
      text = tail;
    }
  }
  return out;
}

std::string folder::fromTemplate(StringRef name,
                                 ArrayRef<std::pair<StringRef, std::string>> vars) {
  const EmbeddedFile *found = nullptr;
  for (const EmbeddedFile &f : kFolderTemplates)
    if (name == f.path)
      found = &f;
  if (!found)
    llvm::report_fatal_error("apec was built without the template codegen/templates/" + name);
  // The template's keys and `vars` must match: a key left over or a value never used means the
  // template and its emitter have drifted apart.
  llvm::StringSet<> keys;
  static const llvm::Regex key("@([A-Z][A-Z0-9_]*)@");
  SmallVector<StringRef, 2> match;
  for (StringRef text = found->text; key.match(text, &match);
       text = text.drop_front(match[0].data() + match[0].size() - text.data() - 1))
    keys.insert(match[1]);  // drops one '@' less, so "@A@B@" finds A and B
  for (const auto &var : vars)
    if (!keys.erase(var.first))
      llvm::report_fatal_error("codegen/templates/" + name + " has no @" + var.first + "@");
  if (!keys.empty())
    llvm::report_fatal_error("codegen/templates/" + name + ": @" + keys.begin()->first() +
                             "@ is not filled in");
  return substitute(found->text, vars);
}

std::string folder::cpuLevelsCMake(StringRef name, StringRef target) {
  std::string text = fromTemplate("emitted_folder/cpu_levels.cmake",
                                  {{"NAME", name.str()}, {"TARGET", target.str()}});
  if (StringRef(text).ends_with("\n"))
    text.pop_back();
  return text;
}

std::string folder::cString(StringRef s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\')
      out += '\\', out += ch;
    else if (ch == '\n')
      out += "\\n";
    else if (std::isprint(static_cast<unsigned char>(ch)))
      out += ch;
    else {
      char octal[8];
      std::snprintf(octal, sizeof octal, "\\%03o", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      out += octal;
    }
  }
  return out + "\"";
}

std::string folder::cDouble(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);  // round-trips
  std::string s = text;
  if (s.find_first_of(".en") == std::string::npos)  // "2" -> "2.0": a double literal
    s += ".0";
  return s;
}

namespace {
// The C++ spellings of the contract's values in the generated tables (vocabulary.h); the switches
// name every enumerator, so a new one is a compile error here, not a wrong table.
std::string dimInitializer(const abi::Dim &d) {
  switch (d.kind) {
  case abi::Dim::Kind::Heads: return "{ape_abi::Dim::Kind::Heads, 0}";
  case abi::Dim::Kind::HeadDim: return "{ape_abi::Dim::Kind::HeadDim, 0}";
  case abi::Dim::Kind::Fixed: return "{ape_abi::Dim::Kind::Fixed, " + std::to_string(d.value) + "}";
  }
  llvm_unreachable("unknown dim kind");
}
std::string enumerator(abi::InitKind k) {
  switch (k) {
  case abi::InitKind::Zeros: return "ape_abi::InitKind::Zeros";
  case abi::InitKind::Ones: return "ape_abi::InitKind::Ones";
  case abi::InitKind::Normal: return "ape_abi::InitKind::Normal";
  case abi::InitKind::Constant: return "ape_abi::InitKind::Constant";
  case abi::InitKind::AlibiSlopes: return "ape_abi::InitKind::AlibiSlopes";
  case abi::InitKind::Sinusoidal: return "ape_abi::InitKind::Sinusoidal";
  case abi::InitKind::ProjectionTerm: return "ape_abi::InitKind::ProjectionTerm";
  case abi::InitKind::ProjectionPrefix: return "ape_abi::InitKind::ProjectionPrefix";
  }
  llvm_unreachable("unknown init kind");
}
std::string enumerator(abi::Projection p) {
  switch (p) {
  case abi::Projection::Q: return "ape_abi::Projection::Q";
  case abi::Projection::K: return "ape_abi::Projection::K";
  case abi::Projection::V: return "ape_abi::Projection::V";
  }
  llvm_unreachable("unknown projection");
}
} // namespace

std::string folder::kernelInputsDefinition(const KernelInputInfo &info) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "// The inputs of @" << info.encoding
     << " beyond q, k and v, in manifest order (ape/contract/kernel_inputs.h).\n"
     << "const ape::KernelInputs &kernel_inputs() {\n";
  if (!info.features.empty()) {
    os << "  static const char *const features[] = {";
    for (auto [i, f] : llvm::enumerate(info.features))
      os << (i ? ", " : "") << cString(f.name);
    os << "};\n";
  }
  if (!info.params.empty()) {
    os << "  static const ape::ParamInput params[] = {\n";
    for (const auto &p : info.params) {
      os << "      {" << cString(p.name) << ", " << p.dims.size() << ", {";
      for (auto [i, d] : llvm::enumerate(p.dims))
        os << (i ? ", " : "") << dimInitializer(d);
      os << "}, " << (p.trainable ? "true" : "false") << ", " << enumerator(p.init) << ", ";
      if (p.derived)
        os << "{true, " << enumerator(p.derived->projection) << ", " << p.derived->columns << ", "
           << cDouble(p.derived->start) << ", " << cDouble(p.derived->step) << ", "
           << cDouble(p.derived->scale) << "}";
      else
        os << "{}";
      if (p.range)
        os << ", true, {" << cDouble(p.range->min) << ", " << cDouble(p.range->max) << ", "
           << (p.range->integer ? "true" : "false") << "}";
      else
        os << ", false, {0, 0, false}";
      os << ", " << cDouble(p.initArg) << "},  // " << p.shapeText << "\n";
    }
    os << "  };\n";
  }
  os << "  static const ape::KernelInputs inputs{" << cString(info.encoding)
     << ", ape_kernel_entry_" << info.encoding << "(), " << info.features.size() << ", "
     << (info.features.empty() ? "nullptr" : "features") << ", " << info.params.size() << ", "
     << (info.params.empty() ? "nullptr" : "params") << ", "
     << (info.scale ? "true" : "false") << ", "
     << llvm::formatv("{0:e17}", info.scale.value_or(0.0)) << "};\n"
     << "  return inputs;\n}\n";
  return text;
}

/// The "ape/..." headers that `text` (a file at `path`) includes with quotes: `#include
/// "ape/cpu/x.h"` (from the folder root, as the kernel headers include each other), or `#include
/// "x.h"` beside the including file.
/// Includes inside `#ifdef APE_SIMT` (the SIMT emulator's surface, for APE's own tests) are not
/// part of an emitted folder.
static SmallVector<std::string> apeIncludes(StringRef path, StringRef text) {
  SmallVector<std::string> out;
  StringRef dir = path.contains('/') ? path.rsplit('/').first : StringRef();
  SmallVector<StringRef> lines;
  text.split(lines, '\n');
  int simtDepth = 0, depth = 0;  // #if nesting, and the depth of an open #ifdef APE_SIMT
  for (StringRef line : lines) {
    line = line.trim();
    if (line.starts_with("#if")) {
      ++depth;
      if (!simtDepth && line == "#ifdef APE_SIMT")
        simtDepth = depth;
      continue;
    }
    if (line.starts_with("#else") || line.starts_with("#elif")) {
      if (simtDepth == depth)
        simtDepth = 0;
      continue;
    }
    if (line.starts_with("#endif")) {
      if (simtDepth == depth)
        simtDepth = 0;
      --depth;
      continue;
    }
    if (simtDepth || !line.consume_front("#include") || !line.ltrim().starts_with("\""))
      continue;
    StringRef name = line.ltrim().drop_front().split('"').first;
    std::string full =
        dir.empty() || name.starts_with("ape/") ? name.str() : (dir + "/" + name).str();
    if (StringRef(full).starts_with("ape/"))
      out.push_back(full);
  }
  return out;
}

LogicalResult folder::addKernelSources(KernelOp kernel, StringRef source,
                                       ArrayRef<StringRef> templates,
                                       std::vector<EmittedFile> &files) {
  StringRef name = kernel.getSymName();
  std::string cpu, manifest;
  {
    llvm::raw_string_ostream os(cpu);
    if (failed(emitCpuKernel(kernel, source, os)))
      return failure();
  }
  {
    llvm::raw_string_ostream os(manifest);
    if (failed(emitManifest(kernel, source, os)))
      return failure();
  }
  // The requested templates and everything they and the kernel include, transitively.
  SmallVector<std::string> pending(templates.begin(), templates.end());
  llvm::append_range(pending, apeIncludes("", cpu));
  if (failed(addTemplates(kernel, pending, files)))
    return failure();
  files.push_back({(name + "_cpu.cpp").str(), std::move(cpu)});
  files.push_back({(name + ".manifest.json").str(), std::move(manifest)});
  return success();
}

LogicalResult folder::addTemplates(KernelOp kernel, ArrayRef<std::string> templates,
                                   std::vector<EmittedFile> &files) {
  llvm::StringSet<> copied;
  for (const EmittedFile &f : files)
    copied.insert(f.path);
  SmallVector<std::string> pending(templates.begin(), templates.end());
  while (!pending.empty()) {
    std::string path = pending.pop_back_val();
    if (!copied.insert(path).second)
      continue;
    const EmbeddedFile *found = nullptr;
    for (const EmbeddedFile &f : kTemplates)
      if (path == f.path)
        found = &f;
    if (!found)
      return kernel.emitOpError("needs the template ")
             << path << ", which apec was built without (kernels/include/)";
    llvm::append_range(pending, apeIncludes(path, found->text));
    files.push_back({path, found->text});
  }
  return success();
}
