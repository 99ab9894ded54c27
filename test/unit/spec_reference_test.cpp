// The reference interpreter of ape-check (runtime/SpecReference.h) on its own: the semantics of
// the ops that the example specs do not all use (MLIR's integer division and rounding rules,
// unordered comparisons, NaN-propagating and NaN-ignoring max, non-finite constants), rows with
// no visible key, and clear errors for data it cannot evaluate. The values are MLIR's (the arith
// and math dialect documentation), written here by hand.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "ape/contract/int_math.h"
#include "runtime/SpecReference.h"

namespace {

using at::Tensor;

Tensor idx(int64_t v) { return at::scalar_tensor(v, at::kLong); }
Tensor real(double v) { return at::scalar_tensor(v, at::kDouble); }

// One op `name` of `type` on args 0..n-1 (optionally with a "predicate").
std::string one_op(const std::string &name, const std::string &type, int args,
                   const std::string &extra = "") {
  std::string operands;
  for (int a = 0; a < args; ++a) operands += (a ? ", " : "") + std::to_string(a);
  return R"({"args": )" + std::to_string(args) + R"(, "ops": [{"op": ")" + name + R"(", "type": ")" +
         type + R"(", "operands": [)" + operands + "]" + extra + R"(}], "yield": [)" +
         std::to_string(args) + "]}";
}

double eval1(const std::string &name, const std::string &type, const std::vector<Tensor> &args,
             const std::string &extra = "") {
  auto out = ape::evaluate_reference_region(one_op(name, type, int(args.size()), extra), args);
  return out.at(0).to(at::kDouble).item<double>();
}

TEST(SpecReference, IntegerDivisionFollowsMlir) {
  // divsi and remsi truncate toward zero (remainder has the dividend's sign); floordivsi and
  // ceildivsi round toward -inf and +inf.
  EXPECT_EQ(eval1("arith.divsi", "index", {idx(-7), idx(2)}), -3);
  EXPECT_EQ(eval1("arith.remsi", "index", {idx(-7), idx(2)}), -1);
  EXPECT_EQ(eval1("arith.remsi", "index", {idx(7), idx(-2)}), 1);
  EXPECT_EQ(eval1("arith.floordivsi", "index", {idx(-7), idx(2)}), -4);
  EXPECT_EQ(eval1("arith.ceildivsi", "index", {idx(-7), idx(2)}), -3);
  EXPECT_EQ(eval1("arith.ceildivsi", "index", {idx(7), idx(2)}), 4);
  EXPECT_EQ(eval1("arith.divui", "index", {idx(7), idx(2)}), 3);
  EXPECT_EQ(eval1("arith.xori", "index", {idx(6), idx(1)}), 7);
  // fptosi truncates toward zero.
  EXPECT_EQ(eval1("arith.fptosi", "i64", {real(-2.7)}), -2);
}

// The unsigned ops read negative values as uint64 (2^64 plus them), as the kernels do: the
// reference had refused them ("on a negative operand"), so ape-check could not check a spec that
// tests a range the usual way, (i - j - 3) <u 5, which apec, ape-train and the kernels accept.
TEST(SpecReference, UnsignedOpsReadNegativeValuesAsTheKernelsDo) {
  auto evali = [](const std::string &name, const std::string &type, const std::vector<Tensor> &args,
                  const std::string &extra = "") {
    return ape::evaluate_reference_region(one_op(name, type, int(args.size()), extra), args)
        .at(0)
        .to(at::kLong)
        .item<int64_t>();
  };
  const int64_t values[] = {0, 1, 2, 3, 7, -1, -2, -7, INT64_MIN, INT64_MAX, INT64_MIN + 1, 1LL << 62,
                            -(1LL << 62) - 3, 4294967296LL, -4294967297LL};
  for (int64_t a : values)
    for (int64_t b : values) {
      const std::string at_ = std::to_string(a) + " ? " + std::to_string(b);
      const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
      EXPECT_EQ(evali("arith.divui", "index", {idx(a), idx(b)}), ape::int_math::udiv(a, b)) << at_;
      EXPECT_EQ(evali("arith.remui", "index", {idx(a), idx(b)}), ape::int_math::urem(a, b)) << at_;
      EXPECT_EQ(evali("arith.maxui", "index", {idx(a), idx(b)}), static_cast<int64_t>(std::max(ua, ub))) << at_;
      EXPECT_EQ(evali("arith.minui", "index", {idx(a), idx(b)}), static_cast<int64_t>(std::min(ua, ub))) << at_;
      for (const char *p : {"ult", "ule", "ugt", "uge"}) {
        const bool want = p == std::string("ult") ? ua < ub : p == std::string("ule") ? ua <= ub
                        : p == std::string("ugt") ? ua > ub : ua >= ub;
        EXPECT_EQ(evali("arith.cmpi", "i1", {idx(a), idx(b)}, std::string(R"(, "predicate": ")") + p + "\""), want)
            << p << " " << at_;
      }
    }
  for (int64_t a : values)
    EXPECT_EQ(eval1("arith.uitofp", "f64", {idx(a)}), static_cast<double>(static_cast<uint64_t>(a))) << a;
}

TEST(SpecReference, RoundingAndMaxima) {
  EXPECT_EQ(eval1("math.round", "f32", {real(-2.5)}), -3);  // half away from zero
  EXPECT_EQ(eval1("math.round", "f32", {real(2.5)}), 3);
  EXPECT_EQ(eval1("math.roundeven", "f32", {real(2.5)}), 2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(eval1("arith.maximumf", "f32", {real(nan), real(1)})));
  EXPECT_EQ(eval1("arith.maxnumf", "f32", {real(nan), real(1)}), 1);
  EXPECT_EQ(eval1("arith.minnumf", "f32", {real(3), real(nan)}), 3);
}

TEST(SpecReference, ComparisonsOrderedAndUnordered) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto cmp = [&](const std::string &p, double a, double b) {
    return eval1("arith.cmpf", "i1", {real(a), real(b)}, R"(, "predicate": ")" + p + "\"");
  };
  EXPECT_EQ(cmp("olt", nan, 1), 0);
  EXPECT_EQ(cmp("ult", nan, 1), 1);
  EXPECT_EQ(cmp("one", nan, 1), 0);
  EXPECT_EQ(cmp("une", nan, 1), 1);
  EXPECT_EQ(cmp("oge", 2, 1), 1);
  EXPECT_EQ(cmp("uno", 2, 1), 0);
  EXPECT_EQ(eval1("arith.cmpi", "i1", {idx(-1), idx(0)}, R"(, "predicate": "slt")"), 1);
}

TEST(SpecReference, NonFiniteConstants) {
  auto constant = [](const std::string &v) {
    const std::string region =
        R"({"args": 0, "ops": [{"op": "arith.constant", "type": "f32", "operands": [], "value": )" + v +
        "}], \"yield\": [0]}";
    return ape::evaluate_reference_region(region, {}).at(0).item<double>();
  };
  EXPECT_EQ(constant("\"-inf\""), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(constant("\"inf\""), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(constant("\"nan\"")));
  EXPECT_EQ(constant("0.25"), 0.25);
  EXPECT_THROW(constant("\"infinity\""), std::runtime_error);
}

TEST(SpecReference, UnknownOpIsAnError) {
  try {
    eval1("math.cbrt", "f32", {real(8)});
    FAIL() << "no error";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("op 'math.cbrt' has no reference evaluation"), std::string::npos)
        << e.what();
  }
}

// A score_mod that masks every key of query 0 and keys more than 1 back: row 0 has no visible key
// (o = 0, lse = -inf, no gradient), the other rows a softmax over at most two keys.
TEST(SpecReference, RowWithoutVisibleKey) {
  const std::string doc = R"({
    "format": "ape-reference/1", "encoding": "mask", "source": "test", "scale": null, "causal": true,
    "params": [], "features": [], "tokens": [], "rel_rows": [], "q_mods": [], "k_mods": [],
    "value_rows": null, "embedding": null,
    "score_mods": [{"args": 5, "ops": [
      {"op": "arith.constant", "type": "index", "operands": [], "value": 0},
      {"op": "arith.cmpi", "type": "i1", "operands": [3, 5], "predicate": "eq"},
      {"op": "arith.subi", "type": "index", "operands": [3, 4]},
      {"op": "arith.constant", "type": "index", "operands": [], "value": 1},
      {"op": "arith.cmpi", "type": "i1", "operands": [7, 8], "predicate": "sgt"},
      {"op": "arith.ori", "type": "i1", "operands": [6, 9]},
      {"op": "arith.constant", "type": "f32", "operands": [], "value": "-inf"},
      {"op": "arith.select", "type": "f32", "operands": [10, 11, 0]}], "yield": [12]}]})";
  const ape::SpecReference ref = ape::SpecReference::parse(doc, "test data");
  at::manual_seed(0);
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  Tensor q = at::randn({1, 1, 4, 2}, opt).requires_grad_(), k = at::randn({1, 1, 4, 2}, opt).requires_grad_();
  Tensor v = at::randn({1, 1, 4, 2}, opt).requires_grad_();
  const auto r = ref.attention(q, k, v, {}, {}, 0.5);
  EXPECT_TRUE(r.o[0][0][0].eq(0).all().item<bool>());
  EXPECT_EQ(r.lse[0][0][0].item<double>(), -std::numeric_limits<double>::infinity());
  // Row 2 sees keys 1 and 2: o_2 = softmax(0.5 q_2 . k_{1,2}) v_{1,2}.
  const Tensor l = 0.5 * at::matmul(k.detach()[0][0].slice(0, 1, 3), q.detach()[0][0][2]);
  const Tensor want = at::matmul(at::softmax(l, 0), v.detach()[0][0].slice(0, 1, 3));
  EXPECT_TRUE(at::allclose(r.o.detach()[0][0][2], want, 1e-14, 1e-14));
  r.o.sum().backward();
  EXPECT_TRUE(q.grad()[0][0][0].eq(0).all().item<bool>());
  EXPECT_TRUE(at::isfinite(q.grad()).all().item<bool>());
  EXPECT_TRUE(at::isfinite(k.grad()).all().item<bool>());
}

TEST(SpecReference, MalformedDataIsAnError) {
  EXPECT_THROW(ape::SpecReference::parse("{", "x"), std::runtime_error);
  EXPECT_THROW(ape::SpecReference::parse(R"({"format": "ape-reference/2"})", "x"), std::runtime_error);
  try {
    ape::SpecReference::parse(R"({"format": "ape-reference/1", "encoding": "e", "params": [
        {"name": "p", "shape": ["rows"], "trainable": true}], "features": []})", "x.json");
    FAIL() << "no error";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("reference data of x.json: param 'p' has an unknown dimension 'rows'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
