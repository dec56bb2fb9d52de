# Shared by scripts/test-env.sh, scripts/guest-image.sh and scripts/test-tools.sh (sourced,
# not run): installing Debian packages and finding the machine's Debian archive. A script
# that calls need_pkgs or debian_archive_uri defines `log` first.

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

apt_updated=0
# Runs `apt-get update` once per script run.
apt_update_once() {
  if [ "$apt_updated" = 0 ]; then
    $SUDO apt-get update -qq >&2
    apt_updated=1
  fi
}

# Prints those of the given packages that are not installed, on one line.
missing_pkgs() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[*]}"
}

# Installs those of the given packages that are not installed yet.
need_pkgs() {
  local -a missing
  read -r -a missing <<< "$(missing_pkgs "$@")"
  if [ "${#missing[@]}" -gt 0 ]; then
    apt_update_once
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
}

# Prints the Debian archive URI of the machine's own apt sources (deb822 or one-line
# format); fails with a log line when there is none.
debian_archive_uri() {
  local uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1=="deb" && $0 ~ /bookworm/ {for(i=2;i<=NF;i++) if ($i ~ /^(https?|file|mirror)/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || { log "no Debian archive URI found in the apt sources"; return 1; }
  echo "$uri"
}
