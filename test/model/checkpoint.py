"""Reads and writes APE checkpoint files (format version 2: docs/internals.md section 4,
runtime/Checkpoint.h) without APE's code: magic, version, encoding name, config JSON, a table of
named tensors, an FNV-1a 64 checksum of everything before it."""
import json
import struct

import numpy as np

DTYPES = {0: np.float32, 1: np.float64, 2: np.int64, 3: np.uint8}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
MAGIC = b"APECKPT1"


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 with the project's offset basis (docs/internals.md, section 4: not the published
    14695981039346656037)."""
    h = 1469598103934665603
    for x in data:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read(path):
    """(encoding name, config dict, {name: numpy array}) of the checkpoint at `path`."""
    buf = open(path, "rb").read()
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(buf) - 8:
            raise ValueError(f"{path}: truncated")
        chunk = buf[pos:pos + n]
        pos += n
        return chunk

    if take(8) != MAGIC:
        raise ValueError(f"{path}: not a checkpoint")
    (version,) = struct.unpack("<I", take(4))
    if version != 2:
        raise ValueError(f"{path}: format version {version}")
    (n,) = struct.unpack("<I", take(4))
    encoding = take(n).decode()
    (n,) = struct.unpack("<Q", take(8))
    config = json.loads(take(n).decode())
    (count,) = struct.unpack("<Q", take(8))
    tensors = {}
    for _ in range(count):
        (n,) = struct.unpack("<I", take(4))
        name = take(n).decode()
        code, rank = struct.unpack("<BB", take(2))
        dims = struct.unpack(f"<{rank}q", take(8 * rank)) if rank else ()
        dtype = np.dtype(DTYPES[code])
        numel = int(np.prod(dims)) if rank else 1
        tensors[name] = np.frombuffer(take(numel * dtype.itemsize), dtype=dtype).reshape(dims).copy()
    if pos != len(buf) - 8:
        raise ValueError(f"{path}: {len(buf) - 8 - pos} bytes after the tensors")
    (checksum,) = struct.unpack("<Q", buf[-8:])
    if checksum != fnv1a64(buf[:-8]):
        raise ValueError(f"{path}: checksum mismatch")
    return encoding, config, tensors


def write(path, encoding, config, tensors):
    out = bytearray(MAGIC) + struct.pack("<I", 2)
    name = encoding.encode()
    out += struct.pack("<I", len(name)) + name
    text = json.dumps(config).encode()
    out += struct.pack("<Q", len(text)) + text
    out += struct.pack("<Q", len(tensors))
    for key, a in tensors.items():
        a = np.ascontiguousarray(a)
        k = key.encode()
        out += struct.pack("<I", len(k)) + k + struct.pack("<BB", CODES[a.dtype], a.ndim)
        out += struct.pack(f"<{a.ndim}q", *a.shape) + a.tobytes()
    out += struct.pack("<Q", fnv1a64(bytes(out)))
    with open(path, "wb") as f:
        f.write(out)
