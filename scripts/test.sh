#!/usr/bin/env bash
# README command 2: install what is missing, build, run every test (lit + GoogleTest).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
scripts/build.sh
build=${APE_BUILD_DIR:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
echo "[ape] running lit and GoogleTest suites"
status=0
(cd "$build" && ctest --output-on-failure -j2 --timeout 1200) || status=$?
echo "[ape] test command finished in $(( $(date +%s) - start )) s"
exit $status
