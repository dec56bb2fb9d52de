#!/usr/bin/env bash
# Builds autonodes' container image from the Dockerfile with Debian's buildah, without a
# registry: the static binary is compiled here and handed to the Dockerfile as its `build`
# stage, and the final stage is `FROM scratch`.
#
#   scripts/image.sh                    build localhost/autonodes:<version> (the chart's default)
#   scripts/image.sh --check            ... and run `autonodes --version` and `autonodes run
#                                       --help` inside it with podman
#   scripts/image.sh --push REPOSITORY  ... and push it as REPOSITORY:<version>
#   scripts/image.sh --save FILE        ... and write it to FILE as an OCI archive
#   scripts/image.sh --print-name       print the image name and exit
#   scripts/image.sh --profile dev ...  build the binary with another cargo profile (default
#                                       release, what ships; the image test uses dev, which
#                                       compiles in half the time)
#   scripts/image.sh --install          only install buildah, podman and runc (the test command
#                                       does this before the tests)
#   scripts/image.sh --binary-only      only build the static binary and print its path (the
#                                       test command does this once, beside the test build)
#   scripts/image.sh --features LIST ... build the binary with these cargo features too (the
#                                       test command passes the test build's tokio/test-util,
#                                       so every dependency it compiled is reused)
#
# AUTONODES_IMAGE overrides the repository (default localhost/autonodes).
# AUTONODES_STATIC_BINARY names a static binary built before (by --binary-only, in the same
# --profile) to put in the image instead of building one. As root on Debian it installs buildah, podman and runc
# with apt-get when they are missing.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
repository="${AUTONODES_IMAGE:-localhost/autonodes}"
name="$repository:$version"

check=false
install_only=false
binary_only=false
profile=release
features=""
push=""
save=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=true ;;
    --push) push="${2:?--push needs a repository}"; shift ;;
    --save) save="${2:?--save needs a file}"; shift ;;
    --print-name) echo "$name"; exit 0 ;;
    --profile) profile="${2:?--profile needs a cargo profile}"; shift ;;
    --features) features="${2:?--features needs a list}"; shift ;;
    --install) install_only=true; check=true ;;
    --binary-only) binary_only=true ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "image: $*" >&2; }

# The static binary: glibc linked in (crt-static). The flag reaches only the final link of
# the `autonodes` binary (`cargo rustc`), so build scripts and proc macros are not affected
# and the dependencies compiled for the tests in the same profile are reused where their
# features are the same. The tests' dev-dependency turns on tokio's `test-util` (a clock
# the unit tests pause), so the test command asks for it here too (`--features`): without
# it tokio and all that builds on it compile again (about a minute on 2 cores). Still
# compiled again: kube's crates (the tests' tempfile turns on fastrand's `default`, which
# kube-runtime's backon uses) and autonodes itself, about 35 s.
build_binary() {
  local revision target_dir profile_dir
  revision=$(git rev-parse HEAD 2> /dev/null || echo unknown)
  local -a feature_args=()
  [ -z "$features" ] || feature_args=(--features "$features")
  say "building the static binary (cargo rustc --profile $profile ${feature_args[*]} --bin autonodes, crt-static)"
  # AUTONODES_REVISION becomes the `revision` label of autonodes_build_info.
  AUTONODES_REVISION="$revision" cargo rustc --profile "$profile" --locked -p autonodes \
    "${feature_args[@]}" --bin autonodes -- -C target-feature=+crt-static >&2
  target_dir="${CARGO_TARGET_DIR:-$root/target}"
  # Cargo's directory of a profile: `dev` builds into debug/, the others into their name.
  profile_dir=$profile
  [ "$profile" != dev ] || profile_dir=debug
  # A copy of its own: the next `cargo build` or `cargo test` relinks target/<profile>/autonodes.
  mkdir -p "$target_dir/static/$profile_dir"
  cp "$target_dir/$profile_dir/autonodes" "$target_dir/static/$profile_dir/autonodes"
  echo "$target_dir/static/$profile_dir/autonodes"
}

if $binary_only; then
  build_binary
  exit 0
fi

need=()
command -v buildah > /dev/null || need+=(buildah)
if $check; then
  command -v podman > /dev/null || need+=(podman)
  command -v runc > /dev/null || need+=(runc)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" > /dev/null \
      || { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" > /dev/null; }
  else
    echo "image: ${need[*]} missing; install them (Debian: apt-get install ${need[*]})" >&2
    exit 1
  fi
fi
if $install_only; then
  say "$(buildah --version), $(podman --version)"
  exit 0
fi

# A binary built before is used only for the profile it was built in (--binary-only puts it
# under static/<profile>/), so a release build never ships a test's dev binary.
profile_dir=$profile
[ "$profile" != dev ] || profile_dir=debug
if [ -n "${AUTONODES_STATIC_BINARY:-}" ] && [[ "$AUTONODES_STATIC_BINARY" == */static/"$profile_dir"/autonodes ]]; then
  binary=$AUTONODES_STATIC_BINARY
  say "using the static binary $binary (AUTONODES_STATIC_BINARY)"
else
  binary=$(build_binary)
fi
revision=$(git rev-parse HEAD 2> /dev/null || echo unknown)
# A build context of its own, so two builds at once (the image and release tests) never share one.
mkdir -p "${CARGO_TARGET_DIR:-$root/target}"
context=$(mktemp -d "${CARGO_TARGET_DIR:-$root/target}/image-context.XXXXXX")
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/out"
cp "$binary" "$context/out/autonodes"
strip "$context/out/autonodes"
if ! file "$context/out/autonodes" | grep -q 'static'; then
  echo "image: $context/out/autonodes is not statically linked" >&2
  exit 1
fi

created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
say "building $name (buildah, FROM scratch; the build stage is the binary above)"
buildah build --quiet --isolation chroot \
  --build-context "build=$context" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
  --tag "$name" --file Dockerfile . > /dev/null
size=$(buildah images --format '{{.Size}}' "$name" 2> /dev/null | head -n 1)
bytes=$(stat -c %s "$context/out/autonodes")
say "built $name: image size ${size:-unknown}, one layer: /autonodes ($((bytes / 1024 / 1024)) MiB, static)"
say "labels: $(buildah inspect --type image --format '{{range $k, $v := .OCIv1.Config.Labels}}{{$k}}={{$v}} {{end}}' "$name")"
say "user $(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$name"), entrypoint $(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.Cmd}}' "$name")"

if $check; then
  # The sandbox's hard limits are below podman's defaults; the binary needs neither.
  run=(podman run --rm --network=none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$name")
  say "podman run $name --version"
  "${run[@]}" --version
  say "podman run $name run --help"
  "${run[@]}" run --help
fi

if [ -n "$save" ]; then
  say "saving to $save"
  rm -f "$save"
  buildah push --quiet "$name" "oci-archive:$save:$name"
fi

if [ -n "$push" ]; then
  say "pushing $push:$version"
  buildah push "$name" "docker://$push:$version"
fi
