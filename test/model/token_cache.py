"""Reads an APE token cache (tokens_<split>_<vocab>_<key>.bin: runtime/Data.h) and places the
evaluation windows as ape-eval does (runtime/Data.cpp, eval_windows)."""
import struct

import numpy as np


def read(path):
    """The token ids of each book of the cache, in order."""
    b = open(path, "rb").read()
    if b[:8] != b"APETOKS\0":
        raise ValueError(f"{path}: not a token cache")
    _version, _vocab = struct.unpack_from("<II", b, 8)
    _fingerprint, docs, count = struct.unpack_from("<QQQ", b, 16)
    pos, sizes = 40, []
    for _ in range(docs):
        (n,) = struct.unpack_from("<I", b, pos)
        pos += 4 + n
        (length,) = struct.unpack_from("<Q", b, pos)
        pos += 8
        sizes.append(length)
    ids = np.frombuffer(b, dtype="<i4", count=count, offset=pos)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [ids[offsets[i]:offsets[i + 1]] for i in range(docs)]


def eval_windows(books, length, max_len, segments):
    """The (N, length + 1) windows of one evaluation length: `segments` segments of max_len + 1
    tokens (the longest length's), spread over the books in proportion to their size (each book's
    floor share, then one more per book in turn from the first), evenly within a book; each segment
    cut into max_len / length windows."""
    seg = max_len + 1
    capacity = [len(d) // seg for d in books]
    total = sum(len(d) for d in books)
    want = min(segments, sum(capacity))
    n = [min(capacity[i], want * len(books[i]) // max(total, 1)) for i in range(len(books))]
    placed, i = sum(n), 0
    while placed < want:
        if n[i] < capacity[i]:
            n[i] += 1
            placed += 1
        i = (i + 1) % len(books)
    rows = []
    for i, d in enumerate(books):
        for j in range(n[i]):
            start = j * len(d) // n[i]
            for w in range(max_len // length):
                s = start + w * length
                rows.append(np.asarray(d[s:s + length + 1], dtype=np.int64))
    return np.stack(rows)
