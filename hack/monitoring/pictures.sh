#!/usr/bin/env bash
# Pictures of the Grafana dashboards (docs/dashboards/*.png), made without Grafana: each
# panel's own queries, read from config/grafana/dashboards/*.json, evaluated by a real
# Prometheus that scraped real memcached, the exporter, the operator and the kubelet's
# cAdvisor under load, and plotted panel by panel (plot.py).
#
#   hack/monitoring/pictures.sh        (as root: the real node; about 12 minutes, 9 of them load)
#
# The run: the pinned control plane with one real node (dev-cluster --real-node, holding
# /tmp/real-node.lock: one real node per host), the operator on the host, three pools
# (shop/cache: 3 pods of 16 MiB behind 2 proxies; accounts/sessions: 2 pods; shop/broken:
# its SASL Secret missing, so Degraded), Prometheus scraping every 5 s (the exporters found
# through the Services' Endpoints and labelled as the Prometheus Operator labels a
# ServiceMonitor's targets; the operator; cAdvisor through the API server's node proxy),
# LOAD_SECONDS (540) of cache-aside traffic (load.py), cache scaled 3 → 4 after 5/18 of it
# (150 s; its proxy is Propagating for ~100 s) and memcached killed in a sessions pod after
# 11/18 (330 s).
# Needs bin/ as `make controlplane node tools` leaves it, the debug dev-cluster and operator
# (cargo build -p envtest -p memcached-operator), Go (Prometheus is built into bin/ once)
# and python3 (matplotlib is installed into bin/plotenv once).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$root/bin"
work="${PICS_WORK:-/tmp/pics}"
debug="${CARGO_TARGET_DIR:-$root/target}/debug"
kubectl="$bin/k8s-v1.37.2/kubectl"
load_seconds="${LOAD_SECONDS:-540}"
# Below the ephemeral port range (32768 and up), where a busy host's outgoing connections
# could hold them.
prom_addr=127.0.0.1:19090
operator_addr=127.0.0.1:18080
say() { echo "$(date -u +%H:%M:%S) $*"; }
die() { echo "pictures.sh: $*" >&2; exit 1; }
[[ $EUID == 0 ]] || die "needs root (the real node runs containerd and the kubelet)"
for f in "$debug/dev-cluster" "$debug/memcached-operator" "$kubectl" "$bin/node-images/names"; do
  [[ -e "$f" ]] || die "missing $f (make controlplane node; cargo build -p envtest -p memcached-operator)"
done

# Prometheus, the pin of hack/tools/prometheus (built from a module of its own: the server
# needs more of Prometheus' dependencies than promtool).
version="$(sed -n 's|^\tgithub.com/prometheus/prometheus \(v[0-9.]*\).*|\1|p' "$here/prometheus/go.mod")"
prometheus="$bin/prometheus-$version/prometheus"
if [[ ! -x "$prometheus" ]]; then
  say "building $prometheus ..."
  (cd "$here/prometheus" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice go build -trimpath \
    -ldflags="-s -w -X github.com/prometheus/common/version.Version=$version" \
    -o "$prometheus" github.com/prometheus/prometheus/cmd/prometheus)
fi
python="${PLOT_PYTHON:-$bin/plotenv/bin/python}"
if ! "$python" -c 'import matplotlib' 2>/dev/null; then
  say "installing matplotlib into $bin/plotenv ..."
  python3 -m venv "$bin/plotenv" && "$bin/plotenv/bin/pip" install -q matplotlib
  python="$bin/plotenv/bin/python"
fi

rm -rf "$work" && mkdir -p "$work"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do # the newest first, the cluster (the first) last
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  done
  say "stopped; logs in $work"
}
trap cleanup EXIT
exec 9>>/tmp/real-node.lock
say "waiting for /tmp/real-node.lock (one real node per host) ..."
flock 9

say "starting the cluster (real node) ..."
"$debug/dev-cluster" --kubeconfig "$work/kubeconfig" --audit-log "$work/audit.log" --real-node --nodes 0 \
  >"$work/dev-cluster.log" 2>&1 &
pids=($!)
for _ in $(seq 600); do
  [[ -f "$work/kubeconfig" ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/dev-cluster.log"; die "dev-cluster exited"; }
  sleep 0.5
done
[[ -f "$work/kubeconfig" ]] || die "the cluster did not start in 300 s; see $work/dev-cluster.log"
export KUBECONFIG="$work/kubeconfig"
k() { "$kubectl" "$@"; }
image() { sed -n "s|^$1 image: ||p" "$work/dev-cluster.log"; }
node="$(k get nodes -o jsonpath='{.items[0].metadata.name}')"

k apply --server-side -k "$root/config/crd" >/dev/null
k wait --for=condition=Established crd/memcacheds.memcached.cache.example.com --timeout=60s >/dev/null
ENABLE_WEBHOOKS=false nice "$debug/memcached-operator" run --memcached-image "$(image memcached)" \
  --exporter-image "$(image exporter)" --metrics-secure=false --metrics-bind-address="$operator_addr" \
  --health-probe-bind-address=0 --leader-elect --leader-election-namespace default >"$work/operator.log" 2>&1 &
pids=($! "${pids[@]}")
sleep 2
kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/operator.log" >&2; die "the operator did not start"; }

# Prometheus: what kube-prometheus and a pool's ServiceMonitor would have it scrape.
k config view --raw --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$work/ca.crt"
k config view --raw --flatten -o jsonpath='{.users[0].user.client-certificate-data}' | base64 -d >"$work/client.crt"
k config view --raw --flatten -o jsonpath='{.users[0].user.client-key-data}' | base64 -d >"$work/client.key"
server="$(k config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
tls="{ca_file: $work/ca.crt, cert_file: $work/client.crt, key_file: $work/client.key}"
cat >"$work/prometheus.yml" <<EOF
global: {scrape_interval: 5s, evaluation_interval: 5s}
scrape_configs:
- job_name: memcached-exporters   # as the Prometheus Operator does for a pool's ServiceMonitor
  kubernetes_sd_configs: [{role: endpoints, kubeconfig_file: $work/kubeconfig}]
  relabel_configs:
  - {source_labels: [__meta_kubernetes_endpoint_port_name], regex: metrics, action: keep}
  - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
  - {source_labels: [__meta_kubernetes_service_name], target_label: service}
  - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
  - {source_labels: [__meta_kubernetes_pod_container_name], target_label: container}
  - {source_labels: [__meta_kubernetes_service_name], target_label: job}
  - {source_labels: [__meta_kubernetes_endpoint_port_name], target_label: endpoint}
- job_name: memcached-operator-controller-manager-metrics-service
  honor_labels: true                # as config/prometheus's ServiceMonitor (honorLabels)
  static_configs:
  - targets: [$operator_addr]
    labels: {namespace: memcached-operator-system, pod: memcached-operator-controller-manager-0}
- job_name: kubelet               # kube-prometheus' cAdvisor job, through the API server
  scheme: https
  metrics_path: /api/v1/nodes/$node/proxy/metrics/cadvisor
  honor_labels: true
  tls_config: $tls
  static_configs: [{targets: ['${server#https://}'], labels: {node: $node, metrics_path: /metrics/cadvisor}}]
EOF
nice "$prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
  --web.listen-address="$prom_addr" >"$work/prometheus.log" 2>&1 &
pids=($! "${pids[@]}")
for _ in $(seq 120); do curl -sf "http://$prom_addr/-/ready" >/dev/null && break; sleep 0.5; done
curl -sf "http://$prom_addr/-/ready" >/dev/null || die "Prometheus is not ready; see $work/prometheus.log"

say "creating the pools ..."
start=$(($(date +%s) - 20))
k create namespace shop >/dev/null
k create namespace accounts >/dev/null
k apply -f - >/dev/null <<EOF
apiVersion: memcached.cache.example.com/v1
kind: Memcached
metadata: {name: cache, namespace: shop}
spec: {size: 3, config: {memoryMiB: 16}, exporter: {enabled: true}, proxy: {enabled: true, replicas: 2}}
---
apiVersion: memcached.cache.example.com/v1
kind: Memcached
metadata: {name: sessions, namespace: accounts}
spec: {size: 2, exporter: {enabled: true}}
---
apiVersion: memcached.cache.example.com/v1
kind: Memcached
metadata: {name: broken, namespace: shop}
spec: {size: 1, sasl: {secretName: missing}}
EOF
k wait --for=condition=Ready -n shop memcached/cache --timeout=300s >/dev/null
k wait --for=condition=Ready -n accounts memcached/sessions --timeout=300s >/dev/null
proxy="$(k get service -n shop cache-proxy -o jsonpath='{.spec.clusterIP}:{.spec.ports[0].port}')"
sessions="$(k get endpointslices -n accounts -l kubernetes.io/service-name=sessions \
  -o jsonpath='{range .items[*].endpoints[*]}{.addresses[0]}:11211,{end}')"
say "load for $load_seconds s: cache through $proxy, sessions to ${sessions%,}"
load_start=$(date +%s)
nice python3 "$here/load.py" "$load_seconds" --cache "$proxy" --sessions "${sessions%,}" >"$work/load.log" 2>&1 &
load=$!
pids=($load "${pids[@]}")

sleep $((load_seconds * 5 / 18))
say "scaling shop/cache 3 -> 4"
k patch -n shop memcached/cache --type merge -p '{"spec":{"size":4}}' >/dev/null
scaled=$(date +%s)
sleep $((load_seconds / 3))
victim="$(k get pods -n accounts -o name | grep -m1 '^pod/sessions-' | cut -d/ -f2)"
id="$(k get pod -n accounts "$victim" -o jsonpath='{.status.containerStatuses[?(@.name=="memcached")].containerID}')"
say "killing memcached in accounts/$victim"
"$bin"/containerd-v*/ctr --address /run/containerd/containerd.sock -n k8s.io tasks kill -s SIGKILL "${id#containerd://}"
killed=$(date +%s)
wait "$load" || die "the load failed; see $work/load.log"
tail -1 "$work/load.log"
sleep 10
end=$(date +%s)

hm() { date -u -d "@$1" +%H:%M:%S; }
note="Run: dev-cluster --real-node (Kubernetes v1.37.2, containerd), the operator, shop/cache (3 pods, -m 16, 2 proxies), \
accounts/sessions (2 pods), shop/broken (its SASL Secret missing: Degraded). Load $(hm $load_start)-$(hm $((load_start + load_seconds))): \
cache-aside, 1,200 gets/s through cache-proxy (200k keys) and 600/s to sessions' pods (20k keys). \
Dashed: cache scaled 3 -> 4 at $(hm $scaled), memcached killed in $victim at $(hm $killed)."
say "plotting ..."
"$python" "$here/plot.py" --prometheus "http://$prom_addr" --start "$start" --end "$end" --step 5 \
  --out "$root/docs/dashboards" --note "$note" --event "$scaled" --event "$killed" \
  "$root"/config/grafana/dashboards/memcached-{pool,proxy,operator}.json
say "done in $SECONDS s"
