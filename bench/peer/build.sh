#!/usr/bin/env bash
# Build the benchmark peer (the seeds' Kubebuilder Memcached controller in Go).
# Usage: bench/peer/build.sh [OUT_DIR]   (default: bench/peer/bin)
# Writes OUT_DIR/memcached-peer; does nothing when that binary is newer than
# every .go file, go.mod and go.sum of the peer. Needs Go and the Go module proxy
# (or a warm module cache).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${1:-$here/bin}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
bin="$out_dir/memcached-peer"

if [[ -x "$bin" ]]; then
  newer="$(find "$here" -path "$here/bin" -prune -o \
    \( -name '*.go' -o -name go.mod -o -name go.sum \) -type f -newer "$bin" -print -quit)"
  if [[ -z "$newer" ]]; then
    echo "memcached-peer: $bin is up to date"
    exit 0
  fi
fi

if ! command -v go >/dev/null 2>&1; then
  echo "memcached-peer: go not found in PATH" >&2
  exit 1
fi

echo "memcached-peer: building $bin"
cd "$here"
nice -n 10 go build -trimpath -o "$bin.tmp" ./cmd
mv -f "$bin.tmp" "$bin"
