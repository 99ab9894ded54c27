// The contract between the stages (docs/internals.md, "The contract (ape/contract/vocabulary.h)").
//
// What the dialect's verifier accepts, what passes and emitters write, what the manifest carries
// and what the runtime and the kernel templates read is spelled once here:
//   - every closed string vocabulary of the dialect (an attribute whose values form a fixed set):
//     an enum class, ONE name table, parse_X(text) -> optional<X> and name(X);
//   - the shape symbol of a param: "heads" | "head_dim" | a positive integer (Dim, parse_dim);
//   - which init argument each param init kind needs or allows (init_arg_use);
//   - the math the stages share: ALiBi slopes, the sinusoid table PE[r, c], the rotation pairing.
// Header-only, the standard library only, no exceptions and no allocation on the parse paths:
// usable from the -fno-exceptions MLIR side, the LibTorch runtime, generated code and (the
// APE_ABI_HD functions) CUDA device code. The namespace is ape_abi, not ape::abi (like
// ape_rules): the MLIR side's mlir::ape would make a global `ape` ambiguous there; the MLIR side
// and the runtime call it `abi` (mlir::ape::abi, ape::abi).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// Functions both host and device code call (the pairing rule): __host__ __device__ under nvcc,
// nothing for a host compiler (including the SIMT emulator's host build of the CUDA sources).
#if defined(__CUDACC__)
#define APE_ABI_HD __host__ __device__
#else
#define APE_ABI_HD
#endif

namespace ape_abi {

// ---- closed vocabularies -----------------------------------------------------------------------
// Each enum's values are the indices of its name table (kNames); Vocab<E> names the table and the
// attribute it spells. The numeric values are part of the contract where generated code carries
// them (Pairing: 0 none, 1 half, 2 interleaved, the Enc::kQPairing / kKPairing codes).
template <class E> struct Vocab;

#define APE_ABI_VOCAB(E, what, ...)                                                           \
  template <> struct Vocab<E> {                                                               \
    static constexpr std::string_view kWhat = what;                                           \
    static constexpr std::string_view kNames[] = {__VA_ARGS__};                               \
    static constexpr std::size_t kSize = sizeof(kNames) / sizeof(kNames[0]);                  \
  };

// q_mod / k_mod / ape.rotary `pairing`: which coordinate a coordinate is rotated with.
enum class Pairing : int { None, Half, Interleaved };
APE_ABI_VOCAB(Pairing, "pairing", "none", "half", "interleaved")

// ape.rotary `scaling`: how the frequencies are rescaled for longer contexts.
enum class Scaling : int { None, Linear, Ntk, DynamicNtk, Yarn, Llama3 };
APE_ABI_VOCAB(Scaling, "scaling", "none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3")

// ape.param `init`: how a runtime creates the param (docs/internals.md, section 1).
enum class InitKind : int {
  Zeros, Ones, Normal, Constant, AlibiSlopes, Sinusoidal, ProjectionTerm, ProjectionPrefix
};
APE_ABI_VOCAB(InitKind, "init", "zeros", "ones", "normal", "constant", "alibi_slopes",
              "sinusoidal", "projection_term", "projection_prefix")

// ape.param `projection` (derived inits): the projection weight the param is computed from.
enum class Projection : int { Q, K, V };
APE_ABI_VOCAB(Projection, "projection", "q", "k", "v")

// ape.override / ape.masked_projection `kind`: the position values written over the inputs.
enum class OverrideKind : int { Expe, Exqpe };
APE_ABI_VOCAB(OverrideKind, "override kind", "expe", "exqpe")

// ape.override / ape.masked_projection `targets`: the projections that read the overridden input.
enum class Targets : int { Qk, Qkv };
APE_ABI_VOCAB(Targets, "targets", "qk", "qkv")

// ape.rel_rows `side`: rows of q' (query rows) or of k' (key rows).
enum class Side : int { Q, K };
APE_ABI_VOCAB(Side, "side", "q", "k")

// ape.dim `which`: a run-time size read inside a region.
enum class DimWhich : int { Heads, HeadDim, SeqLen };
APE_ABI_VOCAB(DimWhich, "dimension", "heads", "head_dim", "seq_len")

// ape.absolute `kind`: a closed-form sinusoidal table or a trained one.
enum class AbsoluteKind : int { Sinusoidal, Learned };
APE_ABI_VOCAB(AbsoluteKind, "absolute kind", "sinusoidal", "learned")

// ape.kerple `kind`: the logarithmic or the power kernel.
enum class KerpleKind : int { Log, Power };
APE_ABI_VOCAB(KerpleKind, "kerple kind", "log", "power")

// ape.cable `kernel`: Cable (none) or K-Cable (log1p_sq).
enum class CableKernel : int { None, Log1pSq };
APE_ABI_VOCAB(CableKernel, "cable kernel", "none", "log1p_sq")

// The manifest's "embedding" kind: a fixed table the kernel entry fills, or a trained one.
enum class EmbeddingKind : int { Table, Learned };
APE_ABI_VOCAB(EmbeddingKind, "embedding kind", "table", "learned")

#undef APE_ABI_VOCAB

template <class E> constexpr std::string_view name(E e) {
  const auto i = static_cast<std::size_t>(e);
  return i < Vocab<E>::kSize ? Vocab<E>::kNames[i] : std::string_view("?");
}

template <class E> constexpr std::optional<E> parse(std::string_view text) {
  for (std::size_t i = 0; i < Vocab<E>::kSize; ++i)
    if (Vocab<E>::kNames[i] == text) return static_cast<E>(i);
  return std::nullopt;
}

// The allowed values for a message: "\"none\", \"half\" or \"interleaved\"".
template <class E> std::string allowed() {
  std::string out;
  for (std::size_t i = 0; i < Vocab<E>::kSize; ++i) {
    if (i) out += i + 1 == Vocab<E>::kSize ? " or " : ", ";
    out += '"';
    out += Vocab<E>::kNames[i];
    out += '"';
  }
  return out;
}

constexpr std::optional<Pairing> parse_pairing(std::string_view s) { return parse<Pairing>(s); }
// The pairing of a rotation (ape.rotary, the manifest's "rotation"): "half" or "interleaved".
constexpr std::optional<Pairing> parse_rotation_pairing(std::string_view s) {
  std::optional<Pairing> p = parse<Pairing>(s);
  return p == Pairing::None ? std::nullopt : p;
}
constexpr std::optional<Scaling> parse_scaling(std::string_view s) { return parse<Scaling>(s); }
constexpr std::optional<InitKind> parse_init_kind(std::string_view s) { return parse<InitKind>(s); }
constexpr std::optional<Projection> parse_projection(std::string_view s) { return parse<Projection>(s); }
constexpr std::optional<OverrideKind> parse_override_kind(std::string_view s) {
  return parse<OverrideKind>(s);
}
constexpr std::optional<Targets> parse_targets(std::string_view s) { return parse<Targets>(s); }
constexpr std::optional<Side> parse_side(std::string_view s) { return parse<Side>(s); }
constexpr std::optional<DimWhich> parse_dim_which(std::string_view s) { return parse<DimWhich>(s); }
constexpr std::optional<AbsoluteKind> parse_absolute_kind(std::string_view s) {
  return parse<AbsoluteKind>(s);
}
constexpr std::optional<KerpleKind> parse_kerple_kind(std::string_view s) {
  return parse<KerpleKind>(s);
}
constexpr std::optional<CableKernel> parse_cable_kernel(std::string_view s) {
  return parse<CableKernel>(s);
}
constexpr std::optional<EmbeddingKind> parse_embedding_kind(std::string_view s) {
  return parse<EmbeddingKind>(s);
}

// ---- the shape symbol --------------------------------------------------------------------------
// A dimension of a param's shape: "heads" and "head_dim" resolve when a model is built, a positive
// integer is a fixed size (written as a string in the dialect, "16"; a number in the manifest).
struct Dim {
  enum class Kind { Heads, HeadDim, Fixed };
  Kind kind = Kind::Fixed;
  int64_t value = 0;  // Kind::Fixed
  constexpr int64_t resolve(int64_t heads, int64_t head_dim) const {
    return kind == Kind::Heads ? heads : kind == Kind::HeadDim ? head_dim : value;
  }
  std::string str() const {  // "heads", "head_dim" or the number
    return kind == Kind::Heads ? "heads" : kind == Kind::HeadDim ? "head_dim" : std::to_string(value);
  }
  constexpr bool is(Kind k) const { return kind == k; }
  friend constexpr bool operator==(const Dim &a, const Dim &b) {
    return a.kind == b.kind && (a.kind != Kind::Fixed || a.value == b.value);
  }
  friend constexpr bool operator!=(const Dim &a, const Dim &b) { return !(a == b); }
};

// "heads", "head_dim", or decimal digits naming a positive integer that fits int64 (leading
// zeros allowed: "016" is 16); anything else (empty, a sign, "0", an overflow) is not a dim.
constexpr std::optional<Dim> parse_dim(std::string_view s) {
  if (s == "heads") return Dim{Dim::Kind::Heads, 0};
  if (s == "head_dim") return Dim{Dim::Kind::HeadDim, 0};
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return std::nullopt;
    const int digit = ch - '0';
    if (v > (INT64_MAX - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  if (v <= 0) return std::nullopt;
  return Dim{Dim::Kind::Fixed, v};
}

// ---- init arguments ----------------------------------------------------------------------------
// The arguments an ape.param init kind reads (attributes of the op; keys of the manifest's "init"
// object). One table says which kind needs which and allows which; the verifier enforces it.
enum class InitArg : int { Std, Value, Projection, Columns, Start, Step, Scale };
template <> struct Vocab<InitArg> {
  static constexpr std::string_view kWhat = "init argument";
  static constexpr std::string_view kNames[] = {"std",   "value", "projection", "columns",
                                                "start", "step",  "scale"};
  static constexpr std::size_t kSize = sizeof(kNames) / sizeof(kNames[0]);
};
inline constexpr InitArg kInitArgs[] = {InitArg::Std,   InitArg::Value, InitArg::Projection,
                                        InitArg::Columns, InitArg::Start, InitArg::Step,
                                        InitArg::Scale};

enum class ArgUse { Forbidden, Required };

//   zeros, ones, alibi_slopes, sinusoidal   no argument
//   normal                                  std                       N(0, std)
//   constant                                value                     (a value range: min, max,
//                                                                      integer, see value_rules.h)
//   projection_term                         projection, columns, start, step
//                                           (W[:, :columns]·(start + step·j)_j).view(H, D)
//   projection_prefix                       projection, columns, scale
//                                           P[r] = scale·Σ_{j<=r} W[:, j], r < columns
constexpr ArgUse init_arg_use(InitKind kind, InitArg arg) {
  switch (kind) {
    case InitKind::Normal: return arg == InitArg::Std ? ArgUse::Required : ArgUse::Forbidden;
    case InitKind::Constant: return arg == InitArg::Value ? ArgUse::Required : ArgUse::Forbidden;
    case InitKind::ProjectionTerm:
      return arg == InitArg::Projection || arg == InitArg::Columns || arg == InitArg::Start ||
                     arg == InitArg::Step
                 ? ArgUse::Required
                 : ArgUse::Forbidden;
    case InitKind::ProjectionPrefix:
      return arg == InitArg::Projection || arg == InitArg::Columns || arg == InitArg::Scale
                 ? ArgUse::Required
                 : ArgUse::Forbidden;
    default: return ArgUse::Forbidden;
  }
}

// Derived every step from a projection weight (not a free tensor: no init, never shared).
constexpr bool is_derived(InitKind k) {
  return k == InitKind::ProjectionTerm || k == InitKind::ProjectionPrefix;
}

// ---- shared math -------------------------------------------------------------------------------
// ALiBi slope of head h of H (Press et al.): for a power of two H, m_h = 2^(-8(h+1)/H); otherwise,
// with c = 2^floor(log2 H), the slopes of c heads followed by every other slope of 2c heads,
// m_h = 2^(-8(2(h-c)+1)/(2c)) for h >= c.
inline double alibi_slope(int64_t h, int64_t heads) {
  int64_t c = 1;
  while (c * 2 <= heads) c *= 2;
  if (h < c) return std::exp2(-8.0 * double(h + 1) / double(c));
  return std::exp2(-8.0 * double(2 * (h - c) + 1) / double(2 * c));
}

// All H slopes (empty for heads <= 0).
inline std::vector<double> alibi_slopes(int64_t heads) {
  std::vector<double> s(static_cast<std::size_t>(heads > 0 ? heads : 0));
  for (int64_t h = 0; h < heads; ++h) s[static_cast<std::size_t>(h)] = alibi_slope(h, heads);
  return s;
}

// The sinusoidal table of docs/encodings-math.md over d columns:
//   PE[r, 2k] = sin(r / base^(2k/d)),  PE[r, 2k+1] = cos(r / base^(2k/d)).
inline constexpr double kSinusoidBase = 10000.0;
inline double sinusoid(int64_t r, int64_t c, int64_t d, double base = kSinusoidBase) {
  const double angle = double(r) / std::pow(base, double(c - c % 2) / double(d));
  return c % 2 == 0 ? std::sin(angle) : std::cos(angle);
}

// The whole table, rows x d, row-major: what an ape.param with init "sinusoidal" of shape
// [rows, heads, head_dim] holds (d = heads·head_dim, column c = h·head_dim + j).
inline std::vector<double> sinusoid_table(int64_t rows, int64_t d) {
  std::vector<double> pe(static_cast<std::size_t>(rows > 0 && d > 0 ? rows * d : 0));
  for (int64_t r = 0; r < rows && d > 0; ++r)
    for (int64_t c = 0; c < d; ++c) pe[static_cast<std::size_t>(r * d + c)] = sinusoid(r, c, d);
  return pe;
}

// The rotation pairing of a q_mod / k_mod over D coordinates: r = 2·floor(fraction·D/2) of them
// (clamped to [0, D - D mod 2]) are paired, "half" coordinate c with c ± r/2, "interleaved" 2k
// with 2k+1; coordinates c >= r (and every one under "none") are their own partner. fraction > 0,
// so the floor is the truncation.
APE_ABI_HD constexpr int64_t rotated_dims(double fraction, int64_t D) {
  const int64_t r = 2 * static_cast<int64_t>(fraction * static_cast<double>(D) / 2);
  const int64_t most = D - D % 2;
  return r < 0 ? 0 : r > most ? most : r;
}

APE_ABI_HD constexpr int64_t partner(Pairing pairing, double fraction, int64_t D, int64_t c) {
  const int64_t r = rotated_dims(fraction, D);
  if (pairing == Pairing::None || c >= r) return c;
  if (pairing == Pairing::Half) return c < r / 2 ? c + r / 2 : c - r / 2;
  return c ^ 1;
}

}  // namespace ape_abi
