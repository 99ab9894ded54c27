#!/usr/bin/env python3
"""The study's intervals and verdicts (scripts/study.py: Quantity, Claims.verdict) against values
computed here by hand from a small made-up table: the mean over seeds, Student's t over the seeds,
the evaluation tokens' standard error from paired per-segment differences, and each verdict rule."""
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import study  # noqa: E402


def row(loss, segs=None):
    return {"loss": f"{loss}", "segments": ";".join(f"{x}" for x in segs) if segs else "", "note": ""}


def table_of(cells):
    """{(enc, seed, variant, multiple): (loss, segments)} -> the driver's {(run, variant): {m: row}}."""
    t = {}
    for (enc, seed, var, m), (loss, segs) in cells.items():
        t.setdefault((f"{enc}-s{seed}", var), {})[m] = row(loss, segs)
    return t


class QuantityTest(unittest.TestCase):
    def test_growth_over_three_seeds_with_segments(self):
        # growth at 4x = loss(4x) - loss(1x), seeds 1, 2, 3; two segments each.
        cells = {}
        seg1 = {1: [4.0, 5.0], 2: [4.1, 5.1], 3: [3.9, 5.3]}
        seg4 = {1: [4.3, 5.5], 2: [4.2, 5.4], 3: [4.4, 5.6]}
        for s in (1, 2, 3):
            cells[("rope", s, "trained", 1)] = (statistics.fmean(seg1[s]), seg1[s])
            cells[("rope", s, "trained", 4)] = (statistics.fmean(seg4[s]), seg4[s])
        q = study.Quantity(table_of(cells), [1, 2, 3], [(1, "rope", "trained", 4), (-1, "rope", "trained", 1)])
        growth = [statistics.fmean(seg4[s]) - statistics.fmean(seg1[s]) for s in (1, 2, 3)]
        self.assertEqual(q.n, 3)
        self.assertAlmostEqual(q.mean, statistics.fmean(growth))
        se_seeds = statistics.stdev(growth) / math.sqrt(3)
        # Per segment: the growth averaged over the seeds, then its standard error over 2 segments.
        per_b = [statistics.fmean(seg4[s][b] - seg1[s][b] for s in (1, 2, 3)) for b in (0, 1)]
        se_tok = statistics.stdev(per_b) / math.sqrt(2)
        self.assertAlmostEqual(q.se_seeds, se_seeds)
        self.assertAlmostEqual(q.se_tokens, se_tok)
        a, b = se_seeds ** 2, se_tok ** 2
        df = (a + b) ** 2 / (a * a / 2 + b * b / 1)  # Welch-Satterthwaite: 2 and 1 degrees of freedom
        self.assertAlmostEqual(q.df, df)
        self.assertAlmostEqual(q.half, study.t95(df) * math.sqrt(a + b))  # at df itself, not rounded

    def test_a_token_term_from_many_segments_has_their_degrees_of_freedom(self):
        # Three seeds that agree closely, 16 noisy segments: the token term dominates, so the
        # interval takes t with about 15 degrees of freedom, not the seeds' 2.
        base = [4.0 + 0.3 * math.sin(7 * b) for b in range(16)]
        cells = {}
        for s, shift in ((1, 0.100), (2, 0.101), (3, 0.099)):
            segs = [x + shift + 0.05 * math.cos(3 * b) for b, x in enumerate(base)]
            cells[("x", s, "trained", 4)] = (statistics.fmean(segs), segs)
            cells[("x", s, "trained", 1)] = (statistics.fmean(base), base)
        q = study.Quantity(table_of(cells), [1, 2, 3], [(1, "x", "trained", 4), (-1, "x", "trained", 1)])
        self.assertGreater(q.se_tokens, 10 * q.se_seeds)
        self.assertGreaterEqual(int(q.df), 14)
        self.assertLessEqual(q.df, 17)
        self.assertAlmostEqual(q.half, study.t95(q.df) * math.sqrt(q.se_seeds ** 2 + q.se_tokens ** 2))
        self.assertLess(q.half, 4.303 * math.sqrt(q.se_seeds ** 2 + q.se_tokens ** 2) / 1.8)

    def test_missing_cells_and_one_seed(self):
        cells = {("a", 1, "trained", 1): (4.0, None), ("b", 1, "trained", 1): (4.5, None),
                 ("a", 2, "trained", 1): (4.1, None)}  # b has no seed 2
        q = study.Quantity(table_of(cells), [1, 2], [(1, "b", "trained", 1), (-1, "a", "trained", 1)])
        self.assertEqual(q.n, 1)
        self.assertAlmostEqual(q.mean, 0.5)
        self.assertIsNone(q.half)  # one seed and no segments: no interval
        self.assertIn("1 seed", q.text())
        empty = study.Quantity(table_of(cells), [1, 2], [(1, "c", "trained", 1)])
        self.assertIsNone(empty.mean)
        self.assertEqual(empty.text(), "—")

    def test_seeds_with_other_segment_counts_are_refused(self):
        # (the first seed's count had indexed past a shorter one's, or dropped a longer one's extra)
        cells = {("x", 1, "trained", 1): (4.0, [4.0, 4.1]), ("x", 2, "trained", 1): (4.1, [4.0, 4.1, 4.2])}
        with self.assertRaises(SystemExit):
            study.Quantity(table_of(cells), [1, 2], [(1, "x", "trained", 1)])

    def test_token_only_interval_for_one_checkpoint(self):
        segs_a, segs_b = [5.0, 5.2, 4.9, 5.1], [4.9, 5.15, 4.85, 5.0]
        cells = {("m", 1, "trained", 16): (statistics.fmean(segs_a), segs_a),
                 ("m", 1, "v", 16): (statistics.fmean(segs_b), segs_b)}
        q = study.Quantity(table_of(cells), [1], [(1, "m", "v", 16), (-1, "m", "trained", 16)], token_only=True)
        d = [b - a for a, b in zip(segs_a, segs_b)]
        self.assertAlmostEqual(q.mean, statistics.fmean(d))
        self.assertAlmostEqual(q.half, 3.182446 * statistics.stdev(d) / 2, places=6)  # t(3) over 4 segments


class VerdictTest(unittest.TestCase):
    def judge(self, mean, half, kind, n=3):
        q = study.Quantity({}, [], [])
        q.mean, q.half, q.n = mean, half, n
        return study.Claims(dict(study.PRESETS["full"]), {}).verdict(q, kind)

    def test_rules(self):
        self.assertEqual(self.judge(-0.10, 0.05, "less"), "agrees")
        self.assertEqual(self.judge(0.10, 0.05, "less"), "disagrees")
        self.assertEqual(self.judge(-0.02, 0.05, "less"), "inconclusive")
        # A direction confirmed within ±FLAT is small; an interval within ±FLAT either way, negligible.
        self.assertEqual(self.judge(-0.02, 0.01, "less"), "agrees (small)")
        self.assertEqual(self.judge(0.02, 0.01, "greater"), "agrees (small)")
        self.assertEqual(self.judge(0.00, 0.02, "less"), "negligible")
        self.assertEqual(self.judge(0.02, 0.01, "less"), "disagrees (small)")
        self.assertEqual(self.judge(-0.02, 0.01, "greater"), "disagrees (small)")
        # "Does not help": agrees above -FLAT, disagrees below it.
        self.assertEqual(self.judge(0.00, 0.02, "no_gain"), "agrees")
        self.assertEqual(self.judge(0.30, 0.02, "no_gain"), "agrees")
        self.assertEqual(self.judge(-0.10, 0.02, "no_gain"), "disagrees")
        self.assertEqual(self.judge(-0.04, 0.03, "no_gain"), "inconclusive")
        self.assertEqual(self.judge(0.10, 0.05, "greater"), "agrees")
        self.assertEqual(self.judge(-0.10, 0.05, "greater"), "disagrees")
        self.assertEqual(self.judge(0.01, 0.02, "flat"), "agrees")      # below FLAT = 0.05 throughout
        self.assertEqual(self.judge(0.02, 0.01, "flat"), "agrees (rise < 0.05)")  # a rise, but a small one
        self.assertEqual(self.judge(0.20, 0.05, "flat"), "disagrees")
        self.assertEqual(self.judge(0.04, 0.03, "flat"), "inconclusive")
        self.assertEqual(self.judge(0.00, 0.04, "same"), "agrees")
        self.assertEqual(self.judge(0.09, 0.03, "same"), "disagrees")
        self.assertEqual(self.judge(0.04, 0.03, "same"), "inconclusive")
        self.assertEqual(self.judge(-0.5, 0.01, "less", n=2), "too few seeds (2 of 3)")
        self.assertEqual(self.judge(None, None, "less", n=0), "not yet run")

    def test_t_quantiles(self):
        # Published two-sided 95% quantiles (6 digits), and between whole degrees of freedom (Welch and
        # Satterthwaite's are not whole: a table rounded down had made row 37's interval a third wider).
        for df, t in ((1, 12.706205), (2, 4.302653), (3, 3.182446), (5, 2.570582), (11, 2.200985),
                      (30, 2.042272), (100, 1.983972), (1e6, 1.959966)):
            self.assertAlmostEqual(study.t95(df), t, places=5)
        self.assertLess(study.t95(2.953), study.t95(2))
        self.assertGreater(study.t95(2.953), study.t95(3))
        self.assertAlmostEqual(study.t95(2.953), 3.2113, places=3)


class LockTest(unittest.TestCase):
    def test_a_run_held_by_another_driver_is_skipped(self):
        with tempfile.TemporaryDirectory() as out:
            args = type("A", (), dict(dry_run=False, out=out))()
            runner = study.Runner.__new__(study.Runner)
            runner.args = args
            run = study.Run("rope", 1234)
            os.makedirs(os.path.join(out, "runs"))
            # Another process holds the run's lock (as a second driver, or `flock`, would).
            holder = subprocess.Popen(["flock", os.path.join(out, "runs", "rope-s1234.lock"), "sleep", "30"],
                                      start_new_session=True)
            try:
                for _ in range(100):
                    with runner.run_lock(run) as mine:
                        if not mine:
                            break
                    time.sleep(0.05)
                self.assertFalse(mine)
            finally:
                os.killpg(holder.pid, 9)  # flock and the sleep that inherited the lock
                holder.wait()
            for _ in range(100):  # the killed sleep's lock goes with it
                with runner.run_lock(run) as mine:
                    if mine:
                        break
                time.sleep(0.05)
            self.assertTrue(mine)


class PlanTest(unittest.TestCase):
    def test_full_plan_gives_the_claims_three_seeds_first(self):
        cfg = dict(study.PRESETS["full"])
        runs = study.plan(cfg)
        ids = [r.id for r in runs]
        self.assertEqual(len(ids), len(set(ids)))
        for e in study.SEEDED:
            for s in cfg["seeds"]:
                self.assertIn(f"{e}-s{s}", ids)
        n, A, B = len(cfg["seeds"]), study.SEEDED_FIRST, [e for e in study.SEEDED if e not in study.SEEDED_FIRST]
        w = len(cfg["lr_sweep"])
        i = 0

        def take(count):
            nonlocal i
            out = runs[i:i + count]
            i += count
            return out
        # The headline group seed by seed, the transition's model, the other seeded encodings seed by
        # seed: every claim's runs with every seed before the sweep.
        self.assertEqual([r.id for r in take(len(A) * n)], [f"{e}-s{s}" for s in cfg["seeds"] for e in A])
        t = take(1)[0]
        self.assertEqual((t.tag, t.layers), (study.TRANSITION_TAG, 6))
        self.assertEqual(len(study.variants_of(t, cfg)), len(cfg["transition"]["settings"]))
        self.assertEqual([r.id for r in take(len(B) * n)], [f"{e}-s{s}" for s in cfg["seeds"] for e in B])
        # Each RoPE model fine-tuned at 2L with PI and without, from its own checkpoint.
        ft = take(2 * n)
        self.assertEqual([r.tag for r in ft], [study.PI_FT_TAG] * n + [study.ROPE_FT_TAG] * n)
        self.assertEqual([r.init for r in ft], [f"rope-s{s}" for s in cfg["seeds"]] * 2)
        self.assertEqual(ft[0].encoding, "rope_pi")
        self.assertEqual(ft[0].sets, {"rope_factor": 2})
        self.assertEqual(ft[n].sets, {})
        self.assertTrue(all(r.seq_len == 2 * cfg["seq_len"] and r.steps == 200 for r in ft))
        # The sinusoidal baseline at 2L with every seed (the same steps and batches: twice the tokens).
        two_l = take(n)
        self.assertTrue(all(r.tag == study.TWO_L_TAG and r.seq_len == 2 * cfg["seq_len"]
                            and r.steps is None for r in two_l))
        # The transition's model with the other seeds.
        self.assertEqual([(r.tag, r.seed, r.layers) for r in take(n - 1)],
                         [(study.TRANSITION_TAG, s, 6) for s in cfg["seeds"][1:]])
        # The sweep (first seed, each other rate; judged on the validation books), then the rest.
        sw = take((len(A) + len(B)) * w)
        self.assertEqual([r.tag for r in sw], [f"{e}_lr{lr:g}" for e in A + B for lr in (0.0015, 0.006)])
        self.assertTrue(all(r.seed == 1234 and not r.main for r in sw))
        self.assertEqual([v[0] for v in study.variants_of(sw[0], cfg)], ["valid"])
        self.assertTrue(all(r.encoding not in study.SEEDED and r.seed == 1234 for r in runs[i:]))
        # A run at 2L is evaluated at the study's lengths from 2L on: the same longest length.
        self.assertEqual(study.eval_multiples(cfg, two_l[0]), [1, 2, 4, 8])
        self.assertEqual(study.eval_multiples(cfg, runs[0]), cfg["multiples"])

    def test_a_chosen_rate_of_any_group_gives_no_duplicate_runs(self):
        cfg = dict(study.PRESETS["full"])
        for chosen in ({"exqpe": 0.006}, {"rope": 0.0015, "kcable": 0.006}):
            ids = [r.id for r in study.plan(cfg, chosen)]
            self.assertEqual(len(ids), len(set(ids)), chosen)

    def test_a_diverged_sweep_run_loses(self):
        cfg = dict(study.PRESETS["full"])
        cells = {("rope", 1234, "valid", 1): (4.60, None), ("rope_lr0.0015", 1234, "valid", 1): (4.70, None)}
        t = table_of(cells)
        # As Runner.train records a diverged run, through collect().
        t.update(study.collect([dict(run="rope_lr0.006-s1234", encoding="rope", seed="1234", variant="trained",
                                     evaluated="rope", settings="", multiple="", note="training diverged; see x")])[0])
        self.assertTrue(study.diverged(t, "rope_lr0.006-s1234"))
        self.assertEqual(study.chosen_lrs(cfg, t), {"rope": 0.003})

    def test_the_sweep_chooses_by_the_validation_books_and_the_plan_follows(self):
        cfg = dict(study.PRESETS["full"])
        # rope: 6e-3 is best on the validation books (its test-book losses say otherwise: ignored).
        cells = {("rope", 1234, "valid", 1): (4.60, None), ("rope_lr0.0015", 1234, "valid", 1): (4.70, None),
                 ("rope_lr0.006", 1234, "valid", 1): (4.55, None), ("rope", 1234, "trained", 1): (4.0, None),
                 ("cable", 1234, "valid", 1): (4.6, None)}  # cable: its sweep has not finished
        chosen = study.chosen_lrs(cfg, table_of(cells))
        self.assertEqual(chosen, {"rope": 0.006})
        self.assertEqual(study.run_tag(cfg, chosen, "rope"), "rope_lr0.006")
        self.assertEqual(study.run_tag(cfg, chosen, "cable"), "cable")
        self.assertEqual(study.run_tag(cfg, chosen, study.PI_FT_TAG), "rope_pi_ft_lr0.006")
        runs = study.plan(cfg, chosen)
        ids = [r.id for r in runs]
        self.assertEqual(ids[0], "rope_lr0.006-s1234")  # the sweep's run is the first seed's main run
        self.assertIn("rope_lr0.006-s2025", ids)
        self.assertNotIn("rope-s2025", ids)
        self.assertEqual(len(ids), len(set(ids)))
        main = runs[0]
        self.assertTrue(main.main)
        self.assertEqual(main.lr, 0.006)
        self.assertEqual([v[0] for v in study.variants_of(main, cfg)], ["pi", "ntk", "yarn", "dynamic_ntk", "valid"])
        ft = next(r for r in runs if r.tag == "rope_pi_ft_lr0.006")
        self.assertEqual(ft.init, "rope_lr0.006-s1234")
        self.assertAlmostEqual(ft.lr, 0.0006)
        # The claims read the chosen rate's runs once they have as many seeds as the preset's rate
        # has (its other seeds train after the sweep): never fewer seeds for a claim.
        claims = study.Claims(cfg, table_of(cells))
        self.assertEqual(claims.tag("rope"), "rope")
        more = dict(cells)
        more[("rope_lr0.006", 1234, "trained", 1)] = (4.5, None)
        self.assertEqual(study.Claims(cfg, table_of(more)).tag("rope"), "rope_lr0.006")
        more[("rope", 4321, "trained", 1)] = (4.6, None)
        self.assertEqual(study.Claims(cfg, table_of(more)).tag("rope"), "rope")
        more[("rope_lr0.006", 4321, "trained", 1)] = (4.5, None)
        self.assertEqual(study.judged_lrs(cfg, table_of(more)), {"rope": 0.006})
        # With the runs' final training losses, the sweep's choice stands only where its seeds'
        # mean is lower at that rate too (the first seed's margin can be noise); else the preset's.
        final = {"rope-s1234": 4.30, "rope-s4321": 4.29, "rope_lr0.006-s1234": 4.28, "rope_lr0.006-s4321": 4.49}
        self.assertEqual(study.judged_lrs(cfg, table_of(more), final), {})
        self.assertEqual(study.Claims(cfg, table_of(more), final).tag("rope"), "rope")
        final["rope_lr0.006-s4321"] = 4.27
        self.assertEqual(study.judged_lrs(cfg, table_of(more), final), {"rope": 0.006})
        # The study's runs hold what the report judges: where the preset's rate is judged (its seeds'
        # mean won), its runs are in the plan beside the chosen rate's (the status counts them,
        # --list lists them, --retrain-missing retrains them); else the chosen rate's alone.
        final["rope_lr0.006-s4321"] = 4.49
        ids = [r.id for r in study.study_plan(cfg, table_of(more), final)]
        self.assertIn("rope-s2025", ids)
        self.assertIn("rope_lr0.006-s2025", ids)
        self.assertIn("rope_pi_ft-s1234", ids)
        self.assertEqual(len(ids), len(set(ids)))
        final["rope_lr0.006-s4321"] = 4.27
        self.assertNotIn("rope-s2025", [r.id for r in study.study_plan(cfg, table_of(more), final)])
        self.assertEqual(study.final_losses([{"run": "a-s1", "final_loss": "4.5"}, {"run": "b-s1", "final_loss": ""}]),
                         {"a-s1": 4.5})

    def test_generated_specs(self):
        text = study.expe_rule_spec(study.PRESETS["full"])
        self.assertIn("l = 16,", text)
        self.assertIn("theta = 0.00390625 : f64", text)  # 1/(2 * 128)
        self.assertEqual(study.transition_name(0.3, 2), "transition_b0p3_i2")
        spec = study.transition_spec("transition_b0p3_i2", 0.3, 2)
        self.assertIn("ape.encoding @rope_transition_b0p3_i2 {", spec)
        self.assertIn("intervals = 2,", spec)
        self.assertIn("beta = 0.3 : f64", spec)


class SeedTest(unittest.TestCase):
    def test_seed_from_a_published_report(self):
        # --seed-from DIR: an empty study folder gets DIR's rows; one with results.csv is left alone.
        with tempfile.TemporaryDirectory() as d:
            pub, out = os.path.join(d, "pub"), os.path.join(d, "out")
            os.makedirs(pub)
            rows = [{"run": "rope-s1", "encoding": "rope", "seed": "1", "variant": "trained", "evaluated": "rope",
                     "train_len": "128", "eval_len": "128", "multiple": "1", "loss": "4.5"}]
            study.write_rows(os.path.join(pub, "study.csv"), study.RESULT_FIELDS, rows)
            study.write_rows(os.path.join(pub, "study_train.csv"), study.TRAIN_FIELDS,
                             [{"run": "rope-s1", "encoding": "rope", "seed": "1", "steps": "2000"}])
            os.makedirs(out)
            args = type("Args", (), {"seed_from": pub, "out": out, "dry_run": False})()
            full = dict(study.PRESETS["full"])
            study.seed_study(args, full)
            self.assertEqual([r["loss"] for r in study.read_rows(os.path.join(out, "results.csv"))], ["4.5"])
            self.assertEqual([r["steps"] for r in study.read_rows(os.path.join(out, "train.csv"))], ["2000"])
            rows[0]["loss"] = "9.9"
            study.write_rows(os.path.join(pub, "study.csv"), study.RESULT_FIELDS, rows)
            study.seed_study(args, full)  # results.csv exists: untouched
            self.assertEqual([r["loss"] for r in study.read_rows(os.path.join(out, "results.csv"))], ["4.5"])
            # Another preset's rows (the full preset's L = 128 into a quick study, L = 16) are refused.
            quick_out = os.path.join(d, "quick")
            os.makedirs(quick_out)
            args.out = quick_out
            with self.assertRaises(SystemExit):
                study.seed_study(args, dict(study.PRESETS["quick"]))
            self.assertFalse(os.path.exists(os.path.join(quick_out, "results.csv")))
            args.seed_from = os.path.join(d, "nowhere")
            with self.assertRaises(SystemExit):
                study.seed_study(args, full)


class CsvTest(unittest.TestCase):
    def test_a_row_cut_short_or_a_bad_multiple_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "results.csv")
            row = {"run": "rope-s1", "encoding": "rope", "seed": "1", "variant": "trained", "evaluated": "rope",
                   "train_len": "128", "eval_len": "128", "multiple": "1", "loss": "4.5"}
            study.write_rows(path, study.RESULT_FIELDS, [row, dict(row, multiple="2", eval_len="256")])
            self.assertEqual(len(study.read_rows(path)), 2)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:  # the last row cut after its loss
                f.write(text[: text.rindex("4.5") + 3] + "\n")
            with self.assertRaises(SystemExit):
                study.read_rows(path)
            study.write_rows(path, study.RESULT_FIELDS, [dict(row, segments="12")])
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:  # the last field cut inside ("12" to "1"): every field there
                f.write(text[: text.rindex("12") + 1])
            with self.assertRaises(SystemExit):
                study.read_rows(path)
            study.write_rows(path, study.RESULT_FIELDS, [dict(row, multiple="2.0")])
            with self.assertRaises(SystemExit):
                study.read_rows(path)
            # A NaN or inf loss or segment is refused (it reached the statistics: a crash).
            for bad in (dict(row, loss="nan"), dict(row, loss="inf"), dict(row, segments="4.1;nan")):
                study.write_rows(path, study.RESULT_FIELDS, [bad])
                with self.assertRaises(SystemExit):
                    study.read_rows(path)

    def test_a_non_finite_evaluation_is_a_result(self):
        note = study.NONFINITE_NOTE + ": the model computes NaN or inf at this length"
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "results.csv")
            fields = ["train_len", "eval_len", "loss", "ppl", "tokens", "note", "segment_losses"]
            ok = {"train_len": "128", "eval_len": "128", "loss": "4.5", "note": "", "segment_losses": "4.4;4.6"}
            # (the non-finite cell's segments as an earlier ape-train wrote them: NaN among them)
            study.write_rows(path, fields, [ok, dict(ok, eval_len="2048", loss="", note=note,
                                                     segment_losses="4.6;nan;-nan;inf")])
            self.assertTrue(study.nonfinite_result(path))
            study.write_rows(path, fields, [ok])  # all finite: the failure was something else
            self.assertFalse(study.nonfinite_result(path))
        # In the claims: the seed with the non-finite cell is named, not "too few seeds".
        cells = {("a", s, "trained", m): (4.0 + 0.1 * s + m / 100, None) for s in (1, 2, 3) for m in (1, 16)}
        t = table_of(cells)
        t[("a-s2", "trained")][16] = {"loss": "", "segments": "", "note": note}
        q = study.Quantity(t, [1, 2, 3], [(1, "a", "trained", 16), (-1, "a", "trained", 1)])
        self.assertEqual(q.n, 2)
        self.assertEqual(q.nonfinite, [2])
        self.assertTrue(study.nonfinite_of(t, "a-s2", "trained", 16))
        self.assertFalse(study.nonfinite_of(t, "a-s1", "trained", 16))


if __name__ == "__main__":
    unittest.main()
