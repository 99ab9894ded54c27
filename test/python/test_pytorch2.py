"""What PyTorch 2 asks of a custom operator, for the operator library of every example encoding
(apec --emit=torch-library):

- torch.library.opcheck passes all its checks (schema, autograd registration, fake tensors,
  aot_dispatch_dynamic) on attention (contiguous and strided inputs), the raw forward and
  backward, and derived_params;
- torch.compile(fullgraph=True) of a small block that calls the operator traces with no graph
  break, puts the fused forward and backward kernels in its graphs, and matches eager (forward
  and gradients) at two sequence lengths with one compile (symbolic shapes); Inductor for a
  representative subset (its compiles cost seconds each), AOTAutograd for all;
- fp64 gradcheck of attention in every input that has a gradient;
- bfloat16 and float16 inputs: computed in float32, results in the input dtype, within a
  rounding of the float64 result (and, where reference.py has the encoding, at most twice the
  error of PyTorch's own materialised attention in that dtype).
"""
import importlib
import importlib.util
import os
import re
import sys

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

import reference
from support import (CUDA_ENCODINGS, ENCODINGS, REFERENCE_ENCODINGS, ROOT, artifact, artifacts, close,
                     cmake_cache, helper, kernel_reference, make_inputs, ops, ordered, pair_sum_bound)

# Inductor compiles C++ for each graph: one encoding per kind of input (none; a token feature;
# fixed and trainable params with a derived bias; derived params; relative rows).
INDUCTOR_ENCODINGS = ["rope", "cable", "t5", "exqpe", "shaw"]


def call(encoding, q, k, v, features, params, scale=None):
    return ops(encoding).attention(q, k, v, *features, *ordered(encoding, params), scale=scale)


# ---- opcheck ---------------------------------------------------------------------------------------
def _check(op, args, kwargs=None):
    result = torch.library.opcheck(op, args, kwargs, raise_exception=False)
    failed = {name: repr(r) for name, r in result.items() if r != "SUCCESS"}
    assert not failed, f"{op}: {failed}"
    assert set(result) == {"test_schema", "test_autograd_registration", "test_faketensor",
                           "test_aot_dispatch_dynamic"}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_opcheck(encoding):
    B, H, T, D = 2, 3, 9, 8
    q, k, v, features, params = make_inputs(encoding, B, H, T, D)
    plist = ordered(encoding, params)
    o = ops(encoding)
    _check(o.attention.default, (q, k, v, *features, *plist))
    qs = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    _check(o.attention.default, (qs, k, v, *features, *plist), {"scale": 0.25})
    _check(o.attention_forward.default, (qs, k, v, features, plist, 0.25))
    out, lse = o.attention_forward(q, k, v, features, plist, 0.25)
    dout = torch.randn_like(out).transpose(1, 2).contiguous().transpose(1, 2)  # strided
    _check(o.attention_backward.default, (dout, q, k, v, out.detach(), lse, features, plist, 0.25))
    h = helper(encoding)
    if h.DERIVED:
        w = lambda: torch.randn(H * D, 40, dtype=torch.float64, requires_grad=True)
        _check(o.derived_params.default, (w(), w(), w()), {"heads": H, "head_dim": D})


def test_init_value_under_fake_tensors_and_compile():
    """init_value (a tensor made from host data, like torch.tensor) under opcheck's fake tensors
    and in a compiled function (the helper's init_params and ape.load's params made at the first
    call reach it): a first version made its tensor inside FakeTensorMode, which holds no data to
    copy into, and every compile that reached it failed."""
    o = ops("alibi")
    _check(o.init_value.default, ("alibi_slopes",), {"heads": 4, "head_dim": 8})
    _check(ops("transformer_xl").init_value.default, ("xl_rel",), {"heads": 2, "head_dim": 4})
    fn = lambda x: x * o.init_value("alibi_slopes", heads=4, head_dim=8).to(x.dtype)
    x = torch.randn(3, 4)
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        close(torch.compile(fn, fullgraph=True, backend=backend)(x), fn(x), "init_value", atol=0, rtol=0)


# ---- torch.compile ---------------------------------------------------------------------------------
class Block(torch.nn.Module):
    """One causal self-attention block around torch.ops.ape_<encoding>.attention: q, k, v and the
    token features projected from x (through W[:, l:] only where an override says so), trainable
    params as nn.Parameters, fixed ones as buffers, derived ones from the projection weights
    every step (ape_<encoding>.derived_params)."""

    def __init__(self, encoding, d=32, heads=2):
        super().__init__()
        self.h, self.heads, self.head_dim = helper(encoding), heads, d // heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        nf = len(self.h.FEATURES)
        self.wf = torch.nn.Linear(d, heads * nf) if nf else None
        _, _, _, _, params = make_inputs(encoding, 1, heads, 1, self.head_dim, torch.float32)
        self.names = {}
        for name, ident in zip(self.h.PARAMS, self.h.ARGUMENTS[nf:]):
            if name in self.h.DERIVED:
                continue
            self.names[name] = "param_" + ident
            t = params[name].detach().clone()
            if t.requires_grad or params[name].requires_grad:
                self.register_parameter(self.names[name], torch.nn.Parameter(t))
            else:
                self.register_buffer(self.names[name], t)

    def forward(self, x):
        B, T, d = x.shape
        H, D, h = self.heads, self.head_dim, self.h
        ov = h.MANIFEST["override"]
        l = int(ov["l"]) if ov else 0

        def project(w, target):  # (B, T, d) -> (B, H, T, D)
            y = x[..., l:] @ w.weight[:, l:].t() if ov and target in ov["targets"] else w(x)
            return y.view(B, T, H, D).transpose(1, 2)

        q, k, v = project(self.wq, "q"), project(self.wk, "k"), project(self.wv, "v")
        feats = []
        if self.wf is not None:  # (B, T, nf*H) -> nf x (B, H, T)
            feats = self.wf(x).view(B, T, -1, H).permute(2, 0, 3, 1).unbind(0)
        derived = h.derived_params({"q": self.wq.weight, "k": self.wk.weight, "v": self.wv.weight}, H, D) \
            if h.DERIVED else {}
        params = [derived[n] if n in derived else getattr(self, self.names[n]) for n in h.PARAMS]
        o = h.load().attention(q, k, v, *feats, *params)
        return self.wo(o.transpose(1, 2).reshape(B, T, d))


def _recording_backend(graphs):
    """AOTAutograd that keeps the forward and backward graphs and runs them as they are."""
    def compiler(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


def _compile_cases():
    for encoding in ENCODINGS:
        yield pytest.param(encoding, "aot", id=f"{encoding}-aot")
        if encoding in INDUCTOR_ENCODINGS:
            yield pytest.param(encoding, "inductor", id=f"{encoding}-inductor")


@pytest.mark.parametrize("encoding,backend", list(_compile_cases()))
def test_compile_fullgraph_matches_eager(encoding, backend):
    torch._dynamo.reset()  # one Block.forward code object serves every encoding
    torch.manual_seed(0)
    model = Block(encoding)
    graphs = []
    # Symbolic shapes from the start: one compile serves both lengths.
    compiled = torch.compile(model, fullgraph=True, dynamic=True,
                             backend=_recording_backend(graphs) if backend == "aot" else "inductor")
    leaves = lambda x: [x, *model.parameters()]
    for T in (7, 12):
        x = torch.randn(2, T, 32, requires_grad=True)
        y = model(x)
        grads = torch.autograd.grad(y.square().sum(), leaves(x))
        yc = compiled(x)
        grads_c = torch.autograd.grad(yc.square().sum(), leaves(x))
        close(yc, y, f"T={T}: compiled o", atol=1e-5, rtol=1e-5)
        for i, (gc, g) in enumerate(zip(grads_c, grads)):
            close(gc, g, f"T={T}: compiled gradient {i}", atol=1e-5 * max(1.0, g.abs().max().item()), rtol=1e-5)
    if backend == "aot":
        text = [str(g.graph) for g in graphs]
        assert any(f"ape_{encoding}.attention_forward" in t for t in text), text
        assert any(f"ape_{encoding}.attention_backward" in t for t in text), text
        assert len(graphs) == 2, f"expected one forward and one backward graph for both lengths, got {len(graphs)}"


# ---- gradcheck -------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_gradcheck(encoding):
    q, k, v, features, params = make_inputs(encoding, 1, 2, 5, 8, torch.float64)
    names = helper(encoding).PARAMS
    trainable = [n for n in names if params[n].requires_grad]

    def fn(q, k, v, *rest):
        feats = list(rest[:len(features)])
        ps = dict(params)
        ps.update(zip(trainable, rest[len(features):]))
        return call(encoding, q, k, v, feats, ps)

    assert torch.autograd.gradcheck(fn, (q, k, v, *features, *[params[n] for n in trainable]),
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


# ---- bfloat16 and float16 ----------------------------------------------------------------------------
def _flash_rule(names, got, torch_half, exact, eps, first_param, tag=""):
    """FlashAttention's rule: each of `got` (outputs, then gradients; param gradients from index
    first_param on) is at most twice as far from `exact` (float64) as PyTorch's materialised
    attention in the same half dtype (`torch_half`), plus eps of the magnitude (param gradients:
    at least the pair-sum floor)."""
    for i, (name, g, t, e) in enumerate(zip(names, got, torch_half, exact)):
        err = (g.double() - e).abs().max().item()
        err_torch = (t.double() - e).abs().max().item()
        floor = eps * max(1.0, e.abs().max().item())
        if i >= first_param:
            floor = max(floor, pair_sum_bound(e))
        assert err <= 2 * err_torch + floor, \
            f"{tag}{name}: error {err:.3e} > 2 x PyTorch's {err_torch:.3e} + {floor:.1e}"


def _value_and_grads(fn, xs, dout):
    o = fn()
    return [o, *torch.autograd.grad(o, xs, dout)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_half_precision_in_float32(encoding, dtype):
    """Half-precision inputs run the float32 kernel: o, lse and the gradients come back in the
    input dtype (lse float32), each within a few roundings of the float64 operator on the same
    (rounded) inputs; with a reference, the error against float64 is at most twice that of
    PyTorch's own materialised attention in the same dtype."""
    B, H, T, D = 2, 3, 37, 16
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, dtype)
    dout = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    xs = [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]
    got = _value_and_grads(lambda: call(encoding, q, k, v, features, params), xs, dout)
    for g, x in zip(got, [q, *xs]):
        assert g.dtype == dtype
    _, lse = ops(encoding).attention_forward(q, k, v, features, ordered(encoding, params), 0.25)
    assert lse.dtype == torch.float32

    up = lambda t: t.detach().double().requires_grad_(t.requires_grad)
    q64, k64, v64 = up(q), up(k), up(v)
    f64, p64 = [up(f) for f in features], {n: up(p) for n, p in params.items()}
    xs64 = [q64, k64, v64, *f64, *[p for p in p64.values() if p.requires_grad]]
    exact = _value_and_grads(lambda: call(encoding, q64, k64, v64, f64, p64), xs64, dout.double())
    eps = torch.finfo(dtype).eps
    names = ["o", "dq", "dk", "dv"] + [f"d{n}" for n in helper(encoding).FEATURES] + \
        [f"d{n}" for n, p in params.items() if p.requires_grad]
    for name, g, e in zip(names, got, exact):
        scale = max(1.0, e.abs().max().item())
        close(g, e, f"{dtype} {name}", atol=8 * eps * scale)
    # FlashAttention's rule: against PyTorch's materialised attention in the same dtype where
    # reference.py has the encoding, else against the C++ reference (every example encoding) rounded
    # where a half kernel rounds, its results in the dtype as the operator returns them.
    if encoding in REFERENCE_ENCODINGS:
        torch_half = _value_and_grads(lambda: reference.attention(encoding, q, k, v, features, params), xs, dout)
        ref = _value_and_grads(lambda: reference.attention(encoding, q64, k64, v64, f64, p64), xs64, dout.double())
    else:
        torch_half = [t.to(dtype) for t in kernel_reference(encoding, q, k, v, features, params, dout,
                                                            rounding=dtype)]
        ref = kernel_reference(encoding, q64, k64, v64, f64, p64, dout.double())
    _flash_rule(names, got, torch_half, ref, eps, 4 + len(features), f"{dtype} ")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("encoding", ["cable", "alibi_learned", "t5"])
def test_float32_features_and_params_with_a_half_q(encoding, dtype):
    """What torch.autocast leaves: q, k, v in 16 bits, features and params float32 (an nn.Parameter
    stays float32). Accepted, and the same computation: with side inputs that 16 bits hold exactly,
    o and dq, dk, dv equal the all-16-bit call's bit for bit, and each side gradient comes back
    float32, which rounded to 16 bits is the all-16-bit call's (the kernels compute in float32 and
    round once). float64 side inputs with a 16-bit q are still refused; opcheck passes on the mix."""
    B, H, T, D = 2, 3, 37, 16
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, dtype)
    side32 = lambda t: t.detach().float().requires_grad_(t.requires_grad)
    f32, p32 = [side32(f) for f in features], {n: side32(p) for n, p in params.items()}
    dout = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(2)).to(dtype)
    xs16 = [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]
    xs32 = [q, k, v, *f32, *[p for p in p32.values() if p.requires_grad]]
    half = _value_and_grads(lambda: call(encoding, q, k, v, features, params), xs16, dout)
    mixed = _value_and_grads(lambda: call(encoding, q, k, v, f32, p32), xs32, dout)
    for name, a, b in zip(["o", "dq", "dk", "dv"], half[:4], mixed[:4]):
        assert b.dtype == dtype and torch.equal(a, b), name
    assert len(half) > 4, "the encoding has a side input with a gradient"
    for a, b in zip(half[4:], mixed[4:]):
        assert b.dtype == torch.float32
        assert torch.equal(b.to(dtype), a)
    with pytest.raises(TypeError, match="must have q's dtype"):
        call(encoding, q, k, v, [f.detach().double() for f in features],
             {n: p.detach().double() for n, p in params.items()})
    _check(ops(encoding).attention.default, (q, k, v, *f32, *ordered(encoding, p32)))


def _amx_runs(encoding):
    """Whether this process's CPU kernels of `encoding` take bf16 products: the avx512 level
    runs, and the CPU has AMX-BF16 and AMX-TILE with APE_CPU_AMX not "0" (cpu/attention.h's
    cpu_amx_bf16_usable; Linux >= 5.16 grants the tiles, which /proc/cpuinfo listing them implies
    here), or AVX512-BF16 with APE_CPU_AVX512BF16=1 (cpu_avx512_bf16_usable, opt-in)."""
    if ops(encoding).cpu_level() != "avx512":
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    amx = "amx_bf16" in flags and "amx_tile" in flags and os.environ.get("APE_CPU_AMX") != "0"
    avx512bf16 = "avx512_bf16" in flags and os.environ.get("APE_CPU_AVX512BF16") == "1"
    return amx or avx512bf16


@pytest.mark.parametrize("encoding", ["nope", "rope", "alibi_learned", "cable", "expe"])
def test_bfloat16_products(encoding):
    """bfloat16 inputs at head dim 64 (a multiple of 32): on a CPU with AMX (or AVX512-BF16 and
    APE_CPU_AVX512BF16=1) the operator's CPU kernel takes its tile products with bf16 operands
    (AttnArgs::bf16_products, as the CUDA kernels do on tensor cores; docs/internals.md section
    2c). Every output and gradient is held to FlashAttention's rule against PyTorch's materialised attention in bfloat16 (at most twice
    its error against float64, param gradients with the pair-sum floor); where the products run,
    they are not the float32 kernel's (the outputs differ from those of the same kernel fed the
    float32 copies). ape_kernels_test's CpuAmxVsReference checks every encoding's kernel against
    the same-precision materialised attention."""
    B, H, T, D = 1, 2, 130, 64
    dtype = torch.bfloat16
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, dtype, seed=3)
    dout = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(2)).to(dtype)
    xs = [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]
    got = _value_and_grads(lambda: call(encoding, q, k, v, features, params), xs, dout)
    up = lambda t, dt=torch.float64: t.detach().to(dt).requires_grad_(t.requires_grad)
    q64, k64, v64 = up(q), up(k), up(v)
    f64, p64 = [up(f) for f in features], {n: up(p) for n, p in params.items()}
    xs64 = [q64, k64, v64, *f64, *[p for p in p64.values() if p.requires_grad]]
    ref = _value_and_grads(lambda: reference.attention(encoding, q64, k64, v64, f64, p64), xs64, dout.double())
    torch_bf16 = _value_and_grads(lambda: reference.attention(encoding, q, k, v, features, params), xs, dout)
    names = ["o", "dq", "dk", "dv"] + [f"d{n}" for n in helper(encoding).FEATURES] + \
        [f"d{n}" for n, p in params.items() if p.requires_grad]
    eps = torch.finfo(dtype).eps
    _flash_rule(names, got, torch_bf16, ref, eps, 4 + len(features))
    if _amx_runs(encoding):
        q32, k32, v32 = up(q, torch.float32), up(k, torch.float32), up(v, torch.float32)
        f32, p32 = [up(f, torch.float32) for f in features], {n: up(p, torch.float32) for n, p in params.items()}
        o32 = call(encoding, q32, k32, v32, f32, p32)
        assert not torch.equal(got[0].float(), o32.to(dtype).float()), \
            "bfloat16 inputs gave the float32 kernel's output: the bf16 products did not run"


# ---- the CUDA kernels ------------------------------------------------------------------------------
def test_cuda_kernels_are_compiled_in():
    """The encodings of APE_CUDA_ENCODINGS (rope and cable by default) carry CUDA kernels where
    PyTorch has CUDA and nvcc was found (the variants run.sh asks for); the others, built without
    kernels, report none. Runs without a GPU: it checks the build, not the kernels (test_cuda.py)."""
    expected = ["bf16/hd64", "f32/hd64"] if torch.version.cuda and _built_with_nvcc() else []
    assert CUDA_ENCODINGS, "APE_CUDA_ENCODINGS is empty"
    for encoding in CUDA_ENCODINGS:
        assert sorted(ops(encoding).cuda_kernels()) == expected, encoding
    for encoding in ("nope", "shaw"):  # built with APE_ENABLE_CUDA=OFF
        if encoding not in CUDA_ENCODINGS:
            assert ops(encoding).cuda_kernels() == [], encoding


def _built_with_nvcc():
    """Whether the framework-suite build found nvcc (its CMakeCache.txt)."""
    artifacts()
    value = cmake_cache("CMAKE_CUDA_COMPILER")
    return bool(value) and not value.endswith("NOTFOUND")


def test_cuda_kernels_use_the_process_runtime():
    """A library with CUDA kernels links the shared CUDA runtime that PyTorch loads (NEEDED
    libcudart.so.N, PyTorch's N) and carries no private copy of it: CMake's default for a target
    with CUDA objects is the static runtime, and such a copy beside PyTorch's is the suspect of the
    operator library's host SIGSEGV on the H200 (bench/results/gpu_h200.md; fixed in the emitted
    CMakeLists.txt, CUDA_RUNTIME_LIBRARY Shared). Runs without a GPU: it reads the ELF files."""
    if not (torch.version.cuda and _built_with_nvcc()):
        pytest.skip("no library was built with CUDA kernels here (no nvcc, or PyTorch without CUDA)")
    import shutil
    import subprocess
    if not shutil.which("readelf") or not shutil.which("nm"):
        pytest.skip("readelf / nm (binutils) not found")
    torch_cuda = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    wanted = {n for n in re.findall(r"\[(libcudart\.so\.\d+)\]",
                                    subprocess.run(["readelf", "-d", torch_cuda], check=True,
                                                   capture_output=True, text=True).stdout)}
    assert wanted, f"{torch_cuda} needs no libcudart: cannot tell PyTorch's runtime"
    for encoding in CUDA_ENCODINGS:
        so = artifact(f"{encoding}_torch_library", f"libape_{encoding}_ops.so")
        needed = re.findall(r"\[(libcudart[^\]]*)\]", subprocess.run(
            ["readelf", "-d", so], check=True, capture_output=True, text=True).stdout)
        assert set(needed) == wanted, \
            f"{so} needs {needed or 'no libcudart'}, PyTorch's libtorch_cuda.so {sorted(wanted)}"
        # The static runtime's entry points, defined inside the library (exported or not).
        symbols = subprocess.run(["nm", "--defined-only", so], capture_output=True, text=True).stdout
        symbols += subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True,
                                  text=True).stdout
        private = sorted({s for s in re.findall(r"\s[TtWw]\s(cuda(?:Malloc|LaunchKernel|GetDevice)\w*)",
                                                 symbols)})
        assert not private, f"{so} defines CUDA runtime functions of its own: {private[:5]}"


def _function_body(text, signature):
    """The text of the C++ function that starts with `signature`, to its closing brace."""
    start = text.index(signature)
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[start:j + 1]
    raise AssertionError(f"unbalanced braces after {signature}")


def test_cuda_calls_never_wait_for_the_device():
    """The operators' CUDA forward and backward read nothing back from the device (a training step
    must not wait for the GPU; test_cuda.py checks it on a GPU under set_sync_debug_mode("error"),
    where the backward's .item() of its status word once failed 12 of 12): no host copy, item or
    synchronisation in their code, except the opt-in APE_CUDA_SYNC_CHECK branch."""
    path = os.path.join(ROOT, "kernels", "include", "ape", "torch/ops_cuda.h")
    text = open(path).read()
    syncing = re.compile(r"\.item\s*[<(]|\.cpu\s*\(|\.to\s*\(\s*at::kCPU|Synchronize|"
                         r"cudaMemcpy\s*\(|\.tolist|\.equal\s*\(|is_nonzero")
    for fn in ("inline ForwardResult forward_cuda(", "inline BackwardResult backward_cuda("):
        body = _function_body(text, fn)
        if "sync_check_requested()" in body:  # the debugging branch, opt-in
            branch = _function_body(body, "if (sync_check_requested()")
            body = body.replace(branch, "")
        found = syncing.findall(body)
        assert not found, f"{fn.split('(')[0]}: host synchronisation {found} in {path}"


def test_backward_status_without_cuda():
    """backward_status() and the helper's check_backward() exist for every library and read 0 where
    no CUDA backward ran (the CPU kernels have no status word: their sums are floating point)."""
    for enc in ("rope", "cable"):
        assert ops(enc).backward_status() == 0
        assert ops(enc).backward_status(torch.device("cpu"), clear=False) == 0
        assert helper(enc).backward_status() == (0, [])
        assert helper(enc).check_backward() == 0
    # The messages follow the bits of ape/cuda/kernel_entry.h, most serious first.
    assert [b for b, _ in helper("rope").STATUS_MESSAGES] == [1, 2, 4, 8]
    assert helper("rope").STATUS_ERRORS == 7


def test_helper_is_importable_by_its_name():
    """The generated helper loaded from its file by importlib (as support.helper and the docs'
    examples do, without registering it) puts itself into sys.modules under its name: Dynamo
    imports the modules of the functions it inlines by name (torch.compile on CUDA once failed
    with "No module named 'ape_rope'"). A module already registered under the name is kept."""
    path = artifact("rope_torch_library", "ape_rope.py")
    saved = sys.modules.pop("ape_rope", None)
    try:
        spec = importlib.util.spec_from_file_location("ape_rope", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # no sys.modules[...] = module: the helper does it
        assert importlib.import_module("ape_rope") is module
        again = importlib.util.module_from_spec(importlib.util.spec_from_file_location("ape_rope", path))
        again.__spec__.loader.exec_module(again)
        assert sys.modules["ape_rope"] is module, "a second load replaced the registered module"
    finally:
        if saved is not None:
            sys.modules["ape_rope"] = saved
        else:
            sys.modules.pop("ape_rope", None)
    assert importlib.import_module("ape_cable") is helper("cable")


def test_compile_through_the_helper():
    """torch.compile(fullgraph=True) of a function that reaches the operator through the helper
    loaded from a file (support.ops -> helper.load(), the shape of test_cuda.py's compile test),
    on the CPU. Dynamo inlines the helper's functions; PyTorch 2.11 on CUDA then imported the
    helper's module by name and failed. PyTorch 2.15 on the CPU does not import it here (this
    passes without the registration too): test_helper_is_importable_by_its_name is the check
    that fails without it, and test_cuda.py's compile test the one on a GPU."""
    torch._dynamo.reset()
    q, k, v, features, params = make_inputs("cable", 2, 2, 9, 16, torch.float32)
    fn = lambda q, k, v, *rest: ops("cable").attention(q, k, v, *rest).square().sum()
    args = (q, k, v, *features, *ordered("cable", params))
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    close(compiled, eager, "loss", atol=0, rtol=1e-6)
