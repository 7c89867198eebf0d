#!/usr/bin/env bash
# Builds the operator of the last release (the commit in hack/previous-release/COMMIT) into
# bin/previous-release-COMMIT/memcached-operator (git-ignored), for tests/upgrade.rs: every
# change is tested as an upgrade from the last release, so that one that would roll the
# fleet is caught. Only when missing. After a release, put its commit in COMMIT.
#   hack/previous-release/build.sh            (make previous-release)
# Needs the repository's history (a shallow clone lacks the commit: git fetch --unshallow).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
commit="$(tr -d '[:space:]' < "$here/COMMIT")"
out="$root/bin/previous-release-${commit:0:12}"
if [[ -x "$out/memcached-operator" ]]; then
  echo "up to date: $out/memcached-operator"; exit 0
fi
if ! git -C "$root" cat-file -e "${commit}^{commit}" 2>/dev/null; then
  echo "commit $commit (hack/previous-release/COMMIT) is not in this clone: git fetch --unshallow" >&2
  exit 1
fi
start=$SECONDS
echo "building the operator of the last release ($commit) ..."
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
git -C "$root" archive "$commit" | tar -x -C "$src"
# A target dir of its own: the same crates at another path would evict the current build's.
CARGO_TARGET_DIR="$root/target/previous-release" \
  cargo build --locked -q -p memcached-operator --manifest-path "$src/Cargo.toml"
mkdir -p "$out"
cp "$root/target/previous-release/debug/memcached-operator" "$out/memcached-operator"
echo "built $out/memcached-operator in $((SECONDS - start)) s"
