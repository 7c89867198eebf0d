#!/usr/bin/env bash
# Builds the real node's images locally (no engine, no registry) into bin/node-images/, as
# tarballs that `ctr images import` reads, with the names the pods use (bin/node-images/names):
#   envtest.local/pause:3.10         the pod sandbox: pause.c, static
#   envtest.local/memcached:VERSION  bin/memcached-VERSION/memcached (with its proxy and TLS,
#                                    make memcached-proxy) and the libraries it links, as
#                                    this machine has them
# Rebuilds only when an input (the binaries, pause.c, mkimage, this script) changed.
#   hack/node/images.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${NODE_BIN:-$root/bin}"
out="$bin/node-images"
memcached="$(ls -d "$bin"/memcached-*/memcached 2>/dev/null | sort -V | tail -1)"
if [[ -z "$memcached" ]]; then
  echo "memcached is missing in $bin: make memcached-proxy (or: hack/memcached/build.sh)" >&2
  exit 1
fi
mc_version="$(basename "$(dirname "$memcached")")"; mc_version="${mc_version#memcached-}"
libs="$(ldd "$memcached" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)"
stamp="$(cat "$here/images.sh" "$here/pause.c" "$here/runtime/cmd/mkimage/main.go" \
  "$here/runtime/go.sum" "$memcached" $libs | sha256sum | cut -c1-16)"
if [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
  echo "up to date: $out"; exit 0
fi
mkdir -p "$out"; rm -f "$out/.stamp"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$here/runtime" && CGO_ENABLED=0 go build -trimpath -o "$work/mkimage" ./cmd/mkimage)
cc -Os -s -static -o "$work/pause" "$here/pause.c"
pause=envtest.local/pause:3.10
mc=envtest.local/memcached:$mc_version
"$work/mkimage" -o "$out/pause.tar" -name "$pause" -entrypoint /pause /pause="$work/pause"
# The loader and libraries at the paths memcached asks for; memcached runs as nobody.
"$work/mkimage" -o "$out/memcached.tar" -name "$mc" -entrypoint /usr/bin/memcached -user 65534 \
  /usr/bin/memcached="$memcached" $libs
printf 'pause %s\nmemcached %s\n' "$pause" "$mc" > "$out/names"
echo "$stamp" > "$out/.stamp"
echo "built $out: $pause, $mc"
