"""The measurements behind ape-check's bf16 tolerances (docs/ape-check.md, runtime/SpecCheck.h).

    python3 bench/ape_check_bf16.py BUILD [--seeds 3] [--specs rope,alibi_learned,...] \
        [--csv bench/results/ape_check_bf16.csv] > bench/results/ape_check_bf16.md

Runs `ape-check SPEC --cuda --verbose` (the CUDA kernels on the SIMT emulator, posing as sm_80 and
sm_90) on the example specs (those with a backward) for seeds 1..N with the bf16 tolerances
switched off (factors 1, floor 1e-30: every row reports its raw error and yardstick), then
summarises per class of quantity the kernels' normalised error over the yardstick (the reference's
own change under the kernels' bf16 roundings; for a param gradient the root mean square of
stochastic roundings over sqrt(2)) and the margin of the default rule (tolerance / error). The
first run of a spec compiles its emulated kernels (about a minute each, cached under
$APE_CACHE_DIR).
"""
import argparse
import collections
import glob
import math
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL, FACTOR, PARAM_FACTOR = 5e-3, 3.0, 6.0  # the defaults of runtime/SpecCheck.h
INFERENCE_ONLY = {"rope_transition"}  # no backward: ape-check --cuda refuses it


def rows(tool, spec, seed):
    out = subprocess.run([tool, spec, "--seed", str(seed), "--verbose", "--cuda", "--bf16-factor", "1",
                          "--bf16-param-factor", "1", "--bf16-tol", "1e-30"],
                         capture_output=True, text=True)
    if out.returncode == 2:
        sys.exit(f"ape-check could not check {spec}:\n{out.stderr}")
    for line in out.stdout.splitlines():
        p = line.split()
        if len(p) < 8 or not p[1].endswith("-bf16"):
            continue
        # The cell, with its key heads where grouped ("2x6x150x64 kv2"); a row may end with a note.
        k = 4 if re.fullmatch(r"kv\d+", p[3]) else 3
        if len(p) < k + 5 or p[k + 4] not in ("pass", "FAIL"):
            continue
        yield p[0], p[1], " ".join(p[2:k]), float(p[k + 1]), float(p[k + 2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--specs", help="comma-separated example names (default: every example with a backward)")
    ap.add_argument("--csv", help="also write every row (spec, seed, quantity, precision, cell, error, yardstick)")
    a = ap.parse_args()
    tool = os.path.join(a.build, "tools", "ape-check")
    if a.specs:
        specs = [os.path.join(ROOT, "examples", "encodings", s + ".mlir") for s in a.specs.split(",")]
    else:
        specs = sorted(s for s in glob.glob(os.path.join(ROOT, "examples", "encodings", "*.mlir"))
                       if os.path.basename(s)[:-5] not in INFERENCE_ONLY)
    ratio = collections.defaultdict(lambda: (0.0, ""))        # error / yardstick
    margin = collections.defaultdict(lambda: (math.inf, ""))  # the default rule's tolerance / error
    per_spec = collections.defaultdict(float)                 # a spec's largest param ratio
    n = 0
    raw = []
    for spec in specs:
        name = os.path.basename(spec)[:-5]
        for seed in range(1, a.seeds + 1):
            for q, prec, cell, rel, y in rows(tool, spec, seed):
                n += 1
                raw.append((name, seed, q, prec, cell, rel, y))
                where = f"{name} {q} {prec} {cell} seed {seed}"
                base = q.split(":", 1)[1] if q.startswith(("grouped:", "grouped-decode:")) else q
                cls = ("param gradients" if base.startswith("dparam:") else
                       "decode steps" if q.startswith(("decode", "grouped-decode")) else
                       "o, dq, dk, dv, features")
                if y > 0 and rel > 0:
                    ratio[cls] = max(ratio[cls], (rel / y, where))
                    if cls == "param gradients":
                        per_spec[name] = max(per_spec[name], rel / y)
                tol = max(TOL, (PARAM_FACTOR if cls == "param gradients" else FACTOR) * y)
                if rel > 0:
                    margin[cls] = min(margin[cls], (tol / rel, where))
            print(f"[bf16] {name} seed {seed}", file=sys.stderr, flush=True)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("spec,seed,quantity,precision,cell,error,yardstick\n")
            for r in raw:
                f.write(",".join(str(x) for x in r) + "\n")
    names = ",".join(os.path.basename(s)[:-5] for s in specs)
    print("# ape-check's bf16 tolerances, measured\n")
    command = f"python3 bench/ape_check_bf16.py build --seeds {a.seeds}" + (f" --specs {a.specs}" if a.specs else "")
    print(f"`{command}`: `ape-check --cuda --verbose` (the "
          f"emulated CUDA kernels posing as sm_80 and sm_90) with the bf16 tolerances off, "
          f"{len(specs)} example specs x {a.seeds} seeds x the default grid's cells at head dims 32, 64, "
          f"128 and the grouped cell ({n} bf16 rows).\n\nSpecs: {names}.\n")
    print("| what | value | where |\n| --- | --- | --- |")
    for cls in sorted(ratio):
        print(f"| {cls}: largest error / yardstick | {ratio[cls][0]:.2f} | {ratio[cls][1]} |")
    for cls in sorted(margin):
        print(f"| {cls}: smallest margin of the default rule | {margin[cls][0]:.2f} | {margin[cls][1]} |")
    if per_spec:
        print("\nParam gradients, each spec's largest error / yardstick over its cells, architectures and "
              "seeds:\n\n| spec | largest ratio |\n| --- | --- |")
        for name in sorted(per_spec):
            print(f"| {name} | {per_spec[name]:.2f} |")
    print(f"\nDefault rule: bf16 tolerance max({TOL:g}, {FACTOR:g} x yardstick), a param gradient's "
          f"max({TOL:g}, {PARAM_FACTOR:g} x yardstick).")


if __name__ == "__main__":
    sys.exit(main())
