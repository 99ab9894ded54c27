#!/usr/bin/env python3
"""The exported PyTorch operator against APE's own kernel, at every instruction-set level.

    APE_VENV=.venv .venv/bin/python bench/cpu_levels_bench.py --build build \\
        [--encodings rope,alibi] [--T 2048] [--B 1] [--H 8] [--D 64] [--threads 2] [--rounds 3] \\
        [--md out.md] [--csv out.csv]

1. Builds the operator library of each encoding exactly as docs/frameworks.md says:
       apec examples/encodings/ENC.mlir -o WORK --emit=torch-library
       cmake -S WORK/ENC_torch_library -B WORK/ENC_torch_library/build -DAPE_PYTHON=<this python>
       cmake --build WORK/ENC_torch_library/build
2. Times, in fresh processes (a library chooses its level once per process), fp32 forward and
   forward + backward of
     - "runtime": APE's own kernel, ape_kernels through the registry, as ape-train calls it
       (build/bench/ape-bench-attention --one ape ENC T: raw forward_f32 + backward_f32);
     - "operator": torch.ops.ape_ENC.attention from Python (autograd: the output and the
       gradients of q, k, v and of the features are allocated by the call, as in a model),
   with APE_CPU_LEVEL set to each level this CPU runs, and unset ("auto": must be the best).
   Each process warms up once, then repeats until --min-reps and --min-time are reached and
   reports its median; the rounds interleave methods and levels, and the table gives the median
   over rounds. Both report the level they ran at; a mismatch aborts.
   With --native-bench, an ape-bench-attention built before CPU dispatch (-march=native) is timed
   too, as the "native build" row (its operator column repeats "auto").
3. Prints a markdown table (and writes --md / --csv): ms per level and method, operator / runtime.

Internal: --child-op LIBDIR ENC T runs one operator measurement and prints a RESULT line.
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_library import ROOT, build_library, library_dir, load_helper, result, run  # noqa: E402
from torch_library import loadavg as uptime  # noqa: E402
LEVELS = ["baseline", "avx2", "avx512"]


# ---- child: one operator measurement --------------------------------------------------------------

def child_op(args):
    import torch

    torch.set_num_threads(args.threads)
    h = load_helper(args.child_op, args.enc)
    ops = h.load()
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.B, args.H, args.T, args.D)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, generator=g)
    features = [torch.randn(shape[:3], generator=g).requires_grad_() for _ in h.FEATURES]
    init = h.init_params(args.H, args.D)
    missing = [n for n in h.PARAMS if n not in init]
    if missing:
        sys.exit(f"{args.enc}: params without a manifest initialiser: {missing}")
    params = [init[n] for n in h.PARAMS]
    leaves = [q, k, v, *features, *[p for p in params if p.requires_grad]]

    def forward():
        with torch.no_grad():
            ops.attention(q, k, v, *features, *params)

    def forward_backward():
        o = ops.attention(q, k, v, *features, *params)
        o.backward(dout)
        for t in leaves:
            t.grad = None

    def median_ms(fn):
        fn()  # warm-up
        times, start = [], time.perf_counter()
        while len(times) < args.min_reps or time.perf_counter() - start < args.min_time:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), len(times)

    fwd, _ = median_ms(forward)
    fb, reps = median_ms(forward_backward)
    print(f"RESULT fwd_ms={fwd:.6f} fwdbwd_ms={fb:.6f} fwdbwd_reps={reps} level={ops.cpu_level()}")


# ---- parent ---------------------------------------------------------------------------------------

def runnable_levels(bench):
    # The runtime's own detection, checked against /proc/cpuinfo by the test suite.
    levels = []
    for level in LEVELS:
        env = dict(os.environ, APE_CPU_LEVEL=level)
        p = subprocess.run([bench, "--one", "ape", "nope", "64", "--min-reps", "1", "--min-time", "0"],
                           env=env, capture_output=True, text=True)
        if p.returncode == 0:
            levels.append(level)
    return levels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="APE's build folder")
    ap.add_argument("--work", default=None, help="folder for the emitted libraries (default BUILD/cpu-levels-bench)")
    ap.add_argument("--encodings", default="rope,alibi")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-build", action="store_true", help="reuse the libraries in --work")
    ap.add_argument("--native-bench", help="an ape-bench-attention built before CPU dispatch, with "
                    "-march=native (e.g. an older checkout's build/bench/ape-bench-attention): timed "
                    "once per round as the row 'native build'")
    ap.add_argument("--md", help="also write the markdown table here")
    ap.add_argument("--csv", help="also write one row per (encoding, level, method) here")
    ap.add_argument("--child-op", help=argparse.SUPPRESS)
    ap.add_argument("--enc", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_op:
        return child_op(args)

    args.apec = os.path.join(args.build, "tools", "apec")
    bench = os.path.join(args.build, "bench", "ape-bench-attention")
    args.work = args.work or os.path.join(args.build, "cpu-levels-bench")
    for f in (args.apec, bench):
        if not os.access(f, os.X_OK):
            sys.exit(f"{f} is missing: build it first (scripts/build.sh apec ape-bench-attention)")
    encodings = args.encodings.split(",")
    os.makedirs(args.work, exist_ok=True)
    load_start = uptime()
    libs, builds = {}, {}
    for enc in encodings:
        if args.skip_build:
            libs[enc] = library_dir(args.work, enc)
        else:
            libs[enc], conf_s, build_s = build_library(args.apec, args.work, enc)
            builds[enc] = (conf_s, build_s)
            print(f"[build] {enc}: configure {conf_s:.1f} s, build {build_s:.1f} s", file=sys.stderr)
    levels = runnable_levels(bench) + ["auto"]
    print(f"[bench] levels this CPU runs: {', '.join(levels[:-1])}", file=sys.stderr)
    shape = ["--B", str(args.B), "--H", str(args.H), "--D", str(args.D), "--threads", str(args.threads),
             "--min-reps", str(args.min_reps), "--min-time", str(args.min_time), "--seed", str(args.seed)]
    samples = {}  # (enc, level, method) -> [(fwd, fwdbwd, level ran)]
    for r in range(args.rounds):
        for enc in encodings:
            for level in levels:
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
                env.pop("APE_CPU_LEVEL", None)
                if level != "auto":
                    env["APE_CPU_LEVEL"] = level
                methods = ["runtime", "operator"] if r % 2 == 0 else ["operator", "runtime"]
                for method in methods:
                    if method == "runtime":
                        cmd = [bench, "--one", "ape", enc, str(args.T), *shape]
                    else:
                        cmd = [sys.executable, os.path.abspath(__file__), "--child-op", libs[enc],
                               "--enc", enc, "--T", str(args.T), *shape]
                    res = result(run(cmd, env=env, what=f"{method} {enc} {level}"))
                    ran = res.get("level")
                    want = levels[-2] if level == "auto" else level
                    if ran != want:
                        sys.exit(f"{method} {enc} APE_CPU_LEVEL={level}: ran at {ran}, expected {want}")
                    samples.setdefault((enc, level, method), []).append(
                        (float(res["fwd_ms"]), float(res["fwdbwd_ms"])))
                if args.native_bench and level == "auto":
                    res = result(run([args.native_bench, "--one", "ape", enc, str(args.T), *shape], env=env,
                                     what=f"native build {enc}"))
                    samples.setdefault((enc, "native", "runtime"), []).append(
                        (float(res["fwd_ms"]), float(res["fwdbwd_ms"])))
                    print(f"[round {r + 1}] {enc:6} native   runtime  fwd {float(res['fwd_ms']):8.2f} ms"
                          f"  fwd+bwd {float(res['fwdbwd_ms']):8.2f} ms  (load {uptime()})", file=sys.stderr)
                    print(f"[round {r + 1}] {enc:6} {level:8} {method:8} fwd {float(res['fwd_ms']):8.2f} ms"
                          f"  fwd+bwd {float(res['fwdbwd_ms']):8.2f} ms  (load {uptime()})", file=sys.stderr)
    load_end = uptime()

    med = {key: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
           for key, v in samples.items()}
    lines = [f"fp32, causal, B={args.B} H={args.H} T={args.T} D={args.D}, {args.threads} threads; "
             f"median of {args.rounds} processes, each the median of >= {args.min_reps} reps and "
             f">= {args.min_time:g} s; load average {load_start} at the start, {load_end} at the end.",
             "",
             "| encoding | level | runtime fwd ms | operator fwd ms | runtime fwd+bwd ms | operator fwd+bwd ms "
             "| operator / runtime (fwd+bwd) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    rows = []
    for enc in encodings:
        for level in levels:
            rf, rfb = med[(enc, level, "runtime")]
            of, ofb = med[(enc, level, "operator")]
            label = f"auto ({levels[-2]})" if level == "auto" else level
            lines.append(f"| {enc} | {label} | {rf:.1f} | {of:.1f} | {rfb:.1f} | {ofb:.1f} | {ofb / rfb:.3f} |")
            for method, (f, fb) in (("runtime", (rf, rfb)), ("operator", (of, ofb))):
                rows.append([enc, level, method, f"{f:.3f}", f"{fb:.3f}"])
        if (enc, "native", "runtime") in med:
            nf, nfb = med[(enc, "native", "runtime")]
            of, ofb = med[(enc, "auto", "operator")]
            lines.append(f"| {enc} | native build (-march=native, no dispatch) | {nf:.1f} | {of:.1f} | {nfb:.1f} "
                         f"| {ofb:.1f} | {ofb / nfb:.3f} |")
            rows.append([enc, "native", "runtime", f"{nf:.3f}", f"{nfb:.3f}"])
    if builds:
        lines += ["", "Library builds (as documented; serial `cmake --build`): " +
                  "; ".join(f"{e} configure {c:.1f} s, build {b:.1f} s" for e, (c, b) in builds.items())]
    table = "\n".join(lines)
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["encoding", "level", "method", "fwd_ms", "fwdbwd_ms"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
