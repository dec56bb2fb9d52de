#!/usr/bin/env bash
# Installs Helm's library for the chart tests: PyPI's helm-python-sdk (Helm v4's Go SDK
# behind a C ABI; lint and render with no helm binary) in a virtualenv.
# Idempotent and quick once installed. The venv lives in $AUTONODES_HELM_VENV (default
# target/helm-venv). Prints the venv's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${AUTONODES_HELM_VENV:-$PWD/target/helm-venv}"
PY="$VENV/bin/python"
WANT="helm-python-sdk==0.2.2"

log() { echo "helm-env: $*" >&2; }

if [ -x "$PY" ] && "$PY" -c 'import helm_python' >/dev/null 2>&1; then
  log "cached in $VENV"
  echo "$PY"
  exit 0
fi

if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  log "installing python3-venv"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >&2
fi
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV" >&2
log "installing $WANT"
"$PY" -m pip install -q --disable-pip-version-check "$WANT" >&2
"$PY" -c 'import helm_python; print("helm-env: Helm SDK", helm_python.helm_sdk_version())' >&2
echo "$PY"
