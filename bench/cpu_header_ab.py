#!/usr/bin/env python3
"""Same-window A/B of the CPU kernel headers: an encoding's PyTorch operator library built twice,
with the kernel headers of a base revision and with the working tree's, timed in alternating
processes (bf16 or fp32, B 1, causal; forward under no_grad and forward + backward).

    .venv/bin/python bench/cpu_header_ab.py --build build --base HEAD \\
        --encodings nope,alibi,cable --T 4096 --D 64,128 --dtype bf16

The libraries are emitted by BUILD's apec (`--emit=torch-library`) and built without CUDA under
--work (default BUILD/header-ab); the base side's copy has every header of its `ape/` folder
replaced by the base revision's (`git show REV:kernels/include/ape/...`). Each cell is the
median of --reps steps after 3 warm-ups, in a process of its own; the two sides alternate for
--rounds rounds, so that a change of the machine's speed during the run reaches both. The
outputs of the two sides are compared (max |o_base - o_new| / max |o_base|) so that a change
meant to keep the arithmetic shows it did. Prints a markdown table (and writes it with --md).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_library  # noqa: E402
from ape.build import build, emit  # noqa: E402

ROOT = torch_library.ROOT


def child(args):
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # init_params' draws: the same params on both sides
    h = torch_library.load_helper(args.lib, args.enc)
    H, T, D = args.H, args.T, args.D[0]
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    q, k, v = [torch.randn(1, H, T, D, generator=g).to(dt).requires_grad_() for _ in range(3)]
    feats = [torch.randn(1, H, T, generator=g).to(dt).requires_grad_() for _ in h.FEATURES]
    params = {n: t.detach().to(dt).requires_grad_(t.requires_grad) for n, t in h.init_params(H, D).items()}
    do = torch.randn(1, H, T, D, generator=g).to(dt)

    def fwd():
        with torch.no_grad():
            return h.attention(q, k, v, feats, params)

    def fb():
        h.attention(q, k, v, feats, params).backward(do)

    out = {}
    for name, f in (("fwd", fwd), ("fb", fb)):
        for _ in range(3):
            f()
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            f()
            ts.append((time.perf_counter() - t0) * 1e3)
        out[name] = statistics.median(ts)
    o = fwd().float()
    torch.save(o, args.save)
    print(f"RESULT fwd={out['fwd']:.3f} fb={out['fb']:.3f}")


def headers_of(rev, lib):
    """Replaces every kernel header under lib/ape by rev's kernels/include/ape version."""
    base = os.path.join(lib, "ape")
    n = 0
    for d, _, files in os.walk(base):
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, base)
            if not os.path.exists(os.path.join(ROOT, "kernels", "include", "ape", rel)):
                continue  # emitted for the library (torch_ops.cpp), not a kernel header
            p = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:kernels/include/ape/{rel}"],
                               capture_output=True)
            if p.returncode != 0:
                sys.exit(f"{rev} has no kernels/include/ape/{rel}: pick a nearer base")
            with open(path, "wb") as out:
                out.write(p.stdout)
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--base", default="HEAD", help="the revision of the base side's headers")
    ap.add_argument("--encodings", default="nope,alibi,cable")
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--D", default="64")
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=None)
    ap.add_argument("--skip-build", action="store_true")
    ap.add_argument("--md", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--enc", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.D = [int(x) for x in args.D.split(",")]
    if args.child:
        return child(args)
    import torch
    apec = os.path.join(args.build, "tools", "apec")
    work = args.work or os.path.join(args.build, "header-ab")
    encs = args.encodings.split(",")
    libs = {}
    for enc in encs:
        for side in ("base", "new"):
            lib = os.path.join(work, side, f"{enc}_torch_library")
            libs[enc, side] = lib
            if args.skip_build:
                continue
            shutil.rmtree(lib, ignore_errors=True)
            emit(apec, os.path.join(ROOT, "examples", "encodings", f"{enc}.mlir"), os.path.join(work, side),
                 expect=enc)
            if side == "base":
                headers_of(args.base, lib)
            conf, bld = build(lib, cmake_args=["-DAPE_ENABLE_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release"])
            print(f"[ab] built {enc} ({side}) in {conf + bld:.0f} s", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    times = {}
    diffs = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(args.rounds):
        for enc in encs:
            for D in args.D:
                outs = {}
                for side in ("base", "new") if r % 2 == 0 else ("new", "base"):
                    save = os.path.join(work, f"o-{side}.pt")
                    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--lib", libs[enc, side],
                           "--enc", enc, "--T", str(args.T), "--D", str(D), "--H", str(args.H),
                           "--dtype", args.dtype, "--reps", str(args.reps), "--threads", str(args.threads),
                           "--save", save]
                    res = torch_library.result(torch_library.run(cmd, env=env, what=f"{enc} {side}"))
                    times.setdefault((enc, D, side), []).append((float(res["fwd"]), float(res["fb"])))
                    outs[side] = torch.load(save)
                    print(f"[ab] round {r + 1} {enc} D {D} {side}: fwd {res['fwd']} ms, fwd+bwd {res['fb']} ms",
                          flush=True)
                d = ((outs["base"] - outs["new"]).abs().max() / outs["base"].abs().max()).item()
                diffs[enc, D] = max(diffs.get((enc, D), 0.0), d)
    lines = [f"B 1, H {args.H}, T {args.T}, {args.dtype}, {args.threads} threads; run {started}, load "
             f"{torch_library.loadavg()} at the end; base = headers of {args.base}; per cell the medians "
             f"of {args.reps} steps of each of {args.rounds} rounds (min-max).", "",
             "| encoding | D | base fwd ms | new fwd ms | fwd speed-up | base fwd+bwd ms | new fwd+bwd ms "
             "| fwd+bwd speed-up | max |o_base - o_new| / max |o_base| |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def span(xs):
        return f"{min(xs):.1f}-{max(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"
    for enc in encs:
        for D in args.D:
            b, n = times[enc, D, "base"], times[enc, D, "new"]
            bf, nf = [x[0] for x in b], [x[0] for x in n]
            bb, nb = [x[1] for x in b], [x[1] for x in n]
            lines.append(f"| {enc} | {D} | {span(bf)} | {span(nf)} | {statistics.median(bf) / statistics.median(nf):.2f}x "
                         f"| {span(bb)} | {span(nb)} | {statistics.median(bb) / statistics.median(nb):.2f}x "
                         f"| {diffs[enc, D]:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
