// SpecCheck: a compiled kernel against the reference derived from its spec (ape-check,
// docs/ape-check.md).
//
// For every shape (B, H, T, D) of a small grid and one seed, random inputs (q, k, v, dO, features
// ~ N(0, 1); params from their manifest initialiser, trainable ones moved off degenerate values,
// see make_params) go through
//   - the kernel's fp64 forward/backward against the fp64 reference (SpecReference, gradients by
//     autograd): tolerance `fp64_tol` on the normalised error max|err| / max(1, max|ref|);
//   - the kernel's fp32 forward/backward against the same fp64 reference, with the fp32
//     reference's own error as the yardstick: tolerance max(fp32_factor x yardstick, fp32_floor);
//     for a param gradient the floor is fp32_param_floor x sqrt(N), N = B H T (T + 1) / 2 the
//     query-key pairs it sums: the kernel accumulates them in fp32 tile by tile (a rounding
//     error growing like sqrt(N)) where torch's reductions sum pairwise, so the fp32 reference
//     can be far more accurate there than any streaming kernel (measured up to 231x);
//   - fp64 central differences of the kernel's forward at a few entries of q, k, v, every
//     feature and every trainable param against its backward (one shape);
//   - the fixed position table (embed_table), when the encoding has one;
//   - the KV-cache decode steps (CheckOptions::decode): o and lse of each step's new rows against
//     the reference over the tokens so far, with the forward's tolerances;
//   - grouped-query attention (a training kernel; the cell with the most heads, its heads doubled
//     and k, v of the cell's heads, or of H / p heads where the spec pins H, p the smallest prime
//     factor of H): the fp64 and fp32 kernels and decode steps against the reference over k and v
//     repeated to every query head (dk, dv summed per group).
// Quantities: o, lse, dq, dk, dv, dfeature:NAME, dparam:NAME (a fixed param must get a zero
// gradient), fd:INPUT, embed_table, decode:o, decode:lse, and grouped:QUANTITY,
// grouped-decode:o, grouped-decode:lse. An inference-only kernel (an attention
// transition) has no backward: o and lse only (and its decode), at every layer of a model of
// num_layers layers (the cell's label "BxHxTxD Ll"), and the check fails when no cell reaches a
// transformed row.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "runtime/SpecReference.h"

namespace ape {
struct KernelEntry;

struct CheckShape {
  int64_t B = 1, H = 1, T = 1, D = 16;
  std::string str() const;  // "BxHxTxD"
};

struct CheckOptions {
  std::vector<CheckShape> grid;  // empty: default_grid()
  uint64_t seed = 1;
  int fd_entries = 2;            // central differences per input: the largest gradient + random
  double fp64_tol = 1e-10;
  double fp32_factor = 8.0;
  double fp32_floor = 4e-6;
  double fp32_param_floor = 2e-6;  // times sqrt(query-key pairs)
  // The largest yardstick (the fp32 reference's own normalised error) a row takes: beyond it single
  // precision has lost the quantity, the reference shares whatever the kernel got wrong in fp32
  // (a count computed in floats), and the row fails saying so. The 31 example specs: at most 2.8e-5.
  double fp32_yardstick_max = 1e-3;
  bool verbose = false;          // a row per grid cell, not only the worst
  int64_t num_layers = 6;        // an attention transition: checked at every layer of a model this deep
  // The KV-cache decode steps too (ape/cpu/decode.h, as ape-generate runs them): each cell's tokens
  // as a prompt of ceil(T/2), two single tokens and the rest in one step, fp64 and fp32, every
  // step's o and lse against the reference over the tokens so far (rows decode:o, decode:lse).
  bool decode = true;
  // The CUDA kernels too, emulated (ape-check --cuda): for each dtype of cuda_dtypes ("f32",
  // "bf16"), at every cell whose head dim is in cuda_head_dims, fused_attention after
  // use_kernels(dtype) (runtime/SimtAttention.h's use_simt_kernels), and use_kernels("cpu")
  // after. Rows of precision "cuda-f32" (the fp32 tolerance) and "cuda-bf16" (q, k, v and dO
  // rounded to bf16 for the reference too; the tolerance of bf16_row, below, on the normalised error). lse is
  // not compared (the autograd binding returns o alone).
  std::vector<std::string> cuda_dtypes;
  std::vector<int64_t> cuda_head_dims;
  std::function<void(const std::string &)> use_kernels;
  // The architectures whose kernels the CUDA rows check, the emulator posing as each (pose_cuda(sm)
  // before its rows, pose_cuda(0) after all, also on an exception: the pose from before): sm_80's
  // rows are cuda-f32 and cuda-bf16, another's smNN-bf16 (its 16-bit paths: sm_90's Hopper forward
  // and wgmma backward); f32, the general path of every architecture, runs at the first listed
  // only. Empty, or no pose_cuda: sm_80 alone.
  std::vector<int> cuda_archs = {80, 90};
  std::function<void(int)> pose_cuda;
  // Cells the CUDA rows check after the grid's (as given: no fitting), e.g. ape-check's head dim
  // 128 cell on the default grid (the H100's and H200's usual head dim, whose Hopper forward and
  // wgmma backward tiles differ from 64's).
  std::vector<CheckShape> cuda_cells;
  // The emulated CUDA decode steps (runtime/SimtAttention.h's simt_decode) for the rows decode:o
  // and decode:lse of cuda-f32 and cuda-bf16 (with `decode`): (dtype, q, k, v, features, params,
  // scale, steps, num_splits) -> (o, lse) of every step's rows; unset: no CUDA decode rows. The
  // keys split as the device decides (num_splits 0); for bf16 also in up to 3 (rows
  // decode-split:o, decode-split:lse: the split path of 16-bit inputs, which the emulated device's
  // 108 SMs leave to longer sequences than the default grid's).
  std::function<std::pair<at::Tensor, at::Tensor>(
      const std::string &, const at::Tensor &, const at::Tensor &, const at::Tensor &,
      const std::vector<at::Tensor> &, const std::vector<at::Tensor> &, double, const std::vector<int64_t> &,
      int)>
      cuda_decode;
  // A bf16 row's tolerance: max(bf16_tol, bf16_factor x its yardstick), the yardstick the
  // reference's own change under the kernels' roundings (ReferenceSite::round_bf16: q', k', P, o,
  // dS, Delta and the input gradients rounded as the 16-bit kernels round them); a param
  // gradient's yardstick is the root mean square of stochastic roundings' draws over sqrt(2)
  // (param_yardsticks in SpecCheck.cpp) and its factor bf16_param_factor. Measured on the emulated
  // kernels of the example specs, seeds 1-3, sm_80 and sm_90 (bench/ape_check_bf16.py,
  // bench/results/ape_check_bf16.md): error / yardstick at most 2.3 on o, dq, dk, dv and features
  // (FIRE's dk; all 31 specs with a backward), 3.2 on param gradients (FIRE's l_mult; the 14 specs
  // with trainable params; ALiBi's learned slopes 1.6, where one nearest-rounded draw had 9.9).
  double bf16_tol = 5e-3;
  double bf16_factor = 3.0;
  double bf16_param_factor = 6.0;
};

// The default grid: T = 1, a partial tile (T = 37), exactly one 64 x 64 tile, several tiles with
// a partial one (T = 150); head dims 16, 32, 64; B and H up to 3 (kernels/include/ape/
// cpu/attention.h works on 64 x 64 tiles).
std::vector<CheckShape> default_grid();

struct Manifest;
// The shapes of `asked` (empty: default_grid()) that the kernel of `man` accepts. The default
// grid's cells are fitted to the encoding (its head_dim hint sets D, its model_dim hint H; cells
// its rotation cannot rotate are dropped); a shape the user asked for (--shapes) is never changed
// or dropped: one the encoding does not accept throws, naming the shape and the reason. Throws
// when no cell is left.
std::vector<CheckShape> fit_grid(const Manifest &man, const std::vector<CheckShape> &asked);

// The CUDA rows' cell beside the default grid (CheckOptions::cuda_cells): 1 x 2 x 150 x 128, the
// head dim H100 and H200 models mostly use, fitted as the default grid is (none where the
// encoding pins its head dim, which the grid's cells then have, or a model dim 128 does not divide).
std::vector<CheckShape> default_cuda_cells(const Manifest &man);

struct CheckRow {
  std::string quantity, precision, shape;  // shape: the worst cell
  double max_abs = 0, rel = 0, yardstick = -1, tol = 0;  // yardstick < 0: none (fp64, fd)
  bool pass = false;
  std::string note;
  // The reference's normalised size, max |ref| / max(1, max |ref|): the rel of a kernel that wrote
  // zeros; < 0 where not recorded. A passing row whose tolerance reaches half of it (and it is
  // not 0) would pass zeros too: check_kernel lists it apart (CheckReport::unresolved).
  double size = -1;
};

struct CheckReport {
  std::vector<CheckRow> rows;
  std::vector<std::string> problems;  // interface mismatches: each one a failure
  std::vector<std::string> notes;     // said, not failures (what the kernel leaves out, unread)
  // Passing rows not counted as checks, "quantity precision (cells)": their tolerance reached
  // half the reference's size (a kernel that wrote zeros would have passed them too)
  std::vector<std::string> unresolved;
  bool passed() const;
};

// Checks `entry` against `ref`. Throws std::runtime_error for inputs that cannot be checked
// (e.g. no grid shape fits the encoding's head_dim / model_dim hints or its rotation).
CheckReport check_kernel(const KernelEntry &entry, const SpecReference &ref,
                         const CheckOptions &options);

// The pass/fail table.
void print_report(std::ostream &os, const CheckReport &report);

}  // namespace ape
