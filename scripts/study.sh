#!/usr/bin/env bash
# The extrapolation study (docs/study.md): every seed encoding trained with one config on pg30,
# evaluated at 1x..16x its training length, the inference-time variants, and the report
# (table, CSV, plot, the seeds' claims with verdicts). Arguments go to the driver,
# scripts/study.py (--help lists them): `scripts/study.sh --quick` for CI, `scripts/study.sh
# --threads 1 --publish bench/results` for the committed study. Rerunning skips finished runs.
# APE_STUDY_NO_BUILD=1 uses the tools already in the build folder (the ctest does).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${APE_BUILD_DIR:-build}
needs_build=1
for a in "$@"; do
  case "$a" in -h|--help|--report-only|--list|--dry-run|--write-specs) needs_build=0 ;; esac
done
if [ "$needs_build" = 1 ] && [ -z "${APE_STUDY_NO_BUILD:-}" ]; then
  /usr/bin/python3 scripts/study.py --check-args "$@"  # bad arguments fail before the build
  scripts/install-deps.sh >/dev/null
  scripts/build.sh ape-train ape-eval >&2
fi
export APE_BUILD_DIR="$build"
exec /usr/bin/python3 scripts/study.py "$@"
