#!/usr/bin/env python3
"""Compiles (syntax only) every LibTorch-using source of the project against another PyTorch
version's headers: the one a GPU machine has (`scripts/gpu-check.sh` builds there against that
machine's own PyTorch, 2.11 when last seen, where this machine's venv may hold a newer one; a
header that one version declares and the other does not costs a device call: docs/cuda.md,
"Checking on a GPU").

    .venv/bin/python scripts/torch-headers-check.py [--torch 2.11.0] [--build build]

Downloads that version's wheel for this interpreter from PyPI once (about 0.5-1 GB, kept in
--cache), unpacks its headers, and runs every compile command of BUILD/compile_commands.json that
includes LibTorch with those headers and -fsyntax-only, then the operator library's sources as
`apec --emit=torch-library` writes them (CUDA on: ape/torch_ops.cpp, NAME_ops.cpp). Exit status 1
when any fails. Nothing is linked: the check is the headers' API, which is what broke before."""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def torch_headers(version, cache):
    """The include folder of torch==version's wheel, downloaded and unpacked into cache once."""
    dest = cache / version
    include = dest / "torch" / "include"
    if include.is_dir():
        return include
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", f"torch=={version}", "--no-deps",
                    "--only-binary=:all:", "-d", str(dest)], check=True)
    wheel = next(dest.glob(f"torch-{version}*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, [n for n in z.namelist() if n.startswith("torch/include/")])
    wheel.unlink()  # the headers are all this check reads
    return include


def commands(build, include):
    """(label, argv, cwd) of each LibTorch compile command, with `include` for LibTorch's."""
    import torch  # this venv's: its include folder is the one to replace
    ours = str(Path(torch.__file__).resolve().parent / "include")
    for c in json.loads((build / "compile_commands.json").read_text()):
        if ours not in c["command"]:
            continue
        argv, skip = [], False
        for a in shlex.split(c["command"].replace(ours, str(include))):
            if skip:
                skip = False
            elif a == "-o":
                skip = True
            else:
                argv.append(a)
        yield os.path.relpath(c["file"], ROOT), argv + ["-fsyntax-only"], c["directory"]


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
        sys.exit(f"torch-headers-check: no {args.build}/compile_commands.json: run scripts/build.sh first")
    include = torch_headers(args.torch, args.cache)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = list(commands(args.build, include))
        jobs += list(library_commands(args.build / "tools" / "apec", include, Path(tmp)))

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
