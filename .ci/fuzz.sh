#!/usr/bin/env bash
# Bounded coverage-guided fuzzing (atheris) of the client's frame decoder and the
# reference server's dispatch: a few seconds each in CI. A finding (a foreign
# exception, a crash) fails the run and leaves the input as crash-* in .ops/fuzz/.
# A longer run: FUZZ_SECONDS=3600 bash .ci/fuzz.sh (docs/security.md).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-10}
PY=${ENVLINK_FUZZ_PYTHON:-.venv/bin/python}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
ROOT=$PWD
"$PY" -m pip install -q 'atheris>=2.3'
mkdir -p .ops/fuzz/frames .ops/fuzz/dispatch
for target in frames dispatch; do
  echo "== fuzz_$target for ${SECONDS_EACH}s"
  (cd .ops/fuzz && "$PY" "$ROOT/tests/fuzz/fuzz_$target.py" \
     -max_total_time="$SECONDS_EACH" -rss_limit_mb=1024 -timeout=10 "$target" 2>&1 | tail -n 3)
done
