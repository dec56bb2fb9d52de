#!/usr/bin/env bash
# Releases autonodes to an OCI registry: the container image, an SBOM of the `autonodes`
# binary's Rust dependencies, and the Helm chart, all under the one version of the
# workspace's Cargo.toml (the chart's version and appVersion and the CHANGELOG's latest
# release must say the same, or nothing is pushed).
#
#   scripts/release.sh --registry REGISTRY [--profile PROFILE] [--plain-http] [--out DIR]
#
#   REGISTRY/autonodes:<version>           the image (scripts/image.sh builds it)
#   REGISTRY/autonodes:<version>.sbom      the SBOM (CycloneDX 1.5 JSON, cargo-cyclonedx) as
#                                          an OCI artifact whose subject is the image
#   oci://REGISTRY/charts/autonodes:<version>  the chart, as `helm push` stores it, its
#                                          default image.repository REGISTRY/autonodes
#   oci://REGISTRY/charts/autonodes-crd:<version>  the CRDs as a chart of their own, so
#                                          `helm upgrade` upgrades them
#   REGISTRY/autonodes-cli:<version>       the command line for laptops, an OCI artifact:
#                                          autonodes-<version>-linux-amd64.tar.gz (the
#                                          image's static binary as `autonodes` and as
#                                          `kubectl-autonodes`), SHA256SUMS and the SBOM
#
# REGISTRY is HOST[:PORT][/PATH]. --plain-http talks HTTP instead of HTTPS (a local test
# registry). --profile builds the binary with another cargo profile (default release; the
# release test uses dev). --out keeps the chart archive and the SBOM (default
# target/release-<version>). With REGISTRY_USERNAME and REGISTRY_PASSWORD set, every push
# logs in with them; otherwise the registry must take anonymous pushes.
#
# cargo-cyclonedx is built from crates.io once into $AUTONODES_CYCLONEDX_DIR (default
# /var/cache/autonodes/cargo-cyclonedx-$VERSION, else target/; about 3 minutes); Helm's
# library comes from scripts/helm-env.sh (or the python in AUTONODES_HELM_PYTHON).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

CYCLONEDX_VERSION=0.5.9
registry=""
profile=release
plain_http=false
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="${2:?--registry needs HOST[:PORT][/PATH]}"; shift ;;
    --profile) profile="${2:?--profile needs a cargo profile}"; shift ;;
    --plain-http) plain_http=true ;;
    --out) out="${2:?--out needs a directory}"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "release: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$registry" ] || { echo "release: --registry is required (see --help)" >&2; exit 2; }
registry="${registry%/}"

say() { echo "release: $*"; }
fail() { echo "release: $*" >&2; exit 1; }

# One version everywhere (tests/it/release.rs checks the same on every test run).
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || fail "no version in Cargo.toml's [workspace.package]"
# A Chart.yaml's top-level `version:` and `appVersion:`, quoted or not.
chart_field() { sed -n "s/^$1:[[:space:]]*[\"']\\{0,1\\}\\([^\"'[:space:]]*\\).*/\\1/p" "charts/$2/Chart.yaml"; }
chart_version=$(chart_field version autonodes)
app_version=$(chart_field appVersion autonodes)
crd_chart_version=$(chart_field version autonodes-crd)
crd_app_version=$(chart_field appVersion autonodes-crd)
changelog_version=$(sed -n 's/^## \[\([0-9][^]]*\)\].*/\1/p' CHANGELOG.md | head -n 1)
for pair in "Chart.yaml version:$chart_version" "Chart.yaml appVersion:$app_version" \
  "autonodes-crd's Chart.yaml version:$crd_chart_version" \
  "autonodes-crd's Chart.yaml appVersion:$crd_app_version" \
  "CHANGELOG.md's latest release:$changelog_version"; do
  [ "${pair##*:}" = "$version" ] \
    || fail "${pair%:*} is '${pair##*:}', Cargo.toml's version is '$version'"
done

out="${out:-$root/target/release-$version}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tls=()
plain=()
if $plain_http; then
  tls=(--tls-verify=false)
  plain=(--plain-http)
fi
creds=()
if [ -n "${REGISTRY_USERNAME:-}" ] && [ -n "${REGISTRY_PASSWORD:-}" ]; then
  creds=(--creds "$REGISTRY_USERNAME:$REGISTRY_PASSWORD")
fi
started=$SECONDS
say "autonodes $version to $registry"

# 1. The image, built by scripts/image.sh under the registry's name, pushed with buildah.
image="$registry/autonodes:$version"
AUTONODES_IMAGE="$registry/autonodes" bash scripts/image.sh --profile "$profile"
say "pushing $image"
buildah push --quiet "${tls[@]}" "${creds[@]}" --digestfile "$out/image.digest" \
  "$image" "docker://$image"
image_digest=$(cat "$out/image.digest")
say "pushed $image ($image_digest)"

# 2. The SBOM: every crate the binary links (dev-dependencies excluded; build-time crates
# included), for the image's target. cargo-cyclonedx writes next to each package's
# Cargo.toml, so it runs on a copy of the sources, not in the work tree.
cyclonedx_dir="${AUTONODES_CYCLONEDX_DIR:-/var/cache/autonodes/cargo-cyclonedx-$CYCLONEDX_VERSION}"
if ! "$cyclonedx_dir/bin/cargo-cyclonedx" cyclonedx --version 2> /dev/null | grep -q "$CYCLONEDX_VERSION"; then
  if ! mkdir -p "$cyclonedx_dir" 2> /dev/null || [ ! -w "$cyclonedx_dir" ]; then
    cyclonedx_dir="$root/target/cargo-cyclonedx-$CYCLONEDX_VERSION"
  fi
  if ! "$cyclonedx_dir/bin/cargo-cyclonedx" cyclonedx --version 2> /dev/null | grep -q "$CYCLONEDX_VERSION"; then
    say "building cargo-cyclonedx $CYCLONEDX_VERSION into $cyclonedx_dir"
    built=$SECONDS
    mkdir -p "$cyclonedx_dir"
    cargo install --quiet --locked --version "$CYCLONEDX_VERSION" --root "$cyclonedx_dir" cargo-cyclonedx
    say "built in $((SECONDS - built)) s"
  fi
fi
sbom="$out/autonodes-$version.cdx.json"
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
tar -c --exclude=./target --exclude=./.git --exclude=./.dev --exclude=./docs/book . | tar -x -C "$copy"
say "SBOM of the autonodes binary (cargo-cyclonedx $CYCLONEDX_VERSION, CycloneDX 1.5)"
(
  cd "$copy"
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2> /dev/null || date +%s) \
    PATH="$cyclonedx_dir/bin:$PATH" cargo cyclonedx --quiet --manifest-path crates/autonodes/Cargo.toml \
    --format json --spec-version 1.5 --describe binaries --target x86_64-unknown-linux-gnu
)
cp "$copy/crates/autonodes/autonodes_bin.cdx.json" "$sbom"
components=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["components"]))' "$sbom")
say "pushing the SBOM ($components components) as $image.sbom"
python3 scripts/lib/release-oci.py sbom "$sbom" --registry "$registry" --repository autonodes \
  --tag "$version.sbom" --subject-tag "$version" "${plain[@]}" > "$out/sbom.json"
say "pushed $(cat "$out/sbom.json")"

# 3. The chart: packaged and pushed with Helm's library (`helm package`, `helm push`).
helm_python="${AUTONODES_HELM_PYTHON:-}"
[ -n "$helm_python" ] || helm_python=$(bash scripts/helm-env.sh | tail -n 1)
say "packaging and pushing the chart to oci://$registry/charts"
"$helm_python" scripts/lib/release-oci.py chart charts/autonodes --registry "$registry" \
  --image "$registry/autonodes" --out "$out" "${plain[@]}" > "$out/chart.json"
say "pushed $(cat "$out/chart.json")"
say "packaging and pushing the CRD chart to oci://$registry/charts"
"$helm_python" scripts/lib/release-oci.py chart charts/autonodes-crd --registry "$registry" \
  --out "$out" "${plain[@]}" > "$out/crd-chart.json"
say "pushed $(cat "$out/crd-chart.json")"

# 4. The command line for laptops: the image's static binary, as `autonodes` and as
# `kubectl-autonodes` (so `kubectl autonodes explain …` runs it), in a tarball with its
# checksum and the SBOM, pushed as one OCI artifact.
profile_dir=$profile
[ "$profile" != dev ] || profile_dir=debug
if [ -n "${AUTONODES_STATIC_BINARY:-}" ] && [[ "$AUTONODES_STATIC_BINARY" == */static/"$profile_dir"/autonodes ]]; then
  binary=$AUTONODES_STATIC_BINARY
else
  binary=$(bash scripts/image.sh --binary-only --profile "$profile")
fi
cli="$out/cli"
rm -rf "$cli"
mkdir -p "$cli/pkg"
install -m 0755 "$binary" "$cli/pkg/autonodes"
install -m 0755 "$binary" "$cli/pkg/kubectl-autonodes"
tarball="autonodes-$version-linux-amd64.tar.gz"
mtime=$(git log -1 --format=%ct 2> /dev/null || date +%s)
tar -C "$cli/pkg" --owner=0 --group=0 --numeric-owner --mtime="@$mtime" --sort=name \
  -czf "$cli/$tarball" autonodes kubectl-autonodes
(cd "$cli" && sha256sum "$tarball" > SHA256SUMS)
cp "$sbom" "$cli/"
say "pushing the command line as $registry/autonodes-cli:$version ($tarball, SHA256SUMS, SBOM)"
python3 scripts/lib/release-oci.py artifact "$cli/$tarball" "$cli/SHA256SUMS" "$cli/$(basename "$sbom")" \
  --registry "$registry" --repository autonodes-cli --tag "$version" \
  --artifact-type application/vnd.autonodes.cli.v1 "${plain[@]}" > "$out/cli.json"
say "pushed $(cat "$out/cli.json")"

say "done in $((SECONDS - started)) s:"
say "  image  $image@$image_digest"
say "  SBOM   $image.sbom ($sbom)"
say "  chart  oci://$registry/charts/autonodes:$version ($out/autonodes-$version.tgz)"
say "  CRDs   oci://$registry/charts/autonodes-crd:$version ($out/autonodes-crd-$version.tgz)"
say "  CLI    $registry/autonodes-cli:$version ($cli/$tarball)"
