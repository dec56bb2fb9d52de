#!/usr/bin/env bash
# Installs what the integration tests need on a Debian bookworm machine:
#   - etcd (Debian package etcd-server), prometheus and promtool (package prometheus)
#   - kube-apiserver, kube-scheduler, kubectl, and for the real guests (scripts/guest-image.sh)
#     kubelet, kubeadm and kube-controller-manager, v1.20.2, built from Debian's `kubernetes`
#     source package (real components, not fakes; see docs/src/development.md).
# Idempotent: binaries are cached in $AUTONODES_K8S_BIN (default
# /var/cache/autonodes/k8s-1.20.2/bin); each cached binary is reused, only missing ones are built.
# Prints the bin directory on its last line.
set -euo pipefail

BIN_DIR="${AUTONODES_K8S_BIN:-/var/cache/autonodes/k8s-1.20.2/bin}"
WORK_DIR="${AUTONODES_K8S_WORK:-/var/cache/autonodes/k8s-build}"
# AUTONODES_K8S_WANT narrows the list (the playground needs only the first three).
read -r -a WANT <<< "${AUTONODES_K8S_WANT:-kube-apiserver kube-scheduler kubectl kubelet kubeadm kube-controller-manager}"

log() { echo "test-env: $*" >&2; }

# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

# 1. etcd and Prometheus from Debian. The tests start their own etcd and Prometheus on free ports with their own data
# directories, so an etcd the machine already runs is left alone. Only when this script
# installs the package, and the package's own service started with it, is that service
# stopped again (it is ours: nobody else asked for it).
etcd_was_installed=0
dpkg-query -W -f='${Status}' etcd-server 2>/dev/null | grep -q "install ok installed" && etcd_was_installed=1
prometheus_was_installed=0
dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "install ok installed" && prometheus_was_installed=1
# prometheus: `prometheus` and `promtool` for the metrics and alerting-rule tests.
need_pkgs etcd-server openssl prometheus
stop_new_service() { # $1: service, $2: 1 when the package was installed before this run
  if [ "$2" = 0 ] && command -v systemctl >/dev/null 2>&1 \
     && systemctl is-active --quiet "$1" 2>/dev/null; then
    log "stopping the $1 service the package just started (the tests run their own)"
    $SUDO systemctl stop "$1" || true
    $SUDO systemctl disable "$1" >/dev/null 2>&1 || true
  fi
}
stop_new_service etcd "$etcd_was_installed"
stop_new_service prometheus "$prometheus_was_installed"

# 2. Kubernetes binaries, each built once: only the ones missing from $BIN_DIR are built.
MISSING=()
for b in "${WANT[@]}"; do [ -x "$BIN_DIR/$b" ] || MISSING+=("$b"); done
if [ "${#MISSING[@]}" = 0 ]; then
  log "cached binaries in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi
log "missing from $BIN_DIR: ${MISSING[*]}"

need_pkgs golang-go golang-github-modern-go-reflect2-dev dpkg-dev build-essential rsync

# A deb-src entry for bookworm, taken from the machine's own apt sources.
SRC_LIST=/etc/apt/sources.list.d/autonodes-src.sources
if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/ ; then
  uri=$(debian_archive_uri) || exit 1
  log "adding deb-src for bookworm from the configured archive"
  printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" \
    | $SUDO tee "$SRC_LIST" >/dev/null
  apt_updated=0
fi
apt_update_once

$SUDO mkdir -p "$WORK_DIR" "$BIN_DIR"
$SUDO chown "$(id -u):$(id -g)" "$WORK_DIR" "$BIN_DIR"
cd "$WORK_DIR"
SRC=$(find . -maxdepth 1 -type d -name 'kubernetes-1.20*' | head -n1)
if [ -z "$SRC" ]; then
  log "fetching Debian's kubernetes source package"
  apt-get source -qq --download-only kubernetes >&2
  dpkg-source --no-check -x kubernetes_*.dsc >&2
  SRC=$(find . -maxdepth 1 -type d -name 'kubernetes-1.20*' | head -n1)
fi
SRC=$(cd "$SRC" && pwd)
log "source tree $SRC"

# The vendored reflect2 1.0.1 panics under Go >= 1.18; use Debian's 1.0.2.
R2_SYS=/usr/share/gocode/src/github.com/modern-go/reflect2
R2_VEN="$SRC/vendor/github.com/modern-go/reflect2"
if ! grep -q "1.0.2" "$SRC/.autonodes-reflect2" 2>/dev/null; then
  rm -rf "$R2_VEN"
  mkdir -p "$R2_VEN"
  rsync -a "$R2_SYS/" "$R2_VEN/"
  echo 1.0.2 > "$SRC/.autonodes-reflect2"
fi

# GOPATH layout as debian/rules sets it up: the tree at k8s.io/kubernetes.
GOPATH_DIR="$WORK_DIR/gopath"
mkdir -p "$GOPATH_DIR/src/k8s.io"
ln -sfn "$SRC" "$GOPATH_DIR/src/k8s.io/kubernetes"

log "building ${MISSING[*]} (several minutes on 2 cores; progress every 30 s)"
started=$SECONDS
(
  cd "$GOPATH_DIR/src/k8s.io/kubernetes"
  export GOPATH="$GOPATH_DIR" GO111MODULE=off GOFLAGS=-mod=vendor GOCACHE="$WORK_DIR/gocache"
  export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
  unset GOFLAGS
  n=0
  for b in "${MISSING[@]}"; do
    n=$((n + 1))
    log "building $b ($n of ${#MISSING[@]})"
    # A heartbeat while make is quiet for minutes; it is this script's own child.
    ( while sleep 30; do log "still building $b, $((SECONDS - started)) s so far"; done ) &
    beat=$!
    make WHAT="cmd/$b" >&2 || { kill "$beat" 2>/dev/null; exit 1; }
    kill "$beat" 2>/dev/null || true
    log "built $b after $((SECONDS - started)) s"
  done
)
for b in "${MISSING[@]}"; do
  f=$(find "$SRC/_output" -type f -name "$b" -perm -u+x | head -n1)
  [ -n "$f" ] || { log "build produced no $b"; exit 1; }
  install -m 0755 "$f" "$BIN_DIR/$b"
done
log "built into $BIN_DIR"
# Once every binary the tests may want is cached, the source tree and Go's build cache
# (several GB) serve nothing more: a CI machine's disk is not ours to fill.
all_cached=1
for b in kube-apiserver kube-scheduler kubectl kubelet kubeadm kube-controller-manager; do
  [ -x "$BIN_DIR/$b" ] || all_cached=0
done
if [ "$all_cached" = 1 ]; then
  log "removing the build tree $WORK_DIR ($(du -sh "$WORK_DIR" 2>/dev/null | cut -f1))"
  chmod -R u+w "$WORK_DIR" 2>/dev/null || true
  rm -rf "$WORK_DIR"
fi
echo "$BIN_DIR"
