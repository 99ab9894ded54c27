// KernelEntry: what one generated encoding exports to the runtime (docs/internals.md §2).
//
// A generated source defines its `Enc` functor and ends with
//   APE_DEFINE_KERNEL_ENTRY(rope, RopeEnc, kManifestJson)
// The source is compiled once per instruction-set level (cpu/dispatch.h). In the baseline unit
// the macro defines
//   ape_kernel_entry_rope()            the entry of the level chosen for this process: what every
//                                      caller (registry, operator library, C ABI) uses;
//   ape_kernel_entry_rope_level(int)   the entry of level 0, 1 or 2, or null when not built
//                                      (tests and benchmarks compare levels with it);
// both `extern "C" const ape::KernelEntry *`. An entry holds the name, the manifest, the fp32 /
// fp64 instantiations of the CPU attention template (fp32 compiled for the entry's level, fp64
// for the baseline) and, for encodings with a fixed absolute table, the function that fills it.
// Every unit also defines ape_kernel_unit_rope_<level name>(), its part, for the dispatcher.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "ape/cpu/attention.h"
#include "ape/cpu/decode.h"
#include "ape/cpu/dispatch.h"

namespace ape {

// KV-cache decoding with the entry's functor (cpu/decode.h, docs/decoding.md): one step appends
// new tokens to the cache and attends their queries to every cached key.
struct DecodeEntry {
  void (*step_f32)(DecodeCache<float> &, const DecodeArgs<float> &);
  void (*step_f64)(DecodeCache<double> &, const DecodeArgs<double> &);
};

struct KernelEntry {
  const char *name;
  const char *manifest_json;
  void (*forward_f32)(const AttnArgs<float> &);
  void (*backward_f32)(const AttnArgs<float> &);
  void (*forward_f64)(const AttnArgs<double> &);
  void (*backward_f64)(const AttnArgs<double> &);
  // Absolute encodings at the embedding site: fills out[n*d + c] (n < T, c < d) with the fixed
  // position table the model adds to the token embedding; null when the encoding has none.
  void (*embed_table)(int64_t T, int64_t d, double *out);
  // The instruction-set level the four kernels were compiled for (cpu_level_name: "baseline",
  // "avx2", "avx512"); "none" in the entry of a refused APE_CPU_LEVEL, whose kernels throw
  // CpuLevelError; null in hand-written entries.
  const char *cpu_level = nullptr;
  // Cached decoding (fp32 at the entry's level, fp64 at the baseline); null in hand-written
  // entries.
  const DecodeEntry *decode = nullptr;
};

namespace entry_detail {
// Enc::embed_table when Enc declares `static void embed_table(int64_t, int64_t, double *)`.
template <class Enc, class = void>
struct EmbedTableOf {
  static constexpr void (*value)(int64_t, int64_t, double *) = nullptr;
};
template <class Enc>
struct EmbedTableOf<Enc, std::void_t<decltype(static_cast<void (*)(int64_t, int64_t, double *)>(
                             &Enc::embed_table))>> {
  static constexpr void (*value)(int64_t, int64_t, double *) = &Enc::embed_table;
};

// The backward of an inference-only encoding (an attention transition, contract/transition.h):
// it has no derivative, so a training step fails here with the reason instead of computing the
// gradient of some other function.
struct InferenceOnlyError : std::logic_error {
  using std::logic_error::logic_error;
};
template <typename Real> void refuse_backward(const AttnArgs<Real> &) {
  throw InferenceOnlyError(
      "this encoding is inference-only (ape.attention_transition has no derivative): train a "
      "model without the transition and evaluate it with this encoding");
}
// attention_backward, or refuse_backward for an inference-only functor.
template <class Enc, typename Real> constexpr void (*backward_of())(const AttnArgs<Real> &) {
  if constexpr (traits::HasTransition<Enc>::value)
    return &refuse_backward<Real>;
  else
    return &attention_backward<Enc, Real>;
}

// The kernels of a refused level choice: they throw the reason instead of computing.
template <unsigned kBuilt, typename Real> void refuse(const AttnArgs<Real> &) {
  throw CpuLevelError(cpu_level_choice<kBuilt>().error);
}
template <unsigned kBuilt, typename Real> void refuse_decode(DecodeCache<Real> &, const DecodeArgs<Real> &) {
  throw CpuLevelError(cpu_level_choice<kBuilt>().error);
}
template <unsigned kBuilt>
inline constexpr DecodeEntry kRefusedDecode{&refuse_decode<kBuilt, float>, &refuse_decode<kBuilt, double>};

// The decode steps of this unit's level: fp32, and fp64 at the baseline only (not instantiated
// above it).
template <class Enc, bool kWithF64> constexpr DecodeEntry decode_entry_of() {
  if constexpr (kWithF64)
    return DecodeEntry{&decode_step<Enc, float>, &decode_step<Enc, double>};
  else
    return DecodeEntry{&decode_step<Enc, float>, nullptr};
}
template <class Enc, bool kWithF64>
inline constexpr DecodeEntry kDecodeEntry = decode_entry_of<Enc, kWithF64>();

// The entry's decode pointer. APE_KERNEL_DECODE=0 (the emitted operator libraries and C ABI
// folders, which have no decode API) leaves the decode steps out: null, nothing instantiated.
#ifndef APE_KERNEL_DECODE
#define APE_KERNEL_DECODE 1
#endif
template <class Enc, bool kWithF64> constexpr const DecodeEntry *decode_pointer() {
#if APE_KERNEL_DECODE
  return &kDecodeEntry<Enc, kWithF64>;
#else
  return nullptr;
#endif
}
}  // namespace entry_detail

// The entry of the encoding functor Enc (instantiates the four template functions of this
// unit's level).
template <class Enc>
constexpr KernelEntry make_kernel_entry(const char *name, const char *manifest_json) {
  return KernelEntry{name,
                     manifest_json,
                     &attention_forward<Enc, float>,
                     entry_detail::backward_of<Enc, float>(),
                     &attention_forward<Enc, double>,
                     entry_detail::backward_of<Enc, double>(),
                     entry_detail::EmbedTableOf<Enc>::value,
                     cpu_level_name(APE_KERNEL_LEVEL),
                     entry_detail::decode_pointer<Enc, true>()};
}

// What the unit of level kLevel contributes to its encoding's entries: name, manifest,
// embed_table and the fp32 kernels of the level; the fp64 kernels only at the baseline (null
// above it; see compose_level_entries). Null when the level does not exist on the target.
template <class Enc, int kLevel, bool kCompiled>
const KernelEntry *unit_kernel_entry(const char *name, const char *manifest_json) {
  if constexpr (!kCompiled) {
    return nullptr;
  } else if constexpr (kLevel == 0) {
    static const KernelEntry entry = make_kernel_entry<Enc>(name, manifest_json);
    return &entry;
  } else {
    static const KernelEntry entry{name,
                                   manifest_json,
                                   &attention_forward<Enc, float>,
                                   entry_detail::backward_of<Enc, float>(),
                                   nullptr,
                                   nullptr,
                                   entry_detail::EmbedTableOf<Enc>::value,
                                   cpu_level_name(kLevel),
                                   entry_detail::decode_pointer<Enc, false>()};
    return &entry;
  }
}

// The entries of one encoding, per level: level l's fp32 kernels with the baseline's fp64
// kernels. fp64 serves gradient checks, not speed, so it is compiled once (the baseline): that
// halves the cost of each extra level (bench/results/cpu_levels.md).
struct LevelEntries {
  KernelEntry entry[kNumCpuLevels];
  DecodeEntry decode[kNumCpuLevels];  // entry[l].decode: level l's fp32 step, the baseline's fp64
  bool built[kNumCpuLevels];

  const KernelEntry *at(int level) const {
    return level >= 0 && level < kNumCpuLevels && built[level] ? &entry[level] : nullptr;
  }
};

// Fills `all` in place (its entries point at its own decode entries, so it is not copied).
inline void compose_level_entries(LevelEntries &all, const KernelEntry *const (&units)[kNumCpuLevels]) {
  all = LevelEntries{};
  const KernelEntry &base = *units[0];
  for (int l = 0; l < kNumCpuLevels; ++l) {
    if (!units[l]) continue;
    all.entry[l] = *units[l];
    all.entry[l].forward_f64 = base.forward_f64;
    all.entry[l].backward_f64 = base.backward_f64;
    if (units[l]->decode && base.decode) {
      all.decode[l] = *units[l]->decode;
      all.decode[l].step_f64 = base.decode->step_f64;
      all.entry[l].decode = &all.decode[l];
    }
    all.built[l] = true;
  }
}

// The entry to use in this process: level(c) for the level c chosen among kBuilt (once, see
// cpu_level_choice), or `refused` when APE_CPU_LEVEL names a level that cannot run.
template <unsigned kBuilt>
const KernelEntry *choose_kernel_entry(const KernelEntry *(*level)(int), const KernelEntry *refused) {
  const CpuLevelChoice &c = cpu_level_choice<kBuilt>();
  const KernelEntry *e = c.level >= 0 ? level(c.level) : nullptr;
  return e ? e : refused;
}

// `base` with kernels that throw the reason of the refused choice.
template <unsigned kBuilt> KernelEntry refused_kernel_entry(const KernelEntry &base) {
  return KernelEntry{base.name,
                     base.manifest_json,
                     &entry_detail::refuse<kBuilt, float>,
                     &entry_detail::refuse<kBuilt, float>,
                     &entry_detail::refuse<kBuilt, double>,
                     &entry_detail::refuse<kBuilt, double>,
                     base.embed_table,
                     "none",
                     &entry_detail::kRefusedDecode<kBuilt>};
}

}  // namespace ape

#define APE_KERNEL_CAT_(a, b) a##b
#define APE_KERNEL_CAT(a, b) APE_KERNEL_CAT_(a, b)

// The units of the levels linked into the library: a declaration, and a call (null when absent).
#if APE_KERNEL_BUILT_LEVELS & 2
#define APE_DECLARE_UNIT_AVX2(NAME) extern "C" const ::ape::KernelEntry *ape_kernel_unit_##NAME##_avx2();
#define APE_UNIT_AVX2(NAME) ape_kernel_unit_##NAME##_avx2()
#else
#define APE_DECLARE_UNIT_AVX2(NAME)
#define APE_UNIT_AVX2(NAME) nullptr
#endif
#if APE_KERNEL_BUILT_LEVELS & 4
#define APE_DECLARE_UNIT_AVX512(NAME) \
  extern "C" const ::ape::KernelEntry *ape_kernel_unit_##NAME##_avx512();
#define APE_UNIT_AVX512(NAME) ape_kernel_unit_##NAME##_avx512()
#else
#define APE_DECLARE_UNIT_AVX512(NAME)
#define APE_UNIT_AVX512(NAME) nullptr
#endif

// The dispatcher of encoding NAME (baseline unit only): ape_kernel_entry_NAME_level(int) and
// ape_kernel_entry_NAME().
#if APE_KERNEL_LEVEL == 0
#define APE_DEFINE_KERNEL_DISPATCH(NAME)                                                        \
  APE_DECLARE_UNIT_AVX2(NAME)                                                                   \
  APE_DECLARE_UNIT_AVX512(NAME)                                                                 \
  extern "C" const ::ape::KernelEntry *ape_kernel_entry_##NAME##_level(int level) {             \
    static ::ape::LevelEntries all;                                                             \
    static const bool composed = (::ape::compose_level_entries(                                 \
        all, {ape_kernel_unit_##NAME##_baseline(), APE_UNIT_AVX2(NAME), APE_UNIT_AVX512(NAME)}), \
                                  true);                                                        \
    (void)composed;                                                                             \
    return all.at(level);                                                                       \
  }                                                                                             \
  extern "C" const ::ape::KernelEntry *ape_kernel_entry_##NAME() {                              \
    static const ::ape::KernelEntry refused = ::ape::refused_kernel_entry<APE_KERNEL_BUILT_LEVELS>( \
        *ape_kernel_entry_##NAME##_level(0));                                                   \
    static const ::ape::KernelEntry *const chosen =                                             \
        ::ape::choose_kernel_entry<APE_KERNEL_BUILT_LEVELS>(&ape_kernel_entry_##NAME##_level,   \
                                                            &refused);                          \
    return chosen;                                                                              \
  }
#else
#define APE_DEFINE_KERNEL_DISPATCH(NAME)
#endif

// Defines the entries of the functor ENC (see the top of this file); NAME is an identifier (also
// the entry's name string), MANIFEST a `const char *` JSON text.
#define APE_DEFINE_KERNEL_ENTRY(NAME, ENC, MANIFEST)                                            \
  extern "C" const ::ape::KernelEntry *APE_KERNEL_CAT(ape_kernel_unit_##NAME##_,                \
                                                      APE_CPU_SUFFIX)() {                       \
    return ::ape::unit_kernel_entry<ENC, APE_KERNEL_LEVEL, APE_CPU_COMPILED>(#NAME, MANIFEST);  \
  }                                                                                             \
  APE_DEFINE_KERNEL_DISPATCH(NAME)
