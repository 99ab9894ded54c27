// The SIMT emulator's own tests: each check (ape/simt/runtime.h) fires on a kernel with a planted
// bug and stays silent on the same kernel without it; the PTX lane layouts of ldmatrix and
// mma.sync match the PTX ISA's formulas (written out again here, independently of the
// emulator's tables) and a kernel that maps lanes wrongly computes wrong numbers; the bf16 / f16
// conversions round like LibTorch's (round to nearest even), over every class of input.
#include "simt_planted.h"

#include <ape/simt/runtime.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using ape::simt::Check;

// The findings since the last call, as "check: message" lines.
std::vector<ape::simt::Finding> findings() { return ape::simt::take_findings(); }

bool has(const std::vector<ape::simt::Finding> &fs, Check c, const std::string &text = "") {
  for (const auto &f : fs)
    if (f.check == c && f.message.find(text) != std::string::npos) return true;
  return false;
}

std::string dump(const std::vector<ape::simt::Finding> &fs) {
  std::string s;
  for (const auto &f : fs) s += std::string(ape::simt::check_name(f.check)) + ": " + f.message + "\n";
  return s.empty() ? "(none)" : s;
}

class Simt : public ::testing::Test {
 protected:
  void SetUp() override {
    ape::simt::set_print(false);
    findings();
    ape::simt::set_arch(80);
  }
  void TearDown() override { ape::simt::set_print(true); }
};

TEST_F(Simt, RacecheckCatchesAMissingBarrier) {
  std::vector<int> out;
  ASSERT_EQ(planted::neighbour_exchange(128, true, out), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int t = 0; t < 128; ++t) ASSERT_EQ(out[t], (t + 1) % 128);
  ASSERT_EQ(planted::neighbour_exchange(128, false, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Racecheck, "read-after-write")) << dump(fs);
}

// A round of a named barrier that every thread of the block takes part in by bar.sync orders like
// __syncthreads (the warp-specialised wgmma backward's block barrier: bar.sync 1 with all 384
// threads, reached from each role's own code); rounds of fewer threads order nothing for the race
// check (two halves, each under its own id: the exchange across them is reported), nor does a
// round that a warp joins by bar.arrive (its reads after it are reported).
TEST_F(Simt, RacecheckCreditsANamedBarrierOfTheWholeBlock) {
  std::vector<int> out;
  ASSERT_EQ(planted::neighbour_exchange_named(128, 0, out), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int t = 0; t < 128; ++t) ASSERT_EQ(out[t], (t + 1) % 128);
  ASSERT_EQ(planted::neighbour_exchange_named(128, 1, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Racecheck, "read-after-write")) << dump(fs);
  ASSERT_EQ(planted::neighbour_exchange_named(128, 2, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Racecheck, "read-after-write")) << dump(fs);
}

// The aligned bar.sync waited on from two roles' own code (two source lines) is reported, as
// synccheck reports it on a GPU (the wgmma backward's block barrier did that until it took the
// unaligned barrier.sync); barrier.sync there orders the exchange and is not.
TEST_F(Simt, SynccheckCatchesAnAlignedBarrierWaitedOnInDifferentCode) {
  std::vector<int> out;
  ASSERT_EQ(planted::neighbour_exchange_named(128, 3, out), 0);
  auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "(aligned) is waited on in one round at two instructions"))
      << dump(fs);
  ASSERT_EQ(planted::neighbour_exchange_named(128, 4, out), 0);
  fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int t = 0; t < 128; ++t) ASSERT_EQ(out[t], (t + 1) % 128);
}

TEST_F(Simt, RacecheckCatchesAWriteOverAnotherThreadsRead) {
  ASSERT_EQ(planted::read_then_overwrite(64), 0);
  const auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Racecheck)) << dump(fs);
}

TEST_F(Simt, RacecheckLetsAtomicsMeetButNotAPlainRead) {
  int total = 0;
  ASSERT_EQ(planted::shared_atomics(false, total), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  EXPECT_EQ(total, 128);
  ASSERT_EQ(planted::shared_atomics(true, total), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Racecheck)) << dump(fs);
}

TEST_F(Simt, TrafficCountsEveryDeviceAccessByKindAndWidth) {
  ape::simt::take_traffic();
  float counter = 0;
  ASSERT_EQ(planted::traffic(64, counter), 0);
  EXPECT_EQ(counter, 64.f);
  const auto all = ape::simt::take_traffic();
  ASSERT_EQ(all.size(), 1u);  // host copies and memsets are not a kernel's traffic
  const ape::simt::Traffic &t = all[0];
  EXPECT_FALSE(t.kernel.empty());
  EXPECT_EQ(t.launches, 1u);
  EXPECT_EQ(t.blocks, 1u);
  EXPECT_EQ(t.threads, 64u);
  EXPECT_EQ(t.read, 64u * 16);
  EXPECT_EQ(t.written, 64u * 4);
  EXPECT_EQ(t.atomic, 64u * 4);
  EXPECT_EQ(t.by_width[4], 64u * 16);  // the 16-byte loads
  EXPECT_EQ(t.by_width[2], 64u * 8);   // 4-byte stores and atomics
  EXPECT_EQ(t.by_width[0] + t.by_width[1] + t.by_width[3] + t.by_width[5], 0u);
  EXPECT_EQ(t.accesses, 64u * 3);
  EXPECT_TRUE(ape::simt::take_traffic().empty());  // taken: cleared
  // cp.async sources count as async copies.
  std::vector<float> out;
  ASSERT_EQ(planted::async_copy(planted::AsyncMode::Correct, 16, out), 0);
  size_t async_bytes = 0;
  for (const auto &k : ape::simt::take_traffic()) async_bytes += k.by_width[5];
  EXPECT_EQ(async_bytes, 32u * 16);
}

TEST_F(Simt, MemcheckCatchesAnOffByOnePartialTile) {
  std::vector<float> out;
  ASSERT_EQ(planted::tile_copy(100, false, out), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(out[i], static_cast<float>(i));
  ASSERT_EQ(planted::tile_copy(100, true, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "outside every live allocation")) << dump(fs);
}

TEST_F(Simt, MemcheckCatchesSharedOverflowUseAfterFreeAndHostDereference) {
  ASSERT_EQ(planted::shared_overflow(), 0);
  auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "outside the block's shared memory")) << dump(fs);
  ASSERT_EQ(planted::use_after_free(), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "outside every live allocation")) << dump(fs);
  ASSERT_EQ(planted::host_reads_device(), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "host code reads")) << dump(fs);
}

// cudaMemcpy2DAsync (cuda/decode.h's copies of every slice's rows at once): height rows of width
// bytes from rows spitch apart to rows dpitch apart, nothing between them touched; a pitch below
// the width is refused (cudaErrorInvalidPitchValue), and a row outside the allocations is a finding.
TEST_F(Simt, Memcpy2DCopiesRowsAtTheirPitches) {
  std::vector<unsigned char> host, back;
  std::vector<int> codes;
  ASSERT_EQ(planted::memcpy_2d(host, back, codes), 0);
  ASSERT_EQ(host.size(), 7u * 40);
  ASSERT_EQ(back.size(), 5u * 64);
  ASSERT_EQ(codes.size(), 3u);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 64; ++c) {  // src rows 1..5 (40 bytes apart), bytes 3..26 -> dst rows 0..4 (64 apart), byte 8
      const unsigned char want = c >= 8 && c < 32 ? host[(r + 1) * 40 + 3 + (c - 8)] : 0xEE;
      ASSERT_EQ(back[r * 64 + c], want) << "row " << r << ", byte " << c;
    }
  EXPECT_EQ(codes[0], 12) << "a destination pitch below the width: cudaErrorInvalidPitchValue";
  EXPECT_EQ(codes[1], 12) << "a source pitch below the width: cudaErrorInvalidPitchValue";
  EXPECT_NE(codes[2], 0) << "rows past the source's allocation";
  const auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "outside every live allocation")) << dump(fs);
}

// cuda/decode.h's copy_rows through each of its three ways: one slice (a plain copy), several at
// once (a 2-D copy), and a copy per slice where a pitch exceeds max_pitch.
TEST_F(Simt, DecodeCopyRowsEveryWay) {
  for (const auto &[S, max_pitch] : {std::pair<int64_t, size_t>{1, 1 << 20}, {3, 1 << 20}, {3, 16}}) {
    std::vector<unsigned char> src, dst;
    ASSERT_EQ(planted::decode_copy_rows(S, max_pitch, src, dst), 0) << "S " << S;
    for (int64_t x = 0; x < S; ++x)
      for (int r = 0; r < 7; ++r)
        for (int c = 0; c < 12; ++c) {
          const unsigned char want = r >= 2 && r < 5 ? src[(x * 5 + (r - 2)) * 12 + c] : 0xEE;
          ASSERT_EQ(dst[(x * 7 + r) * 12 + c], want)
              << "S " << S << ", max_pitch " << max_pitch << ": slice " << x << ", row " << r << ", byte " << c;
        }
    const auto fs = findings();
    EXPECT_TRUE(fs.empty()) << dump(fs);
  }
}

TEST_F(Simt, StaticSharedMemoryIsPerBlockAndBounded) {
  std::vector<float> out;
  ASSERT_EQ(planted::static_shared_reverse(false, out), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(out[i], static_cast<float>(63 - i));
  ASSERT_EQ(planted::static_shared_reverse(true, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "outside the block's shared memory")) << dump(fs);
}

TEST_F(Simt, InitcheckCatchesAReadOfUnwrittenSharedMemory) {
  ASSERT_EQ(planted::uninitialised_shared_read(), 0);
  const auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Initcheck, "nothing has written")) << dump(fs);
}

TEST_F(Simt, SynccheckCatchesDivergentBarriersExitedLanesAndDeadlocks) {
  EXPECT_EQ(planted::divergent_barriers(), 0);
  auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "different __syncthreads")) << dump(fs);
  EXPECT_NE(planted::shuffle_with_exited_lane(), 0);  // it can never complete: a launch failure
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "have returned")) << dump(fs);
  EXPECT_NE(planted::deadlock(), 0);  // the block is abandoned: a launch failure
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "deadlock")) << dump(fs);
}

TEST_F(Simt, AsyncCopiesLandOnlyWhenAWaitLetsThem) {
  std::vector<float> out;
  ASSERT_EQ(planted::async_copy(planted::AsyncMode::Correct, 16, out), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(out[i], 1.0f + static_cast<float>(i)) << i;
  ASSERT_EQ(planted::async_copy(planted::AsyncMode::Correct, 8, out), 0);  // zero fill
  fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(out[i], i % 4 < 2 ? 1.0f + static_cast<float>(i) : 0.0f) << i;
  ASSERT_EQ(planted::async_copy(planted::AsyncMode::ReadBeforeWait, 16, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Async, "not yet waited for")) << dump(fs);
  ASSERT_EQ(planted::async_copy(planted::AsyncMode::NeverWait, 16, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Async, "never waited for")) << dump(fs);
}

TEST_F(Simt, LaunchChecksFollowTheArchitecture) {
  EXPECT_EQ(planted::big_shared(40 * 1024, false), 0);
  EXPECT_NE(planted::big_shared(60 * 1024, false), 0);  // > 48 KiB needs the attribute
  auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Launch, "48 KiB")) << dump(fs);
  EXPECT_EQ(planted::big_shared(120 * 1024, true), 0);  // sm_80: up to 163 KiB
  ape::simt::set_arch(86);
  EXPECT_NE(planted::big_shared(120 * 1024, true), 0);  // sm_86: 99 KiB
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Launch, "sm_86")) << dump(fs);
  ape::simt::set_arch(80);
}

// The occupancy query (cudaOccupancyMaxActiveBlocksPerMultiprocessor) by the architecture's
// threads, blocks and shared memory per SM, 1 KiB of it reserved per block (the emulator has no
// registers to count).
TEST_F(Simt, OccupancyFollowsTheArchitecture) {
  auto blocks = [](int threads, int bytes) {
    int n = -1;
    EXPECT_EQ(planted::big_shared_occupancy(threads, bytes, n), 0);
    return n;
  };
  EXPECT_EQ(blocks(128, 0), 16);          // sm_80: 2048 threads
  EXPECT_EQ(blocks(32, 0), 32);           // 32 blocks
  EXPECT_EQ(blocks(256, 48 * 1024), 3);   // 164 KiB / 49 KiB
  EXPECT_EQ(blocks(256, 96 * 1024), 1);
  ape::simt::set_arch(90);
  EXPECT_EQ(blocks(256, 96 * 1024), 2);   // 228 KiB
  ape::simt::set_arch(86);
  EXPECT_EQ(blocks(1024, 0), 1);          // 1536 threads
  EXPECT_EQ(blocks(256, 48 * 1024), 2);   // 100 KiB
  EXPECT_EQ(blocks(256, 120 * 1024), 0);  // beyond sm_86's 99 KiB a block
  ape::simt::set_arch(80);
  findings();  // (the refused attribute's)
}

// ---- PTX layouts -------------------------------------------------------------------------------------
uint16_t bf16_bits(float x) {
  const torch::Tensor t = torch::tensor({x}).to(torch::kBFloat16);
  uint16_t bits;
  std::memcpy(&bits, t.data_ptr(), 2);
  return bits;
}
float bf16_value(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST_F(Simt, LdmatrixGivesEachLaneThePtxIsaElements) {
  std::vector<uint16_t> m(256);
  for (int i = 0; i < 256; ++i) m[i] = static_cast<uint16_t>(i + 1);  // distinct values
  for (bool trans : {false, true}) {
    std::vector<uint32_t> regs;
    ASSERT_EQ(planted::ldmatrix_x4(m, trans, regs), 0);
    EXPECT_TRUE(findings().empty());
    for (int lane = 0; lane < 32; ++lane)
      for (int mat = 0; mat < 4; ++mat) {
        // PTX ISA, ldmatrix: thread l holds row l/4, elements 2(l%4) and 2(l%4)+1 of each
        // matrix (with .trans, of the transposed matrix).
        const int r = lane / 4, c = 2 * (lane % 4);
        auto at = [&](int row, int col) { return m[mat * 64 + row * 8 + col]; };
        const uint32_t want = trans ? (uint32_t(at(c, r)) | uint32_t(at(c + 1, r)) << 16)
                                    : (uint32_t(at(r, c)) | uint32_t(at(r, c + 1)) << 16);
        ASSERT_EQ(regs[lane * 4 + mat], want) << "lane " << lane << " matrix " << mat
                                              << (trans ? " .trans" : "");
      }
  }
}

TEST_F(Simt, StmatrixWritesEachLanesPtxIsaElements) {
  ape::simt::set_arch(90);  // sm_90's instruction
  std::vector<uint32_t> regs(128);
  for (int i = 0; i < 128; ++i)  // distinct halves: lane, register and half recoverable
    regs[i] = static_cast<uint32_t>(2 * i + 1) | static_cast<uint32_t>(2 * i + 2) << 16;
  for (bool trans : {false, true}) {
    std::vector<uint16_t> m;
    ASSERT_EQ(planted::stmatrix_x4(regs, trans, m), 0);
    const auto fs = findings();
    EXPECT_TRUE(fs.empty()) << dump(fs);
    for (int lane = 0; lane < 32; ++lane)
      for (int mat = 0; mat < 4; ++mat) {
        // PTX ISA, stmatrix: thread l holds row l/4, elements 2(l%4) and 2(l%4)+1 of each matrix
        // (with .trans, of the transposed matrix): ldmatrix's layout.
        const int r = lane / 4, c = 2 * (lane % 4);
        auto at = [&](int row, int col) { return m[mat * 64 + row * 8 + col]; };
        const uint32_t got = trans ? (uint32_t(at(c, r)) | uint32_t(at(c + 1, r)) << 16)
                                   : (uint32_t(at(r, c)) | uint32_t(at(r, c + 1)) << 16);
        ASSERT_EQ(got, regs[lane * 4 + mat]) << "lane " << lane << " matrix " << mat
                                             << (trans ? " .trans" : "");
      }
  }
  // A row address off its 16-byte alignment is a finding; so is the instruction posing as sm_80.
  std::vector<uint16_t> m;
  planted::stmatrix_x4(regs, false, m, 3);
  auto fs = findings();
  EXPECT_TRUE(has(fs, Check::Memcheck, "not 16-byte aligned")) << dump(fs);
  ape::simt::set_arch(80);
  planted::stmatrix_x4(regs, false, m);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Launch, "stmatrix needs sm_90")) << dump(fs);
}

TEST_F(Simt, MmaFollowsThePtxIsaLayoutAndAWrongLaneMapFails) {
  torch::manual_seed(3);
  const torch::Tensor A = torch::randn({16, 16}).to(torch::kBFloat16);
  const torch::Tensor B = torch::randn({16, 8}).to(torch::kBFloat16);
  const torch::Tensor C = torch::randn({16, 8});
  std::vector<uint16_t> a(256), b(128);
  std::vector<float> c(128);
  std::memcpy(a.data(), A.data_ptr(), 512);
  std::memcpy(b.data(), B.data_ptr(), 256);
  std::memcpy(c.data(), C.data_ptr(), 512);
  const torch::Tensor want =
      (A.to(torch::kFloat64).matmul(B.to(torch::kFloat64)) + C.to(torch::kFloat64));
  std::vector<float> d;
  ape::simt::take_traffic();
  ASSERT_EQ(planted::mma_16x8x16(a, b, c, false, d), 0);
  EXPECT_TRUE(findings().empty());
  size_t flops = 0;
  for (const auto &t : ape::simt::take_traffic()) flops += t.mma_flops;
  EXPECT_EQ(flops, size_t(2 * 16 * 8 * 16)) << "the tensor cores' work of one mma.sync (Traffic::mma_flops)";
  const torch::Tensor got = torch::from_blob(d.data(), {16, 8}).to(torch::kFloat64);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);  // f32 sums of exact products
  ASSERT_EQ(planted::mma_16x8x16(a, b, c, true, d), 0);
  const torch::Tensor wrong = torch::from_blob(d.data(), {16, 8}).to(torch::kFloat64);
  EXPECT_GT((wrong - want).abs().max().item<double>(), 0.5) << "a wrong lane map went unnoticed";
}

// wgmma: every swizzle, B K-major and MN-major (transposed by the instruction), A from shared
// memory and from registers, against a matmul; D read before the wait is not the product, and a
// warp that never waits is a finding.
TEST_F(Simt, WgmmaFollowsTheCanonicalLayoutsAndDefersItsResult) {
  torch::manual_seed(5);
  for (int n : {64, 128}) {
    const torch::Tensor A = torch::randn({64, 16}).to(torch::kBFloat16);
    const torch::Tensor B = torch::randn({16, n}).to(torch::kBFloat16);
    std::vector<uint16_t> a(64 * 16), b(static_cast<size_t>(16 * n));
    std::memcpy(a.data(), A.data_ptr(), a.size() * 2);
    std::memcpy(b.data(), B.data_ptr(), b.size() * 2);
    const torch::Tensor want = A.to(torch::kFloat64).matmul(B.to(torch::kFloat64));
    for (int swizzle : {0, 32, 64, 128})
      for (bool mn : {false, true})
        for (bool regs : {false, true}) {
          SCOPED_TRACE("n " + std::to_string(n) + " swizzle " + std::to_string(swizzle) +
                       (mn ? " B MN-major" : " B K-major") + (regs ? " A registers" : " A shared"));
          std::vector<float> d;
          ASSERT_EQ(planted::wgmma_64xnx16(a, b, n, swizzle, mn, regs, planted::WgmmaMode::Correct, d), 0);
          const auto fs = findings();
          EXPECT_TRUE(fs.empty()) << dump(fs);
          const torch::Tensor got = torch::from_blob(d.data(), {64, n}).to(torch::kFloat64);
          EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
        }
  }
  const torch::Tensor A = torch::randn({64, 16}).to(torch::kBFloat16);
  const torch::Tensor B = torch::randn({16, 64}).to(torch::kBFloat16);
  std::vector<uint16_t> a(64 * 16), b(16 * 64);
  std::memcpy(a.data(), A.data_ptr(), a.size() * 2);
  std::memcpy(b.data(), B.data_ptr(), b.size() * 2);
  const torch::Tensor want = A.to(torch::kFloat64).matmul(B.to(torch::kFloat64));
  std::vector<float> d;
  ASSERT_EQ(planted::wgmma_64xnx16(a, b, 64, 128, true, false, planted::WgmmaMode::ReadBeforeWait, d), 0);
  const torch::Tensor early = torch::from_blob(d.data(), {64, 64}).to(torch::kFloat64);
  EXPECT_GT((early - want).abs().max().item<double>(), 0.5) << "D read before the wait was the product";
  planted::wgmma_64xnx16(a, b, 64, 128, true, false, planted::WgmmaMode::NeverWait, d);
  const auto fs = findings();
  EXPECT_TRUE(has(fs, ape::simt::Check::Async, "wgmma operations never waited for")) << dump(fs);
}

// TMA: a box lands swizzled, rows past the tensor zero-filled, and completes its mbarrier's
// phase; a phase that never completes is a deadlock, reported.
TEST_F(Simt, TmaBoxesLandSwizzledAndMbarriersOrderThem) {
  const int T = 20;
  std::vector<uint16_t> src(static_cast<size_t>(T) * 64);
  for (size_t e = 0; e < src.size(); ++e) src[e] = static_cast<uint16_t>(e * 7 + 1);
  std::vector<uint16_t> out;
  ASSERT_EQ(planted::tma_box(src, T, 8, 16, true, out), 0);
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c) {
      const uint16_t want = 8 + r < T ? src[static_cast<size_t>((8 + r) * 64 + c)] : 0;
      ASSERT_EQ(out[static_cast<size_t>(r * 64 + c)], want) << "row " << r << " column " << c;
    }
  EXPECT_NE(planted::tma_box(src, T, 0, 8, false, out), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, ape::simt::Check::Synccheck, "waiting on an mbarrier")) << dump(fs);
}

// The race check of async copies (TMA, bulk copies): their bytes are read or overwritten only by
// a thread ordered after the phase of the mbarrier they complete on: by its own wait, or through a
// warp collective, a named barrier's round or another mbarrier whose arrivals were. A block
// barrier alone does not order them (the copy lands whenever its bytes arrive), nor does issuing
// a second copy into the same bytes before the first was waited for. A read after the reader's own
// release of the buffer (mode 8) is reported too: the arrival that completes the release hands
// over to the threads it woke, so the refill lands before that read (APE_SIMT_EAGER_WAKE=0 lets
// the reader go on first, and the read is not seen).
TEST_F(Simt, RacecheckOrdersAsyncCopiesByTheirMbarriers) {
  for (int mode = 0; mode < 9; ++mode) {
    std::vector<float> out;
    // Mode 7 with the hand-over: the refill's phase completes before warp 1 waits for the first
    // one, whose parity it then misses (a deadlock, as on a GPU); without it, the early release
    // is seen as the refill's write over bytes warp 1 was not yet ordered after.
    if (mode == 7) setenv("APE_SIMT_EAGER_WAKE", "0", 1);
    const int err = planted::async_order(mode, out);
    if (mode == 7) unsetenv("APE_SIMT_EAGER_WAKE");
    ASSERT_EQ(err, 0) << "mode " << mode;
    const auto fs = findings();
    if (mode == 8) {  // the read's value depends on the order: only the report is checked
      EXPECT_TRUE(has(fs, Check::Racecheck, "read-after-write race with the async proxy")) << dump(fs);
      continue;
    }
    if (mode == 1) {
      EXPECT_TRUE(has(fs, Check::Racecheck, "read-after-write race with the async proxy")) << dump(fs);
    } else if (mode == 4 || mode == 7) {
      EXPECT_TRUE(has(fs, Check::Racecheck, "write-after-write race between async copies")) << dump(fs);
    } else {
      EXPECT_TRUE(fs.empty()) << "mode " << mode << ": " << dump(fs);
    }
    for (int t = 0; t < 64; ++t) {
      const float copied = static_cast<float>(mode >= 4 ? 64 + t : t);
      const float early = mode >= 6 && t >= 32 ? static_cast<float>(t - 32) : 0.f;
      ASSERT_EQ(out[static_cast<size_t>(t)], copied + early) << "mode " << mode << " thread " << t;
    }
  }
}

// Named barriers: bar.sync waits for its round, bar.arrive does not; two groups alternate as
// FlashAttention-3's warpgroup scheduling makes them (the emulator alone would run group 0's
// rounds first: it resumes threads in order). A missing first arrival deadlocks, reported; a
// count that is not whole warps and a round left incomplete at the block's end are findings.
TEST_F(Simt, NamedBarriersAlternateTwoGroups) {
  std::vector<int> order;
  ape::simt::take_traffic();
  ASSERT_EQ(planted::named_barrier_turns(5, true, true, 256, order), 0);
  size_t rounds = 0;
  for (const auto &t : ape::simt::take_traffic()) {
    EXPECT_EQ(t.named_rounds[1], 5u);
    EXPECT_EQ(t.named_rounds[2], 5u);
    rounds += t.named_rounds[1] + t.named_rounds[2];
  }
  EXPECT_EQ(rounds, 10u) << "5 rounds of each barrier";
  auto fs = findings();
  EXPECT_TRUE(fs.empty()) << dump(fs);
  ASSERT_EQ(order.size(), 10u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(i % 2)) << "turn " << i;
  EXPECT_NE(planted::named_barrier_turns(3, false, true, 256, order), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "at a named barrier")) << dump(fs);
  planted::named_barrier_turns(1, true, true, 100, order);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "whole warps")) << dump(fs);
  ASSERT_EQ(planted::named_barrier_turns(2, true, false, 256, order), 0);
  fs = findings();
  EXPECT_TRUE(has(fs, Check::Synccheck, "a round never completed")) << dump(fs);
}

TEST_F(Simt, WmmaComputesAGemm) {
  torch::manual_seed(4);
  const torch::Tensor A = torch::randn({16, 16}).to(torch::kBFloat16);
  const torch::Tensor B = torch::randn({16, 16}).to(torch::kBFloat16);
  const torch::Tensor C = torch::randn({16, 16});
  std::vector<uint16_t> a(256), b(256);
  std::vector<float> c(256), d;
  std::memcpy(a.data(), A.data_ptr(), 512);
  std::memcpy(b.data(), B.data_ptr(), 512);
  std::memcpy(c.data(), C.data_ptr(), 1024);
  ASSERT_EQ(planted::wmma_16x16x16(a, b, c, d), 0);
  EXPECT_TRUE(findings().empty());
  const torch::Tensor want =
      A.to(torch::kFloat64).matmul(B.to(torch::kFloat64)) + C.to(torch::kFloat64);
  const torch::Tensor got = torch::from_blob(d.data(), {16, 16}).to(torch::kFloat64);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
}

// ---- conversions ------------------------------------------------------------------------------------
// Every class of input: zeros, normals, ties (exactly half an ulp), subnormals of both formats,
// overflow, infinities, NaN; against LibTorch's CPU conversions (round to nearest even).
std::vector<float> conversion_inputs() {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 70000.0f,
                           1e-8f, 6e-8f, 5.9604645e-08f, 2.9802322e-08f, 6.1035156e-05f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (uint32_t k = 0; k < 64; ++k) {  // ties and their neighbours at several exponents
    uint32_t base = (100u + 3u * k) << 23 | (k * 0x1234u & 0x7f0000u);
    for (uint32_t lowbits : {0x8000u, 0x7fffu, 0x8001u, 0x18000u, 0x1000u, 0x1fffu, 0x3000u}) {
      float f;
      uint32_t u = base | lowbits;
      std::memcpy(&f, &u, 4);
      xs.push_back(f);
      xs.push_back(-f);
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  for (int i = 0; i < 20000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isnan(f)) xs.push_back(f);
  }
  return xs;
}

// Not a check but a kernel of the project's that the full kernels' tests cannot reach: the token
// program's scan (Cable's cumulative sums) runs in rounds of blockDim x kTokItems tokens, 8,192
// with the launch's 1,024 threads, which only sequences longer than the emulated suite's see. With
// 32 and 64 threads the rounds' carries are exercised at a few hundred tokens: every prefix (and
// suffix, added to what dst held) against the serial sum in double, at partial warps, rounds and
// thread chunks.
TEST_F(Simt, TokenScanAddsEveryRoundsCarry) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.f, 2.f);
  for (int threads : {32, 64, 1024})
    for (int n : {1, 7, 255, 256, 257, 600, 2049, 5000})
      for (bool reverse : {false, true}) {
        std::vector<float> src(n), dst(n);
        for (auto &x : src) x = uni(rng);
        for (auto &x : dst) x = reverse ? uni(rng) : 0.f;
        const std::vector<float> before = dst;
        ASSERT_EQ(planted::token_scan(threads, reverse, src, dst), 0);
        EXPECT_TRUE(findings().empty());
        double acc = 0, mag = 0;
        for (int e = 0; e < n; ++e) {
          const int t = reverse ? n - 1 - e : e;
          acc += src[t], mag += std::fabs(src[t]);
          const float want = reverse ? before[t] + static_cast<float>(acc) : static_cast<float>(acc);
          ASSERT_NEAR(dst[t], want, 1e-6 * (mag + std::fabs(before[t])))
              << "threads " << threads << " n " << n << (reverse ? " reverse" : "") << " t " << t;
        }
      }
}

// A decode step's token program resumes its scans at the chunk (kTokChunk = 256 tokens) holding
// its first new token, from the carry the previous step left there (DevCtx::tok0, tok_carry): its
// sums equal those of one scan over all n tokens bit for bit, and the carry it leaves is the
// one-shot scan's at floor(n / 256) * 256. Lengths at and around chunks and rounds (256 tokens a
// round with 32 threads, 512 with 64, 8,192 with 1,024: the carry saved after a round's last
// chunk). A carry taken at another token than the resumed chunk's (a step that failed after its
// token program) makes the scan start again at token 0, with the same sums.
TEST_F(Simt, TokenScanResumesAtAChunkFromItsCarry) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(-1.f, 2.f);
  for (int threads : {32, 64, 1024})
    for (auto [n0, n] : {std::pair<int, int>{1, 2}, {255, 256}, {256, 257}, {300, 512}, {512, 513}, {511, 1024},
                         {700, 1500}, {1024, 1025}, {2047, 2049}, {8191, 8192}, {8192, 8193}, {5000, 16385}})
      for (bool stale : {false, true}) {
        const int64_t from = n0 / 256 * 256 - (stale ? 256 : 0);
        if (from < 0) continue;
        SCOPED_TRACE("threads " + std::to_string(threads) + ", " + std::to_string(n0) + " then " + std::to_string(n) +
                     (stale ? ", resumed a chunk before its carry" : ""));
        std::vector<float> src(n), once(n, 0.f), steps(n, 0.f);
        for (auto &x : src) x = uni(rng);
        double carry_once[2] = {0, 0};
        ASSERT_EQ(planted::token_scan_from(threads, src, once, 0, carry_once), 0);
        const std::vector<float> first(src.begin(), src.begin() + n0);
        std::vector<float> part(n0, 0.f);
        double carry[2] = {0, 0};
        ASSERT_EQ(planted::token_scan_from(threads, first, part, 0, carry), 0);
        ASSERT_EQ(carry[1], static_cast<double>(n0 / 256 * 256));
        std::copy(part.begin(), part.end(), steps.begin());
        for (int64_t t = from; t < n; ++t) steps[t] = -7.f;  // what the resumed scan must overwrite
        ASSERT_EQ(planted::token_scan_from(threads, src, steps, from, carry), 0);
        EXPECT_TRUE(findings().empty());
        for (int t = 0; t < n; ++t)
          ASSERT_EQ(std::memcmp(&steps[t], &once[t], 4), 0) << "t " << t << ": " << steps[t] << " vs " << once[t];
        EXPECT_EQ(std::memcmp(carry, carry_once, 16), 0) << carry[0] << " at " << carry[1] << " vs " << carry_once[0]
                                                          << " at " << carry_once[1];
      }
}

TEST_F(Simt, Bf16AndF16RoundLikeLibTorch) {
  const std::vector<float> xs = conversion_inputs();
  const torch::Tensor t = torch::tensor(xs);
  const torch::Tensor bf = t.to(torch::kBFloat16), hf = t.to(torch::kHalf);
  const uint16_t *bfp = static_cast<const uint16_t *>(bf.data_ptr());
  const uint16_t *hfp = static_cast<const uint16_t *>(hf.data_ptr());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(planted::to_bf16(xs[i]), bfp[i]) << "bf16 of " << xs[i];
    ASSERT_EQ(planted::to_f16(xs[i]), hfp[i]) << "f16 of " << xs[i];
    const float back = planted::from_f16(hfp[i]);
    const float want = hf.to(torch::kFloat32)[static_cast<int64_t>(i)].item<float>();
    ASSERT_TRUE(back == want || (std::isnan(back) && std::isnan(want))) << "f16 -> f32 of " << hfp[i];
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(bf16_value(planted::to_bf16(nan))));
  EXPECT_TRUE(std::isnan(planted::from_f16(planted::to_f16(nan))));
  EXPECT_EQ(planted::to_bf16(1.0f), bf16_bits(1.0f));
}

}  // namespace
