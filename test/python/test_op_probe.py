"""bench/op_probe.py (what scripts/gpu-check.sh runs for an encoding whose benchmark process
crashed): it runs each step of an operator call in a process of its own and names the one that
failed. ALiBi (a param) through its CPU step here, a CUDA step where PyTorch sees a GPU; a helper
whose load kills its process with SIGSEGV is reported as that signal, with its native stack, a
failing one by its message."""
import os
import subprocess
import sys

import torch

from support import ROOT, artifact

PROBE = os.path.join(ROOT, "bench", "op_probe.py")


def probe(helper_path, steps):
    p = subprocess.run([sys.executable, PROBE, "--helper", helper_path, "--steps", steps],
                       capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout.strip().splitlines()


def test_alibi_steps_pass():
    steps = "cpu,raw" if torch.cuda.is_available() else "cpu"
    rc, lines = probe(artifact("alibi_torch_library", "ape_alibi.py"), steps)
    assert rc == 0 and lines[0] == "cpu: ok", lines
    if torch.cuda.is_available():
        assert lines[1] == "raw: ok", lines


def test_a_crash_and_an_error_are_named(tmp_path):
    crash = tmp_path / "ape_crash.py"
    crash.write_text("import os, signal\nFEATURES = PARAMS = []\n"
                     "def load():\n    os.kill(os.getpid(), signal.SIGSEGV)\n")
    rc, lines = probe(str(crash), "cpu")
    assert rc == 1 and lines[0] == "cpu: killed by signal 11 (SIGSEGV)", lines
    # Its native stack, from the preloaded handler (this machine has a C compiler): the frames
    # down to the kill, named by addr2line.
    assert lines[1] == "--- cpu: native stack (preloaded handler):", lines
    assert any("libc.so" in line for line in lines[2:]), lines
    error = tmp_path / "ape_error.py"
    error.write_text("FEATURES = PARAMS = []\ndef load():\n    raise RuntimeError('no library here')\n")
    rc, lines = probe(str(error), "cpu")
    assert rc == 1 and lines[0].startswith("cpu: exit 1: RuntimeError: no library here"), lines
