#!/usr/bin/env python3
"""Verdicts of gpu-check's train stage (scripts/gpu-check.sh): reads the checkpoints and logs the
stage wrote under OUT and prints one line per check, then a summary line; exit 1 if any failed.

The loss rules (docs/cuda.md, "Training on a GPU"): the runs start from the same weights (the
model is initialised on the CPU, then moved) and draw the same windows, so they differ only by
rounding. Each rule must be able to fail: a GPU run that computed another encoding must miss it.
So besides its tolerance each GPU run must lie closer to its own encoding's CPU curve than to the
other encoding's, at step 1 and over the last 20 steps (RoPE and Cable's CPU curves differ by
0.009 nats at step 1 and 0.041 over the last 20 on the H100 and H200 runs of 2026-11-27 and
2026-12-04). The tolerances, from the differences those runs measured:
  - f32 on the GPU against the CPU (the same float32 arithmetic in another order; TF32 off):
    measured at most 3e-5 at step 1 and 0.0015 over the last 20 steps; step 1 within 1e-3, the
    last 20 within 0.005.
  - bf16 autocast against the CPU (matmul inputs to 8 significant bits, float32 accumulation):
    measured at most 3e-5 at step 1 and 0.0135 over the last 20; step 1 within 2e-3, the last 20
    within 0.02 (the curves drift apart by rounding over 200 steps).
  - f16 autocast with dynamic loss scaling (11 significant bits; measured at most 4e-6 at step 1
    and 0.0140 over the last 20: step 1 within 1e-3, the last 20 within 0.02); an overflowed step is skipped (its update only), and with GradScaler's start
    (2^16, halving at each overflow) a healthy run skips at most 16 before the scale would fall
    below 1, where the trainer stops.
  - stopped at step 120 (exit 130 and a checkpoint at step 120, or the check fails: a stop that
    did not happen would make the resume vacuous) and resumed on the same GPU (its log says so):
    every loss bit-identical to the run that was never stopped (the kernels are deterministic;
    the trainer's state is whole).
  - stopped on the GPU and resumed on the CPU: it finishes, the last 20 within the bf16 rule (0.02;
    measured 0.0136).
The queued steps never wait for the GPU: the bf16 and f16 runs and the one-rank NCCL run (data
parallel) have LibTorch's sync debug mode on inside them (APE_CUDA_SYNC_DEBUG=warn; the reads of
the queued losses, the ranks' agreements and the checkpoints wait on purpose), and their logs must
hold no "called a synchronizing CUDA operation", and must say that the mode was on (ape-train's
line "sync debug mode inside the queued steps: warn"), or a mode never set would pass.
"""
import csv
import json
import math
import os
import re
import struct
import sys
from pathlib import Path


def checkpoint_config(path):
    """The config JSON of an APE checkpoint (runtime/Checkpoint.h, format 2)."""
    with open(path, "rb") as f:
        if f.read(8) != b"APECKPT1":
            raise ValueError(f"{path}: not an APE checkpoint")
        (version,) = struct.unpack("<I", f.read(4))
        (n,) = struct.unpack("<I", f.read(4))
        f.read(n)
        (m,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(m))


def state(out, run, enc):
    p = out / run / f"{enc}.ckpt"
    return checkpoint_config(p)["state"] if p.exists() else None


def losses(out, run, enc):
    s = state(out, run, enc)
    return s["losses"] if s else None


def tail_mean(xs, n=20):
    xs = xs[-n:]
    return sum(xs) / len(xs)


def main():
    out = Path(sys.argv[1])
    results = []

    def check(name, ok, detail):
        results.append(ok)
        print(f"{'pass' if ok else 'FAIL'}  {name}: {detail}")

    rules = (("gpu-f32", 1e-3, 0.005), ("gpu-bf16", 2e-3, 0.02), ("gpu-f16", 1e-3, 0.02))
    ref = {enc: losses(out, "cpu", enc) for enc in ("rope", "cable")}
    for enc in ("rope", "cable"):
        cpu = losses(out, "cpu", enc)
        if cpu is None or len(cpu) != 200:
            check(f"{enc} on the CPU", False, "no complete run (logs/train/cpu.log)")
            continue
        for run, first_tol, tail_tol in rules:
            gpu = losses(out, run, enc)
            if gpu is None or len(gpu) != 200:
                check(f"{enc} {run}", False, f"no complete run (logs/train/{run}.log)")
                continue
            d1, dt = abs(gpu[0] - cpu[0]), abs(tail_mean(gpu) - tail_mean(cpu))
            # Closer to its own encoding's CPU curve than to the other's (where that one ran).
            other = ref["cable" if enc == "rope" else "rope"]
            own = True
            if other and len(other) == 200:
                own = d1 < abs(gpu[0] - other[0]) and dt < abs(tail_mean(gpu) - tail_mean(other))
            check(f"{enc} {run} against the CPU",
                  d1 <= first_tol and dt <= tail_tol and own and all(map(math.isfinite, gpu)),
                  f"step 1 {gpu[0]:.5f} vs {cpu[0]:.5f} (|d| {d1:.2e} <= {first_tol}); last 20 "
                  f"{tail_mean(gpu):.4f} vs {tail_mean(cpu):.4f} (|d| {dt:.4f} <= {tail_tol})"
                  + ("" if own else "; closer to the other encoding's CPU curve than to its own"))
            if run == "gpu-f16":
                skipped = state(out, run, enc).get("skipped_steps", 0)
                check(f"{enc} gpu-f16 loss scaling", skipped <= 16, f"{skipped} of 200 updates skipped (<= 16)")

    steps = {}
    steps_file = out / "steps.txt"
    if steps_file.exists():
        for line in steps_file.read_text().splitlines():
            name, _, rc = line.partition(": exit ")
            steps[name] = int(rc)

    # The stops happened (exit 130 at step 120, as Ctrl-C stops a run) and the resumes said so:
    # otherwise a run that never stopped would make "resumed bit-identically" vacuous.
    for stop, resume in (("stop-gpu", "resume-gpu"), ("stop-for-cpu", "resume-cpu")):
        log = out / f"{resume}.log"
        said = log.exists() and re.search(r"resumed from \S+ at step 120\b", log.read_text(errors="replace"))
        check(f"{stop} stopped at step 120 and {resume} resumed there", steps.get(stop) == 130 and bool(said),
              f"{stop} exit {steps.get(stop, 'not run')} (130 expected); {resume}'s log "
              + ("says it resumed at step 120" if said else "does not say it resumed at step 120"))
    whole, resumed = losses(out, "gpu-bf16", "rope"), losses(out, "resume-gpu", "rope")
    if whole and resumed:
        same = whole == resumed
        first = next((i for i, (a, b) in enumerate(zip(whole, resumed)) if a != b), None)
        check("rope stopped at 120 and resumed on the GPU", same and len(resumed) == 200,
              "all 200 losses bit-identical" if same else f"first difference at step {first + 1 if first is not None else '?'}")
    else:
        check("rope stopped at 120 and resumed on the GPU", False, "missing checkpoint")
    cross, cpu = losses(out, "resume-cpu", "rope"), losses(out, "cpu", "rope")
    if cross and cpu and len(cross) == 200:
        dt = abs(tail_mean(cross) - tail_mean(cpu))
        check("rope stopped on the GPU, resumed on the CPU", dt <= 0.02,
              f"last 20 {tail_mean(cross):.4f} vs the CPU run's {tail_mean(cpu):.4f}")
    else:
        check("rope stopped on the GPU, resumed on the CPU", False, "missing or incomplete checkpoint")

    # The queued steps' host waits (the bf16 and f16 runs under APE_CUDA_SYNC_DEBUG=warn).
    on_line = "sync debug mode inside the queued steps: warn"
    for run in ("gpu-bf16", "gpu-f16"):
        log = out / f"{run}.log"
        if log.exists() and losses(out, run, "rope"):
            text = log.read_text(errors="replace")
            waits = text.count("called a synchronizing CUDA operation")
            check(f"no host waits inside the queued steps ({run})", waits == 0 and on_line in text,
                  ("the sync debug mode was not on (no line saying so); " if on_line not in text else "") +
                  f"{waits} synchronizing call(s) reported by LibTorch's sync debug mode"
                  + ("" if waits == 0 else "; the first one's stack: rerun the run with APE_CUDA_SYNC_DEBUG=error "
                     f"TORCH_SHOW_CPP_STACKTRACES=1 (logs/train/{run}.log has the command)"))
        else:
            check(f"no host waits inside the queued steps ({run})", False, f"no run (logs/train/{run}.log)")

    # Data parallel on NCCL (one rank) queues its steps too (judged only where the run finished).
    log = out / "nccl.log"
    if log.exists() and steps.get("nccl") == 0:
        text = log.read_text(errors="replace")
        waits = text.count("called a synchronizing CUDA operation")
        check("no host waits inside the queued steps (nccl)", waits == 0 and on_line in text,
              ("the sync debug mode was not on (no line saying so); " if on_line not in text else "")
              + f"{waits} synchronizing call(s) reported by LibTorch's sync debug mode (logs/train/nccl.log)")
    else:
        check("no host waits inside the queued steps (nccl)", False, "no complete run (logs/train/nccl.log)")
    for name in ("eval-gpu-ckpt-on-cpu", "eval-cpu-ckpt-on-gpu", "generate", "generate-gpu", "score-gpu",
                 "score-cpu", "score-match", "decode-split", "decode-unsplit", "decode-oneshare", "decode-batch",
                 "decode-batch-oneshare", "decode-gqa", "decode-gqa-unpacked", "gpu-params", "gpu-kv-heads",
                 "nccl"):
        check(name, steps.get(name) == 0, f"exit {steps.get(name, 'not run')} (logs/train/{name}.log)")

    # Speed: tokens/s and memory of APE's run and the PyTorch SDPA peer's.
    def grab(log, pattern):
        p = out / log
        m = re.search(pattern, p.read_text()) if p.exists() else None
        return m.groups() if m else None

    # Both sides' rate after their first 5 steps (allocations, library handles, autotuning).
    ape = grab("speed-ape.log", r"\[rope\] after step 5: (\d+) tok/s")
    ape_mem = grab("speed-ape.log", r"GPU memory: peak (\d+) MiB")
    peers = {}  # log -> (tok/s, peak MiB, backend)
    for log in ("speed-sdpa.log", "speed-sdpa-cudnn.log"):
        g, b = grab(log, r"after step 5: (\d+) tok/s.*peak (\d+) MiB"), grab(log, r"SDPA backend (\S+ \([^)]*\))")
        if g:
            peers[log] = (g[0], g[1], b[0] if b else "?")
    # The ratio against the faster peer (SDPA's own choice, or cuDNN forced).
    peer = max(peers.values(), key=lambda v: int(v[0])) if peers else None
    ratio = f" ({int(ape[0]) / int(peer[0]):.2f}x the faster)" if ape and peer and int(peer[0]) > 0 else ""
    if ape and peer:
        print(f"speed  after step 5: APE {ape[0]} tok/s, peak {ape_mem[0] if ape_mem else '?'} MiB; PyTorch SDPA "
              + "; ".join(f"{v[2]} {v[0]} tok/s, peak {v[1]} MiB" for v in peers.values())
              + f"{ratio} (d 1024, 8 layers, 16 heads, L 2048, batch 8, bf16; the peer's rotary compiled)")
    # Cached decoding: the same text scored token by token on the GPU and on the CPU.
    dec = {d: grab(f"score-{d}.log", r"\[score\] (\d+) tokens? in [\d.]+ s \(([\d.]+) tokens/s\)") for d in ("gpu", "cpu")}
    if dec["gpu"] and dec["cpu"]:
        print(f"decode {dec['gpu'][0]} tokens scored through the KV cache (RoPE): GPU {dec['gpu'][1]} tokens/s, "
              f"CPU {dec['cpu'][1]} tokens/s")
    # One-token steps at long contexts, keys split over blocks (the default), unsplit, and unsplit
    # on the FlashAttention-2-class kernel (one share; APE_CUDA_HOPPER_FORWARD=0).
    rows = {}
    for kind in ("split", "unsplit", "oneshare", "batch", "batch-oneshare"):
        try:
            with open(out / f"decode-{kind}.csv") as f:
                for r in csv.DictReader(f):
                    rows.setdefault((r["encoding"], r["length"]), {})[kind] = float(r["cached_tok_s"])
        except (OSError, KeyError, ValueError):
            pass
    for (enc, length), v in sorted(rows.items()):
        if "split" in v and "unsplit" in v and v["unsplit"] > 0:
            print(f"decode {enc} L {length}: {v['split']:.0f} tokens/s with the keys split, {v['unsplit']:.0f} "
                  f"unsplit ({v['split'] / v['unsplit']:.2f}x; d 1024, 4 layers, 16 heads, bf16; on sm_90 the "
                  "unsplit steps run the Hopper forward, the split ones the FlashAttention-2-class kernel)")
        if "oneshare" in v and "unsplit" in v and v["unsplit"] > 0:
            print(f"decode {enc} L {length}: {v['oneshare']:.0f} tokens/s unsplit on the FlashAttention-2-class "
                  f"kernel (one share) against {v['unsplit']:.0f} unsplit by default ({v['oneshare'] / v['unsplit']:.2f}x)")
        if "batch" in v and "batch-oneshare" in v and v["batch"] > 0:
            print(f"decode {enc} L {length}, batch 32: {v['batch']:.0f} tokens/s by default, {v['batch-oneshare']:.0f} on "
                  f"the FlashAttention-2-class kernel as one share ({v['batch-oneshare'] / v['batch']:.2f}x)")
    n_pass = sum(results)
    card = os.environ.get("APE_GPU_CHECK_CARD")  # (scripts/gpu-check.sh: nvidia-smi's name of the GPU)
    print(f"{n_pass} of {len(results)} training checks passed" + (f" on {card}" if card else "")
          + (f"; APE {ape[0]} vs SDPA {peer[0]} tok/s{ratio}" if ape and peer else ""))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
