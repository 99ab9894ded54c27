"""Emitting and building an encoding's PyTorch operator library, as docs/frameworks.md says:

    apec SPEC.mlir -o WORK --emit=torch-library
    cmake -S WORK/NAME_torch_library -B WORK/NAME_torch_library/build -DAPE_PYTHON=<this python>
    cmake --build WORK/NAME_torch_library/build        -> libape_NAME_ops.so, ape_NAME.py

`ape.load` calls these through a cache (cached_library); the benchmarks in bench/ call them on a
work folder of their own.
"""
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BuildError(RuntimeError):
    """apec rejected the spec (its file:line:col diagnostics are the message), or the library
    did not build (the compiler's output is the message)."""


def run(cmd, what="", env=None):
    """Runs cmd; raises BuildError with its output when it fails. Returns its stdout."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise BuildError(f"{what or cmd[0]} failed (exit {p.returncode}):\n{' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def find_apec(apec=None):
    """apec: the argument, else $APE_APEC, else build/tools/apec of this checkout, else PATH's."""
    for c in (apec, os.environ.get("APE_APEC"), os.path.join(ROOT, "build", "tools", "apec"), shutil.which("apec")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise BuildError("apec not found: build it (scripts/build.sh apec), or set APE_APEC or pass apec=PATH")


def library_dir(work, enc):
    return os.path.join(work, f"{enc}_torch_library")


def emit(apec, spec, work, extra=(), expect=None):
    """apec --emit=torch-library of `spec` into `work`; returns the encoding's name: `expect`
    (apec checks it), or the one folder apec wrote into a fresh `work`."""
    if expect:
        extra = [*extra, "--expect-name", expect]
    p = subprocess.run([apec, spec, "-o", work, "--emit=torch-library", *extra], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise BuildError(f"apec rejected {spec}:\n{p.stdout}{p.stderr}".rstrip())
    if expect:
        return expect
    made = sorted(glob.glob(os.path.join(work, "*_torch_library")))
    if len(made) != 1:
        raise BuildError(f"{spec} holds {len(made)} encodings; ape.load takes a spec with exactly one ape.encoding")
    return os.path.basename(made[0])[: -len("_torch_library")]


def build(lib, python=None, cmake_args=()):
    """Configures and builds the operator library folder `lib` for `python`'s PyTorch (default:
    this interpreter). Returns (configure seconds, build seconds)."""
    python = python or sys.executable
    t0 = time.perf_counter()
    run(["cmake", "-S", lib, "-B", os.path.join(lib, "build"), f"-DAPE_PYTHON={python}", *cmake_args],
        what="cmake configure")
    t1 = time.perf_counter()
    run(["cmake", "--build", os.path.join(lib, "build")], what="cmake --build")
    return t1 - t0, time.perf_counter() - t1


def build_library(apec, work, enc):
    """Emits and builds the operator library of examples/encodings/ENC.mlir under work, for the
    PyTorch of this Python. Returns (library folder, configure seconds, build seconds)."""
    spec = os.path.join(ROOT, "examples", "encodings", f"{enc}.mlir")
    emit(apec, spec, work, expect=enc)
    lib = library_dir(work, enc)
    conf, bld = build(lib)
    return lib, conf, bld


def default_cache_dir():
    """$APE_CACHE_DIR, else $XDG_CACHE_HOME/ape, else ~/.cache/ape (as ape-train --spec)."""
    d = os.environ.get("APE_CACHE_DIR")
    if d:
        return d
    xdg = os.environ.get("XDG_CACHE_HOME")
    return os.path.join(xdg, "ape") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "ape")


def _folder_hash(folder, h):
    for path in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            h.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
            h.update(b"\0")


def _remove_stale(cache):
    """Removes .tmp-<pid>-* folders whose process is gone (killed mid-build)."""
    for d in glob.glob(os.path.join(cache, ".tmp-*-*")):
        try:
            pid = int(os.path.basename(d).split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def cached_library(spec, apec=None, cache_dir=None, log=None, cuda_dtypes=None, cuda_head_dims=None):
    """The built operator library folder of `spec`, from the cache or built now.

    apec runs every time (a fraction of a second; spec errors surface as its file:line:col); the
    library is built when the key is new: a hash of the emitted folder (so the spec, apec and the
    kernel headers it copies), this Python and its torch version, and the C++ compiler ($CXX).
    The folder is built under a temporary name and renamed into place, so no process sees a
    half-built library, and a lock per key makes a second process wait for the first's build.
    cuda_dtypes / cuda_head_dims narrow the CUDA variants (apec's --cuda-dtypes, --cuda-head-dims;
    default: all of bf16, f16, f32 x 32, 64, 128), which nvcc compiles where PyTorch sees a GPU.
    Returns (encoding name, library folder, whether it was cached)."""
    import torch

    apec = find_apec(apec)
    cache = os.path.join(cache_dir or default_cache_dir(), "torch")
    os.makedirs(cache, exist_ok=True)
    _remove_stale(cache)
    tmp = os.path.join(cache, f".tmp-{os.getpid()}-{time.monotonic_ns()}")
    os.makedirs(tmp)
    try:
        extra = ["--source-name", os.path.basename(spec)]
        if cuda_dtypes:
            extra.append("--cuda-dtypes=" + ",".join(cuda_dtypes))
        if cuda_head_dims:
            extra.append("--cuda-head-dims=" + ",".join(str(d) for d in cuda_head_dims))
        name = emit(apec, os.path.abspath(spec), tmp, extra)
        h = hashlib.sha256()
        _folder_hash(library_dir(tmp, name), h)
        h.update(f"\0{sys.executable}\0{torch.__version__}\0{os.environ.get('CXX', '')}".encode())
        final = os.path.join(cache, f"{name}-{h.hexdigest()[:16]}")
        lib = library_dir(final, name)
        helper = os.path.join(lib, "build", f"ape_{name}.py")
        # One build per key at a time: a second process waits here, then finds the library.
        with open(final + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(helper):
                return name, lib, True
            t0 = time.perf_counter()
            if log:
                log(f"[ape] building the operator library of {spec} (encoding '{name}') in {final}")
            cuda = "ON" if torch.cuda.is_available() else "OFF"
            build(library_dir(tmp, name), cmake_args=[f"-DAPE_ENABLE_CUDA={cuda}"])
            try:
                os.rename(tmp, final)
                tmp = None
            except OSError:
                if not os.path.exists(helper):  # not another process's finished copy
                    raise
        if log:
            log(f"[ape] built in {time.perf_counter() - t0:.1f} s")
        return name, lib, False
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
