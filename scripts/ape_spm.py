#!/usr/bin/env python3
"""The SentencePiece helper of the runtime (runtime/SentencePieceTool.cpp, `ape-spm`) in Python,
for machines where the tools are built without SentencePiece's C++ library (the GPU check's
standalone build: scripts/gpu-check.sh points APE_SPM_TOOL here). It encodes and decodes with an
existing tokenizer model; training one needs the C++ helper.

    ape_spm.py encode MODEL OUT BOOK...   the books' ids (OUT: APESPMI1, pieces, eos, books, ids)
    ape_spm.py decode MODEL IDS OUT       one id per line in IDS; text in OUT

The same bytes as ape-spm: a book is split into paragraphs at blank lines (lines of spaces and
tabs only; a trailing CR dropped), a paragraph's lines joined by one space, each paragraph encoded
and followed by the end-of-sentence id (the unknown id where the model has none); decoding writes
two newlines for each end-of-sentence id. test/gpu_check/ape_spm_test.sh compares the two.
Needs the `sentencepiece` Python package.
"""
import struct
import sys


def paragraphs(text):
    """The paragraphs of `text` (bytes), as runtime/SentencePieceTool.cpp splits them."""
    out, cur = [], b""
    for line in text.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip(b" \t"):
            if cur:
                out.append(cur)
            cur = b""
        else:
            cur = cur + b" " + line if cur else line
    if cur:
        out.append(cur)
    return out


def load(model):
    try:
        import sentencepiece
    except ImportError:
        sys.exit("ape_spm.py: needs the sentencepiece Python package (pip install sentencepiece)")
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(model)
    except Exception as exc:  # noqa: BLE001 (its own message says why)
        sys.exit(f"ape-spm: cannot load tokenizer {model}: {exc}")
    eos = sp.eos_id() if sp.eos_id() >= 0 else sp.unk_id()
    return sp, eos


def encode(model, out, books):
    sp, eos = load(model)
    encoded = []
    for book in books:
        try:
            with open(book, "rb") as f:
                text = f.read()
        except OSError:
            sys.exit(f"ape-spm: cannot read {book}")
        ids = []
        for p in paragraphs(text):
            ids += sp.EncodeAsIds(p.decode("utf-8", errors="replace"))
            ids.append(eos)
        encoded.append(ids)
    with open(out, "wb") as f:
        f.write(b"APESPMI1" + struct.pack("<iiQ", sp.GetPieceSize(), eos, len(encoded)))
        for ids in encoded:
            f.write(struct.pack("<Q", len(ids)) + struct.pack(f"<{len(ids)}i", *ids))
    return 0


def decode(model, ids_path, out):
    sp, eos = load(model)
    try:
        with open(ids_path) as f:
            ids = [int(tok) for tok in f.read().split()]
    except (OSError, ValueError) as exc:
        sys.exit(f"ape-spm: cannot read {ids_path}: {exc}")
    text, run = [], []
    for i in ids:
        if i < 0 or i >= sp.GetPieceSize():
            sys.exit(f"ape-spm: id {i} is outside the vocabulary [0, {sp.GetPieceSize()})")
        if i == eos:
            text.append(sp.DecodeIds(run))
            text.append("\n\n")
            run = []
        else:
            run.append(i)
    text.append(sp.DecodeIds(run))
    with open(out, "wb") as f:
        f.write("".join(text).encode("utf-8"))
    return 0


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "encode" and len(argv) >= 5:
        return encode(argv[2], argv[3], argv[4:])
    if cmd == "decode" and len(argv) == 5:
        return decode(argv[2], argv[3], argv[4])
    print("usage: ape_spm.py encode MODEL OUT BOOK... | ape_spm.py decode MODEL IDS OUT\n"
          "(the runtime's SentencePiece helper without its training; see runtime/Tokenizer.h)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
