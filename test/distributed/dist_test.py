#!/usr/bin/env python3
"""Data-parallel ape-train on localhost (runtime/Distributed.h, docs/distributed.md).

    dist_test.py APE_TRAIN TORCHRUN CACHE_DIR WORK_DIR equal|failure

equal    2 processes with --batch B (torchrun --standalone) against 1 process with --batch 2B, for
         rope, alibi, cable (a token feature) and t5 (a shared param): the same losses, final
         parameters and evaluation within TOLERANCE (the measured differences are printed). The
         same run started with explicit flags (--rank/--world-size/--master-addr/--master-port) is
         bit-identical to torchrun's. Resume: a 2-rank run stopped by rank 1 alone continues
         on 2 ranks bit-identical to the uninterrupted one, on 1 process (batch 2B) within
         TOLERANCE, and is refused on 3 ranks (the global batch 2B does not split).
failure  a rank killed (SIGKILL; rank 1, then rank 0, which hosts the store) makes the other exit
         with status 1 and a message naming the group failure within KILL_BOUND seconds; SIGTERM
         on rank 1 alone stops both after the same step (checkpoint, status 130); a rank that
         hangs (SIGSTOP) makes the other give up after --dist-timeout. Before the group forms:
         ranks given different --world-size, and a rank refused at its command line (rank 1,
         then rank 0, which hosts the store), end both ranks within REFUSE_BOUND seconds, far
         inside the --dist-timeout they would have waited, each naming the reason; a rank given
         another copy of the books is refused before training; a torchrun restart of a command
         without --resume, and --world-size against torchrun's WORLD_SIZE, are refused.

Ports: torchrun --standalone picks its own; the explicit-flag runs take a port the kernel just
handed out (bind to port 0) and start over with a new one when rank 0 reports it taken.
"""
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "resume"))
from compare_checkpoints import read  # noqa: E402  (the checkpoint reader independent of the runtime)

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ENCODINGS = ["rope", "alibi", "cable", "t5"]
BATCH = 2  # per rank
COMMON = ["--steps", "6", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "32",
          "--eval-multiples", "1,2", "--eval-tokens", "512", "--threads", "1", "--checkpoint-minutes", "0"]
# fp32: the ranks' gradients are summed in another order than one process sums its batch, and
# AdamW's first steps divide by sqrt of the second moment, which turns a rounding difference of a
# near-zero gradient into more. Measured (docs/distributed.md): at most 9.5e-7 on losses, 1.7e-6 on
# parameters (|p| <= 1.01), 1.0e-6 on evaluation losses; the bounds are about 10x and 60x above.
TOLERANCE = {"loss": 1e-5, "param": 1e-4, "eval": 1e-5}
KILL_BOUND = 20.0  # seconds from a rank's death to the other's exit
HANG_TIMEOUT = 4   # --dist-timeout of the hang case
REFUSE_BOUND = 30.0  # seconds for both ranks to end when one is refused before joining (--dist-timeout 300)


def fail(msg):
    print(f"dist_test: FAIL: {msg}")
    sys.exit(1)


def free_port():
    # The wildcard address, as c10d's store server binds: a port free on loopback alone may be taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def floats(entry):
    dtype, shape, raw = entry
    assert dtype == "f32", dtype
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def compare(a_path, b_path, label):
    """Max |a - b| of the losses and of every model tensor (not the training state)."""
    _, ca, ta = read(a_path)
    _, cb, tb = read(b_path)
    la, lb = ca["state"]["losses"], cb["state"]["losses"]
    if len(la) != len(lb):
        fail(f"{label}: {len(la)} losses against {len(lb)}")
    # NaN compares false both ways: a NaN loss or weight must fail, not pass as a difference of 0.
    if any(math.isnan(x) for x in la + lb):
        fail(f"{label}: a loss is NaN")
    dl = max(abs(x - y) for x, y in zip(la, lb))
    dp, where, big = 0.0, "", 0.0
    model = lambda t: {n for n in t if not n.startswith("train/")}
    if model(ta) != model(tb):
        fail(f"{label}: tensors in one checkpoint only: {sorted(model(ta) ^ model(tb))}")
    for name in sorted(model(ta)):
        if ta[name][1] != tb[name][1]:
            fail(f"{label}: tensor {name} of another shape")
        for x, y in zip(floats(ta[name]), floats(tb[name])):
            if math.isnan(x) or math.isnan(y):
                fail(f"{label}: tensor {name} holds NaN")
            big = max(big, abs(x))
            if abs(x - y) > dp:
                dp, where = abs(x - y), name
    print(f"  {label}: losses {la[0]:.4f} .. {la[-1]:.4f}, max |diff| {dl:.2e}; parameters (max |p| {big:.3f}) "
          f"max |diff| {dp:.2e} ({where})")
    if dl > TOLERANCE["loss"]:
        fail(f"{label}: the losses differ by {dl:.3g} > {TOLERANCE['loss']}")
    if dp > TOLERANCE["param"]:
        fail(f"{label}: parameter {where} differs by {dp:.3g} > {TOLERANCE['param']}")
    return dl, dp


def eval_losses(csv):
    rows = {}
    for line in open(csv).read().splitlines()[1:]:
        f = line.split(",")
        rows[(f[0], f[2])] = float(f[4])
    return rows


def run(cmd, log, env=None, timeout=600):
    t0 = time.time()
    with open(log, "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    return rc, time.time() - t0


def start_two(work, tag, command, env=lambda rank: None, ranks=(0, 1)):
    """Starts ranks 0 and 1, or those of `ranks` (command(rank), env(rank)), each writing
    WORK/TAG.rankR.log; returns the processes and the logs."""
    procs, logs = [], []
    for rank in ranks:
        logs.append(os.path.join(work, f"{tag}.rank{rank}.log"))
        procs.append(subprocess.Popen(command(rank), stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT,
                                      env=env(rank)))
    return procs, logs


def launch_pair(train, args, work, tag, extra=(), env1=None, extra1=()):
    """Starts ranks 0 and 1 with explicit flags on a fresh port and waits until they have formed the
    group; starts over on another port when rank 0 finds its port taken."""
    for attempt in range(4):
        port = free_port()
        procs, logs = start_two(
            work, tag,
            lambda rank: [train] + args + ["--rank", str(rank), "--world-size", "2", "--master-addr", "127.0.0.1",
                                           "--master-port", str(port)] + list(extra) + (list(extra1) if rank == 1 else []),
            lambda rank: dict(os.environ, **(env1 or {})) if rank == 1 else None)
        t0 = time.time()
        while time.time() - t0 < 120:
            text = open(logs[0]).read()
            if re.search(r"\[dist\] 2 ranks|\bstep 1\b", text) or (procs[0].poll() is not None and
                                                                  "already in use" not in text.lower()):
                return procs, logs  # formed (or failed otherwise: the caller reports it)
            if procs[0].poll() is not None:
                break
            time.sleep(0.05)
        for p in procs:
            p.kill()
            p.wait()
        print(f"  port {port} was taken (or the group did not form); trying another")
    fail("no group formed after 4 ports")


def run_two(train, args, work, tag, extra=({}, {}), ranks=(0, 1), world=2, bound=REFUSE_BOUND):
    """Ranks 0 and 1 (or `ranks` of a group of `world`) with explicit flags, on a fresh port,
    extra[i] replacing flags of the i-th of them ({flag: value}); waits for them to exit within
    REFUSE_BOUND seconds. Returns their status, their logs and the seconds taken."""
    def command(rank, port):
        mine = list(args)
        for flag, value in dict({"--world-size": str(world)}, **extra[ranks.index(rank)]).items():
            if flag in mine:
                mine[mine.index(flag) + 1] = value
            else:
                mine += [flag, value]
        return [train] + mine + ["--rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                                 "--dist-timeout", "300"]

    for attempt in range(4):
        port = free_port()
        procs, logs = start_two(work, tag, lambda rank: command(rank, port), ranks=ranks)
        t0 = time.time()
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(1.0, bound - (time.time() - t0))))
            except subprocess.TimeoutExpired:
                rcs.append(None)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if "already in use" not in open(logs[0]).read().lower():
            return rcs, logs, time.time() - t0
        print(f"  port {port} was taken; trying another")
    fail("no free port after 4 tries")


def wait_for(log, pattern, procs, timeout=300):  # a cold corpus cache is prepared first
    t0 = time.time()
    while time.time() - t0 < timeout:
        if re.search(pattern, open(log).read()):
            return
        if any(p.poll() is not None for p in procs):
            fail(f"a rank exited before '{pattern}' appeared in {log}:\n" + open(log).read())
        time.sleep(0.05)
    fail(f"'{pattern}' did not appear in {log} within {timeout} s")


def test_equal(train, torchrun, cache, work):
    common = COMMON + ["--cache-dir", cache, "--encoding", ",".join(ENCODINGS)]
    t0 = time.time()
    rc, s = run([train] + common + ["--batch", str(2 * BATCH), "--out", f"{work}/one"], f"{work}/one.log")
    if rc:
        fail("the single-process run failed:\n" + open(f"{work}/one.log").read())
    print(f"1 process, batch {2 * BATCH}: {s:.1f} s")
    rc, s = run([torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", train] + common +
                ["--batch", str(BATCH), "--out", f"{work}/two"], f"{work}/two.log")
    if rc:
        fail("the torchrun run failed:\n" + open(f"{work}/two.log").read())
    print(f"torchrun, 2 processes, batch {BATCH} each: {s:.1f} s")
    log = open(f"{work}/two.log").read()
    if "[dist] 2 ranks, backend gloo" not in log:
        fail("the torchrun run did not form a 2-rank Gloo group:\n" + log)
    worst = [0.0, 0.0]
    for enc in ENCODINGS:
        dl, dp = compare(f"{work}/one/{enc}.ckpt", f"{work}/two/{enc}.ckpt", f"{enc} 2x{BATCH} vs 1x{2 * BATCH}")
        worst = [max(worst[0], dl), max(worst[1], dp)]
    e1, e2 = eval_losses(f"{work}/one/results.csv"), eval_losses(f"{work}/two/results.csv")
    if set(e1) != set(e2):
        fail("the evaluations have different rows")
    de = max(abs(e1[k] - e2[k]) for k in e1)
    print(f"  evaluation (sharded over 2 ranks): {len(e1)} cells, max |loss diff| {de:.2e}")
    if de > TOLERANCE["eval"]:
        fail(f"the evaluation losses differ by {de:.3g} > {TOLERANCE['eval']}")
    print(f"worst: losses {worst[0]:.2e}, parameters {worst[1]:.2e}, evaluation {de:.2e} (tolerance {TOLERANCE})")

    # Explicit flags: the same computation as torchrun's, bit for bit (one encoding).
    args = COMMON + ["--cache-dir", cache, "--encoding", "cable", "--batch", str(BATCH), "--out", f"{work}/flags"]
    procs, logs = launch_pair(train, args, work, "flags")
    rcs = [p.wait(timeout=300) for p in procs]
    if rcs != [0, 0]:
        fail(f"the explicit-flag run exited {rcs}:\n" + open(logs[0]).read() + open(logs[1]).read())
    if open(logs[1]).read().strip():
        fail("rank 1 printed something (only rank 0 prints):\n" + open(logs[1]).read())
    cmp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "resume", "compare_checkpoints.py")
    if subprocess.call([sys.executable, cmp, f"{work}/flags/cable.ckpt", f"{work}/two/cable.ckpt"]):
        fail("the explicit-flag run differs from torchrun's")

    # Resume: rank 1 alone asks to stop after step 2 (as Ctrl-C or SIGTERM would: ape-train's test
    # hook, so that the step is known); both ranks stop there, rank 0 writes the checkpoint.
    args = COMMON + ["--cache-dir", cache, "--encoding", "t5", "--batch", str(BATCH), "--out", f"{work}/cut"]
    procs, logs = launch_pair(train, args, work, "cut", env1={"APE_TEST_STOP_AFTER_STEP": "2"})
    rcs = [p.wait(timeout=300) for p in procs]
    if rcs != [130, 130]:
        fail(f"after rank 1 asked to stop the ranks exited {rcs}, expected 130 and 130:\n" + open(logs[0]).read())
    _, cfg, _ = read(f"{work}/cut/t5.ckpt")
    st = cfg["state"]
    if st["step"] != 2 or st["complete"] or [e["rank"] for e in st["samplers"]] != [0, 1] or \
            any(e["windows"] != 2 * 2 * BATCH for e in st["samplers"]):
        fail(f"unexpected interrupted checkpoint: {st}")
    print(f"rank 1 asked to stop after step 2: both stopped (status 130); checkpoint at step 2 with sampler "
          f"entries for ranks 0 and 1 ({st['samplers'][0]['windows']} windows drawn)")
    for d in ("again2", "again1"):
        os.makedirs(f"{work}/{d}", exist_ok=True)
        with open(f"{work}/cut/t5.ckpt", "rb") as src, open(f"{work}/{d}/t5.ckpt", "wb") as dst:
            dst.write(src.read())
    resume = ["--resume", f"{work}/again2/t5.ckpt", "--cache-dir", cache]
    procs, logs = launch_pair(train, resume, work, "again2")
    rcs = [p.wait(timeout=300) for p in procs]
    if rcs != [0, 0]:
        fail(f"the 2-rank resume exited {rcs}:\n" + open(logs[0]).read() + open(logs[1]).read())
    if subprocess.call([sys.executable, cmp, f"{work}/again2/t5.ckpt", f"{work}/two/t5.ckpt"]):
        fail("the run resumed on 2 ranks differs from the uninterrupted 2-rank run")
    rc, _ = run([train, "--resume", f"{work}/again1/t5.ckpt", "--cache-dir", cache], f"{work}/again1.log")
    if rc or "continues on 1 with batch 4" not in open(f"{work}/again1.log").read():
        fail("the 1-process resume of the 2-rank run failed:\n" + open(f"{work}/again1.log").read())
    compare(f"{work}/again1/t5.ckpt", f"{work}/one/t5.ckpt", f"t5 resumed on 1 process vs 1x{2 * BATCH}")
    rc, _ = run([train, "--resume", f"{work}/cut/t5.ckpt", "--cache-dir", cache, "--rank", "0", "--world-size", "3",
                 "--master-port", str(free_port())], f"{work}/refused.log", timeout=60)
    msg = open(f"{work}/refused.log").read()
    if rc != 1 or "cannot be split over 3 ranks" not in msg:
        fail(f"a resume on 3 ranks (global batch {2 * BATCH}) was not refused clearly (status {rc}):\n{msg}")
    print("resume on 3 ranks refused: " + msg.strip().splitlines()[-1])
    print(f"dist_test equal: PASS in {time.time() - t0:.1f} s")


def test_failure(train, cache, work):
    t0 = time.time()
    args = ["--cache-dir", cache, "--encoding", "rope", "--steps", "100000", "--d-model", "32", "--layers", "1",
            "--heads", "2", "--seq-len", "32", "--batch", "2", "--threads", "1", "--checkpoint-minutes", "0"]
    for victim in (1, 0):
        procs, logs = launch_pair(train, args + ["--out", f"{work}/kill{victim}"], work, f"kill{victim}")
        wait_for(logs[0], r"step 1/", procs)
        time.sleep(0.5)
        procs[victim].kill()
        killed = time.time()
        other = 1 - victim
        try:
            rc = procs[other].wait(timeout=KILL_BOUND)
        except subprocess.TimeoutExpired:
            procs[other].kill()
            fail(f"rank {other} still running {KILL_BOUND} s after rank {victim} was killed")
        took = time.time() - killed
        procs[victim].wait()
        msg = open(logs[other]).read()
        if rc != 1 or "the data-parallel group failed" not in msg or f"[rank {other} of 2]" not in msg:
            fail(f"rank {other} exited {rc} without a clear message after rank {victim} died:\n{msg}")
        print(f"rank {victim} killed: rank {other} exited {rc} after {took:.2f} s: "
              + [l for l in msg.splitlines() if "error" in l][-1][:220])
    # Ranks given other evaluation lengths (whose sums they add) are refused as they form the group
    # (they trained on, then wrote wrong rows or aborted in Gloo).
    procs, logs = launch_pair(train, args + ["--out", f"{work}/evalmix"], work, "evalmix",
                              extra1=["--eval-multiples", "1,4"])
    rcs = [p.wait(timeout=KILL_BOUND + 60) for p in procs]
    msg = open(logs[0]).read() + open(logs[1]).read()
    if rcs != [1, 1] or "and the evaluation config (-e, --spec" not in msg or "step 1/" in msg:
        fail(f"ranks with other --eval-multiples: status {rcs}:\n{msg}")
    print(f"ranks with other --eval-multiples: both exited 1 before training")
    # SIGTERM on rank 1 alone: both stop after the same step, rank 0 writes the checkpoint, both exit 130.
    procs, logs = launch_pair(train, args + ["--out", f"{work}/term"], work, "term")
    wait_for(logs[0], r"step 1/", procs)
    procs[1].send_signal(signal.SIGTERM)
    rcs = [p.wait(timeout=KILL_BOUND) for p in procs]
    _, cfg, _ = read(f"{work}/term/rope.ckpt")
    if rcs != [130, 130] or cfg["state"]["complete"] or len(cfg["state"]["samplers"]) != 2:
        fail(f"SIGTERM on rank 1: status {rcs}, state {cfg['state'].get('step')}:\n" + open(logs[0]).read())
    print(f"SIGTERM on rank 1: both ranks exited 130; checkpoint at step {cfg['state']['step']}: "
          + open(logs[0]).read().strip().splitlines()[-1][:160])
    # Before the group forms: another --world-size on rank 1, then a rank refused at its command line
    # (--threads -1, an unknown option, a backend): both ranks end at once, naming the reason; then
    # ranks whose settings differ, named.
    cases = [("worldmix", ({}, {"--world-size": "3"}), "every rank needs the same --world-size", "--world-size"),
             ("refuse1", ({}, {"--threads": "-1"}), "rank 1 refused to start", "--threads"),
             ("refuse0", ({"--threads": "-1"}, {}), "rank 0 refused to start", "--threads"),
             # refused by the command-line parser itself, and by the rendezvous' own checks
             ("parse1", ({}, {"--bogus": "1"}), "rank 1 refused to start", "--bogus"),
             ("backend1", ({}, {"--dist-backend": "mpi"}), "rank 1 refused to start", "--dist-backend"),
             # after joining: the setting that differs is named
             ("lrmix", ({}, {"--lr": "0.002"}), "the training setting 'lr' differs", "'lr'")]
    for tag, extra, said, reason in cases:
        rcs, logs, took = run_two(train, args + ["--out", f"{work}/{tag}"], work, tag, extra)
        texts = [open(l).read() for l in logs]
        if rcs != [1, 1] or not any(said in t for t in texts) or not all(reason in t for t in texts):
            fail(f"{tag}: status {rcs} after {took:.1f} s (bound {REFUSE_BOUND} s):\n" + "\n".join(texts))
        print(f"{tag}: both ranks exited 1 after {took:.1f} s: "
              + [l for l in "".join(texts).splitlines() if said in l][0][:200])
    # Rank 1 given another copy of the books (one test book's letter case swapped, the same sizes):
    # refused once the corpora are open (both ranks had trained and evaluated on mixed data).
    alt = os.path.join(work, "pg30-other")
    import tarfile
    with tarfile.open(os.path.join(REPO, "data", "pg30", "clean.tar.xz")) as tf:
        tf.extractall(alt)  # (the project's own archive)
    for f in ("MANIFEST.tsv", "SPLITS.tsv"):
        shutil.copy(os.path.join(REPO, "data", "pg30", f), alt)
    test_id = next(l.split("\t")[0] for l in open(os.path.join(alt, "SPLITS.tsv")) if l.rstrip().endswith("\ttest"))
    book = next(os.path.join(r, f) for r, _, fs in os.walk(alt) for f in fs if f.startswith(f"pg{test_id}_"))
    text = open(book, encoding="utf-8").read()
    open(book, "w", encoding="utf-8").write(text.swapcase())
    rcs, logs, took = run_two(train, args + ["--out", f"{work}/datamix"], work, "datamix",
                              ({}, {"--data": alt}), bound=240)
    texts = [open(l).read() for l in logs]
    if rcs != [1, 1] or not all("the corpus's tokenizer and token ids" in t for t in texts) or "step 1/" in texts[0]:
        fail(f"datamix: status {rcs} after {took:.1f} s:\n" + "\n".join(texts))
    print(f"datamix: both ranks exited 1 after {took:.1f} s, before training: "
          + [l for l in texts[0].splitlines() if "corpus's tokenizer" in l][0][:160])
    # Replicas that drift apart (rank 1 on ATen's default kernels, rank 0 on its vectorised ones: other
    # bits each step): the first checkpoint's comparison fails; rank 0 writes its state first (the
    # run had been lost whole), and both stop naming the cause.
    procs, logs = launch_pair(train, [a if a != "100000" else "40" for a in args] +
                              ["--out", f"{work}/drift", "--checkpoint-every", "10"], work, "drift",
                              env1={"ATEN_CPU_CAPABILITY": "default"})
    rcs = [p.wait(timeout=240) for p in procs]
    texts = [open(l).read() for l in logs]
    if rcs != [1, 1] or "replicas drifted apart" not in texts[0] or not os.path.exists(f"{work}/drift/rope.ckpt"):
        fail(f"drift: status {rcs}:\n" + "\n".join(texts))
    _, cfg, _ = read(f"{work}/drift/rope.ckpt")
    print(f"drift: both ranks exited 1, rank 0's state saved at step {cfg['state']['step']}: "
          + [l for l in texts[0].splitlines() if "drifted" in l][0][-200:])
    # torchrun's restart of a command without --resume (it would start the run over), and
    # --world-size against torchrun's WORLD_SIZE: refused at once.
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for tag, extra, env_extra, said in (("restart", [], {"TORCHELASTIC_RESTART_COUNT": "1"}, "torchrun restarted"),
                                        ("worldenv", ["--world-size", "3"], {}, "differs from torchrun's WORLD_SIZE")):
        rc, took = run([train] + args + ["--out", f"{work}/{tag}"] + extra, f"{work}/{tag}.log",
                       dict(env, **env_extra), timeout=60)
        msg = open(f"{work}/{tag}.log").read()
        if rc != 1 or said not in msg:
            fail(f"{tag}: status {rc}:\n{msg}")
        print(f"{tag}: exited 1 after {took:.1f} s: " + [l for l in msg.splitlines() if said in l][0][:160])
    # Three ranks, rank 1 never started and rank 2 refused: rank 0 hears rank 2 while rank 1 is still
    # missing (it read the roll in rank order, and waited out --dist-timeout for rank 1 first).
    rcs, logs, took = run_two(train, args + ["--out", f"{work}/absent1"], work, "absent1",
                              ({}, {"--threads": "-1"}), ranks=(0, 2), world=3)
    texts = [open(l).read() for l in logs]
    if rcs != [1, 1] or "rank 2 refused to start" not in texts[0]:
        fail(f"absent1: status {rcs} after {took:.1f} s (bound {REFUSE_BOUND} s):\n" + "\n".join(texts))
    print(f"absent1: ranks 0 and 2 exited 1 after {took:.1f} s, rank 1 never started: "
          + [l for l in texts[0].splitlines() if "rank 2 refused" in l][0][:200])
    procs, logs = launch_pair(train, args + ["--out", f"{work}/hang", "--dist-timeout", str(HANG_TIMEOUT)], work, "hang")
    wait_for(logs[0], r"step 1/", procs)
    procs[1].send_signal(signal.SIGSTOP)
    stopped = time.time()
    try:
        rc = procs[0].wait(timeout=HANG_TIMEOUT + KILL_BOUND)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        rc = None
    took = time.time() - stopped
    procs[1].kill()
    procs[1].send_signal(signal.SIGCONT)
    procs[1].wait()
    msg = open(logs[0]).read()
    if rc != 1 or "the data-parallel group failed" not in msg:
        fail(f"rank 0 did not give up on a hung rank 1 within {HANG_TIMEOUT + KILL_BOUND} s (status {rc}):\n{msg}")
    print(f"rank 1 hung (SIGSTOP): rank 0 exited {rc} after {took:.2f} s (--dist-timeout {HANG_TIMEOUT}): "
          + [l for l in msg.splitlines() if "error" in l][-1][:220])
    print(f"dist_test failure: PASS in {time.time() - t0:.1f} s")


def main():
    if len(sys.argv) != 6 or sys.argv[5] not in ("equal", "failure"):
        print(__doc__)
        return 2
    train, torchrun, cache, work, what = sys.argv[1:]
    # A fresh folder: a second run would find the first's finished checkpoints (and keep them aside).
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if what == "equal":
        test_equal(train, torchrun, cache, work)
    else:
        test_failure(train, cache, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
