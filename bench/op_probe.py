#!/usr/bin/env python3
"""Which step of an encoding's operator call fails, each step in a process of its own, so that a
crash (a segmentation fault in a library) names its step instead of ending the run:

  cpu     ops.attention_forward on CPU tensors (the CPU kernel; the boxed call with its params)
  raw     ops.attention_forward on CUDA tensors (the CUDA kernels, no autograd)
  nograd  ops.attention under torch.no_grad() on CUDA tensors (the operator without autograd)
  grad    ops.attention with q, k, v requiring grad, then backward, on CUDA tensors (autograd)
  big     raw at T 8192

Usage: bench/op_probe.py --helper PATH/ape_ENC.py [--steps cpu,raw,nograd,grad] [--gdb]
One line per step: "STEP: ok", "STEP: killed by signal N", "STEP: exit N: LAST LINE" or
"STEP: skipped: WHY". With --gdb, a step that a signal ended runs again under cuda-gdb (or gdb)
and its native backtrace follows. Exit status: 0 when every step that ran passed, 1 otherwise.
(scripts/gpu-check.sh runs it for an encoding whose benchmark process crashed.)
"""
import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys

STEPS = ["cpu", "raw", "nograd", "grad", "big"]


def load(path):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    helper = importlib.util.module_from_spec(spec)
    sys.modules[name] = helper
    spec.loader.exec_module(helper)
    return helper, helper.load()


def inputs(helper, device, T, D, H=4, B=1):
    """q, k, v (B, H, T, D) in bf16, the features (B, H, T) and the params in manifest order: the
    manifest's initial values where the helper computes them, random ones of their shape else."""
    import torch
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=torch.bfloat16)
    q, k, v = (rand(B, H, T, D) for _ in range(3))
    features = [rand(B, H, T) for _ in helper.FEATURES]
    init = helper.init_params(H, D)
    params = [init[n].detach().to(device=device, dtype=torch.bfloat16) if n in init
              else rand(*helper.param_shape(n, H, D)) for n in helper.PARAMS]
    return q, k, v, features, params


def child(path, step):
    import torch
    helper, ops = load(path)
    device = "cpu" if step == "cpu" else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("SKIP no CUDA device")
        return
    D = 128 if any("hd128" in n for n in ops.cuda_kernels()) else 64
    q, k, v, features, params = inputs(helper, device, 8192 if step == "big" else 64, D)
    scale = helper.default_scale(D)
    if step in ("cpu", "raw", "big"):
        ops.attention_forward(q, k, v, features, params, scale)
    elif step == "nograd":
        with torch.no_grad():
            ops.attention(q, k, v, *features, *params, scale=scale)
    elif step == "grad":
        for t in (q, k, v):
            t.requires_grad_()
        ops.attention(q, k, v, *features, *params, scale=scale).float().square().sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    print("OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--helper", required=True, help="the generated module ape_ENC.py of a built library")
    ap.add_argument("--steps", default="cpu,raw,nograd,grad", help="comma-separated, of " + ",".join(STEPS))
    ap.add_argument("--gdb", action="store_true", help="a step a signal ended runs again under cuda-gdb or gdb")
    ap.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.helper, a.child)
        return 0
    if not os.path.exists(a.helper):
        sys.exit(f"op_probe: {a.helper} does not exist")
    steps = a.steps.split(",")
    bad = [s for s in steps if s not in STEPS]
    if bad:
        sys.exit(f"op_probe: unknown step(s) {bad}; the steps: {STEPS}")
    failed = False
    for step in steps:
        cmd = [sys.executable, os.path.abspath(__file__), "--helper", a.helper, "--child", step]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            print(f"{step}: timed out after 300 s", flush=True)
            failed = True
            continue
        out = (p.stdout + p.stderr).strip().splitlines()
        if p.returncode == 0 and out and out[-1].startswith("SKIP"):
            print(f"{step}: skipped: {out[-1][5:]}", flush=True)
        elif p.returncode == 0:
            print(f"{step}: ok", flush=True)
        elif p.returncode < 0:
            failed = True
            print(f"{step}: killed by signal {-p.returncode} ({signal.Signals(-p.returncode).name})", flush=True)
            gdb = shutil.which("cuda-gdb") or shutil.which("gdb")
            if a.gdb and gdb:
                bt = subprocess.run([gdb, "-q", "-batch", "-ex", "run", "-ex", "bt", "--args", *cmd],
                                    capture_output=True, text=True, timeout=300)
                print(f"--- {step} under {os.path.basename(gdb)}:\n{bt.stdout}{bt.stderr}---", flush=True)
        else:
            failed = True
            print(f"{step}: exit {p.returncode}: {out[-1] if out else '(no output)'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
