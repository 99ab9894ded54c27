#!/usr/bin/env python3
"""Compares two APE checkpoints (runtime/Checkpoint.h, format version 2) bit for bit.

    compare_checkpoints.py A.ckpt B.ckpt
    compare_checkpoints.py --first-loss-difference A.ckpt B.ckpt
    compare_checkpoints.py --step A.ckpt
    compare_checkpoints.py --digests STEP REF.log RUN1.log RUN2.log ...
    compare_checkpoints.py --first-digest-difference REF.log RUN1.log RUN2.log ...

Reads the format independently of the runtime. Equal means: the same encoding, the same config
except the wall-clock fields (state.elapsed_seconds, result.seconds, result.tokens_per_second,
state.threads is compared), and every tensor (model, AdamW moments and steps, random state) with the
same name, dtype, shape and bytes. Exit status 0 when equal; otherwise 1 with the differences.
--first-loss-difference prints the first step (1-based) whose recorded loss differs between the two
(0: none); --step prints a checkpoint's step. --digests compares the `[digest]` lines
(APE_TEST_STEP_DIGEST=1, runtime/Train.cpp) of steps STEP - 1 and STEP of an uninterrupted run's log
with those of a run in rounds (its logs in round order; a step's line is the last round's that ran
it), and names the tensors that differ: the batch, a gradient, or only a parameter after the update;
--first-digest-difference prints the first step whose digest line differs (0: none), which can come
before the first differing loss (a parameter that differs in the last bits can leave the next losses
equal).
"""
import json
import struct
import sys

MAGIC = b"APECKPT1"
DTYPES = {0: ("f32", 4), 1: ("f64", 8), 2: ("i64", 8), 3: ("u8", 1)}
CLOCK_FIELDS = {("state", "elapsed_seconds"), ("result", "seconds"), ("result", "tokens_per_second")}


def fnv1a(data):
    h = 1469598103934665603
    for b in data:
        h ^= b
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def read(path):
    data = open(path, "rb").read()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not an APE checkpoint")
    pos = 8

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return vals

    (version,) = take("I")
    if version != 2:
        raise ValueError(f"{path}: format version {version}, expected 2")
    (n,) = take("I")
    encoding = data[pos:pos + n].decode()
    pos += n
    (n,) = take("Q")
    config = json.loads(data[pos:pos + n])
    pos += n
    (count,) = take("Q")
    tensors = {}
    for _ in range(count):
        (n,) = take("I")
        name = data[pos:pos + n].decode()
        pos += n
        code, ndim = take("BB")
        shape = take("q" * ndim)
        dtype, size = DTYPES[code]
        numel = 1
        for s in shape:
            numel *= s
        tensors[name] = (dtype, shape, data[pos:pos + numel * size])
        pos += numel * size
    (checksum,) = take("Q")
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes")
    if checksum != fnv1a(data[:pos - 8]):
        raise ValueError(f"{path}: checksum mismatch")
    for section, key in CLOCK_FIELDS:
        config.get(section, {}).pop(key, None)
    return encoding, config, tensors


def digests(path):
    """{step: {field: hash}} of a log's [digest] lines."""
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith("[digest] step "):
                continue
            words = line.split()
            fields = dict(zip(words[3::2], words[4::2]))
            out[int(words[2])] = fields
    return out


def run_digests(run_logs):
    """{step: fields} of a run in rounds: a step's line is the last round's that ran it."""
    run = {}
    for log in run_logs:
        run.update(digests(log))
    return run


def first_digest_difference(ref_log, run_logs):
    ref, run = digests(ref_log), run_digests(run_logs)
    return next((s for s in sorted(run) if s in ref and ref[s] != run[s]), 0)


def compare_digests(step, ref_log, run_logs):
    ref, run = digests(ref_log), run_digests(run_logs)
    for s in (step - 1, step):
        if s not in ref or s not in run:
            print(f"step {s}: no digest in {'the uninterrupted run' if s not in ref else 'the resumed run'}")
            continue
        diff = [k for k in ref[s] if ref[s][k] != run[s].get(k)]
        print(f"step {s}: " + ("the same batch, gradients and parameters" if not diff else
                               "differs in " + " ".join(diff)))


def main():
    if sys.argv[1] == "--digests":
        compare_digests(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
        return 0
    if sys.argv[1] == "--first-digest-difference":
        print(first_digest_difference(sys.argv[2], sys.argv[3:]))
        return 0
    if sys.argv[1] == "--step":
        print(read(sys.argv[2])[1]["state"]["step"])
        return 0
    if sys.argv[1] == "--first-loss-difference":
        la, lb = (read(path)[1]["state"]["losses"] for path in sys.argv[2:4])
        first = next((i + 1 for i, (x, y) in enumerate(zip(la, lb)) if x != y), 0)
        if not first and len(la) != len(lb):
            first = min(len(la), len(lb)) + 1
        print(first)
        return 0
    a, b = read(sys.argv[1]), read(sys.argv[2])
    problems = []
    if a[0] != b[0]:
        problems.append(f"encoding {a[0]} != {b[0]}")
    for key in sorted(set(a[1]) | set(b[1])):
        if a[1].get(key) != b[1].get(key):
            problems.append(f"config[{key!r}] differs:\n  {a[1].get(key)}\n  {b[1].get(key)}")
    for name in sorted(set(a[2]) | set(b[2])):
        if name not in a[2] or name not in b[2]:
            problems.append(f"tensor {name} is in one file only")
        elif a[2][name] != b[2][name]:
            problems.append(f"tensor {name} differs ({a[2][name][0]} {a[2][name][1]})")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"identical: {a[0]}, {len(a[2])} tensors, step {a[1].get('state', {}).get('step')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
