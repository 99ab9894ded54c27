#!/usr/bin/env bash
# README command 2: install what is missing, build, run every test (lit, GoogleTest with the kill -9
# resume loop, the pytest framework suite of test/python/run.sh, and 60 s of fuzzing apec:
# fuzz/run.sh), print the counts. lit and GoogleTest also run
# with plain `ctest` in the build folder.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh || exit 1
scripts/build.sh || exit 1
build=${APE_BUILD_DIR:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Specs compiled at run time (ape-train --spec, ape.load; runtime/SpecLibrary.h): one cache for the
# tutorial's test (ctest) and the framework suite, so the library the first builds the second reuses.
export APE_CACHE_DIR=${APE_CACHE_DIR:-$(cd "$build" && pwd)/spec-cache}
log="$build/Testing/ape-test.log"
mkdir -p "$build/Testing"

echo "[ape] lit suites (dialect, passes, codegen, tools)"
/usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "$build/test/lit" | tee "$log.lit"
lit_status=${PIPESTATUS[0]}

echo "[ape] GoogleTest suites (kernels against materialised references, template, runtime)"
rm -rf "$build/Testing/gtest"  # the shards' reports (cmake/ApeGTestShards.cmake), written afresh
# Two test processes share the two cores (-j2): with libgomp's default waits an OpenMP thread
# spins at each barrier while the other process holds the core its partner needs (shard 3 of
# ape_kernels_test beside an emulator test: 33.1 s, with passive waits 12.0 s; alone 9.7 vs 10.4 s;
# bench/results/test_time.md).
(cd "$build" && OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} ctest -E '^lit$' --output-on-failure -j2 --timeout 1800) |
  tee "$log.ctest"
ctest_status=${PIPESTATUS[0]}
# This run's shard reports, kept from the rerun of failed tests below (the counts are this run's).
rm -rf "$build/Testing/gtest-run" && cp -r "$build/Testing/gtest" "$build/Testing/gtest-run" 2>/dev/null

echo "[ape] framework suite (apec --emit=torch-library,c-abi built and loaded: pytest, the project's PyTorch)"
test/python/run.sh "$build/framework-tests" "$build/tools/apec" -- -q -rs 2>&1 | tee "$log.pytest"
pytest_status=${PIPESTATUS[0]}

echo "[ape] fuzzing apec for 60 s (fuzz/run.sh: libFuzzer, ASan + UBSan, the seed corpus of examples and lit cases)"
fuzz/run.sh 60 >"$log.fuzz" 2>&1
fuzz_status=$?
grep -E '^\[fuzz\]|^#[0-9]+ *DONE|ERROR|SUMMARY|^stat::(number_of_executed_units|peak_rss_mb)' "$log.fuzz"
fuzz_runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log.fuzz" | grep -oE '[0-9]+$')
if [ "$fuzz_status" -eq 0 ]; then
  fuzz_passed=1 fuzz_failed=0
else
  # What a reader of the CI log needs to reproduce it: the report's stack, the failing input
  # (also kept as build-fuzz/crash-*; `build-fuzz/fuzz/apec-fuzzer FILE` reruns it).
  fuzz_passed=0 fuzz_failed=1
  grep -E '^ *#[0-9]+ 0x|apec_fuzzer:|runtime error' "$log.fuzz" | head -40
  for crash in $(grep -oE "Test unit written to [^ ]+" "$log.fuzz" | awk '{print $NF}'); do
    [ -f "$crash" ] && { echo "[ape] the failing input ($crash), base64:"; base64 "$crash"; }
  done
  tail -15 "$log.fuzz"
fi

# A failed GoogleTest or ctest script is named again here, next to the counts, with the end of its
# output (a long log is often read from its tail), and (up to 20) run once more: whether it fails again tells
# a reader a deterministic failure from one that depends on timing or load. It still counts failed.
if [ "$ctest_status" -ne 0 ]; then
  echo "[ape] failed GoogleTest/ctest cases:"
  sed -n '/The following tests FAILED/,$p' "$log.ctest" | grep -E '^\s+[0-9]+ - ' | head -20
  n_failed=$(sed -n '/The following tests FAILED/,$p' "$log.ctest" | grep -cE '^\s+[0-9]+ - ')
  if [ "$n_failed" -le 20 ]; then
    echo "[ape] run once more, with their output (the failure counts either way):"
    # By name: ctest --rerun-failed goes by test number, which the GoogleTest shards' discovery
    # can shift between runs (it once reran ape_check.help for resume_kill_loop).
    names=$(sed -n '/The following tests FAILED/,$p' "$log.ctest" | grep -E '^\s+[0-9]+ - ' | head -20 |
            sed -E 's/^\s+[0-9]+ - (.*) \([^()]*\)$/\1/' | sed -E 's/[][\.*^$+?(){}|]/\\&/g' | paste -sd'|')
    (cd "$build" && ctest -R "^($names)\$" --output-on-failure --timeout 1800) 2>&1 | tail -60
  fi
fi

# Counts: lit's summary lines and ctest's, folded into one closing line.
lit_passed=$(grep -E '^\s*Passed\s*:' "$log.lit" | grep -oE '[0-9]+' | head -1)
lit_failed=$(grep -E '^\s*Failed\s*:' "$log.lit" | grep -oE '[0-9]+' | head -1)
gt_total=$(grep -oE 'tests failed out of [0-9]+' "$log.ctest" | grep -oE '[0-9]+$')
gt_failed=$(grep -oE '[0-9]+ tests failed out of' "$log.ctest" | grep -oE '^[0-9]+')
gt_skipped=$(grep -c '(Skipped)' "$log.ctest")
lit_passed=${lit_passed:-0}; lit_failed=${lit_failed:-0}
gt_total=${gt_total:-0}; gt_failed=${gt_failed:-0}
# The large GoogleTest suites run in shards of many cases (cmake/ApeGTestShards.cmake): their
# cases are counted from the shards' reports, in place of the shards; a shard that failed without a
# report (it crashed or timed out) counts as one failure. Every other ctest test counts as one.
read -r shard_runs shard_failed_runs case_passed case_failed case_skipped < <(
  /usr/bin/python3 - "$log.ctest" "$build/Testing/gtest-run" <<'PY'
import pathlib, re, sys, xml.etree.ElementTree as ET
log, reports = sys.argv[1], pathlib.Path(sys.argv[2])
status = {}
for m in re.finditer(r"Test +#\d+: (\S+_shard_\d+_of_\d+) .*?(Passed|\*\*\*\S+|Failed|Not Run|Exception)",
                     open(log, errors="replace").read()):
    status[m.group(1)] = m.group(2) == "Passed"
passed = failed = skipped = 0
for name, ok in status.items():
    report = reports / (name + ".xml")
    if not report.exists():
        continue
    for case in ET.parse(report).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
no_report = sum(1 for name, ok in status.items() if not ok and not (reports / (name + ".xml")).exists())
print(len(status), sum(1 for ok in status.values() if not ok), passed, failed + no_report, skipped)
PY
)
shard_passed_runs=$(( ${shard_runs:-0} - ${shard_failed_runs:-0} ))
gt_passed=$(( gt_total - gt_failed - gt_skipped - shard_passed_runs + ${case_passed:-0} ))
gt_failed=$(( gt_failed - ${shard_failed_runs:-0} + ${case_failed:-0} ))
gt_skipped=$(( gt_skipped + ${case_skipped:-0} ))
# pytest's closing line, e.g. "1 failed, 76 passed, 2 skipped in 20.1s"; errors count as failed.
py_summary=$(grep -E '^[0-9]+ (passed|failed|skipped|errors?|deselected)' "$log.pytest" | tail -1)
py_count() { echo "$py_summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
py_passed=$(py_count passed); py_skipped=$(py_count skipped)
py_failed=$(( $(py_count failed) + $(py_count 'errors?') ))
if [ "$pytest_status" -ne 0 ] && [ "$py_failed" -eq 0 ]; then py_failed=1; fi  # build or setup failed
echo "[ape] lit: ${lit_passed} passed, ${lit_failed} failed; GoogleTest and ctest scripts: ${gt_passed} passed, ${gt_failed} failed, ${gt_skipped} skipped (in ${gt_total} ctest runs); pytest: ${py_passed} passed, ${py_failed} failed, ${py_skipped} skipped; fuzz: ${fuzz_runs:-0} inputs, $([ "$fuzz_status" -eq 0 ] && echo "no crash" || echo "FAILED (see $log.fuzz)")"
echo "[ape] test command finished in $(( $(date +%s) - start )) s"
echo "tests: $(( lit_passed + gt_passed + py_passed + fuzz_passed )) passed, $(( lit_failed + gt_failed + py_failed + fuzz_failed )) failed, $(( gt_skipped + py_skipped )) skipped"
if [ "$lit_status" -ne 0 ] || [ "$ctest_status" -ne 0 ] || [ "$pytest_status" -ne 0 ] ||
   [ "$fuzz_status" -ne 0 ] || [ $(( lit_passed + gt_passed )) -eq 0 ]; then
  exit 1
fi
