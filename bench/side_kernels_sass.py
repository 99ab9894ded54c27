#!/usr/bin/env python3
"""The side kernels (every kernel but the attention kernels themselves: the q/k mods, delta, the
tables, the conversions) by their compiled code, for what bounds a memory-bound kernel: how many
bytes each thread has in flight, how many threads an SM holds, and how wide its stores are.

A kernel that streams memory runs at the bandwidth only with enough bytes in flight (Little's
law: bytes in flight = bandwidth x latency). Per kernel, from nvcc's SASS (cuobjdump -sass) and
ptxas -v, for one encoding, head dim and architecture:

  regs, blocks/SM   registers per thread, and the blocks of its launch's threads an SM holds
  loops             its loops over rows or slices (outermost loops with global loads and stores;
                    one per shape of work, e.g. the linear mods' paired, interleaved and
                    unrotated runs), none for a kernel without
  loads before the first store
                    the global loads (bytes) issued from the start of each loop (or of the
                    kernel) up to its first store to global, local or shared memory: what one
                    thread has in flight before it waits for them (a store of a loaded value
                    waits; a spill of one to local memory too) (the least-the most over the loops)
  in flight / SM    the most of those bytes times the threads an SM holds (every thread active)
  stores            the loops' global stores by width (16-byte or narrower)

Static counts (both sides of a branch count). The need, at an assumed 0.6 us of loaded memory
latency: H100 SXM 3.35 TB/s x 0.6 us / 132 SMs = 15 KB per SM, H200 4.8 TB/s: 22 KB per SM.

  .venv/bin/python bench/side_kernels_sass.py --apec build/tools/apec --encodings rope t5 \\
      --md bench/results/cuda_side_kernels.md
  (--kernels-include DIR: the kernel headers of another checkout, e.g. a git worktree of an
   earlier commit, for a before/after table)
"""
import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_sass_stats as css  # noqa: E402  (the project's SASS helpers)

ROOT = Path(__file__).resolve().parent.parent
MAIN = re.compile(r"^(flash_|hopper_)?(forward|backward)_kernel$")
# Threads per block of each side kernel's launch (cuda/launch.cuh, cuda/side_kernels.cuh).
THREADS = {"delta_kernel": 128, "token_forward_kernel": 1024, "token_backward_kernel": 1024,
           "mod_backward_params_kernel": 256}  # (mod_params_threads: 256 at head dims 32-256)


def short_name(mangled):
    m = re.match(r"_ZN3ape4cuda(?:\d+simt)?6detail(\d+)", mangled)
    if not m:
        return mangled
    n = int(m.group(1))
    return mangled[m.end():m.end() + n]


def width(op):
    if ".128" in op:
        return 16
    if ".64" in op:
        return 8
    if ".U16" in op or ".S16" in op:
        return 2
    if ".U8" in op or ".S8" in op:
        return 1
    return 4


def loops_of(instrs):
    """The kernel's outermost loops that hold both global loads and stores (no EXIT inside: a
    loop over rows or slices; a kernel may have one per shape of its work), or the whole kernel
    when none does."""
    loops = []
    for addr, body in instrs:
        m = re.match(r"BRA\s+(?:!?U?P\d,\s*)?(0x[0-9a-f]+)", body)
        if not m or int(m.group(1), 16) >= addr:
            continue
        target = int(m.group(1), 16)
        region = [(a, b) for a, b in instrs if target <= a <= addr]
        if any(b.startswith("EXIT") for _, b in region):
            continue
        if any(b.startswith("LDG") for _, b in region) and any(b.startswith("STG") for _, b in region):
            loops.append((target, addr, region))
    outer = [l[2] for l in loops if not any(o is not l and o[0] <= l[0] and l[1] <= o[1] for o in loops)]
    return (outer, True) if outer else ([instrs], False)


def analyse(instrs):
    regions, looped = loops_of(instrs)
    befores, stores = [], {}
    for region in regions:
        before = 0
        for _, b in region:
            if b.startswith(("STG", "STL", "STS")):  # a store waits for its data (a loaded value's)
                break
            if b.startswith("LDG"):
                before += width(b.split()[0])
        befores.append(before)
        for _, b in region:
            if b.startswith("STG"):
                w = width(b.split()[0])
                stores[w] = stores.get(w, 0) + 1
    return dict(before_min=min(befores), before=max(befores), looped=len(regions) if looped else 0, stores=stores)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--apec", default=str(ROOT / "build/tools/apec"))
    ap.add_argument("--encodings", nargs="+", default=["rope", "xpos", "t5", "cable"])
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--arch", nargs="+", default=["90a", "80"])
    ap.add_argument("--kernels-include", default=str(ROOT / "kernels/include"))
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--venv", default=str(ROOT / ".venv"))
    ap.add_argument("--md", help="write the table here (markdown)")
    args = ap.parse_args()
    cuobjdump = css.find_cuobjdump(args.venv)
    css.ensure_nvdisasm(args.venv, cuobjdump)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for enc in args.encodings:
            gen = Path(work) / enc
            subprocess.run([args.apec, str(ROOT / f"examples/encodings/{enc}.mlir"), "-o", str(gen), "--emit=cuda",
                            "--cuda-dtypes=bf16", f"--cuda-head-dims={args.hd}"], check=True,
                           stdout=subprocess.DEVNULL)
            src = gen / f"{enc}_cuda_bf16_hd{args.hd}.cu"
            for arch in args.arch:
                cubin = Path(work) / f"{enc}_{arch}.cubin"
                r = subprocess.run([args.nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-arch=sm_{arch}", "-cubin",
                                    "-Xptxas", "-v", "-I", args.kernels_include, "-I", str(gen), str(src), "-o",
                                    str(cubin)] + (["-DAPE_CUDA_SM90A"] if arch == "90a" else []),
                                   capture_output=True, text=True)
                if r.returncode:
                    sys.exit(r.stderr)
                info = css.ptxas_info(r.stderr + r.stdout)
                sass = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True,
                                      text=True).stdout
                sm = int(arch.rstrip("a"))
                for fn, instrs in sorted(css.sass_functions(sass).items(), key=lambda kv: short_name(kv[0])):
                    name = short_name(fn)
                    if MAIN.match(name) or not any(b.startswith(("LDG", "STG")) for _, b in instrs):
                        continue
                    side = "<q>" if "Lb1E" in fn else "<k>" if "Lb0E" in fn else ""
                    regs = info.get(fn, {}).get("regs", 0)
                    threads = THREADS.get(name, 256)
                    blocks, _, limit = css.occupancy(sm, threads, regs, 0)
                    a = analyse(instrs)
                    rows.append(dict(enc=enc, arch=f"sm_{arch}", kernel=name + side, regs=regs, blocks=blocks,
                                     threads=threads, **a, per_sm=a["before"] * threads * blocks))
    head = ("| encoding | arch | kernel | regs | blocks/SM (threads) | loops | loads before the first store (B/thread) "
            "| in flight / SM (KB, the most) | stores in the loops (16-byte / narrower) |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines = []
    seen = set()
    for r in rows:
        key = (r["enc"], r["arch"], r["kernel"])
        if key in seen:
            continue
        seen.add(key)
        narrow = sum(n for w, n in r["stores"].items() if w < 16)
        before = str(r["before"]) if r["before_min"] == r["before"] else f"{r['before_min']}-{r['before']}"
        lines.append(f"| {r['enc']} | {r['arch']} | {r['kernel']} | {r['regs']} | {r['blocks']} ({r['threads']}) | "
                     f"{r['looped'] or 'none'} | {before} | {r['per_sm'] / 1024:.1f} | "
                     f"{r['stores'].get(16, 0)} / {narrow} |")
    table = head + "\n".join(lines) + "\n"
    print(table)
    if args.md:
        Path(args.md).write_text(
            "# The side kernels by their compiled code\n\nCommand: `" + " ".join(["bench/side_kernels_sass.py"] + sys.argv[1:])
            + "`; bf16, head dim " + str(args.hd) + " (bench/side_kernels_sass.py says what each column counts).\n\n"
            + table)


if __name__ == "__main__":
    main()
