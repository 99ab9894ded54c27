// The Hopper forward (ape/cuda/attention.cuh): sm_90a, TMA, mbarriers and wgmma with a producer
// warpgroup and two (or, at d_h <= 64, three) consumer warpgroups, as FlashAttention-3.
#pragma once

#include "ape/cuda/flash_forward.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// ---- forward, Hopper (sm_90a: TMA, mbarriers, wgmma) -------------------------------------------------
// Blocks of three warpgroups, FlashAttention-3's structure: warpgroup 0 is the producer,
// warpgroups 1 and 2 the consumers. A block computes query tiles of BQ = 128 rows of a slice,
// heaviest first: tile number x is the (x / (B·H))-th query tile from the last of slice x % (B·H)
// (with p.tile_group < B·H, in groups of that many slices, heaviest first within each group:
// FlashAttention-3's L2 grouping of the tile order, so that the group's K' and V stay in L2).
// With kCons = 3 (d_h <= 64 only; APE_CUDA_HOPPER_CONSUMERS=3): four warpgroups, three consumers
// and BQ = 192, FlashAttention-3's tile at d_h 64, where the softmax weighs twice as much against
// the products as at d_h 128: two consumers compute their softmax while the third's products run,
// and a K' and V tile serves 1.5x the rows; the consumers hold 160 registers each instead of 240.
// Block b takes tile b; with p.sched (the persistent grid: a block per SM), it then claims the
// next tile from the counter (number gridDim.x + the counter's old value) until none is left;
// without it (a block per tile) it stops after its first.
//   Producer: one thread claims the tiles, publishes each one's number in a word of shared memory
//     with the Q tile's mbarrier, and issues every copy by TMA (cp.async.bulk.tensor, boxes of the
//     [B·H, T, D] tensors, zeros past T): a tile's Q once the consumers' last S product of the
//     previous tile has read its Q ("q_empty"), then per key tile K' and V into the next stage of
//     a two-stage ring that runs on across the block's tiles, each stage with a "full" mbarrier per
//     operand that the copies complete (arrive.expect_tx announces the bytes) and an "empty"
//     mbarrier per operand the consumers arrive on when they are done with it: K' once the S
//     product that reads it has completed, V once the P V product has (FlashAttention-3's separate
//     K and V pipelines: the key tile two ahead loads while the consumers still use the last V;
//     with one "empty" per stage, the next K' waited for the last P V product and its copy's
//     latency stood between every two steps); a distance or column bias's window comes with K' by
//     a bulk copy. The next tile's Q, K' and V so arrive while the
//     consumers finish the last one. The warpgroup gives its registers back (setmaxnreg.dec) and
//     the consumers take them (setmaxnreg.inc 240).
//   Consumers: consumer warpgroup c owns rows 64 c .. 64 c + 63 of each tile (each warp 16); per
//     key tile it waits for K', runs S = Q'K'^T on wgmma.m64n128k16 (Q and K' read from their
//     tiles, both K-major), the softmax of the FA2 path (flash_softmax) on the accumulators,
//     waits for V, runs O += P V on wgmma.m64nDk16 (P from registers, the S accumulators rounded
//     to In as they stand; V read MN-major, i.e. transposed by the tensor core) and releases the
//     stage; o leaves through the warp's own rows of a staging tile. No block barrier after the
//     start: the producer runs up to two key tiles ahead, and while one consumer warpgroup is in
//     its softmax the other's products keep the tensor cores busy.
//   With p.pingpong (FlashAttention-3's scheduling of the two), the consumers take turns issuing
//     a tile's products by named barriers: consumer c waits for its turn (bar.sync 1 + c),
//     issues S_kt and P_{kt-1} V_{kt-1}, and hands the turn to the next (bar.arrive 1 + (c + 1) %
//     kCons), so that one warpgroup's products run while the others compute their softmax, in
//     rotation.
// Tiles are stored in the canonical layout wgmma reads (cuda/flash_tile.cuh, namespace hopper).
template <class In, int D, int kCons = 2> struct HopperFwd {
  static_assert(kCons == 2 || (kCons == 3 && D <= 64), "three consumers fit their registers at d_h <= 64");
  static constexpr int kConsumers = kCons, kThreads = 128 * (kConsumers + 1);
  // Registers per consumer thread after setmaxnreg (the producer keeps 24): 24 + kCons x this
  // within the 512 per thread of four warpgroups' 64K.
  static constexpr int kConsumerRegs = kCons == 2 ? 240 : 160;
  static constexpr int BQ = 64 * kConsumers, BK = 128, kStages = 2;
  static constexpr int kNT = BK / 8, kDT = D / 8;
  static constexpr int kSwizzle = hopper::swizzle_bytes<D>();
  static constexpr int kRowElems = kSwizzle / 2, kAtomCols = D / kRowElems;
  static constexpr int kDistLen = BQ + BK;
  // mbarriers (q, full_k[2], full_v[2], empty_k[2], empty_v[2], q_empty) and the tile number's
  // word, the bias windows, then the 1024-byte aligned tiles: Q, the K' and V rings, the output's
  // staging tile.
  static constexpr size_t bars = 0, slot = 128, bias = 1024;
  static constexpr size_t q = bias + (kStages * sizeof(float) * kDistLen + 1023) / 1024 * 1024;
  static constexpr size_t k = q + sizeof(In) * BQ * D;
  static constexpr size_t v = k + kStages * sizeof(In) * BK * D;
  static constexpr size_t o = v + kStages * sizeof(In) * BK * D;
  static constexpr size_t bytes = o + sizeof(In) * BQ * D;
  static constexpr size_t dist = bias, rowcol = bias, bytes_dist = bytes, bytes_rowcol = bytes;
  static_assert(slot >= 10 * 8 && slot + sizeof(int) <= bias, "the mbarriers and the tile number fit");
  static_assert(kStages * sizeof(float) * kDistLen <= q - bias, "bias windows fit");
  static_assert(o % 1024 == 0, "the staging tile's rows keep the tiles' alignment");
  static_assert(bytes <= 227 * 1024, "forward tiles exceed sm_90's 227 KiB of shared memory");
  static constexpr unsigned kTileBytes = sizeof(In) * BK * D;
};

// A score mod over features (flash_feature_steps): each consumer warp's column features of two
// key tiles, after the tiles.
template <class Enc, class In, int D, int kCons = 2> constexpr size_t hopper_fwd_feature_bytes() {
  using C = HopperFwd<In, D, kCons>;
  return sizeof(float) * C::kConsumers * 4 * 2 * C::BK * feat_count<Enc>(1);
}

// TMA descriptors of q', k', v as [B·H, T, D] tensors (host: make_hopper_maps).

template <class Enc, class In, int D, int kCons = 2>
__global__ void __launch_bounds__(HopperFwd<In, D, kCons>::kThreads, 1)
    hopper_forward_kernel(const __grid_constant__ Params<Enc, In> p, const __grid_constant__ HopperMaps maps) {
#ifndef APE_SM90A_CODE
  (void)p, (void)maps;
  __trap();  // sm_90a only (hopper_device)
#else
  using C = HopperFwd<In, D, kCons>;
  constexpr int BQ = C::BQ, BK = C::BK, kNT = C::kNT, kDT = C::kDT;
  constexpr float kLog2e = 1.44269504088896341f;
  APE_DYNAMIC_SMEM(smem);
  In *sQ = reinterpret_cast<In *>(smem + C::q), *sK = reinterpret_cast<In *>(smem + C::k);
  In *sV = reinterpret_cast<In *>(smem + C::v);
  uint64_t *bar_q = reinterpret_cast<uint64_t *>(smem + C::bars);
  uint64_t *full_k = bar_q + 1, *full_v = bar_q + 3, *empty_k = bar_q + 5, *empty_v = bar_q + 7;
  uint64_t *q_empty = bar_q + 9;
  int *slot = reinterpret_cast<int *>(smem + C::slot);  // the tile number, -1: none left
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, t = lane % 4, wg = warp / 4;
  // Tile numbers, slices and rows in 32 bits (the launch checks that they fit): the producer
  // runs on 24 registers.
  const int64_t T = p.T;
  const int BH = static_cast<int>(p.B * p.H), n_qt = static_cast<int>(p.n_qt), total = BH * n_qt;
  const int last_qt = static_cast<int>(p.tile0) + n_qt - 1, T32 = static_cast<int>(T);
  // Tile number x: slice, first row. The slices go in groups of p.tile_group (the last group may
  // be smaller), a group's tiles in turn, heaviest first within the group: the (r / n)-th query
  // tile from the last of the group's slice r % n, r the tile's number in the group of n slices.
  // One group of all B·H slices (the default) is the order across all slices.
  const int G = p.tile_group;
  auto tile_rows = [&](int x, int &bh, int &i0) {
    const int per = G * n_qt, gi = x / per, r = x - gi * per;
    const int n = (gi + 1) * G <= BH ? G : BH - gi * G;
    bh = gi * G + r % n;
    i0 = (last_qt - r / n) * BQ;
  };
  auto key_tiles = [&](int i0) {  // the key tiles rows i0 .. i0 + BQ - 1 see
    const int i_end = i0 + BQ < T32 ? i0 + BQ : T32;
    return (i_end + BK - 1) / BK;
  };
  constexpr bool kDist = flash_distance<Enc>(), kRC = flash_rowcol<Enc>();
  constexpr bool kRaw = !Enc::kHasScoreMod || kDist || kRC;
  float *sB = reinterpret_cast<float *>(smem + C::bias);  // distance or column windows
  // A score mod over features: the consumers' column features after the tiles (no parameter
  // cache there: flash_feature_steps).
  constexpr bool kFeat = flash_feature_steps<Enc>();
  constexpr int kRF = feat_count<Enc>(0), kCF = feat_count<Enc>(1), kSF = feat_count<Enc>(2);
  [[maybe_unused]] float *sCF = reinterpret_cast<float *>(smem + C::bytes);
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar_q, 1);
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbar_init(full_k + s, 1);
      ptx::mbar_init(full_v + s, 1);
      ptx::mbar_init(empty_k + s, 128 * C::kConsumers);
      ptx::mbar_init(empty_v + s, 128 * C::kConsumers);
    }
    ptx::mbar_init(q_empty, 128 * C::kConsumers);
    ptx::mbar_init_fence();
  }
  static_assert(C::bytes % 16 == 0, "the parameter cache's base");
  if constexpr (flash_param_cache<Enc>()) ParamCache<Enc>::copy(p, smem + C::bytes, false, C::kThreads);
  __syncthreads();

  if (wg == 0) {  // ---- producer
    ptx::setmaxnreg_dec<24>();
    // One warp runs the loop (its values uniform: the claimed tile number reaches every lane by a
    // shuffle, as FlashAttention-3's scheduler does, so that they live in uniform registers), and
    // its lane 0 issues every claim, copy and arrival.
    if (warp != 0) return;
    const bool leader = lane == 0;
    constexpr unsigned kBiasBytes = kDist ? sizeof(float) * C::kDistLen : kRC ? sizeof(float) * BK : 0;
    // Key tiles loaded for the block's earlier query tiles, modulo 2^32 (a block may load more:
    // stage u % 2 and phase (u / 2) % 2 wrap with it), and the stages not yet used once.
    unsigned it = 0;
    int fresh = C::kStages;
    int x = static_cast<int>(blockIdx.x);
    const int kg = static_cast<int>(p.k_group), vg = static_cast<int>(p.v_group);  // (Params::k_group)
    for (int job = 0;; ++job) {
      if (job > 0) {
        int claim = 0;
        if (leader && p.sched) claim = atomicAdd(p.sched, 1);
        x = p.sched ? static_cast<int>(gridDim.x) + __shfl_sync(0xffffffffu, claim, 0) : total;
        ptx::mbar_wait(q_empty, (job - 1) & 1);  // the last tile's S products have read Q
      }
      if (leader) ptx::st_relaxed_cta(slot, x < total ? x : -1);
      if (x >= total) {
        if (leader) ptx::mbar_arrive(bar_q);  // the consumers read -1 and stop
        return;
      }
      int bh, i0;
      tile_rows(x, bh, i0);
      const int n_tiles = key_tiles(i0);
      const int kbh = bh / kg, vbh = bh / vg;  // the slices of k' and v: its key head's (grouped keys)
      if (leader) {
        ptx::mbar_arrive_expect_tx(bar_q, sizeof(In) * BQ * D);
        hopper::tma_tile<BQ, D>(sQ, &maps.q, i0 - p.qm_row0, bh, bar_q);  // (q' from qm_row0)
      }
      for (int kt = 0; kt < n_tiles; ++kt) {
        const unsigned u = it + unsigned(kt), s = u & 1;
        const bool fresh_stage = fresh > 0;  // never filled: nothing to wait for
        if (fresh_stage) --fresh;
        const int j0 = kt * BK;
        // K' (and the bias window, read with it) once the S products of the stage's last K' are done.
        if (!fresh_stage) ptx::mbar_wait(empty_k + s, ((u >> 1) - 1) & 1);
        if (leader) {
          ptx::mbar_arrive_expect_tx(full_k + s, C::kTileBytes + kBiasBytes);
          hopper::tma_tile<BK, D>(sK + s * BK * D, &maps.k, j0, kbh, full_k + s);
          if constexpr (kDist)  // distances i0 - j0 - BK + x, x < BQ + BK (dist_table_kernel's pads)
            ptx::bulk_copy(sB + s * C::kDistLen, p.dist + bh * p.dist_ld + kDistPad + (i0 - j0 - BK),
                           kBiasBytes, full_k + s);
          if constexpr (kRC)
            ptx::bulk_copy(sB + s * BK, p.rc + 2 * bh * p.rc_ld + p.rc_ld + j0, kBiasBytes, full_k + s);
        }
        // V once the P V products of the stage's last V are done.
        if (!fresh_stage) ptx::mbar_wait(empty_v + s, ((u >> 1) - 1) & 1);
        if (leader) {
          ptx::mbar_arrive_expect_tx(full_v + s, C::kTileBytes);
          hopper::tma_tile<BK, D>(sV + s * BK * D, &maps.v, j0, vbh, full_v + s);
        }
      }
      it += unsigned(n_tiles);
    }
  }

  // ---- consumers
  ptx::setmaxnreg_inc<C::kConsumerRegs>();
  // Consumer warpgroup: rows 64 cw .. (through a shuffle, so that the compiler knows it uniform
  // across the warp: the turns' barrier ids and tests stay in uniform registers).
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;
  const int r0 = 16 * (warp - 4);  // this warp's first row in the tile
  const hopper::Desc dQ = hopper::desc_k<D>(ptx::smem_window_offset(sQ) + uint32_t(64 * cw) * C::kSwizzle);
  const hopper::Desc dK = hopper::desc_k<D>(ptx::smem_window_offset(sK));
  const hopper::Desc dV = hopper::desc_mn<BK, D>(ptx::smem_window_offset(sV));
  const float kf = kRaw ? p.scale * kLog2e : kLog2e;
  const float mscale = kRaw ? p.scale : 1.f;
  unsigned it = 0;  // key tiles consumed for the block's earlier query tiles, modulo 2^32
  for (int job = 0;; ++job) {
    ptx::mbar_wait(bar_q, job & 1);
    const int x = ptx::ld_relaxed_cta(slot);
    if (x < 0) return;
    int bh32, i032;
    tile_rows(x, bh32, i032);
    const int64_t bh = bh32, i0 = i032;
    const int n_tiles = key_tiles(i032);
    DevCtx<Enc> ctx = make_ctx(p, bh, false);
    if constexpr (flash_param_cache<Enc>()) ParamCache<Enc>::point(p, smem + C::bytes, ctx, false);
    [[maybe_unused]] float rb[2];  // R / scale of the thread's rows
    if constexpr (kRC) {
      const float *rc_bh = p.rc + 2 * bh * p.rc_ld;
      for (int h = 0; h < 2; ++h) rb[h] = rc_bh[i0 + r0 + g + 8 * h];
    }
    // A score mod over features (flash_feature_steps): key tiles [0, n_feat), whose every distance
    // is >= d_sat, run it on the features: the thread's rows' and the slice's in registers, the key
    // tile's in shared memory, each consumer warp its own copy by tile parity (its lanes write BK /
    // 32 keys each, in the step before, and meet at __syncwarp before reading; once more at a
    // job's start, for the last job's reads).
    [[maybe_unused]] float rfv[1][2][kRF > 0 ? kRF : 1] = {}, sfv[kSF > 0 ? kSF : 1] = {};
    int n_feat = 0;
    if constexpr (kFeat) {
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + r0 + g + 8 * h;
        if constexpr (kRF > 0) Enc::row_features(ctx, i < T ? i : T - 1, T - 1, rfv[0][h]);
      }
      if constexpr (kSF > 0) Enc::slice_features(ctx, 0, T - 1, sfv);
      if (p.dist_sat) {  // tiles with j0 + BK - 1 <= i0 - d_sat (null: feature steps turned off)
        const int64_t last = i0 - (BK - 1) - p.dist_sat[bh];
        n_feat = last < 0 ? 0 : static_cast<int>(last / BK + 1);
      }
    }
    [[maybe_unused]] auto feat_sync = [] { __syncwarp(); };
    [[maybe_unused]] float *wCF = sCF + (warp - 4) * 2 * BK * kCF;  // this warp's two tiles
    [[maybe_unused]] auto fill_cols = [&](int kt) {  // key tile kt's column features, BK / 32 per lane
      if constexpr (kFeat && kCF > 0) {
        if (kt < n_feat)
          for (int x = lane; x < BK; x += 32) {
            float fv[kCF > 0 ? kCF : 1];
            Enc::col_features(ctx, int64_t(kt) * BK + x, T - 1, fv);
            for (int a = 0; a < kCF; ++a) wCF[((kt & 1) * BK + x) * kCF + a] = fv[a];
          }
      }
    };
    // The score mod of tile kt on the features.
    // (`on`: a std::true_type of the caller's template, so that nothing here is checked for an Enc
    // without features.)
    [[maybe_unused]] auto feat_mod = [&](auto on, int kt) {
      using FE = std::conditional_t<decltype(on)::value, Enc, Enc>;
      const float *cfs = wCF + (kt & 1) * BK * kCF;
      return [&, cfs](int, int h, int cc, int64_t i, int64_t j, float x) {
        return FE::score_mod_features(ctx, static_cast<const float *>(rfv[0][h]), cfs + cc * kCF,
                                      static_cast<const float *>(sfv), i, j, x);
      };
    };
    float o[1][kDT][4] = {};
    float m[1][2] = {{-kInf, -kInf}}, l[1][2] = {{0.f, 0.f}};
    float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o[0][0][0]);
    const int n_plain = i0 + BQ <= T ? static_cast<int>((i0 + 1) / BK) : 0;
    if (n_feat > n_plain) n_feat = n_plain;
    // The softmax of tile kt overlaps the P V product of tile kt - 1 (FlashAttention-3's
    // pipelining inside a warpgroup): issue S_kt, issue O += P_{kt-1} V_{kt-1}, wait for S_kt
    // only, run the softmax, then wait for the product, release stage kt - 1, rescale O and pack
    // P_kt (its registers, the A operand of the next product, are free once the product completed).
    float s_acc[1][kNT][4];
    float(&sf)[BK / 2] = reinterpret_cast<float(&)[BK / 2]>(s_acc[0][0][0]);
    uint32_t a[BK / 16][4];  // P of the previous tile
    auto issue_s = [&](int kt) {
      const unsigned u = it + unsigned(kt), s = u & 1;
      ptx::mbar_wait(full_k + s, (u >> 1) & 1);
      // S = Q' K'^T (+ B / scale, or + (R + C) / scale, as its initial value)
      [[maybe_unused]] const float *tb = sB + s * C::kDistLen + (r0 + g - 2 * t + BK);
      [[maybe_unused]] const float *cwin = sB + s * BK + 2 * t;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int x4 = 0; x4 < 4; ++x4) {
          if constexpr (kDist) s_acc[0][nt][x4] = tb[8 * (x4 / 2) - 8 * nt - x4 % 2];
          else if constexpr (kRC) s_acc[0][nt][x4] = rb[x4 / 2] + cwin[8 * nt + x4 % 2];
          else s_acc[0][nt][x4] = 0.f;
        }
      const hopper::Desc cK = dK.plus(s * C::kTileBytes);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ptx::wgmma_ss<In, BK>(sf, dQ.at(hopper::step_k<BQ, D>(kk)), cK.at(hopper::step_k<BK, D>(kk)),
                              kDist || kRC || kk > 0);
      ptx::wgmma_commit();
    };
    auto issue_pv = [&](int kt) {  // O += P_kt V_kt
      const unsigned u = it + unsigned(kt), s = u & 1;
      ptx::mbar_wait(full_v + s, (u >> 1) & 1);
      const hopper::Desc cV = dV.plus(s * C::kTileBytes);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) ptx::wgmma_rs<In, D, 1>(of, a[kk], cV.at(hopper::step_mn<D>(kk)), 1);
      ptx::wgmma_commit();
    };
    auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) flash::acc_to_a<In>(a[kk], s_acc[0][2 * kk], s_acc[0][2 * kk + 1]);
    };
    // The turns (p.pingpong): consumer cw issues its steps' products between bar.sync 1 + cw and
    // bar.arrive 1 + (cw + 1) % kCons (256 threads: its own and the previous one's arrivals).
    // Consumer 0 starts each tile with an arrival on its own barrier; the last consumer's last step
    // hands on no turn, so that every round of every barrier completes (n_tiles - 1 steps each). A
    // consumer a tile ahead cannot take a round of another's: the next tile's Q waits for every
    // consumer's last S product, which each issues after its last turn.
    const bool pingpong = p.pingpong && n_tiles > 1;
    if (pingpong && cw == 0) ptx::bar_arrive(1, 256);
    auto step = [&](int kt, auto masked, auto feat) {  // kt >= 1
      constexpr bool kMasked = decltype(masked)::value, kFeatStep = decltype(feat)::value;
      if (pingpong) ptx::bar_sync(1 + cw, 256);
      issue_s(kt);
      issue_pv(kt - 1);
      if (pingpong && (cw + 1 < kCons || kt + 1 < n_tiles)) ptx::bar_arrive(1 + (cw + 1) % kCons, 256);
      ptx::wgmma_wait<1>();  // S_kt (the product of tile kt - 1 may still run)
      ptx::fence_regs(sf);
      if (p.kv_split) ptx::mbar_arrive(empty_k + ((it + unsigned(kt)) & 1));  // this thread is done with K'_kt
      if (kt + 1 == n_tiles) ptx::mbar_arrive(q_empty);  // the tile's last read of Q is done
      float alpha[1][2];
      if constexpr (kFeatStep) {
        if constexpr (kCF > 0) feat_sync();  // the tile's column features
        flash_softmax_alpha_mod<Enc, kMasked, kRaw>(s_acc, alpha, m, l, feat_mod(feat, kt), p.scale, kf, i0,
                                                    int64_t(kt) * BK, r0, g, t, T);
        fill_cols(kt + 1);
      } else {
        flash_softmax_alpha<Enc, kMasked, kRaw>(s_acc, alpha, m, l, ctx, p.scale, kf, i0,
                                                int64_t(kt) * BK, r0, g, t, T);
      }
      ptx::wgmma_wait<0>();
      ptx::fence_regs(of);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) ptx::fence_regs(a[kk]);
      ptx::mbar_arrive(empty_v + ((it + unsigned(kt) - 1) & 1));  // this thread is done with V_{kt-1}
      if (!p.kv_split) ptx::mbar_arrive(empty_k + ((it + unsigned(kt) - 1) & 1));  // K'_{kt-1} with it (APE_CUDA_KV_SPLIT=0)
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
        for (int x4 = 0; x4 < 4; ++x4) o[0][dt][x4] *= alpha[0][x4 / 2];
      pack_p();
    };
    // Tile 0 (O is 0: no product to wait for), the steady state, the masked tiles, the last product.
    if constexpr (kFeat && kCF > 0)
      if (n_feat > 0) {
        feat_sync();  // the last job's reads of the column features
        fill_cols(0);
        feat_sync();
      }
    issue_s(0);
    ptx::wgmma_wait<0>();
    ptx::fence_regs(sf);
    if (p.kv_split) ptx::mbar_arrive(empty_k + (it & 1));
    if (n_tiles == 1) ptx::mbar_arrive(q_empty);
    bool tile0 = false;  // tile 0 on the features
    if constexpr (kFeat)
      if (n_feat > 0) {
        float alpha[1][2];
        flash_softmax_mod<Enc, false, kRaw>(s_acc, o, m, l, feat_mod(std::true_type{}, 0), p.scale, kf, i0, 0, r0, g, t, T, alpha);
        fill_cols(1);
        tile0 = true;
      }
    if (!tile0) {
      if (n_plain > 0) flash_softmax<Enc, false, kRaw>(s_acc, o, m, l, ctx, p.scale, kf, i0, 0, r0, g, t, T);
      else flash_softmax<Enc, true, kRaw>(s_acc, o, m, l, ctx, p.scale, kf, i0, 0, r0, g, t, T);
    }
    pack_p();
    int kt = 1;
    if constexpr (kFeat)
      for (; kt < n_feat; ++kt) step(kt, std::false_type{}, std::true_type{});
    for (; kt < n_plain; ++kt) step(kt, std::false_type{}, std::false_type{});
    for (; kt < n_tiles; ++kt) step(kt, std::true_type{}, std::false_type{});
    issue_pv(n_tiles - 1);
    ptx::wgmma_wait<0>();
    ptx::fence_regs(of);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) ptx::fence_regs(a[kk]);
    ptx::mbar_arrive(empty_v + ((it + unsigned(n_tiles) - 1) & 1));
    if (!p.kv_split) ptx::mbar_arrive(empty_k + ((it + unsigned(n_tiles) - 1) & 1));
    it += unsigned(n_tiles);

    // o = O / l through shared memory: each warp stages its 16 rows in its own rows of the staging
    // tile (after __syncwarp: its lanes' reads of the last tile's rows are done), then stores whole
    // rows in 16-byte chunks, 512 contiguous bytes per warp instruction at D = 128, where the
    // fragments' 2-byte stores each touched 8 rows. The staging rows have the tiles' layout:
    // kSwizzle-byte rows per box of kRowElems columns, 16-byte chunk k of row r at k ^ (r % kChunks),
    // so that the fragment writes (a row per lane quad) and the chunk reads (a row per kChunks
    // lanes) are free of bank conflicts.
    constexpr int kChunks = C::kSwizzle / 16;  // 16-byte chunks per staging row
    __syncwarp();
    unsigned char *stage = smem + C::o + size_t(r0) * C::kSwizzle;  // box a's rows at + a BQ kSwizzle
    auto chunk_at = [&](int r, int k) {  // row r of the warp's 16, chunk k of the row's D / 8
      return stage + size_t(k / kChunks) * BQ * C::kSwizzle + r * C::kSwizzle + 16 * ((k % kChunks) ^ (r % kChunks));
    };
    float lt[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lt[h] = flash::quad_sum(l[0][h]);
      const float inv = lt[h] > 0.f ? 1.f / lt[h] : 0.f;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        *reinterpret_cast<uint32_t *>(chunk_at(g + 8 * h, dt) + 4 * t) =
            flash::pack2<In>(o[0][dt][2 * h] * inv, o[0][dt][2 * h + 1] * inv);
      }
    }
    __syncwarp();
    const int64_t rows = T - (i0 + r0) < 16 ? T - (i0 + r0) : 16;
    static_assert(16 * D / 8 % 32 == 0, "whole chunks per lane");
#pragma unroll
    for (int u = 0; u < 16 * D / 8 / 32; ++u) {
      const int xc = lane + 32 * u, r = xc / (D / 8), k = xc % (D / 8);
      if (r < rows && i0 + r0 + r >= p.o_row0)
        *reinterpret_cast<ptx::F4 *>(p.o + out_row(p, bh, i0 + r0 + r) * D + 8 * k) =
            *reinterpret_cast<const ptx::F4 *>(chunk_at(r, k));
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t i = i0 + r0 + g + 8 * h;
      if (out_stored(p, i) && t == 0) p.lse[out_row(p, bh, i)] = m[0][h] * mscale + logf(lt[h]);
    }
  }
#endif
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
