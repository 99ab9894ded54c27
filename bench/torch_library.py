"""What the Python benchmarks share: emitting and building an encoding's PyTorch operator library
exactly as docs/frameworks.md says, loading its generated helper, and running measurement
children that print a `RESULT key=value ...` line.

    apec examples/encodings/ENC.mlir -o WORK --emit=torch-library
    cmake -S WORK/ENC_torch_library -B WORK/ENC_torch_library/build -DAPE_PYTHON=<this python>
    cmake --build WORK/ENC_torch_library/build        -> libape_ENC_ops.so, ape_ENC.py
"""
import importlib.util
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None, what=""):
    """Runs cmd; exits with its output when it fails. Returns its stdout."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what or cmd[0]} failed ({p.returncode}):\n{' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def result(out):
    """The key=value pairs of the last RESULT line of out (exits if there is none)."""
    line = next((l for l in reversed(out.splitlines()) if l.startswith("RESULT")), None)
    if line is None:
        sys.exit(f"no RESULT line in:\n{out}")
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def library_dir(work, enc):
    return os.path.join(work, f"{enc}_torch_library")


def build_library(apec, work, enc):
    """Emits and builds the operator library of examples/encodings/ENC.mlir under work, for the
    PyTorch of this Python. Returns (library folder, configure seconds, build seconds)."""
    spec = os.path.join(ROOT, "examples", "encodings", f"{enc}.mlir")
    lib = library_dir(work, enc)
    run([apec, spec, "-o", work, "--emit=torch-library"], what="apec")
    t0 = time.perf_counter()
    run(["cmake", "-S", lib, "-B", os.path.join(lib, "build"), f"-DAPE_PYTHON={sys.executable}"],
        what="cmake configure")
    t1 = time.perf_counter()
    run(["cmake", "--build", os.path.join(lib, "build")], what="cmake --build")
    t2 = time.perf_counter()
    return lib, t1 - t0, t2 - t1


def load_helper(lib, enc, load=True):
    """The generated module ape_ENC of a built library folder (its operators loaded if load)."""
    path = os.path.join(lib, "build", f"ape_{enc}.py")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: build the library first (drop --skip-build)")
    spec = importlib.util.spec_from_file_location(f"ape_{enc}", path)
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    if load:
        h.load()
    return h


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
