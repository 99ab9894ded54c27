"""What the framework-interop tests share: where test/python/run.sh put the built libraries, the
generated Python helpers, and random inputs shaped by each kernel's manifest.

APE_TEST_ARTIFACTS is the build folder of test/python/CMakeLists.txt:
    <enc>_torch_library/libape_<enc>_ops.so and ape_<enc>.py   (apec --emit=torch-library)
    <enc>_c_abi/libape_<enc>_c.so                               (apec --emit=c-abi)
    examples_c/rope_example                                     (examples/c)
"""
import glob
import importlib.util
import os

import pytest
import torch

import reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every example encoding has an operator library under test. The inference-only ones (an
# ape.attention_transition: no backward) are TRANSITION_ENCODINGS, tested by
# test_transition_ops.py; ENCODINGS are the differentiable ones.
_SPECS = sorted(glob.glob(os.path.join(ROOT, "examples", "encodings", "*.mlir")))
ENCODINGS = [os.path.basename(p)[:-5] for p in _SPECS if "ape.attention_transition" not in open(p).read()]
TRANSITION_ENCODINGS = [os.path.basename(p)[:-5] for p in _SPECS if "ape.attention_transition" in open(p).read()]
# Those reference.py writes out in PyTorch (reference.ENCODINGS). Every encoding's library is
# also checked against the C++ reference of ape_kernels_test (kernel_reference below), so the
# float64 library that the half-precision tests compare with is anchored for all of them.
REFERENCE_ENCODINGS = reference.ENCODINGS
# A GPU check prepared for some encodings only (scripts/gpu-check.sh, APE_GPU_CHECK_ENCODINGS) built
# only their libraries and names them in APE_TEST_ENCODINGS: the others' cases are skipped, saying
# so, rather than failing for a library that was never meant to be there. Unset (CI): every one.
BUILT_ONLY = [e for e in os.environ.get("APE_TEST_ENCODINGS", "").split(",") if e]
if BUILT_ONLY:
    ENCODINGS = [e for e in ENCODINGS if e in BUILT_ONLY]
    TRANSITION_ENCODINGS = [e for e in TRANSITION_ENCODINGS if e in BUILT_ONLY]
    REFERENCE_ENCODINGS = [e for e in REFERENCE_ENCODINGS if e in BUILT_ONLY]
# The C ABIs run.sh emitted and CMakeLists.txt built (run.sh's c_abi list: the one list of them).
_ARTIFACTS = os.environ.get("APE_TEST_ARTIFACTS", "")
_C_ABIS = sorted(d[:-len("_c_abi")] for d in (os.listdir(_ARTIFACTS) if os.path.isdir(_ARTIFACTS) else [])
                 if d.endswith("_c_abi") and os.path.isdir(os.path.join(_ARTIFACTS, d)))
# The differentiable ones, and the inference-only ones (an attention transition: test_c_abi.py's own test).
C_ABI_ENCODINGS = [e for e in _C_ABIS if e not in TRANSITION_ENCODINGS]
C_ABI_TRANSITION_ENCODINGS = [e for e in _C_ABIS if e in TRANSITION_ENCODINGS]
# The same tests run on CUDA tensors where PyTorch sees a GPU.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def cmake_cache(name, default=""):
    """The value of `name` in the build's CMakeCache.txt (`default` without a build or the entry)."""
    path = os.path.join(_ARTIFACTS, "CMakeCache.txt") if _ARTIFACTS else ""
    if path and os.path.isfile(path):
        with open(path) as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split("=", 1)[1].strip()
    return default


# The operator libraries built with CUDA kernels (CMakeLists.txt's APE_CUDA_ENCODINGS: rope and
# cable by default; the GPU check adds alibi and alibi_learned, a fixed and a trainable param).
CUDA_ENCODINGS = [e for e in cmake_cache("APE_CUDA_ENCODINGS", "rope;cable").split(";") if e]


def artifacts():
    d = os.environ.get("APE_TEST_ARTIFACTS")
    if not d:
        pytest.skip("APE_TEST_ARTIFACTS is not set: run test/python/run.sh WORKDIR [APEC]")
    if not os.path.isdir(d):
        pytest.fail(f"APE_TEST_ARTIFACTS={d} is not a folder")
    return d


def artifact(*parts):
    path = os.path.join(artifacts(), *parts)
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: did test/python/run.sh build it?")
    return path


_helpers = {}


def helper(encoding):
    """The generated module ape_<encoding> (from the build folder), its library loaded."""
    if BUILT_ONLY and encoding not in BUILT_ONLY:
        pytest.skip(f"{encoding}'s library is not in this build (APE_TEST_ENCODINGS={','.join(BUILT_ONLY)})")
    if encoding not in _helpers:
        path = artifact(f"{encoding}_torch_library", f"ape_{encoding}.py")
        spec = importlib.util.spec_from_file_location(f"ape_{encoding}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.load()
        _helpers[encoding] = module
    return _helpers[encoding]


def ops(encoding):
    return helper(encoding).load()


def make_inputs(encoding, B, H, T, D, dtype=torch.float64, device="cpu", seed=0):
    """Random q, k, v (B, H, T, D), features (B, H, T) and params {name: tensor} for the kernel of
    `encoding`, all leaves; q, k, v, features and trainable params require grad. A fixed param is
    its initial value scaled by 0.7 (so that a kernel ignoring it would fail; rounded where its
    manifest range takes whole numbers only); a trainable one
    initialised to a value with a meaning (a constant, ALiBi's slopes, a sinusoidal table) is
    that value scaled per element by [0.6, 1) (signs kept: KERPLE's p and a stay positive); the
    others (zeros, normal, derived from a projection as the caller would) are random."""
    h = helper(encoding)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def cast(t):
        return t.to(dtype).to(device)

    q, k, v = (cast(rand(B, H, T, D)).requires_grad_() for _ in range(3))
    features = [cast(rand(B, H, T)).requires_grad_() for _ in h.FEATURES]
    init = h.init_params(H, D, dtype=torch.float64)
    params = {}
    for p in h.MANIFEST["params"]:
        name, shape, kind = p["name"], h.param_shape(p["name"], H, D), p["init"]["kind"]
        if name in init and not p["trainable"]:
            t = init[name].detach() * 0.7
            rng = p.get("range")
            if rng:  # within the values it may take (the library refuses others): an original length stays whole
                t = (t.round() if rng["integer"] else t).clamp(rng["min"], rng["max"])
        elif name in init and kind not in ("zeros", "normal"):
            t = init[name].detach() * (0.6 + 0.4 * torch.rand(shape, generator=g, dtype=torch.float64))
        else:
            t = rand(*shape, std=0.3)
        params[name] = cast(t).requires_grad_(bool(p["trainable"]))
    return q, k, v, features, params


_kernel_reference_loaded = False


def kernel_reference(encoding, q, k, v, features, params, dout, scale=None, rounding=None):
    """The independent fp64 reference of test/unit/kernel_reference.cpp (every example encoding,
    written from the spec's math; torch.ops.ape_test_reference, test/python/reference_op.cpp):
    [o, dq, dk, dv, dfeature..., dparam...] as fp64 CPU tensors, the params' gradients for those
    that require grad, in the dict's order (the order of test_torch_ops.leaves). scale None: the
    operator's default for q's head dim. rounding (torch.bfloat16 / torch.float16): rounded where
    a flash kernel rounds, the same-precision baseline of FlashAttention's error rule."""
    global _kernel_reference_loaded
    if not _kernel_reference_loaded:
        torch.ops.load_library(artifact("libape_test_reference.so"))
        _kernel_reference_loaded = True
    if scale is None:
        scale = helper(encoding).default_scale(q.shape[-1])
    names = list(params)
    trainable = [n for n, p in params.items() if p.requires_grad]
    d = lambda t: t.detach()
    out = torch.ops.ape_test_reference.attention(
        encoding, d(q), d(k), d(v), [d(f) for f in features], names, [d(params[n]) for n in names],
        trainable, float(scale), d(dout), rounding)
    return [out[0], *out[2:]]


def ordered(encoding, params):
    return [params[n] for n in helper(encoding).PARAMS]


def close(actual, expected, what, atol, rtol=0.0):
    """Asserts |actual - expected| <= atol + rtol |expected| with a message naming the worst."""
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = (actual - expected).abs()
    bound = atol + rtol * expected.abs()
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0.0, (f"{what}: max |error| {err.max().item():.3e} exceeds atol {atol:.1e}"
                          f" + rtol {rtol:.1e} (worst excess {worst:.3e})")


def pair_sum_bound(exact):
    """The fp32 error allowed in a param gradient on top of twice PyTorch's: a distance bias's
    param gradient (ALiBi's learned slopes) sums up to B T^2 / 2 terms that cancel (every row of
    dS sums to zero), in the kernel's order, not PyTorch's; ape_kernels_test (test/unit/kernels/harness.cpp) measured
    1.3e-4 of the result for alibi_slopes at T = 129 and bounds it by 2e-3."""
    return 2e-3 * max(1.0, exact.abs().max().item())
