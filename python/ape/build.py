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
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BuildError(RuntimeError):
    """apec rejected the spec (its file:line:col diagnostics are the message), or the library
    did not build (the compiler's output is the message)."""


def run(cmd, what="", env=None):
    """Runs cmd; raises BuildError with its output when it fails. Returns its stdout."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise BuildError(f"{what or cmd[0]} failed (exit {p.returncode}):\n{' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def find_apec(apec=None):
    """apec: the argument, else $APE_APEC, else build/tools/apec of this checkout, else PATH's. One
    that is named (the argument, $APE_APEC) must be an executable file: it is not passed over."""
    for named, what in ((apec, "apec="), (os.environ.get("APE_APEC"), "$APE_APEC=")):
        if named:
            if os.path.isfile(named) and os.access(named, os.X_OK):
                return named
            raise BuildError(f"{what}{named} is not an executable file (apec: scripts/build.sh apec builds it)")
    for c in (os.path.join(ROOT, "build", "tools", "apec"), shutil.which("apec")):
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
                       errors="replace", stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        said = f"{p.stdout}{p.stderr}".rstrip()
        raise BuildError(f"apec rejected {spec}:\n{said}" if said else
                         f"{apec} failed on {spec} (exit {p.returncode}) and said nothing")
    if "warning:" in p.stderr:  # the spec compiled with something to say (an unused param, ...)
        warnings.warn(f"apec on {spec}:\n{p.stderr.rstrip()}", stacklevel=4)
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


OWNER = ".owner"  # in a build folder: the file its process holds an flock on while it builds


def _umask():
    """The process's umask, read without setting it (os.umask(0) would leave it 0 for a moment,
    for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _remove_stale(cache):
    """Removes .tmp-<pid>-* folders whose builder is gone (killed mid-build): the flock on its
    OWNER file is free and the folder a minute old (its builder locks right after making it), or
    it has none and is an hour old. The pid alone does not tell: a process in another PID
    namespace (a container sharing the cache) or on another host looks dead."""
    for d in glob.glob(os.path.join(cache, ".tmp-*-*")):
        try:
            pid = int(os.path.basename(d).split("-")[1])
            if pid == os.getpid():
                continue
            os.kill(pid, 0)
            continue  # alive here
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        try:
            age = time.time() - os.path.getmtime(d)
        except OSError:
            continue
        if age < 60:
            continue
        try:
            fd = os.open(os.path.join(d, OWNER), os.O_RDWR)
        except FileNotFoundError:
            if age > 3600:
                shutil.rmtree(d, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its builder lives (elsewhere)
        finally:
            os.close(fd)
        shutil.rmtree(d, ignore_errors=True)


def _library_digest(lib, name):
    """sha256 of the built library's files that loading reads (the .so and the helper), or None
    when one is missing."""
    h = hashlib.sha256()
    build_dir = os.path.join(lib, "build")
    for f in (f"ape_{name}.py", f"libape_{name}_ops.so"):
        path = os.path.join(build_dir, f)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


COMPLETE = "complete.sha256"  # in a cache entry: _library_digest at the end of its build


def _entry_ok(final, name):
    """Whether the cache entry `final` is complete and unchanged since its build (a truncated or
    deleted file makes it a damaged entry, built again: loading a truncated library crashes the
    process)."""
    try:
        with open(os.path.join(final, COMPLETE)) as f:
            want = f.read().strip()
    except OSError:
        return False
    return bool(want) and _library_digest(library_dir(final, name), name) == want


def cached_library(spec, apec=None, cache_dir=None, log=None, cuda_dtypes=None, cuda_head_dims=None, check=None):
    """The built operator library folder of `spec`, from the cache or built now.

    apec runs every time (a fraction of a second; spec errors surface as its file:line:col); the
    library is built when the key is new: a hash of the emitted folder (so the spec, apec and the
    kernel headers it copies), this Python and its torch version, and the C++ compiler ($CXX).
    The folder is built under a temporary name and renamed into place, so no process sees a
    half-built library, and a lock per key makes a second process wait for the first's build. An
    entry is used only if its files still have the digest recorded when it was built (COMPLETE);
    a damaged or incomplete one is built again. A complete entry in a cache this process cannot
    write to is used as it is.
    cuda_dtypes / cuda_head_dims narrow the CUDA variants (apec's --cuda-dtypes, --cuda-head-dims;
    default: all of bf16, f16, f32 x 32, 64, 128), which nvcc compiles where PyTorch sees a GPU.
    check(name, library folder), if given, runs once the name and the folder are known, before any
    build (ape.load's test that the library can be loaded in this process: a refusal costs no build).
    Returns (encoding name, library folder, whether it was cached)."""
    import tempfile

    import torch

    apec = find_apec(apec)
    cache = os.path.join(cache_dir or default_cache_dir(), "torch")
    # The key first, from an emission outside the cache (which may be read-only).
    scratch = tempfile.mkdtemp(prefix="ape-emit-")
    tmp = owner = None
    try:
        extra = ["--source-name", os.path.basename(spec)]
        if cuda_dtypes:
            extra.append("--cuda-dtypes=" + ",".join(cuda_dtypes))
        if cuda_head_dims:
            extra.append("--cuda-head-dims=" + ",".join(str(d) for d in cuda_head_dims))
        name = emit(apec, os.path.abspath(spec), scratch, extra)
        h = hashlib.sha256()
        _folder_hash(library_dir(scratch, name), h)
        cuda = "ON" if torch.cuda.is_available() else "OFF"  # a library built without CUDA has no CUDA kernels
        h.update(f"\0{sys.executable}\0{torch.__version__}\0{os.environ.get('CXX', '')}\0{cuda}".encode())
        final = os.path.join(cache, f"{name[:64]}-{h.hexdigest()[:16]}")  # (a file name: at most 255 bytes)
        lib = library_dir(final, name)
        if check:
            check(name, lib)
        if _entry_ok(final, name):
            return name, lib, True
        try:
            os.makedirs(cache, exist_ok=True)
            lock = open(final + ".lock", "w")
        except OSError as e:
            raise BuildError(f"the cache {cache} holds no built library for {spec} and cannot be written ({e}): "
                             "set APE_CACHE_DIR (or cache_dir=) to a writable folder") from None
        # One build per key at a time: a second process waits here, then finds the library.
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _entry_ok(final, name):
                return name, lib, True
            _remove_stale(cache)
            tmp = os.path.join(cache, f".tmp-{os.getpid()}-{time.monotonic_ns()}")
            os.mkdir(tmp)
            owner = os.open(os.path.join(tmp, OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.copytree(scratch, tmp, dirs_exist_ok=True)
            # The entry as the umask says (mkdtemp's scratch is 0700): a complete cache may be
            # shared read-only with other users.
            mask = _umask()
            for root, dirs, _ in os.walk(tmp):
                for d in [root, *(os.path.join(root, x) for x in dirs)]:
                    os.chmod(d, 0o777 & ~mask)
            t0 = time.perf_counter()
            if log:
                log(f"[ape] building the operator library of {spec} (encoding '{name}') in {final}")
            build(library_dir(tmp, name), cmake_args=[f"-DAPE_ENABLE_CUDA={cuda}"])
            digest = _library_digest(library_dir(tmp, name), name)
            if digest is None:
                raise BuildError(f"the build of {spec} made no libape_{name}_ops.so and ape_{name}.py")
            with open(os.path.join(tmp, COMPLETE), "w") as f:
                f.write(digest + "\n")
            if os.path.exists(final):  # a damaged or incomplete entry (checked above, under the lock)
                shutil.rmtree(final)
            os.unlink(os.path.join(tmp, OWNER))
            os.rename(tmp, final)
            tmp = None
        if log:
            log(f"[ape] built in {time.perf_counter() - t0:.1f} s")
        return name, lib, False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if owner is not None:
            os.close(owner)
