"""The instruction-set levels of the emitted libraries (docs/frameworks.md, "Instruction sets"):
each library is built for baseline x86-64, AVX2+FMA and AVX-512 and chooses, once per process,
the best level the CPU runs or the one APE_CPU_LEVEL names. Every check runs in a fresh process
(levels_child.py) with its own environment:
  - unset: the operator library and the C ABI report the best level this CPU runs (read from
    /proc/cpuinfo here) and match the fp64 reference within twice PyTorch's own fp32 error;
  - each level this CPU runs, forced: the same;
  - an unknown name: both report "none", the operator raises the reason, the C ABI returns
    APE_ERROR_CPU_LEVEL with it;
  - with qemu-x86_64 (scripts/install-deps.sh installs qemu-user): on an emulated Haswell (AVX2,
    no AVX-512) the operator chooses avx2 by itself and matches the reference, and the C example
    runs; on an emulated Nehalem (no AVX) the C example runs at the baseline.
The encodings of each check are samples (each check is a fresh process, some emulated): the
numerics of every encoding at every level are ape_kernels_test's CpuLevelsVsReference."""
import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

from support import artifact, artifacts

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = ["baseline", "avx2", "avx512"]


def runnable_levels():
    """The levels this CPU runs, from the kernel's /proc/cpuinfo flags (not from the libraries'
    own detection, which is what is tested)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["baseline"]
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    levels = ["baseline"]
    if {"avx2", "fma"} <= set(flags):
        levels.append("avx2")
        if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
            levels.append("avx512")
    return levels


def child(level, encodings, wrapper=(), timeout=120):
    """levels_child.py in a fresh process with APE_CPU_LEVEL=level (None: unset)."""
    env = dict(os.environ, APE_TEST_ARTIFACTS=artifacts())
    env.pop("APE_CPU_LEVEL", None)
    if level is not None:
        env["APE_CPU_LEVEL"] = level
    run = subprocess.run([*wrapper, sys.executable, os.path.join(HERE, "levels_child.py"), *encodings],
                         cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_errors(result, encoding):
    """fp32 kernel error <= 2 x PyTorch's fp32 error + 1e-6 of the largest value, per output."""
    r = result[encoding]
    assert "error" not in r, r
    names = ["o", "dq", "dk", "dv"] + [f"grad{i}" for i in range(4, len(r["kernel"]))]
    for name, err, err_torch, scale in zip(names, r["kernel"], r["torch"], r["scale"]):
        assert err <= 2 * err_torch + 1e-6 * scale, \
            f"{encoding} {name}: fp32 error {err:.3e} > 2 x PyTorch's {err_torch:.3e} + {1e-6 * scale:.1e}"


def test_best_level_by_default():
    result = child(None, ["rope", "cable"])
    best = runnable_levels()[-1]
    assert result["torch_level"] == best and result["c_level"] == best, result
    assert result["c_forward"][0] == 0, result
    check_errors(result, "rope")
    check_errors(result, "cable")


@pytest.mark.parametrize("level", LEVELS)
def test_forced_level(level):
    if level not in runnable_levels():
        pytest.skip(f"this CPU cannot run {level} (cpu_levels_qemu and test_refused_level cover it)")
    result = child(level, ["rope", "alibi"])
    assert result["torch_level"] == level and result["c_level"] == level, result
    assert result["c_forward"][0] == 0, result
    check_errors(result, "rope")
    check_errors(result, "alibi")


def test_refused_level():
    result = child("avx9", ["rope"])
    assert result["torch_level"] == "none" and result["c_level"] == "none", result
    assert result["rope"]["error"].startswith("APE_CPU_LEVEL=avx9: not a level; use baseline, avx2 or avx512")
    status, message = result["c_forward"]  # the C ABI: a status and the message, no exception
    assert status == 6, result  # APE_ERROR_CPU_LEVEL
    assert message.startswith("ape_rope_forward_f32: APE_CPU_LEVEL=avx9: not a level"), message


QEMU = shutil.which("qemu-x86_64")
needs_qemu = pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64",
                                reason="qemu-x86_64 not installed (scripts/install-deps.sh installs qemu-user)")


@needs_qemu
def test_operator_on_a_cpu_without_avx512():
    # PyTorch and the operator under an emulated Haswell: ~15-25 s, most of it importing torch.
    result = child(None, ["rope"], wrapper=[QEMU, "-cpu", "Haswell"], timeout=600)
    assert result["torch_level"] == "avx2" and result["c_level"] == "avx2", result
    check_errors(result, "rope")


@needs_qemu
@pytest.mark.parametrize("cpu,level", [("Haswell", "avx2"), ("Nehalem", "baseline")])
def test_c_example_on_older_cpus(cpu, level):
    env = dict(os.environ)
    env.pop("APE_CPU_LEVEL", None)
    run = subprocess.run([QEMU, "-cpu", cpu, artifact("examples_c", "rope_example")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[0] == f"kernels: {level}", run.stdout
    assert lines[-1].endswith(": ok"), run.stdout
