#!/usr/bin/env bash
# Builds the pinned release tools the tests run into bin/ (git-ignored), keyed by version:
#   bin/helm-vX.Y.Z/helm                   (hack/tools/helm/go.mod)
#   bin/operator-sdk-vX.Y.Z/operator-sdk   (hack/tools/operator-sdk/go.mod)
#   bin/promtool-vX.Y.Z/promtool           (hack/tools/prometheus/go.mod: Prometheus's module)
#   bin/promql-vX.Y.Z/promql               (hack/tools/prometheus/promql, Prometheus's parser)
# Rebuilds only when a pin (go.mod, go.sum, this script, a local package's sources) changed
# since the last build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CONTROLPLANE_BIN:-$root/bin}"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"
export CGO_ENABLED=0

build() { # dir module-path package binary version-ldflags
  local dir="$here/$1" module="$2" package="$3" name="$4" ldflags="$5"
  local version
  version="$(sed -n "s|^require $module \(v[0-9.]*\)$|\1|p; s|^\t$module \(v[0-9.]*\).*|\1|p" "$dir/go.mod" | head -1)"
  local out="$bin/$name-$version"
  local sources=() # a package of this repository: its sources are pins too
  [[ "$package" == ./* ]] && sources=("$dir/${package#./}"/*.go)
  local stamp
  stamp="$(cat "$dir/go.mod" "$dir/go.sum" "$here/build.sh" "${sources[@]}" | sha256sum | cut -c1-16)"
  if [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
    echo "up to date: $out"; return
  fi
  mkdir -p "$out"; rm -f "$out/.stamp"
  echo "building $out ..."
  local start=$SECONDS
  (cd "$dir" && go build -ldflags="-s -w ${ldflags//VERSION/$version}" -o "$out/$name" "$package")
  echo "$stamp" > "$out/.stamp"
  echo "built $out in $((SECONDS - start)) s"
}

build helm helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm helm \
  "-X helm.sh/helm/v4/internal/version.version=VERSION"
build operator-sdk github.com/operator-framework/operator-sdk \
  github.com/operator-framework/operator-sdk/cmd/operator-sdk operator-sdk \
  "-X github.com/operator-framework/operator-sdk/internal/version.Version=VERSION -X github.com/operator-framework/operator-sdk/internal/version.GitVersion=VERSION"
build prometheus github.com/prometheus/prometheus \
  github.com/prometheus/prometheus/cmd/promtool promtool \
  "-X github.com/prometheus/common/version.Version=VERSION"
build prometheus github.com/prometheus/prometheus ./promql promql ""
