#!/usr/bin/env bash
# Installs mdBook, which builds the docs book under docs/ (tests/it/docs.rs builds it and
# checks its links). Built from crates.io with cargo, without the `serve`/`watch`
# features the tests do not use; cached in $AUTONODES_MDBOOK_DIR (default
# /var/cache/autonodes/mdbook-$VERSION) after the first run (about 3 minutes).
# Prints the mdbook binary's path on its last line.
set -euo pipefail
VERSION=0.5.4
DIR="${AUTONODES_MDBOOK_DIR:-/var/cache/autonodes/mdbook-$VERSION}"
BIN="$DIR/bin/mdbook"
log() { echo "docs-tools: $*" >&2; }

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "$VERSION"; then
  log "mdbook $VERSION cached in $DIR"
  echo "$BIN"
  exit 0
fi
if ! mkdir -p "$DIR" 2>/dev/null || [ ! -w "$DIR" ]; then
  DIR="$(cd "$(dirname "$0")/.." && pwd)/target/mdbook-$VERSION"
  BIN="$DIR/bin/mdbook"
  mkdir -p "$DIR"
fi
log "building mdbook $VERSION into $DIR"
started=$SECONDS
cargo install --quiet --locked --no-default-features --features search \
  --version "$VERSION" --root "$DIR" mdbook >&2
log "built in $((SECONDS - started)) s"
echo "$BIN"
