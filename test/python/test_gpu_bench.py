"""bench/gpu_bench.py's plumbing (--selftest-cpu: APE's operator library on CPU tensors, tiny shapes;
the numbers mean nothing): the per-encoding process, the report, --kernel-times' table, and a
process that dies (APE_BENCH_TEST_CRASH) costing only its unfinished cells."""
import os
import subprocess
import sys

from support import ROOT, artifact

BENCH = os.path.join(ROOT, "bench", "gpu_bench.py")


def bench(tmp_path, *extra, env=None):
    libs = tmp_path / "libs"
    (libs / "rope_torch_library").mkdir(parents=True, exist_ok=True)
    build = libs / "rope_torch_library" / "build"
    if not build.exists():
        build.symlink_to(os.path.dirname(artifact("rope_torch_library", "ape_rope.py")))
    md = tmp_path / "out.md"
    p = subprocess.run([sys.executable, BENCH, "--selftest-cpu", "--libs", str(libs), "--encodings", "rope",
                        "--methods", "ape", "--configs", "1x2x64x32", "--md", str(md), *extra],
                       capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    return p.returncode, md.read_text() if md.exists() else "", p.stdout + p.stderr


def test_kernel_times(tmp_path):
    rc, md, out = bench(tmp_path, "--kernel-times")
    assert rc == 0, out
    assert "## Kernels per call (--kernel-times)" in md, md
    rows = [line for line in md.splitlines() if line.startswith("| rope / ape / B1 H2 T64 D32 / ")]
    for phase in ("fwd", "bwd"):
        mine = [r for r in rows if f"/ {phase} |" in r]
        assert any("`attention`" in r or "AttentionAutograd" in r for r in mine), rows
        assert any("**all**" in r and "the timed" in r for r in mine), rows


def test_a_crashed_process_costs_its_cells(tmp_path):
    rc, md, out = bench(tmp_path, env={"APE_BENCH_TEST_CRASH": "rope:exit"})
    assert rc == 3, out
    assert "crashed: exit status 7 in ape at B1 H2 T64 D32" in md, md


def test_a_hung_process_is_killed_and_named(tmp_path):
    """A kernel that never ends (APE_BENCH_TEST_CRASH ...:hang): the watchdog kills the process after
    --cell-timeout seconds without a new phase, and the cell says so."""
    rc, md, out = bench(tmp_path, "--cell-timeout", "3", env={"APE_BENCH_TEST_CRASH": "rope:hang"})
    assert rc == 3, out
    assert "crashed: hung (no progress in 3 s; killed) in ape at B1 H2 T64 D32" in md, md


def test_grouped_queries(tmp_path):
    """--kv-heads: k and v of fewer heads reach the methods (APE's operator and SDPA with
    enable_gqa, spot-checked against each other), and the report says so."""
    rc, md, out = bench(tmp_path, "--kv-heads", "1", "--methods", "ape,sdpa-flash")
    assert rc == 0, out
    assert "Key/value heads" in md and "1 (grouped-query attention" in md, md
    assert "MISMATCH" not in md.split("## TFLOP/s")[-1], md
