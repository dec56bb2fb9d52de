#!/usr/bin/env bash
# Runs the test binaries `cargo test --no-run --message-format=json` reported, in lanes that
# run side by side: each lane takes the next entry from one queue (the slowest known first)
# until none is left. An integration-test binary made of modules (`tests/NAME/main.rs`, as
# the controller's `tests/it/main.rs`) gives one entry per top-level module, run as that
# binary with the module's tests named exactly; every other binary is one entry. Most integration tests spend much of their time waiting for API
# servers, outages and timeouts, so a second lane uses cores the first leaves idle.
#
#   bash scripts/lib/test-lanes.sh CARGO_JSON OUTPUT
#
# Each binary runs as `cargo test` would run it: from its package's directory, with CARGO
# and CARGO_MANIFEST_DIR set. Its whole output goes to OUTPUT in one piece, under the
# `Running …` line cargo prints (the summary in scripts/test.sh reads it), as soon as it
# ended; a one-line verdict per binary is printed as it comes, the whole output of one
# that failed, and at the end the wall time of each, slowest first. AUTONODES_TEST_LANES sets the number of lanes (default 2);
# AUTONODES_TEST_ONLY, an extended regular expression, keeps only the entries whose name
# (`module_graph`, `it::packing`) it matches whole. The queue is
# ordered by the wall times of the last run here (target/test-times), else by those in
# scripts/lib/test-times (a clean checkout). Exits 1 if any binary failed.
set -uo pipefail
json=${1:?cargo JSON messages}
output=${2:?output file}
lanes=${AUTONODES_TEST_LANES:-2}
root=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/autonodes-lanes.XXXXXX")
trap 'rm -rf "$work"' EXIT
times=target/test-times
: > "$output"

# One line per test binary: executable, package directory, source path relative to it,
# and whether it is a crate's unit tests.
while IFS= read -r line; do
  # A target cargo test runs ("test":true in its target) built as a test harness ("test":
  # true in its profile): not the plain binaries the tests call, not benches.
  case "$line" in
    *'"reason":"compiler-artifact"'*'"test":true},"profile"'*'"test":true},"features"'*) ;;
    *) continue ;;
  esac
  exe=$(sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' <<< "$line")
  [ -n "$exe" ] || continue
  manifest=$(sed -n 's/.*"manifest_path":"\([^"]*\)".*/\1/p' <<< "$line")
  src=$(sed -n 's/.*"src_path":"\([^"]*\)".*/\1/p' <<< "$line")
  kind=$(sed -n 's/.*"kind":\["\([^"]*\)"\].*/\1/p' <<< "$line")
  dir=$(dirname "$manifest")
  printf '%s\t%s\t%s\t%s\n' "$exe" "$dir" "${src#"$dir"/}" "$kind"
done < "$json" > "$work/raw"

# A binary of modules becomes one line per top-level module (its area; `-` for the others),
# the names of the area's tests kept in $work/area-<binary>-<area>.
while IFS=$'\t' read -r exe dir src kind; do
  case "$kind:$src" in
    test:tests/*/main.rs)
      bin=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
      areas=$( (cd "$dir" && "$exe" --list --format terse 2> /dev/null) | sed -n 's/^\(\([a-z0-9_]*\)::.*\): test$/\2 \1/p')
      if [ -z "$areas" ]; then
        printf '%s\t%s\t%s\t%s\t-\n' "$exe" "$dir" "$src" "$kind"
        continue
      fi
      while read -r area name; do
        echo "$name" >> "$work/area-$bin-$area"
      done <<< "$areas"
      for area in $(cut -d' ' -f1 <<< "$areas" | sort -u); do
        printf '%s\t%s\t%s\t%s\t%s\n' "$exe" "$dir" "$src" "$kind" "$area"
      done
      ;;
    *) printf '%s\t%s\t%s\t%s\t-\n' "$exe" "$dir" "$src" "$kind" ;;
  esac
done < "$work/raw" > "$work/binaries"

# The queue: slowest first by the last run's times here, else by the committed ones
# (binaries timed nowhere go first: they may be slow), then by name.
while IFS=$'\t' read -r exe dir src kind area; do
  name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
  [ "$area" = - ] || name="$name::$area"
  if [ -n "${AUTONODES_TEST_ONLY:-}" ] && ! grep -Eq "^(${AUTONODES_TEST_ONLY})\$" <<< "$name"; then
    continue
  fi
  last=$(cat "$times" scripts/lib/test-times 2> /dev/null | awk -v n="$name" '$2 == n {print $1}' | head -n 1)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${last:-99999}" "$exe" "$dir" "$src" "$kind" "$area"
done < "$work/binaries" | sort -t $'\t' -k1,1nr -k2,2 -k6,6 | cut -f2- > "$work/queue"
total=$(wc -l < "$work/queue")
echo "== $total test binaries and areas in $lanes lanes"
echo 0 > "$work/next"

# Takes the next entry of the queue (under a lock), or fails when none is left.
take() {
  exec 9> "$work/lock"
  flock 9
  local n
  n=$(cat "$work/next")
  echo $((n + 1)) > "$work/next"
  flock -u 9
  [ "$n" -lt "$total" ] || return 1
  sed -n "$((n + 1))p" "$work/queue"
}

lane() {
  local entry exe dir src kind area header log started took rc verdict bin label
  local -a only
  while entry=$(take); do
    IFS=$'\t' read -r exe dir src kind area <<< "$entry"
    bin=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
    only=()
    label="$src"
    if [ "$area" != - ]; then
      mapfile -t only < "$work/area-$bin-$area"
      only=(--exact "${only[@]}")
      label="$src::$area"
    fi
    if [ "$kind" = test ] || [ "$kind" = bench ]; then
      header="     Running $label (${exe#"$root"/})"
    else
      header="     Running unittests $label (${exe#"$root"/})"
    fi
    log="$work/$(basename "$exe")-$area.log"
    started=$SECONDS
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" CARGO="${CARGO:-cargo}" "$exe" "${only[@]}") > "$log" 2>&1
    rc=$?
    took=$((SECONDS - started))
    verdict=$(grep -E '^test result: ' "$log" | tail -n 1)
    [ $rc -eq 0 ] || echo "$rc" >> "$work/failed"
    {
      exec 9> "$work/lock"
      flock 9
      { echo; echo "$header"; echo; cat "$log"; } >> "$output"
      # The disk's free space after each binary: a run that fills the disk shows where.
      echo "$took s  $label ($bin): ${verdict:-no test result, exit $rc} [disk: $(df -h . | awk 'NR==2 {print $4}') free]"
      # A failed binary's whole output, where the reader of this run looks first.
      [ $rc -eq 0 ] || { echo "$header"; cat "$log"; }
      flock -u 9
    }
  done
}

for _ in $(seq "$lanes"); do lane & done
wait

# The wall time of each binary (its harness's own figure), slowest first: shown, and kept
# for the next run's queue (binaries this run did not time keep their earlier figure).
awk '
  /^ *Running / {
    name = ($2 == "unittests") ? $3 : $2
    if (match($0, /deps\/[^)]*/)) {
      bin = substr($0, RSTART + 5, RLENGTH - 5); sub(/-[0-9a-f]+$/, "", bin)
      if (match(name, /::[a-z0-9_]+$/)) bin = bin substr(name, RSTART)
      name = name " (" bin ")"
    }
  }
  /^test result: / {
    t = $0; sub(/.*finished in /, "", t); sub(/s$/, "", t)
    if (name != "") printf "%8.1f s  %s\n", t, name
    name = ""
  }' "$output" | sort -rn > "$work/wall"
echo "== wall time of each test binary, slowest first (its harness's own figure; $lanes lanes ran at once)"
cat "$work/wall"
sed -n 's/^ *\([0-9.]*\) s .*(\(.*\))$/\1 \2/p' "$work/wall" > "$times.new"
cat "$times" 2> /dev/null | while read -r t n; do
  grep -q " $n\$" "$times.new" || echo "$t $n"
done >> "$times.new"
mv "$times.new" "$times"
[ ! -s "$work/failed" ]
