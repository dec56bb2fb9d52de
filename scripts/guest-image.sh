#!/usr/bin/env bash
# Builds the real guests' disk images (issue 16; crates/autonodes-testenv/src/qemu.rs boots them):
# Debian bookworm from `debootstrap` (archive URI taken from the machine's apt sources), with
# linux-image-amd64, systemd, cloud-init (NoCloud only), containerd, Debian's CNI plugins and a
# bridge CNI config, and the tools kubeadm checks for. Two variants:
#   stock     without kubelet and kubeadm (user data has to install them);
#   prepared  plus kubelet and kubeadm v1.20.2 from scripts/test-env.sh's bin dir in /usr/bin,
#             kubelet.service with kubeadm's 10-kubeadm.conf drop-in (enabled), the
#             br_netfilter/overlay modules and the sysctls kubeadm's preflight checks want.
# Each variant is a directory $AUTONODES_GUEST_DIR/<variant> (default /var/cache/autonodes/guest)
# holding rootfs.qcow2 (ext4 on the whole disk, made with `mkfs.ext4 -d`, no mounting),
# vmlinuz, initrd.img (virtio_blk, virtio_net, ext4), cmdline (the kernel command line qemu
# needs) and recipe (what built it). Built once and cached: a variant is rebuilt only when this
# script or its kubelet/kubeadm changed. Everything is built in a temporary directory and renamed
# into place at the end, so an interrupted run never leaves an image that looks complete.
# Needs root (debootstrap, chroot). Prints the guest directory on its last line.
set -euo pipefail

OUT_DIR="${AUTONODES_GUEST_DIR:-/var/cache/autonodes/guest}"
VARIANTS=(stock prepared)
SUITE=bookworm
# The ext4 file system's size (sparse; the qcow2 holds only what is used). cloud-init's
# resizefs grows it to the overlay's size at boot.
FS_SIZE=3G
# Kubelet 1.20 predates cgroup v2 support (GA in 1.25): boot with cgroup v1.
CMDLINE="root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.unified_cgroup_hierarchy=0"
PACKAGES=(
  linux-image-amd64 initramfs-tools udev kmod systemd-sysv dbus
  cloud-init e2fsprogs
  containerd containernetworking-plugins
  iptables iproute2 conntrack socat ebtables ethtool
  ca-certificates curl
)

log() { echo "guest-image: $*" >&2; }

# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
TEST_ENV="$(dirname "$SCRIPT")/test-env.sh"

# kubelet and kubeadm for the prepared variant: scripts/test-env.sh builds them (cached).
K8S_BIN="${AUTONODES_K8S_BIN:-/var/cache/autonodes/k8s-1.20.2/bin}"
if [ ! -x "$K8S_BIN/kubelet" ] || [ ! -x "$K8S_BIN/kubeadm" ]; then
  log "kubelet or kubeadm missing in $K8S_BIN: running scripts/test-env.sh"
  K8S_BIN="$(bash "$TEST_ENV" | tail -n 1)"
fi

# What a variant is built from; a cached variant with another recipe is rebuilt.
recipe() { # $1: variant
  {
    echo "variant $1"
    echo "script $(sha256sum "$SCRIPT" | cut -d' ' -f1)"
    if [ "$1" = prepared ]; then
      echo "kubelet $(sha256sum "$K8S_BIN/kubelet" | cut -d' ' -f1)"
      echo "kubeadm $(sha256sum "$K8S_BIN/kubeadm" | cut -d' ' -f1)"
    fi
  }
}

complete() { # $1: variant directory, $2: variant
  local f
  for f in rootfs.qcow2 vmlinuz initrd.img cmdline recipe; do
    [ -s "$1/$f" ] || return 1
  done
  [ "$(cat "$1/recipe")" = "$(recipe "$2")" ]
}

# One build at a time (test.sh and a test may both ask): the second waits, then finds the cache.
if mkdir -p "$OUT_DIR" 2>/dev/null && { exec 9>>"$OUT_DIR/.lock"; } 2>/dev/null; then
  flock 9
fi

# What booting the guests needs on this machine (qemu.rs): QEMU, qemu-img, genisoimage for
# the NoCloud seed, socat for the guests' forwards to the host's loopback.
need_pkgs qemu-system-x86 qemu-utils genisoimage socat

TODO=()
for v in "${VARIANTS[@]}"; do
  if complete "$OUT_DIR/$v" "$v"; then
    log "cached $v image in $OUT_DIR/$v"
  else
    TODO+=("$v")
  fi
done
if [ "${#TODO[@]}" = 0 ]; then
  echo "$OUT_DIR"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "building the guest images needs root (debootstrap, chroot)"
  exit 1
fi
need_pkgs debootstrap e2fsprogs qemu-utils

# The archive URI from the machine's own apt sources (as test-env.sh takes its deb-src).
uri=$(debian_archive_uri) || exit 1

# One temporary directory for this run, removed however the run ends (the chroot's mounts
# first). The leftovers of an earlier run that was killed outright are removed too: we hold
# the lock, so no other build uses them.
remove_build_dir() { # $1: directory
  local m
  for m in $(awk -v w="$1/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$1"
}
for d in "$OUT_DIR"/.build.*; do
  [ -d "$d" ] || continue
  log "removing the leftovers of an interrupted build: $d"
  remove_build_dir "$d"
done
WORK=$(mktemp -d "$OUT_DIR/.build.XXXXXX")
cleanup() { remove_build_dir "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

in_root() { # $1: root, rest: command; with /proc, /sys and /dev for maintainer scripts
  local root="$1"; shift
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount --bind /dev "$root/dev"
  local rc=0
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@" || rc=$?
  umount "$root/dev" "$root/sys" "$root/proc"
  return "$rc"
}

started=$SECONDS
BASE="$WORK/base"
# debootstrap lays down a minimal system; apt inside it installs the rest (debootstrap's own
# resolver does not know virtual packages, which cloud-init's Python dependencies need).
log "debootstrap $SUITE from $uri into $BASE (a few minutes; progress every 30 s)"
( while sleep 30; do log "still building the base system, $((SECONDS - started)) s so far"; done ) &
beat=$!
trap 'kill "$beat" 2>/dev/null || true; cleanup' EXIT
if ! debootstrap --variant=minbase --merged-usr "$SUITE" "$BASE" "$uri" > "$WORK/debootstrap.log" 2>&1; then
  tail -n 30 "$WORK/debootstrap.log" >&2
  [ -f "$BASE/debootstrap/debootstrap.log" ] && tail -n 30 "$BASE/debootstrap/debootstrap.log" >&2
  log "debootstrap failed"
  exit 1
fi
log "debootstrap done after $((SECONDS - started)) s; installing ${PACKAGES[*]}"
# A small initrd with just what the root disk needs (the modules follow after the install).
mkdir -p "$BASE/etc/initramfs-tools/conf.d"
echo "MODULES=list" > "$BASE/etc/initramfs-tools/conf.d/autonodes.conf"
# No service starts inside the chroot.
printf '#!/bin/sh\nexit 101\n' > "$BASE/usr/sbin/policy-rc.d"
chmod 0755 "$BASE/usr/sbin/policy-rc.d"
if ! in_root "$BASE" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"' \
    apt-install "${PACKAGES[@]}" > "$WORK/apt.log" 2>&1; then
  tail -n 40 "$WORK/apt.log" >&2
  log "installing the guest's packages failed"
  exit 1
fi
rm -f "$BASE/usr/sbin/policy-rc.d"
in_root "$BASE" apt-get clean
kill "$beat" 2>/dev/null || true
log "packages installed after $((SECONDS - started)) s"

# --- the shared base ---------------------------------------------------------------------
# The apt sources the guest would use (it reaches no archive at run time; for completeness).
printf 'deb %s %s main\n' "$uri" "$SUITE" > "$BASE/etc/apt/sources.list"
echo "autonodes-guest" > "$BASE/etc/hostname"
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' > "$BASE/etc/hosts"
# No fstab entry is needed for the root file system (the kernel mounts /dev/vda rw).
printf '# <file system> <mount point> <type> <options> <dump> <pass>\n' > "$BASE/etc/fstab"
# QEMU's user-mode network has its DNS proxy at 10.0.2.3 (a restricted guest reaches none).
echo "nameserver 10.0.2.3" > "$BASE/etc/resolv.conf"

# cloud-init: the NoCloud datasource only (KubeVirt's cloudInitNoCloud: a `cidata` volume).
cat > "$BASE/etc/cloud/cloud.cfg.d/90_dpkg.cfg" <<'EOF'
# autonodes guest: KubeVirt's cloudInitNoCloud seed (an ISO9660 volume labelled cidata).
datasource_list: [ NoCloud ]
EOF
# No SSH server in the guest, and no locales generated (cc_locale fails on en_US.UTF-8).
cat > "$BASE/etc/cloud/cloud.cfg.d/91_autonodes.cfg" <<'EOF'
# autonodes guest: serial console only, no SSH server; the C.UTF-8 locale.
ssh_genkeytypes: []
ssh_deletekeys: false
locale: false
EOF

# The network: cloud-init renders its (fallback DHCP) config for systemd-networkd.
ln -sf /lib/systemd/system/systemd-networkd.service \
  "$BASE/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
mkdir -p "$BASE/etc/systemd/system/sockets.target.wants" "$BASE/etc/systemd/system/network-online.target.wants"
ln -sf /lib/systemd/system/systemd-networkd.socket \
  "$BASE/etc/systemd/system/sockets.target.wants/systemd-networkd.socket"
ln -sf /lib/systemd/system/systemd-networkd-wait-online.service \
  "$BASE/etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service"

# A bridge CNI network for the pods (Debian's plugins live in /usr/lib/cni).
mkdir -p "$BASE/etc/cni/net.d" "$BASE/opt/cni"
ln -sfn /usr/lib/cni "$BASE/opt/cni/bin"
cat > "$BASE/etc/cni/net.d/10-bridge.conflist" <<'EOF'
{
  "cniVersion": "0.4.0",
  "name": "bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "10.85.0.0/16" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
cat > "$BASE/etc/cni/net.d/99-loopback.conf" <<'EOF'
{ "cniVersion": "0.4.0", "name": "lo", "type": "loopback" }
EOF

printf 'virtio_pci\nvirtio_blk\nvirtio_net\next4\n' >> "$BASE/etc/initramfs-tools/modules"
log "rebuilding the initrd"
in_root "$BASE" update-initramfs -u -k all >&2
KVER=$(basename "$(ls -d "$BASE"/lib/modules/* | head -n1)")
listing=$(in_root "$BASE" lsinitramfs "/boot/initrd.img-$KVER")
for m in virtio_pci virtio_blk virtio_net ext4; do
  grep -q "/$m.ko" <<<"$listing" || { log "the initrd lacks $m"; exit 1; }
done

# Smaller: no apt caches, no docs, no drivers a virtual machine never loads.
rm -rf "$BASE"/var/cache/apt/*.bin "$BASE"/var/cache/apt/archives/*.deb "$BASE"/var/lib/apt/lists/* \
  "$BASE"/usr/share/doc/* "$BASE"/usr/share/man/* "$BASE"/usr/share/info/* \
  "$BASE"/var/log/*.log "$BASE"/debootstrap
for d in gpu media net/wireless net/ethernet net/can net/usb sound infiniband bluetooth staging \
         isdn usb iio hwmon mtd nfc thunderbolt firewire atm pcmcia video comedi fpga; do
  rm -rf "$BASE/lib/modules/$KVER/kernel/drivers/$d"
done
rm -rf "$BASE/lib/modules/$KVER/kernel/sound"
# Translations (41 MB); locale.alias stays.
find "$BASE/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
in_root "$BASE" depmod "$KVER"
# cloud-init must see a first boot.
rm -rf "$BASE"/var/lib/cloud/*
: > "$BASE/etc/machine-id"
log "base done after $((SECONDS - started)) s"

# --- the variants ------------------------------------------------------------------------
prepare_kubernetes() { # $1: root
  local root="$1"
  install -m 0755 "$K8S_BIN/kubelet" "$root/usr/bin/kubelet"
  install -m 0755 "$K8S_BIN/kubeadm" "$root/usr/bin/kubeadm"
  # As the kubelet and kubeadm packages install them.
  cat > "$root/lib/systemd/system/kubelet.service" <<'EOF'
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/home/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
  mkdir -p "$root/etc/systemd/system/kubelet.service.d"
  cat > "$root/etc/systemd/system/kubelet.service.d/10-kubeadm.conf" <<'EOF'
# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
EOF
  ln -sf /lib/systemd/system/kubelet.service "$root/etc/systemd/system/multi-user.target.wants/kubelet.service"
  mkdir -p "$root/etc/kubernetes/manifests" "$root/var/lib/kubelet"
  # What kubeadm's preflight checks want of a node.
  printf 'overlay\nbr_netfilter\n' > "$root/etc/modules-load.d/kubernetes.conf"
  cat > "$root/etc/sysctl.d/90-kubernetes.conf" <<'EOF'
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
EOF
}

for v in "${TODO[@]}"; do
  vstart=$SECONDS
  root="$WORK/root-$v"
  out="$WORK/$v"
  log "building the $v image"
  cp -a "$BASE" "$root"
  [ "$v" = prepared ] && prepare_kubernetes "$root"
  mkdir -p "$out"
  cp "$root/boot/vmlinuz-$KVER" "$out/vmlinuz"
  cp "$root/boot/initrd.img-$KVER" "$out/initrd.img"
  echo "$CMDLINE" > "$out/cmdline"
  mkfs.ext4 -q -F -L autonodes-root -d "$root" "$WORK/$v.ext4" "$FS_SIZE"
  qemu-img convert -f raw -O qcow2 "$WORK/$v.ext4" "$out/rootfs.qcow2"
  rm -rf --one-file-system "$root" "$WORK/$v.ext4"
  recipe "$v" > "$out/recipe"
  # Into place: the old directory (if any) goes first, the new one is renamed in whole.
  if [ -e "$OUT_DIR/$v" ]; then
    mv "$OUT_DIR/$v" "$WORK/old-$v"
  fi
  mv "$out" "$OUT_DIR/$v"
  log "$v image in $OUT_DIR/$v after $((SECONDS - vstart)) s: $(du -sh --apparent-size "$OUT_DIR/$v/rootfs.qcow2" | cut -f1) (qcow2)"
done
log "built ${TODO[*]} in $((SECONDS - started)) s"
echo "$OUT_DIR"
