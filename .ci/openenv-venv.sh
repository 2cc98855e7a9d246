#!/usr/bin/env bash
# Create or update the virtualenv holding the real openenv package (0.10.x).
#
# openenv is large (FastAPI, uvicorn, FastMCP, Gradio, ...), so it lives in its
# own virtualenv, never in envlink's dependencies. Used by .ci/interop.sh (the
# interop suite) and by benchmarks/run.py (OpenEnv's server and client, side by
# side with envlink's). The last line on stdout is the virtualenv's python.
#
# Environment:
#   ENVLINK_PYTHON    interpreter whose version the virtualenv gets
#                     (default: .venv/bin/python if present, else python3)
#   OPENENV_VENV      where to keep the openenv virtualenv (default: .venv-openenv)
#   OPENENV_SPEC      what to install there (default: openenv==0.10.*)
#   OPENENV_PROVIDERS third-party runtime providers installed beside it, for the
#                     interop suite's provider cases (default: openenv-sprites==0.2.0
#                     openenv-openshell==0.1.1, pure-Python wheels; "" for none)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ -z "${ENVLINK_PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then ENVLINK_PYTHON=.venv/bin/python; else ENVLINK_PYTHON=python3; fi
fi
OPENENV_VENV="${OPENENV_VENV:-.venv-openenv}"
OPENENV_SPEC="${OPENENV_SPEC:-openenv==0.10.*}"
OPENENV_PROVIDERS="${OPENENV_PROVIDERS-openenv-sprites==0.2.0 openenv-openshell==0.1.1}"

if [[ ! -x "$OPENENV_VENV/bin/python" ]]; then
    echo "== openenv venv: creating $OPENENV_VENV" >&2
    # The same interpreter version as envlink's (openenv needs Python >= 3.10).
    "$ENVLINK_PYTHON" -m venv "$OPENENV_VENV"
fi
OPENENV_PYTHON="$(cd "$OPENENV_VENV" && pwd)/bin/python"
echo "== openenv venv: installing $OPENENV_SPEC into $OPENENV_VENV" >&2
# The servers under tests/interop/servers need only openenv and its own
# dependencies (fastapi, uvicorn, fastmcp, pydantic, websockets); the providers'
# cloud SDKs are installed with them but never reach a cloud (the tests fake them).
# (This machine's pip config names local indexes that may be absent; drop pip's
# per-package warnings about them.)
# shellcheck disable=SC2086  # OPENENV_PROVIDERS is a list of requirements
timeout 1200 "$OPENENV_PYTHON" -m pip install -q "$OPENENV_SPEC" $OPENENV_PROVIDERS \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
"$OPENENV_PYTHON" -c \
    "import importlib.metadata as m; print('openenv venv: openenv', m.version('openenv'), \
'uvicorn', m.version('uvicorn'), 'fastapi', m.version('fastapi'), 'fastmcp', m.version('fastmcp'))" >&2
echo "$OPENENV_PYTHON"
