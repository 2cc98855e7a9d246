#!/usr/bin/env bash
# The training-framework suite: TRL's real GRPOTrainer, OpenEnv's harness rollout function
# and the envlink.integrations tests, in a virtualenv of their own (torch, TRL,
# transformers and openenv are large; they never go into envlink's dev environment).
#
# torch is pinned to the CPU build on purpose: an unpinned torch pulls a multi-GB CUDA
# build. ENVLINK_REQUIRE_TRL=1 makes a missing framework a failure, not a skip.
#
# Environment:
#   TRL_PYTHON   interpreter for the virtualenv (default: a Python 3.11, else python3)
#   TRL_VENV     where to keep it (default: .venv-trl)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ -z "${TRL_PYTHON:-}" ]]; then
    TRL_PYTHON=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11*/bin/python3.11 2>/dev/null \
        | tail -n 1 || true)
    if [[ -z "$TRL_PYTHON" ]]; then TRL_PYTHON=$(command -v python3.11 || command -v python3); fi
fi
TRL_VENV="${TRL_VENV:-.venv-trl}"

if [[ ! -x "$TRL_VENV/bin/python" ]]; then
    echo "== trl venv: creating $TRL_VENV with $TRL_PYTHON" >&2
    "$TRL_PYTHON" -m venv "$TRL_VENV"
fi
# (This machine's pip config names local indexes that may be absent; drop pip's
# per-package warnings about them.)
quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
echo "== trl venv: torch (CPU), then envlink[dev,trl], openenv and aiohttp" >&2
quiet timeout 1800 "$TRL_VENV/bin/pip" install -q "torch==2.13.0"
# aiohttp: TRL's async rollout loop (tests/integrations/test_trl_harness_worker.py) needs it.
quiet timeout 1800 "$TRL_VENV/bin/pip" install -q -e '.[dev,trl]' 'openenv==0.10.*' aiohttp
"$TRL_VENV/bin/python" -c "import importlib.metadata as m; print('trl venv:', \
', '.join(f'{p} {m.version(p)}' for p in ('torch', 'trl', 'transformers', 'openenv', 'aiohttp')))" >&2

echo "== envlink.integrations with TRL and openenv installed (nothing downloaded from a hub)"
HF_HUB_OFFLINE=1 ENVLINK_REQUIRE_TRL=1 "$TRL_VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integrations
