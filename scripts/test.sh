#!/usr/bin/env bash
# The one test command: installs the test environment (etcd, kube-apiserver,
# kube-scheduler, kubectl, kubelet, kubeadm, kube-controller-manager, and where /dev/kvm
# exists the real guests' images; cached after the first run), then checks formatting and
# lints, runs every test, and fails if a process the tests started outlived them. It
# looks only at processes the tests recorded (target/test-pids), never at anybody else's.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean checkout gains nothing from incremental artefacts; they doubled target/'s size.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
echo "== disk: $(df -h . | awk 'NR==2 {print $4}') free"

AUTONODES_K8S_BIN="$(bash scripts/test-env.sh | tail -n 1)"
export AUTONODES_K8S_BIN
# Helm v4's library for the chart tests (a venv under target/; quick once installed).
AUTONODES_HELM_PYTHON="$(bash scripts/helm-env.sh | tail -n 1)"
export AUTONODES_HELM_PYTHON
# mdBook for the book's build test (tests/it/docs.rs; built from crates.io once, then cached).
AUTONODES_MDBOOK="$(bash scripts/docs-tools.sh | tail -n 1)"
export AUTONODES_MDBOOK
# cloud-init (schema checks), buildah, podman and runc (the image test) from Debian.
bash scripts/test-tools.sh || echo "== test tools not installed: the tests that need them say so"
# The real guests' disk images (Debian via debootstrap, cached after the first run) where
# /dev/kvm exists; the real-guest test (tests/it/real_guest.rs) boots them. Without /dev/kvm it skips, and a
# failed build here only says so (the tests run the script themselves and show its error).
if [ -e /dev/kvm ]; then
  guest_started=$SECONDS
  if AUTONODES_GUEST_DIR="$(bash scripts/guest-image.sh | tail -n 1)"; then
    export AUTONODES_GUEST_DIR
    echo "== guest images in $AUTONODES_GUEST_DIR ($((SECONDS - guest_started)) s)"
  else
    unset AUTONODES_GUEST_DIR
    echo "== guest images not built: the real-guest tests will say why"
  fi
fi

# Where the run's time goes, printed at its end: "<phase> <seconds>" per phase.
phases=""
phase_started=0
phase_done() { # $1: the phase that just ended
  phases="${phases}$1 $((SECONDS - phase_started)) s, "
  phase_started=$SECONDS
}
phase_done "tools and images"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
phase_done "fmt and clippy"
echo "== cargo doc (intra-doc links)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --locked -q
phase_done "doc"
# Every process the tests start is recorded here (pid and start time; crates/autonodes-testenv/src/testenv.rs).
AUTONODES_TEST_PIDS="$(pwd)/target/test-pids"
rm -rf "$AUTONODES_TEST_PIDS"
mkdir -p "$AUTONODES_TEST_PIDS"
export AUTONODES_TEST_PIDS

echo "== cargo test"
# Each Go process the tests start (etcd, kube-apiserver, the other components) runs on one
# core: both cores are busy with two lanes of tests, and Go's idle workers spinning for
# work cost about 5% of the API servers' CPU. The environment's own GOMAXPROCS wins.
export GOMAXPROCS="${GOMAXPROCS:-1}"
rm -f target/chaos-report.txt
# A failing test must not end the script here: the leftover check and the totals follow.
set +e
# Every test binary is built first, then run in two lanes side by side
# (scripts/lib/test-lanes.sh): most of them wait on API servers far more than they compute.
# `--tests`: the unit and integration tests; the benchmarks are not run here, and clippy
# above already compiled them (--all-targets).
cargo test --workspace --tests --locked --no-run --message-format=json-render-diagnostics \
  > target/test-binaries.json
status=$?
phase_done "test build"
: > target/test-output.txt
if [ "$status" -eq 0 ]; then
  # The image's static binary, once, from the dependencies just built (scripts/image.sh;
  # the image and release tests put it in their images instead of building their own).
  # With the test build's tokio features (test-util, from a dev-dependency), so that tokio
  # and most of what builds on it are reused (scripts/image.sh says what still compiles
  # again); the binary never pauses its clock.
  echo "== the image's static binary"
  AUTONODES_STATIC_BINARY="$(bash scripts/image.sh --binary-only --profile dev --features tokio/test-util | tail -n 1)"
  status=$?
  export AUTONODES_STATIC_BINARY
  phase_done "static binary"
fi
if [ "$status" -eq 0 ]; then
  bash scripts/lib/test-lanes.sh target/test-binaries.json target/test-output.txt
  status=$?
  phase_done "tests in lanes"
fi
set -e
results=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' target/test-output.txt || true)
passed=$(echo "$results" | awk '{s+=$4} END {print s+0}')
failed=$(echo "$results" | awk '{s+=$6} END {print s+0}')

if [ -f target/chaos-report.txt ]; then
  echo "== chaos report (tests/it/chaos.rs)"
  cat target/chaos-report.txt
fi

echo "== leftover processes"
# A recorded pid counts only while its start time is still the recorded one (pids are reused).
leftover=""
started=0
for f in "$AUTONODES_TEST_PIDS"/*; do
  [ -e "$f" ] || continue
  started=$((started + 1))
  pid=$(basename "$f")
  read -r start name < "$f"
  if [ -r "/proc/$pid/stat" ]; then
    now=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{print $20}')
    if [ "$now" = "$start" ]; then leftover="${leftover}${pid} ${name}"$'\n'; fi
  fi
done
if [ -n "$leftover" ]; then
  echo "processes the tests started outlived them:"; printf '%s' "$leftover"
  status=1
else
  echo "none (of ${started} processes the tests started)"
fi
echo "target/: $(du -sh target 2>/dev/null | cut -f1); disk: $(df -h . | awk 'NR==2 {print $4}') free"
echo "tests: ${passed} passed, ${failed} failed"
echo "by phase: ${phases%, }"
echo "whole run: $((SECONDS / 60)) min $((SECONDS % 60)) s"
exit "$status"
