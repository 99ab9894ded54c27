// CPU instruction-set levels of the generated kernels: each kernel is compiled once per level and
// the best level the running CPU supports is chosen once per process (docs/internals.md §2c).
//
//   level  name       what the compiler may use                      CPUs (x86-64)
//   0      baseline   the compiler's default target (x86-64: SSE2)    every x86-64; aarch64: NEON
//   1      avx2       + AVX, AVX2, FMA                                 Haswell, Zen 1 and newer
//   2      avx512     + AVX-512 F, CD, BW, DQ, VL (x86-64-v4's set)    Skylake-X, Ice Lake, Zen 4, ...
//
// Compiling. A generated kernel source NAME_cpu.cpp is compiled once per level into one library;
// the translation unit of level L defines APE_KERNEL_LEVEL=L (default 0), and every unit defines
// APE_KERNEL_LEVELS, the mask of the levels linked into the library (bit L; default 1, baseline
// only, so that a source compiled once on its own still works). What a unit compiles for its
// level is written between APE_CPU_BEGIN and APE_CPU_END, inside namespace APE_CPU_NS:
//   - APE_CPU_BEGIN/END push and pop a target pragma, so the instruction set is a property of
//     those functions, not of the whole file: the standard library and every other inline
//     function defined outside the region keep the baseline target in every unit. (Compiled
//     whole with -march=x86-64-v3, a unit emits AVX code into inline functions that every unit
//     defines, std::vector<double>::vector(size_t) for one, and the linker keeps one copy for
//     all units: possibly the AVX one for the baseline's calls, an illegal instruction on an
//     older CPU.) So no #include inside a region: a header first included there would be
//     compiled for the level.
//   - APE_CPU_NS (cpu_baseline, cpu_avx2, cpu_avx512) makes the level part of every name compiled
//     in the region, so the linker can never merge two levels' copies of one template (gemm<64,
//     float> exists once per level).
// Levels a target does not have (avx2 / avx512 outside x86-64, or a compiler without target
// pragmas) compile to an empty entry, so a build may add the three units everywhere.
//
// Choosing. The baseline unit also defines the dispatcher (cpu/kernel_entry.h): the entry of the
// best built level the CPU runs, or the level the environment variable APE_CPU_LEVEL names
// (baseline | avx2 | avx512; unset or empty: the best). A named level that is unknown, not built
// or not runnable here is refused: the kernels then throw CpuLevelError with the reason instead
// of running (the C ABI returns APE_ERROR_CPU_LEVEL) — never a silent fallback, never an illegal
// instruction. The choice is made once per process and library (cpu_level_choice).
//
// Everything outside the regions (this header's functions included) is baseline code: it runs
// on any CPU, before the CPU is known.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

#ifndef APE_KERNEL_LEVEL
#define APE_KERNEL_LEVEL 0
#endif
#ifndef APE_KERNEL_LEVELS
#define APE_KERNEL_LEVELS 1
#endif
#if APE_KERNEL_LEVEL < 0 || APE_KERNEL_LEVEL > 2
#error "APE_KERNEL_LEVEL must be 0 (baseline), 1 (avx2) or 2 (avx512)"
#endif
#if (APE_KERNEL_LEVELS & 1) == 0 || (APE_KERNEL_LEVELS & ~7) != 0
#error "APE_KERNEL_LEVELS is a mask of levels 0..2 that includes the baseline (bit 0)"
#endif

// Whether this target can compile the x86-64 levels (GCC and Clang have target pragmas).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define APE_CPU_HAS_X86_LEVELS 1
#else
#define APE_CPU_HAS_X86_LEVELS 0
#endif

#define APE_CPU_STR_(x) #x
#define APE_CPU_STR(x) APE_CPU_STR_(x)

// Per level: APE_CPU_NS, the namespace of its code; APE_CPU_SUFFIX, the suffix of its entry
// (ape_kernel_entry_NAME_avx2); APE_CPU_COMPILED, 1 when the level exists on this target (else
// the unit compiles an empty entry); APE_CPU_BEGIN, the start of its target region.
#if APE_KERNEL_LEVEL == 0
#define APE_CPU_NS cpu_baseline
#define APE_CPU_SUFFIX baseline
#define APE_CPU_COMPILED 1
#elif APE_KERNEL_LEVEL == 1
#define APE_CPU_NS cpu_avx2
#define APE_CPU_SUFFIX avx2
#define APE_CPU_COMPILED APE_CPU_HAS_X86_LEVELS
#define APE_CPU_TARGET "avx2,fma"
#else
#define APE_CPU_NS cpu_avx512
#define APE_CPU_SUFFIX avx512
#define APE_CPU_COMPILED APE_CPU_HAS_X86_LEVELS
#define APE_CPU_TARGET "avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx2,fma"
#endif

#if APE_KERNEL_LEVEL == 0 || !APE_CPU_COMPILED
#define APE_CPU_BEGIN
#define APE_CPU_END
#elif defined(__clang__)
#define APE_CPU_BEGIN \
  _Pragma(APE_CPU_STR(clang attribute push(__attribute__((target(APE_CPU_TARGET))), apply_to = function)))
#define APE_CPU_END _Pragma("clang attribute pop")
#else
#define APE_CPU_BEGIN _Pragma("GCC push_options") _Pragma(APE_CPU_STR(GCC target(APE_CPU_TARGET)))
#define APE_CPU_END _Pragma("GCC pop_options")
#endif

// The levels linked into this library that exist on this target (mask): what the dispatcher
// chooses from.
#define APE_KERNEL_BUILT_LEVELS (APE_KERNEL_LEVELS & (APE_CPU_HAS_X86_LEVELS ? 7 : 1))

namespace ape {

constexpr int kNumCpuLevels = 3;

constexpr const char *cpu_level_name(int level) {
  switch (level) {
    case 0: return "baseline";
    case 1: return "avx2";
    case 2: return "avx512";
    default: return "none";
  }
}

// What a level lets the compiler use, for messages.
constexpr const char *cpu_level_features(int level) {
  switch (level) {
    case 0: return "the compiler's default instruction set";
    case 1: return "AVX2 and FMA";
    case 2: return "AVX-512 F/CD/BW/DQ/VL";
    default: return "nothing";
  }
}

// The level named `name`, or -1.
inline int cpu_level_from_name(const std::string &name) {
  for (int l = 0; l < kNumCpuLevels; ++l)
    if (name == cpu_level_name(l)) return l;
  return -1;
}

// "baseline, avx2": the levels of a mask (bit l = level l).
inline std::string cpu_level_list(unsigned mask) {
  std::string s;
  for (int l = 0; l < kNumCpuLevels; ++l)
    if (mask & (1u << l)) s += (s.empty() ? "" : ", ") + std::string(cpu_level_name(l));
  return s.empty() ? std::string("none") : s;
}

// The levels this CPU and operating system can run (mask). x86-64: the compiler's CPU-feature
// builtins, which read cpuid and check that the OS saves the AVX / AVX-512 register state (XCR0).
inline unsigned cpu_runnable_levels() {
  unsigned mask = 1;
#if APE_CPU_HAS_X86_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    mask |= 2u;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
      mask |= 4u;
  }
#endif
  return mask;
}

// The outcome of choosing a level for one library.
struct CpuLevelChoice {
  int level = -1;         // the level whose kernels run; -1 when the request was refused
  unsigned built = 0;     // levels compiled into the library (mask)
  unsigned runnable = 0;  // levels this CPU runs (mask)
  bool forced = false;    // APE_CPU_LEVEL named the level
  std::string error;      // why the request was refused (level == -1)

  // One line for logs: "avx512 (best of baseline, avx2, avx512 built; APE_CPU_LEVEL forces one)"
  // or "avx2 (forced by APE_CPU_LEVEL; this CPU runs baseline, avx2, avx512)".
  std::string describe() const {
    if (level < 0) return "none: " + error;
    std::string s = std::string(cpu_level_name(level)) + " (" + cpu_level_features(level);
    if (forced)
      return s + "; forced by APE_CPU_LEVEL; this CPU runs " + cpu_level_list(runnable) +
             ", built " + cpu_level_list(built) + ")";
    return s + "; the best this CPU runs of the built " + cpu_level_list(built) +
           "; APE_CPU_LEVEL=baseline|avx2|avx512 forces one)";
  }
};

// The level to run given the built and runnable masks and the value of APE_CPU_LEVEL (`request`:
// null or empty = the best level that is both built and runnable).
inline CpuLevelChoice choose_cpu_level(unsigned built, unsigned runnable, const char *request) {
  CpuLevelChoice c;
  c.built = built;
  c.runnable = runnable;
  const unsigned usable = built & runnable;
  if (!request || !*request) {
    for (int l = kNumCpuLevels - 1; l >= 0; --l)
      if (usable & (1u << l)) {
        c.level = l;
        return c;
      }
    c.error = "no kernel level this CPU can run was built (built: " + cpu_level_list(built) + ")";
    return c;
  }
  c.forced = true;
  const std::string name = request;
  const int l = cpu_level_from_name(name);
  const std::string head = "APE_CPU_LEVEL=" + name + ": ";
  if (l < 0)
    c.error = head + "not a level; use baseline, avx2 or avx512 (or unset it for the best level "
                     "this CPU runs)";
  else if (!(built & (1u << l)))
    c.error = head + "these kernels were built without that level (built: " +
              cpu_level_list(built) + ")";
  else if (!(runnable & (1u << l)))
    c.error = head + "this CPU cannot run " + cpu_level_features(l) + " code (it runs " +
              cpu_level_list(runnable) + "); unset APE_CPU_LEVEL or name one of those";
  else
    c.level = l;
  return c;
}

// The choice of a library whose built levels are kBuilt: made once per process (per library:
// the function is inline, each shared object has its own copy).
template <unsigned kBuilt> const CpuLevelChoice &cpu_level_choice() {
  static const CpuLevelChoice choice =
      choose_cpu_level(kBuilt, cpu_runnable_levels(), std::getenv("APE_CPU_LEVEL"));
  return choice;
}

// What a kernel of a refused choice throws (the C ABI turns it into APE_ERROR_CPU_LEVEL).
struct CpuLevelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ape
