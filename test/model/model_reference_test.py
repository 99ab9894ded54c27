"""The runtime's whole model against an independent float64 reference (reference.py): for each
encoding, a tiny model trained by ape-train, then a copy of it with large random weights (so that
every part of the model, the encoding's included, moves the loss by far more than float32 rounding)
scored by ape-eval; the reference, reading the same checkpoints and placing the same windows, must
give every segment's loss to 1e-6 relative (float32 against float64: about 1e-7 measured). Then
the reference with one planted error per part must miss by more than that: the test can fail.

usage: model_reference_test.py APE_TRAIN APE_EVAL CACHE_DIR WORK_DIR [ENCODING ...]"""
import csv
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
import token_cache  # noqa: E402
from reference import KV_MUTATIONS, MUTATIONS, Reference  # noqa: E402

# NAME@kvN: the encoding with 4 heads reading N key/value heads (--kv-heads: grouped-query
# attention; ExPE's params then derived from a grouped W_k).
ENCODINGS = ["nope", "rope", "alibi", "t5", "cable", "expe", "sinusoidal", "learned_absolute", "fire",
             "forget_gate", "xpos", "rope@kv2", "expe@kv2"]
TOLERANCE = 1e-6
TINY = ["--steps", "30", "--seq-len", "32", "--batch", "4", "--d-model", "32", "--layers", "2",
        "--heads", "2", "--vocab", "4096", "--warmup", "5", "--lr", "3e-3", "--seed", "1"]
EVAL = ["--eval-multiples", "1,2,4", "--eval-tokens", "256", "--threads", "1"]


def run(argv, log):
    with open(log, "w") as f:
        if subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"FAIL: {' '.join(argv)}\n" + open(log).read()[-3000:])


def stressed(src, dst, seed=7):
    """A copy of checkpoint `src` whose trained tensors are large random values; the fixed ones
    (those without AdamW state: ALiBi's slopes, ExPE's σ) kept."""
    enc, cfg, w = checkpoint.read(src)
    rng = np.random.default_rng(seed)
    for k, a in w.items():
        if k.startswith("train/") or a.dtype != np.float32 or f"train/adam/{k}/exp_avg" not in w:
            continue
        normal = lambda std: (rng.standard_normal(a.shape) * std).astype(np.float32)  # noqa: E731
        if k.endswith("fire_c"):
            w[k] = np.full(a.shape, 0.3, np.float32)
        elif k.endswith("fire_l_mult"):
            w[k] = np.full(a.shape, 0.01, np.float32)  # 512·0.01 < 32: both sides of max(i, 512·L)
        elif ".ln" in k or k.startswith("ln_f"):
            w[k] = 1 + normal(0.5) if k.endswith(".weight") else normal(0.3)
        elif k.endswith("fire_w1"):
            w[k] = normal(2.0)
        elif k in ("wpe",) or k.endswith("t5_table") or k.endswith("wf.weight") or k.endswith("fire_w2"):
            w[k] = normal(0.5 if not k.endswith("fire_w2") else 1.0)
        elif k.endswith("wf.bias"):
            w[k] = normal(1.0)
        else:  # projections, the token embedding, biases
            w[k] = normal(0.3)
    checkpoint.write(dst, enc, cfg, w)


def segment_losses(model, books, row, seq_len, max_mult, eval_tokens):
    length = int(row["eval_len"])
    max_len = seq_len * max_mult
    windows = torch.from_numpy(token_cache.eval_windows(books, length, max_len, max(1, eval_tokens // max_len)))
    with torch.no_grad():
        losses = model.token_losses(windows)
    return losses.sum(1).view(-1, max_len // length).sum(1).numpy() / max_len


def compare(ckpt_path, csv_path, books, mutations=()):
    """The largest relative difference between the reference's segment losses and the CSV's."""
    enc, cfg, w = checkpoint.read(ckpt_path)
    rows = list(csv.DictReader(open(csv_path)))
    max_mult = max(int(r["multiple"]) for r in rows)
    model = Reference(enc, cfg, w, mutations)
    worst = 0.0
    for r in rows:
        tool = np.array([float(x) for x in r["segment_losses"].split(";")])
        ref = segment_losses(model, books, r, cfg["train"]["seq_len"], max_mult, cfg["eval"]["tokens"])
        if ref.shape != tool.shape:
            sys.exit(f"FAIL: {enc} at {r['eval_len']}: {len(tool)} segments in the CSV, {len(ref)} placed here")
        worst = max(worst, float(np.abs(ref - tool).max() / np.abs(tool).max()))
        if not mutations and abs(float(r["loss"]) - ref.mean()) > TOLERANCE * abs(ref.mean()):
            sys.exit(f"FAIL: {enc} at {r['eval_len']}: loss {r['loss']}, the reference's {ref.mean():.6f}")
    return worst


def main():
    train, evaluate, cache, work = sys.argv[1:5]
    encodings = sys.argv[5:] or ENCODINGS
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.set_num_threads(1)
    books = None
    failures = []
    for variant in encodings:
        t0 = time.time()
        enc, _, kv = variant.partition("@kv")
        tiny = TINY
        if kv:
            i = TINY.index("--heads")
            tiny = TINY[:i] + ["--heads", "4", "--kv-heads", kv] + TINY[i + 2:]
        out = os.path.join(work, variant.replace("@", "_"))
        run([train, "-e", enc, *tiny, "--out", out, "--cache-dir", cache, *EVAL], out + ".train.log")
        ckpt = os.path.join(out, enc + ".ckpt")
        if books is None:  # the test split of the tokenizer the run used
            key = os.path.basename(checkpoint.read(ckpt)[1]["data"]["tokenizer"]).rsplit("_", 1)[1].split(".")[0]
            books = token_cache.read(os.path.join(cache, f"tokens_test_4096_{key}.bin"))
        trained = compare(ckpt, os.path.join(out, "results.csv"), books)
        stress = os.path.join(out, "stress.ckpt")
        stressed(ckpt, stress)
        run([evaluate, "-c", stress, "--cache-dir", cache, *EVAL, "--csv", stress + ".csv"], out + ".eval.log")
        worst = compare(stress, stress + ".csv", books)
        line = f"{variant:17s} trained {trained:.1e}  random weights {worst:.1e}"
        if max(trained, worst) > TOLERANCE:
            failures.append(f"{variant}: the reference differs by {max(trained, worst):.1e} relative")
        for m in (KV_MUTATIONS if kv else MUTATIONS.get(enc, [])):
            caught = compare(stress, stress + ".csv", books, [m])
            line += f"  {m} {caught:.1e}"
            if caught <= TOLERANCE:
                failures.append(f"{variant}: the planted error {m} moves the loss by only {caught:.1e}: "
                                "the comparison could not see it")
        print(f"{line}  ({time.time() - t0:.0f} s)", flush=True)
    if failures:
        sys.exit("FAIL:\n  " + "\n  ".join(failures))
    print(f"ok: {len(encodings)} encodings agree with the reference to {TOLERANCE:g}; every planted error is seen")


if __name__ == "__main__":
    main()
