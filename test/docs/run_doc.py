"""Runs every command of a documentation page, so that the page cannot drift from the code.

    run_doc.py PAGE.md --build BUILD [--work DIR] [--python PYTHON]

The page's fenced blocks, in order:
  ```mlir    a spec; its first line is a comment naming the file (`// NAME.mlir: ...`): written
             to the work folder under that name;
  ```sh      commands, one per line, run with bash in the work folder (which links `build` to
             BUILD and `python` to the repository's python/, as the repository root has them);
             each must exit 0;
  ```python  a script, run with PYTHON in the work folder;
  ```text    shown, not run.
CI settings (CI_ARGS): the training and evaluation commands get tiny sizes, substituted for the
page's budget (`--minutes N`) or appended, and the page says what the user runs. No command is
skipped. Exit status 0 when every command ran and passed.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What replaces `--minutes N` in an ape-train command: a model and a run small enough for CI.
CI_TRAIN = ["--steps", "3", "--seq-len", "32", "--batch", "2", "--d-model", "32", "--layers", "1", "--heads", "2",
            "--eval-multiples", "1,2", "--eval-tokens", "256"]
# What an ape-eval command gets appended.
CI_EVAL = ["--eval-multiples", "1,2", "--eval-tokens", "256"]


def blocks(page):
    """(kind, text, line) of every fenced block of the page."""
    out, kind, start, lines = [], None, 0, []
    with open(page) as f:
        for n, line in enumerate(f, 1):
            m = re.match(r"^```(\w*)\s*$", line)
            if m and kind is None:
                kind, start, lines = m.group(1) or "text", n, []
            elif line.startswith("```") and kind is not None:
                out.append((kind, "".join(lines), start))
                kind = None
            elif kind is not None:
                lines.append(line)
    if kind is not None:
        sys.exit(f"{page}:{start}: unterminated ``` block")
    return out


def ci_command(argv):
    """The CI form of one command (argv list)."""
    tool = os.path.basename(argv[0])
    if tool == "ape-train":
        if "--minutes" in argv:
            i = argv.index("--minutes")
            argv = argv[:i] + CI_TRAIN + argv[i + 2:]
        else:
            argv = argv + CI_TRAIN
    elif tool == "ape-eval":
        argv = argv + CI_EVAL
    return argv


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page")
    ap.add_argument("--build", required=True, help="the build folder (build/tools/apec, ...)")
    ap.add_argument("--work", help="work folder (default: a fresh temporary one, removed when all passed)")
    ap.add_argument("--python", default=sys.executable, help="the Python of the ```python blocks")
    args = ap.parse_args()
    page = os.path.abspath(args.page)
    work = args.work or tempfile.mkdtemp(prefix="ape-doc-")
    os.makedirs(work, exist_ok=True)
    for name, target in (("build", os.path.abspath(args.build)), ("python", os.path.join(ROOT, "python"))):
        link = os.path.join(work, name)
        if not os.path.lexists(link):
            os.symlink(target, link)
    env = dict(os.environ)
    env.setdefault("APE_CACHE_DIR", os.path.join(os.path.abspath(args.build), "spec-cache"))
    env.setdefault("OMP_NUM_THREADS", "2")
    print(f"[doc] {os.path.relpath(page, ROOT)} in {work} (APE_CACHE_DIR={env['APE_CACHE_DIR']})", flush=True)

    ran, t_all = 0, time.perf_counter()
    for kind, text, line in blocks(page):
        where = f"{os.path.relpath(page, ROOT)}:{line}"
        if kind == "mlir":
            m = re.match(r"^//\s*([\w.-]+\.mlir)\b", text)
            if not m:
                sys.exit(f"{where}: an mlir block must start with `// NAME.mlir: ...` (the file it is)")
            with open(os.path.join(work, m.group(1)), "w") as f:
                f.write(text)
            print(f"[doc] {where}: wrote {m.group(1)}", flush=True)
            continue
        if kind == "sh":
            commands = [(c, ["bash", "-c", c]) for c in
                        (l.split("  #")[0].strip() for l in text.splitlines()) if c and not c.startswith("#")]
        elif kind == "python":
            commands = [("python block", [args.python, "-c", text])]
        else:
            continue
        for shown, argv in commands:
            if kind == "sh":
                words = shlex.split(shown)
                argv = ["bash", "-c", shlex.join(ci_command(words))]
            t0 = time.perf_counter()
            print(f"[doc] {where}: $ {argv[-1] if kind == 'sh' else shown}", flush=True)
            p = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            out = (p.stdout + p.stderr).rstrip()
            tail = "\n".join(out.splitlines()[-15:])
            if p.returncode != 0:
                print(out)
                sys.exit(f"[doc] FAILED ({p.returncode}) {where}: {shown}")
            print(f"{tail}\n[doc]   ok ({time.perf_counter() - t0:.1f} s)", flush=True)
            ran += 1
    print(f"[doc] {ran} commands passed in {time.perf_counter() - t_all:.0f} s")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
