// ape-check: a spec's fused kernel against a reference derived from the same spec by another path
// (docs/ape-check.md).
//
//   ape-check examples/encodings/rope.mlir
//   ape-check my_encoding.mlir                  compiled now (runtime/SpecLibrary.h, cached)
//   ape-check my_rope.mlir --kernel rope        the registry's rope kernel against my_rope's spec
//
// apec --emit=reference writes the spec's regions as data (after expand and push-override, before
// fuse and differentiate); SpecReference evaluates them with LibTorch ops on the materialised
// T x T logits and takes gradients by autograd; SpecCheck compares the kernel with it (fp64,
// fp32, central differences) and prints a pass/fail table. Exit status: 0 every check passed,
// 1 a check failed, 2 the spec or the arguments could not be checked.
#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "Cli.h"

#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/Options.h"
#include "runtime/Registry.h"
#include "runtime/Manifest.h"
#include "runtime/SimtAttention.h"
#include "runtime/SpecCheck.h"
#include "runtime/SpecLibrary.h"
#include "runtime/SpecReference.h"
#include "runtime/Threads.h"
#include "runtime/Util.h"

#ifndef APE_SOURCE_DIR
#error "APE_SOURCE_DIR: the source root whose examples/encodings/ the registry was compiled from"
#endif

namespace fs = std::filesystem;

namespace {

// The apec next to this executable (both live in the build's tools/), unless told otherwise.
std::string default_apec() {
  if (const char *env = std::getenv("APE_APEC"); env && *env) return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(self.parent_path() / "apec")) return (self.parent_path() / "apec").string();
  return "apec";
}

// Runs apec on `spec` into `dir` (reference data and manifest); its diagnostics go to stderr.
int run_apec(const std::string &apec, const std::string &spec, const fs::path &dir) {
  const std::vector<std::string> args = {apec, spec, "-o", dir.string(), "--emit=reference,manifest"};
  std::vector<char *> argv;
  for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot start apec");
  if (pid == 0) {
    execvp(argv[0], argv.data());
    std::cerr << "ape-check: cannot run " << apec << " (give the compiler with --apec or $APE_APEC)\n";
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;  // the wait status (ape::system_status_text reads it)
}

// A temporary folder removed on scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ape-check-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary folder");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<ape::CheckShape> parse_shapes(const std::string &text) {
  std::vector<ape::CheckShape> out;
  std::stringstream all(text);
  std::string item;
  while (std::getline(all, item, ',')) {
    ape::CheckShape s;
    long long b, h, t, d;
    char x1, x2, x3;
    std::istringstream in(item);
    if (!(in >> b >> x1 >> h >> x2 >> t >> x3 >> d) || x1 != 'x' || x2 != 'x' || x3 != 'x' ||
        !(in >> std::ws).eof())
      throw std::runtime_error("--shapes: '" + item + "' is not BxHxTxD (e.g. 2x3x37x16)");
    if (b < 1 || h < 1 || t < 1 || d < 2 || b > 64 || h > 64 || t > 4096 || d > 256)
      throw std::runtime_error("--shapes: '" + item +
                               "' out of range (B, H in [1, 64], T in [1, 4096], D in [2, 256])");
    s.B = b, s.H = h, s.T = t, s.D = d;
    out.push_back(s);
  }
  if (out.empty()) throw std::runtime_error("--shapes: no shape given");
  // (getline drops a trailing empty item, which a leading or middle one above is refused as)
  if (text.back() == ',') throw std::runtime_error("--shapes: an empty item at its end");
  return out;
}

}  // namespace

static int tool_main(int argc, char **argv) {
  ape::prepare_threads(argv);
  CLI::App app{
      "ape-check: check the fused kernel of a spec against a materialised reference derived from\n"
      "the same spec by an independent path, forward and backward.\n\n"
      "  ape-check SPEC.mlir [--kernel NAME] [--shapes BxHxTxD,...] [--seed N] [--verbose] [--cuda]\n\n"
      "apec --emit=reference writes the spec's regions as data, taken after expand and\n"
      "push-override (named components such as ape.rotary are already generic regions there),\n"
      "before fuse and differentiate. LibTorch evaluates them elementwise: the token program per\n"
      "token, every q/k mod on the whole q/k tensors, every score_mod on the full causal T x T\n"
      "logits, then softmax, P.V (and value rows), and torch autograd gives the gradients; the\n"
      "fused kernel, its tiles and -ape-differentiate are not involved. For every shape of the grid\n"
      "(default 1x1x1x16, 2x3x37x16, 1x2x64x32, 2x2x150x64: T = 1, a partial 64-tile, one tile,\n"
      "several tiles) the kernel's fp64 and fp32 results are compared with the fp64 reference:\n"
      "o, lse, dq, dk, dv, the gradient of every feature and param, and the fixed position table;\n"
      "and the KV-cache decode steps that ape-generate runs (the cell's tokens as a prompt of\n"
      "ceil(T/2), two single tokens and the rest in one step): each step's o and lse against the\n"
      "reference over the tokens so far (rows decode:o, decode:lse); and all of it again under\n"
      "grouped-query attention at the cell with the most heads, its heads doubled (tripled where\n"
      "it has 2) and k, v of the cell's heads (groups of 2 or 3; a spec pinning model_dim: H / p\n"
      "key heads, p the smallest divisor of H above 1 other than sqrt(H)), against the reference\n"
      "over k, v repeated to every query head (rows grouped:*, grouped-decode:*).\n"
      "fp64 must agree within --fp64-tol (normalised error max|err| / max(1, max|ref|)); fp32 within\n"
      "max(--fp32-factor x the fp32 reference's own error (at most --fp32-yardstick-max),\n"
      "--fp32-floor); a param gradient, a sum over the N = B H T (T+1)/2 query-key pairs, at\n"
      "least --fp32-param-floor x S x sqrt(max(1, D/16)), S = sqrt(N) or, where larger, its\n"
      "sensitivity to the rounding of Delta, sqrt(sum_i (sum_j P_ij ds_ij/dw)^2) (the reference's\n"
      "estimate over random signs). fp64 central differences of the kernel's forward (at the first\n"
      "partial-tile shape) at --fd-entries entries of q, k, v, every feature and every trainable\n"
      "param check its backward. Inputs are N(0, 1); params come from their manifest initialisers\n"
      "(fixed ones as they are, trainable ones moved off degenerate values; docs/ape-check.md).\n\n"
      "An inference-only spec (an ape.attention_transition) has no backward: o and lse are checked\n"
      "at every layer of a model of --layers layers (the transformed layers and the others), the\n"
      "reference applying the spec's steps to the materialised softmax weights.\n\n"
      "The kernel: with --kernel NAME, the kernel NAME compiled into this build; for a spec that is\n"
      "one of the examples this build compiled (examples/encodings/NAME.mlir, same text), that\n"
      "kernel; any other spec file is compiled now, as ape-train --spec does (apec and the C++\n"
      "compiler into a library cached under $APE_CACHE_DIR, default $XDG_CACHE_HOME/ape or\n"
      "~/.cache/ape).\n\n"
      "Prints a table with one row per quantity and precision (the worst cell) and exits with 0\n"
      "when every check passes, 1 when one fails (or the kernel's params and features are not the\n"
      "spec's), 2 when the spec or the arguments cannot be checked (apec's located diagnostics are\n"
      "shown)."};
  std::string spec, kernel_name, shapes, apec = default_apec();
  ape::CheckOptions opt;
  int64_t seed = 1;
  app.add_option("spec", spec, "The spec file (.mlir) holding one ape.encoding")->required();
  app.add_option("--kernel", kernel_name,
                 "Check the kernel NAME compiled into this build against SPEC's reference (its params and\n"
                 "features must match the spec's)")
      ->type_name("NAME");
  app.add_option("--shapes", shapes, "Comma-separated grid of BxHxTxD (B, H in [1, 64], T in [1, 4096], D in [2, 256])")
      ->type_name("BxHxTxD,...");
  app.add_option("--seed", seed, "Seed of the random inputs, in [0, 2^31)")->capture_default_str();
  app.add_option("--fd-entries", opt.fd_entries,
                 "Central differences per input (the largest gradient entry, then random ones), in [1, 64]")
      ->capture_default_str();
  app.add_option("--fp64-tol", opt.fp64_tol, "Tolerance of the fp64 kernel's normalised error, in (0, 1]")
      ->capture_default_str();
  app.add_option("--fp32-factor", opt.fp32_factor,
                 "fp32 tolerance: this many times the fp32 reference's own error, in [1, 1e6]")
      ->capture_default_str();
  app.add_option("--fp32-param-floor", opt.fp32_param_floor,
                 "The least fp32 tolerance of a param gradient, per sqrt of the B H T (T+1)/2 query-key\n"
                 "pairs it sums or per unit of its sensitivity to Delta's rounding where larger, times\n"
                 "sqrt(D/16) above head dim 16, in (0, 1]")
      ->capture_default_str();
  app.add_option("--fp32-floor", opt.fp32_floor, "The least fp32 tolerance, in (0, 1]")->capture_default_str();
  app.add_option("--fp32-yardstick-max", opt.fp32_yardstick_max,
                 "The largest fp32 reference error taken as the yardstick (beyond it single precision has\n"
                 "lost the quantity, and the row says so), in (0, 1]")
      ->capture_default_str();
  app.add_option("--apec", apec, "The compiler (default: $APE_APEC, else the apec next to ape-check)")
      ->capture_default_str();
  app.add_option("--layers", opt.num_layers,
                 "An attention transition: the depth of the model whose every layer is checked, in [1, 256]")
      ->capture_default_str();
  app.add_flag("--verbose", opt.verbose, "A row per grid cell instead of the worst one per quantity");
  bool no_decode = false;
  app.add_flag("--no-decode", no_decode,
               "Leave out the KV-cache decode rows (decode:o, decode:lse and grouped-decode:*: each cell's\n"
               "tokens through the decode steps ape-generate runs, as a prompt of ceil(T/2), two single\n"
               "tokens and the rest)");
  bool cuda = false;
  app.add_flag("--cuda", cuda,
               "Check the spec's CUDA kernels too, f32 and bf16, on the SIMT emulator (no GPU needed; its\n"
               "memory, race and barrier checks on): apec --emit=cuda and the C++ compiler build them now\n"
               "(cached), at the grid's head dims among 32, 64 and 128 (with --kernel NAME: the build's\n"
               "emulated kernels of NAME, the variants it has); rows cuda-f32 (the fp32 tolerance) and\n"
               "cuda-bf16 (--bf16-tol on the normalised error, or --bf16-factor x the reference's own change\n"
               "under the kernels' bf16 roundings, whichever is larger; the reference fed the bf16-rounded q,\n"
               "k, v and dO), the CUDA decode steps' too (decode:o, decode:lse). An inference-only spec is\n"
               "refused.");
  app.add_option("--bf16-tol", opt.bf16_tol, "--cuda: the least tolerance of the bf16 kernels' normalised error, in (0, 1]")
      ->capture_default_str();
  ape::cli::add_list_option(app, "--cuda-archs", opt.cuda_archs,
                 "--cuda: the architectures whose kernels are checked, the emulator posing as each (80, 86, 89,\n"
                 "90): sm_80's rows cuda-f32 and cuda-bf16, another's smNN-bf16 (sm_90: the Hopper forward and\n"
                 "the wgmma backward that H100 and H200 run, on a device of 2 multiprocessors)",
                            /*show_default=*/true);
  app.add_option("--bf16-factor", opt.bf16_factor,
                 "--cuda: a bf16 row's tolerance is at least this times its yardstick (the reference's change\n"
                 "when q', k', P, o, dS and the gradients are rounded to bf16 where the kernels round them), in\n"
                 "[1, 1e6]")
      ->capture_default_str();
  app.add_option("--bf16-param-factor", opt.bf16_param_factor,
                 "--cuda: a bf16 param gradient's tolerance is at least this times its yardstick (the root\n"
                 "mean square of 4 stochastic roundings' changes, over sqrt(2)), in [1, 1e6]")
      ->capture_default_str();
  app.footer(ape::kernel_cpu_level_help());
  APE_CLI_PARSE_STATUS(app, argc, argv, 2);  // (1 is a failed check)

  try {
    ape::require_in("--seed", seed, 0, (int64_t(1) << 31) - 1);
    ape::require_in("--fd-entries", int64_t(opt.fd_entries), 1, 64);
    ape::require_in("--layers", opt.num_layers, int64_t(1), int64_t(256));
    ape::require_in("--fp64-tol", opt.fp64_tol, 0.0, 1.0, /*open_low=*/true);
    ape::require_in("--fp32-factor", opt.fp32_factor, 1.0, 1e6);
    ape::require_in("--fp32-param-floor", opt.fp32_param_floor, 0.0, 1.0, /*open_low=*/true);
    ape::require_in("--fp32-floor", opt.fp32_floor, 0.0, 1.0, /*open_low=*/true);
    ape::require_in("--fp32-yardstick-max", opt.fp32_yardstick_max, 0.0, 1.0, /*open_low=*/true);
    ape::require_in("--bf16-tol", opt.bf16_tol, 0.0, 1.0, /*open_low=*/true);
    ape::require_in("--bf16-param-factor", opt.bf16_param_factor, 1.0, 1e6);
    ape::require_in("--bf16-factor", opt.bf16_factor, 1.0, 1e6);
    for (size_t n = 0; n < opt.cuda_archs.size(); ++n) {
      const int sm = opt.cuda_archs[n];
      if (sm != 80 && sm != 86 && sm != 89 && sm != 90)
        throw std::invalid_argument("--cuda-archs: " + std::to_string(sm) + " is not 80, 86, 89 or 90");
      if (std::find(opt.cuda_archs.begin(), opt.cuda_archs.begin() + n, sm) != opt.cuda_archs.begin() + n)
        throw std::invalid_argument("--cuda-archs names " + std::to_string(sm) + " twice");
    }
    if (opt.cuda_archs.empty()) throw std::invalid_argument("--cuda-archs names no architecture");
    opt.seed = static_cast<uint64_t>(seed);
    opt.decode = !no_decode;
    if (!shapes.empty()) opt.grid = parse_shapes(shapes);
    if (!fs::exists(spec)) throw std::runtime_error("cannot read " + spec + ": no such file");
    if (!fs::is_regular_file(spec)) throw std::runtime_error("cannot read " + spec + ": not a file");
    if (!kernel_name.empty()) {  // unknown: fail now, listing the names (ape-check's own hint)
      try {
        ape::find_kernel(kernel_name);
      } catch (const std::runtime_error &e) {
        std::string m = e.what();
        m = m.substr(0, m.rfind(" (ape-train --list"));
        throw std::runtime_error(m + " (--kernel names a built-in encoding; a spec of your own is the SPEC argument)");
      }
    }
    const std::string cpu_level = ape::checked_kernel_cpu_level();
  } catch (const std::exception &e) {
    std::cerr << "ape-check: error: " << ape::error_text(e) << "\n";
    return 2;
  }

  TempDir dir;
  const int rc = run_apec(apec, spec, dir.path);
  if (rc != 0) {
    std::cerr << "ape-check: error: apec could not compile " << spec << " (it " << ape::system_status_text(rc)
              << ")\n";
    return 2;
  }
  std::vector<fs::path> refs;
  for (const auto &e : fs::directory_iterator(dir.path))
    if (e.path().string().size() > 15 &&
        e.path().string().compare(e.path().string().size() - 15, 15, ".reference.json") == 0)
      refs.push_back(e.path());
  if (refs.size() != 1) {
    std::cerr << "ape-check: error: " << spec << " holds " << refs.size()
              << " encodings; ape-check takes a spec with exactly one\n";
    return 2;
  }

  try {
    const ape::SpecReference ref = ape::SpecReference::parse(ape::read_file(refs[0]), spec);
    // --shapes against the spec's hints and rotation, before the kernels are compiled (minutes).
    if (!opt.grid.empty()) {
      fs::path manifest = refs[0];
      manifest.replace_filename(ref.encoding() + ".manifest.json");
      ape::fit_grid(ape::Manifest::parse(ape::read_file(manifest), manifest.string()), opt.grid);
    }
    const std::string name = ref.encoding();
    const ape::KernelEntry *entry = nullptr;
    ape::SpecLibrary library;
    std::string origin;
    if (!kernel_name.empty()) {
      entry = &ape::find_kernel(kernel_name);
      origin = "the kernel " + kernel_name + " compiled into this build (--kernel)";
    } else {
      const fs::path example = fs::path(APE_SOURCE_DIR) / "examples" / "encodings" / (name + ".mlir");
      const auto names = ape::kernel_names();
      const bool registered = std::find(names.begin(), names.end(), name) != names.end();
      std::error_code ec;
      if (registered && fs::is_regular_file(example, ec) && ape::read_file(example) == ape::read_file(spec)) {
        entry = &ape::find_kernel(name);
        origin = "the kernel compiled into this build from examples/encodings/" + name + ".mlir";
      } else {
        // Any other spec file: compiled now into a cached library (runtime/SpecLibrary.h).
        ape::SpecLibraryOptions lib_opts;
        lib_opts.apec = apec;
        lib_opts.log = &std::cout;
        lib_opts.show_warnings = false;  // run_apec showed them
        library = ape::load_spec_library(spec, lib_opts);
        entry = library.entry;
        origin = "compiled from " + spec + " (" + library.library + (library.cached ? ", cached" : "") + ")";
        if (library.name != name)
          throw std::runtime_error("the compiled library holds @" + library.name + ", the spec @" + name);
      }
    }
    std::string cuda_origin;
    if (cuda) {  // the CUDA kernels of the spec for the emulator, at the grid's head dims
      if (ref.has_transition())
        throw std::runtime_error("--cuda: an inference-only spec (an attention transition) has no CUDA backward "
                                 "to check; check its CPU kernel without --cuda");
      const ape::Manifest &man = ape::manifest_of(*entry);
      // On the default grid the CUDA rows check head dim 128 too (default_cuda_cells).
      if (opt.grid.empty()) opt.cuda_cells = ape::default_cuda_cells(man);
      std::vector<int64_t> dims;  // the grid's head dims that CUDA kernels have
      std::vector<ape::CheckShape> cuda_grid = ape::fit_grid(man, opt.grid);
      cuda_grid.insert(cuda_grid.end(), opt.cuda_cells.begin(), opt.cuda_cells.end());
      for (const ape::CheckShape &s : cuda_grid) {
        if ((s.D == 32 || s.D == 64 || s.D == 128) && std::find(dims.begin(), dims.end(), s.D) == dims.end())
          dims.push_back(s.D);
      }
      std::sort(dims.begin(), dims.end());
      if (dims.empty())
        throw std::runtime_error("--cuda: no shape of the grid has a CUDA head dim (32, 64 or 128); give one "
                                 "with --shapes");
      if (!kernel_name.empty()) {
        // The build's emulated kernels of NAME, as the CPU rows check the build's CPU kernel: the
        // variants it has (bf16 at head dim 64, every one for a few encodings: docs/cuda.md).
        for (const auto &[dtype, D] : ape::simt_variants(kernel_name)) {
          if (dtype == "f16" || std::find(dims.begin(), dims.end(), D) == dims.end()) continue;
          if (std::find(opt.cuda_dtypes.begin(), opt.cuda_dtypes.end(), dtype) == opt.cuda_dtypes.end())
            opt.cuda_dtypes.push_back(dtype);
          if (std::find(opt.cuda_head_dims.begin(), opt.cuda_head_dims.end(), D) == opt.cuda_head_dims.end())
            opt.cuda_head_dims.push_back(D);
        }
        if (opt.cuda_dtypes.empty())
          throw std::runtime_error("--cuda: this build has no emulated f32 or bf16 kernel of " + kernel_name +
                                   " at the grid's head dims; give --shapes with head dim 64");
        cuda_origin = "the emulated kernels of " + kernel_name + " compiled into this build (";
      } else {
        ape::SpecLibrary source = library;  // the spec's text, whichever kernel the CPU rows check
        source.name = name, source.spec_path = spec, source.spec_text = ape::read_file(spec);
        ape::SpecLibraryOptions lib_opts;
        lib_opts.apec = apec;
        lib_opts.log = &std::cout;
        opt.cuda_dtypes = {"f32", "bf16"};
        opt.cuda_head_dims = dims;
        ape::add_simt_kernels(ape::load_spec_simt(source, {"", opt.cuda_dtypes, dims, ape::simt_kernel_abi()}, lib_opts));
        cuda_origin = "compiled from " + spec + " for the SIMT emulator (";
      }
      opt.use_kernels = [](const std::string &dtype) {
        if (dtype == "cpu") ape::use_cpu_kernels();
        else ape::use_simt_kernels(dtype);
      };
      // (sm_90 with 2 multiprocessors: the persistent Hopper forward's blocks claim tiles; 0: the
      // pose from before)
      opt.pose_cuda = [before = ape::simt_device_pose()](int sm) {
        if (sm == 0) ape::pose_simt_device(before.first, before.second);
        else ape::pose_simt_device(sm, sm == 90 ? 2 : 0);
      };
      opt.cuda_decode = [entry](const std::string &dtype, const at::Tensor &q, const at::Tensor &k,
                                const at::Tensor &v, const std::vector<at::Tensor> &features,
                                const std::vector<at::Tensor> &params, double scale,
                                const std::vector<int64_t> &steps, int num_splits) {
        return ape::simt_decode(*entry, dtype, q, k, v, features, params, scale, steps, num_splits);
      };
      for (size_t n = 0; n < opt.cuda_dtypes.size(); ++n) cuda_origin += (n ? ", " : "") + opt.cuda_dtypes[n];
      cuda_origin += " at head dim";
      for (int64_t D : opt.cuda_head_dims) cuda_origin += " " + std::to_string(D);
      // (the extra cells of head dims the kernels have: --kernel NAME's build may lack 128)
      opt.cuda_cells.erase(std::remove_if(opt.cuda_cells.begin(), opt.cuda_cells.end(),
                                          [&](const ape::CheckShape &s) {
                                            return std::find(opt.cuda_head_dims.begin(), opt.cuda_head_dims.end(),
                                                             s.D) == opt.cuda_head_dims.end();
                                          }),
                           opt.cuda_cells.end());
      cuda_origin += "), posing as sm";
      for (size_t n = 0; n < opt.cuda_archs.size(); ++n)
        cuda_origin += (n ? ", " : "_") + std::to_string(opt.cuda_archs[n]) + (opt.cuda_archs[n] == 90 ? " (2 SMs)" : "");
    }
    std::cout << "ape-check: " << spec << " (@" << name << ")\n"
              << "  kernel:    " << origin << ", CPU level " << (entry->cpu_level ? entry->cpu_level : "?")
              << "\n"
              << (cuda ? "  CUDA:      " + cuda_origin + "\n" : std::string())
              << "  reference: the spec's regions (apec --emit=reference) evaluated by LibTorch, "
              << (ref.has_transition()
                      ? "the attention transition's steps on its softmax weights; inference only: "
                        "forward at layers 0-" + std::to_string(opt.num_layers - 1) + " of " +
                            std::to_string(opt.num_layers)
                      : std::string("gradients by autograd"))
              << "\n";
    std::cout << "  grid:      ";
    std::vector<ape::CheckShape> grid = opt.grid.empty() ? ape::default_grid() : opt.grid;
    try {  // as checked: fitted to the kernel's hints (check_kernel reports what does not fit)
      grid = ape::fit_grid(ape::manifest_of(*entry), opt.grid);
    } catch (const std::exception &) {
    }
    for (size_t n = 0; n < grid.size(); ++n) std::cout << (n ? ", " : "") << grid[n].str();
    std::cout << " (BxHxTxD)";
    for (size_t n = 0; n < opt.cuda_cells.size(); ++n) std::cout << (n ? ", " : "; the CUDA rows also ") << opt.cuda_cells[n].str();
    std::cout << ", seed " << opt.seed << "\n\n";
    const ape::CheckReport report = ape::check_kernel(*entry, ref, opt);
    ape::print_report(std::cout, report);
    int failed = 0;
    for (const auto &r : report.rows) failed += r.pass ? 0 : 1;
    if (report.passed()) {
      std::cout << "\nape-check: PASS (" << report.rows.size() << " checks)\n";
      return 0;
    }
    std::cout << "\nape-check: FAIL (" << failed + report.problems.size() << " of "
              << report.rows.size() + report.problems.size() << " checks)\n";
    return 1;
  } catch (const std::exception &e) {
    std::cerr << "ape-check: error: " << ape::error_text(e) << "\n";
    return 2;
  }
}

int main(int argc, char **argv) {
  ape::ignore_broken_pipes();
  return ape::output_status(tool_main(argc, argv), "ape-check");
}
