#!/usr/bin/env bash
# Installs the Debian packages some tests use besides the test environment
# (scripts/test-env.sh): cloud-init (`cloud-init schema` checks every rendered user data)
# and buildah, podman and runc (the image test). Idempotent; as root on Debian only, and a
# failure here only makes those tests say why they cannot run.
set -euo pipefail
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"
want=(cloud-init buildah podman runc)
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
echo "test-tools: installed ${missing[*]}"
