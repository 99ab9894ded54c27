"""The operators' CUDA kernels on a GPU (docs/frameworks.md). They need a device: skipped where
PyTorch sees none (the project's own machines); scripts/gpu-check.sh runs them on a lent GPU
machine (docs/cuda.md). Without a GPU, test_pytorch2.py checks that the kernels are compiled into
the libraries, that the CUDA calls contain no host synchronisation, and the helper's import by
name.

For the libraries built with CUDA kernels (test/python/CMakeLists.txt: APE_CUDA_ENCODINGS, rope
and cable by default; scripts/gpu-check.sh adds alibi and alibi_learned, params fixed and
trainable, and shaw, the general path's relative rows; variants bf16 and f32 at head dim 64,
run.sh): forward and gradients against the float64 reference (reference.py where it has the
encoding, else the C++ reference of ape_kernels_test, support.kernel_reference), under
torch.cuda.set_sync_debug_mode("error") so that a host copy (the fallback for inputs without a
kernel) would fail the test; f32 within 1e-4 of the magnitude, bf16 by FlashAttention's rule
(at most twice the error of PyTorch's own bf16 materialised attention, or of the C++
reference rounded where a flash kernel rounds, plus 1e-3 of the magnitude, as docs/cuda.md); the same results on a side stream; torch.compile on CUDA tensors; a CUDA graph of the forward and
backward replayed on new inputs; a first backward inside a capture refused."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import reference
from support import CUDA_ENCODINGS, close, helper, kernel_reference, make_inputs, ops, ordered, pair_sum_bound

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SHAPES = [(1, 1, 1, 64), (2, 3, 77, 64), (1, 2, 130, 64)]


def _run(encoding, q, k, v, features, params, dout):
    """o and the gradients of q, k, v, features, trainable params, with no host synchronisation."""
    xs = [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = ops(encoding).attention(q, k, v, *features, *ordered(encoding, params))
        grads = torch.autograd.grad(o, xs, dout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [o, *grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}T{}D{}".format(*s))
@pytest.mark.parametrize("encoding", CUDA_ENCODINGS)
def test_cuda_kernels_match_reference(encoding, shape, dtype):
    variant = ("f32" if dtype == torch.float32 else "bf16") + "/hd64"
    assert variant in ops(encoding).cuda_kernels()
    q, k, v, features, params = make_inputs(encoding, *shape, dtype, "cuda")
    dout = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype).cuda()
    got = _run(encoding, q, k, v, features, params, dout)
    assert all(t.is_cuda and t.dtype == dtype for t in got)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        again = _run(encoding, q, k, v, features, params, dout)
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(got, again):
        close(b, a, "side stream", atol=0)  # the kernels are deterministic (docs/cuda.md)

    in_python = encoding in reference.ENCODINGS  # else the C++ reference
    if in_python:
        up = lambda t: t.detach().double().cpu().requires_grad_(t.requires_grad)
        q64, k64, v64 = up(q), up(k), up(v)
        f64, p64 = [up(f) for f in features], {n: up(p) for n, p in params.items()}
        xs64 = [q64, k64, v64, *f64, *[p for p in p64.values() if p.requires_grad]]
        o64 = reference.attention(encoding, q64, k64, v64, f64, p64)
        exact = [o64, *torch.autograd.grad(o64, xs64, dout.double().cpu())]
    else:
        exact = kernel_reference(encoding, q, k, v, features, params, dout)
    # A param gradient (ALiBi's learned slopes) sums up to B T^2 / 2 terms that cancel, in the
    # kernel's order: support.pair_sum_bound.
    n_pre = 4 + len(features)
    if dtype == torch.float32:
        for i, (g, e) in enumerate(zip(got, exact)):
            atol = 1e-4 * max(1.0, e.abs().max().item())
            close(g, e, f"output {i}", atol=max(atol, pair_sum_bound(e)) if i >= n_pre else atol)
        return
    if in_python:
        xs = [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]
        o_torch = reference.attention(encoding, q, k, v, features, params)
        torch_bf16 = [o_torch, *torch.autograd.grad(o_torch, xs, dout)]
    else:
        # Rounded where a flash kernel rounds, and its results to bf16 as the operator returns them.
        torch_bf16 = [t.to(dtype) for t in kernel_reference(encoding, q, k, v, features, params, dout,
                                                            rounding=dtype)]
    for i, (g, t, e) in enumerate(zip(got, torch_bf16, exact)):
        err = (g.double().cpu() - e).abs().max().item()
        err_torch = (t.double().cpu() - e).abs().max().item()
        floor = 1e-3 * max(1.0, e.abs().max().item())
        if i >= n_pre:
            floor = max(floor, pair_sum_bound(e))
        assert err <= 2 * err_torch + floor, f"output {i}: {err:.3e} > 2 x {err_torch:.3e} + {floor:.1e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("encoding", CUDA_ENCODINGS)
def test_cuda_grouped_queries(encoding, dtype):
    """k and v of 2 key/value heads for 4 query heads on the CUDA kernels (CudaAttnArgs::kv_heads:
    the forward reads the key heads in place, the backward sums each group's dk, dv in head order;
    no host synchronisation): o and dq bitwise those of the call on k and v repeated by hand, dk
    and dv its gradients summed per group; f32 also against the float64 C++ reference over the
    repeated k, v."""
    B, H, T, D, kv = 2, 4, 77, 64, 2
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, dtype, "cuda", seed=11)
    kg, vg = (t.detach()[:, :kv].clone().requires_grad_() for t in (k, v))
    dout = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(2)).to(dtype).cuda()
    got = _run(encoding, q, kg, vg, features, params, dout)
    assert got[2].shape == kg.shape and got[3].shape == vg.shape
    kr, vr = (t.detach().repeat_interleave(H // kv, 1).requires_grad_() for t in (kg, vg))
    rep = _run(encoding, q, kr, vr, features, params, dout)
    assert torch.equal(got[0], rep[0]) and torch.equal(got[1], rep[1])
    for i in (2, 3):  # the same gradient summed over each group (in float32, then rounded once)
        want = rep[i].float().view(B, kv, H // kv, T, D).sum(2).to(dtype)
        assert torch.equal(got[i], want), f"output {i}"
    if dtype == torch.float32:
        exact = kernel_reference(encoding, q, kr, vr, features, params, dout)
        for i in (2, 3):
            exact[i] = exact[i].view(B, kv, H // kv, T, D).sum(2)
        n_pre = 4 + len(features)
        for i, (g, e) in enumerate(zip(got, exact)):
            atol = 1e-4 * max(1.0, e.abs().max().item())
            close(g, e, f"output {i}", atol=max(atol, pair_sum_bound(e)) if i >= n_pre else atol)


def test_cuda_misaligned_views_run_on_aligned_copies():
    """q, k, v and dout as contiguous views 2 bytes into a flat buffer: the kernels take 16-byte
    aligned rows only (cuda/kernel_entry.h refuses others); the operator copies such views and
    gives what it gives for the same values at aligned addresses, bit for bit."""
    shape, n = (1, 2, 33, 64), 2 * 33 * 64
    flat = torch.randn(4 * n + 1, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).cuda()
    views = [flat[1 + i * n:1 + (i + 1) * n].view(shape) for i in range(4)]
    assert all(v.is_contiguous() and v.data_ptr() % 16 != 0 for v in views)
    q, k, v = (t.clone().requires_grad_() for t in views[:3])
    qm, km, vm = (t.requires_grad_() for t in (views[0].detach(), views[1].detach(), views[2].detach()))
    assert qm.data_ptr() % 16 != 0
    _, _, _, features, params = make_inputs("rope", *shape, torch.bfloat16, "cuda")
    got = _run("rope", qm, km, vm, features, params, views[3])
    want = _run("rope", q, k, v, features, params, views[3].clone())
    for i, (g, w) in enumerate(zip(got, want)):
        close(g, w, f"output {i}", atol=0)


@pytest.mark.parametrize("encoding", CUDA_ENCODINGS)
def test_cuda_compile_fullgraph(encoding):
    """torch.compile (Inductor) of the operator on CUDA tensors matches eager."""
    torch._dynamo.reset()
    q, k, v, features, params = make_inputs(encoding, 2, 2, 40, 64, torch.bfloat16, "cuda")
    fn = lambda q, k, v, *rest: ops(encoding).attention(q, k, v, *rest).float().square().sum()
    args = (q, k, v, *features, *ordered(encoding, params))
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True)(*args)
    close(compiled, eager, "loss", atol=0, rtol=1e-6)


@pytest.mark.parametrize("encoding", CUDA_ENCODINGS)
def test_cuda_graph_capture_replays_eager(encoding):
    """The forward and backward captured in one CUDA graph (torch.cuda.graph, what
    torch.compile(mode="reduce-overhead") and graph-captured training steps do) and replayed on
    other inputs give what eager calls give on them, bit for bit: capture fails on a host
    synchronisation, an allocation outside PyTorch's graph pool, or a copy from pageable host
    memory, and a replay reads stale values where a call baked its inputs in at capture time."""
    shape = (2, 2, 70, 64)

    def inputs(seed):
        q, k, v, features, params = make_inputs(encoding, *shape, torch.bfloat16, "cuda", seed=seed)
        dout = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 7)).to(torch.bfloat16).cuda()
        return [q, k, v, *features, *ordered(encoding, params)], dout

    def step(args, dout):
        o = ops(encoding).attention(*args)
        grads = torch.autograd.grad(o, [a for a in args if a.requires_grad], dout)
        return [o, *grads]

    first, dout = inputs(0)
    static = [a.detach().clone().requires_grad_(a.requires_grad) for a in first]
    static_dout = dout.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph asks
        for _ in range(2):
            step(static, static_dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(static, static_dout)

    for seed in (1, 2):
        args, dout = inputs(seed)
        with torch.no_grad():
            for s, a in zip(static, args):
                s.copy_(a)
            static_dout.copy_(dout)
        graph.replay()
        want = step(args, dout)
        for i, (g, w) in enumerate(zip(captured, want)):
            close(g, w, f"replay {seed}, output {i}", atol=0)
        # The inputs changed the output: a replay that reused the capture's inputs would fail above.
        assert not torch.equal(captured[0], step(first, dout)[0]), "the seeds gave the same output"
    torch.cuda.synchronize()


def test_cuda_first_backward_inside_a_capture_is_refused():
    """The first CUDA backward of a process makes the device's status record (ops_cuda.h): inside
    a CUDA graph capture that record would come from the graph's pool and be zeroed at every
    replay, so a first backward there is refused with a clear error (a fresh process: the record
    is the process's)."""
    code = textwrap.dedent("""
        import torch
        from support import make_inputs, ops, ordered
        q, k, v, features, params = make_inputs("rope", 1, 2, 64, 64, torch.bfloat16, "cuda")
        args = [q, k, v, *features, *ordered("rope", params)]
        ops("rope").attention(*args)  # a forward outside the capture makes no record
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                o = ops("rope").attention(*args)
                torch.autograd.grad(o, [q, k, v], torch.ones_like(o))
        except RuntimeError as e:
            print("REFUSED:", repr(e), repr(e.__context__))
        else:
            print("CAPTURED")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert "REFUSED:" in p.stdout and "inside a CUDA graph capture" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("mode", ["nan", "range"])
def test_cuda_backward_errors_poison_without_waiting(mode):
    """A backward whose fixed-point sums cannot hold a term (a NaN feature; terms beyond 2^31 from
    a huge dout) waits for nothing: its feature gradients are NaN on the device, and the reason
    reaches the user where they choose to synchronise (check_backward raises, naming it; the
    record is then clear)."""
    h = helper("cable")
    h.backward_status()  # clear what earlier tests left
    q, k, v, features, params = make_inputs("cable", 1, 2, 40, 64, torch.float32, "cuda")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).cuda()
    if mode == "nan":
        with torch.no_grad():
            features[0][0, 1, 17] = float("nan")
    else:
        dout = dout * 1e12
    grads = _run("cable", q, k, v, features, params, dout)[1:]  # under set_sync_debug_mode("error")
    dfeature = grads[3]
    assert torch.isnan(dfeature).all(), "the feature gradient of a failed sum must be NaN"
    with pytest.raises(RuntimeError, match="NaN or infinite" if mode == "nan" else "clamped"):
        h.check_backward()
    assert h.backward_status() == (0, []), "check_backward clears the record"


def test_cuda_scratch_memory_is_pytorchs():
    """The kernels' scratch memory (RoPE's q' and k', the backward's row sums, ...) comes from
    PyTorch's caching allocator (torch/ops_cuda.h, TorchScratch): torch.cuda.max_memory_allocated
    counts it (with cudaMallocAsync it was invisible there, and a training step's peak read low),
    and every byte of it is given back when the call returns."""
    B, H, T, D = 1, 2, 1024, 64
    q, k, v, features, params = make_inputs("rope", B, H, T, D, torch.bfloat16, "cuda")
    args = (*features, *ordered("rope", params))
    dout = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
    tensor, lse = B * H * T * D * 2, B * H * T * 4  # bytes of a bf16 (B, H, T, D) tensor, of lse
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o = ops("rope").attention(qg, kg, vg, *args)
    torch.cuda.synchronize()
    # o and lse stay (lse for the backward); q' and k' were there beside them, and are gone.
    assert torch.cuda.memory_allocated() - base == tensor + lse, torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    assert peak >= 3 * tensor + lse, f"the forward's peak {peak} B does not count q' and k'"
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(o, (qg, kg, vg), dout)
    torch.cuda.synchronize()
    # dq, dk, dv beside the q' and k' the backward recomputes.
    peak = torch.cuda.max_memory_allocated() - base
    assert peak >= 5 * tensor, f"the backward's peak {peak} B does not count q' and k'"
    del grads, o
