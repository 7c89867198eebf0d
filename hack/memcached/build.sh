#!/usr/bin/env bash
# Builds memcached with its built-in proxy (and TLS, and SASL with its password database) from Debian's source package into
# bin/memcached-VERSION/memcached (git-ignored), for the proxy tests (tests/real_proxy.rs):
# Debian's binary package is built without --enable-proxy. Only when missing or when this
# script or its patch changed. proxy-read-fixes.patch fixes two defects of the proxy's copy of
# a backend's response that the warm-up route (write-back of a value read from another pod)
# runs into: upstream's b700e7000 (first in 1.6.45) and the truncation of values that span
# more than one read (still in 1.6.45).
#   hack/memcached/build.sh
# Needs a C toolchain, libevent, OpenSSL and Cyrus SASL headers:
#   apt-get install build-essential pkg-config libevent-dev libssl-dev libsasl2-dev   (.ci/run does)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# Debian trixie's memcached (the upstream tarball of its source package).
version=1.6.38
sha256=074076ab3e889e16e763c6a3e5cadacc6696979dbb8c473bbf871d498b19b1a0
url="http://deb.debian.org/debian/pool/main/m/memcached/memcached_${version}.orig.tar.xz"
out="$root/bin/memcached-$version"
stamp="$(cat "$here/build.sh" "$here/proxy-read-fixes.patch" | sha256sum | cut -c1-16)"
if [[ -x "$out/memcached" && -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
  echo "up to date: $out/memcached"; exit 0
fi
for header in event.h openssl/ssl.h sasl/sasl.h; do
  if ! echo "#include <$header>" | cc -E - >/dev/null 2>&1; then
    echo "missing <$header>: apt-get install build-essential pkg-config libevent-dev libssl-dev libsasl2-dev" >&2
    exit 1
  fi
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "building memcached $version with the proxy ..."
curl -fsSL -o "$work/src.tar.xz" "$url"
echo "$sha256  $work/src.tar.xz" | sha256sum -c - >/dev/null
tar -C "$work" -xf "$work/src.tar.xz"
(
  cd "$work/memcached-$version"
  git apply -p1 "$here/proxy-read-fixes.patch"
  ./configure --enable-proxy --enable-tls --enable-sasl --enable-sasl-pwdb --disable-docs >"$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log" >&2; exit 1; }
  make -j"$(nproc)" >"$work/make.log" 2>&1 \
    || { tail -30 "$work/make.log" >&2; exit 1; }
)
mkdir -p "$out"
cp "$work/memcached-$version/memcached" "$out/memcached"
echo "$stamp" > "$out/.stamp"
"$out/memcached" -V
echo "built $out/memcached in $((SECONDS - start)) s"
