#!/usr/bin/env bash
# The one test command: installs the test environment (etcd, kube-apiserver,
# kube-scheduler, kubectl; cached after the first run), then checks formatting and
# lints, runs every test, and fails if any etcd or kube-apiserver outlived the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

AUTONODES_K8S_BIN="$(bash scripts/test-env.sh | tail -n 1)"
export AUTONODES_K8S_BIN
# Helm v4's library for the chart tests (a venv under target/; quick once installed).
AUTONODES_HELM_PYTHON="$(bash scripts/helm-env.sh | tail -n 1)"
export AUTONODES_HELM_PYTHON

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
# A failing test must not end the script here: the leftover check and the totals follow.
set +e
cargo test --all-targets --locked --no-fail-fast 2>&1 | tee target/test-output.txt
status=${PIPESTATUS[0]}
set -e
results=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' target/test-output.txt || true)
passed=$(echo "$results" | awk '{s+=$4} END {print s+0}')
failed=$(echo "$results" | awk '{s+=$6} END {print s+0}')

echo "== leftover processes"
# pgrep matches no name longer than 15 characters in one pattern, so one call per name.
leftover=$(for p in etcd kube-apiserver kube-scheduler; do pgrep -a -x "$p" || true; done)
if [ -n "$leftover" ]; then
  echo "processes outlived the tests:"; echo "$leftover"
  status=1
else
  echo "none"
fi
echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
