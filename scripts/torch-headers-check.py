#!/usr/bin/env python3
"""Compiles (syntax only) every LibTorch-using source of the project against another PyTorch
version's headers: the one a GPU machine has (`scripts/gpu-check.sh` builds there against that
machine's own PyTorch, 2.11 when last seen, where this machine's venv may hold a newer one; a
header that one version declares and the other does not costs a device call: docs/cuda.md,
"Checking on a GPU").

    .venv/bin/python scripts/torch-headers-check.py [--torch 2.11.0] [--build build]

Downloads that version's wheel for this interpreter from PyPI once (0.5-1 GB; its headers are kept in
--cache), unpacks its headers, and runs every compile command of BUILD/compile_commands.json that
includes LibTorch with those headers and -fsyntax-only, then the operator library's sources as
`apec --emit=torch-library` writes them (CUDA on: ape/torch_ops.cpp, NAME_ops.cpp). Exit status:
0 when every source compiles, 1 when one fails, 2 when the check could not run (no build, no
download, no LibTorch compile command in the build). Nothing is linked: the check is the headers'
API, which is what broke before."""
import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_error(message):
    print(f"torch-headers-check: {message}", file=sys.stderr)
    sys.exit(2)


def torch_headers(version, cache):
    """The include folder of torch==version's wheel, downloaded and unpacked into cache once (into
    a temporary folder first: an interrupted unpack leaves nothing the next run would take)."""
    dest = cache / version
    include = dest / "torch" / "include"
    if include.is_dir():
        return include
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", f"torch=={version}", "--no-deps",
                            "--only-binary=:all:", "-d", tmp])
        wheels = list(Path(tmp).glob("torch-*.whl"))
        if r.returncode or len(wheels) != 1:
            setup_error(f"could not download torch=={version}'s wheel for this Python from PyPI")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(unpacked, [n for n in z.namelist() if n.startswith("torch/include/")])
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(unpacked, dest)  # the headers are all this check keeps
    return include


def torch_include_of(argv):
    """The LibTorch include folder a compile command names (-isystem/-I .../torch/include), or None."""
    for n, a in enumerate(argv):
        path = argv[n + 1] if a in ("-isystem", "-I") and n + 1 < len(argv) else \
            a[2:] if a.startswith("-I") else None
        if path and path.rstrip("/").endswith("torch/include"):
            return path.rstrip("/")
    return None


def commands(build, include):
    """(label, argv, cwd) of each LibTorch compile command, with `include` for LibTorch's."""
    for c in json.loads((build / "compile_commands.json").read_text()):
        argv = c["arguments"] if "arguments" in c else shlex.split(c["command"])
        ours = torch_include_of(argv)
        if ours is None:
            continue
        out, skip = [], False
        for a in argv:
            if skip:
                skip = False
            elif a == "-o":
                skip = True
            else:  # the prefix in an argument of its own or after -I / -isystem=
                out.append(str(include) + a[len(ours):] if a.startswith(ours) else
                           a[:2] + str(include) + a[2 + len(ours):] if a.startswith("-I" + ours) else a)
        yield os.path.relpath(c["file"], ROOT), out + ["-fsyntax-only"], c["directory"]


def library_commands(apec, include, out):
    """The operator library's two sources as emitted, compiled as its CMakeLists.txt does."""
    spec = ROOT / "examples" / "encodings" / "alibi.mlir"  # params and CUDA kernels
    subprocess.run([str(apec), str(spec), "-o", str(out), "--emit=torch-library"], check=True,
                   stdout=subprocess.DEVNULL)
    lib = out / "alibi_torch_library"
    base = ["c++", "-std=c++17", "-fsyntax-only", "-I", str(lib), "-isystem", str(include),
            "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
            "-isystem", "/usr/local/cuda/include"]
    yield "emitted ape/torch_ops.cpp", base + ["-DAPE_TORCH_OPS_CUDA", str(lib / "ape" / "torch_ops.cpp")], str(lib)
    yield "emitted alibi_ops.cpp", base + ["-DAPE_TORCH_OPS_CUDA_KERNELS", str(lib / "alibi_ops.cpp")], str(lib)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", default="2.11.0", help="the PyTorch version whose headers to use")
    ap.add_argument("--build", type=Path, default=ROOT / "build", help="a configured build folder")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "ape" / "torch-headers")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not (args.build / "compile_commands.json").is_file():
        setup_error(f"no {args.build}/compile_commands.json: run scripts/build.sh first")
    apec = args.build / "tools" / "apec"
    if not os.access(apec, os.X_OK):
        setup_error(f"no {apec}: run scripts/build.sh first")
    include = torch_headers(args.torch, args.cache)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = list(commands(args.build, include))
        if not jobs:
            setup_error(f"no compile command of {args.build} includes LibTorch (torch/include)")
        try:
            jobs += list(library_commands(apec, include, Path(tmp)))
        except subprocess.CalledProcessError as e:
            setup_error(f"apec failed: {e}")

        def run(job):
            label, argv, cwd = job
            r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
            return label, r.returncode, r.stderr

        failed = 0
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
            for label, rc, err in ex.map(run, jobs):
                print(("ok    " if rc == 0 else "FAIL  ") + label, flush=True)
                if rc:
                    failed += 1
                    print(err[-4000:], file=sys.stderr)
    print(f"torch-headers-check: torch {args.torch}: {len(jobs) - failed} of {len(jobs)} sources compile"
          + ("" if failed == 0 else f", {failed} fail"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
