// Tensor-core and asynchronous-copy operations of the SIMT emulator, with each lane's registers
// laid out as the PTX ISA documents them (so that a kernel that maps lanes wrongly computes
// wrong numbers here as it would on a GPU):
//
// mma.m16n8k16 (.row.col, f16/bf16 inputs, f32 accumulators), with g = lane / 4, t = lane % 4:
//   A (16 x 16), 4 registers of 2 elements a0..a7: row g (a0, a1, a4, a5) or g + 8 (a2, a3, a6,
//     a7), column 2t + (i & 1) (+ 8 for a4..a7);
//   B (16 x 8), 2 registers b0..b3: row (k) 2t + (i & 1) (+ 8 for b2, b3), column (n) g;
//   C, D (16 x 8), c0..c3: row g (c0, c1) or g + 8 (c2, c3), column 2t + (i & 1).
// ldmatrix.m8n8.x{1,2,4}.b16: lanes 8m..8m+7 give the row addresses of matrix m; lane l receives
//   in register m the elements (l / 4, 2(l % 4)) and (l / 4, 2(l % 4) + 1) of matrix m; with
//   .trans, the elements (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4).
// The element of lower index sits in the lower 16 bits of a register.
// Accumulation: each product of two 16-bit values is exact in f32; D = C + sum_k a_k b_k is
// summed in f32 in k order (the hardware's order and intermediate rounding are unspecified).
//
// WMMA m16n16k16 (the layout of its sm_80 implementation, see ape/simt/cuda.h) uses the same maps:
// matrix_a one mma A fragment, matrix_b and accumulators two mma fragments (n 0-7, then 8-15).
//
// wgmma.m64nNk16 (sm_90a): warp w % 4 of a warpgroup holds rows 16 (w % 4) .. + 15 of A (register
//   form: an m16n8k16 A fragment) and D (d[4 j + x]: C/D element x of n8 tile j); shared-memory
//   operands through matrix descriptors (ape/cuda/platform.cuh states the canonical layouts).
// cp.async: a copy is recorded when issued and lands when a cp.async.wait_group lets it, i.e. as
// late as the program allows; until then its destination bytes are marked, and touching them is
// a finding.
#include "Internal.h"

#include <sstream>

namespace ape::simt::detail {

namespace {

float elem_to_f32(int elem, const void *p, int index) {
  switch (elem) {
  case 0: return static_cast<const float *>(p)[index];
  case 1: return f16_to_f32(static_cast<const uint16_t *>(p)[index]);
  default: return bf16_to_f32(static_cast<const uint16_t *>(p)[index]);
  }
}
size_t elem_bytes(int elem) { return elem == 0 ? 4 : 2; }

// mma.m16n8k16 fragment coordinates.
struct RC {
  int r, c;
};
RC a_coord(unsigned lane, int i) {  // A: element i of 8
  const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
  return {g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)};
}
RC b_coord(unsigned lane, int i) {  // B: element i of 4, (k, n)
  const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
  return {2 * t + (i & 1) + 8 * (i >> 1), g};
}
RC c_coord(unsigned lane, int i) {  // C/D: element i of 4
  const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
  return {g + 8 * (i >> 1), 2 * t + (i & 1)};
}

// d(16, 8) = c + a(16, 16) b(16, 8), f32, k in order.
void mma_16x8x16(const float (&a)[16][16], const float (&b)[16][8], const float (&c)[16][8],
                 float (&d)[16][8]) {
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      float acc = c[r][n];
      for (int k = 0; k < 16; ++k) acc += a[r][k] * b[k][n];
      d[r][n] = acc;
    }
}

// ---- WMMA m16n16k16 ----------------------------------------------------------------------------
struct WmmaArg {
  int use, elem;  // use: 0 matrix_a, 1 matrix_b, 2 accumulator
  bool col_major;
  void *frag;
  const void *ptr;
  unsigned ld;
};

// (row, column) of element e of a fragment (`use`) held by `lane`.
RC wmma_coord(int use, unsigned lane, int e) {
  if (use == 0) return a_coord(lane, e % 8);
  const int half = (e % 8) / 4;
  if (use == 1) {
    RC k = b_coord(lane, e % 4);
    return {k.r, k.c + 8 * half};
  }
  RC c = c_coord(lane, e % 4);
  return {c.r, c.c + 8 * half};
}

int wmma_elements(int use, int elem) { return use == 2 ? 8 : (elem == 1 ? 16 : 8); }

bool uniform_args(unsigned mask, void *const *args, const char *what) {
  const WmmaArg *first = nullptr;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    const auto *a = static_cast<const WmmaArg *>(args[lane]);
    if (!first) {
      first = a;
      continue;
    }
    if (a->ptr != first->ptr || a->ld != first->ld || a->col_major != first->col_major) {
      std::ostringstream os;
      os << what << ": lanes pass different pointers, leading dimensions or layouts (lane "
         << lane << ")";
      report(Check::Synccheck, os.str());
      return false;
    }
  }
  if (mask != 0xffffffffu) {
    report(Check::Synccheck, std::string(what) + " needs all 32 lanes of the warp");
    return false;
  }
  return true;
}

}  // namespace

}  // namespace ape::simt::detail

namespace ape::simt {

using namespace detail;

void wmma_load(int use, int elem, bool col_major, void *frag, const void *ptr, unsigned ld) {
  WmmaArg arg{use, elem, col_major, frag, ptr, ld};
  collective(kWmmaLoad, 0xffffffffu, &arg, [](Warp &w, unsigned mask, void *const *args) {
    if (!uniform_args(mask, args, "wmma::load_matrix_sync")) return;
    Thread *runner = tl_worker.thread;
    for (unsigned lane = 0; lane < 32; ++lane) {
      auto *a = static_cast<WmmaArg *>(args[lane]);
      const int n = wmma_elements(a->use, a->elem);
      tl_worker.thread = w.lanes[lane];  // the lane that receives an element reads it
      for (int e = 0; e < n; ++e) {
        const RC rc = wmma_coord(a->use, lane, e);
        const size_t index = a->col_major ? size_t(rc.c) * a->ld + rc.r : size_t(rc.r) * a->ld + rc.c;
        const char *src = static_cast<const char *>(a->ptr) + index * elem_bytes(a->elem);
        check_access(src, elem_bytes(a->elem), Access::Read, nullptr);
        std::memcpy(static_cast<char *>(a->frag) + e * elem_bytes(a->elem), src,
                    elem_bytes(a->elem));
      }
    }
    tl_worker.thread = runner;
  }, Site{__builtin_return_address(0)});
}

void wmma_store(float *ptr, const float *frag, unsigned ld, bool col_major) {
  WmmaArg arg{2, 0, col_major, const_cast<float *>(frag), ptr, ld};
  collective(kWmmaStore, 0xffffffffu, &arg, [](Warp &w, unsigned mask, void *const *args) {
    if (!uniform_args(mask, args, "wmma::store_matrix_sync")) return;
    Thread *runner = tl_worker.thread;
    for (unsigned lane = 0; lane < 32; ++lane) {
      auto *a = static_cast<WmmaArg *>(args[lane]);
      tl_worker.thread = w.lanes[lane];
      for (int e = 0; e < 8; ++e) {
        const RC rc = wmma_coord(2, lane, e);
        const size_t index = a->col_major ? size_t(rc.c) * a->ld + rc.r : size_t(rc.r) * a->ld + rc.c;
        float *dst = const_cast<float *>(static_cast<const float *>(a->ptr)) + index;
        check_access(dst, 4, Access::Write, nullptr);
        *dst = static_cast<const float *>(a->frag)[e];
      }
    }
    tl_worker.thread = runner;
  }, Site{__builtin_return_address(0)});
}

namespace {
struct WmmaMmaArg {
  int elem;
  float *d;
  const void *a, *b;
  const float *c;
};
}  // namespace

void wmma_mma(int elem, float *d, const void *a, const void *b, const float *c) {
  WmmaMmaArg arg{elem, d, a, b, c};
  collective(kWmmaMma, 0xffffffffu, &arg, [](Warp &, unsigned mask, void *const *args) {
    if (mask != 0xffffffffu) return report(Check::Synccheck, "wmma::mma_sync needs all 32 lanes");
    count_mma(2 * 16 * 16 * 16);
    float A[16][16], B[16][16], C[16][16];
    for (unsigned lane = 0; lane < 32; ++lane) {
      auto *x = static_cast<WmmaMmaArg *>(args[lane]);
      for (int e = 0; e < 8; ++e) {
        RC ra = wmma_coord(0, lane, e), rb = wmma_coord(1, lane, e), rc = wmma_coord(2, lane, e);
        A[ra.r][ra.c] = elem_to_f32(x->elem, x->a, e);
        B[rb.r][rb.c] = elem_to_f32(x->elem, x->b, e);
        C[rc.r][rc.c] = x->c[e];
      }
    }
    float D[16][16];
    for (int half = 0; half < 2; ++half) {
      float b8[16][8], c8[16][8], d8[16][8];
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) b8[r][n] = B[r][n + 8 * half], c8[r][n] = C[r][n + 8 * half];
      mma_16x8x16(A, b8, c8, d8);
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) D[r][n + 8 * half] = d8[r][n];
    }
    for (unsigned lane = 0; lane < 32; ++lane) {
      auto *x = static_cast<WmmaMmaArg *>(args[lane]);
      for (int e = 0; e < 8; ++e) {
        RC rc = wmma_coord(2, lane, e);
        x->d[e] = D[rc.r][rc.c];
      }
    }
  }, Site{__builtin_return_address(0)});
}

// ---- mma.sync m16n8k16 ----------------------------------------------------------------------------
namespace {
struct MmaArg {
  int elem;
  float *d;
  const uint32_t *a, *b;
  const float *c;
};
}  // namespace

void mma_m16n8k16(int elem, float *d, const uint32_t *a, const uint32_t *b, const float *c) {
  MmaArg arg{elem, d, a, b, c};
  collective(kMma, 0xffffffffu, &arg, [](Warp &, unsigned mask, void *const *args) {
    if (mask != 0xffffffffu) return report(Check::Synccheck, "mma.sync needs all 32 lanes");
    count_mma(2 * 16 * 8 * 16);
    float A[16][16], B[16][8], C[16][8], D[16][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
      auto *x = static_cast<MmaArg *>(args[lane]);
      for (int i = 0; i < 8; ++i) {
        const RC rc = a_coord(lane, i);
        A[rc.r][rc.c] = elem_to_f32(x->elem, x->a, i);  // register i/2, half i%2
      }
      for (int i = 0; i < 4; ++i) {
        const RC kn = b_coord(lane, i);
        B[kn.r][kn.c] = elem_to_f32(x->elem, x->b, i);
        const RC rc = c_coord(lane, i);
        C[rc.r][rc.c] = x->c[i];
      }
    }
    mma_16x8x16(A, B, C, D);
    for (unsigned lane = 0; lane < 32; ++lane) {
      auto *x = static_cast<MmaArg *>(args[lane]);
      for (int i = 0; i < 4; ++i) {
        const RC rc = c_coord(lane, i);
        x->d[i] = D[rc.r][rc.c];
      }
    }
  }, Site{__builtin_return_address(0)});
}

// ---- ldmatrix, stmatrix -----------------------------------------------------------------------------
// `count` 8 x 8 matrices of 16-bit elements between shared memory and a warp's registers: lane
// 8 mat + r gives the address of row r of matrix mat (16 bytes, 16-byte aligned), and lane l's
// register mat holds elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix mat, in its
// low and high halves (.trans: the elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)).
namespace {
struct MatrixArg {
  int count;
  bool trans;
  uint32_t *regs;
  void *row;
};
using Matrices = uint16_t[4][8][8];

// Every lane present and asking for the same shape; else a finding.
bool matrix_shapes(const char *op, unsigned mask, void *const *args) {
  if (mask != 0xffffffffu) {
    report(Check::Synccheck, std::string(op) + " needs all 32 lanes");
    return false;
  }
  const auto *first = static_cast<MatrixArg *>(args[0]);
  for (unsigned lane = 1; lane < 32; ++lane) {
    const auto *x = static_cast<MatrixArg *>(args[lane]);
    if (x->count != first->count || x->trans != first->trans) {
      report(Check::Synccheck, std::string(op) + ": lanes give different shapes");
      return false;
    }
  }
  return true;
}

// Each matrix row between shared memory and m, accessed as the lane that gives its address.
void matrix_rows(const char *op, Warp &w, void *const *args, Matrices &m, bool store) {
  const int count = static_cast<MatrixArg *>(args[0])->count;
  Thread *runner = tl_worker.thread;
  for (int mat = 0; mat < count; ++mat)
    for (int r = 0; r < 8; ++r) {
      const unsigned lane = static_cast<unsigned>(8 * mat + r);
      char *row = static_cast<char *>(static_cast<MatrixArg *>(args[lane])->row);
      tl_worker.thread = w.lanes[lane];
      if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
        std::ostringstream os;
        os << op << ": lane " << lane << " gives a row address that is not 16-byte aligned";
        report(Check::Memcheck, os.str());
      }
      check_access(row, 16, store ? Access::Write : Access::Read, nullptr);
      if (store) std::memcpy(row, m[mat][r], 16);
      else std::memcpy(m[mat][r], row, 16);
    }
  tl_worker.thread = runner;
}

// Element e (0: low half, 1: high) of lane's register mat.
uint16_t &matrix_elem(Matrices &m, int mat, unsigned lane, int e, bool trans) {
  const int r = static_cast<int>(lane / 4), c = 2 * static_cast<int>(lane % 4) + e;
  return trans ? m[mat][c][r] : m[mat][r][c];
}
}  // namespace

void ldmatrix(int count, bool trans, uint32_t *regs, const void *row_addr) {
  MatrixArg arg{count, trans, regs, const_cast<void *>(row_addr)};
  collective(kLdmatrix, 0xffffffffu, &arg, [](Warp &w, unsigned mask, void *const *args) {
    if (!matrix_shapes("ldmatrix", mask, args)) return;
    const auto *a0 = static_cast<MatrixArg *>(args[0]);
    Matrices m;
    matrix_rows("ldmatrix", w, args, m, false);
    for (unsigned lane = 0; lane < 32; ++lane)
      for (int mat = 0; mat < a0->count; ++mat)
        static_cast<MatrixArg *>(args[lane])->regs[mat] =
            static_cast<uint32_t>(matrix_elem(m, mat, lane, 0, a0->trans)) |
            static_cast<uint32_t>(matrix_elem(m, mat, lane, 1, a0->trans)) << 16;
  }, Site{__builtin_return_address(0)});
}

void stmatrix(int count, bool trans, const uint32_t *regs, void *row_addr) {
  MatrixArg arg{count, trans, const_cast<uint32_t *>(regs), row_addr};
  collective(kStmatrix, 0xffffffffu, &arg, [](Warp &w, unsigned mask, void *const *args) {
    if (!matrix_shapes("stmatrix", mask, args)) return;
    if (arch() < 90) {  // the instruction does not exist before sm_90: an illegal instruction there
      std::ostringstream os;
      os << "stmatrix needs sm_90 or later; the emulator poses as sm_" << arch();
      return report(Check::Launch, os.str());
    }
    const auto *a0 = static_cast<MatrixArg *>(args[0]);
    Matrices m;
    for (unsigned lane = 0; lane < 32; ++lane)
      for (int mat = 0; mat < a0->count; ++mat) {
        const uint32_t v = static_cast<MatrixArg *>(args[lane])->regs[mat];
        matrix_elem(m, mat, lane, 0, a0->trans) = static_cast<uint16_t>(v);
        matrix_elem(m, mat, lane, 1, a0->trans) = static_cast<uint16_t>(v >> 16);
      }
    matrix_rows("stmatrix", w, args, m, true);
  }, Site{__builtin_return_address(0)});
}

// ---- 16-byte global accesses ------------------------------------------------------------------------
void global_load16(void *dst, const void *src) {
  check_access(src, 16, Access::Read, __builtin_return_address(0));
  std::memcpy(dst, src, 16);
}
void global_store16(void *dst, const void *src) {
  check_access(dst, 16, Access::Write, __builtin_return_address(0));
  std::memcpy(dst, src, 16);
}

// ---- cp.async ---------------------------------------------------------------------------------------
void cp_async(void *smem_dst, const void *gmem_src, int bytes, int src_bytes) {
  Thread *t = self();
  const void *pc = __builtin_return_address(0);
  if (!t) {
    report(Check::Async, "cp.async from host code", pc);
    return;
  }
  Block &b = *tl_worker.block;
  char *dst = static_cast<char *>(smem_dst);
  if ((bytes != 4 && bytes != 8 && bytes != 16) || src_bytes < 0 || src_bytes > bytes ||
      reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(gmem_src) % bytes) {
    std::ostringstream os;
    os << "cp.async of " << bytes << " bytes (" << src_bytes << " from the source) needs 4, 8 or "
       << "16 bytes aligned to their size";
    report(Check::Memcheck, os.str(), pc);
    return;
  }
  if (dst < b.window || dst + bytes > b.window + b.window_bytes) {
    report(Check::Memcheck, "cp.async destination is not in the block's shared memory", pc);
    return;
  }
  // The destination must be shared memory; it stays untouchable until the copy lands.
  for (int i = 0; i < bytes; ++i) {
    uint8_t &f = b.flags[dst - b.window + i];
    if (!(f & kAddressable)) {
      report(Check::Memcheck, "cp.async destination outside the block's shared memory", pc);
      return;
    }
    if (f & kPending) {
      report(Check::Async, "cp.async to bytes another cp.async has not yet written", pc);
      return;
    }
  }
  for (int i = 0; i < bytes; ++i) b.flags[dst - b.window + i] |= kPending;
  t->uncommitted.push_back({dst, static_cast<const char *>(gmem_src), bytes, src_bytes});
}

void cp_async_commit() {
  Thread *t = self();
  if (!t) return;
  t->groups.push_back(std::move(t->uncommitted));
  t->uncommitted.clear();
}

void cp_async_wait(int pending_groups) {
  Thread *t = self();
  if (!t) return;
  Block &b = *tl_worker.block;
  while (static_cast<int>(t->groups.size()) > pending_groups) {
    for (const AsyncCopy &c : t->groups.front()) {
      for (int i = 0; i < c.bytes; ++i)
        b.flags[c.dst - b.window + i] &= static_cast<uint8_t>(~kPending);
      tl_async_copy = true;
      if (c.src_bytes > 0) check_access(c.src, static_cast<size_t>(c.src_bytes), Access::Read, nullptr);
      tl_async_copy = false;
      check_access(c.dst, static_cast<size_t>(c.bytes), Access::Write, nullptr);
      std::memcpy(c.dst, c.src, static_cast<size_t>(c.src_bytes));
      std::memset(c.dst + c.src_bytes, 0, static_cast<size_t>(c.bytes - c.src_bytes));
    }
    t->groups.pop_front();
  }
}

// ---- wgmma (sm_90a) ---------------------------------------------------------------------------------
// Each warp computes its own 16 rows of a warpgroup's product (the rows of A and D it holds), so
// the instruction is emulated as a warp collective per warp. An issued product is recorded and
// computed when a wgmma.wait_group lets its group complete: shared memory and D are read then, as
// late as the program allows, so a kernel that overwrites an operand tile or reads D before the
// wait computes wrong numbers here, as it may on a GPU.
namespace {
struct WgmmaArg {
  int elem, n;
  float *d;
  const uint32_t *a;
  uint64_t a_desc, b_desc;
  bool scale_d, trans_b, trans_a;
};

// The byte offset, from the block's dynamic shared memory, of element (x, k) of an operand given
// by a descriptor: x its row (A: m, B: n), k in [0, 16); `mn_major`: contiguous along x. The
// canonical layouts of ape/cuda/platform.cuh (PTX ISA, "Shared Memory Matrix Layout").
bool desc_offset(uint64_t desc, bool mn_major, int x, int k, uint32_t &off) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  const unsigned base = static_cast<unsigned>((desc >> 49) & 7), mode = static_cast<unsigned>(desc >> 62);
  if (base != 0) return false;  // the matrix base offset: not used by the kernels
  const uint32_t W = mode == 1 ? 8 : mode == 2 ? 4 : mode == 3 ? 2 : 1;  // 16-byte units per row
  const uint32_t ux = static_cast<uint32_t>(x), uk = static_cast<uint32_t>(k);
  uint32_t o;
  if (!mn_major)
    o = mode == 0 ? (ux % 8) * 16 + (ux / 8) * sbo + (uk % 8) * 2 + (uk / 8) * lbo
                  : (ux % 8) * 16 * W + (ux / 8) * sbo + uk * 2;
  else
    o = mode == 0 ? (ux % 8) * 2 + (ux / 8) * sbo + (uk % 8) * 16 + (uk / 8) * lbo
                  : (ux % (8 * W)) * 2 + (ux / (8 * W)) * lbo + (uk % 8) * 16 * W + (uk / 8) * sbo;
  uint32_t addr = start + o;
  if (mode != 0) addr ^= ((addr >> 7) & (W - 1)) << 4;
  off = addr;
  return true;
}

void wgmma_run(Warp &w, const WgmmaOp &op) {
  Block &b = *tl_worker.block;
  const int wi = static_cast<int>(w.index % 4);  // the warp's rows: 16 wi .. 16 wi + 15
  auto read = [&](uint64_t desc, bool mn_major, int x, int k, float &v) {
    uint32_t off;
    if (!desc_offset(desc, mn_major, x, k, off)) {
      report(Check::Memcheck, "wgmma descriptor with a matrix base offset (unsupported)");
      return false;
    }
    const char *p = b.smem + off;
    if (p < b.smem || p + 2 > b.window + b.window_bytes - kSmemRedzone) {
      std::ostringstream os;
      os << "wgmma reads shared memory at offset " << off << ", outside the block's";
      report(Check::Memcheck, os.str());
      return false;
    }
    check_access(p, 2, Access::Read, nullptr);
    v = elem_to_f32(op.elem, p, 0);
    return true;
  };
  float A[16][16];
  if (op.a_regs) {
    for (unsigned lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 8; ++i) {
        const RC rc = a_coord(lane, i);
        A[rc.r][rc.c] = elem_to_f32(op.elem, op.a[lane], i);
      }
  } else {
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k)
        if (!read(op.a_desc, op.trans_a, 16 * wi + r, k, A[r][k])) return;
  }
  std::vector<float> B(static_cast<size_t>(16 * op.n));
  for (int k = 0; k < 16; ++k)
    for (int x = 0; x < op.n; ++x)
      if (!read(op.b_desc, op.trans_b, x, k, B[static_cast<size_t>(k * op.n + x)])) return;
  for (unsigned lane = 0; lane < 32; ++lane) {
    const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
    for (int i = 0; i < op.n / 2; ++i) {
      const int r = g + 8 * ((i % 4) / 2), c = 8 * (i / 4) + 2 * t + i % 2;
      float acc = op.scale_d ? op.d[lane][i] : 0.f;
      for (int k = 0; k < 16; ++k) acc += A[r][k] * B[static_cast<size_t>(k * op.n + c)];
      op.d[lane][i] = acc;
    }
  }
}
}  // namespace

void wgmma(int elem, int n, float *d, const uint32_t *a, uint64_t a_desc, uint64_t b_desc,
           bool scale_d, bool trans_b, bool trans_a) {
  WgmmaArg arg{elem, n, d, a, a_desc, b_desc, scale_d, trans_b, trans_a};
  collective(kWgmma, 0xffffffffu, &arg, [](Warp &w, unsigned mask, void *const *args) {
    if (mask != 0xffffffffu) return report(Check::Synccheck, "wgmma needs all 32 lanes");
    const auto *x0 = static_cast<WgmmaArg *>(args[0]);
    WgmmaOp op;
    op.elem = x0->elem, op.n = x0->n, op.a_regs = x0->a != nullptr, op.scale_d = x0->scale_d;
    op.trans_b = x0->trans_b, op.trans_a = x0->trans_a, op.a_desc = x0->a_desc, op.b_desc = x0->b_desc;
    for (unsigned lane = 0; lane < 32; ++lane) {
      const auto *x = static_cast<WgmmaArg *>(args[lane]);
      if (x->elem != op.elem || x->n != op.n || (x->a != nullptr) != op.a_regs ||
          x->scale_d != op.scale_d || x->trans_b != op.trans_b || x->trans_a != op.trans_a || x->b_desc != op.b_desc ||
          (!op.a_regs && x->a_desc != op.a_desc))
        return report(Check::Synccheck, "wgmma: lanes give different shapes or descriptors");
      op.d[lane] = x->d;
      if (op.a_regs) std::memcpy(op.a[lane], x->a, sizeof op.a[lane]);
    }
    count_mma(size_t(2) * 16 * op.n * 16);  // this warp's 16 of the 64 rows
    w.wgmma_open.push_back(op);
  }, Site{__builtin_return_address(0)});
}

void wgmma_fence() {
  collective(kWgmmaFence, 0xffffffffu, nullptr, [](Warp &, unsigned mask, void *const *) {
    if (mask != 0xffffffffu) report(Check::Synccheck, "wgmma.fence needs all 32 lanes");
  }, Site{__builtin_return_address(0)});
}

void wgmma_commit() {
  collective(kWgmmaCommit, 0xffffffffu, nullptr, [](Warp &w, unsigned mask, void *const *) {
    if (mask != 0xffffffffu) return report(Check::Synccheck, "wgmma.commit_group needs all 32 lanes");
    w.wgmma_groups.push_back(std::move(w.wgmma_open));
    w.wgmma_open.clear();
  }, Site{__builtin_return_address(0)});
}

void wgmma_wait(int pending_groups) {
  int arg = pending_groups;
  collective(kWgmmaWait, 0xffffffffu, &arg, [](Warp &w, unsigned mask, void *const *args) {
    if (mask != 0xffffffffu) return report(Check::Synccheck, "wgmma.wait_group needs all 32 lanes");
    const int n = *static_cast<int *>(args[0]);
    while (static_cast<int>(w.wgmma_groups.size()) > n) {
      for (const WgmmaOp &op : w.wgmma_groups.front()) wgmma_run(w, op);
      w.wgmma_groups.pop_front();
    }
  }, Site{__builtin_return_address(0)});
}

// The emulator's shared memory has one proxy: the fence orders nothing more than program order.
void fence_proxy_async() {}

// ---- mbarriers, TMA, bulk copies (sm_90) -----------------------------------------------------------
namespace {
Mbar *find_mbar(Block &b, const void *bar) {
  for (auto &[key, m] : b.mbars)
    if (key == bar) return &m;
  return nullptr;
}
bool in_shared(const Block &b, const void *p, size_t n) {
  const char *c = static_cast<const char *>(p);
  return c >= b.smem && c + n <= b.window + b.window_bytes - kSmemRedzone;
}
Mbar *mbar_of(const void *bar, const char *what, const void *pc) {
  Block &b = *tl_worker.block;
  Mbar *m = find_mbar(b, bar);
  if (!m) {
    std::ostringstream os;
    os << what << " on " << bar << ", which is no initialised mbarrier of the block";
    report(Check::Synccheck, os.str(), pc);
  }
  return m;
}
// Completes the current phase when its arrivals and transaction bytes are all in; wakes waiters.
// True when it woke a thread.
bool mbar_settle(Block &b, const void *bar, Mbar &m) {
  if (m.pending != 0 || m.tx != 0) return false;
  m.done_seen[m.completed & 1u] = std::move(m.arrived_seen);
  m.arrived_seen.clear();
  ++m.completed;
  m.pending = m.count;
  bool woke = false;
  for (Thread &t : b.threads)
    if (t.state == State::Mbarrier && t.op_arg == bar) t.state = State::Ready, woke = true;
  return woke;
}
void complete_tx(const void *bar, long long bytes, const void *pc) {
  Block &b = *tl_worker.block;
  if (Mbar *m = mbar_of(bar, "a copy completes its bytes", pc)) {
    m->tx -= bytes;
    mbar_settle(b, bar, *m);
  }
}

// The emulator's tensor map, inside CUtensorMap's 128 bytes.
struct TensorMap {
  uint32_t magic, elem_bytes, rank, swizzle;
  const char *base;
  uint64_t dims[3], strides[3];  // strides[0] = elem_bytes
  uint32_t box[3];
};
static_assert(sizeof(TensorMap) <= 128, "fits CUtensorMap");
constexpr uint32_t kMapMagic = 0x41504554;  // "APET"
}  // namespace

void mbar_init(void *bar, unsigned count) {
  Block &b = *tl_worker.block;
  const void *pc = __builtin_return_address(0);
  if (!in_shared(b, bar, 8) || reinterpret_cast<uintptr_t>(bar) % 8 || count == 0) {
    report(Check::Memcheck, "mbarrier.init: needs 8 aligned bytes of shared memory and a count > 0", pc);
    return;
  }
  if (Mbar *m = find_mbar(b, bar)) *m = Mbar{count, count, 0, 0, m->base + m->completed, {}, {}};
  else b.mbars.push_back({bar, Mbar{count, count, 0, 0, 0, {}, {}}});
}

void mbar_arrive(void *bar, unsigned tx_bytes) {
  Block &b = *tl_worker.block;
  const void *pc = __builtin_return_address(0);
  Mbar *m = mbar_of(bar, "mbarrier.arrive", pc);
  if (!m) return;
  m->tx += tx_bytes;
  if (m->pending == 0) {
    report(Check::Synccheck, "mbarrier.arrive: more arrivals than the barrier's count in one phase", pc);
    return;
  }
  join_seen(m->arrived_seen, self()->seen);  // an arrival releases what its thread was ordered after
  --m->pending;
  // The arrival that completes a phase hands over to the scheduler (unless APE_SIMT_EAGER_WAKE=0), so
  // the threads it woke run before the arriving one goes on: the widest window a GPU may leave
  // between a release and the arriving thread's next accesses. A thread that releases a buffer
  // while its own reads of it are still pending (a wgmma issued but not waited for, computed here
  // at its wait) then reads what the woken producer copied over it.
  if (mbar_settle(b, bar, *m) && b.launch->eager_wake) yield_to_scheduler();
}

void mbar_wait(void *bar, unsigned parity) {
  Thread *t = self();
  const void *pc = __builtin_return_address(0);
  for (;;) {
    Mbar *m = mbar_of(bar, "mbarrier.try_wait", pc);
    if (m && (m->completed & 1u) != (parity & 1u)) {
      // Phase completed - 1 (the last of this parity) is complete: the thread is ordered after it
      // and after what its arrivals were.
      const size_t i = static_cast<size_t>(mbar_index(*tl_worker.block, bar));
      if (t->seen.size() <= i) t->seen.resize(i + 1, 0);
      const unsigned done = m->base + m->completed;
      t->seen[i] = t->seen[i] > done ? t->seen[i] : done;
      join_seen(t->seen, m->done_seen[(m->completed - 1u) & 1u]);
      return;
    }
    if (!m) return;
    t->state = State::Mbarrier;
    t->op_arg = bar;
    t->site = Site{pc};
    yield_to_scheduler();
  }
}

bool tensor_map_encode(void *map, int elem_bytes, int rank, const void *base, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box, int swizzle_bytes) {
  TensorMap tm{};
  bool ok = (elem_bytes == 2 || elem_bytes == 4) && rank >= 1 && rank <= 3 &&
            reinterpret_cast<uintptr_t>(base) % 16 == 0 &&
            (swizzle_bytes == 0 || swizzle_bytes == 32 || swizzle_bytes == 64 || swizzle_bytes == 128);
  for (int d = 0; ok && d < rank; ++d) {
    ok = dims[d] >= 1 && box[d] >= 1 && box[d] <= 256 && (d == 0 || strides[d - 1] % 16 == 0);
    tm.dims[d] = dims[d], tm.box[d] = box[d];
    tm.strides[d] = d == 0 ? static_cast<uint64_t>(elem_bytes) : strides[d - 1];
  }
  // The inner box extent is a multiple of 16 bytes, at most the swizzle span.
  ok = ok && (box[0] * static_cast<uint32_t>(elem_bytes)) % 16 == 0 &&
       (swizzle_bytes == 0 || box[0] * static_cast<uint32_t>(elem_bytes) <= static_cast<uint32_t>(swizzle_bytes));
  if (!ok) {
    report(Check::Launch, "cuTensorMapEncodeTiled: arguments the driver refuses");
    return false;
  }
  tm.magic = kMapMagic, tm.elem_bytes = static_cast<uint32_t>(elem_bytes);
  tm.rank = static_cast<uint32_t>(rank), tm.swizzle = static_cast<uint32_t>(swizzle_bytes);
  tm.base = static_cast<const char *>(base);
  std::memset(map, 0, 128);
  std::memcpy(map, &tm, sizeof tm);
  return true;
}

void tma_load(void *dst, const void *map, const int *coords, void *bar) {
  Block &b = *tl_worker.block;
  const void *pc = __builtin_return_address(0);
  TensorMap tm;
  std::memcpy(&tm, map, sizeof tm);
  if (tm.magic != kMapMagic) return report(Check::Memcheck, "TMA load with a tensor map that was never encoded", pc);
  const size_t row = static_cast<size_t>(tm.box[0]) * tm.elem_bytes;
  const size_t rows = (tm.rank > 1 ? tm.box[1] : 1) * (tm.rank > 2 ? tm.box[2] : 1);
  char *d = static_cast<char *>(dst);
  const size_t align = tm.swizzle ? 8 * static_cast<size_t>(tm.swizzle) : 128;
  if (!in_shared(b, d, row * rows) || static_cast<size_t>(d - b.smem) % align != 0) {
    std::ostringstream os;
    os << "TMA load destination not in the block's shared memory or not " << align << "-byte aligned";
    return report(Check::Memcheck, os.str(), pc);
  }
  const uint32_t W = tm.swizzle / 16;
  bool reported = false;
  std::vector<char> elem(tm.elem_bytes);
  for (size_t r = 0; r < rows; ++r) {
    const int64_t c1 = tm.rank > 1 ? coords[1] + static_cast<int64_t>(r % tm.box[1]) : 0;
    const int64_t c2 = tm.rank > 2 ? coords[2] + static_cast<int64_t>(r / tm.box[1]) : 0;
    for (uint32_t x = 0; x < tm.box[0]; ++x) {
      const int64_t c0 = coords[0] + x;
      const bool in = c0 >= 0 && c0 < static_cast<int64_t>(tm.dims[0]) &&
                      (tm.rank < 2 || (c1 >= 0 && c1 < static_cast<int64_t>(tm.dims[1]))) &&
                      (tm.rank < 3 || (c2 >= 0 && c2 < static_cast<int64_t>(tm.dims[2])));
      uint32_t off = static_cast<uint32_t>((d - b.smem) + r * row + x * tm.elem_bytes);
      if (W > 1) off ^= ((off >> 7) & (W - 1)) << 4;
      char *to = b.smem + off;
      if (in) {
        const char *from = tm.base + c0 * static_cast<int64_t>(tm.strides[0]) +
                           c1 * static_cast<int64_t>(tm.strides[1]) + c2 * static_cast<int64_t>(tm.strides[2]);
        tl_async_copy = true;
        check_access(from, tm.elem_bytes, Access::Read, pc);
        tl_async_copy = false;
        std::memcpy(to, from, tm.elem_bytes);
      } else {
        std::memset(to, 0, tm.elem_bytes);
      }
      mark_async_shared_write(b, to, tm.elem_bytes, bar, reported, pc);
    }
  }
  complete_tx(bar, static_cast<long long>(row * rows), pc);
}

namespace {
// Visits the in-bounds elements of a reduction's box in order: f(smem offset, global element).
template <class F> void for_box(const BulkReduce &r, F f) {
  const Block &b = *tl_worker.block;
  TensorMap tm;
  std::memcpy(&tm, r.map, sizeof tm);
  const size_t row = static_cast<size_t>(tm.box[0]) * tm.elem_bytes;
  const size_t rows = (tm.rank > 1 ? tm.box[1] : 1) * (tm.rank > 2 ? tm.box[2] : 1);
  const uint32_t W = tm.swizzle / 16;
  for (size_t y = 0; y < rows; ++y) {
    const int64_t c1 = tm.rank > 1 ? r.coords[1] + static_cast<int64_t>(y % tm.box[1]) : 0;
    const int64_t c2 = tm.rank > 2 ? r.coords[2] + static_cast<int64_t>(y / tm.box[1]) : 0;
    for (uint32_t x = 0; x < tm.box[0]; ++x) {
      const int64_t c0 = r.coords[0] + x;
      const bool in = c0 >= 0 && c0 < static_cast<int64_t>(tm.dims[0]) &&
                      (tm.rank < 2 || (c1 >= 0 && c1 < static_cast<int64_t>(tm.dims[1]))) &&
                      (tm.rank < 3 || (c2 >= 0 && c2 < static_cast<int64_t>(tm.dims[2])));
      if (!in) continue;
      uint32_t off = static_cast<uint32_t>((r.src - b.smem) + y * row + x * tm.elem_bytes);
      if (W > 1) off ^= ((off >> 7) & (W - 1)) << 4;
      f(off, reinterpret_cast<float *>(const_cast<char *>(tm.base) + c0 * static_cast<int64_t>(tm.strides[0]) +
                                       c1 * static_cast<int64_t>(tm.strides[1]) +
                                       c2 * static_cast<int64_t>(tm.strides[2])));
    }
  }
}
// The source's in-bounds elements into `out`, each read checked as this thread's.
void snapshot(const BulkReduce &r, std::vector<float> &out, const void *pc) {
  const Block &b = *tl_worker.block;
  out.clear();
  for_box(r, [&](uint32_t off, float *) {
    check_access(b.smem + off, 4, Access::Read, pc);
    float v;
    std::memcpy(&v, b.smem + off, 4);
    out.push_back(v);
  });
}
// The read of the source, as late as the program allows; a source rewritten since the issue
// (before the wait that lets the reduction read it) is reported.
void bulk_read(BulkReduce &r) {
  if (r.read) return;
  snapshot(r, r.values, nullptr);
  r.read = true;
  if (std::memcmp(r.values.data(), r.issued.data(), sizeof(float) * r.values.size()) != 0)
    report(Check::Async, "the source of a TMA reduction changed while it was in flight (wait_group.read first)");
}
void bulk_add(BulkReduce &r) {
  bulk_read(r);
  size_t n = 0;
  for_box(r, [&](uint32_t, float *to) {
    tl_async_copy = true;
    atomic_add_f32(to, r.values[n++]);
    tl_async_copy = false;
  });
}
}  // namespace

void tma_reduce_add(const void *map, const int *coords, const void *src) {
  Thread *t = self();
  if (!t) return;
  Block &b = *tl_worker.block;
  const void *pc = __builtin_return_address(0);
  TensorMap tm;
  std::memcpy(&tm, map, sizeof tm);
  if (tm.magic != kMapMagic) return report(Check::Memcheck, "TMA reduction with a tensor map that was never encoded", pc);
  if (tm.elem_bytes != 4) return report(Check::Memcheck, "TMA add reduction: the emulator takes fp32 tensors only", pc);
  const size_t bytes = static_cast<size_t>(tm.box[0]) * tm.elem_bytes * (tm.rank > 1 ? tm.box[1] : 1) *
                       (tm.rank > 2 ? tm.box[2] : 1);
  const char *s = static_cast<const char *>(src);
  const size_t align = tm.swizzle ? 8 * static_cast<size_t>(tm.swizzle) : 128;
  if (!in_shared(b, s, bytes) || static_cast<size_t>(s - b.smem) % align != 0) {
    std::ostringstream os;
    os << "TMA reduction source not in the block's shared memory or not " << align << "-byte aligned";
    return report(Check::Memcheck, os.str(), pc);
  }
  BulkReduce r;
  std::memcpy(r.map, map, sizeof r.map);
  for (int d = 0; d < 3; ++d) r.coords[d] = d < static_cast<int>(tm.rank) ? coords[d] : 0;
  r.src = s;
  // The source as issued, read by this thread for the race rule (its writers must be ordered
  // before the issue: a barrier, not the later wait); bulk_read compares it with what it reads.
  snapshot(r, r.issued, pc);
  t->bulk_open.push_back(std::move(r));
}

void bulk_commit() {
  Thread *t = self();
  if (!t) return;
  t->bulk_groups.push_back(std::move(t->bulk_open));
  t->bulk_open.clear();
}

void bulk_wait(int pending_groups, bool read_only) {
  Thread *t = self();
  if (!t) return;
  const size_t keep = pending_groups < 0 ? 0 : static_cast<size_t>(pending_groups);
  if (read_only) {
    for (size_t g = 0; g + keep < t->bulk_groups.size(); ++g)
      for (BulkReduce &r : t->bulk_groups[g]) bulk_read(r);
    return;
  }
  while (t->bulk_groups.size() > keep) {
    for (BulkReduce &r : t->bulk_groups.front()) bulk_add(r);
    t->bulk_groups.pop_front();
  }
}

void fence_release() {
  Thread *t = self();
  if (!t || (t->bulk_open.empty() && t->bulk_groups.empty())) return;
  report(Check::Async,
         "a release fence with TMA reductions in flight: their adds are not ordered before it (bulk_wait first)",
         __builtin_return_address(0));
}

namespace detail {
void bulk_drain(Thread &t) {
  bool unread = !t.bulk_open.empty();
  for (const auto &g : t.bulk_groups)
    for (const BulkReduce &r : g) unread = unread || !r.read;
  if (unread) report(Check::Async, "returns with TMA reductions whose reads of shared memory were never waited for");
  t.bulk_groups.push_back(std::move(t.bulk_open));
  t.bulk_open.clear();
  for (auto &g : t.bulk_groups)
    for (BulkReduce &r : g) bulk_add(r);
  t.bulk_groups.clear();
}
}  // namespace detail

void bulk_copy(void *dst, const void *src, unsigned bytes, void *bar) {
  Block &b = *tl_worker.block;
  const void *pc = __builtin_return_address(0);
  if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16 ||
      !in_shared(b, dst, bytes))
    return report(Check::Memcheck, "bulk copy: 16-byte aligned shared destination, source and size", pc);
  tl_async_copy = true;
  check_access(src, bytes, Access::Read, pc);
  tl_async_copy = false;
  std::memcpy(dst, src, bytes);
  bool reported = false;
  mark_async_shared_write(b, static_cast<char *>(dst), bytes, bar, reported, pc);
  complete_tx(bar, bytes, pc);
}

}  // namespace ape::simt
