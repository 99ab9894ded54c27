#!/usr/bin/env python3
"""Hardware counters of APE's CUDA kernels for one training step, read by Nsight Compute.

    ncu --profile-from-start off --csv --page raw [--print-units base] --metrics METRICS \\
        --log-file ENC.csv python bench/gpu_counters.py --libs LIBDIR --encodings ENC [--config 1x16x8192x128]
    python bench/gpu_counters.py --summarize nope=nope.csv rope=rope.csv [--config 1x16x8192x128]
    python bench/gpu_counters.py --metrics          # prints METRICS (the list ncu is given)

Each encoding's operator library (as bench/gpu_bench.py loads it: LIBDIR/ENC_torch_library/build)
runs one forward and backward (bf16, causal, the encoding's default params) twice outside the
profiler, then once between cudaProfilerStart and cudaProfilerStop: ncu (with --profile-from-start
off) reads only that step's kernels, each replayed for its counters under ncu's fixed clocks. The
bytes read here are what the emulator's count (ape-cuda-traffic, bench/results/cuda_traffic.md)
predicts: requests from the SMs to L2 (lts__t_bytes) and the part that reaches DRAM.

Run ncu once per encoding, one CSV each: the kernels' names do not say which encoding they were
generated for (every library has its hopper_forward_kernel, flash_backward_kernel, ...), so the
file does. --summarize takes ENC=CSV per encoding and prints one row per kernel labelled ENC (its
time, its share of the step, DRAM and L2 bytes, atomics, instructions, registers, occupancy), then
per encoding the step's totals: time, DRAM and L2 GB, TFLOP/s and bytes per FLOP by FlashAttention's
count. ncu's units are converted whichever way it spells them: time ns/nsecond, us/usecond,
ms/msecond, s/second; bytes byte/B, Kbyte/KB, Mbyte/MB, Gbyte/GB, KiB, MiB, GiB; counts with a K/M/G
prefix. A unit it does not know is printed unscaled, and the column header and a note say so.
`scripts/gpu-check.sh run --stages build,counters` runs it for nope and rope and writes
LOGDIR/gpu_counters.md.
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


# ncu's unit strings (its own spellings differ between versions, and with --print-units auto it
# picks a prefix per value): to ms, to bytes; counts to 1; percentages as they are.
TIME_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
           "s": 1e3, "second": 1e3}
BYTES = {"byte": 1.0, "B": 1.0, "Kbyte": 1e3, "KB": 1e3, "kB": 1e3, "Mbyte": 1e6, "MB": 1e6,
         "Gbyte": 1e9, "GB": 1e9, "Tbyte": 1e12, "TB": 1e12, "KiB": 1024.0, "Kibyte": 1024.0,
         "MiB": 1024.0 ** 2, "Mibyte": 1024.0 ** 2, "GiB": 1024.0 ** 3, "Gibyte": 1024.0 ** 3}
COUNT_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
COUNT_BASES = {"", "inst", "instruction", "sector", "request", "warp", "thread", "block", "cycle",
               "register/thread", "register", "byte/block"}


def unit_factor(metric, unit):
    """What multiplies ncu's value of `metric` in `unit` into this table's unit (ms, bytes, a plain
    count, a percentage); None for a unit this script does not know."""
    unit = unit.strip()
    if "duration" in metric:
        return TIME_MS.get(unit)
    if "bytes" in metric:
        return BYTES.get(unit)
    if "pct" in metric:
        return 1.0 if unit in ("%", "") else None
    for prefix in sorted(COUNT_PREFIX, key=len, reverse=True):
        if unit.startswith(prefix) and unit[len(prefix):] in COUNT_BASES:
            return COUNT_PREFIX[prefix]
    return None


def read_ncu_csv(path):
    """(header, units, rows) of ncu's --csv --page raw log: the first quoted line is the header, the
    second the units, then one line per kernel; ncu's own lines ("==PROF==", "==WARNING==") and
    the program's output are not CSV and are skipped."""
    import csv
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 2:
        return None, None, []
    return rows[0], rows[1], rows[2:]


def parse_inputs(items, encodings):
    """[(encoding, path)] of --summarize's ENC=CSV items (a bare CSV: the encoding is the one of
    --encodings when it names one, else '?')."""
    import re
    out = []
    for item in items:
        m = re.fullmatch(r"([A-Za-z_][\w.-]*)=(.+)", item)
        if m and not os.path.exists(item):
            out.append((m.group(1), m.group(2)))
        else:
            out.append((encodings[0] if len(encodings) == 1 else "?", item))
    return out


def summarize(inputs, config):
    """Markdown: one row per profiled kernel, labelled by its encoding (one ncu CSV per encoding):
    time, its share of the encoding's step, DRAM and L2 bytes, atomic/reduction sectors,
    instructions, registers, occupancy; then per encoding the totals and bytes per FLOP."""
    import re
    B, H, T, D = (int(x) for x in config.split("x"))
    flops = 3.5 * 2.0 * B * H * T * T * D  # FlashAttention's causal count, forward + backward
    unknown = {}  # metric -> {unit: [encodings]}
    notes, kernels, totals, empty = [], [], [], []
    for enc, path in inputs:
        try:
            head, units, data = read_ncu_csv(path)
        except OSError as exc:
            notes.append(f"{enc}: {path} not read ({exc.strerror})")
            empty.append(path)
            continue
        if not data:
            notes.append(f"{enc}: no kernels in {path}")
            empty.append(path)
            continue
        col = {name: i for i, name in enumerate(head)}
        missing = [m for m in METRICS if m not in col]
        if missing:
            notes.append(f"{enc}: {path} has no column for {', '.join(missing)} (nan)")

        def factor(m):
            if m not in col:
                return 1.0
            u = units[col[m]] if col[m] < len(units) else ""
            f = unit_factor(m, u)
            if f is None:
                unknown.setdefault(m, {}).setdefault(u, []).append(enc)
                return 1.0
            return f
        scale = {m: factor(m) for m in METRICS}

        def getter(r, col=col, scale=scale):  # m -> the kernel's value of metric m, in this table's unit
            def g(m):
                try:
                    return float(r[col[m]].replace(",", "")) * scale[m]
                except (KeyError, IndexError, ValueError):
                    return float("nan")
            return g
        rows = []
        for r in data:
            name = r[col["Kernel Name"]] if "Kernel Name" in col and col["Kernel Name"] < len(r) else "?"
            rows.append((re.split(r"[<(]", name)[0].split("::")[-1].strip() or name, getter(r)))
        step_ms = sum(g("gpu__time_duration.sum") for _, g in rows)
        dram = sum(g("dram__bytes_read.sum") + g("dram__bytes_write.sum") for _, g in rows)
        l2 = sum(g("lts__t_bytes.sum") for _, g in rows)
        kernels += [(enc, fn, g, step_ms) for fn, g in rows]
        odd = {m for m in unknown if enc in sum(unknown[m].values(), [])}  # this file's unscaled metrics
        totals.append((enc, len(rows), step_ms, dram, l2, odd))

    def flagged(title, *metrics):  # a column whose unit was not understood says so
        bad = sorted({u for m in metrics for u in unknown.get(m, {})})
        return title + (f" [unit {', '.join(repr(u) for u in bad)}: unscaled]" if bad else "")
    ms_col = flagged("ms", "gpu__time_duration.sum")
    dram_col = flagged("DRAM GB", "dram__bytes_read.sum", "dram__bytes_write.sum")
    l2_col = flagged("L2 GB", "lts__t_bytes.sum")
    print(f"| encoding | kernel | {ms_col} | % of step | {dram_col} | {l2_col} | "
          f"{flagged('atom+red sectors (M)', 'lts__t_sectors_op_atom.sum', 'lts__t_sectors_op_red.sum')} | "
          f"{flagged('instructions (M)', 'smsp__inst_executed.sum')} | "
          f"{flagged('regs', 'launch__registers_per_thread')} | warps active % | SM % | L2 % | DRAM % |")
    print("| --- | --- |" + " ---: |" * 11)
    for enc, fn, g, step_ms in kernels:
        t = g("gpu__time_duration.sum")
        print(f"| {enc} | {fn} | {t:.3f} | {100 * t / step_ms if step_ms else float('nan'):.1f} | "
              f"{(g('dram__bytes_read.sum') + g('dram__bytes_write.sum')) / 1e9:.3f} | "
              f"{g('lts__t_bytes.sum') / 1e9:.3f} | "
              f"{(g('lts__t_sectors_op_atom.sum') + g('lts__t_sectors_op_red.sum')) / 1e6:.1f} | "
              f"{g('smsp__inst_executed.sum') / 1e6:.1f} | {g('launch__registers_per_thread'):.0f} | "
              f"{g('sm__warps_active.avg.pct_of_peak_sustained_active'):.1f} | "
              f"{g('sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
              f"{g('lts__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
              f"{g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} |")
    print(f"\nB {B}, H {H}, T {T}, D {D}, bf16, causal; one forward and backward per encoding, each kernel "
          "replayed by ncu under its fixed clocks (times are ncu's, not the benchmark's).")
    if totals:
        print(f"\n## Per encoding: the step's kernels together\n\nFLOP by FlashAttention's count for a causal "
              f"forward and backward: 3.5 * 2*B*H*T*T*D = {flops / 1e9:.1f} GFLOP (rotary, biases and the "
              "small kernels not counted); TFLOP/s at ncu's clocks, kernels one at a time.\n")
        print(f"| encoding | kernels | {ms_col} | {dram_col} | {l2_col} | TFLOP/s | DRAM bytes/FLOP | L2 bytes/FLOP |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for enc, n, step_ms, dram, l2, odd in totals:
            bad_t = "gpu__time_duration.sum" in odd
            bad_d = bool(odd & {"dram__bytes_read.sum", "dram__bytes_write.sum"})
            bad_l = "lts__t_bytes.sum" in odd
            tflops = "?" if bad_t or step_ms <= 0 else f"{flops / (step_ms * 1e-3) / 1e12:.0f}"
            print(f"| {enc} | {n} | {step_ms:.3f} | {dram / 1e9:.3f} | {l2 / 1e9:.3f} | {tflops} | "
                  f"{'?' if bad_d else f'{dram / flops:.4f}'} | {'?' if bad_l else f'{l2 / flops:.4f}'} |")
    for m, by_unit in sorted(unknown.items()):
        for u, encs in by_unit.items():
            notes.append(f"ncu gave {m} in {u!r} ({', '.join(encs)}), a unit this script does not know: "
                         "printed unscaled")
    if notes:
        print("\n" + "\n".join(f"- note: {n}" for n in notes))
    print("\nTotal kernel time per step (ncu's clocks): " + ("; ".join(
        f"{enc} {step_ms:.3f} " + ("(unscaled: unknown unit)" if "gpu__time_duration.sum" in odd else "ms")
        for enc, _, step_ms, _, _, odd in totals) or "none"))
    if empty:  # the table has what the other files gave
        print("gpu_counters: no kernels from " + ", ".join(empty), file=sys.stderr)
        return 1
    return 0


def stalls(path, top=12):
    """Where a kernel's warps wait: from ncu's --csv --page raw log of the WarpStateStats section,
    each kernel's smsp__average_warps_issue_stalled_REASON_per_issue_active ratios (warps stalled
    for REASON per issued instruction), largest first, with cycles per issued instruction."""
    import csv
    import re
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(ln for ln in f if ln.startswith('"')))
    except OSError as exc:
        print(f"gpu_counters: {exc}", file=sys.stderr)
        return 1
    if len(rows) < 3:
        print(f"gpu_counters: no kernels in {path}", file=sys.stderr)
        return 1
    head, data = rows[0], rows[2:]
    pat = re.compile(r"^smsp__average_warps_issue_stalled_(.+)_per_issue_active\.ratio$")
    reasons = [(i, m.group(1)) for i, h in enumerate(head) if (m := pat.match(h))]
    name_col = head.index("Kernel Name") if "Kernel Name" in head else None
    for r in data:
        name = r[name_col] if name_col is not None else "?"
        vals = []
        for i, reason in reasons:
            try:
                vals.append((float(r[i].replace(",", "")), reason))
            except ValueError:
                pass
        vals.sort(reverse=True)
        total = sum(v for v, _ in vals)
        print(f"{name.split('(')[0][:100]}: {total:.1f} warp-cycles stalled per issued instruction")
        print("| stall reason | warps per issued instruction | share |")
        print("| --- | --- | --- |")
        for v, reason in vals[:top]:
            print(f"| {reason} | {v:.2f} | {100 * v / total if total else 0:.0f}% |")
        print()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", help="the operator libraries' folder (as bench/gpu_bench.py --libs)")
    ap.add_argument("--encodings", default="nope,rope")
    ap.add_argument("--config", default="1x16x8192x128", help="BxHxTxD (default %(default)s)")
    ap.add_argument("--metrics", action="store_true", help="print the metrics for ncu --metrics and exit")
    ap.add_argument("--summarize", nargs="+", metavar="ENC=NCU_CSV",
                    help="print a Markdown table of ncu's --csv --page raw logs, one per encoding (one row "
                    "per kernel, labelled ENC; per-encoding totals) and exit")
    ap.add_argument("--stalls", metavar="NCU_CSV",
                    help="print each kernel's warp stall reasons from ncu's --section WarpStateStats --csv "
                    "--page raw log and exit")
    args = ap.parse_args()
    if args.stalls:
        return stalls(args.stalls)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.summarize:
        return summarize(parse_inputs(args.summarize, [e for e in args.encodings.split(",") if e]), args.config)
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
