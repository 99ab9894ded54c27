"""`ape.load(SPEC)` (python/ape): a spec file outside examples/ compiled, built (cached) and
returned as a differentiable nn.Module. The spec is the tutorial's (docs/writing-an-encoding.md,
sliding-window ALiBi with a -inf mask), read from the page itself; the kernel is checked against a
materialised reference, forward and gradients in fp64, with the window inside and beyond T.

The library is built once per cache ($APE_CACHE_DIR: scripts/test.sh shares build/spec-cache with
the tutorial's own test, which builds it first; alone, the first test here builds it, ~1 minute)."""
import os
import re
import sys

import pytest
import torch

from support import ROOT, close

sys.path.insert(0, os.path.join(ROOT, "python"))
import ape  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "writing-an-encoding.md")


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    """The tutorial's spec, written to sliding_alibi.mlir (the name the page gives it)."""
    with open(PAGE) as f:
        text = re.search(r"^```mlir\n(// sliding_alibi\.mlir.*?)^```", f.read(), re.S | re.M).group(1)
    path = tmp_path_factory.mktemp("spec") / "sliding_alibi.mlir"
    path.write_text(text)
    return str(path)


def reference(q, k, v, slopes, window, scale):
    """l_ij = scale q_i.k_j - m_h (i - j) for 0 <= i - j < window, else -inf; softmax; P V."""
    T = q.shape[2]
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    d = (i - j).to(q.dtype)
    logits = scale * q @ k.transpose(-1, -2) - slopes.view(1, -1, 1, 1) * d
    keep = (j <= i) & (d < window)
    return torch.softmax(logits.masked_fill(~keep, float("-inf")), -1) @ v


@pytest.mark.parametrize("window", [3.0, 64.0])
@pytest.mark.parametrize("T", [1, 7, 70])
def test_matches_reference_fp64(spec, T, window):
    B, H, D = 2, 3, 8
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    fresh = ape.load(spec).materialize(H, D, dtype=torch.float64)
    fresh.fixed.window.fill_(window)
    slopes = fresh.params["slopes"]  # learned: an nn.Parameter of the module
    with torch.no_grad():
        slopes.mul_(1.3)  # away from the initial values
    o = fresh(q, k, v)
    grads = torch.autograd.grad(o, (q, k, v, slopes), dout)
    scale = fresh.helper.default_scale(D)
    o_ref = reference(q, k, v, slopes, window, scale)
    grads_ref = torch.autograd.grad(o_ref, (q, k, v, slopes), dout)
    assert torch.isfinite(o).all()
    close(o, o_ref, "o", atol=1e-10, rtol=1e-9)
    for name, a, b in zip(("dq", "dk", "dv", "dslopes"), grads, grads_ref):
        close(a, b, name, atol=1e-9, rtol=1e-8)


def test_module_params_and_cache(spec):
    m = ape.load(spec, heads=4, head_dim=16)
    assert m.name == "sliding_alibi" and m.features == []
    assert float(m.fixed.window) == 64.0  # the manifest's initial value
    assert [n for n, _ in m.named_parameters()] == ["params.slopes"]
    assert m.params["slopes"].shape == (4,) and m.params["slopes"].requires_grad
    name, lib, cached = ape.cached_library(spec)
    assert cached and name == "sliding_alibi" and lib == m.library_dir
    # The module is differentiable as a whole and moves with .double().
    q = torch.randn(1, 4, 5, 16, dtype=torch.float64, requires_grad=True)
    m.double()(q, q, q).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(m.params["slopes"].grad).all()
    with pytest.raises(ValueError, match=r"params were made for \(heads, head_dim\) = \(4, 16\)"):
        m(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16))


def test_spec_error_is_apecs_located_diagnostic(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("ape.encoding @bad {\n  ape.bogus\n}\n")
    with pytest.raises(ape.BuildError, match=r"bad\.mlir:2:3: error: custom op 'ape\.bogus' is unknown"):
        ape.load(str(bad))


def test_a_second_library_of_the_same_name_is_refused(spec, tmp_path):
    """PyTorch takes one library per operator namespace: loading another library named like a
    loaded one (an edited spec, a copy from another file) aborted the process; it is refused."""
    ape.load(spec)
    with pytest.raises(ape.BuildError, match=r"encoding 'sliding_alibi' is already loaded in this process"):
        ape._import_helper(os.path.join("/nonexistent", "sliding_alibi_torch_library"), "sliding_alibi")
    # An edited spec of that name is refused before its library is built (a minute of compiling).
    edited = tmp_path / "edited.mlir"
    with open(spec) as f:
        edited.write_text(f.read().replace("64.0 : f64", "32.0 : f64"))
    cache = tmp_path / "cache"
    with pytest.raises(ape.BuildError, match=r"encoding 'sliding_alibi' is already loaded in this process"):
        ape.load(str(edited), cache_dir=str(cache))
    built = [f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".so")]
    assert not built, built


def test_a_damaged_cache_entry_is_not_used(spec, tmp_path):
    """An entry is used only while its library has the digest its build recorded: a truncated
    .so (which crashed the process at load with SIGBUS) or a missing one is built again."""
    import shutil
    from ape import build

    name, lib, _ = ape.cached_library(spec)
    entry = os.path.dirname(lib)
    assert build._entry_ok(entry, name)
    copy = tmp_path / os.path.basename(entry)
    shutil.copytree(entry, copy)
    so = copy / f"{name}_torch_library" / "build" / f"libape_{name}_ops.so"
    with open(so, "r+b") as f:
        f.truncate(100000)
    assert not build._entry_ok(str(copy), name)
    # Unpickling a module whose library is that damaged entry is refused with the way out (it had
    # loaded the truncated library: SIGBUS), and so is one whose library folder is gone.
    m = ape.load(spec, heads=2, head_dim=8)
    state = dict(m.__getstate__())
    for where, why in ((copy / f"{name}_torch_library", "is damaged or changed"),
                       (tmp_path / "gone" / f"{name}_torch_library", "no longer exists")):
        state["library_dir"] = str(where)
        twin = ape.Attention.__new__(ape.Attention)
        with pytest.raises(ape.BuildError, match=why + r".*ape\.load"):
            twin.__setstate__(dict(state))
    so.unlink()
    assert not build._entry_ok(str(copy), name)


def test_module_params_pickling_and_scale(spec):
    """Params made at the first call are float32 whatever q's dtype and outside an inference
    mode; the module deep-copies and pickles; a scale tensor that requires grad is refused."""
    import copy
    import pickle

    m = ape.load(spec)
    assert list(m.parameters()) == []  # none before the first call without heads/head_dim
    q = torch.randn(1, 2, 5, 8)
    with torch.inference_mode():
        m(q.bfloat16(), q.bfloat16(), q.bfloat16())
    assert m.params["slopes"].dtype == torch.float32 and not m.params["slopes"].is_inference()
    qg = q.clone().requires_grad_()
    m(qg, qg, qg).sum().backward()  # trains after an inference-mode first call
    assert m.params["slopes"].grad is not None
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(twin(q, q, q), m(q, q, q))
    with pytest.raises(ValueError, match="scale is a number"):
        m(q, q, q, scale=torch.tensor(0.5, requires_grad=True))
    assert torch.equal(m(q, q, q, scale=torch.tensor(0.5)), m(q, q, q, scale=0.5))


def test_threads_calling_a_lazy_module_first_make_one_set_of_params(spec):
    """Threads whose first calls meet make the params once (each had made its own, and most outputs
    came from params the module no longer held)."""
    import threading

    for _ in range(5):
        m = ape.load(spec)
        q = torch.randn(1, 2, 5, 8)
        barrier, seen = threading.Barrier(4), []

        def call():
            barrier.wait()
            m(q, q, q)
            seen.append(m.params["slopes"])

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen) == 4 and all(p is seen[0] for p in seen)
        assert len(list(m.parameters())) == 1


def test_a_device_context_places_every_param(spec):
    """Under `with torch.device(...)` every param follows it, the library's closed-form ones (ALiBi's
    slopes) too: they had stayed on the CPU while the random ones moved."""
    with torch.device("meta"):
        m = ape.load(spec, heads=2, head_dim=8)
    tensors = list(m.parameters()) + list(m.buffers())
    assert tensors and all(t.device.type == "meta" for t in tensors), [t.device for t in tensors]


def test_bad_spec_bytes_and_a_named_apec_that_is_not_there(spec, tmp_path):
    bad = tmp_path / "bytes.mlir"
    bad.write_bytes(b"// \xff\xfe\x00 not utf-8\nape.encoding @bytes {\n  ape.bogus\n}\n")
    with pytest.raises(ape.BuildError, match=r"bytes\.mlir"):
        ape.load(str(bad))
    with pytest.raises(ape.BuildError, match=r"apec=/no/such/apec is not an executable file"):
        ape.load(spec, apec="/no/such/apec")


def test_an_inference_only_spec(tmp_path):
    """An attention transition (inference only) through ape.load: called with layer= and
    num_layers= under no_grad, against the reference of test_transition_ops.py; without them, or
    with inputs that require grad, a clear error. (Its own name: rope_transition's library of the
    framework build may be loaded in this process.)"""
    from test_transition_ops import transition_reference

    path = tmp_path / "load_transition.mlir"
    path.write_text("ape.encoding @load_transition {\n  ape.rotary\n"
                    "  ape.attention_transition {first_layer = 1, skip_last = 1, intervals = 2}\n}\n")
    m = ape.load(str(path))
    assert m.inference_only and list(m.parameters()) == []
    t = m.manifest["transition"]
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 80, 16, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        for layer in range(4):
            close(m(q, k, v, layer=layer, num_layers=4), transition_reference(q, k, v, layer, 4, t),
                  f"o at layer {layer} of 4", atol=1e-12)
        with pytest.raises(ValueError, match="needs layer= and num_layers="):
            m(q, k, v)
    with pytest.raises(RuntimeError, match="inference-only"):
        m(q.requires_grad_(), k, v, layer=1, num_layers=4)


def test_a_build_folder_is_removed_only_once_its_builder_is_gone(tmp_path):
    """ape.build._remove_stale: a .tmp-<pid>-* folder whose pid looks dead here (pid 2^22 + 7 is
    above Linux's pid_max, as a builder in another PID namespace or on another host looks) is
    removed when the flock on its owner file is free, kept while it is held, and kept without an
    owner file until it is an hour old (a first version removed a live container's build)."""
    import fcntl
    import subprocess
    from ape import build
    folders = [tmp_path / f".tmp-4194311-{n}" for n in range(3)]
    for f in folders:
        f.mkdir()
    for f in folders[:2]:
        (f / build.OWNER).touch()
    # Two minutes old (a younger folder may be between its making and its lock, and stays); the
    # one without an owner file stays until it is an hour old.
    for f in folders:
        os.utime(f, (os.path.getmtime(f) - 120,) * 2)
    fd = os.open(folders[0] / build.OWNER, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Another process sweeps (flock's locks are per open file: this one's own would not conflict).
        code = f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'python')!r}); from ape import build; " \
               f"build._remove_stale({str(tmp_path)!r})"
        subprocess.run([sys.executable, "-c", code], check=True)
    finally:
        os.close(fd)
    assert [f.exists() for f in folders] == [True, False, True]


def test_arguments_are_checked_before_a_build_and_fixed_params_keep_their_dtype(spec):
    """load's own arguments are refused before anything compiles; a call's params and tensors are
    checked by type; .bfloat16() rounds the trainable params as asked but not the fixed ones (a
    window of 257 became 256, which still passed the range check); a module whose params are made
    at the first call says how to compile it (torch.compile cannot trace their creation)."""
    with pytest.raises(ValueError, match="give both heads and head_dim"):
        ape.load("/no/such/spec.mlir", heads=4)
    with pytest.raises(ValueError, match="heads must be a whole number >= 1; got 0"):
        ape.load("/no/such/spec.mlir", heads=0, head_dim=8)
    with pytest.raises(TypeError, match=r"cuda_dtypes is a sequence"):
        ape.load(spec, cuda_dtypes="bf16")
    m = ape.load(spec, heads=2, head_dim=8)
    m.fixed.window.fill_(257.0)
    m.bfloat16()
    assert m.fixed.window.dtype == torch.float32 and float(m.fixed.window) == 257.0
    assert m.params["slopes"].dtype == torch.bfloat16
    import pickle
    older = ape.load(spec, heads=2, head_dim=8)  # as pickled before the fixed params kept their dtype
    older.fixed.__class__ = torch.nn.Module
    assert type(pickle.loads(pickle.dumps(older)).fixed).__name__ == "_Fixed"
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(TypeError, match="param 'slopes' must be a torch.Tensor; got list"):
        m(q, q, q, params={"slopes": [0.1, 0.2]})
    with pytest.raises(TypeError, match="params must be a mapping"):
        m(q, q, q, params=[q])
    assert m(q, q, q, params=torch.nn.ParameterDict({"slopes": torch.nn.Parameter(torch.ones(2))})).shape == q.shape
    with pytest.raises(TypeError, match="q must be a torch.Tensor; got ndarray"):
        m(q.numpy(), q, q)
    import numpy
    assert ape.load(spec, heads=numpy.int64(2), head_dim=8).params["slopes"].shape == (2,)
    # torch.compile: the params made at the first call outside the graph (a graph break), which
    # fullgraph=True refuses naming what to do
    with pytest.raises(Exception, match="give_load_heads_and_head_dim"):
        torch.compile(ape.load(spec), fullgraph=True, backend="eager")(q, q, q)
    lazy = ape.load(spec)
    assert torch.compile(lazy, backend="eager")(q, q, q).shape == q.shape and lazy.params["slopes"].shape == (2,)
    assert torch.compile(ape.load(spec, heads=2, head_dim=8), fullgraph=True, backend="eager")(q, q, q).shape == q.shape
