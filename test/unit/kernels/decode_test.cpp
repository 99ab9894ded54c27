// Inference: KV-cache decoding (ape/cpu/decode.h) of every trainable encoding, prefill then steps
// of 1, 3, 5 and 70 tokens, against the full forward over the tokens so far (also at every level
// in CpuLevelsVsReference, levels_test.cpp), with and without grouped queries; and the inference-only attention transition
// (rope_transition) against a materialised reference.
#include "decode_check.h"

namespace {

using namespace ape_test;

class Decode : public ::testing::TestWithParam<std::string> {};

TEST_P(Decode, MatchesFullForward) {
  for (const auto &sched : kDecodeSchedules) {
    check_decode<double>(GetParam(), sched);
    check_decode<float>(GetParam(), sched);
  }
}

// Grouped-query attention (DecodeArgs::kv_heads): 4 query heads reading 2 key heads and 1, the
// cache keeping k and v per key head, against the grouped full forward and, in fp64, the
// materialised reference over k and v repeated to every query head.
TEST_P(Decode, GroupedQueries) {
  for (int64_t kv : {2, 1}) {
    check_decode<double>(GetParam(), kDecodeSchedules[2], nullptr, kv);
    check_decode<float>(GetParam(), kDecodeSchedules[1], nullptr, kv);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Decode, ::testing::ValuesIn(trainable_encodings()),
                         [](const auto &info) { return info.param; });

// Dynamic NTK really depends on the length past its original length (else the prefix check above
// would not test the recomputation of k'): its rows differ from a longer forward's. (xPos reads
// the length only through its centre, which cancels in q' . k' up to rounding.)
TEST(DecodeEdge, DynamicNtkDiffersFromALongerForward) {
  Problem p = make_problem("rope_dynamic_ntk", 1, 2, 300, 16, 7);
  set_param(p, "rope_original_length", 64);
  KernelCall<double> full(p), part(prefix(p, 100));
  full.forward(), part.forward();
  EXPECT_GT(max_abs_diff(part.o, full.o.narrow(2, 0, 100)), 1e-6);
}

TEST(DecodeEdge, ErrorsAreClear) {
  const Problem p = make_problem("cable", 1, 1, 4, 8, 3);
  KernelCall<double> all(p);
  ape::DecodeCache<double> cache;
  ape::DecodeArgs<double> a{};
  a.B = 1, a.H = 1, a.n = 4, a.D = 8;
  a.q = all.q.data_ptr<double>(), a.k = all.k.data_ptr<double>(), a.v = all.v.data_ptr<double>();
  a.features = all.feat_p.data(), a.params = all.prm_p.data(), a.scale = 0.3;
  Tensor o = torch::empty({1, 1, 4, 8}, kF64);
  a.o = o.data_ptr<double>(), a.lse = nullptr;
  auto message = [&](auto &&fn) {
    try {
      fn();
    } catch (const std::exception &e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { p.entry->decode->step_f64(cache, a); }).find("no capacity"),
            std::string::npos);
  cache.capacity = 6;
  p.entry->decode->step_f64(cache, a);
  EXPECT_NE(message([&] { p.entry->decode->step_f64(cache, a); }).find("exceed the cache's capacity 6"),
            std::string::npos);
  a.n = 1, a.H = 2;
  EXPECT_NE(message([&] { p.entry->decode->step_f64(cache, a); }).find("but the cache holds"),
            std::string::npos);
  a.kv_heads = 3;  // not a divisor of H
  EXPECT_NE(message([&] { p.entry->decode->step_f64(cache, a); }).find("kv_heads must be 0 (= H) or a divisor of H"),
            std::string::npos);
  a.kv_heads = 0;
  {  // key heads other than the first step's (H = 2: 2, then 1), the cache unchanged
    const Problem p2 = make_problem("cable", 1, 2, 4, 8, 5);
    KernelCall<double> two(p2);
    ape::DecodeCache<double> c2;
    c2.capacity = 8;
    ape::DecodeArgs<double> b = a;
    b.H = 2, b.n = 1, b.q = two.q.data_ptr<double>(), b.k = two.k.data_ptr<double>(), b.v = two.v.data_ptr<double>();
    b.features = two.feat_p.data(), b.params = two.prm_p.data();
    Tensor o2 = torch::empty({1, 2, 1, 8}, kF64);
    b.o = o2.data_ptr<double>();
    p2.entry->decode->step_f64(c2, b);
    b.kv_heads = 1;
    EXPECT_NE(message([&] { p2.entry->decode->step_f64(c2, b); })
                  .find("H=2, key heads=1, D=8 but the cache holds B=1, H=2, key heads=2"),
              std::string::npos);
    EXPECT_EQ(c2.len, 1);
  }
  // Its buffers follow the first step's capacity: a capacity raised later is refused, not read past.
  a.H = 1, cache.capacity = 600;
  EXPECT_NE(message([&] { p.entry->decode->step_f64(cache, a); }).find("capacity changed after its first step"),
            std::string::npos);
  EXPECT_EQ(cache.len, 4);
}

// ---- the attention transition (inference only) --------------------------------------------------
// The generated rope_transition kernel (examples/encodings/rope_transition.mlir, the spec's
// attributes) against a materialised reference: RoPE's q', k' (kernel_reference), the T x T
// softmax, the spec's steps applied literally to every transformed row
// (ape::transition_row_reference), times V; every layer of a 6-layer model, T = 300 (I = 40:
// layers 1..3 transform rows [80, 160) .. [160, 240)). Untransformed layers equal rope's kernel
// bit for bit.
TEST(RopeTransition, MatchesTheMaterialisedReference) {
  const int64_t N = 6;
  Problem p = make_problem("rope_transition", 2, 2, 300, 16, 17);
  Problem plain = p;
  plain.entry = find_entry("rope");
  ASSERT_TRUE(p.entry && plain.entry);
  p.q = p.q * 2.5;  // sharper rows: weights on both sides of the bound
  plain.q = p.q;
  const auto [qm, km] = ape_test::reference_qk("rope", ref_inputs(p));
  const Tensor logits = torch::matmul(qm, km.transpose(-1, -2)) * p.scale;
  const Tensor mask = torch::ones({p.T, p.T}, torch::kBool).triu(1);
  const Tensor P0 = torch::softmax(logits.masked_fill(mask, -INFINITY), -1).contiguous();
  int transformed = 0;
  for (int64_t layer = 0; layer < N; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer) + " of " + std::to_string(N));
    const ape::TransitionRows rows = ape::transition_rows_of(ape::TransitionAttrs{}, p.T, N, layer);
    Tensor P = P0.clone();
    double *pd = P.data_ptr<double>();
    for (int64_t s = 0; s < p.B * p.H; ++s)
      for (int64_t i = rows.lo; i < rows.hi; ++i) {
        const int64_t st = rows.start(i);
        ape::transition_row_reference(pd + (s * p.T + i) * p.T, st, st + rows.I, 0.5, 0.1);
      }
    const Tensor ref = torch::matmul(P, p.v);
    KernelCall<double> k64(p);
    k64.args.layer = layer, k64.args.num_layers = N;
    k64.forward();
    KernelCall<float> k32(p);
    k32.args.layer = layer, k32.args.num_layers = N;
    k32.forward();
    EXPECT_LT(normalised_error(k64.o, ref), 1e-12);
    EXPECT_LT(normalised_error(k32.o, ref), 2e-5);
    KernelCall<double> r64(plain);
    r64.forward();
    if (rows.empty()) {
      EXPECT_TRUE(torch::equal(k64.o, r64.o)) << "an untransformed layer differs from rope";
    } else {
      ++transformed;
      EXPECT_EQ(rows.I, 40);
      EXPECT_GT(normalised_error(r64.o, ref), 1e-3) << "the transition changed nothing";
    }
    EXPECT_TRUE(torch::equal(k64.lse, r64.lse)) << "lse is the log-sum-exp before the transition";
  }
  EXPECT_EQ(transformed, 3);
}

// Its backward refuses with the reason (training it would compute some other gradient).
TEST(RopeTransition, BackwardRefuses) {
  Problem p = make_problem("rope_transition", 1, 1, 10, 8, 3);
  ASSERT_TRUE(p.entry);
  KernelCall<double> k(p);
  k.forward();
  try {
    k.backward();
    FAIL() << "the backward of an inference-only kernel ran";
  } catch (const std::logic_error &e) {
    EXPECT_NE(std::string(e.what()).find("inference-only"), std::string::npos) << e.what();
  }
}

}  // namespace
