#!/usr/bin/env bash
# verifiers 0.4: OpenEnv's taskset on envlink (taskset id envlink-openenv), under the real
# verifiers package, in a virtualenv of its own (verifiers brings openai, mcp, numpy and
# more; they never go into envlink's dev environment). ENVLINK_REQUIRE_VERIFIERS=1 makes a
# missing verifiers a failure, not a skip.
#
# Environment:
#   VERIFIERS_PYTHON  interpreter for the virtualenv (default: python3)
#   VERIFIERS_VENV    where to keep it (default: .venv-verifiers)
#   VERIFIERS_SPEC    what to install (default: verifiers==0.4.*)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

VERIFIERS_PYTHON="${VERIFIERS_PYTHON:-python3}"
VERIFIERS_VENV="${VERIFIERS_VENV:-.venv-verifiers}"
VERIFIERS_SPEC="${VERIFIERS_SPEC:-verifiers==0.4.*}"

if [[ ! -x "$VERIFIERS_VENV/bin/python" ]]; then
    echo "== verifiers venv: creating $VERIFIERS_VENV with $VERIFIERS_PYTHON" >&2
    "$VERIFIERS_PYTHON" -m venv "$VERIFIERS_VENV"
fi
# (This machine's pip config names local indexes that may be absent; drop pip's
# per-package warnings about them.)
quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
quiet timeout 1200 "$VERIFIERS_VENV/bin/pip" install -q -e . "$VERIFIERS_SPEC" \
    'pytest>=8' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
"$VERIFIERS_VENV/bin/python" -c "import importlib.metadata as m, sys; print('verifiers venv: \
python', sys.version.split()[0] + ',', 'verifiers', m.version('verifiers'))" >&2

echo "== envlink.integrations.verifiers with the real verifiers"
ENVLINK_REQUIRE_VERIFIERS=1 "$VERIFIERS_VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integrations/test_verifiers.py "$@"
