#!/usr/bin/env bash
# Builds the pinned control plane into bin/ (git-ignored), keyed by version:
#   bin/k8s-vX.Y.Z/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   bin/kwok-vA.B.C/kwok
# Rebuilds only when a pin (go.mod, go.sum, this script) changed since the last build.
#   hack/controlplane/build.sh            # every pinned Kubernetes version, and kwok
#   hack/controlplane/build.sh v1.37      # one Kubernetes version (and kwok)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CONTROLPLANE_BIN:-$root/bin}"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"
export CGO_ENABLED=0

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

build_module() { # dir outdir ldflags targets...
  local dir="$1" out="$2" ldflags="$3"; shift 3
  local stamp; stamp="$(stamp_of "$dir/go.mod" "$dir/go.sum" "$here/build.sh")"
  if [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
    echo "up to date: $out"; return
  fi
  mkdir -p "$out"; rm -f "$out/.stamp"
  echo "building $out (${*##*/}) ..."
  local start=$SECONDS
  (cd "$dir" && go build -ldflags="-s -w $ldflags" -o "$out/" "$@")
  echo "$stamp" > "$out/.stamp"
  echo "built $out in $((SECONDS - start)) s"
}

want="${1:-}"
for dir in "$here"/k8s-v*/; do
  dir="${dir%/}"
  [[ -n "$want" && "$(basename "$dir")" != "k8s-$want"* ]] && continue
  version="$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p; s/^\tk8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$dir/go.mod" | head -1)"
  # The version stamp Kubernetes' own build (hack/lib/version.sh) writes, so that /version,
  # kubectl version and the components' skew checks see the release they are.
  minor="${version#v1.}"; minor="${minor%%.*}"
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  build_module "$dir" "$bin/k8s-$version" "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl ./cmd/etcd
done
kwok_version="$(sed -n 's/^\tsigs.k8s.io\/kwok \(v[0-9.]*\).*/\1/p; s/^require sigs.k8s.io\/kwok \(v[0-9.]*\)$/\1/p' "$here/kwok/go.mod" | head -1)"
build_module "$here/kwok" "$bin/kwok-$kwok_version" "" sigs.k8s.io/kwok/cmd/kwok
# kwok's own stages, as kwokctl uses them: nodes Ready with a Lease heartbeat; pods Running
# and Ready with an IP as soon as they are scheduled, and gone once deleted.
stages="$bin/kwok-$kwok_version/stages.yaml"
if [[ ! -s "$stages" ]]; then
  src="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
  for f in "$src"/node/fast/node-initialize.yaml "$src"/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml "$src"/pod/fast/pod-*.yaml; do
    echo "---"; cat "$f"
  done > "$stages.tmp"
  mv "$stages.tmp" "$stages"
fi
