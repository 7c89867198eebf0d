#!/usr/bin/env bash
# Builds a real node's binaries into bin/ (git-ignored), keyed by version:
#   bin/node-vX.Y.Z/{kubelet,kube-proxy}                 one per pinned Kubernetes version
#   bin/containerd-vA.B.C/{containerd,containerd-shim-runc-v2,ctr,runc,crane}
#   bin/containerd-vA.B.C/cni/{bridge,host-local,loopback,portmap}
# Rebuilds only when a pin (go.mod, go.sum, this script) changed since the last build.
# runc is built with cgo and libseccomp (Debian's libseccomp-dev); everything else is static.
#   hack/node/build.sh            # every pinned Kubernetes version, and the runtime
#   hack/node/build.sh v1.37      # one Kubernetes version (and the runtime)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${NODE_BIN:-$root/bin}"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"
export CGO_ENABLED=0

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }
version_of() { # module dir -> the version go.mod requires
  sed -n "s#^\t$1 \(v[^ ]*\).*#\1#p; s#^require $1 \(v[^ ]*\).*#\1#p" "$2/go.mod" | head -1
}

build_module() { # dir outdir ldflags targets...
  local dir="$1" out="$2" ldflags="$3"; shift 3
  mkdir -p "$out"
  echo "building $out (${*##*/}) ..."
  local start=$SECONDS
  (cd "$dir" && go build -ldflags="-s -w $ldflags" -o "$out/" "$@")
  echo "built $out (${*##*/}) in $((SECONDS - start)) s"
}

up_to_date() { # outdir stamp
  [[ -f "$1/.stamp" && "$(cat "$1/.stamp")" == "$2" ]] && echo "up to date: $1"
}

want="${1:-}"
for dir in "$here"/k8s-v*/; do
  dir="${dir%/}"
  [[ -n "$want" && "$(basename "$dir")" != "k8s-$want"* ]] && continue
  version="$(version_of k8s.io/kubernetes "$dir")"
  out="$bin/node-$version"
  stamp="$(stamp_of "$dir/go.mod" "$dir/go.sum" "$here/build.sh")"
  up_to_date "$out" "$stamp" && continue
  rm -f "$out/.stamp"
  # The version stamp Kubernetes' own build writes (as hack/controlplane/build.sh does), so
  # that the node reports the kubelet version it is to the API server.
  minor="${version#v1.}"; minor="${minor%%.*}"
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  build_module "$dir" "$out" "$ldflags" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  echo "$stamp" > "$out/.stamp"
done

rt="$here/runtime"
containerd="$(version_of github.com/containerd/containerd/v2 "$rt")"
runc="$(version_of github.com/opencontainers/runc "$rt")"
cni="$(version_of github.com/containernetworking/plugins "$rt")"
out="$bin/containerd-$containerd"
stamp="$(stamp_of "$rt/go.mod" "$rt/go.sum" "$here/build.sh")"
if ! up_to_date "$out" "$stamp"; then
  rm -f "$out/.stamp"
  if ! [[ -f /usr/include/seccomp.h ]]; then
    echo "runc needs libseccomp's headers: apt-get install -y libseccomp-dev" >&2; exit 1
  fi
  cd_pkg=github.com/containerd/containerd/v2
  build_module "$rt" "$out" "-X $cd_pkg/version.Version=$containerd -X $cd_pkg/version.Package=$cd_pkg" \
    $cd_pkg/cmd/containerd $cd_pkg/cmd/containerd-shim-runc-v2 $cd_pkg/cmd/ctr \
    github.com/google/go-containerregistry/cmd/crane
  build_module "$rt" "$out/cni" \
    "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni" \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/meta/portmap
  # runc's nsenter is C, and its seccomp filter comes from libseccomp.
  CGO_ENABLED=1 GOFLAGS="$GOFLAGS -tags=seccomp" build_module "$rt" "$out" \
    "-X main.version=${runc#v}" github.com/opencontainers/runc
  echo "$stamp" > "$out/.stamp"
fi
