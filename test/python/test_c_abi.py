"""libape_<enc>_c (apec --emit=c-abi) called through ctypes, exactly as a C caller would: forward
and backward in f32 and f64 with strided q, k, v, o and gradients against the materialised
reference, and status codes with messages for bad arguments."""
import ctypes
import json
import math

import pytest
import torch

import reference
from support import C_ABI_ENCODINGS, C_ABI_TRANSITION_ENCODINGS, artifact, close, helper, make_inputs


class Tensor(ctypes.Structure):  # ape_tensor (ape/c/abi.h)
    _fields_ = [("data", ctypes.c_void_p), ("strides", ctypes.POINTER(ctypes.c_int64))]


class Args(ctypes.Structure):  # ape_<enc>_args (ape_<enc>.h): the same layout for every trainable encoding
    _fields_ = [("B", ctypes.c_int64), ("H", ctypes.c_int64), ("T", ctypes.c_int64), ("D", ctypes.c_int64),
                ("scale", ctypes.c_double),
                ("q", Tensor), ("k", Tensor), ("v", Tensor),
                ("features", ctypes.POINTER(Tensor)), ("params", ctypes.POINTER(ctypes.c_void_p)),
                ("o", Tensor), ("lse", ctypes.c_void_p),
                ("dout", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
                ("dfeatures", ctypes.POINTER(Tensor)), ("dparams", ctypes.POINTER(ctypes.c_void_p)),
                ("kv_heads", ctypes.c_int64)]


class LayerArgs(ctypes.Structure):  # an inference-only encoding's args: the same with the layer before kv_heads
    _fields_ = Args._fields_[:-1] + [("layer", ctypes.c_int64), ("num_layers", ctypes.c_int64)] + Args._fields_[-1:]


APE_OK, APE_ERROR_NULL_POINTER, APE_ERROR_INVALID_SHAPE, APE_ERROR_INVALID_VALUE = 0, 1, 2, 3
APE_ERROR_NOT_SUPPORTED = 7

_libs = {}


def lib(encoding):
    if encoding not in _libs:
        so = ctypes.CDLL(artifact(f"{encoding}_c_abi", f"libape_{encoding}_c.so"))
        args = LayerArgs if encoding in C_ABI_TRANSITION_ENCODINGS else Args
        for fn in ("forward_f32", "backward_f32", "forward_f64", "backward_f64"):
            f = getattr(so, f"ape_{encoding}_{fn}")
            f.argtypes, f.restype = [ctypes.POINTER(args)], ctypes.c_int
        for fn, args, res in [("init_param", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                              ctypes.POINTER(ctypes.c_double)], ctypes.c_int),
                              ("error_string", [ctypes.c_int], ctypes.c_char_p),
                              ("last_error", [], ctypes.c_char_p),
                              ("param_numel", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64], ctypes.c_int64),
                              ("default_scale", [ctypes.c_int64], ctypes.c_double),
                              ("manifest", [], ctypes.c_char_p),
                              ("abi_version", [], ctypes.c_int)]:
            f = getattr(so, f"ape_{encoding}_{fn}")
            f.argtypes, f.restype = args, res
        _libs[encoding] = so
    return _libs[encoding]


def fn(encoding, name):
    return getattr(lib(encoding), f"ape_{encoding}_{name}")


class Call:
    """An ape_<enc>_args over torch CPU tensors (kept alive here), strides from the tensors."""

    def __init__(self, q, k, v, features, params, scale, strided=True, args=None):
        self.keep = []
        B, H, T, D = q.shape
        self.args = (args or Args)(B=B, H=H, T=T, D=D, scale=scale, kv_heads=0 if k.shape[1] == H else k.shape[1])
        self.args.q, self.args.k, self.args.v = self.view(q, strided), self.view(k, strided), self.view(v, strided)
        self.args.features = self.views(features, strided)
        self.args.params = self.pointers(params)

    def view(self, t, strided=True):
        self.keep.append(t)
        if not strided:
            assert t.is_contiguous()
            return Tensor(t.data_ptr(), None)
        strides = (ctypes.c_int64 * t.dim())(*t.stride())
        self.keep.append(strides)
        return Tensor(t.data_ptr(), strides)

    def views(self, ts, strided=True):
        if not ts:
            return None
        arr = (Tensor * len(ts))(*[self.view(t, strided) for t in ts])
        self.keep.append(arr)
        return arr

    def pointers(self, ts):
        if not ts:
            return None
        self.keep.extend(ts)
        arr = (ctypes.c_void_p * len(ts))(*[t.data_ptr() for t in ts])
        self.keep.append(arr)
        return arr


def check_backward(encoding, c, suffix, names, params, dout, grads, grads_ref, atol, what=""):
    """Runs c's backward into grads = (dq, dk, dv) and fresh dfeatures / dparams, and compares
    them (the trainable params') with grads_ref; a fixed param's gradient must be zeros."""
    dtype, (B, H, T, _) = grads[0].dtype, grads[0].shape
    dfeat = [torch.zeros(B, H, T, dtype=dtype) for _ in helper(encoding).FEATURES]
    dparams = [torch.zeros_like(params[n].detach().to(dtype)).contiguous() for n in names]
    c.args.dout = c.view(dout)
    c.args.dq, c.args.dk, c.args.dv = (c.view(g) for g in grads)
    c.args.dfeatures, c.args.dparams = c.views(dfeat), c.pointers(dparams)
    assert fn(encoding, "backward_" + suffix)(ctypes.byref(c.args)) == APE_OK, fn(encoding, "last_error")()
    got = [*grads, *dfeat, *[dparams[i] for i, n in enumerate(names) if params[n].requires_grad]]
    for i, (g, g_ref) in enumerate(zip(got, grads_ref)):
        close(g, g_ref, f"gradient {i}{what}", atol=10 * atol, rtol=10 * atol)
    for i, n in enumerate(names):  # a fixed param gets zeros
        if not params[n].requires_grad:
            assert (dparams[i] == 0).all(), n


def strided_like(shape, dtype):
    """A (B, H, T, D) view of (B, T, H, D) memory, as attention sees a projection's output."""
    B, H, T, D = shape
    return torch.zeros(B, T, H, D, dtype=dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 8), (2, 3, 7, 16), (1, 2, 129, 8), (1, 2, 65, 7)],
                         ids=lambda s: "B{}H{}T{}D{}".format(*s))
@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS)
def test_forward_backward_match_reference(encoding, shape, dtype):
    B, H, T, D = shape
    suffix = "f64" if dtype == torch.float64 else "f32"
    q, k, v, features, params = make_inputs(encoding, *shape, torch.float64)
    dout = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    names = helper(encoding).PARAMS
    xs = [q, k, v, *features, *[params[n] for n in names if params[n].requires_grad]]
    o_ref = reference.attention(encoding, q, k, v, features, params)
    grads_ref = torch.autograd.grad(o_ref, xs, dout)

    cast = lambda t: t.detach().to(dtype)
    qs, ks, vs = (strided_like(shape, dtype).copy_(cast(t)) for t in (q, k, v))
    c = Call(qs, ks, vs, [cast(f) for f in features], [cast(params[n]).contiguous() for n in names],
             1.0 / math.sqrt(D))
    o, lse = strided_like(shape, dtype), torch.zeros(B, H, T, dtype=dtype)
    c.args.o, c.args.lse = c.view(o), lse.data_ptr()
    assert fn(encoding, "forward_" + suffix)(ctypes.byref(c.args)) == APE_OK, fn(encoding, "last_error")()
    atol = 1e-10 if dtype == torch.float64 else 2e-5
    close(o, o_ref, "o", atol=atol, rtol=atol)

    check_backward(encoding, c, suffix, names, params, strided_like(shape, dtype).copy_(cast(dout)),
                   [strided_like(shape, dtype) for _ in range(3)], grads_ref, atol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS)
def test_grouped_queries_match_reference(encoding, dtype):
    """kv_heads < H (grouped-query attention; 1: multi-query): k, v, dk, dv [B, kv_heads, T, D],
    against the reference over k and v repeated to H heads (autograd sums the groups)."""
    B, H, T, D = 2, 4, 37, 8
    suffix = "f64" if dtype == torch.float64 else "f32"
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, torch.float64, seed=3)
    names = helper(encoding).PARAMS
    for kv in (2, 1):
        kg, vg = (t.detach()[:, :kv].clone().requires_grad_() for t in (k, v))
        dout = torch.randn(B, H, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(kv))
        o_ref = reference.attention(encoding, q, kg.repeat_interleave(H // kv, 1), vg.repeat_interleave(H // kv, 1),
                                    features, params)
        xs = [q, kg, vg, *features, *[params[n] for n in names if params[n].requires_grad]]
        grads_ref = torch.autograd.grad(o_ref, xs, dout)
        cast = lambda t: t.detach().to(dtype).contiguous()
        c = Call(cast(q), cast(kg), cast(vg), [cast(f) for f in features], [cast(params[n]) for n in names],
                 1.0 / math.sqrt(D))
        assert c.args.kv_heads == kv
        o, lse = torch.zeros(B, H, T, D, dtype=dtype), torch.zeros(B, H, T, dtype=dtype)
        c.args.o, c.args.lse = c.view(o), lse.data_ptr()
        assert fn(encoding, "forward_" + suffix)(ctypes.byref(c.args)) == APE_OK, fn(encoding, "last_error")()
        atol = 1e-10 if dtype == torch.float64 else 2e-5
        close(o, o_ref, f"o (kv_heads {kv})", atol=atol, rtol=atol)
        grads = [torch.zeros(B, H, T, D, dtype=dtype), *(torch.zeros(B, kv, T, D, dtype=dtype) for _ in range(2))]
        check_backward(encoding, c, suffix, names, params, cast(dout), grads, grads_ref, atol, f" (kv_heads {kv})")
    c.args.kv_heads = 3  # not a divisor of H = 4
    assert fn(encoding, "forward_f64")(ctypes.byref(c.args)) == APE_ERROR_INVALID_SHAPE
    assert b"kv_heads must be 0 (= H) or a divisor of H in [1, H]; got kv_heads=3 for H=4" in fn(encoding, "last_error")()
    c.args.H, c.args.kv_heads = 0, 2  # more key heads than query heads (none): no group to read them
    assert fn(encoding, "backward_f64")(ctypes.byref(c.args)) == APE_ERROR_INVALID_SHAPE
    assert b"got kv_heads=2 for H=0" in fn(encoding, "last_error")()


@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS)
def test_contiguous_null_strides_and_empty_shapes(encoding):
    B, H, T, D = 1, 2, 5, 4
    q, k, v, features, params = make_inputs(encoding, B, H, T, D)
    names = helper(encoding).PARAMS
    c = Call(*(t.detach() for t in (q, k, v)), [f.detach() for f in features],
             [params[n].detach() for n in names], 0.5, strided=False)
    o, lse = torch.zeros(B, H, T, D, dtype=torch.float64), torch.zeros(B, H, T, dtype=torch.float64)
    c.args.o, c.args.lse = c.view(o, strided=False), lse.data_ptr()
    assert fn(encoding, "forward_f64")(ctypes.byref(c.args)) == APE_OK
    close(o, reference.attention(encoding, q, k, v, features, params, scale=0.5), "o", atol=1e-10)
    for B0, T0 in [(0, T), (B, 0)]:  # nothing to do, still OK
        c.args.B, c.args.T = B0, T0
        assert fn(encoding, "forward_f64")(ctypes.byref(c.args)) == APE_OK
    # The backward of no rows: OK, the params' gradients zero (written: they were ones).
    c.args.B, c.args.T = B, 0
    dparams = [torch.ones_like(params[n].detach()).contiguous() for n in names]
    empty = torch.zeros(B, H, 0, D, dtype=torch.float64)
    c.args.dout = c.args.dq = c.args.dk = c.args.dv = c.view(empty, strided=False)
    c.args.dfeatures = c.views([torch.zeros(B, H, 0, dtype=torch.float64) for _ in features])
    c.args.dparams = c.pointers(dparams)
    assert fn(encoding, "backward_f64")(ctypes.byref(c.args)) == APE_OK, fn(encoding, "last_error")()
    for n, g in zip(names, dparams):
        assert (g == 0).all(), n


@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS)
def test_status_codes_and_messages(encoding):
    h = helper(encoding)
    forward, last = fn(encoding, "forward_f32"), fn(encoding, "last_error")
    assert forward(None) == APE_ERROR_NULL_POINTER
    assert b"args is NULL" in last()
    B, H, T, D = 1, 2, 3, 4
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, torch.float32)
    plist = [params[n].detach().clone() for n in h.PARAMS]
    c = Call(*(t.detach() for t in (q, k, v)), [f.detach() for f in features], plist, 0.5)
    o, lse = torch.zeros(B, H, T, D), torch.zeros(B, H, T)
    c.args.o, c.args.lse = c.view(o), lse.data_ptr()
    assert forward(ctypes.byref(c.args)) == APE_OK

    # A fixed param's value outside its manifest range (a position_scale of NaN had made every
    # output NaN): the runtime's words, before anything runs.
    for i, name in enumerate(h.PARAMS):
        if h.MANIFEST["params"][i].get("range"):
            saved = plist[i].clone()
            plist[i].fill_(math.nan)
            assert forward(ctypes.byref(c.args)) == APE_ERROR_INVALID_VALUE
            assert f"params[{i}]: param '{name}' must be ".encode() in last() and last().endswith(b"got nan"), last()
            plist[i].copy_(saved)
    assert forward(ctypes.byref(c.args)) == APE_OK

    def expect(status, text, **change):
        saved = bytes(c.args)  # fields of a ctypes struct alias it: restore the bytes
        for name, value in change.items():
            setattr(c.args, name, value)
        assert forward(ctypes.byref(c.args)) == status
        assert text.encode() in last(), last()
        assert last().startswith(f"ape_{encoding}_forward_f32: ".encode())
        ctypes.memmove(ctypes.addressof(c.args), saved, ctypes.sizeof(Args))

    expect(APE_ERROR_INVALID_SHAPE, "B, H, T must be >= 0 and D >= 1, got B=1 H=2 T=3 D=0", D=0)
    expect(APE_ERROR_INVALID_SHAPE, "got B=-1", B=-1)
    expect(APE_ERROR_INVALID_SHAPE, "overflows int64", B=2**40, H=2**40)
    expect(APE_ERROR_INVALID_VALUE, "scale must be finite", scale=math.nan)
    expect(APE_ERROR_INVALID_VALUE, "0 or at least 5.42101086e-20 in magnitude; got -1e-30", scale=-1e-30)
    expect(APE_ERROR_INVALID_VALUE, "beyond the range of the kernel's float", scale=1e39)  # inf in float
    expect(APE_ERROR_INVALID_SHAPE, "overflows int64", B=2**40, H=2**20, T=0)  # no rows, but 2^60 slices
    expect(APE_ERROR_INVALID_SHAPE, "T or D is too large", T=0, D=2**62)
    expect(APE_ERROR_NULL_POINTER, "q.data is NULL", q=Tensor(None, None))
    expect(APE_ERROR_NULL_POINTER, "lse is NULL", lse=None)
    if h.FEATURES:
        expect(APE_ERROR_NULL_POINTER, "features is NULL but the encoding has 1 feature(s)", features=None)
    if h.PARAMS:
        expect(APE_ERROR_NULL_POINTER, f"params is NULL but the encoding has {len(h.PARAMS)} param(s)", params=None)
    assert fn(encoding, "backward_f32")(ctypes.byref(c.args)) == APE_ERROR_NULL_POINTER  # no dout
    assert b"dout.data is NULL" in last()

    err = fn(encoding, "error_string")
    assert err(APE_OK) == b"ok" and err(APE_ERROR_NULL_POINTER) == b"a required pointer is NULL"
    assert err(12345) == b"unknown status"


@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS)
def test_queries(encoding):
    h = helper(encoding)
    assert fn(encoding, "abi_version")() == 2
    assert json.loads(fn(encoding, "manifest")().decode()) == h.MANIFEST
    assert fn(encoding, "default_scale")(16) == pytest.approx(h.default_scale(16))
    assert math.isnan(fn(encoding, "default_scale")(0))
    for n, name in enumerate(h.PARAMS):
        assert fn(encoding, "param_numel")(n, 3, 8) == math.prod(h.param_shape(name, 3, 8))
    assert fn(encoding, "param_numel")(len(h.PARAMS), 3, 8) == -1
    for n, name in enumerate(h.PARAMS):  # an element count past int64: -1, not a wrapped one
        numel = math.prod(h.param_shape(name, 2**40, 2**40))
        assert fn(encoding, "param_numel")(n, 2**40, 2**40) == (numel if numel < 2**63 else -1), name
    assert fn(encoding, "param_numel")(-1, 3, 8) == -1


@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS + C_ABI_TRANSITION_ENCODINGS)
def test_init_param(encoding):
    """ape_<enc>_init_param: a param's initial value as the operator library's helper makes it
    (zeros, ones, constant, ALiBi's slopes, the sinusoidal table: a C caller had to compute
    them again), a param drawn at random or derived from a projection refused with the reason,
    and bad arguments refused."""
    h = helper(encoding)
    f = fn(encoding, "init_param")
    H, D = 3, 8
    made = h.init_params(H, D, dtype=torch.float64)
    for n, p in enumerate(h.MANIFEST["params"]):
        numel = fn(encoding, "param_numel")(n, H, D)
        out = (ctypes.c_double * max(numel, 1))()
        status = f(n, H, D, out)
        kind = p["init"]["kind"]
        if kind == "normal":
            assert status == APE_ERROR_NOT_SUPPORTED
            assert b"is drawn at random, N(0, " in fn(encoding, "last_error")()
        elif kind.startswith("projection_"):
            assert status == APE_ERROR_NOT_SUPPORTED
            assert b"is computed from a projection weight" in fn(encoding, "last_error")()
        else:
            assert status == APE_OK, fn(encoding, "last_error")()
            got = torch.tensor(list(out)[:numel], dtype=torch.float64)
            assert torch.equal(got, made[p["name"]].detach().flatten()), p["name"]
    out = (ctypes.c_double * 1)()
    assert f(len(h.MANIFEST["params"]), H, D, out) == APE_ERROR_INVALID_VALUE
    assert f(-1, H, D, out) == APE_ERROR_INVALID_VALUE
    if h.MANIFEST["params"]:
        assert f(0, 0, D, out) == APE_ERROR_INVALID_SHAPE
        assert f(0, H, D, None) == APE_ERROR_NULL_POINTER


@pytest.mark.parametrize("encoding", C_ABI_TRANSITION_ENCODINGS)
def test_inference_only_layers_and_refused_backward(encoding):
    """An attention transition's C ABI: forward at each layer of a 6-layer model against the
    reference of test_transition_ops.py (strided q, k, v, o; f64 and f32), a layer out of range
    APE_ERROR_INVALID_VALUE, and the backward APE_ERROR_NOT_SUPPORTED with the reason."""
    from test_transition_ops import transition_reference

    B, H, T, D, N = 2, 2, 150, 16, 6
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    t = helper(encoding).MANIFEST["transition"]
    last = fn(encoding, "last_error")
    for dtype, suffix, atol in [(torch.float64, "f64", 1e-12), (torch.float32, "f32", 2e-5)]:
        qs, ks, vs = (strided_like((B, H, T, D), dtype).copy_(x.to(dtype)) for x in (q, k, v))
        c = Call(qs, ks, vs, [], [], 1.0 / math.sqrt(D), args=LayerArgs)
        o, lse = strided_like((B, H, T, D), dtype), torch.zeros(B, H, T, dtype=dtype)
        c.args.o, c.args.lse = c.view(o), lse.data_ptr()
        for layer in range(N):
            c.args.layer, c.args.num_layers = layer, N
            assert fn(encoding, "forward_" + suffix)(ctypes.byref(c.args)) == APE_OK, last()
            close(o, transition_reference(q, k, v, layer, N, t), f"{suffix} o at layer {layer}", atol=atol)
        # lse is the softmax's, and layer 0 of 0 is rope's own C ABI bit for bit.
        if "rope" in C_ABI_ENCODINGS:
            c.args.layer, c.args.num_layers = 0, 0
            assert fn(encoding, "forward_" + suffix)(ctypes.byref(c.args)) == APE_OK, last()
            r = Call(qs, ks, vs, [], [], 1.0 / math.sqrt(D))
            o_rope, lse_rope = strided_like((B, H, T, D), dtype), torch.zeros(B, H, T, dtype=dtype)
            r.args.o, r.args.lse = r.view(o_rope), lse_rope.data_ptr()
            assert fn("rope", "forward_" + suffix)(ctypes.byref(r.args)) == APE_OK
            assert torch.equal(o, o_rope) and torch.equal(lse, lse_rope)
        for layer, num_layers in [(6, 6), (-1, 6), (1, 0), (0, -1)]:
            c.args.layer, c.args.num_layers = layer, num_layers
            assert fn(encoding, "forward_" + suffix)(ctypes.byref(c.args)) == APE_ERROR_INVALID_VALUE
            assert b"layer must be in [0, num_layers)" in last(), last()
        c.args.layer, c.args.num_layers = 1, N
        assert fn(encoding, "backward_" + suffix)(ctypes.byref(c.args)) == APE_ERROR_NOT_SUPPORTED
        assert b"inference-only" in last(), last()
    assert fn(encoding, "error_string")(APE_ERROR_NOT_SUPPORTED).startswith(b"not supported")


def test_each_library_keeps_its_own_last_error_linked_statically():
    """rope's and alibi's C ABI objects linked into one program (c_abi_static_errors.c), as a static
    link makes it: a failed call of each, and each library's last_error names its own call. The
    message was one variable of an inline function, one symbol for every library linked statically:
    ape_rope_last_error() returned alibi's message."""
    import subprocess

    if not {"rope", "alibi"} <= set(C_ABI_ENCODINGS):
        pytest.skip("the rope and alibi C ABIs are not in this build")
    run = subprocess.run([artifact("c_abi_static_errors")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rope: 2 ape_rope_forward_f32" in run.stdout and "alibi: 1 ape_alibi_backward_f64" in run.stdout, run.stdout


@pytest.mark.parametrize("encoding", C_ABI_ENCODINGS)
def test_only_the_c_functions_are_exported(encoding):
    """The shared library's dynamic symbols are its ape_<enc>_* functions and nothing else: hidden
    visibility had left 18 instantiations of the C++ library's templates exported (std::
    functions and typeinfo), which a program's own could bind to (the version script of the
    emitted CMakeLists.txt)."""
    import shutil
    import subprocess

    nm = shutil.which("nm")
    assert nm, "nm (binutils) is part of the toolchain that built the library"
    so = artifact(f"{encoding}_c_abi", f"libape_{encoding}_c.so")
    run = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    names = [line.split()[-1] for line in run.stdout.splitlines() if line.strip()]
    ours = [n for n in names if n.startswith(f"ape_{encoding}_")]
    assert f"ape_{encoding}_forward_f32" in ours and f"ape_{encoding}_abi_version" in ours, names
    others = [n for n in names if not n.startswith(f"ape_{encoding}_") and not n.startswith("APE_C_ABI")]
    assert not others, f"exported beside the C functions: {others[:10]}"
