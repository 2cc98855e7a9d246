#!/usr/bin/env bash
# SkyRL: envlink's text environment under the real skyrl-gym, in a virtualenv of its own.
#
# SkyRL's trainer needs Python >= 3.12, so its users run 3.12: the virtualenv is made with
# 3.12 where the machine has it. skyrl-gym brings pandas and omegaconf; they never go
# into envlink's dev environment. ENVLINK_REQUIRE_SKYRL=1 makes a missing skyrl-gym a
# failure, not a skip.
#
# Environment:
#   SKYRL_PYTHON  interpreter for the virtualenv (default: a Python 3.12, else python3)
#   SKYRL_VENV    where to keep it (default: .venv-skyrl)
#   SKYRL_SPEC    what to install (default: skyrl-gym==0.4.*)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ -z "${SKYRL_PYTHON:-}" ]]; then
    SKYRL_PYTHON=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null \
        | tail -n 1 || true)
    if [[ -z "$SKYRL_PYTHON" ]]; then SKYRL_PYTHON=$(command -v python3.12 || command -v python3); fi
fi
SKYRL_VENV="${SKYRL_VENV:-.venv-skyrl}"
SKYRL_SPEC="${SKYRL_SPEC:-skyrl-gym==0.4.*}"

if [[ ! -x "$SKYRL_VENV/bin/python" ]]; then
    echo "== skyrl venv: creating $SKYRL_VENV with $SKYRL_PYTHON" >&2
    "$SKYRL_PYTHON" -m venv "$SKYRL_VENV"
fi
# (This machine's pip config names local indexes that may be absent; drop pip's
# per-package warnings about them.)
quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
quiet timeout 1200 "$SKYRL_VENV/bin/pip" install -q -e . "$SKYRL_SPEC" \
    'pytest>=8' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
"$SKYRL_VENV/bin/python" -c "import importlib.metadata as m, sys; print('skyrl venv: python', \
sys.version.split()[0] + ',', 'skyrl-gym', m.version('skyrl-gym'))" >&2

echo "== envlink.integrations.skyrl with the real skyrl-gym"
ENVLINK_REQUIRE_SKYRL=1 "$SKYRL_VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integrations/test_skyrl.py tests/integrations/test_skyrl_gym.py "$@"
