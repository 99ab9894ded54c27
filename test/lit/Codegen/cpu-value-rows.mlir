// The value-side relative term in the generated C++: the functor names the table and its rows,
// and value_row(i, j) is the index region, clamped to the table.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,kernel-mlir
// RUN: FileCheck %s --input-file=%t/shaw_cpu.cpp
// RUN: FileCheck %s --check-prefix=IR --input-file=%t/shaw.kernel.mlir
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/shaw_cpu.cpp

// CHECK: static constexpr int kNumRel = 1;
// CHECK: static constexpr bool kHasValueRows = true;
// CHECK-NEXT: static constexpr int kValueTable = 1;
// CHECK-NEXT: static constexpr int64_t kValueRows = 33;
// CHECK-NEXT: static constexpr bool kValueTableTrainable = true;
// CHECK: static int64_t value_row(const ape::HeadCtx<T> &ctx, int64_t i, int64_t j) {
// CHECK: int64_t(static_cast<uint64_t>(i) - static_cast<uint64_t>(j))
// CHECK: return std::clamp<int64_t>({{v[0-9]+}}, 0, kValueRows - 1);

// IR: ape.value_rows %{{.*}} index {
// IR-NEXT: ^bb0(%{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index):
// IR: ape.score_mod {
// Shaw relative positions, written in the generic form, with both terms:
//   key term   l_ij += q_i·a^K_r / sqrt(d_h)
//   value term z_i  += Σ_j A_ij·a^V_r
// for the clipped distance r = clip(i - j, 0, 32) and learned tables a^K, a^V [33, heads, head_dim].
// The kernel computes q'_i·a^K_r for the 33 rows once per query (ape.rel_rows) and gathers them
// inside the tile; the value term keeps per query the probability mass of each r
// (ape.value_rows). No T×T matrix is formed. Drop the ape.value_rows op for the key term only.
ape.encoding @shaw {
  %ak = ape.param "shaw_key" ["33", "heads", "head_dim"] init = "normal" trainable {std = 0.02 : f64}
  %av = ape.param "shaw_value" ["33", "heads", "head_dim"] init = "normal" trainable {std = 0.02 : f64}
  %rows = ape.rel_rows "q" %ak
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c32 = arith.constant 32 : index
    %d = arith.subi %i, %j : index
    %pos = arith.maxsi %d, %c0 : index
    %r = arith.minsi %pos, %c32 : index
    %qa = ape.load %rows[%b, %h, %i, %r] : !ape.rows
    %dh = ape.dim "head_dim"
    %dh64 = arith.index_cast %dh : index to i64
    %dhf = arith.sitofp %dh64 : i64 to f32
    %root = math.sqrt %dhf : f32
    %term = arith.divf %qa, %root : f32
    %out = arith.addf %s, %term : f32
    ape.yield %out : f32
  }
  ape.value_rows %av index {
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c32 = arith.constant 32 : index
    %d = arith.subi %i, %j : index
    %pos = arith.maxsi %d, %c0 : index
    %r = arith.minsi %pos, %c32 : index
    ape.yield %r : index
  }
}
