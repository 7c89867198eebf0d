#!/usr/bin/env bash
# Builds the real node's images locally (no engine, no registry) into bin/node-images/, as
# tarballs that `ctr images import` reads, with the names the pods use (bin/node-images/names):
#   envtest.local/pause:3.10         the pod sandbox: pause.c, static
#   envtest.local/memcached:VERSION  bin/memcached-VERSION/memcached (with its proxy and TLS,
#                                    make memcached-proxy) and the libraries it links, as
#                                    this machine has them
#   envtest.local/memcached-tls-agent:VERSION
#                                    the TLS reload agent (crates/tls-agent, VERSION its own
#                                    version), a debug build in CARGO_TARGET_DIR (default
#                                    target/), and the libraries it links
#   envtest.local/memcached-exporter:VERSION
#                                    the memcached exporter the operator runs by default,
#                                    from its source in hack/memcached-exporter (static)
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
# The loader and libraries a binary links, at the paths it asks for.
libs_of() { ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u; }
# ---- The operator's image: a block of its own (own stamp, own name file) -------------------
#   envtest.local/memcached-operator:VERSION (operator.tar; the name in operator.name)
# The operator (crates/operator, VERSION the workspace's, as the chart's appVersion), a debug
# build in CARGO_TARGET_DIR (default target/), stripped, at /memcached-operator (the command
# of config/manager and the chart) with the libraries it links, as user 65532 (the
# Dockerfile's distroless nonroot). The tests name it in the manifests, as a user names an
# image of their registry (kustomize's `images:`, the chart's image.repository).
# operator.sources: a hash of the workspace sources the binary was built from (the files its
# cargo dep-info lists, by path and contents), which tests/real_node_operator.rs computes for
# the binary under test, so that it never tests a stale image.
(cd "$root" && cargo build --locked -p memcached-operator)
operator="${CARGO_TARGET_DIR:-$root/target}/debug/memcached-operator"
op_version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"
op_image=envtest.local/memcached-operator:$op_version
op_libs="$(libs_of "$operator")"
# (The dep-info's first word is the binary itself, "PATH:", under $root when the target
# directory is the default one: only the words after it are sources.)
op_sources="$(tr ' ' '\n' < "$operator.d" | grep "^$root/" | grep -v ':$' | sort -u | while read -r f; do
  printf '%s %s\n' "${f#"$root/"}" "$(sha256sum < "$f" | cut -c1-64)"; done | sha256sum | cut -c1-64)"
op_stamp="$({ cat "$here/images.sh" "$here/runtime/cmd/mkimage/main.go" "$here/runtime/go.sum" \
  "$operator" $op_libs; echo "$op_sources"; } | sha256sum | cut -c1-16)"
if [[ -f "$out/.stamp-operator" && "$(cat "$out/.stamp-operator")" == "$op_stamp" ]]; then
  echo "up to date: $out/operator.tar"
else
  mkdir -p "$out"; rm -f "$out/.stamp-operator"
  op_work="$(mktemp -d)"
  (cd "$here/runtime" && CGO_ENABLED=0 go build -trimpath -o "$op_work/mkimage" ./cmd/mkimage)
  strip -o "$op_work/memcached-operator" "$operator"
  "$op_work/mkimage" -o "$out/operator.tar" -name "$op_image" -entrypoint /memcached-operator \
    -user 65532 /memcached-operator="$op_work/memcached-operator" $op_libs
  rm -rf "$op_work"
  echo "$op_image" > "$out/operator.name"
  echo "$op_sources" > "$out/operator.sources"
  echo "$op_stamp" > "$out/.stamp-operator"
  echo "built $out/operator.tar: $op_image"
fi
# ---- end of the operator's image ---------------------------------------------------------
libs="$(libs_of "$memcached")"
# SASL (memcached built with --enable-sasl-pwdb): Cyrus SASL loads its mechanisms from its
# plugin directory (Debian's, compiled into libsasl2), not through ldd. The image has PLAIN
# and ANONYMOUS (as Debian's libsasl2-modules does) and, like the official memcached images,
# no SASL configuration of its own: memcached -S exits ("Error initializing sasl.") unless
# the pod gives it one (SASL_CONF_PATH), and one without `mech_list` offers ANONYMOUS too.
sasl_libs=""
if grep -q libsasl2 <<<"$libs"; then
  for mech in plain anonymous; do
    plugin="/usr/lib/$(cc -print-multiarch)/sasl2/lib$mech.so"
    [[ -f "$plugin" ]] || { echo "missing $plugin: apt-get install libsasl2-modules" >&2; exit 1; }
    sasl_libs="$sasl_libs $plugin $(libs_of "$plugin")"
  done
fi
# The agent: cargo decides whether it is up to date; its binary is an input of the stamp.
(cd "$root" && cargo build --locked -p memcached-tls-agent)
agent="${CARGO_TARGET_DIR:-$root/target}/debug/memcached-tls-agent"
agent_version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/crates/tls-agent/Cargo.toml" | head -1)"
agent_libs="$(libs_of "$agent")"
# The exporter: go decides whether it is up to date (its build cache); the binary is an input
# of the stamp (-trimpath and the fixed version make it the same from the same sources).
exporter_src="$root/hack/memcached-exporter"
exporter_version="$(cat "$exporter_src/VERSION")"
exporter_dir="$bin/memcached-exporter-$exporter_version"
mkdir -p "$exporter_dir"
(cd "$exporter_src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w \
  -X github.com/prometheus/common/version.Version=$exporter_version \
  -X github.com/prometheus/common/version.Revision=$(sed -n 's/.*(commit \([0-9a-f]*\).*/\1/p' README.md)" \
  -o "$exporter_dir/memcached_exporter" ./cmd/memcached_exporter)
exporter="$exporter_dir/memcached_exporter"
stamp="$(cat "$here/images.sh" "$here/pause.c" "$here/runtime/cmd/mkimage/main.go" \
  "$here/runtime/go.sum" "$memcached" $libs $sasl_libs "$agent" $agent_libs "$exporter" \
  | sha256sum | cut -c1-16)"
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
  /usr/bin/memcached="$memcached" $libs $sasl_libs
# The agent at the path the pool's sidecar runs (TLS_AGENT_BINARY); the pod sets its user.
agent_image=envtest.local/memcached-tls-agent:$agent_version
"$work/mkimage" -o "$out/tls-agent.tar" -name "$agent_image" -entrypoint /memcached-tls-agent \
  -user 65534 /memcached-tls-agent="$agent" $agent_libs
# The exporter at the path of the upstream image's entrypoint, as nobody (the pod sets it too).
exporter_image=envtest.local/memcached-exporter:$exporter_version
"$work/mkimage" -o "$out/exporter.tar" -name "$exporter_image" \
  -entrypoint /bin/memcached_exporter -user 65534 /bin/memcached_exporter="$exporter"
printf 'pause %s\nmemcached %s\ntls-agent %s\nexporter %s\n' "$pause" "$mc" "$agent_image" \
  "$exporter_image" > "$out/names"
echo "$stamp" > "$out/.stamp"
echo "built $out: $pause, $mc, $agent_image, $exporter_image"
