#!/usr/bin/env python3
"""Hardware counters of APE's CUDA kernels for one training step, read by Nsight Compute.

    ncu --profile-from-start off --csv --page raw --metrics METRICS \\
        python bench/gpu_counters.py --libs LIBDIR [--encodings nope,rope] [--config 1x16x8192x128]
    python bench/gpu_counters.py --metrics          # prints METRICS (the list ncu is given)

Each encoding's operator library (as bench/gpu_bench.py loads it: LIBDIR/ENC_torch_library/build)
runs one forward and backward (bf16, causal, the encoding's default params) twice outside the
profiler, then once between cudaProfilerStart and cudaProfilerStop: ncu (with --profile-from-start
off) reads only that step's kernels, each replayed for its counters under ncu's fixed clocks. The
bytes read here are what the emulator's count (ape-cuda-traffic, bench/results/cuda_traffic.md)
predicts: requests from the SMs to L2 (lts__t_bytes) and the part that reaches DRAM.
`scripts/gpu-check.sh run --stages build,counters` runs it and writes LOGDIR/gpu_counters.csv.
"""
import argparse
import os
import sys

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "lts__t_sectors_op_atom.sum",
    "lts__t_sectors_op_red.sum",
    "smsp__inst_executed.sum",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
]


def summarize(path, encodings, config):
    """One Markdown row per profiled kernel: its name (the function, the encoding it was generated
    for), time, DRAM and L2 bytes, atomic/reduction sectors, instructions, registers, occupancy."""
    import csv
    import re
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own lines ("==PROF==") are not CSV
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print(f"gpu_counters: no kernels in {path}", file=sys.stderr)
        return 1
    head, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(head)}

    def num(r, m):
        try:
            return float(r[col[m]].replace(",", ""))
        except (KeyError, ValueError):
            return float("nan")

    def scale(m):  # ncu may report bytes in KB/MB/GB and time in us/ms: back to bytes and ms
        u = units[col[m]] if m in col else ""
        return {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1e-6, "usecond": 1e-3,
                "msecond": 1.0, "second": 1e3}.get(u, 1.0)
    print(f"| kernel | encoding | ms | DRAM GB | L2 GB | atom+red sectors (M) | instructions (M) | regs | warps active % | SM % | L2 % | DRAM % |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    B, H, T, D = (int(x) for x in config.split("x"))
    for r in data:
        name = r[col["Kernel Name"]] if "Kernel Name" in col else "?"
        fn = re.split(r"[<(]", name)[0].split("::")[-1].strip()
        enc = next((e for e in encodings if re.search(rf"\b{e}\b|_{e}_|ape_{e}", name)), "")
        g = lambda m: num(r, m) * scale(m)
        print(f"| {fn} | {enc} | {g('gpu__time_duration.sum'):.3f} | "
              f"{(g('dram__bytes_read.sum') + g('dram__bytes_write.sum')) / 1e9:.3f} | {g('lts__t_bytes.sum') / 1e9:.3f} | "
              f"{(num(r, 'lts__t_sectors_op_atom.sum') + num(r, 'lts__t_sectors_op_red.sum')) / 1e6:.1f} | "
              f"{num(r, 'smsp__inst_executed.sum') / 1e6:.1f} | {num(r, 'launch__registers_per_thread'):.0f} | "
              f"{num(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.1f} | "
              f"{num(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
              f"{num(r, 'lts__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
              f"{num(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} |")
    print(f"\nB {B}, H {H}, T {T}, D {D}, bf16, causal; one forward and backward per encoding, each kernel "
          "replayed by ncu under its fixed clocks (times are ncu's, not the benchmark's).")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", help="the operator libraries' folder (as bench/gpu_bench.py --libs)")
    ap.add_argument("--encodings", default="nope,rope")
    ap.add_argument("--config", default="1x16x8192x128", help="BxHxTxD (default %(default)s)")
    ap.add_argument("--metrics", action="store_true", help="print the metrics for ncu --metrics and exit")
    ap.add_argument("--summarize", metavar="NCU_CSV",
                    help="print a Markdown table of ncu's --csv --page raw output (one row per kernel) and exit")
    args = ap.parse_args()
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.summarize:
        return summarize(args.summarize, [e for e in args.encodings.split(",") if e], args.config)
    if not args.libs:
        ap.error("--libs is required")
    B, H, T, D = (int(x) for x in args.config.split("x"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import gpu_bench
    gpu_bench.torch, gpu_bench.F = torch, torch.nn.functional
    if not torch.cuda.is_available():
        print("gpu_counters: no CUDA device", file=sys.stderr)
        return 2
    cudart = torch.cuda.cudart()
    for enc in [e for e in args.encodings.split(",") if e]:
        helper, ops = gpu_bench.load_helper(args.libs, enc)
        case = gpu_bench.Case(enc, helper, ops, (B, H, T, D), "cuda", 0)

        def step():
            o = helper.attention(case.q, case.k, case.v, case.features, case.params)
            torch.autograd.grad(o, case.leaves, case.dout)
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        print(f"[gpu_counters] {enc} B{B} H{H} T{T} D{D}: profiling one forward+backward", file=sys.stderr,
              flush=True)
        cudart.cudaProfilerStart()
        step()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
