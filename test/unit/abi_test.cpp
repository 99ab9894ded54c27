// The contract between the stages (contract/vocabulary.h), checked against values written out
// here from the spec (docs/encodings-math.md) and the dialect's documentation, not computed with
// the header's own formulas.
#include "ape/contract/vocabulary.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace {

// Every name of E parses back to its value, and nothing else parses.
template <class E> void expect_round_trip(std::initializer_list<const char *> names) {
  ASSERT_EQ(ape_abi::Vocab<E>::kSize, names.size());
  int i = 0;
  for (const char *n : names) {
    std::optional<E> e = ape_abi::parse<E>(n);
    ASSERT_TRUE(e) << n;
    EXPECT_EQ(static_cast<int>(*e), i++) << n;
    EXPECT_EQ(ape_abi::name(*e), n);
  }
  EXPECT_FALSE(ape_abi::parse<E>(""));
  EXPECT_FALSE(ape_abi::parse<E>("unknown"));
}

TEST(Abi, VocabulariesRoundTrip) {
  expect_round_trip<ape_abi::Pairing>({"none", "half", "interleaved"});
  expect_round_trip<ape_abi::Scaling>({"none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3"});
  expect_round_trip<ape_abi::InitKind>({"zeros", "ones", "normal", "constant", "alibi_slopes",
                                    "sinusoidal", "projection_term", "projection_prefix"});
  expect_round_trip<ape_abi::Projection>({"q", "k", "v"});
  expect_round_trip<ape_abi::OverrideKind>({"expe", "exqpe"});
  expect_round_trip<ape_abi::Targets>({"qk", "qkv"});
  expect_round_trip<ape_abi::Side>({"q", "k"});
  expect_round_trip<ape_abi::DimWhich>({"heads", "head_dim", "seq_len"});
  expect_round_trip<ape_abi::AbsoluteKind>({"sinusoidal", "learned"});
  expect_round_trip<ape_abi::KerpleKind>({"log", "power"});
  expect_round_trip<ape_abi::CableKernel>({"none", "log1p_sq"});
  expect_round_trip<ape_abi::EmbeddingKind>({"table", "learned"});
  EXPECT_FALSE(ape_abi::parse_pairing("Half"));  // names are case-sensitive
}

TEST(Abi, PairingCodesAreTheTemplatesCodes) {
  // Enc::kQPairing / kKPairing carry these numbers into cpu/attention.h and cuda/attention.cuh.
  EXPECT_EQ(static_cast<int>(ape_abi::Pairing::None), 0);
  EXPECT_EQ(static_cast<int>(ape_abi::Pairing::Half), 1);
  EXPECT_EQ(static_cast<int>(ape_abi::Pairing::Interleaved), 2);
  EXPECT_FALSE(ape_abi::parse_rotation_pairing("none"));
  EXPECT_EQ(ape_abi::parse_rotation_pairing("interleaved"), ape_abi::Pairing::Interleaved);
}

TEST(Abi, AllowedListsTheValues) {
  EXPECT_EQ(ape_abi::allowed<ape_abi::Pairing>(), "\"none\", \"half\" or \"interleaved\"");
  EXPECT_EQ(ape_abi::allowed<ape_abi::Targets>(), "\"qk\" or \"qkv\"");
}

// The values a parser accepts, spelled as allowed<E>() spells them.
template <class E> std::string accepted_by(std::optional<E> (*parser)(std::string_view)) {
  std::vector<std::string_view> names;
  for (std::size_t i = 0; i < ape_abi::Vocab<E>::kSize; ++i)
    if (parser(ape_abi::Vocab<E>::kNames[i])) names.push_back(ape_abi::Vocab<E>::kNames[i]);
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("\"" + std::string(names[i]) + "\"");
  return out;
}

// An ODS constraint summary must be a literal, so dialect/ApeOps.td spells each vocabulary's
// values again (they become the verifier's "failed to satisfy constraint: ..." message): every
// Ape_VocabAttr there must spell exactly what its parser accepts, so the two cannot drift.
TEST(Abi, OdsSummariesSpellEachVocabulary) {
  using namespace ape_abi;
  const std::map<std::string, std::function<std::string()>> parsers = {
      {"parse_pairing", [] { return accepted_by<Pairing>(parse_pairing); }},
      {"parse_rotation_pairing", [] { return accepted_by<Pairing>(parse_rotation_pairing); }},
      {"parse_scaling", [] { return accepted_by<Scaling>(parse_scaling); }},
      {"parse_init_kind", [] { return accepted_by<InitKind>(parse_init_kind); }},
      {"parse_projection", [] { return accepted_by<Projection>(parse_projection); }},
      {"parse_override_kind", [] { return accepted_by<OverrideKind>(parse_override_kind); }},
      {"parse_targets", [] { return accepted_by<Targets>(parse_targets); }},
      {"parse_side", [] { return accepted_by<Side>(parse_side); }},
      {"parse_dim_which", [] { return accepted_by<DimWhich>(parse_dim_which); }},
      {"parse_absolute_kind", [] { return accepted_by<AbsoluteKind>(parse_absolute_kind); }},
      {"parse_kerple_kind", [] { return accepted_by<KerpleKind>(parse_kerple_kind); }},
      {"parse_cable_kernel", [] { return accepted_by<CableKernel>(parse_cable_kernel); }},
  };
  std::ifstream in(APE_ODS_FILE);
  ASSERT_TRUE(in) << "cannot read " << APE_ODS_FILE;
  std::stringstream text;
  text << in.rdbuf();
  const std::string td = text.str();
  // def Ape_XAttr : Ape_VocabAttr<"Enum", "parser", "..." "...">;  (TableGen joins the literals)
  const std::regex def(R"re(def (Ape_\w+) : Ape_VocabAttr<"\w+", "(\w+)",\s*((?:"(?:[^"\\]|\\.)*"\s*)+)>;)re");
  const std::regex literal(R"re("((?:[^"\\]|\\.)*)")re");
  int seen = 0;
  for (auto it = std::sregex_iterator(td.begin(), td.end(), def); it != std::sregex_iterator(); ++it) {
    const std::string attr = (*it)[1], parser = (*it)[2], lits = (*it)[3];
    std::string summary;
    for (auto l = std::sregex_iterator(lits.begin(), lits.end(), literal); l != std::sregex_iterator(); ++l)
      summary += std::regex_replace((*l)[1].str(), std::regex(R"re(\\")re"), "\"");
    auto p = parsers.find(parser);
    ASSERT_NE(p, parsers.end()) << attr << " names parser " << parser << ", unknown to this test";
    EXPECT_EQ(summary, p->second()) << attr << "'s summary in dialect/ApeOps.td";
    ++seen;
  }
  EXPECT_EQ(seen, static_cast<int>(parsers.size())) << "Ape_VocabAttr definitions found in " << APE_ODS_FILE;
}

TEST(Abi, ShapeSymbols) {
  using K = ape_abi::Dim::Kind;
  EXPECT_EQ(ape_abi::parse_dim("heads"), (ape_abi::Dim{K::Heads, 0}));
  EXPECT_EQ(ape_abi::parse_dim("head_dim"), (ape_abi::Dim{K::HeadDim, 0}));
  EXPECT_EQ(ape_abi::parse_dim("16"), (ape_abi::Dim{K::Fixed, 16}));
  EXPECT_EQ(ape_abi::parse_dim("016"), (ape_abi::Dim{K::Fixed, 16}));
  EXPECT_EQ(ape_abi::parse_dim("9223372036854775807"), (ape_abi::Dim{K::Fixed, INT64_MAX}));
  for (const char *bad : {"", "0", "-1", "+1", "1.5", "seq", "Heads", "16 ", "9223372036854775808",
                          "99999999999999999999"})
    EXPECT_FALSE(ape_abi::parse_dim(bad)) << bad;
  EXPECT_EQ(ape_abi::parse_dim("heads")->resolve(8, 64), 8);
  EXPECT_EQ(ape_abi::parse_dim("head_dim")->resolve(8, 64), 64);
  EXPECT_EQ(ape_abi::parse_dim("3")->resolve(8, 64), 3);
  EXPECT_EQ(ape_abi::parse_dim("head_dim")->str(), "head_dim");
  EXPECT_EQ(ape_abi::parse_dim("07")->str(), "7");
}

TEST(Abi, InitArgumentTable) {
  using A = ape_abi::InitArg;
  using I = ape_abi::InitKind;
  auto needs = [](I kind, std::initializer_list<A> args) {
    for (A arg : ape_abi::kInitArgs) {
      bool expected = false;
      for (A a : args) expected = expected || a == arg;
      EXPECT_EQ(ape_abi::init_arg_use(kind, arg) == ape_abi::ArgUse::Required, expected)
          << ape_abi::name(kind) << " " << ape_abi::name(arg);
    }
  };
  needs(I::Zeros, {});
  needs(I::Ones, {});
  needs(I::Normal, {A::Std});
  needs(I::Constant, {A::Value});
  needs(I::AlibiSlopes, {});
  needs(I::Sinusoidal, {});
  needs(I::ProjectionTerm, {A::Projection, A::Columns, A::Start, A::Step});
  needs(I::ProjectionPrefix, {A::Projection, A::Columns, A::Scale});
  EXPECT_TRUE(ape_abi::is_derived(I::ProjectionTerm));
  EXPECT_TRUE(ape_abi::is_derived(I::ProjectionPrefix));
  EXPECT_FALSE(ape_abi::is_derived(I::Constant));
}

TEST(Abi, AlibiSlopes) {
  // Press et al.: H = 8 gives 1/2, 1/4, ..., 1/256; H = 12 the 8 of H = 8 then the odd-indexed
  // (2^(-1/2·k) for k = 1, 3, 5, 7) slopes of H = 16: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  std::vector<double> s8 = ape_abi::alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(s8[h], std::ldexp(1.0, -(h + 1))) << h;
  std::vector<double> s12 = ape_abi::alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(s12[h], s8[h]) << h;
  for (int k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(s12[8 + k], std::pow(2.0, -0.5 - k)) << k;
  EXPECT_DOUBLE_EQ(ape_abi::alibi_slopes(1)[0], 1.0 / 256);
  EXPECT_TRUE(ape_abi::alibi_slopes(0).empty());
}

TEST(Abi, Sinusoid) {
  EXPECT_EQ(ape_abi::kSinusoidBase, 10000.0);
  // d = 4: PE[1] = (sin 1, cos 1, sin(1/100), cos(1/100)); PE[0] = (0, 1, 0, 1).
  EXPECT_DOUBLE_EQ(ape_abi::sinusoid(1, 0, 4), std::sin(1.0));
  EXPECT_DOUBLE_EQ(ape_abi::sinusoid(1, 1, 4), std::cos(1.0));
  EXPECT_NEAR(ape_abi::sinusoid(1, 2, 4), std::sin(0.01), 1e-15);
  EXPECT_NEAR(ape_abi::sinusoid(1, 3, 4), std::cos(0.01), 1e-15);
  EXPECT_EQ(ape_abi::sinusoid(0, 0, 4), 0.0);
  EXPECT_EQ(ape_abi::sinusoid(0, 3, 4), 1.0);
}

TEST(Abi, PairingRule) {
  using P = ape_abi::Pairing;
  // D = 8, fraction 1: half pairs (0,4) (1,5) (2,6) (3,7); interleaved (0,1) (2,3) ...
  const int64_t half[8] = {4, 5, 6, 7, 0, 1, 2, 3}, inter[8] = {1, 0, 3, 2, 5, 4, 7, 6};
  for (int64_t c = 0; c < 8; ++c) {
    EXPECT_EQ(ape_abi::partner(P::Half, 1.0, 8, c), half[c]) << c;
    EXPECT_EQ(ape_abi::partner(P::Interleaved, 1.0, 8, c), inter[c]) << c;
    EXPECT_EQ(ape_abi::partner(P::None, 1.0, 8, c), c) << c;
  }
  // Partial: fraction 0.5 of D = 8 rotates r = 4: half pairs (0,2) (1,3), 4..7 are their own.
  const int64_t partial[8] = {2, 3, 0, 1, 4, 5, 6, 7};
  for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(ape_abi::partner(P::Half, 0.5, 8, c), partial[c]) << c;
  // r = 2 floor(f D / 2): fraction 0.3 of D = 10 rotates 2; an odd D leaves its last column.
  EXPECT_EQ(ape_abi::rotated_dims(0.3, 10), 2);
  EXPECT_EQ(ape_abi::rotated_dims(1.0, 7), 6);
  EXPECT_EQ(ape_abi::partner(P::Interleaved, 1.0, 7, 6), 6);
  EXPECT_EQ(ape_abi::rotated_dims(0.1, 4), 0);  // nothing rotates
  static_assert(ape_abi::partner(ape_abi::Pairing::Half, 1.0, 4, 1) == 3, "constexpr: device code uses it");
}

}  // namespace
