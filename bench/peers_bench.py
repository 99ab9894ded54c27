#!/usr/bin/env python3
"""APE's fused CPU kernels against the peers a PyTorch user would pick instead, in one run.

    .venv/bin/python bench/peers_bench.py --build build [--encodings nope,rope,alibi,t5,cable] \\
        [--T 1024,4096,16384] [--B 1,2,4] [--H 8] [--D 64,128] [--dtypes fp32,bf16] \\
        [--methods ape,sdpa,flex,eager] [--threads 2] [--min-reps 5] [--min-time 1] \\
        [--max-seconds 900] [--mem-budget-gib G] [--md out.md] [--csv out.csv]

Methods (causal attention, scale 1/sqrt(d_h), the encoding of examples/encodings/ENC.mlir):
  ape          torch.ops.ape_ENC.attention, the operator library emitted by
               `apec --emit=torch-library` and built as docs/frameworks.md says
  ape-runtime  (optional, fp32; nope, rope, alibi, cable) the same kernel inside APE's runtime:
               BUILD/bench/ape-bench-attention --one ape ENC T
  sdpa         torch.nn.functional.scaled_dot_product_attention: is_causal=True for nope and
               rope (the rotation by torch ops first, cos/sin tables cached); alibi, t5, cable:
               the bias with the causal mask as a 4-D float attn_mask (a 3-D one sends SDPA to
               its math kernel). alibi's is a constant built once (flash kernel); t5's and
               cable's are built in the step from the trainable table / the feature so that
               their gradient flows, which makes SDPA take its math kernel. The aten kernels
               that ran are recorded by torch.profiler on the warm-up call.
  sdpa-detached  (t5, cable) the same with the mask built from detached inputs: the flash
               kernel, but no gradient for the table / feature (left out of the "fastest peer").
  flex         torch.compile of a step calling torch.nn.attention.flex_attention with a causal
               BlockMask and the encoding as a score_mod (rope: rotation first; cable: S from the
               feature first, inside the compiled step). Forward+backward is attempted compiled,
               then eager; PyTorch's exact error is recorded where it refuses.
  eager        the materialised reference: softmax(scale q k^T + bias, causal) v in torch ops,
               every (B, H, T, T) tensor in memory, backward by autograd.
Forward is timed under torch.no_grad (inference; APE still writes the lse); forward+backward is
the forward with autograd and .backward(dout), gradients of q, k, v, features and trainable
params (t5's table) included.

Each (encoding, dtype, D, B, T, method) runs in a fresh process with OMP_NUM_THREADS and
torch.set_num_threads = --threads: one warm-up call (compiles flex), one call measured for
memory, then repetitions until --min-reps and --min-time; the median is reported.

Peak memory: the step's resident-set high-water mark above what was resident before it. The
child frees what the warm-up left (gc, glibc malloc_trim), reads VmRSS, resets the high-water
mark (`echo 5 > /proc/self/clear_refs`), runs one step and reads VmHWM. The method's constant
tables (cos/sin, causal masks, t5's bucket indices, alibi's mask, flex's BlockMask) are added:
their resident growth is measured when they are built. tracemalloc would not see torch's
allocations; a process-wide VmHWM would count flex's compiler.

Guards: a method whose materialised (B, H, T, T) tensors would exceed --mem-budget-gib (default
80% of MemAvailable at the start) is skipped and says how much it needs; a method whose
previous T extrapolates (quadratically) to more than --max-seconds for its measurement, or whose
warm-up step does, is skipped or reported from that single step.

Before any timing a correctness gate runs every method at T=--gate-T (partial tiles), B=2, in
fp32, against the eager reference evaluated in fp64: o and every gradient within --tol, else
the run aborts.

Internal: --child METHOD ENC ... runs one measurement; --child-gate ENC D checks one encoding.
"""
import argparse
import csv
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_library  # noqa: E402

ROOT = torch_library.ROOT
ENCODINGS = ["nope", "rope", "alibi", "t5", "cable"]
METHODS = ["ape", "ape-runtime", "sdpa", "sdpa-detached", "flex", "eager"]
TRAINABLE_BIAS = ["t5", "cable"]  # sdpa-detached differs from sdpa only for these
RUNTIME_ENCODINGS = ["nope", "rope", "alibi", "cable"]  # what ape-bench-attention implements
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
GIB = 1 << 30


# ---- memory of this process -------------------------------------------------------------------------

def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def _settle():
    """Frees what earlier calls left in glibc's heaps, so VmRSS is the live memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def step_peak_mib(fn):
    """(resident-set high-water mark of one call of fn above the resident set before it, MiB, or
    None where the kernel cannot reset the mark; seconds the call took)."""
    _settle()
    before = _status_kib("VmRSS")
    reset = _reset_hwm()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    if not reset:
        return None, seconds
    return max(0, _status_kib("VmHWM") - before) / 1024.0, seconds


# ---- the encodings in PyTorch ops (the peers' side; from docs/encodings-math.md) -------------------

def t5_bucket_lut(T):
    """bucket(n) for n = 0..T-1, decoder form: n if n < 16, else min(16 + floor(ln(n/16)/ln 8 * 16), 31)."""
    import torch
    n = torch.arange(max(T, 1), dtype=torch.float64)
    big = 16 + torch.floor(torch.log(n.clamp(min=16) / 16) / math.log(8) * 16)
    return torch.where(n < 16, n, big.clamp(max=31)).long()


class Encoding:
    """One encoding written with torch ops, for every peer. Constant tables are built once per
    process (outside the timed region, as a tuned model caches them), only those a method needs."""

    def __init__(self, enc, T, dtype):
        import torch
        self.enc, self.T, self.dtype = enc, T, dtype
        self._const = {}
        self.torch = torch

    def const(self, name):
        if name not in self._const:
            self._const[name] = self._build(name)
        return self._const[name]

    def _build(self, name):
        torch, T = self.torch, self.T
        i = torch.arange(T)
        if name == "upper":  # True above the diagonal (j > i): masked
            return i[None, :] > i[:, None]
        if name == "causal_add":  # 0 on and below the diagonal, -inf above
            return torch.zeros(T, T, dtype=self.dtype).masked_fill(self.const("upper"), float("-inf"))
        if name == "rope":  # rotate-half tables (T, D) as in the usual PyTorch RoPE module
            raise KeyError("rope tables need D: use rope_tables(D)")
        if name == "neg_dist":  # -(i - j), (T, T)
            return (i[None, :] - i[:, None]).to(self.dtype)
        if name == "t5_index":  # bucket(max(i - j, 0)), (T, T) int32 (F.embedding takes it)
            return t5_bucket_lut(T)[(i[:, None] - i[None, :]).clamp(min=0)].int()
        if name == "t5_lut":
            return t5_bucket_lut(T)
        raise KeyError(name)

    def rope_tables(self, D):
        if "rope" not in self._const:
            torch = self.torch
            theta = 1e4 ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
            angle = torch.arange(self.T, dtype=torch.float64)[:, None] * theta[None, :]
            angle = torch.cat([angle, angle], dim=-1)  # (T, D): pairs (c, c + D/2)
            self._const["rope"] = (torch.cos(angle).to(self.dtype), torch.sin(angle).to(self.dtype))
        return self._const["rope"]

    def rotate(self, q, k):
        """RoPE on q and k (rotate-half pairs, base 10000); identity for the others."""
        if self.enc != "rope":
            return q, k
        cos, sin = self.rope_tables(q.shape[-1])
        half = q.shape[-1] // 2

        def rot(x):
            return x * cos + self.torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
        return rot(q), rot(k)

    def bias(self, features, params):
        """The additive bias, broadcastable to (B, H, T, T), or None; differentiable in the
        features and trainable params."""
        torch = self.torch
        if self.enc == "alibi":  # -m_h (i - j)
            return params["alibi_slopes"].view(-1, 1, 1) * self.const("neg_dist")
        if self.enc == "t5":  # T[bucket(i - j), h]
            return torch.nn.functional.embedding(self.const("t5_index"), params["t5_table"]).permute(2, 0, 1)
        if self.enc == "cable":  # S_i - S_j, S = cumsum(-softplus(f)) in fp32
            s = self.cable_s(features)
            return (s[..., :, None] - s[..., None, :]).to(self.dtype)
        return None

    def cable_s(self, features):
        torch = self.torch
        return torch.cumsum(-torch.nn.functional.softplus(features[0].float()), dim=-1)

    def score_mod(self, features, params):
        """The bias as a FlexAttention score_mod (None: nothing to add)."""
        if self.enc == "alibi":
            m = params["alibi_slopes"]
            return lambda s, b, h, qi, kv: s + m[h] * (kv - qi)
        if self.enc == "t5":
            table, lut = params["t5_table"], self.const("t5_lut")
            return lambda s, b, h, qi, kv: s + table[lut[self.torch.clamp(qi - kv, min=0)], h]
        if self.enc == "cable":
            S = self.cable_s(features)
            return lambda s, b, h, qi, kv: s + (S[b, h, qi] - S[b, h, kv])
        return None


# ---- one method on one shape ----------------------------------------------------------------------

def make_inputs(h, B, H, T, D, dtype, seed, table_std=None, kv_heads=0):
    """q, dout (B, H, T, D), k, v (B, kv_heads or H, T, D), features [(B, H, T)], params
    {name: tensor} (manifest initialisers; t5's table with std table_std when given, to make the
    bias matter in checks)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    KV = kv_heads or H
    q, k, v = (torch.randn(B, n, T, D, generator=g).to(dtype).requires_grad_() for n in (H, KV, KV))
    dout = torch.randn(B, H, T, D, generator=g).to(dtype)
    features = [torch.randn(B, H, T, generator=g).to(dtype).requires_grad_() for _ in h.FEATURES]
    init = h.init_params(H, D, dtype=torch.float32, generator=g)
    missing = [n for n in h.PARAMS if n not in init]
    if missing:
        sys.exit(f"params without a manifest initialiser: {missing}")
    params = {}
    for name, t in init.items():
        if table_std is not None and name == "t5_table":
            t = t * (table_std / 0.02)
        params[name] = t.detach().to(dtype).requires_grad_(t.requires_grad)
    return q, k, v, dout, features, params


class Method:
    """fwd(q, k, v, features, params) -> o and fwdbwd(...) -> o for one method; fwdbwd is None
    (with self.fwdbwd_error) where PyTorch refuses it; self.kernels names the aten kernels."""

    def __init__(self, method, enc, h, T, dtype):
        import torch
        self.torch, self.method, self.h = torch, method, h
        self.e = Encoding(enc, T, dtype)
        self.fwdbwd_error = None
        self.notes = []
        if method == "ape":
            self.ops = h.load()
        elif method == "flex":
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            self.block_mask = create_block_mask(lambda b, hh, qi, kv: qi >= kv, None, None, T, T, device="cpu")
            self.flex = flex_attention

            def step(q, k, v, features, params):
                q, k = self.e.rotate(q, k)
                return flex_attention(q, k, v, score_mod=self.e.score_mod(features, params),
                                      block_mask=self.block_mask, enable_gqa=k.shape[1] != q.shape[1])
            self.step = step
            self.compiled = torch.compile(step)
        if enc == "alibi" and method == "sdpa" and any(p["trainable"] for p in h.MANIFEST["params"]):
            sys.exit("alibi's slopes are trainable in this manifest: sdpa's constant mask would be wrong")

    def prepare(self, features, params, D):
        """Builds the method's constant tables (outside any timed region)."""
        e, enc = self.e, self.e.enc
        if self.method.startswith("sdpa") and enc == "alibi":  # the whole mask is a constant
            with self.torch.no_grad():
                # (1, H, T, T): SDPA's flash kernel takes a 4-D float mask, a 3-D one goes to math
                self.alibi_mask = (e.bias(features, params) + e.const("causal_add")).unsqueeze(0).contiguous()
            return
        if self.method not in ("sdpa", "sdpa-detached", "eager", "flex"):
            return
        if enc == "rope":
            e.rope_tables(D)
        if self.method == "flex":
            if enc == "t5":
                e.const("t5_lut")
            return
        if self.method == "eager" or enc in ("t5", "cable"):  # masked_fill in the step
            e.const("upper")
        if enc == "alibi":
            e.const("neg_dist")
        if enc == "t5":
            e.const("t5_index")

    def call(self, q, k, v, features, params, train):
        torch, e = self.torch, self.e
        if self.method == "ape":
            ordered = [params[n] for n in self.h.PARAMS]
            return self.ops.attention(q, k, v, *features, *ordered)
        if self.method == "flex":
            return self.compiled(q, k, v, features, params) if train != "eager" else self.step(q, k, v, features, params)
        F = torch.nn.functional
        gqa = k.shape[1] != q.shape[1]  # grouped-query attention (--kv-heads)
        if self.method in ("sdpa", "sdpa-detached"):
            q, k = e.rotate(q, k)
            if e.enc in ("nope", "rope"):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            if e.enc == "alibi":
                mask = self.alibi_mask
            else:
                if self.method == "sdpa-detached":  # the flash kernel, no bias gradient
                    features = [f.detach() for f in features]
                    params = {n: p.detach() for n, p in params.items()}
                bias = e.bias(features, params)
                # 4-D: a 3-D mask sends SDPA to its math kernel
                mask = bias.expand(q.shape[0], *bias.shape[-3:]) if bias.dim() == 3 else bias
                mask = mask.masked_fill(e.const("upper"), float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        # eager: the materialised reference
        q, k = e.rotate(q, k)
        if gqa:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        b = e.bias(features, params)
        if b is not None:
            s = s + b
        s = s.masked_fill(e.const("upper"), float("-inf"))
        return torch.softmax(s, dim=-1) @ v


def leaves_of(q, k, v, features, params):
    return [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]


def median_ms(fn, min_reps, min_time):
    times, start = [], time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), len(times)


def kernels_of(fn):
    """The aten attention kernels one call of fn runs (torch.profiler)."""
    from torch.profiler import profile
    with profile(activities=[__import__("torch").profiler.ProfilerActivity.CPU]) as p:
        fn()
    names = sorted({ev.name for ev in p.events() if ev.name.startswith("aten::_scaled_dot_product")})
    short = [n.replace("aten::_scaled_dot_product_", "") for n in names]
    return "+".join(short) if short else "-"


def child(args):
    import torch
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, DTYPES[args.dtype])
    lib = torch_library.library_dir(args.work, args.enc)
    h = torch_library.load_helper(lib, args.enc, load=(args.child == "ape"))
    q, k, v, dout, features, params = make_inputs(h, args.B, args.H, args.T, args.D, dtype, args.seed,
                                                  kv_heads=args.kv_heads)
    leaves = leaves_of(q, k, v, features, params)
    detached = ([t.detach() for t in (q, k, v)], [f.detach() for f in features],
                {n: p.detach() for n, p in params.items()})
    m = Method(args.child, args.enc, h, args.T, dtype)
    _settle()
    rss0 = _status_kib("VmRSS")
    m.prepare(features, params, args.D)
    _settle()
    const_mib = max(0, _status_kib("VmRSS") - rss0) / 1024.0
    out = {"const_mib": f"{const_mib:.1f}", "threads": str(torch.get_num_threads())}

    def fwd():
        with torch.no_grad():
            m.call(*detached[0], detached[1], detached[2], train=False)

    def fwdbwd(mode=True):
        o = m.call(q, k, v, features, params, train=mode)
        o.backward(dout)
        for t in leaves:
            t.grad = None

    def measure(name, fn):
        t0 = time.perf_counter()
        kern = kernels_of(fn) if args.child.startswith("sdpa") else fn()  # warm-up (flex: compiles)
        out[f"{name}_warm_s"] = f"{time.perf_counter() - t0:.3f}"
        if args.child.startswith("sdpa"):
            out[f"{name}_kernel"] = kern
        peak, step_s = step_peak_mib(fn)
        out[f"{name}_peak_mib"] = "na" if peak is None else f"{peak + const_mib:.1f}"
        if step_s * args.min_reps > args.max_seconds:
            out[f"{name}_ms"] = "over"
            out[f"{name}_step_ms"] = f"{step_s * 1e3:.3f}"
            return
        ms, reps = median_ms(fn, args.min_reps, args.min_time)
        out[f"{name}_ms"] = f"{ms:.6f}"
        out[f"{name}_reps"] = str(reps)

    measure("fwd", fwd)
    if args.child == "flex":
        errors = []
        for mode in (True, "eager"):  # compiled, then eager
            try:
                fwdbwd(mode)
            except Exception as exc:  # PyTorch's refusal, recorded verbatim
                errors.append(f"{'compiled' if mode is True else 'eager'}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            measure("fwdbwd", lambda mode=mode: fwdbwd(mode))
            out["fwdbwd_mode"] = "compiled" if mode is True else "eager"
            break
        if errors:
            out["fwdbwd_error"] = " | ".join(errors)
    else:
        measure("fwdbwd", fwdbwd)
    if args.child == "ape":
        out["level"] = m.ops.cpu_level()
    # RESULT values must be single tokens: the error text goes on its own line.
    err = out.pop("fwdbwd_error", None)
    if err:
        print("REFUSED " + err)
    print("RESULT " + " ".join(f"{key}={val.replace(' ', '_')}" for key, val in out.items()))
    return 0


def child_gate(args):
    """Every method at a small shape in fp32 against the eager reference in fp64."""
    import torch
    torch.set_num_threads(args.threads)
    lib = torch_library.library_dir(args.work, args.enc)
    h = torch_library.load_helper(lib, args.enc, load=True)
    B, T = 2, args.gate_T
    ref_in = make_inputs(h, B, args.H, T, args.D, torch.float64, args.seed, table_std=0.5, kv_heads=args.kv_heads)
    ref = Method("eager", args.enc, h, T, torch.float64)
    ref.prepare(ref_in[4], ref_in[5], args.D)

    def value_and_grads(m, q, k, v, dout, features, params, backward=True):
        if not backward:
            with torch.no_grad():
                return [m.call(q.detach(), k.detach(), v.detach(), [f.detach() for f in features],
                               {n: p.detach() for n, p in params.items()}, train=False)]
        o = m.call(q, k, v, features, params, train=True)
        ls = leaves_of(q, k, v, features, params)
        return [o, *torch.autograd.grad(o, ls, dout, allow_unused=True)]

    expected = value_and_grads(ref, *ref_in)
    names = ["o", "dq", "dk", "dv"] + [f"d{n}" for n in h.FEATURES] + \
        [f"d{n}" for n, p in ref_in[5].items() if p.requires_grad]
    worst, lines = 0.0, []
    for method in args.gate_methods.split(","):
        inp = [t.detach().float().requires_grad_(t.requires_grad) for t in ref_in[:3]] + [ref_in[3].float()]
        inp.append([f.detach().float().requires_grad_() for f in ref_in[4]])
        inp.append({n: p.detach().float().requires_grad_(p.requires_grad) for n, p in ref_in[5].items()})
        m = Method(method, args.enc, h, T, torch.float32)
        m.prepare(inp[4], inp[5], args.D)
        backward = method != "flex"
        got = value_and_grads(m, *inp, backward=backward)
        errs = [(n, (g.double() - e.double()).abs().max().item()) for n, g, e in zip(names, got, expected)
                if g is not None]
        missing = [n for n, g in zip(names, got) if g is None]
        worst = max([worst] + [x for _, x in errs])
        lines.append(f"{method}: " + " ".join(f"{n} {x:.1e}" for n, x in errs) +
                     ("" if backward else " (forward only)") + (f" (no {', '.join(missing)})" if missing else ""))
        if max(x for _, x in errs) > args.tol:
            print("\n".join(lines))
            print(f"GATE FAILED: {method} {args.enc} D={args.D} error above --tol {args.tol:g}")
            return 1
    print("\n".join(lines))
    print(f"RESULT worst={worst:.3e}")
    return 0


# ---- parent -----------------------------------------------------------------------------------------

def element_bytes(dtype):
    return 4 if dtype == "fp32" else 2


def needs_gib(method, enc, dtype, B, H, T):
    """Estimated peak of a step's materialised (.., T, T) tensors, GiB (0: memory O(T)).
    eager and sdpa's math kernel (trainable bias): ~5 (B, H, T, T) tensors live in the backward
    (logits, probabilities, their gradients, the mask / bias); sdpa-detached: the mask and its
    construction; alibi's constant (1, H, T, T) mask twice while built; the (T, T) constants."""
    e = element_bytes(dtype)
    n, tt = B * H * T * T * e, T * T
    if method == "eager":
        return (5 * n + tt * (1 + 4 + e) + H * tt * e) / GIB
    if method.startswith("sdpa") and enc == "alibi":
        return (2 * H * tt * e + tt * (1 + e)) / GIB
    if method.startswith("sdpa") and enc in TRAINABLE_BIAS:
        return ((5 if method == "sdpa" else 2) * n + tt * 5) / GIB
    return 0.0


def mem_available_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def machine():
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / (1 << 20)
    return f"{cpu}, {os.cpu_count()} logical cores, {mem:.0f} GiB, {platform.system()} {platform.release()}"


def run_child(cmd, env, timeout):
    """(RESULT dict or None, error text or None, extra ERROR line or None)."""
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s", None
    lines = p.stdout.splitlines()
    err_line = next((l[8:] for l in lines if l.startswith("REFUSED ")), None)
    res = next((l for l in reversed(lines) if l.startswith("RESULT")), None)
    if p.returncode != 0 or res is None:
        err = p.stderr.strip().splitlines()
        # The exception line (the last lines are often PyTorch's hints), first 300 characters.
        named = [l for l in err if re.match(r"^[\w.]+(Error|Exception)\b.*:", l)]
        tail = (named or err or [f"exit {p.returncode}"])[-1][:300]
        if p.returncode < 0:
            tail = f"killed by signal {-p.returncode} (out of memory?)"
        return None, f"failed: {tail}", err_line
    return dict(kv.split("=", 1) for kv in res.split()[1:]), None, err_line


def fmt_ms(x):
    return "" if x is None else (f"{x:.1f}" if x >= 10 else f"{x:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="APE's build folder (tools/apec, bench/ape-bench-attention)")
    ap.add_argument("--work", default=None, help="folder for the emitted libraries (default BUILD/peers-bench)")
    ap.add_argument("--skip-build", action="store_true", help="reuse the libraries in --work")
    ap.add_argument("--encodings", default=",".join(ENCODINGS))
    ap.add_argument("--methods", default="ape,sdpa,flex,eager", help=f"of {','.join(METHODS)}")
    ap.add_argument("--T", default="1024,4096,16384")
    ap.add_argument("--B", default="1,2,4")
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="key/value heads, dividing --H (grouped-query attention; 0: --H)")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--dtypes", default="fp32,bf16", help="fp32, bf16")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--max-seconds", type=float, default=900.0,
                    help="skip a measurement whose min-reps steps would take longer (extrapolated from "
                         "the previous T, or from the warm-up step)")
    ap.add_argument("--mem-budget-gib", type=float, default=None,
                    help="skip materialising methods that would need more (default 80%% of MemAvailable)")
    ap.add_argument("--gate-T", type=int, default=200)
    ap.add_argument("--tol", type=float, default=2e-3)
    ap.add_argument("--skip-gate", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--md", help="write the Markdown report here")
    ap.add_argument("--csv", help="write one row per measurement here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-gate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gate-methods", help=argparse.SUPPRESS)
    ap.add_argument("--enc", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work = args.work or os.path.join(args.build, "peers-bench")
    if args.child or args.child_gate:
        args.T, args.B, args.D = int(args.T), int(args.B), int(args.D)
        return child_gate(args) if args.child_gate else child(args)

    encodings, methods, dtypes = args.encodings.split(","), args.methods.split(","), args.dtypes.split(",")
    Ts, Bs, Ds = ([int(x) for x in s.split(",")] for s in (args.T, args.B, args.D))
    bad = [x for x in encodings if x not in ENCODINGS] + [x for x in methods if x not in METHODS] + \
        [x for x in dtypes if x not in DTYPES]
    if bad or min(Ts + Bs + Ds + [args.H, args.threads, args.min_reps]) < 1:
        sys.exit(f"bad arguments: {bad or 'sizes, --threads and --min-reps must be >= 1'}")
    if args.kv_heads < 0 or (args.kv_heads and args.H % args.kv_heads):
        sys.exit(f"bad arguments: --kv-heads {args.kv_heads} must divide --H {args.H}")
    if args.kv_heads and "ape-runtime" in methods:
        sys.exit("--kv-heads: ape-runtime (bench/ape-bench-attention) times full heads only")
    if "ape" not in methods:
        sys.exit("--methods must include ape (the ratios are against it)")
    apec = os.path.join(args.build, "tools", "apec")
    runtime = os.path.join(args.build, "bench", "ape-bench-attention")
    need = [apec] + ([runtime] if "ape-runtime" in methods else [])
    for f in need:
        if not os.access(f, os.X_OK) and not (f == apec and args.skip_build):
            sys.exit(f"{f} is missing: build it first (scripts/build.sh apec ape-bench-attention)")
    budget = args.mem_budget_gib if args.mem_budget_gib else 0.8 * mem_available_gib()
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable] + sys.argv)
    started, load_start, t_start = datetime.datetime.now(), torch_library.loadavg(), time.perf_counter()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    os.makedirs(args.work, exist_ok=True)
    builds = {}
    for enc in encodings:
        if not args.skip_build:
            _, c, b = torch_library.build_library(apec, args.work, enc)
            builds[enc] = (c, b)
            log(f"[build] {enc}: configure {c:.1f} s, build {b:.1f} s")

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    me = [sys.executable, os.path.abspath(__file__), "--work", args.work, "--threads", str(args.threads),
          "--H", str(args.H), "--kv-heads", str(args.kv_heads), "--seed", str(args.seed)]
    gate = {}
    if not args.skip_gate:
        peers = [m for m in methods if m != "ape-runtime"]
        for enc in encodings:
            for D in Ds:
                cmd = me + ["--child-gate", "--enc", enc, "--D", str(D), "--T", "0", "--B", "0",
                            "--gate-T", str(args.gate_T), "--tol", str(args.tol), "--gate-methods", ",".join(peers)]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                out = p.stdout.strip()
                log(f"[gate] {enc} D={D} T={args.gate_T} (max |error| vs eager fp64):\n  " + out.replace("\n", "\n  "))
                if p.returncode != 0:
                    sys.exit(f"CORRECTNESS GATE FAILED: {enc} D={D}\n{out}\n{p.stderr[-3000:]}")
                gate[(enc, D)] = out

    rows, errors = [], {}
    for dtype in dtypes:
        for D in Ds:
            for B in Bs:
                last = {}  # method, enc -> (T, fwdbwd seconds per step)
                for T in Ts:
                    for enc in encodings:
                        for method in methods:
                            row = dict(encoding=enc, dtype=dtype, D=D, B=B, T=T, method=method, fwd_ms=None,
                                       fwdbwd_ms=None, fwd_peak_mib=None, fwdbwd_peak_mib=None, kernel="",
                                       note="")
                            rows.append(row)
                            if method == "ape-runtime" and (dtype != "fp32" or enc not in RUNTIME_ENCODINGS):
                                row["note"] = "n/a (runtime bench: fp32; nope, rope, alibi, cable)"
                                continue
                            if method == "sdpa-detached" and enc not in TRAINABLE_BIAS:
                                row["note"] = "n/a (no trainable bias: same as sdpa)"
                                continue
                            gib = needs_gib(method, enc, dtype, B, args.H, T)
                            if gib > budget:
                                row["note"] = f"skipped: needs ~{gib:.1f} GiB (budget {budget:.1f} GiB)"
                                continue
                            prev = last.get((method, enc))
                            if prev:
                                predicted = prev[1] * (T / prev[0]) ** 2 * (args.min_reps + 2)
                                if predicted > args.max_seconds:
                                    row["note"] = (f"skipped: ~{predicted / (args.min_reps + 2):.1f} s per step "
                                                   f"predicted from T={prev[0]}, > --max-seconds")
                                    continue
                            if method == "ape-runtime":
                                cmd = [runtime, "--one", "ape", enc, str(T), "--B", str(B), "--H", str(args.H),
                                       "--D", str(D), "--threads", str(args.threads), "--min-reps",
                                       str(args.min_reps), "--min-time", str(args.min_time), "--seed", str(args.seed)]
                            else:
                                cmd = me + ["--child", method, "--enc", enc, "--dtype", dtype, "--T", str(T),
                                            "--B", str(B), "--D", str(D), "--min-reps", str(args.min_reps),
                                            "--min-time", str(args.min_time), "--max-seconds", str(args.max_seconds)]
                            t0 = time.perf_counter()
                            res, err, extra = run_child(cmd, env, timeout=3 * args.max_seconds + 300)
                            wall = time.perf_counter() - t0
                            if extra:
                                errors[(method, enc, dtype)] = extra
                            if res is None:
                                row["note"] = err
                                log(f"[run] {dtype} D={D} B={B} T={T} {enc} {method}: {err}")
                                continue
                            for key in ("fwd", "fwdbwd"):
                                v = res.get(f"{key}_ms")
                                if v == "over":
                                    row["note"] += f"{key}: one step {float(res[key + '_step_ms']) / 1e3:.1f} s, over --max-seconds; "
                                elif v is not None:
                                    row[f"{key}_ms"] = float(v)
                                pk = res.get(f"{key}_peak_mib")
                                if pk not in (None, "na"):
                                    row[f"{key}_peak_mib"] = float(pk)
                            kern = [res.get("fwd_kernel"), res.get("fwdbwd_kernel")]
                            if kern[0]:
                                row["kernel"] = f"fwd {kern[0]}; fwd+bwd {kern[1] or '-'}"
                            if method == "ape":
                                row["kernel"] = f"APE operator ({res.get('level')})"
                            if method == "ape-runtime":
                                row["kernel"] = "APE runtime (registry)"
                            if method == "flex":
                                row["kernel"] = "compiled fwd" + (f"; {res['fwdbwd_mode']} fwd+bwd" if "fwdbwd_mode" in res else "")
                                if extra and row["fwdbwd_ms"] is None:
                                    row["note"] += "fwd+bwd refused (see notes); "
                            step = row["fwdbwd_ms"] or row["fwd_ms"]
                            if step:
                                last[(method, enc)] = (T, step / 1e3)
                            else:
                                last[(method, enc)] = (T, wall / (args.min_reps + 2))
                            log(f"[run] {dtype} D={D} B={B} T={T} {enc:5} {method:11} fwd {fmt_ms(row['fwd_ms']):>9} ms"
                                f"  fwd+bwd {fmt_ms(row['fwdbwd_ms']):>9} ms  peak {row['fwdbwd_peak_mib'] or '-'} MiB"
                                f"  {row['kernel']} {row['note']} ({wall:.0f} s, load {torch_library.loadavg()})")
    report(args, rows, errors, gate, builds, dict(command=command, started=started, load_start=load_start,
                                                  load_end=torch_library.loadavg(), budget=budget,
                                                  minutes=(time.perf_counter() - t_start) / 60))
    return 0


def report(args, rows, errors, gate, builds, run):
    import torch
    ape = {(r["encoding"], r["dtype"], r["D"], r["B"], r["T"]): r for r in rows if r["method"] == "ape"}

    def ratio(r, key):
        a = ape[(r["encoding"], r["dtype"], r["D"], r["B"], r["T"])][key]
        return r[key] / a if (a and r[key]) else None

    lines = [
        "# APE's CPU kernels against PyTorch's attention peers",
        "",
        f"Machine: {machine()}; PyTorch {torch.__version__} (CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}); {args.threads} threads for every method "
        f"(OMP_NUM_THREADS and torch.set_num_threads). Run {run['started']:%Y-%m-%d %H:%M}, "
        f"{run['minutes']:.0f} min; load average {run['load_start']} at the start, {run['load_end']} at the end.",
        "",
        "```sh",
        run["command"],
        "```",
        "",
        f"Causal, H={args.H}" + (f" reading {args.kv_heads} key/value heads (grouped-query attention)"
                                 if args.kv_heads else "") + f"; median of >= {args.min_reps} reps and >= {args.min_time:g} s per process, one "
        f"process per measurement. fwd: inference forward (`torch.no_grad`); fwd+bwd: forward with autograd + "
        f"`backward(dout)`. Peak MiB: resident-set high-water mark of one step above the live state before it, "
        f"plus the method's constant tables. Memory budget for materialising methods: {run['budget']:.0f} GiB.",
        "",
        "## APE against the fastest peer",
        "",
        "speed-up = fastest peer's ms / APE's ms (> 1: APE faster); the peer in brackets. Memory: fastest "
        "fwd+bwd peer's peak / APE's peak. sdpa-detached (no bias gradient) is left out of this table.",
        "",
        "| encoding | dtype | D | B | T | APE fwd ms | fwd speed-up | APE fwd+bwd ms | fwd+bwd speed-up | memory |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    for key, a in ape.items():
        peers = [r for r in rows if (r["encoding"], r["dtype"], r["D"], r["B"], r["T"]) == key
                 and r["method"] not in ("ape", "ape-runtime", "sdpa-detached")]
        cells = []
        for k in ("fwd_ms", "fwdbwd_ms"):
            timed = [r for r in peers if r[k]]
            best = min(timed, key=lambda r: r[k]) if timed else None
            if best and a[k]:
                cells.append(f"{best[k] / a[k]:.2f}x ({best['method']})")
            else:
                cells.append("-")
            if k == "fwdbwd_ms":
                mem = (f"{best['fwdbwd_peak_mib'] / a['fwdbwd_peak_mib']:.1f}x" if best and best["fwdbwd_peak_mib"]
                       and a["fwdbwd_peak_mib"] else "-")
        enc, dtype, D, B, T = key
        lines.append(f"| {enc} | {dtype} | {D} | {B} | {T} | {fmt_ms(a['fwd_ms']) or a['note']} | {cells[0]} | "
                     f"{fmt_ms(a['fwdbwd_ms']) or '-'} | {cells[1]} | {mem} |")
    lines += ["", "## Every measurement", "",
              "speed-up = method's ms / APE's ms at the same shape (> 1: APE faster).", "",
              "| encoding | dtype | D | B | T | method | kernel | fwd ms | fwd+bwd ms | peak fwd MiB | "
              "peak fwd+bwd MiB | APE speed-up fwd | APE speed-up fwd+bwd | note |",
              "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        rf, rb = ratio(r, "fwd_ms"), ratio(r, "fwdbwd_ms")
        pk = [f"{r[k]:.0f}" if r[k] is not None else "" for k in ("fwd_peak_mib", "fwdbwd_peak_mib")]
        lines.append(f"| {r['encoding']} | {r['dtype']} | {r['D']} | {r['B']} | {r['T']} | {r['method']} | "
                     f"{r['kernel']} | {fmt_ms(r['fwd_ms'])} | {fmt_ms(r['fwdbwd_ms'])} | {pk[0]} | {pk[1]} | "
                     f"{'' if rf is None or r['method'] == 'ape' else f'{rf:.2f}x'} | "
                     f"{'' if rb is None or r['method'] == 'ape' else f'{rb:.2f}x'} | {r['note'].strip().rstrip(';')} |")
    if errors:
        lines += ["", "## What PyTorch refused", ""]
        grouped = {}
        for (method, enc, dtype), e in sorted(errors.items()):
            grouped.setdefault((method, e), []).append(f"{enc} {dtype}")
        for (method, e), where in grouped.items():
            lines.append(f"- {method} ({', '.join(where)}): `{e}`")
    if gate:
        lines += ["", f"## Correctness gate (T={args.gate_T}, B=2, fp32, max |error| against the eager "
                  f"reference in fp64; tolerance {args.tol:g})", "", "```"]
        for (enc, D), out in gate.items():
            lines.append(f"{enc} D={D}")
            lines += ["  " + l for l in out.splitlines() if not l.startswith("RESULT")]
        lines.append("```")
    if builds:
        lines += ["", "Library builds (as documented; serial `cmake --build`): " +
                  "; ".join(f"{e} configure {c:.1f} s, build {b:.1f} s" for e, (c, b) in builds.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            cols = ["encoding", "dtype", "D", "B", "T", "method", "kernel", "fwd_ms", "fwdbwd_ms",
                    "fwd_peak_mib", "fwdbwd_peak_mib", "note"]
            w.writerow(cols + ["ape_speedup_fwd", "ape_speedup_fwdbwd"])
            for r in rows:
                rf, rb = ratio(r, "fwd_ms"), ratio(r, "fwdbwd_ms")
                w.writerow([r[c] if r[c] is not None else "" for c in cols] +
                           ["" if rf is None else f"{rf:.4f}", "" if rb is None else f"{rb:.4f}"])


if __name__ == "__main__":
    sys.exit(main())
