// SpecLibrary: a spec file compiled into a kernel at run time, with no rebuild of APE.
//
//   SPEC.mlir ──apec --emit=cpu,manifest──▶ NAME_cpu.cpp ──c++ -shared──▶ libape_NAME.so ──dlopen──▶
//   ape_kernel_entry_NAME(): the same KernelEntry the build's registry holds for examples/encodings
//
// apec is the one next to the running program (build/tools/apec; $APE_APEC overrides), the C++
// compiler the one APE was built with ($APE_CXX overrides). The generated source is compiled for
// one instruction-set level, the best the running CPU has (or the one APE_CPU_LEVEL forces; see
// ape/cpu/dispatch.h), plus the baseline unit that holds the entry and the fp64 kernels.
//
// Cache: CACHE/kernels/NAME-KEY/ holds the generated source, the manifest and the library; KEY is
// a hash of what decides the library's bytes: the generated source (so the spec and apec), the
// kernel headers, the compiler, its version and flags, and the level. apec runs every time (it
// takes a fraction of a second and reports spec errors at their file:line:col); the compiler only
// when the key is new. A folder is built under a temporary name and renamed into place, so
// processes that share the cache never see a half-written library (the first rename wins).
// CACHE is $APE_CACHE_DIR, else $XDG_CACHE_HOME/ape, else ~/.cache/ape (docs/internals.md: without
// HOME, and a cache this process cannot write to).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ape {

struct KernelEntry;

struct SpecLibraryOptions {
  std::string apec;       // empty: $APE_APEC, else apec next to this program, else the build's
  std::string cxx;        // empty: $APE_CXX, else the compiler APE was built with
  std::string cache_dir;  // empty: default_spec_cache_dir()
  std::ostream *log = nullptr;  // one line per spec: what was compiled or found in the cache
  bool show_warnings = true;    // apec's warnings (an unused param) on log, else std::cerr
};

// A loaded spec. The library stays loaded until the process ends.
struct SpecLibrary {
  const KernelEntry *entry = nullptr;
  std::string name;       // the encoding's name (ape.encoding @NAME)
  std::string spec_path;  // as given
  std::string spec_text;  // the file's bytes
  std::string spec_hash;  // spec_fingerprint(spec_text)
  std::string library;    // path of the shared library
  std::string level;      // instruction-set level compiled ("baseline", "avx2", "avx512")
  bool cached = false;    // found in the cache (not compiled now)
  std::string cache_dir;  // the cache it was compiled into (its CUDA kernels go there too)

  // What a checkpoint records of it: {"name", "path", "fnv", "text"} (spec_record_matches).
  nlohmann::json record() const;
};

// 16 hex digits of the FNV-1a of a spec's text: what checkpoints compare.
std::string spec_fingerprint(const std::string &text);

std::string default_spec_cache_dir();

// Compiles (or finds in the cache) and loads the spec at `path`. Throws std::runtime_error with
// apec's located diagnostics for a bad spec, the compiler's output when the kernel does not
// compile, or the reason a level cannot be chosen (APE_CPU_LEVEL).
SpecLibrary load_spec_library(const std::string &path, const SpecLibraryOptions &opts = {});

// The same, from the text a checkpoint recorded (`record()`); the text is written to the cache as
// NAME-FNV.mlir and compiled from there.
SpecLibrary load_spec_record(const nlohmann::json &record, const SpecLibraryOptions &opts = {});

// Loads the spec and adds its encoding to the registry (register_kernel), so that every
// name-based path (models, checkpoints, --encoding) finds it. Loading the same spec twice returns
// the first load; another spec with the name of a registered encoding is refused. `refuse`, when
// set, is called with the encoding's name once apec has read the spec, before it compiles: a
// caller's refusal (an exception) then costs no compile.
const SpecLibrary &register_spec(const std::string &path, const SpecLibraryOptions &opts = {},
                                 const std::function<void(const std::string &name)> &refuse = {});
const SpecLibrary &register_spec_record(const nlohmann::json &record, const SpecLibraryOptions &opts = {});

// The CUDA kernels of a loaded spec, compiled at run time for one GPU architecture:
//   spec text ──apec --emit=cuda──▶ NAME_cuda*.cu ──nvcc -shared──▶ libape_NAME_cuda.so ──dlopen──▶
//   ape_cuda_kernel_entry_NAME(), the entry the build's ape_cuda_kernels holds for example specs
// cached like the CPU library (CACHE/kernels/NAME-cuda-KEY/, CACHE the library's unless `opts` names one; KEY: the generated sources, nvcc, its
// version, the architecture, the flags and the kernel headers). nvcc is the one APE was built
// with ($APE_NVCC overrides). Returns the entry as `const void *` (a const
// ape::cuda::CudaKernelEntry *: this header stays free of CUDA's); runtime/CudaAttention.h
// registers it. Throws std::runtime_error when nvcc is missing or the kernels do not compile.
struct SpecCudaOptions {
  std::string arch;                  // "90a", "80", ... (nvcc's sm_ARCH)
  std::vector<std::string> dtypes;   // "bf16", "f16", "f32"
  std::vector<int64_t> head_dims;    // 32, 64, 128
  // The loading program's ape::cuda::cuda_kernel_abi_fingerprint() (ape/cuda/kernel_abi.h, compiled
  // as the kernels are: for the GPU, or with -DAPE_SIMT for the emulator): a library compiled
  // against other kernel headers is refused ("rebuild APE"). 0: not checked.
  uint64_t expected_abi = 0;
};
const void *load_spec_cuda(const SpecLibrary &lib, const SpecCudaOptions &cuda,
                           const SpecLibraryOptions &opts = {});
// The same kernels for the SIMT emulator (docs/cuda.md, "The emulator"): compiled by the host C++
// compiler (cuda.arch unused) into a cached library whose references to the emulator resolve in
// the program that loads it, which must link the emulator and export its symbols (ape-check
// does). Returns the entry (ape_simt_kernel_entry_NAME) as `const void *`; runtime/SimtAttention.h
// registers it.
const void *load_spec_simt(const SpecLibrary &lib, const SpecCudaOptions &cuda,
                           const SpecLibraryOptions &opts = {});

// The registered spec of encoding `name`, or null (the name is built in or unknown).
const SpecLibrary *registered_spec(const std::string &name);

// Before a checkpoint's model is built (ape-eval, ape-train --resume): when its config records
// the spec it was trained from ("spec": record()), registers that spec from the recorded text
// unless a spec of that name is registered already, which must then be the same text (else a
// std::runtime_error saying which spec differs and what to do). `path` is for messages.
void register_checkpoint_spec(const nlohmann::json &config, const std::string &path,
                              const SpecLibraryOptions &opts = {});

}  // namespace ape
