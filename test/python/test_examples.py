"""The examples of docs/frameworks.md run and reach their verdict: examples/c/rope_example (the C
ABI from C) and examples/python/cable_in_pytorch.py (the operator in a plain PyTorch model,
trained, checked against materialised attention) on the libraries run.sh built."""
import os
import subprocess
import sys

from support import artifact

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_c_example():
    run = subprocess.run([artifact("examples_c", "rope_example")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1].endswith(": ok"), run.stdout


def test_python_example():
    script = os.path.join(ROOT, "examples", "python", "cable_in_pytorch.py")
    run = subprocess.run([sys.executable, script, "--library-dir", artifact("cable_torch_library"), "--steps", "20"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1].endswith(": ok"), run.stdout
