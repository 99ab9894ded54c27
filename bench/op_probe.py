#!/usr/bin/env python3
"""Which step of an encoding's operator call fails, each step in a process of its own, so that a
crash (a segmentation fault in a library) names its step instead of ending the run:

  cpu     ops.attention_forward on CPU tensors (the CPU kernel; the boxed call with its params)
  raw     ops.attention_forward on CUDA tensors (the CUDA kernels, no autograd)
  nograd  ops.attention under torch.no_grad() on CUDA tensors (the operator without autograd)
  grad    ops.attention with q, k, v requiring grad, then backward, on CUDA tensors (autograd)
  big     raw at T 8192
  bad     cpu with an input of the wrong shape (a param's, else v's): must raise its message, not
          crash (the message streams sizes, as the H200's crash of 2026-12-04 did on every call)

Usage: bench/op_probe.py --helper PATH/ape_ENC.py [--steps cpu,bad,raw,nograd,grad] [--gdb]
One line per step: "STEP: ok", "STEP: killed by signal N", "STEP: exit N: LAST LINE" or
"STEP: skipped: WHY". A step that a signal ends prints its native stack: each child runs with a
small preloaded library (compiled here with the C compiler, when there is one) whose handler of
SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT writes every frame as LIBRARY+OFFSET, which addr2line
then names (function, and file:line where the library has line tables). With --gdb, such a step
also runs again under gdb (or cuda-gdb) and its backtrace follows. Exit status: 0 when every step that ran passed, 1 otherwise.
(scripts/gpu-check.sh runs it for an encoding whose benchmark process crashed.)
"""
import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

STEPS = ["cpu", "raw", "nograd", "grad", "big", "bad"]

# The preloaded crash handler: the frames of the faulting thread as LIBRARY+OFFSET (dladdr), then
# the signal again, to the previous handler (or the default action: the process ends by it).
CRASH_TRACE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static struct sigaction previous[32];
static void on_signal(int sig, siginfo_t *info, void *uc) {
  void *frames[64];
  char line[1024];
  int n = backtrace(frames, 64);
  int len = snprintf(line, sizeof line, "[crash-trace] signal %d (%s) at address %p\n", sig,
                     strsignal(sig), info ? info->si_addr : 0);
  if (write(2, line, len) < 0) {}
  for (int i = 0; i < n; ++i) {
    Dl_info d;
    memset(&d, 0, sizeof d);
    if (dladdr(frames[i], &d) && d.dli_fname)
      len = snprintf(line, sizeof line, "[crash-trace] #%d %s+0x%lx %s\n", i, d.dli_fname,
                     (unsigned long)((char *)frames[i] - (char *)d.dli_fbase),
                     d.dli_sname ? d.dli_sname : "");
    else
      len = snprintf(line, sizeof line, "[crash-trace] #%d %p\n", i, frames[i]);
    if (write(2, line, len) < 0) {}
  }
  sigaction(sig, &previous[sig], 0);
  raise(sig); /* pending until this returns: then the previous handler, or the default action */
  (void)uc;
}
__attribute__((constructor)) static void install(void) {
  void *warm[2];
  backtrace(warm, 2);  /* loads the unwinder now, not inside the handler */
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; ++i) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, &previous[sigs[i]]);
  }
}
"""


def crash_trace_library(workdir):
    """The preloaded handler's library, compiled into `workdir`, or None (no C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    src, lib = os.path.join(workdir, "crash_trace.c"), os.path.join(workdir, "crash_trace.so")
    with open(src, "w") as f:
        f.write(CRASH_TRACE_C)
    r = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", lib, src, "-ldl"], capture_output=True, text=True)
    return lib if r.returncode == 0 else None


def symbolize(text):
    """The [crash-trace] frames of `text` named by addr2line (function, file:line), one per line."""
    addr2line = shutil.which("addr2line")
    out = []
    for line in text.splitlines():
        m = re.match(r"\[crash-trace\] #(\d+) (\S+)\+(0x[0-9a-f]+)", line)
        if not m:
            continue
        name = ""
        if addr2line and os.path.exists(m.group(2)):
            # The return address points after the call: look up the byte before it.
            pc = hex(max(int(m.group(3), 16) - 1, 0))
            r = subprocess.run([addr2line, "-f", "-C", "-i", "-e", m.group(2), pc],
                               capture_output=True, text=True)
            name = " | ".join(r.stdout.split("\n")[:4]).strip(" |")
        out.append(f"  #{m.group(1)} {os.path.basename(m.group(2))}+{m.group(3)}: {name}")
    return "\n".join(out)


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
    device = "cpu" if step in ("cpu", "bad") else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("SKIP no CUDA device")
        return
    D = 128 if any("hd128" in n for n in ops.cuda_kernels()) else 64
    q, k, v, features, params = inputs(helper, device, 8192 if step == "big" else 64, D)
    scale = helper.default_scale(D)
    if step == "bad":
        if params:
            params[0] = params[0].reshape(-1)[:-1] if params[0].numel() > 1 else params[0].reshape(1, 1, 1, 1, 1)
        else:
            v = v[..., :-1]
        try:
            ops.attention_forward(q, k, v, features, params, scale)
        except (RuntimeError, ValueError, TypeError) as e:
            print("refused:", str(e).splitlines()[0][:200])
            print("OK")
            return
        raise SystemExit("an input of the wrong shape was accepted")
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
    ap.add_argument("--steps", default="cpu,bad,raw,nograd,grad", help="comma-separated, of " + ",".join(STEPS))
    ap.add_argument("--gdb", action="store_true", help="a step a signal ended runs again under gdb (or cuda-gdb)")
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
    workdir = tempfile.mkdtemp(prefix="op_probe_")
    trace = crash_trace_library(workdir)
    env = dict(os.environ)
    if trace:
        env["LD_PRELOAD"] = (trace + " " + env.get("LD_PRELOAD", "")).strip()
    for step in steps:
        cmd = [sys.executable, os.path.abspath(__file__), "--helper", a.helper, "--child", step]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
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
            frames = symbolize(p.stderr)
            print(f"--- {step}: native stack (preloaded handler):\n{frames}\n---" if frames else
                  f"--- {step}: no native stack (no C compiler for the handler)", flush=True)
            # Plain gdb first: the fault is on the host, and cuda-gdb spends minutes starting its
            # device debugging (the H200 run of 2026-11-30 printed no stack within its limit).
            gdb = shutil.which("gdb") or shutil.which("cuda-gdb")
            if a.gdb and gdb:
                try:
                    bt = subprocess.run([gdb, "-q", "-batch", "-ex", "set pagination off", "-ex", "run",
                                         "-ex", "bt 40", "-ex", "info registers rip", "--args", *cmd],
                                        capture_output=True, text=True, timeout=240)
                except subprocess.TimeoutExpired as e:
                    bt = subprocess.CompletedProcess(e.cmd, -1, (e.stdout or b"").decode(errors="replace")
                                                     if isinstance(e.stdout, bytes) else (e.stdout or ""),
                                                     "gdb timed out after 240 s")
                print(f"--- {step} under {os.path.basename(gdb)}:\n{bt.stdout}{bt.stderr}---", flush=True)
        else:
            failed = True
            print(f"{step}: exit {p.returncode}: {out[-1] if out else '(no output)'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
