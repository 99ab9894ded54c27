#!/usr/bin/env python3
"""A model of the flash backward's grid: where its blocks' steps end, in steps (no GPU needed).

The flash backward (kernels/include/ape/cuda/flash_backward.cuh) runs a block per (slice, key tile
kt) of BK keys; a block walks the query tiles that see its keys, from its diagonal (BK / BQ tiles
per key tile) to the last, one step per query tile of BQ queries. With dQ' in the semaphores' order
(deterministic), the block of key tile kt adds to query tile qt only after key tile kt + 1 has
(highest key tile first), and it needs that turn half way through its step. The grid is 1-D and
slice-major, highest key tile first within a slice; the GPU starts each block, in grid order, on
the first SM that frees (one block per SM: the wgmma layout's 181 KB of shared memory).

Every step costs 1 but key tile 0's, which cost F0 (--f0): where key tile 0 writes dq
(dq_direct) each of its steps first reads the sums of the higher key tiles. The model prints, per
configuration, the steps from the first block's start to the last block's end (the makespan),
against the bound (all steps over all SMs), for F0 = 1 and each --f0, and the ratio to F0 = 1: the
slowdown key tile 0's extra work costs the whole backward, which its share of the steps (1/64 at
T 8192) does not show, because that block is the last of its slice to start and the longest.

Checked against the H200 (bench/results/gpu_h200.md, 2026-12-04: the backward in order over in any
order, 1.09x for NoPE and Cable, whose key tile 0 wrote dq, 1.02x for RoPE, whose did not): at
F0 = 1.6 the model gives 1.085x at B 2, H 16, T 8192.

  python3 bench/bwd_schedule.py --configs 2x16x8192,8x16x2048,1x16x16384,1x32x4096 --f0 1.2 1.6
"""
import argparse
import heapq


def makespan(slices, n_kt, n_qt, per_kt, sms, f0=1.0):
    """Steps until the last block ends: blocks start in grid order on the first free SM; a step on
    query tile qt waits (half a step in) for key tile kt + 1's step on qt."""
    free = [0.0] * sms
    heapq.heapify(free)
    end = 0.0
    for s in range(slices):
        above = None  # key tile kt + 1's step ends, by query tile
        for kt in reversed(range(n_kt)):
            t = heapq.heappop(free)
            cost = f0 if kt == 0 else 1.0
            first = per_kt * kt
            ends = []
            for qt in range(first, n_qt):
                start = t
                if above is not None and qt >= first + per_kt:
                    start = max(start, above[qt - first - per_kt] - 0.5 * cost)
                t = start + cost
                ends.append(t)
            above = ends
            end = max(end, t)
            heapq.heappush(free, t)
    return end


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="2x16x8192,8x16x2048,1x16x16384,1x32x4096",
                    help="BxHxT,... (default %(default)s)")
    ap.add_argument("--sms", type=int, default=132, help="SMs (default 132: H100 SXM, H200)")
    ap.add_argument("--bq", type=int, default=64, help="queries per step (default 64: the wgmma layout)")
    ap.add_argument("--bk", type=int, default=128, help="keys per block (default 128)")
    ap.add_argument("--f0", type=float, nargs="+", default=[1.2, 1.6], help="key tile 0's step cost")
    args = ap.parse_args()
    if args.bk % args.bq or args.sms < 1:
        ap.error("--bk must be a multiple of --bq, --sms positive")
    print(f"# The flash backward's grid by the model (bench/bwd_schedule.py): {args.sms} SMs, "
          f"BQ {args.bq}, BK {args.bk}, one block per SM\n")
    head = "| B x H x T | blocks | bound (steps) | F0 = 1 | " + " | ".join(f"F0 = {f:g}" for f in args.f0) + " |"
    print(head)
    print("|" + " --- |" * (4 + len(args.f0)))
    for cfg in args.configs.split(","):
        try:
            b, h, t = (int(x) for x in cfg.lower().split("x"))
        except ValueError:
            ap.error(f"bad config {cfg!r}: want BxHxT")
        if b < 1 or h < 1 or t < args.bk or t % args.bk:
            ap.error(f"bad config {cfg!r}: T a multiple of BK ({args.bk}), B and H positive")
        slices, n_kt, n_qt, per_kt = b * h, t // args.bk, t // args.bq, args.bk // args.bq
        steps = slices * sum(n_qt - per_kt * kt for kt in range(n_kt))
        bound = steps / args.sms
        base = makespan(slices, n_kt, n_qt, per_kt, args.sms)
        cells = [f"{base:.0f} ({base / bound:.3f} of the bound)"]
        for f in args.f0:
            m = makespan(slices, n_kt, n_qt, per_kt, args.sms, f)
            cells.append(f"{m:.0f} ({m / base:.3f}x F0 = 1)")
        print(f"| {cfg} | {slices * n_kt} | {bound:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
