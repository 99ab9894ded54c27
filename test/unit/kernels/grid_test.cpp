// The grid against the reference: fp32 and fp64 forward/backward of every trainable encoding
// against the independent materialised fp64 LibTorch reference (kernel_reference.h) on B in {1,3},
// H in {1,4}, T in {1,7,64,129,1000}, D in {16,64,128}: o, lse, dq, dk, dv, every feature
// gradient, every param gradient. The bias and relative-position encodings use the reduced grid
// (below): their bias terms do not depend on D, and the T = 1000 cells with D = 16 reach every
// bucket, both clips (Shaw 32, XL 256) and both branches of FIRE's max(i, 512 L). Their params
// get values at which the terms matter (bias_param_std).
#include "harness.h"

namespace {

using namespace ape_test;

// The grid (harness.h: trainable_encodings()). kGridPerCell is deliberately a subset: the first
// seven encodings run one cell per test (KernelGrid); every other trainable encoding (a new spec
// in examples/encodings/ included) runs one test per (encoding, T) covering every (B, H, D)
// (KernelGridCells: each process start loads LibTorch, ~0.4 s of CPU, which would dominate a
// per-cell split of the others). The full grid runs for the original seven and for a
// representative of each mechanism whose error grows with T (kFullGridCells: dynamic NTK's
// run-time base, xPos's factors, ExQPE's block counter, ExPE + Cable's prefix sums); the other
// encodings skip the T = 1000 cells with D >= 64 (they dominate the grid's time and run the same
// template code paths). The ten bias and relative-position encodings follow the reduced grid: the
// full one would add ~8 T = 1000 cells each (the 257-row tables of Transformer-XL and the
// materialised [T, T, 32] hidden layer of FIRE's reference make those the slowest), while their
// terms do not depend on D. Their additions measured ~3.5 min in all on the shared 2-core
// machine (grid ~2.3 min, finite differences ~0.9 min, edge cases, hand checks and the rest ~0.3
// min; the whole suite ~10.5 min there).
const std::vector<std::string> kGridPerCell = {"alibi",       "cable", "expe", "expe_rope_cable",
                                               "forget_gate", "nope",  "rope"};
const std::set<std::string> kFullGridCells = {"expe_cable", "exqpe", "rope_dynamic_ntk", "xpos"};

// The trainable encodings outside kGridPerCell.
std::vector<std::string> grid_cells_encodings() {
  std::vector<std::string> r;
  for (const auto &enc : trainable_encodings())
    if (std::find(kGridPerCell.begin(), kGridPerCell.end(), enc) == kGridPerCell.end())
      r.push_back(enc);
  return r;
}

// ---- the grid against the reference -------------------------------------------------------------

using GridCase = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>;  // enc, B, H, T, D
class KernelGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(KernelGrid, MatchesReference) {
  const auto &[enc, B, H, T, D] = GetParam();
  const Problem p = make_problem(enc, B, H, T, D, case_seed(enc, B, H, T, D));
  ASSERT_NE(p.entry, nullptr);
  check_against_reference(p);
}

std::string grid_case_name(const ::testing::TestParamInfo<GridCase> &info) {
  const auto &[enc, B, H, T, D] = info.param;
  return case_name(enc, B, H, T, D);
}

INSTANTIATE_TEST_SUITE_P(
    All, KernelGrid,
    ::testing::Combine(::testing::ValuesIn(kGridPerCell), ::testing::Values<int64_t>(1, 3),
                       ::testing::Values<int64_t>(1, 4),
                       ::testing::Values<int64_t>(1, 7, 64, 129, 1000),
                       ::testing::Values<int64_t>(16, 64, 128)),
    grid_case_name);

using CellsCase = std::tuple<std::string, int64_t>;  // enc, T
class KernelGridCells : public ::testing::TestWithParam<CellsCase> {};

// The cells (B, H, D) of one (encoding, T), each with the seed and checks of its KernelGrid cell.
TEST_P(KernelGridCells, MatchReference) {
  const auto &[enc, T] = GetParam();
  const bool full = kFullGridCells.count(enc) > 0;
  for (int64_t B : {1, 3})
    for (int64_t H : {1, 4})
      for (int64_t D : {16, 64, 128}) {
        if (T == 1000 && D > 16 && !full) continue;
        SCOPED_TRACE(case_name(enc, B, H, T, D));
        const Problem p = make_problem(enc, B, H, T, D, case_seed(enc, B, H, T, D));
        ASSERT_NE(p.entry, nullptr);
        check_against_reference(p);
      }
}

INSTANTIATE_TEST_SUITE_P(All, KernelGridCells,
                         ::testing::Combine(::testing::ValuesIn(grid_cells_encodings()),
                                            ::testing::Values<int64_t>(1, 7, 64, 129, 1000)),
                         [](const ::testing::TestParamInfo<CellsCase> &info) {
                           return std::get<0>(info.param) + "_T" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Every trainable encoding is in the grid, the per-cell list and the full-grid representatives are
// registered encodings, and the reference knows every one.
TEST(Registry, EveryEncodingIsInTheGrid) {
  const auto &all = trainable_encodings();
  const std::vector<std::string> cells = grid_cells_encodings();
  std::multiset<std::string> grid(kGridPerCell.begin(), kGridPerCell.end());
  grid.insert(cells.begin(), cells.end());
  for (const auto &enc : kFullGridCells) EXPECT_EQ(std::count(cells.begin(), cells.end(), enc), 1) << enc;
  EXPECT_EQ(grid, std::multiset<std::string>(all.begin(), all.end()));
  for (const auto &enc : all) {
    const auto &known = ape_test::reference_encodings();
    EXPECT_NE(std::find(known.begin(), known.end(), enc), known.end()) << "reference lacks " << enc;
  }
}

}  // namespace
