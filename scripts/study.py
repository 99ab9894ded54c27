#!/usr/bin/env python3
"""The extrapolation study's driver (scripts/study.sh runs it; docs/study.md explains it).

Trains every seed encoding with one config on pg30 (ape-train), evaluates each at 1x..16x its
training length on the held-out books, evaluates the inference-time variants of the trained
checkpoints (ape-eval --encoding/--set: RoPE under PI, NTK, dynamic NTK and YaRN; ExPE and ExQPE at
sigma = 0.5), and writes the table, the CSV, the plot and the claim-by-claim report.

Resumable: each run (encoding, seed) trains in OUT/runs/<encoding>-s<seed>/ with a checkpoint that
ape-train writes every few minutes; each finished job (a training run and its evaluation, or one
inference-time variant) appends its rows to OUT/results.csv. Rerunning the same command skips the
finished jobs and continues an unfinished training run from its checkpoint (ape-train --resume).

Standard library only (Debian's python3); the plot is drawn by gnuplot (scripts/install-deps.sh).
"""

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from array import array

# ---- what is studied ---------------------------------------------------------------------------

# Every seed encoding of issue 18 (examples/encodings), the encodings of the seeds' claims first so
# that a partial study answers them first. kerple has two kernels (log and power); both are run.
CLAIM_ENCODINGS = ["rope", "sinusoidal", "expe", "cable", "alibi", "t5", "exqpe"]
OTHER_ENCODINGS = ["nope", "learned_absolute", "xpos", "kerple_log", "kerple_power", "fire", "shaw",
                   "transformer_xl", "deberta", "kcable", "forget_gate",
                   "rope_alibi", "rope_t5", "expe_cable", "expe_rope_cable"]
# Study-only specs, trained from their file (ape-train --spec; compiled at run time, cached).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_FILES = {"sinusoidal_scaled": os.path.join(ROOT, "bench", "study", "sinusoidal_scaled.mlir")}
ALL_ENCODINGS = CLAIM_ENCODINGS + OTHER_ENCODINGS + list(SPEC_FILES)
# The headline encodings get a second seed so that the table shows the seed-to-seed noise.
HEADLINE = ["rope", "sinusoidal", "expe", "cable"]

# Inference-time variants of a trained checkpoint, evaluated with ape-eval (no retraining).
#   factor "multiple": one ape-eval per length with rope_factor = eval length / training length
#   (so 1x is plain RoPE); otherwise the listed params at every length.
VARIANTS = [
    # (name, base encoding, evaluated encoding, fixed params, per-length factor)
    ("pi", "rope", "rope_pi", {}, True),
    ("ntk", "rope", "rope_ntk", {}, True),
    ("yarn", "rope", "rope_yarn", {"rope_original_length": "L"}, True),
    ("dynamic_ntk", "rope", "rope_dynamic_ntk", {"rope_factor": "2", "rope_original_length": "L"}, False),
    ("sigma0.5", "expe", "expe", {"position_scale": "0.5"}, False),
    ("sigma0.5", "exqpe", "exqpe", {"position_scale": "0.5"}, False),
]

# ---- presets -----------------------------------------------------------------------------------

PRESETS = {
    # What CI runs (test/study): tiny models, a few steps, the claim encodings, every variant,
    # the whole pipeline (train, resume/skip, evaluate, report, plot) in a minute or two.
    "quick": dict(d_model=32, layers=1, heads=2, seq_len=16, batch=4, steps=8, warmup=2, lr=3e-3,
                  vocab=4096, multiples=[1, 2, 4, 8, 16], eval_tokens=512, seed=1234, seed2=4321,
                  encodings=CLAIM_ENCODINGS, headline=["rope"], checkpoint_minutes=5.0),
    # The committed study (bench/results/study.md), one thread per run: 4.1M training tokens per
    # run (about 13 minutes on one core of the development machine), 26 runs.
    "full": dict(d_model=128, layers=2, heads=4, seq_len=128, batch=16, steps=2000, warmup=50, lr=3e-3,
                 vocab=4096, multiples=[1, 2, 4, 8, 16], eval_tokens=32768, seed=1234, seed2=4321,
                 encodings=ALL_ENCODINGS, headline=HEADLINE, checkpoint_minutes=5.0),
    # Every seed encoding in about ten GPU-minutes (an estimate until run; docs/study.md): 4.2M
    # parameters (d 256, 4 layers, head dim 64), 8.2M training tokens per run at L 256. On a GPU
    # (--device cuda, a build with CUDA kernels for every encoding: scripts/gpu-check.sh's study stage).
    "gpu-small": dict(d_model=256, layers=4, heads=4, seq_len=256, batch=32, steps=1000, warmup=100,
                      lr=2e-3, vocab=4096, multiples=[1, 2, 4, 8, 16], eval_tokens=32768, seed=1234,
                      seed2=4321, encodings=CLAIM_ENCODINGS + OTHER_ENCODINGS, headline=HEADLINE,
                      checkpoint_minutes=5.0),
    # The ExPE paper's small scale (about 35M parameters, train 512, evaluate to 8k = 16x). Sized
    # for a GPU; see docs/study.md for what running it takes today. No results are committed.
    "gpu": dict(d_model=512, layers=10, heads=8, seq_len=512, batch=32, steps=20000, warmup=1000,
                lr=6e-4, vocab=4096, multiples=[1, 2, 4, 8, 16], eval_tokens=65536, seed=1234,
                seed2=4321, encodings=ALL_ENCODINGS, headline=HEADLINE, checkpoint_minutes=10.0),
}
MODEL_KEYS = ["d_model", "layers", "heads", "seq_len", "batch", "steps", "warmup", "lr", "vocab",
              "multiples", "eval_tokens", "seed", "seed2"]

RESULT_FIELDS = ["run", "encoding", "seed", "variant", "evaluated", "settings", "train_len",
                 "eval_len", "multiple", "loss", "ppl", "tokens", "note"]
TRAIN_FIELDS = ["run", "encoding", "seed", "parameters", "steps", "seconds", "tok_s", "first_loss",
                "final_loss", "status"]


def die(msg):
    print(f"[study] error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---- files -------------------------------------------------------------------------------------

def write_atomically(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_rows(path, fields, rows):
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in fields})
    write_atomically(path, out.getvalue())


def append_rows(path, fields, new_rows):
    """A job's rows are added all at once (the file is rewritten atomically), so a kill leaves either
    all of a job's rows or none."""
    write_rows(path, fields, read_rows(path) + new_rows)


# ---- the plan ----------------------------------------------------------------------------------

class Run:
    def __init__(self, encoding, seed):
        self.encoding, self.seed = encoding, seed
        self.id = f"{encoding}-s{seed}"


def plan(cfg):
    runs = [Run(e, cfg["seed"]) for e in cfg["encodings"]]
    second = [Run(e, cfg["seed2"]) for e in cfg["encodings"] if e in cfg["headline"]]
    # The claim encodings and the headline encodings' second seeds first, then the rest.
    first = CLAIM_ENCODINGS + list(SPEC_FILES)  # the study-only specs answer the claims too
    claim = [r for r in runs if r.encoding in first]
    rest = [r for r in runs if r.encoding not in first]
    return claim + second + rest


def variants_of(run):
    return [v for v in VARIANTS if v[1] == run.encoding]


# ---- running -----------------------------------------------------------------------------------

class Runner:
    def __init__(self, args, cfg):
        self.args, self.cfg = args, cfg
        self.train_bin = os.path.join(args.build_dir, "tools", "ape-train")
        self.eval_bin = os.path.join(args.build_dir, "tools", "ape-eval")
        self.results = os.path.join(args.out, "results.csv")
        self.train_csv = os.path.join(args.out, "train.csv")
        self.failed = []
        self.child, self.stopping = None, False
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)

    def common(self):
        device = [] if self.args.device == "cpu" else ["--device", self.args.device]
        return ["--data", self.args.data, "--cache-dir", self.args.cache_dir,
                "--threads", str(self.args.threads)] + device

    def run_cmd(self, cmd, log):
        """Runs cmd, its output to log (appended) and, with --verbose, to the terminal."""
        print("[study] $ " + " ".join(cmd), flush=True)
        if self.args.dry_run:
            return 0, ""
        with open(log, "a", encoding="utf-8") as lf:
            lf.write("$ " + " ".join(cmd) + "\n")
            lf.flush()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.child = p
            text = []
            for line in p.stdout:
                lf.write(line)
                lf.flush()
                text.append(line)
                if self.args.verbose:
                    sys.stdout.write(line)
            rc = p.wait()
            self.child = None
            if self.stopping:
                print(f"[study] stopped; the running tool was asked to save its state (see {log}); run the "
                      "same command again to continue", file=sys.stderr)
                sys.exit(130)
            return rc, "".join(text)

    def on_signal(self, signum, _frame):
        """SIGINT/SIGTERM: ask the running ape-train/ape-eval to stop as Ctrl-C does (ape-train writes its
        checkpoint), let it finish, then stop without recording a half-done job."""
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)
        else:
            sys.exit(130)

    def done_jobs(self):
        return {(r["run"], r["variant"]) for r in read_rows(self.results)}

    def train(self, run):
        c = self.cfg
        d = os.path.join(self.args.out, "runs", run.id)
        if not self.args.dry_run:
            os.makedirs(d, exist_ok=True)
        ckpt = os.path.join(d, f"{run.encoding}.ckpt")
        run_csv = os.path.join(d, "results.csv")
        log = os.path.join(d, "train.log")
        t0 = time.time()
        if os.path.exists(run_csv) and not self.args.dry_run:
            rc, text = 0, open(log, encoding="utf-8").read() if os.path.exists(log) else ""
            print(f"[study] {run.id}: trained and evaluated before (its results.csv); recording it")
        elif os.path.exists(ckpt):
            rc, text = self.run_cmd([self.train_bin, "--resume", ckpt] + self.common(), log)
        else:
            what = ["--spec", SPEC_FILES[run.encoding]] if run.encoding in SPEC_FILES else ["-e", run.encoding]
            cmd = [self.train_bin] + what + ["--seed", str(run.seed), "--steps", str(c["steps"]),
                   "--seq-len", str(c["seq_len"]), "--batch", str(c["batch"]), "--d-model", str(c["d_model"]),
                   "--layers", str(c["layers"]), "--heads", str(c["heads"]), "--vocab", str(c["vocab"]),
                   "--lr", repr(c["lr"]), "--warmup", str(c["warmup"]),
                   "--eval-multiples", ",".join(map(str, c["multiples"])), "--eval-tokens", str(c["eval_tokens"]),
                   "--checkpoint-minutes", str(c["checkpoint_minutes"]), "--out", d] + self.common()
            rc, text = self.run_cmd(cmd, log)
        if self.args.dry_run:
            return True
        info = {"run": run.id, "encoding": run.encoding, "seed": run.seed}
        m = re.search(r"\] (\d+) parameters;", text)
        if m:
            info["parameters"] = m.group(1)
        m = re.search(r"\] (\d+) steps in ([\d.]+) s, (\d+) tok/s, loss ([\d.na]+) -> ([\d.na]+)", text)
        if m:
            info.update(steps=m.group(1), seconds=m.group(2), tok_s=m.group(3), first_loss=m.group(4),
                        final_loss=m.group(5))
        if rc != 0 or not os.path.exists(run_csv):
            diverged = re.search(r"diverg|NaN|non-finite|inf loss", text, re.I)
            if rc != 0 and diverged:
                # A diverged run is a result (it stays diverged when run again): recorded, not retried.
                info["status"] = "diverged"
                append_rows(self.train_csv, TRAIN_FIELDS, [info])
                append_rows(self.results, RESULT_FIELDS, [dict(
                    run=run.id, encoding=run.encoding, seed=run.seed, variant="trained",
                    evaluated=run.encoding, settings="", note="training diverged; see " + log)])
                print(f"[study] {run.id}: training diverged (recorded; see {log})")
                return False
            self.failed.append(run.id)
            print(f"[study] {run.id}: ape-train failed (exit {rc}); see {log}; rerun to continue it",
                  file=sys.stderr)
            return False
        rows = []
        for r in read_rows(run_csv):
            rows.append(dict(run=run.id, encoding=run.encoding, seed=run.seed, variant="trained",
                             evaluated=run.encoding, settings="", train_len=r["train_len"],
                             eval_len=r["eval_len"], multiple=r["multiple"], loss=r["loss"], ppl=r["ppl"],
                             tokens=r["tokens"], note=r["note"]))
        info["status"] = "ok"
        append_rows(self.train_csv, TRAIN_FIELDS, [info])
        append_rows(self.results, RESULT_FIELDS, rows)
        print(f"[study] {run.id}: done in {time.time() - t0:.0f} s", flush=True)
        return True

    def variant(self, run, v):
        name, _, evaluated, params, per_length = v
        c = self.cfg
        d = os.path.join(self.args.out, "runs", run.id)
        ckpt = os.path.join(d, f"{run.encoding}.ckpt")
        log = os.path.join(d, f"eval_{name}.log")
        sets = {k: (str(c["seq_len"]) if val == "L" else val) for k, val in params.items()}
        # (multiples evaluated, the multiple kept, sets). ape-eval places its windows by the largest
        # multiple (runtime/Eval.h): a per-length call evaluates that multiple and the largest, so
        # every call scores the same target tokens as the trained row, and keeps the one it is for.
        calls = []
        top = max(c["multiples"])
        if per_length:
            for m in c["multiples"]:
                calls.append((sorted({m, top}), m, dict(sets, rope_factor=str(m))))
        else:
            calls.append((c["multiples"], None, sets))
        rows = []
        for i, (mults, keep, s) in enumerate(calls):
            out_csv = os.path.join(d, f"eval_{name}_{i}.csv")
            cmd = [self.eval_bin, "-c", ckpt, "--eval-multiples", ",".join(map(str, mults)),
                   "--eval-tokens", str(c["eval_tokens"]), "--csv", out_csv] + self.common()
            if evaluated != run.encoding:
                cmd += ["--encoding", evaluated]
            for k, val in s.items():
                cmd += ["--set", f"{k}={val}"]
            rc, _ = self.run_cmd(cmd, log)
            if self.args.dry_run:
                continue
            if rc != 0:
                self.failed.append(f"{run.id}/{name}")
                print(f"[study] {run.id}/{name}: ape-eval failed (exit {rc}); see {log}", file=sys.stderr)
                return False
            settings = ";".join(f"{k}={val}" for k, val in sorted(s.items()))
            for r in read_rows(out_csv):
                if keep is not None and int(r["multiple"]) != keep:
                    continue
                rows.append(dict(run=run.id, encoding=run.encoding, seed=run.seed, variant=name,
                                 evaluated=evaluated, settings=settings, train_len=r["train_len"],
                                 eval_len=r["eval_len"], multiple=r["multiple"], loss=r["loss"], ppl=r["ppl"],
                                 tokens=r["tokens"], note=r["note"]))
        if not self.args.dry_run:
            append_rows(self.results, RESULT_FIELDS, rows)
        return True

    def go(self):
        runs = plan(self.cfg)
        done = self.done_jobs()
        todo = sum((r.id, "trained") not in done for r in runs) + sum(
            (r.id, v[0]) not in done for r in runs for v in variants_of(r))
        print(f"[study] {len(runs)} runs; {todo} jobs to do, {len(done)} finished before (skipped)", flush=True)
        for run in runs:
            if (run.id, "trained") not in done:
                if not self.train(run):
                    continue
                done = self.done_jobs()
            trained = [r for r in read_rows(self.results) if r["run"] == run.id and r["variant"] == "trained"]
            if trained and not trained[0]["train_len"] and "diverged" in trained[0]["note"]:
                continue  # no checkpoint to evaluate
            for v in variants_of(run):
                if (run.id, v[0]) not in done:
                    self.variant(run, v)
            if not self.args.dry_run and run is not runs[-1]:
                report(self.args, self.cfg)  # outputs stay current while the study runs
        return not self.failed


# ---- the report ------------------------------------------------------------------------------

def label(r):
    lab = r["encoding"] if r["variant"] == "trained" else f'{r["encoding"]}+{r["variant"]}'
    return lab


def collect(results):
    """{(run, variant): {multiple: row}} and the order the rows appear in."""
    table, order = {}, []
    for r in results:
        key = (r["run"], r["variant"])
        if key not in table:
            table[key] = {}
            order.append(key)
        if r["multiple"]:
            table[key][int(r["multiple"])] = r
    return table, order


def loss_of(table, run, variant, m):
    r = table.get((run, variant), {}).get(m)
    if not r or not r["loss"]:
        return None
    return float(r["loss"])


def unigram_loss(cache_dir, vocab):
    """Cross-entropy of the held-out test books under the training books' unigram distribution
    (add-one smoothed): what a model that ignores all context can reach. Reads the token caches
    (runtime/Data.cpp: header, names, int32 ids, fnv64)."""
    def ids(split):
        # tokens_SPLIT_VOCAB_TAG.bin (TAG: the hash of the books the tokenizer was trained on;
        # runtime/Data.cpp), or tokens_SPLIT_VOCAB.bin of older caches; the newest.
        found = [os.path.join(cache_dir, n) for n in os.listdir(cache_dir)
                 if re.fullmatch(rf"tokens_{split}_{vocab}(_[0-9a-f]+)?\.bin", n)]
        if not found:
            raise FileNotFoundError(f"no tokens_{split}_{vocab}*.bin in {cache_dir}")
        path = max(found, key=os.path.getmtime)
        with open(path, "rb") as f:
            b = f.read()
        if b[:8] != b"APETOKS\0":
            raise ValueError(f"{path}: not an APE token cache")
        n = struct.unpack_from("<Q", b, 32)[0]
        a = array("i")
        a.frombytes(b[len(b) - 8 - 4 * n:len(b) - 8])
        return a
    try:
        train, test = ids("train"), ids("test")
    except (OSError, ValueError, struct.error):
        return None
    counts = [1] * vocab
    for t in train:
        counts[t] += 1
    total = sum(counts)
    logp = [math.log(c / total) for c in counts]
    return -sum(logp[t] for t in test) / len(test)


def fmt(x, nd=3):
    return "—" if x is None else f"{x:.{nd}f}"


def noise_estimate(cfg, table):
    """Seed-to-seed noise of each headline encoding that has both seeds: {encoding: (largest
    difference between the seeds in the growth from 1x (loss(m) - loss(1x)) over the multiples,
    difference in loss(1x))}."""
    out = {}
    for e in cfg["headline"]:
        a, b = f"{e}-s{cfg['seed']}", f"{e}-s{cfg['seed2']}"
        la1, lb1 = loss_of(table, a, "trained", 1), loss_of(table, b, "trained", 1)
        if la1 is None or lb1 is None:
            continue
        growth = []
        for m in cfg["multiples"][1:]:
            la, lb = loss_of(table, a, "trained", m), loss_of(table, b, "trained", m)
            if la is not None and lb is not None:
                growth.append(abs((la - la1) - (lb - lb1)))
        if growth:
            out[e] = (max(growth), abs(la1 - lb1))
    return out


class Claims:
    """The seeds' claims, each judged by a stated rule from the study's numbers (docs/study.md)."""

    def __init__(self, cfg, table):
        self.cfg, self.table = cfg, table
        self.s = cfg["seed"]
        self.mults = cfg["multiples"]
        # tau: how much a loss must grow beyond the training length to count as degrading (and how
        # little to count as flat): twice the seed-to-seed noise of that growth, at least 0.02 nats.
        # Per encoding: its own noise where it has both seeds (a run that learnt poorly is noisier,
        # and its own noise is the yardstick of its growth), else the median of the measured ones.
        self.noise_by = {e: g for e, (g, _) in noise_estimate(cfg, table).items()}
        gs = sorted(self.noise_by.values())
        self.noise_default = gs[len(gs) // 2] if gs else None
        own = ", ".join(f"{e} {fmt(self.tau_of(e))}" for e in self.noise_by)
        self.tau_note = (f"τ = max(0.02, 2 × seed noise of the growth): an encoding's own where it has "
                         f"both seeds (τ: {own}), else twice the median noise of those, {fmt(self.tau_of(None))} nats"
                         if gs else
                         "τ = 0.05 nats (no headline encoding has both seeds yet, so no measured noise)")

    def tau_of(self, enc):
        g = self.noise_by.get(enc, self.noise_default)
        return max(0.02, 2 * g) if g is not None else 0.05

    def growth(self, enc, m, variant="trained"):
        run = f"{enc}-s{self.s}"
        l1, lm = loss_of(self.table, run, "trained", 1), loss_of(self.table, run, variant, m)
        return None if l1 is None or lm is None else lm - l1

    def variant_gain(self, enc, variant, mults):
        """The variant's loss minus the trained model's at each of mults; None until all are in."""
        run = f"{enc}-s{self.s}"
        diffs = []
        for m in mults:
            a, b = loss_of(self.table, run, variant, m), loss_of(self.table, run, "trained", m)
            if a is None or b is None:
                return None
            diffs.append(a - b)
        return diffs

    def row(self, enc, variant="trained"):
        run = f"{enc}-s{self.s}"
        return [loss_of(self.table, run, variant, m) for m in self.mults]

    def cells(self, enc, variant="trained", upto=None):
        ms = [m for m in self.mults if upto is None or m <= upto]
        return " / ".join(fmt(loss_of(self.table, f"{enc}-s{self.s}", variant, m), 2) for m in ms)

    def degrades(self, enc, m):
        g = self.growth(enc, m)
        return None if g is None else g > self.tau_of(enc)

    def judge(self):
        out = []
        t, mx = self.tau_of, max(self.mults)
        # 1. ExPE Table 2: sinusoidal and RoPE degrade past the training length, ExPE stays flat.
        gs = {e: self.growth(e, 4) for e in ("sinusoidal", "rope", "expe")}
        if any(v is None for v in gs.values()):
            v = "not yet run"
        elif gs["sinusoidal"] > t("sinusoidal") and gs["rope"] > t("rope") and gs["expe"] <= t("expe"):
            v = "agrees"
        elif gs["expe"] > t("expe") and gs["expe"] >= min(gs["sinusoidal"], gs["rope"]) - t("expe"):
            v = "disagrees"
        else:
            v = "inconclusive at this scale"
        out.append(dict(
            claim="ExPE (Table 2, train 512): loss at 1x/2x/4x: sinusoidal 4.00/4.75/5.64, RoPE "
                  "3.88/4.37/5.05, ExPE 3.93/3.87/3.88 — absolute and rotary degrade, ExPE stays flat",
            ours="loss at 1x/2x/4x: sinusoidal {}, RoPE {}, ExPE {}; growth at 4x: {}".format(
                self.cells("sinusoidal", upto=4), self.cells("rope", upto=4), self.cells("expe", upto=4),
                ", ".join(f"{e} {fmt(g, 3) if g is None else f'{g:+.3f}'}" for e, g in gs.items())),
            rule=f"agrees when sinusoidal's and RoPE's loss at 4x exceed their 1x loss by more than τ and "
                 f"ExPE's does not; disagrees when ExPE grows by more than τ and about as much as they do",
            verdict=v))
        # 2. ExPE Tables 1 and 3: scaled positions (sigma = 0.5) help further out.
        for enc in ("expe", "exqpe"):
            far = [m for m in self.mults if m >= 4]
            diffs = self.variant_gain(enc, "sigma0.5", far)
            if diffs is None:
                v, ours = "not yet run", "—"
            else:
                v = ("agrees" if all(d < -0.01 for d in diffs) else
                     "disagrees" if all(d >= -0.01 for d in diffs) else "inconclusive at this scale")
                ours = "σ = 1: {}; σ = 0.5: {} (1x..{}x); σ = 0.5 minus σ = 1 at 4x..{}x: {}".format(
                    self.cells(enc), self.cells(enc, "sigma0.5"), mx, mx,
                    " / ".join(f"{d:+.3f}" for d in diffs))
            out.append(dict(
                claim=f"ExPE (Tables 1 and 3): positions scaled by σ = 0.5 at evaluation help further out "
                      f"({'ExPE' if enc == 'expe' else 'ExQPE'})",
                ours=ours,
                rule="agrees when σ = 0.5 gives a loss lower by more than 0.01 than σ = 1 at every length from 4x "
                     "on; disagrees when it is lower by more than 0.01 at none of them; inconclusive when it helps "
                     "at some lengths only",
                verdict=v))
        # 3. Cable Fig. 3 / Table 1: Cable's loss keeps falling up to 16x; ALiBi holds; T5, RoPE and
        #    sinusoidal degrade.
        cab = self.row("cable")
        if any(x is None for x in cab):
            v = "not yet run"
        else:
            falling = all(b <= a + 0.01 for a, b in zip(cab, cab[1:])) and cab[-1] < cab[0] - 0.01
            rising = cab[-1] > cab[0] + t("cable")
            v = "agrees" if falling else "disagrees" if rising else "inconclusive at this scale"
        out.append(dict(
            claim=f"Cable (Fig. 3, Table 1): Cable's perplexity keeps falling as the evaluation length grows, "
                  f"up to 16x",
            ours=f"Cable loss 1x..{mx}x: {self.cells('cable')}",
            rule="agrees when the loss never rises by more than 0.01 from one length to the next and the longest "
                 "is more than 0.01 below 1x; disagrees when the longest is more than τ above 1x",
            verdict=v))
        g = self.growth("alibi", mx)
        v = "not yet run" if g is None else "agrees" if g <= t("alibi") else "disagrees"
        out.append(dict(claim="Cable (Fig. 3): ALiBi holds its loss at long lengths",
                        ours=f"ALiBi loss 1x..{mx}x: {self.cells('alibi')}",
                        rule=f"agrees when the loss at {mx}x is at most τ above 1x, else disagrees", verdict=v))
        for enc, nm in (("t5", "T5"), ("rope", "RoPE"), ("sinusoidal", "sinusoidal"),
                        ("sinusoidal_scaled", "sinusoidal with the token embedding scaled by √d (study-only "
                                              "spec)")):
            g = self.growth(enc, mx)
            v = "not yet run" if g is None else "agrees" if g > t(enc) else "disagrees"
            out.append(dict(claim=f"Cable (Fig. 3): {nm} degrades at long lengths",
                            ours=f"{nm} loss 1x..{mx}x: {self.cells(enc)}",
                            rule=f"agrees when the loss at {mx}x is more than τ above 1x, else disagrees",
                            verdict=v))
        # 4. RoPE scalings at evaluation reduce a RoPE model's loss beyond the training length.
        for var, nm in (("pi", "PI"), ("ntk", "NTK"), ("dynamic_ntk", "dynamic NTK"), ("yarn", "YaRN")):
            far = [m for m in self.mults if m >= 2]
            diffs = self.variant_gain("rope", var, far)
            if diffs is None:
                v, ours = "not yet run", "—"
            else:
                v = ("agrees" if all(d < -0.01 for d in diffs) else
                     "disagrees" if all(d >= -0.01 for d in diffs) else "inconclusive at this scale")
                ours = "RoPE {}; RoPE+{} {}; difference at 2x..{}x: {}".format(
                    self.cells("rope"), nm, self.cells("rope", var), mx, " / ".join(f"{d:+.3f}" for d in diffs))
            out.append(dict(claim=f"RoPE scalings: {nm} applied at evaluation lowers a RoPE model's loss "
                                  f"beyond the training length",
                            ours=ours,
                            rule="agrees when the scaled loss is lower by more than 0.01 at every length from 2x "
                                 "on; disagrees when it is lower by more than 0.01 at none of them (it never "
                                 "helps); inconclusive when it helps at some lengths only",
                            verdict=v))
        return out


# Distinct line colours (gnuplot's "podo" set and more); a line's style is (colour, dash, point).
COLOURS = ["#000000", "#e69f00", "#56b4e9", "#009e73", "#d55e00", "#0072b2", "#cc79a7", "#999999",
           "#8b0000", "#6a3d9a", "#b15928", "#33a02c"]


def write_plot(args, cfg, table, order, png):
    """Loss against evaluation length (log2 axis), the training length marked: left, every trained
    encoding (first seed); right, the inference-time variants (dashed) beside their base models."""
    gp = shutil.which("gnuplot")
    if not gp:
        print("[study] note: no gnuplot (scripts/install-deps.sh installs gnuplot-nox); no plot", file=sys.stderr)
        return False
    L, top = cfg["seq_len"], max(cfg["multiples"])
    dat = os.path.join(args.out, "plot")
    os.makedirs(dat, exist_ok=True)
    trained, variants = [], []
    for run, variant in order:
        if not run.endswith(f"-s{cfg['seed']}"):
            continue
        pts = [(L * m, loss_of(table, run, variant, m)) for m in cfg["multiples"]]
        pts = [(x, y) for x, y in pts if y is not None]
        if not pts:
            continue
        enc = run.rsplit("-s", 1)[0]
        name = enc if variant == "trained" else f"{enc}+{variant}"
        path = os.path.join(dat, re.sub(r"[^A-Za-z0-9_.+-]", "_", name) + ".dat")
        with open(path, "w") as f:
            f.writelines(f"{x} {y}\n" for x, y in pts)
        if variant == "trained":
            trained.append((name, path))
            if enc in {v[1] for v in VARIANTS}:
                variants.append((name, path))
        else:
            variants.append((name, path))
    if not trained:
        return False
    script = ['set terminal pngcairo size 1800,800 font ",10" noenhanced', f'set output "{png}"',
              f"set multiplot layout 1,{2 if variants else 1}", "set logscale x 2", "set grid", "set key outside right top",
              f"set xrange [{L / 1.4}:{L * top * 1.4}]", f"set xtics ({', '.join(str(L * m) for m in cfg['multiples'])})",
              'set xlabel "evaluation length (tokens)"', 'set ylabel "held-out loss (nats/token)"',
              f'set arrow from {L}, graph 0 to {L}, graph 1 nohead dt 2 lw 2 lc "black"',
              f'set label "training length {L}" at {L}, graph 0.97 offset 0.5,0']
    for title, items in ((f"every encoding as trained (seed {cfg['seed']})", trained),
                         ("inference-time variants (dashed) beside their models", variants)):
        if not items:
            continue
        script.append(f'set title "{title}"')
        plots = []
        for i, (name, path) in enumerate(items):
            dt = 2 if "+" in name else (1 if i < len(COLOURS) else 4)
            plots.append(f'"{path}" using 1:2 with linespoints lc rgb "{COLOURS[i % len(COLOURS)]}" dt {dt} '
                         f'pt {i % 13 + 1} lw 1.5 title "{name}"')
        script.append("plot " + ", \\\n  ".join(plots))
    script.append("unset multiplot")
    r = subprocess.run([gp], input="\n".join(script) + "\n", text=True, capture_output=True)
    if r.returncode != 0:
        print("[study] gnuplot failed:\n" + r.stderr, file=sys.stderr)
        return False
    return True


def report(args, cfg):
    results = read_rows(os.path.join(args.out, "results.csv"))
    train = read_rows(os.path.join(args.out, "train.csv"))
    table, order = collect(results)
    runs = plan(cfg)
    # Rows in the plan's order (runs), each run's variants after it in VARIANTS' order.
    run_rank = {r.id: i for i, r in enumerate(runs)}
    var_rank = {"trained": -1, **{v[0]: i for i, v in enumerate(VARIANTS)}}
    order.sort(key=lambda k: (run_rank.get(k[0], len(runs)), k[0], var_rank.get(k[1], len(VARIANTS))))
    n_done = sum(any(k == (r.id, "trained") for k in table) for r in runs)
    n_var = sum(len(variants_of(r)) for r in runs)
    n_var_done = sum((r.id, v[0]) in table for r in runs for v in variants_of(r))
    mults, L = cfg["multiples"], cfg["seq_len"]
    dests = [args.out] + ([args.publish] if args.publish else [])
    for dest in dests:
        os.makedirs(dest, exist_ok=True)

    # CSV: every row, as measured.
    for dest in dests:
        write_rows(os.path.join(dest, "study.csv"), RESULT_FIELDS, results)
    png_ok = write_plot(args, cfg, table, order, os.path.join(args.out, "study.png"))
    if png_ok and args.publish:
        shutil.copyfile(os.path.join(args.out, "study.png"), os.path.join(args.publish, "study.png"))

    # The table.
    head = "| encoding | seed | " + " | ".join(f"{m}x ({L * m})" for m in mults) + " |"
    lines = [head, "|" + " --- |" * (len(mults) + 2)]
    for key in order:
        run, variant = key
        rows = table[key]
        enc, seed = run.rsplit("-s", 1)
        name = enc if variant == "trained" else f"{enc} + {variant}"
        cells = []
        for m in mults:
            r = rows.get(m)
            if r is None:
                cells.append("—")
            elif not r["loss"]:
                cells.append("skipped")
            else:
                cells.append(f'{float(r["loss"]):.3f} / {float(r["ppl"]):.1f}')
        if not rows:
            cells = ["diverged"] * len(mults)
        lines.append(f"| {name} | {seed} | " + " | ".join(cells) + " |")
    notes = sorted({f'{r["encoding"]} {r["multiple"]}x: {r["note"]}' for r in results if r["note"]})
    table_md = "\n".join(lines)
    write_atomically(os.path.join(args.out, "table.md"), table_md + "\n")

    claims = Claims(cfg, table).judge()
    unigram = unigram_loss(args.cache_dir, cfg["vocab"])
    one_x = [loss_of(table, r.id, "trained", 1) for r in runs]
    one_x = [x for x in one_x if x is not None]
    status = ("complete" if n_done == len(runs) and n_var_done == n_var else
              f"PARTIAL: {n_done} of {len(runs)} training runs and {n_var_done} of {n_var} inference-time "
              f"variants have finished")
    cmd = args.resume_command
    quick_note = ""
    if args.preset == "quick":
        quick_note = (" The quick preset's models have not learnt beyond the first steps: its verdicts exercise "
                   "the pipeline and mean nothing about the encodings.")
    md = [f"# The extrapolation study ({args.preset} preset)", "",
          f"Status: **{status}**.{quick_note} Generated by `scripts/study.sh` from `{os.path.join(args.out, 'results.csv')}`"
          f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; docs/study.md explains the design and "
          f"the rules below.", "",
          "Command (rerunning it skips what has finished and continues the rest):", "", "```", cmd, "```", "",
          "## Config", "",
          f"One config for every encoding: d_model {cfg['d_model']}, layers {cfg['layers']}, heads {cfg['heads']}, "
          f"vocab {cfg['vocab']} (SentencePiece BPE), training length L = {L}, batch {cfg['batch']}, "
          f"{cfg['steps']} steps ({cfg['steps'] * cfg['batch'] * L:,} training tokens), AdamW lr {cfg['lr']} "
          f"(warmup {cfg['warmup']}, cosine), seed {cfg['seed']} (second seed {cfg['seed2']} for "
          f"{', '.join(cfg['headline'])}). Evaluated on the held-out test books of pg30 at "
          f"{', '.join(f'{m}x' for m in mults)} L, {cfg['eval_tokens']} scored target tokens per length (the same "
          f"tokens at every length; a cell is the mean loss over all positions of windows of that length).", ""]
    if one_x:
        med = statistics.median(one_x)
        md += ["## How far the models got", "",
               f"Held-out loss at 1x: {min(one_x):.3f} to {max(one_x):.3f} nats over {len(one_x)} finished runs "
               f"(median {med:.3f})."
               + (f" A unigram model (no context) scores {unigram:.3f} on the same books: the median run is "
                  f"{unigram - med:.2f} nats below it" if unigram else "")
               + "; the README's two-minute runs reach about 5.0 and the 150-step runs of "
                 "bench/results/issue4_encodings.md about 5.7.", ""]
        behind = [(r.id, loss_of(table, r.id, "trained", 1)) for r in runs]
        behind = [(i, x) for i, x in behind if x is not None and x > med + 0.2]
        if behind:
            md += ["Runs that learnt clearly less in the same budget (1x loss more than 0.2 nats above the median): "
                   + ", ".join(f"{i} ({x:.3f})" for i, x in behind)
                   + ". Their growth with length is measured from a weaker model; docs/study.md says what is known "
                     "of why.", ""]
    pairs = [e for e in cfg["headline"] if (f"{e}-s{cfg['seed']}", "trained") in table
             and (f"{e}-s{cfg['seed2']}", "trained") in table]
    if pairs:
        md += ["## Seed-to-seed noise", "",
               f"The headline encodings trained with seeds {cfg['seed']} and {cfg['seed2']} (initialisation and "
               "data order); cells: loss with the first seed / the second / their difference.", "",
               "| encoding | " + " | ".join(f"{m}x" for m in mults) + " |", "|" + " --- |" * (len(mults) + 1)]
        for e in pairs:
            cells = []
            for m in mults:
                a = loss_of(table, f"{e}-s{cfg['seed']}", "trained", m)
                b = loss_of(table, f"{e}-s{cfg['seed2']}", "trained", m)
                cells.append("—" if a is None or b is None else f"{a:.3f} / {b:.3f} / {b - a:+.3f}")
            md.append(f"| {e} | " + " | ".join(cells) + " |")
        md.append("")
    counts = {}
    for c in claims:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    md[4:4] = ["In short: of the seeds' " + str(len(claims)) + " claims below, " + ", ".join(
        f"{counts[v]} {w}" for v, w in (("agrees", "agree"), ("disagrees", "disagree"),
                                        ("inconclusive at this scale", "inconclusive at this scale"),
                                        ("not yet run", "not yet run")) if v in counts) + ".", ""]
    md += ["## The seeds' claims", "", claims_tau_line(cfg, table), "",
           "| claim (seed paper) | APE's numbers (loss, nats) | verdict |", "| --- | --- | --- |"]
    for c in claims:
        md.append(f"| {c['claim']} | {c['ours']} | **{c['verdict']}** |")
    md += ["", "Rules:", ""]
    seen = set()
    for c in claims:
        if c["rule"] not in seen:
            seen.add(c["rule"])
            md.append(f"- {c['rule']}.")
    md += ["", "Scale: the seeds measured larger models (ExPE's Table 2: about 35M parameters trained at 512 "
                 "tokens); this preset is the config above. Position interpolation (PI) is meant to be followed "
                 "by a short fine-tuning at the longer length; here every scaling is applied at evaluation only, "
                 "as the claim states.",
           "", "## Loss / perplexity by evaluation length", "",
           "Cells: mean held-out token loss (nats) / perplexity; `—`: not run yet; `skipped`: the model cannot "
           "take that length (learned absolute: its table). Variants: `+pi`, `+ntk`, `+yarn`: rope_factor = "
           "evaluation length / L at each length (1x is plain RoPE); `+dynamic_ntk`: rope_factor 2, "
           "original length L; `+sigma0.5`: position_scale = 0.5.", "", table_md, ""]
    if notes:
        md += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    if png_ok:
        md += ["## Plot", "", "![loss against evaluation length](study.png)", "",
               "Left: every trained encoding (first seed), the training length marked; right: the "
               "inference-time variants (dashed) beside the models they evaluate.", ""]
    if train:
        md += ["## Training", "", "| run | parameters | steps | time (s) | tok/s | loss first -> last 20 | status |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        for t in train:
            md.append(f"| {t['run']} | {t['parameters']} | {t['steps']} | {t['seconds']} | {t['tok_s']} | "
                      f"{t['first_loss']} -> {t['final_loss']} | {t['status']} |")
        md += ["", "Times are wall-clock on the shared 2-core development machine (other jobs ran beside it): "
                   "upper bounds on what the runs need.", ""]
    for dest in dests:
        write_atomically(os.path.join(dest, "study.md"), "\n".join(md) + "\n")
    print(f"[study] report -> {dests[-1]}/study.md, study.csv" + (", study.png" if png_ok else "") + f" ({status})")


def claims_tau_line(cfg, table):
    c = Claims(cfg, table)
    return ("Growth = loss at a multiple minus loss at 1x, same model. " + c.tau_note +
            ": the threshold for 'degrades' / 'holds'. Verdicts follow the rules under the table mechanically; "
            "'not yet run' means the runs it needs have not finished.")


# ---- command line ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        prog="scripts/study.sh",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The extrapolation study (docs/study.md): train every seed encoding with one config on pg30, "
                    "evaluate each at 1x..16x its training length on the held-out books, evaluate the "
                    "inference-time variants (RoPE + PI/NTK/dynamic NTK/YaRN, ExPE/ExQPE at sigma 0.5), and "
                    "write the table, CSV, plot and the claim-by-claim report. Resumable: rerun the same "
                    "command to skip finished jobs and continue an interrupted training run.",
        epilog="Presets: --quick (CI: tiny models, the claim encodings, a minute or two), full (the default; "
               "the committed bench/results/study.md: 26 runs of ~10 minutes on one core), --preset gpu (the ExPE "
               "small scale, ~35M params, train 512, evaluate to 8k; see docs/study.md). "
               "Examples:\n  scripts/study.sh --quick\n  scripts/study.sh --threads 1 --publish bench/results\n"
               "  scripts/study.sh --report-only --publish bench/results")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full", help="the config (default full)")
    ap.add_argument("--quick", action="store_const", const="quick", dest="preset", help="same as --preset quick")
    ap.add_argument("--out", help="study folder: runs/, results.csv, train.csv, report (default "
                                   "BUILD/study-PRESET)")
    ap.add_argument("--publish", help="also write study.md, study.csv and study.png into this folder "
                                      "(e.g. bench/results)")
    ap.add_argument("--build-dir", default=os.environ.get("APE_BUILD_DIR", "build"),
                    help="where ape-train and ape-eval are (BUILD/tools; default $APE_BUILD_DIR or build)")
    ap.add_argument("--data", default="data/pg30", help="corpus folder (default data/pg30)")
    ap.add_argument("--cache-dir", help="tokenizer and token-id cache (default BUILD/cache)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per run (default 1; 0: all)")
    ap.add_argument("--device", default="cpu",
                    help="cpu (default) or cuda[:N]: ape-train and ape-eval on that GPU (bf16 autocast; a build "
                         "with -DAPE_CUDA_ALL_ENCODINGS=ON has CUDA kernels for every seed encoding; the study-only "
                         "specs compiled at run time have CPU kernels only and are refused there)")
    ap.add_argument("--encodings", help="comma-separated subset of the preset's encodings")
    ap.add_argument("--steps", type=int, help="override the preset's training steps (a new study folder "
                                               "is needed: the config is fixed per folder)")
    ap.add_argument("--report-only", action="store_true", help="only (re)write the report from results.csv")
    ap.add_argument("--list", action="store_true", help="list the runs and variants with their state, and exit")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo ape-train/ape-eval output (always in "
                                                                 "the runs' logs)")
    args = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `scripts/study.sh --list | head` ends quietly
    cfg = dict(PRESETS[args.preset])
    if args.encodings:
        want = [e for e in args.encodings.split(",") if e]
        bad = [e for e in want if e not in ALL_ENCODINGS]
        if bad:
            die(f"unknown encoding(s) {', '.join(bad)}; the study's encodings: {', '.join(ALL_ENCODINGS)}")
        cfg["encodings"] = [e for e in cfg["encodings"] if e in want] + [
            e for e in want if e not in cfg["encodings"]]
    if args.steps is not None:
        if args.steps < 1:
            die("--steps must be at least 1")
        cfg["steps"] = args.steps
    if args.threads < 0:
        die("--threads must be >= 0")
    default_out = os.path.join(args.build_dir, f"study-{args.preset}")
    # The command that runs (and resumes) this study, for the report.
    args.resume_command = " ".join(
        ["scripts/study.sh"] + (["--quick"] if args.preset == "quick" else
                                [] if args.preset == "full" else ["--preset", args.preset])
        + (["--out", args.out] if args.out and os.path.normpath(args.out) != os.path.normpath(default_out) else [])
        + (["--encodings", args.encodings] if args.encodings else [])
        + (["--steps", str(args.steps)] if args.steps is not None else [])
        + ["--threads", str(args.threads)]
        + (["--device", args.device] if args.device != "cpu" else [])
        + (["--publish", args.publish] if args.publish else []))
    args.out = args.out or default_out
    args.cache_dir = args.cache_dir or os.path.join(args.build_dir, "cache")

    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
    cfg_path = os.path.join(args.out, "study.json")
    fixed = {k: cfg[k] for k in MODEL_KEYS}
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            old = json.load(f)
        if old.get("config") != fixed:
            diff = {k: (old.get("config", {}).get(k), fixed[k]) for k in fixed
                    if old.get("config", {}).get(k) != fixed[k]}
            die(f"{args.out} holds a study with another config ({diff}: was, now); "
                f"use another --out or the same settings")
        cfg["encodings"] = list(dict.fromkeys(old.get("encodings", []) + cfg["encodings"])) \
            if args.report_only else cfg["encodings"]
    if not args.report_only and not args.list and not args.dry_run:
        write_atomically(cfg_path, json.dumps({"preset": args.preset, "config": fixed,
                                               "encodings": cfg["encodings"]}, indent=1) + "\n")

    if args.list:
        done = {(r["run"], r["variant"]) for r in read_rows(os.path.join(args.out, "results.csv"))}
        for r in plan(cfg):
            state = "done" if (r.id, "trained") in done else (
                "started (checkpoint)" if os.path.exists(os.path.join(args.out, "runs", r.id, f"{r.encoding}.ckpt"))
                else "to do")
            print(f"{r.id:24s} trained: {state}")
            for v in variants_of(r):
                print(f"{r.id:24s} +{v[0]}: {'done' if (r.id, v[0]) in done else 'to do'}")
        return 0
    if args.report_only:
        report(args, cfg)
        return 0
    for tool in ("ape-train", "ape-eval"):
        p = os.path.join(args.build_dir, "tools", tool)
        if not os.access(p, os.X_OK):
            die(f"no {p}: build it (scripts/build.sh ape-train ape-eval) or give --build-dir")
    ok = Runner(args, cfg).go()
    if not args.dry_run:
        report(args, cfg)  # also when nothing was left to run
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
