// A score mod over features (score_bias = "features"): every load reads at the query row, the key
// column or the slice, its indices of the distance saturating. --emit=cuda writes the features
// of each side, the score mod on them with each feature's gradient, the sums into the features'
// elements, and features_same, by which the kernels find the saturation point. (Transformer-XL's
// terms: a query row of the clipped distance, a key row of one column.)
// RUN: rm -rf %t && apec %s -o %t --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: FileCheck %s --input-file=%t/xl_cuda.cuh
// RUN: ape-opt %s -ape-lower | FileCheck %s --check-prefix=IR

// IR: ape.kernel @xl attributes {passes = 1 : i64, score_bias = "features"

// CHECK: static constexpr bool kFeatures = true;
// CHECK-NEXT: static constexpr int kRowFeatures = 1, kColFeatures = 1, kSliceFeatures = 0;
// CHECK: APE_HD static void row_features(const Ctx &ctx, int64_t x, int64_t d, T *f) {
// CHECK: const int64_t [[Z:f0_[0-9]+]] = int64_t(0);
// CHECK-NEXT: const int64_t [[CAP:f0_[0-9]+]] = int64_t(256);
// CHECK-NEXT: const int64_t [[N:f0_[0-9]+]] = std::max<int64_t>(d, [[Z]]);
// CHECK-NEXT: const int64_t [[R:f0_[0-9]+]] = std::min<int64_t>([[N]], [[CAP]]);
// CHECK-NEXT: f[0] = ctx.rel[0][(x) * 257 + (std::clamp<int64_t>([[R]], 0, int64_t(257) - 1))];
// CHECK: APE_HD static void row_features_grad(const Ctx &ctx, int64_t x, int64_t d, const T *g) {
// CHECK: ctx.drel[0][(x) * 257 + (std::clamp<int64_t>({{.*}})] += g[0];
// CHECK: APE_HD static void col_features(const Ctx &ctx, int64_t x, int64_t d, T *f) {
// CHECK: f[0] = ctx.rel[1][(x) * 1 + (
// CHECK: APE_HD static void col_features_grad(const Ctx &ctx, int64_t x, int64_t d, const T *g) {
// CHECK: ctx.drel[1][(x) * 1 + ({{.*}})] += g[0];
// CHECK: APE_HD static T score_mod_features(const Ctx &ctx, const T *rf, const T *cf, const T *sf, int64_t i, int64_t j, T s) {
// CHECK-NOT: ctx.rel
// CHECK: const T [[V:v[0-9]+]] = (rf[0] + cf[0]);
// CHECK-NEXT: const T [[O:v[0-9]+]] = (s + [[V]]);
// CHECK-NEXT: return [[O]];
// CHECK: APE_HD static T score_mod_features_grad(
// CHECK-NOT: ctx.rel
// CHECK: drf[0] += g;
// CHECK-NEXT: dcf[0] += g;
// CHECK-NEXT: return g;
// CHECK: APE_HD static bool features_same(const Ctx &ctx, int64_t d1, int64_t d2) {
// CHECK: std::max<int64_t>(d1,
// CHECK: std::max<int64_t>(d2,
// CHECK: same = same &&
// CHECK: return same;
ape.encoding @xl {
  %p = ape.param "xl_rel" ["257", "heads", "head_dim"] init = "sinusoidal" trainable
  %u = ape.param "xl_u" ["1", "heads", "head_dim"] init = "zeros" trainable
  %qp = ape.rel_rows "q" %p
  %uk = ape.rel_rows "k" %u
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c256 = arith.constant 256 : index
    %d = arith.subi %i, %j : index
    %n = arith.maxsi %d, %c0 : index
    %r = arith.minsi %n, %c256 : index
    %pos = ape.load %qp[%b, %h, %i, %r] : !ape.rows
    %glob = ape.load %uk[%b, %h, %j, %c0] : !ape.rows
    %sum = arith.addf %pos, %glob : f32
    %out = arith.addf %s, %sum : f32
    ape.yield %out : f32
  }
}
