// Small CUDA kernels for the emulator's own tests (simt_checks_test.cpp): correct ones, and the
// same with a planted bug each check must catch. The kernels live in simt_planted_kernels.cpp,
// compiled as emulated CUDA (ape_simt_kernel_flags); this header is plain C++ so the test itself
// is compiled normally. Every function launches one kernel and returns the launch's error code
// (0 = cudaSuccess); device buffers are allocated and freed inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace planted {

// Block of `threads`: each thread writes smem[t] = t, then reads smem[(t + 1) % threads] into
// out[t]. With `sync`, a __syncthreads separates the two; without, racecheck must fire.
int neighbour_exchange(int threads, bool sync, std::vector<int> &out);
int neighbour_exchange_named(int threads, int mode, std::vector<int> &out);
// A bulk copy into shared memory read by 64 threads, ordered by `mode`: 0 every thread waits on
// its mbarrier; 1 warp 1 passes a block barrier but never waits (a race); 2 lane 0 of each warp
// waits, then __syncwarp; 3 warp 0 waits and bar.arrives where warp 1 bar.syncs; 4 a second copy
// into the same bytes issued before its thread waited for the first (a race); 5 the same after
// the wait; 6 warp 1 reads and releases the buffer by a second mbarrier, which the refilling
// thread waits for; 7 warp 1 releases it before its wait and read (a race, seen as the refill
// not ordered after the first copy). out[t]: what thread t read.
int async_order(int mode, std::vector<float> &out);
// Each thread reads smem[t] and then writes smem[(t + 1) % threads] without a barrier in between:
// a write-after-read race.
int read_then_overwrite(int threads);
// A tile copy of n floats by blocks of 64 threads; `off_by_one`: the partial last tile reads one
// element past the end (the classic `<=` bound).
int tile_copy(int n, bool off_by_one, std::vector<float> &out);
// One thread writes one float past the block's dynamic shared memory.
int shared_overflow();
// A block reverses 64 floats through static shared memory (APE_STATIC_SMEM) next to 32 bytes
// of dynamic shared memory; `overflow`: one thread writes one float past the static array.
int static_shared_reverse(bool overflow, std::vector<float> &out);
// Reads shared memory that nothing wrote.
int uninitialised_shared_read();
// Reads a device buffer after cudaFree.
int use_after_free();
// cudaMemcpy2DAsync: `host` (7 rows of 40 bytes) uploaded, its rows 1..5, bytes 3..26, copied to
// rows 0..4 of a buffer of 5 rows of 64 bytes filled with 0xEE, at byte 8, read back into `back`;
// `codes`: the errors of a copy with a destination pitch below the width, one with a source pitch
// below it, and one whose rows run past the source's allocation.
int memcpy_2d(std::vector<unsigned char> &host, std::vector<unsigned char> &back, std::vector<int> &codes);
// cuda/decode.h's copy_rows: rows [0, 3) of S slices of 5 rows (W 12 bytes) to rows [2, 5) of
// slices of 7 rows (0xEE elsewhere); max_pitch below the pitches takes its copy per slice.
int decode_copy_rows(int64_t S, size_t max_pitch, std::vector<unsigned char> &src,
                     std::vector<unsigned char> &dst);
// Threads < 64 wait at one __syncthreads, the others at another.
int divergent_barriers();
// Lane 5 returns early; the others shuffle with the full mask (which can never complete).
int shuffle_with_exited_lane();
// Threads of warp 0 wait at __syncthreads while warp 1 waits in a shuffle that lane 0 of warp 1
// never reaches: a deadlock.
int deadlock();
// Atomic adds of every thread to one shared counter (no race), then, with `plain_read`, a plain
// read of it by another thread before the barrier (a race).
int shared_atomics(bool plain_read, int &total);
// `threads` threads: each reads 16 bytes of a device buffer (ld.global.cg), writes one float
// and adds 1 to a float counter atomically: the traffic counts (ape::simt::take_traffic) must
// say 16·threads bytes read by 16-byte accesses, 4·threads written and 4·threads atomic.
int traffic(int threads, float &counter);
// cp.async of a 16-byte chunk per thread into shared memory, read back after commit + wait +
// __syncthreads (`wait`), or read before any wait (a finding), or never waited for (a finding);
// src_bytes < 16 zero-fills the rest.
enum class AsyncMode { Correct, ReadBeforeWait, NeverWait };
int async_copy(AsyncMode mode, int src_bytes, std::vector<float> &out);
// A kernel with `bytes` of dynamic shared memory, with or without cudaFuncSetAttribute first.
int big_shared(int bytes, bool set_attribute);
// cudaOccupancyMaxActiveBlocksPerMultiprocessor of that kernel at `threads` and `bytes` (the
// attribute set to `bytes` first where it exceeds 48 KiB and the architecture allows it).
int big_shared_occupancy(int threads, int bytes, int &blocks);
// Host code (in an instrumented translation unit) reads device memory.
int host_reads_device();

// ---- PTX layouts ------------------------------------------------------------------------------------
// ldmatrix.x4 (optionally .trans) of four 8x8 bf16 matrices m[4][8][8] (row major): each lane's
// four registers, regs[lane * 4 + m].
int ldmatrix_x4(const std::vector<uint16_t> &m, bool trans, std::vector<uint32_t> &regs);
// stmatrix.x4 of regs (4 per lane) into four 8 x 8 matrices, read back into m (256 elements);
// misalign_lane >= 0: that lane gives a row address 8 bytes off its row.
int stmatrix_x4(const std::vector<uint32_t> &regs, bool trans, std::vector<uint16_t> &m,
                int misalign_lane = -1);
// D(16 x 8) = A(16 x 16) B(16 x 8) + C with one mma.m16n8k16 (bf16 in, f32 out), each lane
// filling its fragments from row-major A, B, C by the PTX formulas. `wrong_lanes`: the kernel
// swaps the roles of groupID and threadID_in_group in A (a lane-mapping bug).
int mma_16x8x16(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
                const std::vector<float> &c, bool wrong_lanes, std::vector<float> &d);
// D(64 x n) = A(64 x 16) B(16 x n) with one wgmma.m64nNk16 by a warpgroup (bf16 in, f32 out; n =
// 64 or 128), A and B row-major on the host. B is stored in shared memory K-major ([n][k]) or
// MN-major ([k][n]), both with a `swizzle`-byte swizzle (0: none, 32, 64, 128), by per-element
// stores at the canonical layouts' offsets (written out here in CUTLASS's form of them); A from a
// K-major tile with the same swizzle (`a_regs` false) or from each warp's m16n8k16 A fragment.
// Planted bugs: the accumulators read before the wait (D is not yet written), or no wait at all.
enum class WgmmaMode { Correct, ReadBeforeWait, NeverWait };
int wgmma_64xnx16(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b, int n,
                  int swizzle, bool b_mn_major, bool a_regs, WgmmaMode mode, std::vector<float> &d);
// A TMA box of `rows` x 64 bf16 elements with a 128-byte swizzle from rows [row0, row0 + rows)
// of a (T, 64) matrix (rows >= T zero-filled), completed on an mbarrier that every thread of the
// block waits on, then read back element by element through the swizzle (row r, chunk c at
// r 128 + ((c ^ r % 8) 16)). `arrive`: the barrier's one expected arrival comes (with the
// transaction bytes); without it every thread waits forever (a deadlock finding).
int tma_box(const std::vector<uint16_t> &src, int T, int row0, int rows, bool arrive,
            std::vector<uint16_t> &out);
// Two groups of 128 threads take turns by named barriers, as FlashAttention-3's consumer
// warpgroups do: group c waits on barrier 1 + c (bar.sync, 256), appends c to `order` (its
// thread 0, by a global atomic index), and lets the other group go (bar.arrive 1 + (1 - c), 256);
// group 0 starts by an arrival on its own barrier, group 1's last round hands on nothing
// (`balanced` false: it does, and the block ends with a round incomplete, a finding). `start`: without that arrival every thread
// waits forever (a deadlock finding). `count`: the barriers' thread count (256; another value
// that is not whole warps is a synccheck finding).
int named_barrier_turns(int rounds, bool start, bool balanced, int count, std::vector<int> &order);
// A 16x16x16 bf16 GEMM (row-major A, B; f32 C) through nvcuda::wmma.
int wmma_16x16x16(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
                  const std::vector<float> &c, std::vector<float> &d);
// bf16 / f16 conversions of the emulator: bits of x rounded to nearest even.
// The token program's block scan (ape::cuda::detail::tok_block_scan) by one block of `threads`:
// dst[t] = sum_{u <= t} src[u], or with `reverse` dst[t] += sum_{u >= t} src[u] (dst in and out).
int token_scan(int threads, bool reverse, const std::vector<float> &src, std::vector<float> &dst);
// The forward scan from chunk `from` (a multiple of kTokChunk) with {the carry, its token}
// (tok_block_scan's carry_io: from 0 where the token is not `from`); carry becomes {the carry at
// s, s}, s = floor(n / kTokChunk) * kTokChunk.
int token_scan_from(int threads, const std::vector<float> &src, std::vector<float> &dst, int64_t from,
                    double (&carry)[2]);
uint16_t to_bf16(float x);
uint16_t to_f16(float x);
float from_f16(uint16_t h);

}  // namespace planted
