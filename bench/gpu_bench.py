#!/usr/bin/env python3
"""APE's CUDA kernels against the peers a PyTorch user would pick instead, on one GPU, in one run.

    python bench/gpu_bench.py --libs LIBDIR [--quick] [--encodings nope,rope,alibi,t5,cable] \\
        [--methods ape,sdpa-cudnn,sdpa-flash,sdpa-mask,flex] [--configs 2x16x8192x128,...] \\
        [--ape-settings NAME:VAR=VALUE[+VAR=VALUE...],...] [--mask-limit-gib 4] [--md out.md] [--csv out.csv]

LIBDIR holds the operator libraries that `apec --emit=torch-library` and CMake build
(docs/frameworks.md) with their CUDA kernels (bf16 at head dims 64 and 128):
LIBDIR/ENC_torch_library/build/ape_ENC.py next to libape_ENC_ops.so (default LIBDIR: this script's
folder). The script needs PyTorch only (and takes Triton's timer where Triton imports); it imports
nothing of the repository, so it may be copied alone next to the libraries.

Methods (bf16, causal, the encoding's logit scale (1/sqrt(D)), gradients of q, k, v, every feature
and every trainable param; the encodings of examples/encodings/ENC.mlir):
  ape         ape_ENC.attention of the generated helper: torch.ops.ape_ENC.attention on its CUDA
              kernel (a row is skipped when the library has no bf16/hdD kernel); features randn
              (B, H, T), params from init_params(H, D) in bf16 (t5's table drawn with std 0.5
              rather than 0.02 so that the spot check sees the bias; no timing depends on it).
              After its runs the helper's backward_status() is read (where the helper has it):
              a backward whose fixed-point sums failed is named in the notes.
  ape:NAME    with --ape-settings NAME:VAR=VALUE[+VAR=VALUE...]: APE again, in the same process,
              with those environment variables set while its cells run (the kernels read
              APE_CUDA_PINGPONG, APE_CUDA_PERSISTENT, APE_CUDA_KV_SPLIT, APE_CUDA_HOPPER_FORWARD,
              APE_CUDA_HOPPER_CONSUMERS, APE_CUDA_TILE_GROUP,
              APE_CUDA_WGMMA_BACKWARD, APE_CUDA_BWD_SUBTILES, APE_CUDA_DQ_TMA, APE_CUDA_BWD_SQUARE,
              APE_CUDA_DQ_DIRECT, APE_CUDA_FEATURE_STEPS, APE_CUDA_MOD_PARAM_SUMS and
              APE_CUDA_DETERMINISTIC at every
              call), after `ape`; its
              spot check is against `ape`, and the report adds a table of each setting's speed-up
              over the default. APE_BENCH_GRAPH=1 (the bench's own variable) times each phase as
              one CUDA graph's replay instead of eager calls (captured after a warm-up on a side
              stream, torch.cuda.graph): the launches' host time drops out, so its rows against
              `ape` say how much of a phase is the host's, not the kernels' (a capture that fails
              is the cell's error).
  sdpa-cudnn  torch.nn.functional.scaled_dot_product_attention(is_causal=True) under
  sdpa-flash  sdpa_kernel(SDPBackend.CUDNN_ATTENTION / FLASH_ATTENTION): nope; rope as
              "... + rotary": q and k rotated first (rotate-half pairs, base 10000, the spec's
              RoPE; cos/sin tables built outside the timing) by the rotation compiled with
              torch.compile(fullgraph=True), one fused pass as a user would write it (the eager
              torch ops, several passes, only where that compile fails: the cell's note says so)
  sdpa-mask   alibi, t5, cable: SDPA with bias and causal mask as a 4-D (B, H, T, T) bf16
              attn_mask under the memory-efficient backend (the math backend where that one
              refuses). alibi's mask is a constant built outside the timing; t5's (from the
              trainable table, as T5 models build it: embedding of the bucket index) and cable's
              (S_i - S_j in fp32, S = cumsum(-softplus(f))) are built in the step so that their
              gradients flow. Skipped where B*H*T*T*2 bytes > --mask-limit-gib.
  flex        torch.compile(flex_attention, dynamic=False) with a causal BlockMask (built outside
              the timing) and the encoding as a score_mod: alibi s - m_h (i - j); t5
              s + table[bucket(i - j), h] (T5's decoder buckets: 32, max distance 128, computed
              by torch ops inside the score_mod); cable s + S[b, h, i] - S[b, h, j] with S computed
              in the step, outside flex (indexed through two copies: Inductor refuses the backward
              of one tensor indexed twice); rope "flex + rotary" (compiled) without a score_mod.
              Compiled with fullgraph=True: a graph break (flex_attention's unfused eager path)
              is an error, not a FlexAttention timing. Where PyTorch refuses (e.g. the backward
              for a trainable captured tensor) its error is the cell.

Phases: fwd = the training forward (autograd recording); bwd = torch.autograd.grad(o, inputs,
dout, retain_graph=True) of an o computed outside the timing (where a compiled backward refuses
retain_graph, bwd = (fwd+bwd) - fwd, said in the notes); fwd+bwd = both. Each is timed by
triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.25, 0.75]) (L2 flushed between
calls): the median of the timed calls, and their quartiles (the report's spread, the CSV's ms_q1 and
ms_q3); or by CUDA events around the same loop where Triton does not import. The first call of every
method (flex: its compilation) is a warm-up outside the timing.

TFLOP/s by FlashAttention's count: causal forward 4*B*H*T*T*D/2 (= 2*B*H*T*T*D), backward 2.5x
and fwd+bwd 3.5x that; rotary, biases and masks are not counted.

Kernels (--kernel-times): after its timings, each cell's fwd and bwd run 3 more times under
torch.profiler (CUDA activity; eager calls, no L2 flush): every kernel, memset and copy on the GPU,
summed by name, per call, with the launches per call, and the phase's time left over (the timed ms
minus the kernels' sum: launch gaps, host work, the L2 flush's misses). It says where a phase's
time goes, e.g. RoPE's forward: its q and k mods against the attention kernel. (--selftest-cpu:
the top-level CPU ops, to test the plumbing.) The profiler runs inside the process that times the
later cells, which may then carry its after-effects (CUPTI left attached): take speed figures from
a run without --kernel-times (scripts/gpu-check.sh leaves it out unless APE_GPU_CHECK_KERNEL_TIMES=1).

Peak memory: torch.cuda.max_memory_allocated() over one fwd+bwd step after
reset_peak_memory_stats(), every live tensor included (q, k, v, dout, features, params, the
method's constants).

Spot check: at the smallest configuration, every peer's o against APE's: max |difference|
(bf16: about 1e-2; above 5e-2 flagged MISMATCH), and each gradient's max |difference| relative to
the largest |APE gradient| (above 5e-2 flagged MISMATCH too). A peer flagged MISMATCH is left out
of "APE against the fastest peer" at every configuration of its encoding.

Every (method, configuration, phase) is tried on its own: an error (out of memory, a compile
failure, a missing backend) becomes the table cell ("OOM", "n/a: reason", "fails: first line")
and the run goes on.

Crashes: each encoding runs in a process of its own (this script again, with the hidden option
--one-encoding; the spot check stays inside it), which hands its finished cells to the parent as
JSON after every cell and says which method, configuration and phase it is starting. A process
that dies (a segfault or abort inside a library, a nonzero exit) costs only what it had not
finished: the cell it was in reads "crashed: signal 11 (SIGSEGV) in ape at B1 H16 T4096 D128
(warm-up); see the log" (its faulthandler traceback is on stderr, before the parent's line
"[gpu_bench] crashed: ..."), the same method's later configurations "not run: ape crashed at
B1 H16 T4096 D128" (after a crash in `ape`, APE's settings, which call the same operator, too),
and a new process runs the rest of the encoding (its peers, without a spot
check where APE's reference was in the dead process). A process whose CUDA context is lost (a
sticky error such as an illegal memory access, which the failing cell names; checked after every
failed cell) stops the same way, the cell keeping its error. The Markdown and CSV files are
rewritten after every process (marked partial until the end; on SIGTERM or SIGINT, e.g. a time
limit, once more saying so), so a run that is stopped keeps every finished row.

Exit status: 0 when the run finished (failed cells included), 1 when no APE library loaded,
2 without a CUDA device, 3 when it finished but a process crashed or lost its CUDA context (the
cells and the notes say where; every other row stands), 128 + N when stopped by signal N.

Hangs: the parent kills an encoding's process that starts no new phase for --cell-timeout
seconds (150; a warm-up's compile included): its cell reads "crashed: hung (no progress in 150 s;
killed) in ...", and a new process runs the rest.

Test-only: APE_BENCH_TEST_CRASH=ENC[/METHOD][@N][:abort|segv|exit|lost|hang],... makes ENC's
process die when it starts METHOD (default ape) at the N-th configuration (default 0): os.abort()
(SIGABRT, the default), a real segfault (SIGSEGV), os._exit(7), a simulated loss of the CUDA
context (the cell fails with a fake CUDA error), or a hang (it sleeps); used with --selftest-cpu
to test the above.
"""
import argparse
import csv
import datetime
import faulthandler
import gc
import importlib.util
import inspect
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ENCODINGS = ["nope", "rope", "alibi", "t5", "cable"]
METHODS = ["ape", "sdpa-cudnn", "sdpa-flash", "sdpa-mask", "flex"]
PEERS = {  # the peers of each encoding, in table order (other encodings: ape alone)
    "nope": ["sdpa-cudnn", "sdpa-flash", "flex"],
    "rope": ["sdpa-cudnn", "sdpa-flash", "flex"],
    "alibi": ["sdpa-mask", "flex"],
    "t5": ["sdpa-mask", "flex"],
    "cable": ["sdpa-mask", "flex"],
}
FULL = [(2, 16, 8192, 128), (8, 16, 2048, 128), (2, 32, 8192, 64)]  # (B, H, T, D)
QUICK = [(1, 16, 4096, 128), (4, 16, 1024, 64)]
PHASES = ["fwd", "bwd", "fwdbwd"]
PHASE_NAMES = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
MISMATCH = 5e-2  # max |o - APE's o| above this is flagged (bf16: about 1e-2 expected)
GRAD_MISMATCH = 5e-2  # a gradient's max |diff| / max |APE's| above this is flagged (bf16: below 1e-2 seen)
T5_TABLE_STD = 0.5
SETTINGS = {}  # --ape-settings: NAME -> {VAR: VALUE}, the methods ape:NAME
KERNEL_TIMES = False  # --kernel-times
KV_HEADS = 0  # --kv-heads: key/value heads (0: H)
KERNEL_REPS = 3  # calls profiled per phase
KERNEL_ROWS = 8  # kernels listed per phase (the rest summed as one row)
GIB, MIB = 1 << 30, 1 << 20

torch = None  # imported in main(), after the arguments (so that --help needs no PyTorch)
F = None


def log(text):
    print(f"[gpu_bench] {text}", file=sys.stderr, flush=True)


def is_ape(method):
    """APE's own rows: `ape` and its settings `ape:NAME`."""
    return method == "ape" or method.startswith("ape:")


def label(enc, method):
    """The row's name: the rope peers say that they rotate q and k first (compiled; the cell's note
    says where the eager rotation ran instead)."""
    if enc == "rope" and not is_ape(method):
        return f"{method} + rotary"
    return method


def config_name(cfg):
    B, H, T, D = cfg
    return f"B{B} H{H} T{T} D{D}"


def forward_flops(cfg):
    """FlashAttention's count for the causal forward: 4*B*H*T*T*D / 2."""
    B, H, T, D = cfg
    return 4.0 * B * H * T * T * D / 2


# ---- errors as table cells ------------------------------------------------------------------------

class NotApplicable(Exception):
    """The method does not apply to this encoding or configuration: the cell reads 'n/a: reason'."""


def is_oom(exc):
    oom = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                            getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def error_text(exc):
    """'OOM', 'n/a: reason', or 'fails: Type: first line' (and the next line where the first only
    announces it, as torch.compile's 'backend raised:' does)."""
    if isinstance(exc, NotApplicable):
        return f"n/a: {exc}"
    if is_oom(exc):
        return "OOM"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text += " " + lines[1]
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return "fails: " + (text if len(text) <= 200 else text[:197] + "...")


def short(err):
    """An error's tag inside a 'fwd / bwd / fwd+bwd' cell (the whole text goes to the notes)."""
    return err if err in ("OOM", "-") else err.split(":")[0]


def free_memory(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


# ---- timing ----------------------------------------------------------------------------------------

class Timing(float):
    """A cell's time in ms: the median of the timed calls, with their first and third quartiles
    (q1, q3), the spread within the cell's own loop."""

    def __new__(cls, median, q1, q3):
        t = super().__new__(cls, median)
        t.q1, t.q3 = float(q1), float(q3)
        return t


def quartiles(times):
    """Timing of a list of per-call times (ms)."""
    times = sorted(times)
    if len(times) < 2:
        return Timing(times[0], times[0], times[0])
    q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return Timing(statistics.median(times), q1, q3)


def make_timer(device):
    """(fn -> Timing, description)."""
    if device == "cpu":  # --selftest-cpu: plumbing only
        def cpu_ms(fn, reps=3):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return quartiles(times)
        return cpu_ms, "time.perf_counter, median and quartiles of 3 (CPU self-test: no meaning)"
    try:
        import triton
        from triton.testing import do_bench
        if "quantiles" in inspect.signature(do_bench).parameters:
            def triton_ms(fn):
                median, q1, q3 = do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.25, 0.75])
                return Timing(median, q1, q3)
            return triton_ms, (f"triton.testing.do_bench(warmup=25, rep=100, quantiles=[0.5, 0.25, 0.75]): the "
                               f"median and the quartiles of the timed calls, Triton {triton.__version__}")
    except Exception:  # Triton missing or too old: CUDA events around the same loop
        pass
    return events_ms, ("CUDA events, median and quartiles of the timed calls (do_bench's loop: warm-up 25 ms, "
                       "100 ms of reps, L2 flushed)")


def events_ms(fn, warmup=25, rep=100):
    """triton.testing.do_bench's loop with CUDA events: one call, five to estimate, warmup ms of
    calls, then rep ms of timed calls, the L2 cache flushed before each; their Timing."""
    cache = torch.empty(256 * MIB, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        cache.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    n_warmup, n_repeat = max(1, int(warmup / estimate)), max(1, int(rep / estimate))
    for _ in range(n_warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for s, e in zip(starts, ends):
        cache.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return quartiles([s.elapsed_time(e) for s, e in zip(starts, ends)])


# ---- the APE libraries -----------------------------------------------------------------------------

def load_helper(libs, enc):
    """(the generated module ape_ENC, torch.ops.ape_ENC) of LIBS/ENC_torch_library/build/: imported
    from its file path, registered in sys.modules under its name first (Python's recipe; torch.compile
    imports the modules it traces by name), its operator library loaded."""
    path = os.path.join(libs, f"{enc}_torch_library", "build", f"ape_{enc}.py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing")
    name = f"ape_{enc}"
    spec = importlib.util.spec_from_file_location(name, path)
    helper = importlib.util.module_from_spec(spec)
    sys.modules[name] = helper
    try:
        spec.loader.exec_module(helper)
        ops = helper.load()
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return helper, ops


# ---- the encodings in torch ops (the peers' side) ---------------------------------------------------

def rotary_tables(T, D, device):
    """cos, sin (T, D) in bf16 for rotate-half RoPE, base 10000: pairs (c, c + D/2), angle
    n * 10000^(-2c/D)."""
    theta = 1e4 ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return (torch.cos(angle).to(device=device, dtype=torch.bfloat16),
            torch.sin(angle).to(device=device, dtype=torch.bfloat16))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


_compiled_rotate = None


def compiled_rotate():
    """rotate through torch.compile (one fused read and write of q or k, forward and backward): what
    a PyTorch user beside SDPA would run; the eager one is several passes (an unfair peer)."""
    global _compiled_rotate
    if _compiled_rotate is None:
        _compiled_rotate = torch.compile(rotate, dynamic=False, fullgraph=True)
    return _compiled_rotate


def t5_bucket(n):
    """T5's relative-position bucket, decoder form (bidirectional=False, 32 buckets, max distance
    128), of the distance n = max(i - j, 0) (an integer tensor of any shape): n below 16, else
    min(16 + floor(ln(n / 16) / ln(128 / 16) * 16), 31)."""
    large = 16 + (torch.log(torch.clamp(n, min=16).to(torch.float32) / 16.0)
                  / math.log(128 / 16) * 16.0).to(n.dtype)
    return torch.where(n < 16, n, torch.clamp(large, max=31))


class Case:
    """One encoding at one configuration: the inputs every method shares."""

    def __init__(self, enc, helper, ops, cfg, device, seed):
        self.enc, self.h, self.ops, self.cfg, self.device = enc, helper, ops, cfg, device
        self.B, self.H, self.T, self.D = B, H, T, D = cfg
        bf16 = torch.bfloat16
        torch.manual_seed(seed)
        g = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape):
            return torch.randn(*shape, generator=g, device=device, dtype=bf16)
        KV = KV_HEADS or H  # --kv-heads: grouped-query attention, every method given the same groups
        self.gqa = KV != H
        self.q, self.k, self.v = (randn(B, n, T, D).requires_grad_() for n in (H, KV, KV))
        self.dout = randn(B, H, T, D)
        self.features = [randn(B, H, T).requires_grad_() for _ in helper.FEATURES]
        init = helper.init_params(H, D)
        self.missing = [n for n in helper.PARAMS if n not in init]
        self.params = {}
        for p in helper.MANIFEST["params"]:
            if p["name"] not in init:
                continue
            t = init[p["name"]]
            if enc == "t5" and p["name"] == "t5_table" and p["init"]["kind"] == "normal":
                t = t * (T5_TABLE_STD / float(p["init"].get("std", 0.02)))
            self.params[p["name"]] = t.detach().to(device=device, dtype=bf16).requires_grad_(t.requires_grad)
        trainable = [n for n, t in self.params.items() if t.requires_grad]
        self.leaves = [self.q, self.k, self.v, *self.features, *[self.params[n] for n in trainable]]
        self.leaf_names = ["q", "k", "v", *[f"f:{n}" for n in helper.FEATURES], *trainable]
        self.scale = helper.default_scale(D)

    def param(self, name):
        if name not in self.params:
            raise NotApplicable(f"the manifest has no param {name!r} (params: {list(self.params)})")
        return self.params[name]

    def feature(self, index):
        if index >= len(self.features):
            raise NotApplicable(f"the manifest has no feature {index}")
        return self.features[index]


def sdpa_mask_builder(case):
    """() -> the (B, H, T, T) bf16 attn_mask (bias, -inf above the diagonal) of alibi, t5 or cable;
    built inside the step where it depends on a trainable input."""
    B, H, T = case.B, case.H, case.T
    pos = torch.arange(T, device=case.device)
    upper, inf = pos[None, :] > pos[:, None], float("inf")  # (T, T): True where the key follows the query
    if case.enc == "alibi":  # -m_h (i - j)
        m = case.param("alibi_slopes")
        i = torch.arange(T, device=case.device, dtype=torch.float32)
        dist = i[:, None] - i[None, :]

        def alibi():
            bias = (-m.float().view(H, 1, 1) * dist).masked_fill_(upper, -inf)
            return bias.to(torch.bfloat16).unsqueeze(0).expand(B, -1, -1, -1)
        if m.requires_grad:
            return alibi
        with torch.no_grad():
            const = alibi()
        return lambda: const
    if case.enc == "t5":  # table[bucket(i - j), h]; index 32 (row of -inf) above the diagonal
        table = case.param("t5_table")
        i = torch.arange(T, device=case.device, dtype=torch.int32)
        index = t5_bucket(torch.clamp(i[:, None] - i[None, :], min=0)).masked_fill_(upper, 32)
        neg = torch.full((1, H), -inf, device=case.device, dtype=torch.bfloat16)

        def t5():
            bias = F.embedding(index, torch.cat([table, neg]))  # (T, T, H)
            return bias.permute(2, 0, 1).contiguous().unsqueeze(0).expand(B, -1, -1, -1)
        return t5
    if case.enc == "cable":  # S_i - S_j in fp32, S = cumsum(-softplus(f))
        f = case.feature(0)

        def cable():
            s = torch.cumsum(-F.softplus(f.float()), dim=-1)
            return (s[..., :, None] - s[..., None, :]).masked_fill_(upper, -inf).to(torch.bfloat16)
        return cable
    raise NotApplicable(f"no mask written for {case.enc}")


_compiled_flex = None


def compiled_flex():
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        # fullgraph: a graph break would run flex_attention's unfused eager path, timed as FlexAttention.
        _compiled_flex = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return _compiled_flex


def flex_builder(case):
    """() -> o through compiled flex_attention, the encoding as a score_mod (closures made in the
    step capture what it computes: their tensors are graph inputs, not recompiles)."""
    from torch.nn.attention.flex_attention import create_block_mask
    flex = compiled_flex()
    q, k, v, enc = case.q, case.k, case.v, case.enc
    if enc not in PEERS:
        raise NotApplicable(f"no score_mod written for {enc}")
    block_mask = create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, case.T, case.T, device=case.device)

    def run(q, k, score_mod=None):
        args = dict(score_mod=score_mod, block_mask=block_mask, scale=case.scale, enable_gqa=case.gqa)
        try:
            return flex(q, k, v, **args)
        except Exception as exc:
            if type(exc).__name__ != "Unsupported":
                raise
            # fullgraph reports an error raised inside flex_attention as "Observed exception": the
            # eager call says which (else the compile met a graph break, said as such).
            from torch.nn.attention.flex_attention import flex_attention as eager
            eager(q, k, v, **args)
            raise RuntimeError("a graph break under torch.compile(fullgraph=True), which would time "
                               f"flex_attention's unfused path: {error_text(exc)}") from exc
    if enc == "nope":
        return lambda: run(q, k)
    if enc == "rope":
        cos, sin = rotary_tables(case.T, case.D, case.device)
        rot = compiled_rotate()
        return lambda: run(rot(q, cos, sin), rot(k, cos, sin))
    if enc == "alibi":
        m = case.param("alibi_slopes")

        def alibi():
            slopes = m.float()
            return run(q, k, lambda s, b, h, qi, kv: s - slopes[h] * (qi - kv))
        return alibi
    if enc == "t5":
        table = case.param("t5_table")

        def t5():
            t = table.float()
            return run(q, k, lambda s, b, h, qi, kv: s + t[t5_bucket(torch.clamp(qi - kv, min=0)), h])
        return t5
    f = case.feature(0)  # cable

    def cable():
        S = torch.cumsum(-F.softplus(f.float()), dim=-1)
        # Two tensors, each indexed once: Inductor refuses a score_mod's backward that indexes one
        # gradient-carrying tensor twice, and its message names this copy as the way round.
        Sk = S.clone()
        return run(q, k, lambda s, b, h, qi, kv: s + (S[b, h, qi] - Sk[b, h, kv]))
    return cable


def candidates(method, case, mask_limit_gib):
    """[(note, builder)]: the ways to run the method, tried in order until one warms up (forward
    and backward); each builder returns the forward () -> o."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    enc = case.enc
    if is_ape(method):
        def ape():
            if case.missing:
                raise NotApplicable(f"params without a manifest initialiser: {case.missing}")
            if case.device == "cuda":
                want, have = f"bf16/hd{case.D}", list(case.ops.cuda_kernels())
                if want not in have:
                    raise NotApplicable(f"the library has no {want} CUDA kernel (it has {have or 'none'})")
            h, q, k, v, features, params = case.h, case.q, case.k, case.v, case.features, case.params
            return lambda: h.attention(q, k, v, features, params)
        return [("", ape)]
    if method in ("sdpa-cudnn", "sdpa-flash"):
        backend = SDPBackend.CUDNN_ATTENTION if method == "sdpa-cudnn" else SDPBackend.FLASH_ATTENTION

        def sdpa(compiled):
            def build():
                if enc not in ("nope", "rope"):
                    raise NotApplicable("takes no bias (see sdpa-mask)")
                q, k, v, scale = case.q, case.k, case.v, case.scale
                rot = rotary_tables(case.T, case.D, case.device) if enc == "rope" else None
                rot_fn = compiled_rotate() if compiled else rotate

                def fwd():
                    qq, kk = (rot_fn(q, *rot), rot_fn(k, *rot)) if rot else (q, k)
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qq, kk, v, is_causal=True, scale=scale,
                                                              enable_gqa=case.gqa)
                return fwd
            return build
        if enc == "rope":  # the rotary compiled, as a user would; eager only where that fails (named)
            return [("rotary by torch.compile", sdpa(True)), ("eager rotary", sdpa(False))]
        return [("", sdpa(False))]
    if method == "sdpa-mask":
        def masked(backend):
            def build():
                if enc not in ("alibi", "t5", "cable"):
                    raise NotApplicable("no bias to materialise (see sdpa-cudnn, sdpa-flash)")
                need = case.B * case.H * case.T * case.T * 2
                if need > mask_limit_gib * GIB:
                    raise NotApplicable(f"the (B, H, T, T) bf16 mask would take {need / GIB:.1f} GiB "
                                        f"> {mask_limit_gib:g} GiB")
                mask = sdpa_mask_builder(case)
                q, k, v, scale = case.q, case.k, case.v, case.scale

                def fwd():
                    m = mask()
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale,
                                                              enable_gqa=case.gqa)
                return fwd
            return build
        return [("memory-efficient backend", masked(SDPBackend.EFFICIENT_ATTENTION)),
                ("math backend", masked(SDPBackend.MATH))]
    if method == "flex":
        return [("", lambda: flex_builder(case))]
    raise ValueError(method)


# ---- one method at one configuration ---------------------------------------------------------------

class Cell:
    """The results of one method at one configuration."""

    def __init__(self, enc, method, cfg):
        self.enc, self.method, self.cfg = enc, method, cfg
        self.ms, self.err, self.notes = {}, {}, []
        self.spread = {}  # phase -> [q1, q3] of the timed calls, ms
        self.peak_mib = None
        self.check = None  # spot-check text
        self.kernels = {}  # --kernel-times: phase -> [[name, us per call, launches per call], ...]

    def fail_all(self, text):
        for p in PHASES:
            self.err.setdefault(p, text)

    def tflops(self, phase):
        ms = self.ms.get(phase)
        return forward_flops(self.cfg) * FLOP_FACTOR[phase] / (ms * 1e-3) / 1e12 if ms else None

    def to_json(self):
        return {"enc": self.enc, "method": self.method, "cfg": list(self.cfg), "ms": self.ms, "err": self.err,
                "notes": self.notes, "peak_mib": self.peak_mib, "check": self.check, "kernels": self.kernels,
                "spread": self.spread}

    def set_time(self, phase, t):
        self.ms[phase] = float(t)
        if isinstance(t, Timing):
            self.spread[phase] = [t.q1, t.q3]

    def spread_pct(self, phase):
        """Half the interquartile range of the timed calls, in % of their median."""
        ms, q = self.ms.get(phase), self.spread.get(phase)
        return 50.0 * (q[1] - q[0]) / ms if ms and q else None

    @classmethod
    def from_json(cls, d):
        c = cls(d["enc"], d["method"], tuple(d["cfg"]))
        c.ms, c.err, c.notes = dict(d["ms"]), dict(d["err"]), list(d["notes"])
        c.peak_mib, c.check = d["peak_mib"], d["check"]
        c.kernels = dict(d.get("kernels") or {})
        c.spread = dict(d.get("spread") or {})
        return c


def short_kernel(name):
    """A kernel's name without its return type, namespaces and arguments; template arguments kept
    (without namespaces), at most 90 characters."""
    name = re.sub(r"^void ", "", name.strip())
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = re.sub(r"\b[A-Za-z_]\w*::", "", name[:cut])
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= 90 else name[:87] + "..."


def kernel_times(fn, device, reps=None):
    """[[name, us per call, launches per call], ...] of fn() under torch.profiler, the longest
    first: the GPU's kernels, memsets and copies (on the CPU, for the self-test: the top-level ops)."""
    from torch.profiler import ProfilerActivity, profile
    reps = reps or KERNEL_REPS
    fn()
    sync(device)
    acts = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        sync(device)
    total, count = {}, {}
    for e in prof.events():
        if getattr(e, "is_user_annotation", False):  # a range around kernels, not one
            continue
        on_gpu = str(getattr(e, "device_type", "")).endswith("CUDA")
        if device == "cuda" and not on_gpu:
            continue
        if device != "cuda" and (on_gpu or getattr(e, "cpu_parent", None) is not None):
            continue
        name = short_kernel(e.name)
        total[name] = total.get(name, 0.0) + e.time_range.elapsed_us()
        count[name] = count.get(name, 0) + 1
    rows = [[n, total[n] / reps, count[n] / reps] for n in total]
    return sorted(rows, key=lambda r: -r[1])


def captured(fn, stream):
    """fn() captured in a CUDA graph on `stream`, after one call there (torch.cuda.graph's rule for
    work that allocates); replay() runs it again on the same tensors. A backward alone must be
    captured on the stream its forward ran on: autograd launches each backward op on its forward
    op's stream."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return graph


def run_method(method, case, timer, mask_limit_gib, keep_outputs, progress=None):
    """Warms up, times the three phases, measures the peak of one fwd+bwd step. Returns the Cell
    and, when keep_outputs, (o, grads) of that step (grads None where the backward failed).
    progress(phase), where given, is told each phase before it starts."""
    progress = progress or (lambda phase: None)
    cell, device = Cell(case.enc, method, case.cfg), case.device
    leaves, dout = case.leaves, case.dout
    chosen = fallback = None
    tried = []  # (way, error) of the ways that did not warm up
    t0 = time.perf_counter()
    for way, build in candidates(method, case, mask_limit_gib):
        progress("warm-up" + (f", {way}" if way else ""))
        try:
            f = build()
        except Exception as exc:
            if isinstance(exc, NotApplicable) or is_oom(exc):  # another way would not do better
                cell.fail_all(error_text(exc))
                free_memory(device)
                return cell, None
            tried.append((way, error_text(exc)))
            continue
        fwd_err = bwd_err = None
        try:  # warm-up (flex: compiles the forward and the backward)
            o = f()
            sync(device)
            try:
                torch.autograd.grad(o, leaves, dout)
                sync(device)
            except Exception as exc:
                bwd_err = error_text(exc)
            o = None
        except Exception as exc:
            fwd_err = error_text(exc)
        free_memory(device)
        if fwd_err is None and bwd_err is None:
            chosen = (way, f, None)
            break
        tried.append((way, fwd_err or bwd_err))
        if fwd_err is None and fallback is None:
            fallback = (way, f, bwd_err)  # the forward runs: timed, the backward's error recorded
        if "OOM" in (fwd_err, bwd_err):
            break
    chosen = chosen or fallback
    if chosen is None:
        cell.fail_all(tried[0][1] if tried else "fails: no way to run it")
        cell.notes += [f"{w}: {e}" for w, e in tried[1:]]
        return cell, None
    way, f, bwd_err = chosen
    if way:
        others = [f"{w}: {e}" for w, e in tried if w != way]
        cell.notes.append(way + (f" ({'; '.join(others)})" if others else ""))
    if method == "flex":
        cell.notes.append(f"compile and warm-up {time.perf_counter() - t0:.1f} s")

    graphs = is_ape(method) and os.environ.get("APE_BENCH_GRAPH") == "1"
    if graphs and device != "cuda":
        cell.notes.append("APE_BENCH_GRAPH: no CUDA graphs on the CPU, eager calls timed")
        graphs = False
    capture_stream = torch.cuda.Stream() if graphs else None

    def attempt(phase, fn):
        progress(PHASE_NAMES[phase])
        try:
            if graphs:
                graph = captured(fn, capture_stream)
                cell.set_time(phase, timer(graph.replay))
                graph = None
            else:
                cell.set_time(phase, timer(fn))
        except Exception as exc:
            cell.err[phase] = error_text(exc)
        free_memory(device)

    attempt("fwd", f)
    if bwd_err is not None:
        cell.err["bwd"] = cell.err["fwdbwd"] = bwd_err
    else:
        try:  # o outside the timing, its graph kept (on the capture stream for a graph's backward)
            if graphs:
                capture_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(capture_stream):
                    o = f()
            else:
                o = f()
            attempt("bwd", lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True))
        except Exception as exc:
            cell.err["bwd"] = error_text(exc)
        o = None
        free_memory(device)
        attempt("fwdbwd", lambda: torch.autograd.grad(f(), leaves, dout))
        if cell.err.get("bwd", "OOM") != "OOM" and "fwdbwd" in cell.ms and "fwd" in cell.ms:
            cell.notes.append(f"bwd = (fwd+bwd) - fwd: the retain_graph backward {cell.err.pop('bwd')}")
            cell.ms["bwd"] = max(cell.ms["fwdbwd"] - cell.ms["fwd"], 0.0)
    if KERNEL_TIMES and not graphs:
        for phase in ("fwd", "bwd"):
            if phase not in cell.ms:
                continue
            progress(f"kernel times, {PHASE_NAMES[phase]}")
            try:
                if phase == "fwd":
                    cell.kernels[phase] = kernel_times(f, device)
                else:
                    o = f()
                    cell.kernels[phase] = kernel_times(
                        lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True), device)
                    o = None
            except Exception as exc:
                cell.notes.append(f"kernel times of {PHASE_NAMES[phase]} {error_text(exc)}")
            free_memory(device)
    outputs = None
    if "fwd" in cell.ms and (keep_outputs or "fwdbwd" in cell.ms):
        try:  # one fwd+bwd step: the peak memory, and the spot check's outputs
            progress("peak-memory step")
            free_memory(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            o, grads = f(), None
            if bwd_err is None:
                try:
                    grads = torch.autograd.grad(o, leaves, dout)
                except Exception:
                    pass
            sync(device)
            if device == "cuda" and grads is not None and "fwdbwd" in cell.ms:
                cell.peak_mib = torch.cuda.max_memory_allocated() / MIB
            if keep_outputs:
                outputs = (o.detach(), None if grads is None else [g.detach() for g in grads])
            o = grads = None
        except Exception as exc:
            cell.notes.append(f"peak/spot-check step {error_text(exc)}")
    if is_ape(method) and device == "cuda" and hasattr(case.h, "backward_status"):
        progress("backward_status")
        try:  # what the CUDA backward could not sum (the gradients concerned are NaN)
            bits, messages = case.h.backward_status(clear=True)
            if bits & 7:
                cell.notes.append(f"backward status {bits}: {'; '.join(messages)}")
        except Exception as exc:
            cell.notes.append(f"backward_status {error_text(exc)}")
    return cell, outputs


def spot_check(ref, got, names):
    """(text, mismatch) comparing a peer's (o, grads) with APE's."""
    o, g = got
    o_ref = ref[0].to(o.device)
    g_ref = None if ref[1] is None else [t.to(o.device) for t in ref[1]]
    d = (o.float() - o_ref.float()).abs().max().item()
    bad = not math.isfinite(d) or d > MISMATCH
    text = f"max |o - APE's o| {d:.1e}" + (" MISMATCH" if bad else "")
    if g is not None and g_ref is not None:
        rel, wrong = [], []
        for n, a, b in zip(names, g, g_ref):
            # (relative to the larger of the two: an all-zero gradient of APE's against a tiny one of the
            # peer's is not a mismatch, a zero against a large one is)
            scale = max(b.float().abs().max().item(), a.float().abs().max().item())
            r = (a.float() - b.float()).abs().max().item() / max(scale, 1e-30)
            rel.append(f"{n} {r:.1e}")
            if not math.isfinite(r) or r > GRAD_MISMATCH:
                wrong.append(n)
        text += "; gradients, max |diff| / max |APE's|: " + ", ".join(rel)
        if wrong:  # (a wrong gradient, a T5 table's say, is as much a mismatch as a wrong o)
            bad = True
            text += f" MISMATCH (gradient{'s' if len(wrong) > 1 else ''} {', '.join(wrong)} above {GRAD_MISMATCH:g})"
    return text, bad


# ---- the report -------------------------------------------------------------------------------------

def fmt_ms(x):
    return f"{x:.3f}" if x < 1 else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def fmt_tflops(x):
    return f"{x:.0f}" if x >= 100 else (f"{x:.1f}" if x >= 1 else f"{x:.2f}")


def cell_text(cell, value):
    """'fwd / bwd / fwd+bwd' of value(phase), or the one error all three share."""
    if cell is None:
        return ""
    errs = [cell.err.get(p) for p in PHASES]
    if not cell.ms and errs[0] is not None and all(e == errs[0] for e in errs):
        text = errs[0].replace("|", "/")
        return text if len(text) <= 100 else text[:97] + "..."  # the whole line is in the notes
    parts = []
    for p in PHASES:
        v = value(p)
        parts.append(short(cell.err.get(p, "-")) if v is None else v)
    return " / ".join(parts)


class replaced:
    """open(path, "w") for a report rewritten during the run: a regular file is written beside and
    renamed over (a reader, or a kill, never sees half of it); anything else (/dev/stdout) as is."""

    def __init__(self, path):
        self.path = path
        regular = not os.path.exists(path) or (os.path.isfile(path) and not os.path.islink(path))
        self.tmp = path + ".tmp" if regular else None

    def __enter__(self):
        self.f = open(self.tmp or self.path, "w", newline="")
        return self.f

    def __exit__(self, kind, exc, tb):
        self.f.close()
        if self.tmp and kind is None:
            os.replace(self.tmp, self.path)
        elif self.tmp:
            os.unlink(self.tmp)


def quartile_fields(cell, phase):
    """The CSV's ms_q1, ms_q3 of a cell's phase ("" where not timed by itself)."""
    q = cell.spread.get(phase)
    return [f"{q[0]:.4f}", f"{q[1]:.4f}"] if q else ["", ""]


def report(args, cells, rows_order, configs, header, notes, final=True):
    """Writes the Markdown (--md) and CSV (--csv) reports; prints the Markdown when final."""
    by_key = {(c.enc, c.method, c.cfg): c for c in cells}
    head = "| encoding | method | " + " | ".join(config_name(c) for c in configs) + " |"
    rule = "| --- | --- |" + " ---: |" * len(configs)

    def table(text_of):
        """One row per (encoding, method), one column per configuration: text_of(cell)."""
        lines = [head, rule]
        for enc, method in rows_order:
            cells_ = [by_key.get((enc, method, cfg)) for cfg in configs]
            lines.append(f"| {enc} | {label(enc, method)} | " +
                         " | ".join("" if c is None else text_of(c) for c in cells_) + " |")
        return lines

    def tflops(c, p):
        return None if c.tflops(p) is None else fmt_tflops(c.tflops(p))

    def ms(c, p):
        return fmt_ms(c.ms[p]) if p in c.ms else None

    def peak(c):
        return f"{c.peak_mib:.0f}" if c.peak_mib is not None else short(c.err.get("fwdbwd", "-"))

    # A peer whose spot check flagged a mismatch computes something else: never "the fastest peer".
    mismatched = {(x.enc, x.method) for x in by_key.values() if x.check and "MISMATCH" in x.check}

    def speedup(c):  # c: APE's cell
        parts = []
        for p in ("fwd", "fwdbwd"):
            peers = [x for (e, m, k), x in by_key.items() if e == c.enc and k == c.cfg and not is_ape(m) and p in x.ms
                     and (e, m) not in mismatched]
            best = min(peers, key=lambda x: x.ms[p]) if peers else None
            if best is not None and p in c.ms and c.ms[p] > 0:
                parts.append(f"{PHASE_NAMES[p]} {best.ms[p] / c.ms[p]:.2f}x ({label(c.enc, best.method)})")
            else:
                parts.append(f"{PHASE_NAMES[p]} -")
        return "; ".join(parts)

    lines = ["# APE's CUDA kernels against PyTorch's attention peers (bf16, causal)", ""]
    lines += [f"- {k}: {v}" for k, v in header]
    lines += ["", "fwd: the training forward; bwd: torch.autograd.grad of an o computed outside the timing; "
              "fwd+bwd: both. Gradients of q, k, v, every feature and every trainable param. The rope peers "
              "include the rotary of q and k (compiled by torch.compile; eager where a note says so). TFLOP/s by FlashAttention's count: fwd 4*B*H*T*T*D/2 "
              "(causal), bwd 2.5x, fwd+bwd 3.5x. The methods: the docstring of gpu_bench.py.",
              "", "## TFLOP/s (fwd / bwd / fwd+bwd)", ""]
    lines += table(lambda c: cell_text(c, lambda p: tflops(c, p)))
    lines += ["", "## Time, ms (fwd / bwd / fwd+bwd)", ""]
    lines += table(lambda c: cell_text(c, lambda p: ms(c, p)))
    lines += ["", "## Spread within each cell, % (fwd / bwd / fwd+bwd)", "",
              "Half the interquartile range of the cell's timed calls, in % of their median: how far apart "
              "two timings of one kernel in this run may fall (a ratio between two methods closer to 1 than "
              "their spreads together is no difference). Not the spread between runs or cards.", ""]
    lines += table(lambda c: cell_text(c, lambda p: None if c.spread_pct(p) is None else f"{c.spread_pct(p):.1f}"))
    lines += ["", "## Peak memory of one fwd+bwd step, MiB", "",
              "torch.cuda.max_memory_allocated() after reset_peak_memory_stats(): everything live, "
              "q, k, v, dout, features, params and the method's constants included.", ""]
    lines += table(peak)
    lines += ["", "## APE against the fastest peer", "",
              "speed-up = the fastest peer's ms / APE's ms (> 1: APE faster), that peer in brackets.", "",
              head, rule]
    for enc in dict.fromkeys(e for e, m in rows_order if m == "ape"):
        cells_ = [by_key.get((enc, "ape", cfg)) for cfg in configs]
        lines.append(f"| {enc} | ape | " + " | ".join("" if c is None else speedup(c) for c in cells_) + " |")
    if SETTINGS:
        def over_default(c):  # c: an ape:NAME cell
            base = by_key.get((c.enc, "ape", c.cfg))
            return cell_text(c, lambda p: f"{base.ms[p] / c.ms[p]:.2f}x"
                             if base is not None and p in base.ms and p in c.ms and c.ms[p] > 0 else None)
        lines += ["", "## APE's settings against its default", "",
                  "speed-up = `ape`'s ms / the setting's ms (> 1: the setting is faster), fwd / bwd / fwd+bwd; "
                  "the settings: " + "; ".join(f"`ape:{n}` " + " ".join(f"{k}={v}" for k, v in env.items())
                                               for n, env in SETTINGS.items()) + ".", "", head, rule]
        for enc, method in rows_order:
            if method.startswith("ape:"):
                cells_ = [by_key.get((enc, method, cfg)) for cfg in configs]
                lines.append(f"| {enc} | {method} | " + " | ".join("" if c is None else over_default(c)
                                                                     for c in cells_) + " |")
    kernel_lines = []
    for enc, method in rows_order:
        for cfg in configs:
            c = by_key.get((enc, method, cfg))
            for p in ("fwd", "bwd"):
                rows = [] if c is None else c.kernels.get(p) or []
                if not rows:
                    continue
                where = f"{enc} / {label(enc, method)} / {config_name(cfg)} / {PHASE_NAMES[p]}"
                shown, rest = rows[:KERNEL_ROWS], rows[KERNEL_ROWS:]
                for name, us, n in shown:
                    kernel_lines.append(f"| {where} | `{name}` | {us:.1f} | {n:g} |")
                if rest:
                    kernel_lines.append(f"| {where} | {len(rest)} others | {sum(r[1] for r in rest):.1f} | "
                                        f"{sum(r[2] for r in rest):g} |")
                summed = sum(r[1] for r in rows)
                left = f"; the timed {c.ms[p] * 1e3:.1f} us less that: {c.ms[p] * 1e3 - summed:.1f}" if p in c.ms else ""
                kernel_lines.append(f"| {where} | **all** ({summed:.1f} us{left}) | {summed:.1f} | "
                                    f"{sum(r[2] for r in rows):g} |")
    if kernel_lines:
        lines += ["", "## Kernels per call (--kernel-times)", "",
                  f"torch.profiler over {KERNEL_REPS} eager calls of each phase after its timing (no L2 flush): "
                  "GPU time per call by kernel, the longest first, and launches per call.", "",
                  "| cell | kernel | us | launches |", "| --- | --- | ---: | ---: |"] + kernel_lines
    notes = list(notes)
    for enc, method in rows_order:
        for cfg in configs:
            c = by_key.get((enc, method, cfg))
            if c is None:
                continue
            where = f"{enc} / {label(enc, method)} / {config_name(cfg)}"
            errs = {}
            for p in PHASES:
                if (p in c.err and c.err[p] != "OOM" and not c.err[p].startswith("not run:")
                        and (not c.err[p].startswith("n/a") or len(c.err[p]) > 100)):
                    errs.setdefault(c.err[p], []).append(PHASE_NAMES[p])
            notes += [f"{where}: {', '.join(phases)} {e}" for e, phases in errs.items()]
            notes += [f"{where}: {n}" for n in c.notes]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    if final:
        print(text, flush=True)
    if args.md:
        with replaced(args.md) as f:
            f.write(text)
    if args.csv:
        with replaced(args.csv) as f:
            w = csv.writer(f)
            gpu = dict(header).get("GPU", "?")  # (the card, in every row: a CSV travels without its report)
            w.writerow(["encoding", "method", "config", "phase", "ms", "tflops", "note", "peak_mib", "B", "H", "T", "D",
                        "gpu", "ms_q1", "ms_q3"])
            for enc, method in rows_order:
                for cfg in configs:
                    c = by_key.get((enc, method, cfg))
                    if c is None:
                        continue
                    for p in PHASES:
                        note = [c.err[p]] if p in c.err else []
                        if p == "fwd" and c.check:
                            note.append(c.check)
                        if p == "fwdbwd":
                            note += c.notes
                        ms_, tf = c.ms.get(p), c.tflops(p)
                        w.writerow([enc, label(enc, method), config_name(cfg), PHASE_NAMES[p],
                                    "" if ms_ is None else f"{ms_:.4f}", "" if tf is None else f"{tf:.2f}",
                                    "; ".join(note),
                                    f"{c.peak_mib:.1f}" if p == "fwdbwd" and c.peak_mib is not None else "", *cfg,
                                    gpu, *quartile_fields(c, p)])


# ---- one encoding, in a process of its own -------------------------------------------------------

CONTEXT_LOST = 4  # a child's exit status: its CUDA context is lost (the JSON's "lost" says where)


def parse_configs(text):
    out = []
    for item in text.split(","):
        parts = item.lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            sys.exit(f"bad --configs item {item!r}: want BxHxTxD, e.g. 2x16x8192x128")
        out.append(tuple(int(p) for p in parts))
    return out


def config_arg(cfg):
    return "x".join(str(x) for x in cfg)


def encoding_methods(enc, methods):
    """The methods of enc's rows, in order: ape, its settings (where ape runs), the peers."""
    ape = ["ape"] + [f"ape:{n}" for n in SETTINGS] if "ape" in methods else []
    return ape + [m for m in PEERS.get(enc, []) if m in methods]


class ape_setting:
    """While in scope, the environment variables of the method's setting (ape:NAME); nothing for
    other methods. The previous values come back afterwards."""

    def __init__(self, method):
        self.env = SETTINGS.get(method[4:], {}) if method.startswith("ape:") else {}
        self.saved = {}

    def __enter__(self):
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_settings(text):
    """--ape-settings NAME:VAR=VALUE[+VAR=VALUE...],... -> {NAME: {VAR: VALUE}}."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        name, _, assigns = item.partition(":")
        env = {}
        for a in filter(None, assigns.split("+")):
            var, eq, value = a.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
                sys.exit(f"bad --ape-settings item {item!r}: want NAME:VAR=VALUE[+VAR=VALUE...]")
            env[var] = value
        if not re.fullmatch(r"[\w-]+", name) or not env or name in out:
            sys.exit(f"bad --ape-settings item {item!r}: want NAME:VAR=VALUE[+VAR=VALUE...] with a new name")
        out[name] = env
    return out


def test_crashes(enc):
    """APE_BENCH_TEST_CRASH (test-only, see the docstring): {(method, config index): kind} for enc."""
    out = {}
    for item in filter(None, os.environ.get("APE_BENCH_TEST_CRASH", "").split(",")):
        m = re.fullmatch(r"([\w-]+)(?:/([\w-]+))?(?:@(\d+))?(?::(abort|segv|exit|lost|hang))?", item.strip())
        if not m:
            sys.exit(f"bad APE_BENCH_TEST_CRASH item {item!r}: want ENC[/METHOD][@N][:abort|segv|exit|lost|hang]")
        if m.group(1) == enc:
            out[(m.group(2) or "ape", int(m.group(3) or 0))] = m.group(4) or "abort"
    return out


def die_for_test(kind):
    log(f"APE_BENCH_TEST_CRASH: {kind} (test-only)")
    if kind == "abort":
        os.abort()
    if kind == "segv":
        import ctypes
        ctypes.string_at(0)  # a real segfault: faulthandler prints the traceback, the signal kills
    if kind == "exit":
        os._exit(7)
    if kind == "hang":  # a kernel that never ends: no phase starts again (the parent's watchdog)
        while True:
            time.sleep(60)


def context_lost(device, simulated=False):
    """None while the CUDA context still runs work, else the error that says it does not (a sticky
    error such as an illegal memory access poisons every later call in the process)."""
    if simulated:
        return "CUDA error: an illegal memory access was encountered (simulated, APE_BENCH_TEST_CRASH)"
    if device != "cuda":
        return None
    try:
        torch.cuda.synchronize()
        x = torch.ones(1, device="cuda")
        if float((x + 1).item()) != 2.0:
            return "a trivial CUDA computation returned a wrong value"
        return None
    except Exception as exc:
        return None if is_oom(exc) else error_text(exc).removeprefix("fails: ")


def environment(device, timer_text):
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu = (f"{torch.cuda.get_device_name(0)} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
               f"{props.total_memory / GIB:.0f} GiB)")
    else:
        gpu = "none (CPU self-test: the numbers mean nothing)"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"gpu": gpu, "pytorch": f"{torch.__version__}; CUDA {torch.version.cuda}; cuDNN {cudnn}",
            "timer": timer_text}


def child_main(args, enc, methods, configs, device):
    """--one-encoding ENC: runs ENC's methods at the configurations not in --skip and keeps
    --cells-json up to date (written beside and renamed over, so the parent never reads half)."""
    faulthandler.enable()  # a segfault's Python traceback on stderr (the parent names the cell)
    state = {"encoding": enc, "status": "running", "loaded": False, "load_note": None, "env": None,
             "cells": [], "check_notes": [], "current": {"phase": "starting"}, "lost": None}

    def save():
        with open(args.cells_json + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(args.cells_json + ".tmp", args.cells_json)

    def progress(method, cfg, phase):
        state["current"] = {"method": method, "cfg": None if cfg is None else list(cfg), "phase": phase}
        save()

    save()
    timer, timer_text = make_timer(device)
    state["env"] = environment(device, timer_text)
    progress(None, None, "loading the library")
    try:
        helper, ops = load_helper(args.libs, enc)
        kernels = list(ops.cuda_kernels()) if hasattr(ops, "cuda_kernels") else "?"
        log(f"loaded ape_{enc}: CUDA kernels {kernels}")
    except Exception as exc:
        state.update(status="not-loaded", current=None,
                     load_note=f"{enc}: APE library not loaded ({error_text(exc).removeprefix('fails: ')}); "
                               "encoding skipped")
        log(state["load_note"])
        save()
        return 1
    state["loaded"] = True
    progress(None, None, "setting up, after loading the library")
    for name in ("recompile_limit", "cache_size_limit"):  # one compile per configuration
        try:
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 16))
        except Exception:
            pass
    skip = set()
    for item in filter(None, (args.skip or "").split(",")):
        method, _, cfg = item.partition("@")
        skip.add((method, parse_configs(cfg)[0]))
    crashes = test_crashes(enc)
    enc_methods = encoding_methods(enc, methods)
    check_cfg = min(configs, key=forward_flops)
    for index, cfg in enumerate(configs):
        todo = [m for m in enc_methods if (m, cfg) not in skip and ("*", cfg) not in skip]
        if not todo:
            continue
        progress(None, cfg, "making the inputs")
        free_memory(device)
        try:
            case = Case(enc, helper, ops, cfg, device, args.seed)
        except Exception as exc:
            text = error_text(exc)
            for m in todo:
                c = Cell(enc, m, cfg)
                c.fail_all(text)
                state["cells"].append(c.to_json())
            log(f"{enc} {config_name(cfg)}: inputs {text}")
            continue
        ref = None
        for method in todo:
            keep = cfg == check_cfg
            progress(method, cfg, "starting")
            crash = crashes.get((method, index))
            if crash and crash != "lost":
                die_for_test(crash)
            try:
                if crash == "lost":
                    raise RuntimeError(context_lost(device, simulated=True))
                with ape_setting(method):
                    cell, outputs = run_method(method, case, timer, args.mask_limit_gib, keep,
                                               lambda phase: progress(method, cfg, phase))
            except Exception as exc:  # a failure outside the guarded phases: still one cell
                cell, outputs = Cell(enc, method, cfg), None
                cell.fail_all(error_text(exc))
            if keep and outputs is not None:
                progress(method, cfg, "spot check")
                if method == "ape":  # kept on the host: it must not count in the peers' peaks
                    ref = (outputs[0].cpu(), None if outputs[1] is None else [g.cpu() for g in outputs[1]])
                    outputs = ref
                    bad = [n for n, t in zip(["o"] + case.leaf_names, [outputs[0]] + list(outputs[1] or []))
                           if not bool(torch.isfinite(t).all())]
                    cell.check = "spot-check reference" + (f"; non-finite {bad}" if bad else "")
                elif ref is not None:
                    try:
                        cell.check, mismatch = spot_check(ref, outputs, case.leaf_names)
                    except Exception as exc:
                        cell.check = f"spot check {error_text(exc)}"
                    state["check_notes"].append(f"spot check, {enc} / {label(enc, method)} / {config_name(cfg)}: "
                                                f"{cell.check}")
                elif "ape" in enc_methods and "ape" not in todo:
                    cell.check = "no spot check: APE did not run in this process (restarted after a crash)"
            outputs = None
            state["cells"].append(cell.to_json())
            summary = ", ".join(f"{PHASE_NAMES[p]} " + (f"{fmt_ms(cell.ms[p])} ms" if p in cell.ms
                                                         else cell.err.get(p, "-")) for p in PHASES)
            log(f"{enc} {config_name(cfg)} {label(enc, method)}: {summary}"
                + (f"; peak {cell.peak_mib:.0f} MiB" if cell.peak_mib else "")
                + (f"; {'; '.join(cell.notes)}" if cell.notes else "")
                + (f"; {cell.check}" if cell.check else ""))
            lost = context_lost(device, simulated=crash == "lost") if cell.err else None
            if lost:  # every later cell would fail the same way: a fresh process runs them
                state.update(status="context-lost", current=None,
                             lost={"method": method, "cfg": list(cfg), "error": lost})
                log(f"{enc} {config_name(cfg)} {label(enc, method)}: the CUDA context is lost ({lost}); "
                    "this process stops")
                save()
                return CONTEXT_LOST
            progress(method, cfg, "freeing memory")
            free_memory(device)
        ref = case = None
        free_memory(device)
    state.update(status="done", current=None)
    save()
    return 0


# ---- the parent: one process per encoding, one report -----------------------------------------------

class Stopped(Exception):
    """SIGTERM or SIGINT reached the parent (a time limit, Ctrl-C)."""


def death_text(rc):
    """'signal 11 (SIGSEGV)' or 'exit status 7' of a child's return code."""
    if rc < 0:
        try:
            return f"signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def read_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", default=os.path.dirname(os.path.abspath(__file__)),
                    help="folder holding ENC_torch_library/build/ape_ENC.py (default: this script's folder)")
    ap.add_argument("--quick", action="store_true",
                    help="the configurations " + ", ".join(config_name(c) for c in QUICK) +
                    " instead of " + ", ".join(config_name(c) for c in FULL))
    ap.add_argument("--configs", help="BxHxTxD,... instead of the default or --quick configurations")
    ap.add_argument("--encodings", default=",".join(ENCODINGS),
                    help="comma-separated (default %(default)s); others run ape alone")
    ap.add_argument("--methods", default=",".join(METHODS), help="a subset of %(default)s")
    ap.add_argument("--ape-settings", metavar="NAME:VAR=VALUE[+VAR=VALUE...],...",
                    help="APE again with these environment variables, as the method ape:NAME (see above)")
    ap.add_argument("--mask-limit-gib", type=float, default=4.0,
                    help="skip sdpa-mask where its (B, H, T, T) bf16 mask takes more (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="key/value heads, dividing each configuration's H: grouped-query attention, every method "
                         "given the same groups (enable_gqa for the peers); 0: H")
    ap.add_argument("--md", help="write the Markdown report here (it is printed either way)")
    ap.add_argument("--csv", help="write one row per (encoding, method, config, phase) here")
    ap.add_argument("--cell-timeout", type=float, default=150.0,
                    help="seconds an encoding's process may go without starting its next phase (a warm-up, "
                         "compile included, or a timing) before it is killed as hung and its cell says so "
                         "(default %(default)s; 0: no limit)")
    ap.add_argument("--kernel-times", action="store_true",
                    help="also profile each cell's fwd and bwd: GPU time per kernel (see above)")
    ap.add_argument("--selftest-cpu", action="store_true", help=argparse.SUPPRESS)  # plumbing check, tiny shapes
    # The child process of one encoding (see the docstring, "Crashes"):
    ap.add_argument("--one-encoding", help=argparse.SUPPRESS)
    ap.add_argument("--cells-json", help=argparse.SUPPRESS)
    ap.add_argument("--skip", help=argparse.SUPPRESS)  # METHOD@BxHxTxD,... (METHOD * : every method)
    args = ap.parse_args()
    encodings = [e for e in args.encodings.split(",") if e]
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad or not encodings:
        sys.exit(f"unknown methods {bad} (known: {','.join(METHODS)})" if bad else "no encodings")
    configs = parse_configs(args.configs) if args.configs else (QUICK if args.quick else FULL)
    SETTINGS.update(parse_settings(args.ape_settings))
    global KERNEL_TIMES, KV_HEADS
    KERNEL_TIMES = args.kernel_times
    KV_HEADS = args.kv_heads
    if args.kv_heads < 0 or any(args.kv_heads and c[1] % args.kv_heads for c in configs):
        sys.exit(f"--kv-heads {args.kv_heads} must divide every configuration's H")
    if args.selftest_cpu and not args.configs:
        configs = [(1, 2, 256, 64), (2, 2, 128, 128)]
    if args.one_encoding and not args.cells_json:
        ap.error("--one-encoding needs --cells-json")

    global torch, F
    try:
        import torch as _torch
    except ImportError as exc:
        print(f"gpu_bench: needs PyTorch with CUDA ({exc})", file=sys.stderr)
        return 2
    torch, F = _torch, _torch.nn.functional
    device = "cpu" if args.selftest_cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_bench: no CUDA device: torch.cuda.is_available() is False (PyTorch {torch.__version__}, "
              f"built for CUDA {torch.version.cuda or 'none'}). This benchmark times CUDA kernels; run it "
              f"where a GPU is visible.", file=sys.stderr)
        return 2
    if args.one_encoding:
        return child_main(args, args.one_encoding, methods, configs, device)
    return parent_main(args, encodings, methods, configs)


def parent_main(args, encodings, methods, configs):
    """Runs each encoding in a child process (again and again, past the methods that crashed),
    gathers the cells, rewrites the report after each child and prints it at the end."""
    test_crashes("")  # a bad APE_BENCH_TEST_CRASH stops here, not in a child
    started = datetime.datetime.now().astimezone()
    t_start = time.perf_counter()
    check_cfg = min(configs, key=forward_flops)
    cells, rows_order, load_notes, check_notes, crash_notes = [], [], [], [], []
    env, loaded_any, crashed = None, False, []
    work = tempfile.mkdtemp(prefix="gpu_bench.")
    forward = ["--libs", args.libs, "--configs", ",".join(config_arg(c) for c in configs),
               "--methods", ",".join(methods), "--mask-limit-gib", repr(args.mask_limit_gib),
               "--seed", str(args.seed), "--kv-heads", str(args.kv_heads)] + \
        (["--selftest-cpu"] if args.selftest_cpu else []) + \
        (["--kernel-times"] if args.kernel_times else []) + \
        (["--ape-settings", args.ape_settings] if args.ape_settings else [])
    proc = None
    status = None  # the report's "Status" line until the run is over

    def write(final):
        header = [
            ("GPU", env["gpu"] if env else "?"),
            ("PyTorch", env["pytorch"] if env else torch.__version__),
            ("Date", f"{started:%Y-%m-%d %H:%M %Z}, {(time.perf_counter() - t_start) / 60:.1f} min"),
            ("Timer", env["timer"] if env else "?"),
            ("Command", "`" + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv) + "`"),
            ("Spot check", f"at {config_name(check_cfg)}: each peer's o against APE's, MISMATCH above {MISMATCH:g}"),
        ]
        if args.kv_heads:
            header.append(("Key/value heads", f"{args.kv_heads} (grouped-query attention: H / {args.kv_heads} "
                                              "query heads per key/value head, every method given the groups)"))
        if status:
            header.append(("Status", status))
        report(args, cells, rows_order, configs, header, load_notes + crash_notes + check_notes, final)

    def on_signal(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise Stopped(signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # (a background job keeps ignoring SIGINT)
            signal.signal(sig, on_signal)

    def merge(enc, path, have):
        """Adds the cells, spot-check notes and rows of the child's JSON at path; returns it."""
        nonlocal env, loaded_any
        state = read_state(path) or {}
        env = env or state.get("env")
        loaded_any = loaded_any or bool(state.get("loaded"))
        for d in state.get("cells", []):
            c = Cell.from_json(d)
            have[(c.method, c.cfg)] = c
            cells.append(c)
        check_notes.extend(state.get("check_notes", []))
        if state.get("loaded") and enc not in {e for e, _ in rows_order}:
            rows_order.extend((enc, m) for m in encoding_methods(enc, methods))
        return state

    current_enc = pending = None
    try:
        for n, enc in enumerate(encodings):
            current_enc = enc
            enc_methods = encoding_methods(enc, methods)
            have = {}  # (method, cfg) -> Cell
            skip = set()  # (method, cfg) the next child leaves out; method "*": the whole configuration
            path = os.path.join(work, f"{enc}.json")
            for attempt in range(1 + len(enc_methods) * len(configs)):
                if os.path.exists(path):
                    os.unlink(path)
                cmd = [sys.executable, os.path.abspath(__file__), *forward, "--encodings", enc,
                       "--one-encoding", enc, "--cells-json", path]
                if skip:
                    cmd += ["--skip", ",".join(f"{m}@{config_arg(c)}" for m, c in sorted(skip))]
                    log(f"{enc}: a new process for the rest (skipping {len(skip)} of "
                        f"{len(enc_methods) * len(configs)} cells)")
                pending = path  # its cells are not merged yet
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
                # A watchdog: the child rewrites its state at every phase it starts; one that says
                # nothing for --cell-timeout seconds hangs (a kernel that never ends, a deadlocked
                # barrier) and is killed, so that it costs its cell, not the encodings after it.
                hung, last = False, time.monotonic()
                seen = None
                while True:
                    try:
                        rc = proc.wait(timeout=1.0)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    stamp = os.stat(path).st_mtime_ns if os.path.exists(path) else None
                    if stamp != seen:
                        seen, last = stamp, time.monotonic()
                    elif args.cell_timeout > 0 and time.monotonic() - last > args.cell_timeout:
                        hung = True
                        proc.kill()
                        rc = proc.wait()
                        break
                proc = None
                state = merge(enc, path, have)
                pending = None
                for key in have:
                    skip.add(key)
                if rc == 0 and state.get("status") == "done":
                    break
                if state.get("status") == "not-loaded":
                    load_notes.append(state.get("load_note") or f"{enc}: APE library not loaded; encoding skipped")
                    break
                if rc == 2 and not state:
                    print(f"gpu_bench: the process for {enc} exited with status 2 before it started (no CUDA "
                          "device? see above)", file=sys.stderr)
                    return 2
                # It died or lost its CUDA context: name the cell, skip the method from there on.
                if state.get("status") == "context-lost":
                    lost = state["lost"]
                    method, cfg = lost["method"], tuple(lost["cfg"])
                    what = f"{label(enc, method)} lost the CUDA context at {config_name(cfg)}"
                    crashed.append(f"{enc}: {what}")
                    crash_notes.append(f"{enc}: {what} ({lost['error']}); a new process ran the rest")
                    log(f"crashed: {enc}: {what} ({lost['error']})")
                else:
                    how = (f"hung (no progress in {args.cell_timeout:g} s; killed)" if hung else
                           death_text(rc) if rc != 0 else "exit status 0 before the end")
                    cur = state.get("current") or {"phase": "starting (no state written)"}
                    method, cfg = cur.get("method"), None if cur.get("cfg") is None else tuple(cur["cfg"])
                    phase = cur.get("phase") or "?"
                    if method is not None:
                        where = f"in {label(enc, method)} at {config_name(cfg)} ({phase})"
                    elif cfg is not None:
                        where = f"while {phase} at {config_name(cfg)}"
                    else:
                        where = f"while {phase}"
                    text = f"crashed: {how} {where}; see the log"
                    crashed.append(f"{enc}: {how} {where}")
                    log(f"crashed: {enc}: {how} {where}")
                    if cfg is None:  # loading the library, or before: nothing to skip past
                        load_notes.append(f"{enc}: the process {text}")
                        break
                    if method is not None and (method, cfg) in have:  # after its cell was kept
                        crash_notes.append(f"{enc}: the process {text} (after that cell's results were kept)")
                    for m in ([method] if method is not None else enc_methods):
                        if (m, cfg) in have:
                            continue
                        c = Cell(enc, m, cfg)
                        c.fail_all(text)
                        have[(m, cfg)] = c
                        skip.add((m, cfg))
                        cells.append(c)
                    if method is None:
                        what = f"the inputs crashed at {config_name(cfg)}"
                    else:
                        what = f"{label(enc, method)} crashed at {config_name(cfg)}"
                if method is not None:  # its later configurations: not run
                    # APE's settings call the operator that crashed in `ape`: not run either.
                    same_op = [m for m in enc_methods if is_ape(m) and m != "ape"] if method == "ape" else []
                    for m in [method] + same_op:
                        for c2 in configs:
                            if (m, c2) not in have:
                                c = Cell(enc, m, c2)
                                c.fail_all(f"not run: {what}" + ("" if m == method else
                                                                 " (the same operator)"))
                                have[(m, c2)] = c
                                skip.add((m, c2))
                                cells.append(c)
                if all((m, c2) in have for m in enc_methods for c2 in configs):
                    break
                status = f"partial: {enc} restarted after a crash"
                write(False)
            left = encodings[n + 1:]
            if left and (rows_order or crashed):
                status = f"partial: {', '.join(encodings[:n + 1])} done; {', '.join(left)} not yet run"
                write(False)
    except Stopped as stop:
        name = signal.Signals(stop.args[0]).name
        if proc is not None:  # the child (under `timeout` it got the signal too)
            try:
                proc.terminate()
                proc.wait(timeout=10)
            except Exception:
                proc.kill()
                proc.wait()
        if pending:  # what the child had finished
            merge(current_enc, pending, {})
        left = encodings[encodings.index(current_enc) + 1:] if current_enc else encodings
        status = (f"stopped by {name} while running {current_enc or 'nothing'}: its unfinished cells are empty"
                  + (f"; not run: {', '.join(left)}" if left else ""))
        log(status)
        write(True)
        shutil.rmtree(work, ignore_errors=True)
        return 128 + stop.args[0]
    shutil.rmtree(work, ignore_errors=True)
    if not loaded_any and not crashed:
        print(f"gpu_bench: no APE library could be loaded from {args.libs}:\n  " + "\n  ".join(load_notes),
              file=sys.stderr)
        return 1
    status = None
    write(True)
    if crashed:
        log("processes that crashed: " + "; ".join(crashed))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
