#!/usr/bin/env bash
# Installs the Debian packages some tests use besides the test environment
# (scripts/test-env.sh): cloud-init (`cloud-init schema` checks every rendered user data),
# buildah, podman and runc (the image test) and docker-registry (the release test pushes to
# a registry of its own on a loopback port). Idempotent; as root on Debian only, and a
# failure here only makes those tests say why they cannot run.
set -euo pipefail
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"
want=(cloud-init buildah podman runc docker-registry)
read -r -a missing <<< "$(missing_pkgs "${want[@]}")"
if [ "${#missing[@]}" -eq 0 ]; then
  echo "test-tools: ${want[*]} installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
  echo "test-tools: ${missing[*]} missing and cannot be installed here (needs root and apt-get)" >&2
  exit 1
fi
echo "test-tools: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${missing[@]}" > /dev/null \
  || { apt-get update -q > /dev/null && apt-get install -y -q "${missing[@]}" > /dev/null; }
# cloud-init installed here is for its `schema` command only: it must not run at this
# machine's next boot. (A cloud-init the machine had before is left alone.)
if printf '%s\n' "${missing[@]}" | grep -qx cloud-init; then
  mkdir -p /etc/cloud
  touch /etc/cloud/cloud-init.disabled
fi
# docker-registry installed here is for the release test, which starts its own on a free
# loopback port: the package's service (on :5000, with the package's config) must neither
# run now nor start at the next boot. Debian's postinst may start it through invoke-rc.d
# where no policy-rc.d forbids it.
if printf '%s\n' "${missing[@]}" | grep -qx docker-registry; then
  # Without systemd as PID 1, `disable` still removes the links and `stop` fails: both quiet.
  systemctl disable docker-registry > /dev/null 2>&1 || true
  systemctl stop docker-registry > /dev/null 2>&1 || true
  if [ -s /var/run/docker-registry.pid ] || ss -Hltnp 'sport = :5000' 2>/dev/null | grep -q docker-registry; then
    /etc/init.d/docker-registry stop > /dev/null 2>&1 || true
  fi
  if ss -Hltnp 'sport = :5000' 2>/dev/null | grep -q docker-registry; then
    echo "test-tools: the docker-registry service still listens on :5000 (stop it: service docker-registry stop)" >&2
  fi
fi
echo "test-tools: installed ${missing[*]}"
