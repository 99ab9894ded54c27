"""APE from Python: a spec file in, a differentiable fused attention out.

    import ape
    attn = ape.load("my_encoding.mlir", heads=8, head_dim=64)   # compiled once, then cached
    o = attn(q, k, v)                   # q (B, H, T, D), k, v (B, H or H_kv, T, D); o.sum().backward() reaches every input
    attn.parameters()                   # the encoding's trainable params, initialised from its manifest

`load` runs apec (--emit=torch-library), builds the operator library for this Python's PyTorch
(cached under $APE_CACHE_DIR, default $XDG_CACHE_HOME/ape or ~/.cache/ape; see ape.build.cached_library), loads it and
wraps torch.ops.ape_NAME.attention in an nn.Module. A spec error raises ape.BuildError whose
message is apec's file:line:col diagnostics. Put the folder of this file's parent on sys.path (the
repository's python/) to import it.
"""
import importlib.util
import operator
import os
import sys
import threading

import torch

from .build import BuildError, cached_library, default_cache_dir, find_apec  # noqa: F401

__all__ = ["load", "Attention", "BuildError"]


def _import_helper(lib, name):
    """The generated module ape_NAME of a built library folder, its operators loaded. PyTorch
    registers one library per operator namespace (torch.ops.ape_NAME) in a process: a second
    library of that name (another spec named NAME, an edited spec) is refused with a BuildError
    here, where loading it would abort the process; the same spec text from another file is the
    same library (its cache entry), and is reused."""
    loaded = _loadable(name, lib)
    if loaded is not None:
        return loaded
    module_name = f"ape_{name}"
    spec = importlib.util.spec_from_file_location(module_name, _helper_path(lib, name))
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    h.load()
    sys.modules[module_name] = h
    return h


def _helper_path(lib, name):
    import os

    return os.path.join(lib, "build", f"ape_{name}.py")


def _loadable(name, lib):
    """The module of library folder `lib` if this process has loaded it (None if not loaded); a
    BuildError if another library of that name is loaded (checked before a build: ape.load's
    `check`, so a refusal costs no minute of compiling)."""
    module_name = f"ape_{name}"
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__file__", None) == _helper_path(lib, name):
        return loaded
    if loaded is not None or _namespace_taken(module_name):
        where = getattr(loaded, "__file__", None) or "a library loaded by other means"
        raise BuildError(f"encoding '{name}' is already loaded in this process (torch.ops.{module_name}, from "
                         f"{where}); PyTorch takes one library per name, so another spec named '{name}' (or this "
                         "spec edited) cannot be loaded beside it: rename its "
                         "ape.encoding, or restart Python")
    return None


def _namespace_taken(namespace):
    """Whether torch.ops.NAMESPACE has an operator (a library of that name is loaded)."""
    try:
        getattr(getattr(torch.ops, namespace), "attention")
        return True
    except (AttributeError, RuntimeError):
        return False


class _Fixed(torch.nn.Module):
    """The fixed params of an Attention, as buffers: moved by .to(device) and .cuda() like any
    buffer, but kept in their dtype under .half(), .bfloat16() and .to(dtype), which round them (a
    window of 257 became 256 in bfloat16 and still passed the range check: other keys masked,
    without a word). Each call passes them to the kernels as Attention.forward says."""

    def _apply(self, fn, recurse=True):
        def keep_dtype(t):
            out = fn(t)
            if isinstance(out, torch.Tensor) and t.is_floating_point() and out.dtype != t.dtype:
                return t.to(device=out.device)
            return out
        return super()._apply(keep_dtype, recurse)


def _materialize_outside_the_graph_give_load_heads_and_head_dim(module, q):
    """The params of an Attention made at its first call while torch.compile traces it: torch.compile
    cannot trace their creation (nn.Parameter), so this runs eagerly, a graph break, which
    fullgraph=True refuses: give ape.load heads= and head_dim= (or call materialize) first."""
    module.materialize(q.shape[1], q.shape[3], device=q.device)


if hasattr(torch, "compiler") and hasattr(torch.compiler, "disable"):
    try:  # (the reason is what fullgraph=True's refusal prints; PyTorch before 2.6 takes none)
        _materialize_outside_the_graph_give_load_heads_and_head_dim = torch.compiler.disable(
            _materialize_outside_the_graph_give_load_heads_and_head_dim,
            reason="an ape.Attention makes its params at its first call, which torch.compile cannot trace: give "
                   "ape.load heads= and head_dim= (or call materialize) before torch.compile(fullgraph=True)")
    except TypeError:
        _materialize_outside_the_graph_give_load_heads_and_head_dim = torch.compiler.disable(
            _materialize_outside_the_graph_give_load_heads_and_head_dim)

# One lazy module's params made once when threads call it first together (each had made its own:
# three of four outputs came from params the module no longer held).
_MATERIALIZE_LOCK = threading.Lock()


def _compiling():
    """Whether torch.compile is tracing the caller."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


class Attention(torch.nn.Module):
    """The fused attention of one encoding: forward(q, k, v, *features, scale=None).

    q: (B, H, T, D); k, v: (B, H_kv, T, D), H_kv = H or a divisor of it (grouped-query attention); features: one (B, H, T) tensor per token feature of the encoding, in
    the order of `.features` (the runtime computes them as a Linear(d, H) of the block input; here
    they are inputs). The params the manifest declares are created by `materialize(heads,
    head_dim)` (called by load when heads and head_dim are given, else at the first call from q's
    shape): trainable ones are nn.Parameters in `.params`, fixed ones buffers of `.fixed`, in
    float32 (each call passes them to the kernels in q's dtype, float32 ones as they are with a
    bfloat16 or float16 q), outside any inference mode. Until then
    `.parameters()` is empty: give load heads and head_dim before making an optimizer or loading a
    state_dict. Params derived from projection weights (ExPE-style overrides) are not created: pass
    them with params={name: tensor}. The module pickles and deep-copies (the library is loaded
    again from its folder).

    An inference-only encoding (an ape.attention_transition; `.inference_only`) is called with
    layer= and num_layers= (the layer, 0-based, of a model of num_layers layers that the call
    computes) under torch.no_grad() or torch.inference_mode(): it has no backward, and its
    trainable params are frozen Parameters (requires_grad False; the state_dict keys of the
    encoding trained without the transition)."""

    def __init__(self, helper, library_dir):
        super().__init__()
        self.helper = helper
        self.name = helper.ENCODING
        self.manifest = helper.MANIFEST
        self.features = list(helper.FEATURES)
        self.inference_only = bool(getattr(helper, "INFERENCE_ONLY", False))
        self.library_dir = library_dir
        self.params = torch.nn.ParameterDict()  # trainable params by manifest name
        self.fixed = _Fixed()                   # fixed params, as buffers by manifest name
        self._shape = None

    def materialize(self, heads, head_dim, dtype=torch.float32, device=None, generator=None):
        """Creates the params for `heads` heads of dimension `head_dim`, from the manifest's
        initialisers."""
        with torch.inference_mode(False), torch.no_grad():
            init = self.helper.init_params(heads, head_dim, dtype=dtype, device=device, generator=generator)
        for p in self.manifest["params"]:
            n = p["name"]
            if n not in init:
                continue
            t = init[n].detach()
            if p["trainable"]:  # (frozen for an inference-only encoding: it has no backward)
                self.params[n] = torch.nn.Parameter(t, requires_grad=not self.inference_only)
            else:
                self.fixed.register_buffer(n, t)
        self._shape = (heads, head_dim)
        return self

    def forward(self, q, k, v, *features, params=None, scale=None, layer=None, num_layers=None):
        for what, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, (torch.Tensor, torch.fx.Proxy)):  # (a Proxy: torch.fx.symbolic_trace)
                raise TypeError(f"{what} must be a torch.Tensor; got {type(t).__name__}")
        if len(features) != len(self.features):
            raise ValueError(f"encoding {self.name!r} takes {len(self.features)} token feature(s) "
                             f"{self.features} after q, k, v; got {len(features)}")
        if q.dim() != 4:
            raise ValueError(f"q must be (B, H, T, D); got shape {tuple(q.shape)}")
        if scale is not None and isinstance(scale, torch.Tensor):
            if scale.requires_grad:
                raise ValueError("scale is a number: a tensor that requires grad would not be differentiated "
                                 "(pass a float, or scale q instead)")
            scale = float(scale)
        if params is not None and not (hasattr(params, "keys") and hasattr(params, "__getitem__")):
            raise TypeError(f"params must be a mapping of name: tensor (a dict); got {type(params).__name__}")
        for n in (params.keys() if params is not None else ()):
            t = params[n]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"encoding {self.name!r}: param {n!r} must be a torch.Tensor; got {type(t).__name__}")
        if self._shape is None:
            if self.manifest["params"] and _compiling():
                # torch.compile cannot trace the creation of nn.Parameters: outside the graph (a
                # graph break; under fullgraph=True Dynamo refuses, naming this function)
                _materialize_outside_the_graph_give_load_heads_and_head_dim(self, q)
            else:
                with _MATERIALIZE_LOCK:
                    if self._shape is None:
                        self.materialize(q.shape[1], q.shape[3], device=q.device)
        elif self._shape != (q.shape[1], q.shape[3]) and self.manifest["params"]:
            raise ValueError(f"encoding {self.name!r}: params were made for (heads, head_dim) = {self._shape}; "
                             f"q has {(q.shape[1], q.shape[3])}")
        own = dict(self.params.items())
        own.update(self.fixed.named_buffers())
        given = dict(own, **(params or {}))
        # q's dtype, but float32 params stay float32 with a bfloat16 or float16 q (the kernels
        # compute in float32; their gradients then come back in float32, unrounded).
        keep32 = q.dtype in (torch.bfloat16, torch.float16)
        cast = {n: (t.to(q.dtype) if t.is_floating_point() and t.dtype != q.dtype
                    and not (keep32 and t.dtype == torch.float32) else t) for n, t in given.items()}
        if self.inference_only:
            return self.helper.attention(q, k, v, features, cast, scale=scale, layer=layer, num_layers=num_layers)
        if layer is not None or num_layers is not None:
            raise ValueError(f"encoding {self.name!r}: layer and num_layers are for an attention transition; "
                             f"{self.name!r} has none")
        return self.helper.attention(q, k, v, features, cast, scale=scale)

    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        state.pop("helper", None)  # a module object: loaded again from library_dir
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if type(self.fixed) is torch.nn.Module:  # (pickled before _Fixed: its buffers keep their dtype too)
            self.fixed.__class__ = _Fixed
        # The library is loaded again from its folder, which may have changed since it was pickled
        # (a truncated .so had killed the process with SIGBUS): a cache entry is used only if its
        # files still match the digest of its build, and a missing folder is said as such.
        from .build import COMPLETE, _entry_ok
        entry = os.path.dirname(os.path.abspath(self.library_dir))
        why = None
        if not os.path.isdir(self.library_dir):
            why = "no longer exists (a cleared cache, or another machine)"
        elif (self.library_dir not in _VERIFIED and os.path.exists(os.path.join(entry, COMPLETE))
              and not _entry_ok(entry, self.name)):
            why = "is damaged or changed since it was built"
        if why:
            raise BuildError(f"unpickling ape.Attention {self.name!r}: its operator library {self.library_dir} {why}; "
                             f"load the spec again with ape.load(...) (it rebuilds the library) and load the "
                             f"state_dict into it")
        self.helper = _import_helper(self.library_dir, self.name)
        _VERIFIED.add(self.library_dir)  # (a deepcopy's unpickling hashes a library once per process)

    def extra_repr(self):
        return f"encoding={self.name!r}, features={self.features}, library={self.library_dir!r}"


# The library folders whose digest this process has checked (loaded once, a library cannot change
# under the process that holds it).
_VERIFIED = set()


def load(spec, heads=None, head_dim=None, *, apec=None, cache_dir=None, verbose=False, cuda_dtypes=None,
         cuda_head_dims=None):
    """Compiles (cached), builds and loads the spec file `spec`; returns its Attention module.

    heads, head_dim: the shape the params are made for (both, or neither: then at the first call,
    from q). apec: the compiler (default $APE_APEC, else build/tools/apec of this checkout).
    cache_dir: default $APE_CACHE_DIR, else $XDG_CACHE_HOME/ape, else ~/.cache/ape. verbose: say when a library is built.
    cuda_dtypes, cuda_head_dims: the CUDA kernels to compile where PyTorch sees a GPU (e.g. ("bf16",)
    and (64,); default every variant: nvcc takes minutes for all nine)."""
    if (heads is None) != (head_dim is None):
        raise ValueError("give both heads and head_dim, or neither (then the params are made at the first call)")
    for what, n in (("heads", heads), ("head_dim", head_dim)):
        if n is None:
            continue
        try:
            whole = operator.index(n) if not isinstance(n, bool) else None
        except TypeError:
            whole = None
        if whole is None or whole < 1:
            raise ValueError(f"{what} must be a whole number >= 1; got {n!r}")
    for what, vals in (("cuda_dtypes", cuda_dtypes), ("cuda_head_dims", cuda_head_dims)):
        if vals is not None and (isinstance(vals, (str, bytes, int)) or not hasattr(vals, "__iter__")):
            raise TypeError(f"{what} is a sequence (e.g. {what}=" + ("(\"bf16\",)" if what == "cuda_dtypes" else "(64,)")
                            + f"); got {vals!r}")
    log = (lambda s: print(s, file=sys.stderr)) if verbose else None
    name, lib, _ = cached_library(spec, apec=apec, cache_dir=cache_dir, log=log, cuda_dtypes=cuda_dtypes,
                                  cuda_head_dims=cuda_head_dims, check=_loadable)
    m = Attention(_import_helper(lib, name), lib)
    if heads is not None:
        m.materialize(heads, head_dim)
    return m
