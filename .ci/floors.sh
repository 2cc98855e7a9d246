#!/usr/bin/env bash
# The suite against exactly the declared floors: every runtime dependency of envlink
# installed at the version its `>=` in pyproject.toml names (`==floor` constraints
# generated from pyproject, so a floor raised there is tested at once), on the oldest
# supported Python. The test tools and the optional extras resolve to what fits.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

PY=${ENVLINK_FLOORS_PYTHON:-$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10 \
  2>/dev/null | tail -n 1 || true)}
if [ -z "$PY" ]; then PY=$(command -v python3.10 || command -v python3); fi

CONSTRAINTS=.venv-floors.constraints.txt
python3 - >"$CONSTRAINTS" <<'PYEOF'
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 runs this only if python3 is 3.10
    sys.exit("floors.sh needs python3 >= 3.11 (tomllib) to read pyproject.toml")
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for dep in project["dependencies"]:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)", dep)
    if match is None:
        sys.exit(f"floors.sh: dependency {dep!r} has no >= floor")
    print(f"{match.group(1)}=={match.group(3)}")
PYEOF
echo "floors: $(tr '\n' ' ' <"$CONSTRAINTS")"

rm -rf .venv-floors
"$PY" -m venv .venv-floors
.venv-floors/bin/pip install -q -c "$CONSTRAINTS" -e '.[otlp,prometheus,redis,socks]' \
  pytest pytest-asyncio pytest-timeout hypothesis trustme pyyaml opentelemetry-proto import-linter \
  jsonschema
# Proof that the floors, not newer versions, are what got installed.
.venv-floors/bin/python - "$CONSTRAINTS" <<'PYEOF'
import sys
from importlib.metadata import version

from packaging.version import Version

for line in open(sys.argv[1]):
    name, _, floor = line.strip().partition("==")
    got = version(name)
    assert Version(got) == Version(floor), f"{name}: {got} installed, floor {floor}"
    print(f"   {name} {got}")
PYEOF
# tests/ray needs Ray (its own job), tests/interop the openenv package (.ci/interop.sh),
# tests/ops the ops tools (.ci/ops.sh).
.venv-floors/bin/python -m pytest -q -p no:cacheprovider -x \
  --ignore=tests/ray --ignore=tests/interop --ignore=tests/ops
