"""What the Python benchmarks share: emitting and building an encoding's PyTorch operator library
(build_library and library_dir, from the repository's `ape` package: python/ape/build.py),
loading its generated helper, and running measurement children that print a
`RESULT key=value ...` line.
"""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from ape.build import build_library, library_dir  # noqa: E402,F401  (the benchmarks' API)


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
