#!/usr/bin/env python3
"""A pitfall of nvcc 13.0 kept out of the kernel headers: inside a generic lambda, when an
`if constexpr (...)` whose body is a `#pragma unroll` loop without braces is discarded, the
front end drops the statement after it as well (a `wgmma.wait_group` vanished from the flash
backward that way; docs/cuda.md, "The wgmma backward"). The host compiler, and so the emulator,
keeps it. Fails (exit 1) on any `if constexpr` line that ends without a brace or a statement
and whose next line is a `#pragma`; checks first that it finds a planted one.

usage: cuda_pragma_test.py KERNELS_INCLUDE_DIR
"""
import pathlib
import re
import sys

IF_CONSTEXPR = re.compile(r"^\s*(\}\s*else\s+)?if\s+constexpr\b")


def findings(text):
    lines = text.split("\n")
    out = []
    for i in range(len(lines) - 1):
        code = re.sub(r"//.*$", "", lines[i]).rstrip()
        if IF_CONSTEXPR.match(code) and not code.endswith(("{", ";")) and lines[i + 1].strip().startswith("#pragma"):
            out.append(i + 1)
    return out


def main():
    planted = "  if constexpr (kA)  // a comment\n    #pragma unroll\n    for (int i = 0; i < 4; ++i) f(i);\n  g();\n"
    if findings(planted) != [1]:
        print("cuda_pragma_test: the planted case was not found")
        return 1
    braced = "  if constexpr (kA) {  // braced\n    #pragma unroll\n    for (int i = 0; i < 4; ++i) f(i);\n  }\n"
    if findings(braced):
        print("cuda_pragma_test: a braced body was flagged")
        return 1
    root = pathlib.Path(sys.argv[1])
    bad = []
    for path in sorted((root / "ape").rglob("*")):
        if path.suffix in (".cuh", ".h") and path.is_file():
            for line in findings(path.read_text()):
                bad.append(f"{path.relative_to(root)}:{line}: brace the body of this if constexpr "
                           "(its #pragma loop would take the next statement with it under nvcc)")
    print("\n".join(bad) if bad else "cuda_pragma_test: no unbraced if constexpr before a #pragma")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
