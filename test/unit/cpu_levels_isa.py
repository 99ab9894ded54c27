#!/usr/bin/python3
"""Audits the instruction sets inside libape_kernels.a (kernels/include/ape/cpu/dispatch.h).

    cpu_levels_isa.py OBJDUMP LIBRARY        (ctest: cpu_levels_isa)

The library holds, per encoding, NAME_cpu.cpp.o (baseline, with the dispatcher) and the units
NAME_cpu_avx2.cpp.o and NAME_cpu_avx512.cpp.o. The dispatch design promises:
  1. a baseline object holds no AVX instruction at all (VEX or EVEX): it runs on any x86-64 CPU,
     before the CPU is known;
  2. an avx2 object holds no AVX-512 instruction (no zmm, opmask or EVEX-only register);
  3. in an avx2 / avx512 object, every function that uses AVX instructions is either in that
     level's namespace (ape::cpu_avx2::, ape::cpu_avx512::) or local to the object (anonymous
     namespace, compiler clones): no symbol the linker may merge with another object's copy of
     the same name (std::, shared inline code) carries the level's instructions;
  4. each level object does use its level (FMA on ymm for avx2, zmm for avx512): the target
     pragma took effect.
Prints one line per violation (object, kind, function; at most 20) and a verdict; exit status 1 on any.
"""
import re
import subprocess
import sys

AVX = re.compile(r"^v[a-z]|%[yz]mm|%k[0-7]\b")   # a VEX/EVEX mnemonic, or a ymm, zmm, opmask register
AVX512 = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b")
LEVEL_NS = {"avx2": "ape::cpu_avx2::", "avx512": "ape::cpu_avx512::"}


def level_of(obj):
    for level in ("avx512", "avx2"):
        if obj.endswith(f"_cpu_{level}.cpp.o"):
            return level
    return "baseline"


def local(fn):
    # Internal linkage: the anonymous namespace, or a compiler clone / OpenMP outlined body.
    return "(anonymous namespace)" in fn or "[clone ." in fn or "._omp_fn." in fn


def main():
    objdump, library = sys.argv[1], sys.argv[2]
    text = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", library], check=True,
                          capture_output=True, text=True).stdout
    problems, used = [], {}
    obj, fn = None, None
    for line in text.splitlines():
        m = re.match(r"^(\S+\.o):\s+file format", line)
        if m:
            obj, fn = m.group(1), None
            used.setdefault(obj, False)
            continue
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            fn = m.group(1)
            continue
        parts = line.split("\t")
        if obj is None or fn is None or len(parts) < 2:
            continue
        insn = parts[-1].strip()
        if not AVX.search(insn):
            continue
        level = level_of(obj)
        bad = None
        if level == "baseline":
            bad = "AVX instruction in a baseline object"
        elif level == "avx2" and AVX512.search(insn):
            bad = "AVX-512 instruction in an avx2 object"
        elif LEVEL_NS[level] not in fn and not local(fn):
            bad = f"{level} instruction in a function outside {LEVEL_NS[level]}"
        if bad:
            if not problems or not problems[-1].startswith(f"{obj}: {bad}: {fn}: "):
                problems.append(f"{obj}: {bad}: {fn}: {insn}")
        elif level == "avx2" and "vfmadd" in insn and "%ymm" in insn:
            used[obj] = True
        elif level == "avx512" and "%zmm" in insn:
            used[obj] = True
    for o, ok in sorted(used.items()):
        if level_of(o) != "baseline" and not ok:
            problems.append(f"{o}: no {level_of(o)} instruction: the target pragma did not apply")
    counts = {lv: sum(1 for o in used if level_of(o) == lv) for lv in ("baseline", "avx2", "avx512")}
    print(f"objects: {counts['baseline']} baseline, {counts['avx2']} avx2, {counts['avx512']} avx512")
    for p in problems[:20]:
        print(p)
    if not used:
        problems.append("no object found")
    print("FAIL" if problems else "PASS: every AVX / AVX-512 instruction sits in its level's code")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
