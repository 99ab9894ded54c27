#!/usr/bin/env python3
"""The CUDA kernels measured by their compiled code (no GPU needed).

For each encoding, head dim and architecture, emits the CUDA variant with apec (--emit=cuda,
from examples/encodings/NAME.mlir), compiles NAME_cuda_DTYPE_hdD.cu with nvcc to a cubin and
reports, per kernel:

  from ptxas -v     registers, spill stores/loads (bytes), stack frame, static shared memory
  from the source   dynamic shared memory and threads per block (a host program prints the tile
                    constants of cuda/attention.cuh), hence the theoretical occupancy per arch
  from the SASS     (cuobjdump -sass) the main loop: the outermost loop (a backward branch)
                    that holds the tensor-core instructions (the flash backward's loop over
                    a step's sub-tiles inside it counted once per sub-tile); per iteration of
                    it, per warp:
                    instructions, instructions per MFLOP, tensor-core (HMMA, and HGMMA for wgmma)
                    share of the instructions, MUFU,
                    ldmatrix, cp.async, shared / global loads and stores, global atomics,
                    barriers, shuffles; the bytes moved through shared memory per kFLOP:
                    by the load/store unit (ldmatrix, shared loads and stores, cp.async's
                    writes: its 128 bytes per cycle per SM are a limit of the mma.sync
                    kernels) and by wgmma's operand reads from shared memory (descriptors)

Instruction counts are static: every instruction inside the loop once, both sides of a branch
included. The kernels run the tiles that need no causal mask in their own copy of the loop
(FlashAttention does the same); the steady-state loop reported is that one (of the outermost
loops with tensor-core instructions, the one with the most HMMA, then the shortest). FLOPs per iteration are the GEMM FLOPs of the warp's part of one tile step
(forward: S = Q K^T and O += P V; backward: S^T, dP^T, dV, dK and the warp's share of dQ).

  .venv/bin/python bench/cuda_sass_stats.py --apec build/tools/apec \\
      --md bench/results/cuda_sass.md --csv bench/results/cuda_sass.csv

cuobjdump (and nvdisasm, which it calls for sm_90a code) come from the CUDA toolkit or, when it
lacks them, from PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, which this script
installs into the project's virtual environment (--venv, default .venv).
"""
import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Per-SM limits used for the theoretical occupancy (CUDA C++ Programming Guide, "Compute
# Capabilities"): registers per SM, max warps per SM, max blocks per SM, shared memory per SM
# usable by blocks (bytes), reserved shared memory per block.
ARCH = {
    80: dict(regs=65536, warps=64, blocks=32, smem=164 * 1024, reserved=1024),
    86: dict(regs=65536, warps=48, blocks=16, smem=100 * 1024, reserved=1024),
    89: dict(regs=65536, warps=48, blocks=24, smem=100 * 1024, reserved=1024),
    90: dict(regs=65536, warps=64, blocks=32, smem=228 * 1024, reserved=1024),
}

# FlashAttention-2's own kernels, sm_90 SASS from nvcc 13, bf16, d_h = 128, per warp and main
# loop iteration, as measured in issue 14 (the bar is 1.3x these).
FA2 = {"forward": dict(ipm=874, hmma=27.9), "backward": dict(ipm=738, hmma=33.0)}
# FlashAttention-3's forward (flash_fwd_hdim128_bf16_sm90.cu, commit 0251105 with CUTLASS 7127592,
# its own nvcc flags), sm_90a SASS from the same nvcc 13.0, per consumer warp and iteration of its
# steady-state loop (the innermost loop holding HGMMA; causal: the loop without the mask).
# FlashAttention-2's backward by the same count (smem_bytes): PyTorch 2.15's build (libtorch_cuda.so,
# sm_90 SASS) of flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel with Flash_bwd_kernel_traits<128, 64,
# 128, 8, 2, 4, 2, false, false>, bf16, causal, even sizes: per warp and 64-query step of its loop
# over query tiles (SASS 0x2480-0x6840, 1,085 instructions, 320 HMMA, 1.3107 MFLOP; main_loop()
# would take the loop over key blocks around it), 144 ldmatrix.x4 (73,728 bytes), 32 STS (P and
# dS), 6 LDS, 8 cp.async: 82,688 bytes.
FA2_SMEM = dict(bytes_per_kflop=63.1)
FA3 = {"causal": dict(instrs=469, ipm=447, hgmma=16, mufu=66), "non-causal": dict(instrs=594, ipm=412, hgmma=19, mufu=90)}
# FlashAttention-3's backward (flash_bwd_hdim128_bf16_sm90.cu, same commits and flags; causal,
# kBlockM 64 x kBlockN 128, two consumer warpgroups raised to 240 registers by setmaxnreg, one
# producer warpgroup lowered to 24): per consumer warp and iteration of its loop over query tiles
# (SASS 0x15e0-0x3430 of the kernel without the deterministic order; the deterministic one's loop
# is one instruction longer), 486 instructions (its causal mask's selects included), 32 HGMMA,
# 1.3107 MFLOP; through the load/store unit 10,240 bytes (16 LDS: lse and dPsum; 8 STS.128: the
# dQ tile in the accumulators' own order, which a producer warp adds by a bulk reduction; 4 STSM:
# dS), by wgmma 32,768.
FA3_BWD = dict(instrs=486, ipm=371, hgmma=32, lsu_b_per_kflop=7.8, wgmma_b_per_kflop=25.0)

KERNELS = {  # mangled-name fragment -> report name
    "flash_forward_kernel": "forward",
    "hopper_forward_kernel": "hopper_forward",
    "flash_backward_kernel": "backward",
}

CLASSES = [  # (column, regex on the opcode)
    ("hmma", r"^(HMMA|HGMMA)"),  # tensor-core instructions: mma.sync and wgmma
    ("mufu", r"^MUFU"),
    ("ldsm", r"^LDSM"),
    ("stsm", r"^STSM"),  # stmatrix (sm_90)
    ("cp_async", r"^LDGSTS"),
    ("lds", r"^LDS(\.|$)"),
    ("sts", r"^STS(\.|$)"),
    ("ldg", r"^LDG(\.|$)"),
    ("stg", r"^STG(\.|$)"),
    ("atomics", r"^(RED|ATOM)"),
    ("bar", r"^BAR(\.|$)"),
    ("shfl", r"^SHFL"),
    ("local", r"^(LDL|STL)"),  # spill traffic inside the loop
]


def ensure_nvdisasm(venv, cuobjdump):
    """cuobjdump hands sm_90a code to nvdisasm: the toolkit's, or PyPI's nvidia-cuda-nvdisasm
    (installed into the virtual environment when missing), found through NVDISASM_PATH."""
    if shutil.which("nvdisasm") or os.environ.get("NVDISASM_PATH"):
        return
    here = Path(cuobjdump).parent / "nvdisasm"
    if not here.exists():
        py = Path(venv) / "bin" / "python"
        if not py.exists():
            sys.exit(f"no nvdisasm, and no virtual environment at {venv} to install it into")
        print("[sass] installing nvidia-cuda-nvdisasm into", venv, file=sys.stderr)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "nvidia-cuda-nvdisasm"], check=True)
    if not here.exists():
        sys.exit(f"nvdisasm not found next to {cuobjdump} after installing nvidia-cuda-nvdisasm")
    os.environ["NVDISASM_PATH"] = str(here.parent)


def find_cuobjdump(venv):
    for cand in [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]:
        if cand and os.access(cand, os.X_OK):
            return cand
    py = Path(venv) / "bin" / "python"
    found = list((Path(venv) / "lib").glob("python3*/site-packages/nvidia/cu*/bin/cuobjdump"))
    if not found:
        if not py.exists():
            sys.exit(f"no cuobjdump, and no virtual environment at {venv} to install it into")
        print("[sass] installing nvidia-cuda-cuobjdump into", venv, file=sys.stderr)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "nvidia-cuda-cuobjdump"], check=True)
        found = list((Path(venv) / "lib").glob("python3*/site-packages/nvidia/cu*/bin/cuobjdump"))
    if not found:
        sys.exit("cuobjdump not found after installing nvidia-cuda-cuobjdump")
    return str(found[0])


TILE_PROGRAM = r"""
#include "ape/cuda/attention.cuh"
#include <cstdio>
using namespace ape::cuda::detail;
template <class In, int D> void print(const char *dt) {
  using F = FlashFwd<In, D>;
  using B = FlashBwd<In, D, true>;
  using N = FlashBwd<In, D, false>;
  using W = HopperBwd<In, D == 32 ? 64 : D>;
  using S = BwdTiles<In, D, kBwdWideSub>;
  using X = BwdTiles<In, D == 32 ? 64 : D, kBwdWideTma>;
  using H = HopperFwd<In, D>;
  std::printf("forward %s %d threads=%d smem=%zu smem_dist=%zu smem_rowcol=%zu flops=%lld\n", dt, D,
              F::kThreads, F::bytes, F::bytes_dist, F::bytes_rowcol, 4LL * 16 * F::kMT * F::BK * D);
  // wgmma: a warp's part of the warpgroup's 64 rows is 16 rows.
  std::printf("hopper_forward %s %d threads=%d smem=%zu smem_dist=%zu smem_rowcol=%zu flops=%lld\n", dt,
              D, H::kThreads, H::bytes, H::bytes_dist, H::bytes_rowcol, 4LL * 16 * H::BK * D);
  // Three consumer warpgroups (APE_CUDA_HOPPER_CONSUMERS=3, d_h <= 64): the same work per warp.
  if constexpr (D <= 64) {
    using H3 = HopperFwd<In, D, 3>;
    std::printf("hopper_forward3 %s %d threads=%d smem=%zu smem_dist=%zu smem_rowcol=%zu flops=%lld\n", dt,
                D, H3::kThreads, H3::bytes, H3::bytes_dist, H3::bytes_rowcol, 4LL * 16 * H3::BK * D);
  }
  // S^T, dP^T, dV, dK: 16 keys x BQ queries x D each; dQ: BQ x D x BK over the warps.
  // subs: the sub-tiles of a step (BwdTiles::kSubs), a loop inside the step's loop.
  std::printf("backward %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt, D,
              B::kThreads, B::bytes, B::bytes_dist, B::gsum, B::bytes_rowcol, 8LL * 16 * B::BQ * D + 2LL * B::BQ * D * B::BK / B::kWarps,
              B::kSubs);
  // The narrow layout (64 keys, 4 warps): D = 128 on sm_86/89 only.
  std::printf("backward_narrow %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt, D,
              N::kThreads, N::bytes, N::bytes_dist, N::gsum, N::bytes_rowcol, 8LL * 16 * N::BQ * D + 2LL * N::BQ * D * N::BK / N::kWarps,
              N::kSubs);
  // The wide layout in sub-tiles (APE_CUDA_BWD_SUBTILES=1, D 128): steps of 64 queries.
  std::printf("backward_sub %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt, D,
              S::kThreads, S::bytes, S::bytes_dist, S::gsum, S::bytes_rowcol, 8LL * 16 * S::BQ * D + 2LL * S::BQ * D * S::BK / S::kWarps,
              S::kSubs);
  // The wgmma layout (sm_90a, D 64 and 128): 128 keys over two consumer warpgroups, BQ 64, and a
  // producer warpgroup (the block's threads; the FLOPs are the consumer warps').
  std::printf("backward_wgmma %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt, D,
              W::kBlockThreads, W::bytes, W::bytes_dist, W::gsum, W::bytes_rowcol, 8LL * 16 * W::BQ * D + 2LL * W::BQ * D * W::BK / W::kWarps,
              W::kSubs);
  // The wide layout with dQ' by TMA reductions (APE_CUDA_DQ_TMA=1; sm_90a, D 64 and 128).
  std::printf("backward_dqtma %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt, D,
              X::kThreads, X::bytes, X::bytes_dist, X::gsum, X::bytes_rowcol, 8LL * 16 * X::BQ * D + 2LL * X::BQ * D * X::BK / X::kWarps,
              X::kSubs);
  // FlashAttention-2's tiling (APE_CUDA_BWD_SQUARE=1, D 128): the five products over 8 warps.
  if constexpr (D == 128) {
    using Q = ape::cuda::detail::BwdTiles<In, D, ape::cuda::detail::kBwdSquare>;
    std::printf("backward_square %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt, D,
                Q::kThreads, Q::bytes, Q::bytes_dist, Q::gsum, Q::bytes_rowcol, 10LL * Q::BK * Q::BQ * D / Q::kWarps, Q::kSubs);
    // The same with dQ' by TMA reductions (APE_CUDA_BWD_SQUARE=1 with APE_CUDA_DQ_TMA=1; sm_90a).
    using QT = ape::cuda::detail::BwdTiles<In, D, ape::cuda::detail::kBwdSquareTma>;
    std::printf("backward_square_tma %s %d threads=%d smem=%zu smem_dist=%zu smem_dist_fixed=%zu smem_rowcol=%zu flops=%lld subs=%d\n", dt,
                D, QT::kThreads, QT::bytes, QT::bytes_dist, QT::gsum, QT::bytes_rowcol, 10LL * QT::BK * QT::BQ * D / QT::kWarps,
                QT::kSubs);
  }
}
int main() {
  print<__nv_bfloat16, 32>("bf16"); print<__nv_bfloat16, 64>("bf16"); print<__nv_bfloat16, 128>("bf16");
  print<__half, 32>("f16"); print<__half, 64>("f16"); print<__half, 128>("f16");
}
"""


def tile_constants(nvcc, work, include=str(ROOT / "kernels/include")):
    src = Path(work) / "tiles.cu"
    src.write_text(TILE_PROGRAM)
    exe = Path(work) / "tiles"
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_80", "-I", include,
                    str(src), "-o", str(exe)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        kind, dt, d, *kv = line.split()
        out[(kind, dt, int(d))] = {k: int(v) for k, v in (x.split("=") for x in kv)}
    return out


def ptxas_info(text):
    """function -> dict(regs, spill_st, spill_ld, stack, smem_static) from ptxas -v output."""
    info, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            info[cur] = dict(regs=0, spill_st=0, spill_ld=0, stack=0, smem_static=0)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            info[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            info[cur]["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            info[cur]["smem_static"] = int(m.group(1))
    return info


def sass_functions(text):
    """function -> [(address, opcode)] from cuobjdump -sass."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur:
            body = m.group(2).strip()
            body = re.sub(r"^@!?U?P[T0-9]+\s+", "", body)  # predicate guard
            funcs[cur].append((int(m.group(1), 16), body))
    return funcs


def main_loop(instrs, trips=1):
    """The steady-state main loop: of the outermost loops (regions from a backward branch's
    target to the branch) that hold tensor-core instructions, the one with the most HMMA, and of
    those the shortest (a kernel may run its masked tiles in a second copy of the loop). With
    trips > 1, the loop's largest inner loop with tensor-core instructions (the flash backward's
    sub-tiles of a step) runs `trips` times per iteration: its instructions count that often."""
    loops = []
    for addr, body in instrs:
        m = re.match(r"BRA\s+(?:!?U?P\d,\s*)?(0x[0-9a-f]+)", body)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        region = [b for a, b in instrs if target <= a <= addr]
        # Not a loop: the jump back from an out-of-line block (an mbarrier wait's retry, placed
        # after the function's exit, returns into the code it left).
        if any(b.startswith("EXIT") for b in region):
            continue
        n_hmma = sum(1 for b in region if b.startswith(("HMMA", "HGMMA")))
        if n_hmma:
            loops.append((target, addr, n_hmma, region))
    outer = [l for l in loops
             if not any(o is not l and o[0] <= l[0] and l[1] <= o[1] for o in loops)]
    if not outer:
        return []
    best = min(outer, key=lambda l: (-l[2], len(l[3])))
    inner = [l for l in loops if l is not best and best[0] <= l[0] and l[1] <= best[1]]
    if trips > 1 and inner:
        return best[3] + max(inner, key=lambda l: l[2])[3] * (trips - 1)
    return best[3]


TOKEN_KERNELS = {"token_forward_kernel": "token forward", "token_backward_kernel": "token backward"}
TOK_THREADS = 1024  # kTokThreads in cuda/common.cuh (read from the headers compiled: tok_threads)
TOK_ITEMS = 8  # kTokItems in cuda/common.cuh: the tokens a thread of a scan's round loads


def tok_threads(include):
    """kTokThreads of the kernel headers at `include` (cuda/common.cuh, or the older
    cuda_attention.cuh), else TOK_THREADS."""
    for name in ("ape/cuda/common.cuh", "ape/cuda_attention.cuh"):
        f = Path(include) / name
        if f.exists():
            m = re.search(r"constexpr int kTokThreads = (\d+);", f.read_text())
            if m:
                return int(m.group(1))
    return TOK_THREADS


def load_groups(ops):
    """The dependent rounds of global loads in one pass over a loop body: runs of loads (LDG)
    that no store (global, shared or local) separates. A store of a loaded value waits for its
    load, so each run after a store starts once the loads before have landed: one round trip to
    memory per run (a conservative count: a run after a store of something else may overlap)."""
    groups, in_run = 0, False
    for o in ops:
        if re.match(r"^LDG(\.|$)", o):
            if not in_run:
                groups, in_run = groups + 1, True
        elif re.match(r"^(STG|STS|STL|ATOMG|REDG|RED)(\.|$)", o):
            in_run = False
    return groups


def token_cost(instrs, T):
    """A static estimate of the token program's cost at sequence length T (one block of
    TOK_THREADS threads per slice): the kernel's loops (regions from a backward branch's target to
    the branch, none holding an EXIT), each with its instructions per iteration n, the tokens an
    iteration handles u (its global stores, else its global loads) and its rounds of dependent
    global loads g (load_groups), grouped into stages (an unrolled loop and its remainder:
    adjacent, with the same kinds of memory instruction). A stage costs its cheapest n / u per
    token times the tokens of a thread, T / TOK_THREADS (shared-memory loops: the TOK_THREADS
    values one thread scans), and g round trips to memory per iteration of its widest loop, for
    ceil(tokens of a thread / u) iterations: the latency chain that bounds a stage whose block is
    alone on its SM (the token program runs one block per slice: B·H blocks in all). A loop of
    warp shuffles and no global loads is the scans' chain of chunk sums (tok_block_scan: warp 0
    adds one chunk's sum per shuffle, TOK_THREADS / 32 chunks a round of TOK_THREADS x 8 tokens):
    serial, its instructions per shuffle times the chunks of T.
    Returns (stages, per-thread instructions, serial instructions of thread 0 or warp 0, round
    trips)."""
    loops = []
    for addr, body in instrs:
        m = re.match(r"BRA\s+(?:!?U?P\d,\s*)?(0x[0-9a-f]+)", body)
        if not m or int(m.group(1), 16) >= addr:
            continue
        region = [b for a, b in instrs if int(m.group(1), 16) <= a <= addr]
        if any(b.startswith("EXIT") for b in region):
            continue
        ops = [b.split()[0] for b in region]
        ldg = sum(1 for o in ops if re.match(r"^LDG(\.|$)", o))
        stg = sum(1 for o in ops if re.match(r"^STG(\.|$)", o))
        lds = sum(1 for o in ops if re.match(r"^LDS(\.|$)", o))
        sts = sum(1 for o in ops if re.match(r"^STS(\.|$)", o))
        shfl = sum(1 for o in ops if re.match(r"^SHFL(\.|$)", o))
        chain = ldg == 0 and shfl > 0
        shared = ldg == 0 and stg == 0 and not chain
        u = shfl if chain else (sts or lds) if shared else (stg or ldg)
        kinds = (ldg > 0, stg > 0, lds > 0, sts > 0, chain)
        loops.append(dict(n=len(region), u=max(u, 1), shared=shared, chain=chain, kinds=kinds,
                          g=load_groups(ops)))
    stages = []
    for l in loops:
        prev = stages[-1] if stages else None
        # An unrolled loop and its remainder (one token per iteration) are one stage; the strided
        # stage loops, one token per iteration each, are stages of their own.
        if prev and prev[0]["kinds"] == l["kinds"] and (
                l["shared"] or l["chain"] or (len(prev) == 1 and (l["u"] > 1) != (prev[0]["u"] > 1))):
            prev.append(l)
        else:
            stages.append([l])
    per_thread = serial = trips = 0.0
    out = []
    for st in stages:
        per_item = min(l["n"] / l["u"] for l in st)
        serial_stage = st[0]["shared"] or st[0]["chain"]
        if st[0]["chain"]:  # chunks of T: TOK_THREADS / 32 a round of TOK_THREADS x TOK_ITEMS
            items = -(-T // (TOK_THREADS * TOK_ITEMS)) * (TOK_THREADS // 32)
        else:
            items = TOK_THREADS if st[0]["shared"] else (T + TOK_THREADS - 1) // TOK_THREADS
        cost = per_item * items
        wide = max(st, key=lambda l: l["u"])
        stage_trips = 0 if serial_stage else -(-items // wide["u"]) * wide["g"]
        if serial_stage:
            serial += cost
        else:
            per_thread += cost
            trips += stage_trips
        out.append(dict(loops=[(l["n"], l["u"]) for l in st], per_item=per_item, items=items,
                        shared=st[0]["shared"], chain=st[0]["chain"], cost=cost, trips=stage_trips))
    return out, per_thread, serial, trips


def token_section(token_rows, token_T):
    """The token program's table (token_cost) as Markdown lines, none without rows."""
    if not token_rows:
        return []
    T = token_T
    lines = ["", f"## The token program at T = {T:,} (static estimate)", "",
              f"One block of {TOK_THREADS} threads per (b, h) slice runs the token program's stages "
              "(token_forward_kernel, token_backward_kernel; scans block-parallel in double), B·H "
              "blocks in all, each alone on its SM: a stage lasts as long as its thread's chain of "
              "memory round trips. From the SASS (token_cost in this script): each stage's loops "
              "(instructions / tokens per iteration), its cheapest instructions per token times the "
              f"tokens of one thread ({(T + TOK_THREADS - 1) // TOK_THREADS}), the values one "
              "thread scans in shared memory, or (chunk chain: warp 0's serial sum of the scans' "
              "256-token chunks) the chunks of T, and its dependent rounds of global loads (runs of loads "
              "no store separates, per iteration of its widest loop, times the iterations a thread "
              "makes). At roughly 0.5-1 us per round trip under load, the round trips are the "
              "program's time per slice.", "",
              "| encoding | kernel | arch | regs | stages (loop instrs / tokens per iteration = "
              "instrs per token x tokens; round trips) | instrs per thread | + serial (thread 0 or warp 0) | "
              "global round trips per thread |", "| --- " * 8 + "|"]
    for r in token_rows:
        st = "; ".join(
            ("shared scan " if x["shared"] else "chunk chain " if x.get("chain") else "") +
            ", ".join(f"{n}/{u}" for n, u in x["loops"]) + f" = {x['per_item']:.1f} x {x['items']}" +
            ("" if x["shared"] or x.get("chain") else f", {x['trips']}")
            for x in r["stages"])
        lines.append(f"| {r['encoding']} | {r['kernel']} | {r['arch']} | {r['regs']} | {st} | "
                     f"{r['per_thread']:,.0f} | {r['serial']:,.0f} | {r['trips']:,.0f} |")
    return lines


def smem_bytes(body):
    """Bytes one warp's instruction moves through the load/store unit's shared-memory path:
    ldmatrix and stmatrix (128 bytes per 8x8 matrix: .x1/.x2/.x4), shared loads and stores (32 lanes x their
    width), cp.async's writes (LDGSTS); 0 for anything else."""
    op = body.split()[0]
    if op.startswith(("LDSM", "STSM")):
        m = re.search(r"\.(\d)$", op)
        return 128 * (int(m.group(1)) if m else 1)
    m = re.match(r"^(LDS|STS|LDGSTS)(\..*)?$", op)
    if not m:
        return 0
    width = 4
    for mod in (m.group(2) or "").split("."):
        width = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}.get(mod, width)
    return 32 * width


def wgmma_smem_bytes(body):
    """A warp's share (a quarter of its warpgroup's) of the bytes one wgmma (HGMMA.64xNxK) reads
    from shared memory through its descriptors: A (64 x K) unless it comes from registers, and B
    (N x K); K elements are 32 bytes for every dense 16-bit and tf32 wgmma (the f16 form names only
    its accumulator type: HGMMA.64x128x16.F32)."""
    m = re.match(r"^HGMMA\.64x(\d+)x(\d+)(?:\.\w+)*\s+[^,]+,\s*([^,\s]+)", body)
    if not m:
        return 0
    n, k, a = int(m.group(1)), int(m.group(2)), m.group(3)
    row = 32  # bytes of K elements of a row: 16 x 2 (16-bit) or 8 x 4 (tf32), whatever SASS names the type
    a_bytes = 0 if re.match(r"^R\d+", a) else 64 * row
    return (a_bytes + n * row) // 4


def occupancy(arch, threads, regs, smem):
    a = ARCH[arch]
    warps = (threads + 31) // 32
    regs_per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    by_regs = a["regs"] // (regs_per_warp * warps)
    by_smem = a["smem"] // (smem + a["reserved"]) if smem else a["blocks"]
    by_warps = a["warps"] // warps
    blocks = min(by_regs, by_smem, by_warps, a["blocks"])
    limit = min((by_regs, "registers"), (by_smem, "shared memory"), (by_warps, "warps"),
                key=lambda x: x[0])[1]
    return blocks, blocks * warps, limit


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--apec", default=str(ROOT / "build/tools/apec"), help="apec (default build/tools/apec)")
    ap.add_argument("--encodings", nargs="+", default=["nope", "rope", "alibi", "cable", "t5"],
                    help="example names; NAME+fast compiles NAME with apec --fast-math")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--hd", nargs="+", type=int, default=[128, 64])
    ap.add_argument("--arch", nargs="+", default=["80", "86", "90a"],
                    help="architectures (80, 86, 89, 90, 90a: sm_90a adds the wgmma forward)")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--venv", default=os.environ.get("APE_VENV", str(ROOT / ".venv")))
    ap.add_argument("--md", help="write the Markdown table here")
    ap.add_argument("--csv", help="write the rows as CSV here")
    ap.add_argument("--kernels-include", default=str(ROOT / "kernels/include"),
                    help="the kernel headers (default this checkout's; another checkout's, e.g. a git "
                         "worktree of an earlier commit with its apec, for a before/after table)")
    ap.add_argument("--token-T", type=int, default=16384,
                    help="sequence length of the token program's static estimate (default 16384)")
    ap.add_argument("--token-only", action="store_true",
                    help="compile only the token program's kernels (token_forward_kernel, "
                         "token_backward_kernel) and write only its table")
    args = ap.parse_args()

    cuobjdump = find_cuobjdump(args.venv)
    ensure_nvdisasm(args.venv, cuobjdump)
    rows = []
    token_rows = []
    with tempfile.TemporaryDirectory() as work:
        tiles = tile_constants(args.nvcc, work, args.kernels_include)
        global TOK_THREADS
        TOK_THREADS = tok_threads(args.kernels_include)
        gen = Path(work) / "gen"
        for label in args.encodings:
            # NAME+fast: the example compiled with apec --fast-math (its score mods' exp, log,
            # log1p and divisions by the GPU's approximate instructions), in a folder of its own.
            enc, fast = (label[:-5], True) if label.endswith("+fast") else (label, False)
            spec = ROOT / "examples" / "encodings" / f"{enc}.mlir"
            gen = Path(work) / ("gen-fast" if fast else "gen")
            subprocess.run([args.apec, str(spec), "-o", str(gen), "--emit=cuda",
                            f"--cuda-dtypes={args.dtype}", "--cuda-head-dims=" + ",".join(map(str, args.hd))]
                           + (["--fast-math"] if fast else []), check=True)
            for hd in args.hd:
                src = gen / f"{enc}_cuda_{args.dtype}_hd{hd}.cu"
                if args.token_only:  # the two token kernels alone (they do not depend on d_h)
                    if hd != args.hd[0]:
                        continue
                    src = gen / f"{enc}_token_only.cu"
                    el = "__nv_bfloat16" if args.dtype == "bf16" else "__half"
                    src.write_text(
                        f'#include "{enc}_cuda.cuh"\nnamespace ape::cuda::detail {{\n' + "".join(
                            f"template __global__ void token_{d}_kernel<ape_gen_{enc}::Enc, {el}>("
                            f"const Params<ape_gen_{enc}::Enc, {el}>);\n" for d in ("forward", "backward")) + "}\n")
                functor = (gen / f"{enc}_cuda.cuh").read_text()
                dist = "kDistanceBias = true" in functor
                fixed = dist and "kBiasFixed = true" in functor  # its windows only in the backward
                rowcol = not dist and "kRowColBias = true" in functor
                for arch in args.arch:
                    cubin = Path(work) / f"{label}_{hd}_{arch}.cubin"
                    r = subprocess.run([args.nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-arch=sm_{arch}",
                                        "-cubin", "-Xptxas", "-v", "-I", args.kernels_include,
                                        "-I", str(gen), str(src), "-o", str(cubin)],
                                       capture_output=True, text=True)
                    if r.returncode:
                        sys.exit(r.stderr)
                    pinfo = ptxas_info(r.stderr + r.stdout)
                    sass = sass_functions(subprocess.run([cuobjdump, "-sass", str(cubin)], check=True,
                                                         capture_output=True, text=True).stdout)
                    for fn, instrs in sass.items():
                        tok = next((v for k, v in TOKEN_KERNELS.items() if k in fn), None)
                        if tok and hd == args.hd[0]:  # the token program does not depend on d_h
                            stages, per_thread, serial, trips = token_cost(instrs, args.token_T)
                            token_rows.append(dict(encoding=label, kernel=tok, arch=f"sm_{arch}",
                                                   regs=pinfo.get(fn, {}).get("regs"), stages=stages,
                                                   per_thread=per_thread, serial=serial, trips=trips))
                        kind = next((v for k, v in KERNELS.items() if k in fn), None)
                        # The flash backward's template arguments after d_h: the order (kOrdered), then
                        # the layout (BwdTiles). The kernels for dQ' in any order: the wide layout's only.
                        tiles_kind = kind
                        if kind == "hopper_forward" and re.search(r"Li\d+ELi3E", fn):
                            kind = tiles_kind = "hopper_forward3"  # three consumer warpgroups
                        if kind == "forward" and re.search(r"Li\d+ELb1E", fn):
                            kind = "forward_split"  # the keys split over blocks (kSplit)
                        if kind == "backward":
                            ordered, lay = re.search(r"Li\d+ELb([01])ELi(\d)E", fn).groups()
                            kind = {"0": "backward_narrow", "1": "backward", "2": "backward_wgmma",
                                    "3": "backward_sub", "4": "backward_dqtma", "5": "backward_square",
                                    "6": "backward_square_tma"}[lay]
                            tiles_kind = kind
                            if ordered == "0":
                                kind = "backward_anyorder" if lay == "1" else None
                        if kind is None or (kind in ("hopper_forward", "hopper_forward3", "backward_wgmma", "backward_dqtma",
                                                     "backward_square_tma")
                                            and arch != "90a"):
                            continue  # the wgmma and TMA kernels are a trap without sm_90a code
                        t = tiles[(tiles_kind, args.dtype, hd)]
                        loop = main_loop(instrs, t.get("subs", 1))
                        ops = [b.split()[0] for b in loop]
                        counts = {c: sum(1 for o in ops if re.match(rx, o)) for c, rx in CLASSES}
                        total_hmma = sum(1 for _, b in instrs if b.startswith(("HMMA", "HGMMA")))
                        p = pinfo.get(fn, {})
                        # Distance and row/column biases add their tables to the flash kernels.
                        key = "smem_dist" if dist else "smem_rowcol" if rowcol else "smem"
                        if fixed and "smem_dist_fixed" in t:
                            key = "smem_dist_fixed"
                        smem = t[key] + p.get("smem_static", 0)
                        blocks, warps, limit = occupancy(int(arch.rstrip("a")), t["threads"], p.get("regs", 0), smem)
                        mflop = t["flops"] / 1e6
                        lsu = sum(smem_bytes(b) for b in loop)
                        wg = sum(wgmma_smem_bytes(b) for b in loop)
                        rows.append(dict(
                            encoding=label, kernel=kind, dtype=args.dtype, hd=hd, arch=f"sm_{arch}",
                            regs=p.get("regs"), spill_st=p.get("spill_st"), spill_ld=p.get("spill_ld"),
                            stack=p.get("stack"), smem=smem, threads=t["threads"],
                            blocks_per_sm=blocks, warps_per_sm=warps, occupancy_limit=limit,
                            loop_instrs=len(loop), mflop=round(mflop, 4),
                            instrs_per_mflop=round(len(loop) / mflop) if loop else None,
                            hmma_share=round(100.0 * counts["hmma"] / len(loop), 1) if loop else None,
                            hmma_outside_loop=total_hmma - counts["hmma"], **counts,
                            smem_bytes=lsu, smem_b_per_kflop=round(lsu / (mflop * 1e3), 1) if loop else None,
                            wgmma_b_per_kflop=round(wg / (mflop * 1e3), 1) if loop else None))
    nvcc_version = next((l.strip() for l in subprocess.run([args.nvcc, "--version"], capture_output=True,
                                                           text=True).stdout.splitlines() if "release" in l), "nvcc")
    if args.token_only:
        text = "\n".join(["# The token program by its compiled code", "",
                          "Command: `" + " ".join(["bench/cuda_sass_stats.py"] + sys.argv[1:]) + "`; " +
                          nvcc_version + f"; {args.dtype}."] + token_section(token_rows, args.token_T)) + "\n"
        print(text)
        if args.md:
            Path(args.md).write_text(text)
        return
    cols = list(rows[0].keys())
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    lines = ["# The CUDA kernels by their compiled code", "",
             "Command: `" + " ".join(["bench/cuda_sass_stats.py"] + sys.argv[1:]) + "`; " + nvcc_version +
             f"; {args.dtype}; per warp and iteration of the steady-state main loop (bench/README.md).", "",
             "| encoding | kernel | d_h | arch | regs | spills st/ld (B) | stack (B) | smem (B) | "
             "blocks/SM (limit) | instrs / iter | MFLOP / iter | instrs / MFLOP | HMMA % | MUFU | "
             "LDSM/STSM | cp.async | LDS/STS | LDG/STG | atomics | BAR | SHFL | LDL+STL | "
             "smem B / kFLOP (LSU + wgmma) |",
             "| --- " * 23 + "|"]
    for r in rows:
        lines.append(
            f"| {r['encoding']} | {r['kernel']} | {r['hd']} | {r['arch']} | {r['regs']} | "
            f"{r['spill_st']}/{r['spill_ld']} | {r['stack']} | {r['smem']} | "
            f"{r['blocks_per_sm']} ({r['occupancy_limit']}) | {r['loop_instrs']} | {r['mflop']} | "
            f"{r['instrs_per_mflop']} | {r['hmma_share']} | {r['mufu']} | {r['ldsm']}/{r['stsm']} | "
            f"{r['cp_async']} | {r['lds']}/{r['sts']} | {r['ldg']}/{r['stg']} | {r['atomics']} | "
            f"{r['bar']} | {r['shfl']} | {r['local']} | {r['smem_b_per_kflop']} + {r['wgmma_b_per_kflop']} |")
    lines.append("")
    lines.append(f"FlashAttention-2 (issue 14; sm_90, bf16, d_h = 128): forward {FA2['forward']['ipm']} "
                 f"instrs/MFLOP, HMMA {FA2['forward']['hmma']}%; backward {FA2['backward']['ipm']} "
                 f"instrs/MFLOP, HMMA {FA2['backward']['hmma']}%. The bar: <= 1.3x (1,150 forward, "
                 f"960 backward), HMMA >= 20%, no spills.")
    lines.append("")
    lines.append(f"FlashAttention-3 (sm_90a, bf16, d_h = 128, built beside the project; docs/cuda.md): causal "
                 f"{FA3['causal']['ipm']} instrs/MFLOP ({FA3['causal']['instrs']} per iteration, "
                 f"{FA3['causal']['hgmma']} HGMMA, {FA3['causal']['mufu']} MUFU), non-causal "
                 f"{FA3['non-causal']['ipm']} ({FA3['non-causal']['instrs']}, {FA3['non-causal']['hgmma']} HGMMA): "
                 "the reference for the hopper_forward rows.")
    lines.append("")
    lines.append(f"FlashAttention-3's backward (sm_90a, bf16, d_h = 128, causal; FA3_BWD in this script): "
                 f"{FA3_BWD['ipm']} instrs/MFLOP ({FA3_BWD['instrs']} per consumer warp and iteration, "
                 f"{FA3_BWD['hgmma']} HGMMA), {FA3_BWD['lsu_b_per_kflop']} + {FA3_BWD['wgmma_b_per_kflop']} "
                 "bytes of shared memory per kFLOP: the reference for the backward_wgmma rows, whose bar is "
                 f"<= 1.3x ({round(1.3 * FA3_BWD['ipm'])}). Its rows' registers are the launch's (384 threads: "
                 "168); the consumer warpgroups run with 240 (setmaxnreg), the producer warpgroup with 24, "
                 "whose loop (TMA loads, the semaphore's turns, the dQ' tiles' TMA reductions) is not counted: the "
                 "consumers' instruction stream is.")
    lines.append("")
    lines.append(f"Shared memory per kFLOP: FlashAttention-2's backward (PyTorch's build, sm_90, bf16, d_h = 128, "
                 f"causal; FA2_SMEM in this script) {FA2_SMEM['bytes_per_kflop']} bytes through the load/store "
                 "unit (0 by wgmma). At 128 bytes per cycle per SM that pipe alone bounds an mma.sync kernel "
                 "at 128 / (bytes per FLOP) FLOP per cycle per SM: at 63 bytes per kFLOP about 530 TFLOP/s "
                 "on an H100 SXM (132 SMs at its 1.98 GHz boost clock), at 96 about 350.")
    bar = {"forward": 1150, "forward_split": 1150, "hopper_forward": 1150, "hopper_forward3": 1150, "backward": 960, "backward_narrow": 960, "backward_sub": 960,
           "backward_wgmma": round(1.3 * FA3_BWD["ipm"]), "backward_anyorder": 960, "backward_dqtma": 960, "backward_square": 960,
           "backward_square_tma": 960}
    lines.append("")
    lines.append("Against the bar (d_h = 128):")
    lines.append("")
    for r in rows:
        if r["hd"] != 128 or not r["instrs_per_mflop"]:
            continue
        if r["blocks_per_sm"] == 0:  # the flash backward's wide layout on sm_86/89: never launched
            lines.append(f"- {r['encoding']} {r['kernel']} {r['arch']}: not launched there (its shared "
                         f"memory exceeds a block's)")
            continue
        misses = []
        if r["instrs_per_mflop"] > bar[r["kernel"]]:
            misses.append(f"{r['instrs_per_mflop']} > {bar[r['kernel']]} instrs/MFLOP")
        # One HGMMA (m64nNk16, per warp a quarter of 64 x N x 16) does N / 8 times an HMMA
        # m16n8k16's work: the tensor-core instruction share applies to the mma.sync kernels.
        if r["kernel"] not in ("hopper_forward", "hopper_forward3", "backward_wgmma") and r["hmma_share"] < 20:
            misses.append(f"HMMA {r['hmma_share']}% < 20%")
        if r["spill_st"] or r["spill_ld"]:
            misses.append(f"spills {r['spill_st']}/{r['spill_ld']} B")
        lines.append(f"- {r['encoding']} {r['kernel']} {r['arch']}: " +
                     ("meets it" if not misses else "misses it: " + ", ".join(misses)))
    lines += token_section(token_rows, args.token_T)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
