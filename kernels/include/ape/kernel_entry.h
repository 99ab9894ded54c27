// KernelEntry: what one generated encoding exports to the runtime (docs/internals.md §2).
//
// A generated source defines its `Enc` functor and ends with
//   APE_DEFINE_KERNEL_ENTRY(rope, RopeEnc, kManifestJson)
// which defines `extern "C" const ape::KernelEntry *ape_kernel_entry_rope()`, returning the
// name, the manifest, the fp32 / fp64 instantiations of the CPU attention template and, for
// encodings with a fixed absolute table, the function that fills it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu_attention.h"

namespace ape {

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
};

namespace detail {
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
}  // namespace detail

// The entry of the encoding functor Enc (instantiates the four template functions).
template <class Enc>
constexpr KernelEntry make_kernel_entry(const char *name, const char *manifest_json) {
  return KernelEntry{name,
                     manifest_json,
                     &attention_forward<Enc, float>,
                     &attention_backward<Enc, float>,
                     &attention_forward<Enc, double>,
                     &attention_backward<Enc, double>,
                     detail::EmbedTableOf<Enc>::value};
}

}  // namespace ape

// Defines `extern "C" const ape::KernelEntry *ape_kernel_entry_<NAME>()` for the functor ENC;
// NAME is an identifier (also the entry's name string), MANIFEST a `const char *` JSON text.
#define APE_DEFINE_KERNEL_ENTRY(NAME, ENC, MANIFEST)                                   \
  extern "C" const ::ape::KernelEntry *ape_kernel_entry_##NAME() {                      \
    static const ::ape::KernelEntry entry = ::ape::make_kernel_entry<ENC>(#NAME, MANIFEST); \
    return &entry;                                                                      \
  }
