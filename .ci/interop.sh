#!/usr/bin/env bash
# Interop suite: envlink against the real openenv package, and OpenEnv's client
# against envlink's reference server.
#
# openenv (0.10.x) is large (FastAPI, uvicorn, FastMCP, Gradio, ...), so it lives in
# its own virtualenv, .venv-openenv/, never in envlink's dependencies. This script
# creates or updates that virtualenv (with .ci/openenv-venv.sh), then runs tests/interop with envlink's own
# interpreter, pointing the suite at the openenv one through ENVLINK_OPENENV_PYTHON.
#
# Environment:
#   ENVLINK_PYTHON    interpreter with envlink[dev] installed
#                     (default: .venv/bin/python if present, else python3)
#   OPENENV_VENV      where to keep the openenv virtualenv (default: .venv-openenv)
#   OPENENV_SPEC      what to install there (default: openenv==0.10.*)
# Extra arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Here the suite must run: an interop test skipped for a missing virtualenv fails.
export ENVLINK_REQUIRE_OPENENV=1

if [[ -z "${ENVLINK_PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then ENVLINK_PYTHON=.venv/bin/python; else ENVLINK_PYTHON=python3; fi
fi
OPENENV_VENV="${OPENENV_VENV:-.venv-openenv}"
OPENENV_SPEC="${OPENENV_SPEC:-openenv==0.10.*}"

if ! "$ENVLINK_PYTHON" -c "import envlink, pytest, pytest_timeout" 2>/dev/null; then
    echo "interop: $ENVLINK_PYTHON lacks envlink[dev]; install it first (pip install -e '.[dev]')" >&2
    exit 2
fi

start=$SECONDS
# Creates or updates the openenv virtualenv; its python is the last line printed.
OPENENV_PYTHON="$(ENVLINK_PYTHON="$ENVLINK_PYTHON" OPENENV_VENV="$OPENENV_VENV" \
    OPENENV_SPEC="$OPENENV_SPEC" bash .ci/openenv-venv.sh | tail -n 1)"
install_seconds=$((SECONDS - start))

start=$SECONDS
echo "== interop: running tests/interop"
status=0
ENVLINK_OPENENV_PYTHON="$OPENENV_PYTHON" \
    timeout 2400 "$ENVLINK_PYTHON" -m pytest tests/interop -p no:cacheprovider "$@" || status=$?
run_seconds=$((SECONDS - start))
echo "== interop: install ${install_seconds}s, tests ${run_seconds}s"

# Exit 5 (no test collected) is a failure here: the suite must really run.
if [[ $status -eq 5 ]]; then
    echo "interop: no test was collected" >&2
    exit 1
fi
exit "$status"
