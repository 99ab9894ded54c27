#!/usr/bin/env python3
"""The kernel layer's floors (docs/internals.md, section 5): kernels/include/ape/ holds one folder
per audience, and a header includes only headers of its own floor or of a floor below, by the
full path ("ape/cpu/attention.h"), which is also how the library emitters find the headers an
emitted folder copies. Fails (exit 1) on a header outside the folders, an include that climbs a
floor, an include of a header that does not exist, or a relative include.

usage: kernel_layers_test.py KERNELS_INCLUDE_DIR
"""
import pathlib
import re
import sys

# floor of each folder; simt/ is the emulator's surface, reached from cuda/ under APE_SIMT only
FLOORS = {"contract": 0, "cpu": 1, "cuda": 1, "simt": 1, "torch": 2, "c": 2}
# folders of one floor that may include each other (the CUDA layer builds on its emulator)
SIDEWAYS = {("cuda", "simt")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(rel):
    parts = rel.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "ape" else None


def main():
    root = pathlib.Path(sys.argv[1])
    errors = []
    headers = sorted(p for p in (root / "ape").rglob("*") if p.is_file())
    if not headers:
        errors.append(f"no headers under {root / 'ape'}")
    for path in headers:
        rel = path.relative_to(root).as_posix()
        mine = folder_of(rel)
        if mine not in FLOORS:
            errors.append(f"{rel}: not in one of the folders {sorted(FLOORS)}")
            continue
        for name in INCLUDE.findall(path.read_text()):
            target = folder_of(name)
            if target is None:
                errors.append(f'{rel}: #include "{name}": include kernel headers by their full '
                              'path, "ape/<folder>/<file>"')
            elif not (root / name).is_file():
                errors.append(f'{rel}: #include "{name}": no such header')
            elif target not in FLOORS:
                errors.append(f'{rel}: #include "{name}": not a folder of the kernel layer')
            elif FLOORS[target] > FLOORS[mine] or (
                    FLOORS[target] == FLOORS[mine] and target != mine
                    and (mine, target) not in SIDEWAYS):
                errors.append(f'{rel} (floor {FLOORS[mine]}, {mine}/) includes "{name}" '
                              f'(floor {FLOORS[target]}, {target}/): a header may include its own '
                              'folder and the floors below only')
    for e in errors:
        print("kernel_layers_test:", e, file=sys.stderr)
    print(f"kernel_layers_test: {len(headers)} headers, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
