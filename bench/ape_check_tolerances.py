"""The measurements behind ape-check's tolerances (docs/ape-check.md, runtime/SpecCheck.h).

    python3 bench/ape_check_tolerances.py BUILD [--seeds 6] > bench/results/ape_check_tolerances.md

Runs `ape-check --verbose` on every spec of examples/encodings/ for seeds 1..N with the tolerances
switched off (factor 1, floors 1e-30: every row reports its raw numbers), then summarises: the
largest fp64 normalised error, the fp32 kernel's error relative to the fp32 reference's own error
(the yardstick), the margin of the default rule (tolerance / error) per class of quantity, and the
central differences' largest error.
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
FACTOR, FLOOR, PARAM_FLOOR = 8.0, 4e-6, 2e-6  # the defaults of runtime/SpecCheck.h


def rows(tool, spec, seed):
    out = subprocess.run([tool, spec, "--seed", str(seed), "--verbose", "--fp32-factor", "1",
                          "--fp32-floor", "1e-30", "--fp32-param-floor", "1e-30"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        p = line.split()
        if len(p) < 8 or p[1] not in ("fp32", "fp64"):
            continue
        # The cell, with its layer where an attention transition is checked ("2x2x150x64 L3") or its
        # key heads where grouped ("2x6x37x16 kv3"); a failing row may end with a note in parentheses.
        k = 4 if re.fullmatch(r"L\d+|kv\d+", p[3]) else 3
        if len(p) < k + 5 or p[k + 4] not in ("pass", "FAIL"):
            continue
        yield p[0], p[1], " ".join(p[2:k]), float(p[k + 1]), (None if p[k + 2] == "-" else float(p[k + 2]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--seeds", type=int, default=6)
    a = ap.parse_args()
    tool = os.path.join(a.build, "tools", "ape-check")
    specs = sorted(glob.glob(os.path.join(ROOT, "examples", "encodings", "*.mlir")))
    worst64 = (0.0, "")
    worst_fd = (0.0, "")
    ratio = collections.defaultdict(lambda: (0.0, ""))   # fp32 error / yardstick, where error > 1e-6
    margin = collections.defaultdict(lambda: (math.inf, ""))  # the default rule's tolerance / error
    n = 0
    for seed in range(1, a.seeds + 1):
        for spec in specs:
            name = os.path.basename(spec)[:-5]
            for q, prec, cell, rel, y in rows(tool, spec, seed):
                n += 1
                where = f"{name} {q} {cell} seed {seed}"
                if q.startswith("fd:"):
                    worst_fd = max(worst_fd, (rel, where))
                    continue
                if prec == "fp64":
                    worst64 = max(worst64, (rel, where))
                    continue
                base = q.split(":", 1)[1] if q.startswith(("grouped:", "grouped-decode:")) else q
                cls = "param gradients" if base.startswith("dparam:") else "o, lse, dq, dk, dv, features"
                if rel > 1e-6 and y > 0:
                    ratio[cls] = max(ratio[cls], (rel / y, where))
                B, H, T, D = (int(x) for x in cell.split()[0].split("x"))
                # (runtime/SpecCheck.cpp, param_floor_scale: sqrt of the pairs, times sqrt(D/16) above 16)
                scale = math.sqrt(B * H * T * (T + 1) / 2) * math.sqrt(max(1.0, D / 16))
                floor = PARAM_FLOOR * scale if base.startswith("dparam:") else FLOOR
                tol = max(FACTOR * y, floor)
                if rel > 0:
                    margin[cls] = min(margin[cls], (tol / rel, where))
    print("# ape-check's tolerances, measured\n")
    print(f"`python3 bench/ape_check_tolerances.py build --seeds {a.seeds}`: `ape-check --verbose` with the "
          f"tolerances off, {len(specs)} example specs x {a.seeds} seeds x the default grid ({n} rows).\n")
    print("| what | value | where |\n| --- | --- | --- |")
    print(f"| fp64: largest normalised error (tolerance 1e-10) | {worst64[0]:.2e} | {worst64[1]} |")
    for cls in sorted(ratio):
        print(f"| fp32 {cls}: largest error / yardstick (error > 1e-6) | {ratio[cls][0]:.1f} | {ratio[cls][1]} |")
    for cls in sorted(margin):
        print(f"| fp32 {cls}: smallest margin of the default rule | {margin[cls][0]:.2f} | {margin[cls][1]} |")
    print(f"| central differences: largest normalised error (tolerance 1e-6) | {worst_fd[0]:.2e} | {worst_fd[1]} |")
    print(f"\nDefault rule: fp32 tolerance max({FACTOR:g} x yardstick, {FLOOR:g}); a param gradient's floor "
          f"{PARAM_FLOOR:g} x sqrt(B H T (T+1)/2) x sqrt(max(1, D/16)).")


if __name__ == "__main__":
    sys.exit(main())
