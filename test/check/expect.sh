#!/usr/bin/env bash
# expect.sh STATUS PATTERN... -- COMMAND ARGS...: runs COMMAND, fails unless it exits with STATUS
# and every PATTERN (an extended regular expression) matches a line of its stdout + stderr.
# ape-check's own tests (ape_check.cmake) use it: a wrong kernel must fail with a readable table.
set -u
want=$1
shift
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
[ $# -gt 0 ] || { echo "expect.sh: no -- COMMAND" >&2; exit 2; }
shift
out=$("$@" 2>&1)
got=$?
echo "$out"
status=0
if [ "$got" != "$want" ]; then
  echo "expect.sh: exit status $got, expected $want" >&2
  status=1
fi
for p in "${patterns[@]}"; do
  if ! grep -Eq -- "$p" <<<"$out"; then
    echo "expect.sh: no line matches /$p/" >&2
    status=1
  fi
done
exit $status
