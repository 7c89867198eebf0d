# The Kubebuilder workflow for memcached-operator; every target is a thin wrapper around
# cargo, kubectl (with its built-in kustomize) or the container tool.

# One version for the binary, the image tag, the Helm chart and the OLM bundle: the
# workspace's (Cargo.toml [workspace.package] version).
CRATE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
VERSION ?= $(CRATE_VERSION)
# The TLS reload agent's own version (crates/tls-agent/Cargo.toml), the tag of its image: it
# moves only when the agent changes, not with every operator release.
AGENT_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' crates/tls-agent/Cargo.toml | head -1)
# Repository of released images (the chart's and the bundle's default); the agent's is
# IMAGE_TAG_BASE-tls-agent (tagged AGENT_VERSION), the bundle's IMAGE_TAG_BASE-bundle.
IMAGE_TAG_BASE ?= example.com/memcached-operator
# Image URL to use for all building/pushing image targets.
IMG ?= controller:latest
# The TLS reload agent's own image (make docker-build-tls-agent), run as a sidecar of the pools
# whose certificate is reloaded in place: config/manager's `tls-agent` image, set by make deploy.
TLS_AGENT_IMG ?= tls-agent:latest
# The OLM bundle image.
BUNDLE_IMG ?= $(IMAGE_TAG_BASE)-bundle:v$(VERSION)
# The pinned operator-sdk (make tools), else the one on the PATH.
OPERATOR_SDK ?= $(firstword $(wildcard bin/operator-sdk-v*/operator-sdk) operator-sdk)
# Where make release-manifests writes install.yaml.
RELEASE_DIR ?= dist
# Container tool to build and push the image with (docker or podman).
CONTAINER_TOOL ?= docker
KUBECTL ?= kubectl
CARGO ?= cargo
# `make uninstall undeploy ignore-not-found=true` tolerates missing objects.
ignore-not-found ?= false

# Setting SHELL to bash allows bash commands to be executed by recipes.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Write config/ (CRD, RBAC, manager, webhook, cert-manager, ...) and the Helm chart from the code.
	$(CARGO) run -q -p memcached-operator-gen -- manifests --dir config
	$(CARGO) run -q -p memcached-operator-gen -- helm-chart --dir charts/memcached-operator

.PHONY: fmt
fmt: ## Format the code (cargo fmt).
	$(CARGO) fmt --all

.PHONY: lint
lint: ## Lint the code (clippy, warnings are errors).
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: test
test: controlplane memcached-proxy node tools previous-release peer-test ## Run all tests (what CI runs): builds the pinned control plane, memcached with its proxy, a real node, helm and operator-sdk, then every test, the real-server and real-node suites included.
	$(CARGO) test --workspace --locked

##@ Control plane (a real Kubernetes without a cluster)

.PHONY: tools
tools: ## Build the pinned helm, operator-sdk, promtool and the PromQL checker into bin/ (Go; only when a pin changed).
	hack/tools/build.sh

.PHONY: controlplane
controlplane: ## Build the pinned kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and kwok into bin/ (Go; only when a pin changed).
	hack/controlplane/build.sh

.PHONY: node
node: memcached-proxy ## Build a real node into bin/: the pinned kubelet and kube-proxy, containerd with its runc shim, runc, the CNI plugins, and the pause, memcached, TLS reload agent and operator images (Go and C, no registry; only when a pin changed). Needs libseccomp-dev, iptables (apt).
	hack/node/build.sh
	hack/node/images.sh

.PHONY: previous-release
previous-release: ## Build the operator of the last release (hack/previous-release/COMMIT) into bin/, for the upgrade test (tests/upgrade.rs; only when missing).
	hack/previous-release/build.sh

.PHONY: memcached-proxy
memcached-proxy: ## Build memcached with its built-in proxy from Debian's source package into bin/ (for tests/real_proxy.rs; only when missing).
	hack/memcached/build.sh

# Where cargo puts what it builds (CARGO_TARGET_DIR when set).
TARGET_DIR = $(or $(CARGO_TARGET_DIR),target)
# Which pinned Kubernetes version the dev cluster runs: newest or oldest.
KUBE ?= newest
# The pinned kubectl of the newest version (the dev cluster's tools).
KUBECTL_PINNED = $(lastword $(sort $(wildcard bin/k8s-v*/kubectl)))
DEV_KUBECONFIG ?= bin/dev-cluster.kubeconfig
# NODE=real: one real node (containerd and the kubelet, make node; needs root) instead of the
# kwok nodes, so every pod (make install run, kubectl apply -k config/samples) really runs.
NODE ?= fake
DEV_NODE_ARGS = $(if $(filter real,$(NODE)),--real-node --nodes 0)
# Seconds the dev cluster may take to start (a real node registers and turns Ready).
DEV_START_SECONDS = $(if $(filter real,$(NODE)),180,60)
# kubectl wait fails at once (not waits) while a new CRD has no conditions yet: asked again.
WAIT_CRD_ESTABLISHED = for i in $$(seq 30); do KUBECONFIG=$(DEV_KUBECONFIG) $(KUBECTL_PINNED) wait --for=condition=Established --timeout=60s crd/memcacheds.memcached.cache.example.com 2>/dev/null && exit 0; sleep 1; done; exit 1

.PHONY: dev-cluster
dev-cluster: controlplane $(if $(filter real,$(NODE)),node) ## Start a local cluster (real control plane, 3 kwok nodes; NODE=real: one real node instead) in the background; prints the KUBECONFIG to export.
	@if [ -f bin/dev-cluster.pid ] && kill -0 "$$(cat bin/dev-cluster.pid)" 2>/dev/null; then \
	  echo "dev-cluster already running (pid $$(cat bin/dev-cluster.pid)); make dev-cluster-down first"; exit 1; fi
	$(CARGO) build -q -p envtest --bin dev-cluster
	@rm -f $(DEV_KUBECONFIG)
	@nohup $(TARGET_DIR)/debug/dev-cluster --kube $(KUBE) --kubeconfig $(DEV_KUBECONFIG) $(DEV_NODE_ARGS) > bin/dev-cluster.log 2>&1 & echo $$! > bin/dev-cluster.pid
	@for i in $$(seq 1 $$(( $(DEV_START_SECONDS) * 10 ))); do \
	  if [ -f $(DEV_KUBECONFIG) ]; then cat bin/dev-cluster.log; exit 0; fi; \
	  if ! kill -0 "$$(cat bin/dev-cluster.pid)" 2>/dev/null; then cat bin/dev-cluster.log; rm -f bin/dev-cluster.pid; exit 1; fi; \
	  sleep 0.1; done; echo "dev-cluster did not start within $(DEV_START_SECONDS) s; see bin/dev-cluster.log"; exit 1

.PHONY: dev-cluster-down
dev-cluster-down: ## Stop the local cluster started by make dev-cluster (its data is thrown away).
	@if [ -f bin/dev-cluster.pid ]; then kill "$$(cat bin/dev-cluster.pid)" 2>/dev/null || true; \
	  while kill -0 "$$(cat bin/dev-cluster.pid)" 2>/dev/null; do sleep 0.1; done; rm -f bin/dev-cluster.pid; \
	  echo "dev-cluster stopped"; else echo "no dev-cluster running"; fi

.PHONY: e2e
e2e: ## Run the end-to-end tests against a real cluster: make e2e E2E_KUBECONFIG=~/.kube/config
	@test -n "$(E2E_KUBECONFIG)" || { echo "set E2E_KUBECONFIG to the kubeconfig of a disposable cluster"; exit 1; }
	E2E_KUBECONFIG="$(E2E_KUBECONFIG)" $(CARGO) test -p memcached-operator --test e2e -- --ignored --nocapture

.PHONY: demo
demo: ## Run the operator against the in-memory API server and narrate what it does.
	$(CARGO) run -p memcached-demo

# Benchmark sizes and extra flags: make bench BENCH_N=100,1000 BENCH_ARGS="--concurrency 8"
BENCH_N ?= 100,1000,5000
BENCH_ARGS ?=

# The benchmark harness is its own binary (crates/bench); the shipped operator carries none of it.
BENCH = $(TARGET_DIR)/release/bench

.PHONY: bench-build
bench-build:
	$(CARGO) build --release -p memcached-operator -p bench

.PHONY: bench
bench: bench-build ## Benchmark (release build; not part of the tests): convergence vs raw writes, steady state, latency, memory.
	$(BENCH) operator --n $(BENCH_N) $(BENCH_ARGS)

.PHONY: bench-real
bench-real: bench-build dev-cluster ## Benchmark on the real control plane with kwok nodes (release build; starts and stops a dev-cluster): make bench-real BENCH_N=1000
	KUBECONFIG=$(DEV_KUBECONFIG) $(KUBECTL_PINNED) apply --server-side -k config/crd
	$(WAIT_CRD_ESTABLISHED)
	$(BENCH) operator --kubeconfig $(DEV_KUBECONFIG) --audit-log bin/dev-cluster.audit.log --n $(BENCH_N) $(BENCH_ARGS); \
	  status=$$?; $(MAKE) -s dev-cluster-down; exit $$status

.PHONY: bench-latency
bench-latency: memcached-proxy controlplane ## The proxy's hop and the webhook's admission with its children's dry run (release build; BENCHMARKS.md).
	$(CARGO) build --release -p bench
	$(BENCH) latency

# Sizes of the side-by-side benchmark: make bench-side-by-side SBS_N=100,1000 SBS_ARGS="--runs 3"
SBS_N ?= 100,1000
SBS_ARGS ?=

.PHONY: peer-test
peer-test: ## Run the benchmark peer's own Go tests (bench/peer: go test ./...).
	cd bench/peer && go test ./...

.PHONY: bench-peer
bench-peer: ## Build the seeds' Go operator used as the benchmark peer (bench/peer, Go).
	bench/peer/build.sh

.PHONY: bench-side-by-side
bench-side-by-side: bench-build bench-peer dev-cluster ## The operator and the seeds' Go operator side by side on the real control plane (release build; starts and stops a dev-cluster).
	KUBECONFIG=$(DEV_KUBECONFIG) $(KUBECTL_PINNED) apply --server-side -k config/crd
	$(WAIT_CRD_ESTABLISHED)
	$(BENCH) side-by-side --kubeconfig $(DEV_KUBECONFIG) --audit-log bin/dev-cluster.audit.log --n $(SBS_N) $(SBS_ARGS); \
	  status=$$?; $(MAKE) -s dev-cluster-down; exit $$status

##@ Build

.PHONY: build
build: ## Build the operator binary (debug).
	$(CARGO) build -p memcached-operator

.PHONY: build-release
build-release: ## Build the release binary, as the Dockerfile does.
	$(CARGO) build --release --locked -p memcached-operator

.PHONY: run
run: manifests ## Run the operator from your host against the current kubeconfig (make install first).
	ENABLE_WEBHOOKS=false $(CARGO) run -p memcached-operator -- run --metrics-secure=false --metrics-bind-address=:8080 --health-probe-bind-address=:8081

.PHONY: docker-build
docker-build: ## Build the operator image: make docker-build IMG=registry/memcached-operator:tag
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the operator image.
	$(CONTAINER_TOOL) push $(IMG)

.PHONY: docker-build-tls-agent
docker-build-tls-agent: ## Build the TLS reload agent's own image: make docker-build-tls-agent TLS_AGENT_IMG=registry/memcached-tls-agent:tag
	$(CONTAINER_TOOL) build -f tls-agent.Dockerfile -t $(TLS_AGENT_IMG) .

.PHONY: docker-push-tls-agent
docker-push-tls-agent: ## Push the TLS reload agent's image.
	$(CONTAINER_TOOL) push $(TLS_AGENT_IMG)

##@ Release

.PHONY: check-version
check-version:
	@test "$(VERSION)" = "$(CRATE_VERSION)" || { echo "VERSION=$(VERSION) is not the crate's version $(CRATE_VERSION): one version for binary, image, chart and bundle; set [workspace.package] version in Cargo.toml, then make manifests bundle"; exit 1; }

.PHONY: bundle
bundle: check-version ## Write the OLM bundle (bundle/, bundle.Dockerfile; images IMAGE_TAG_BASE:VERSION and IMAGE_TAG_BASE-tls-agent:AGENT_VERSION) from the code and validate it with operator-sdk (OperatorHub validators).
	$(CARGO) run -q -p memcached-operator-gen -- bundle --dir . --image-repository $(IMAGE_TAG_BASE)
	$(OPERATOR_SDK) bundle validate ./bundle --select-optional suite=operatorframework
	$(OPERATOR_SDK) bundle validate ./bundle --select-optional name=operatorhub

.PHONY: bundle-build
bundle-build: ## Build the bundle image: make bundle-build BUNDLE_IMG=registry/memcached-operator-bundle:vX.Y.Z
	$(CONTAINER_TOOL) build -f bundle.Dockerfile -t $(BUNDLE_IMG) .

.PHONY: bundle-push
bundle-push: ## Push the bundle image.
	$(CONTAINER_TOOL) push $(BUNDLE_IMG)

.PHONY: release-manifests
release-manifests: check-version ## Write $(RELEASE_DIR)/install.yaml (config/default with images IMAGE_TAG_BASE:VERSION and IMAGE_TAG_BASE-tls-agent:AGENT_VERSION): make release-manifests VERSION=x.y.z
	@mkdir -p $(RELEASE_DIR)
	$(KUBECTL) kustomize config/default | sed -e 's|image: controller:latest$$|image: $(IMAGE_TAG_BASE):$(VERSION)|' -e 's|value: tls-agent:latest$$|value: $(IMAGE_TAG_BASE)-tls-agent:$(AGENT_VERSION)|' > $(RELEASE_DIR)/install.yaml
	@echo "wrote $(RELEASE_DIR)/install.yaml ($(IMAGE_TAG_BASE):$(VERSION), TLS reload agent $(IMAGE_TAG_BASE)-tls-agent:$(AGENT_VERSION))"

##@ Deployment

.PHONY: install
install: manifests ## Install the CRD into the cluster of the current kubeconfig.
	$(KUBECTL) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: ## Remove the CRD (and with it every Memcached) from the cluster.
	$(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -k config/crd

.PHONY: deploy
deploy: manifests ## Deploy the operator (config/default) with image IMG and the TLS reload agent's TLS_AGENT_IMG; needs cert-manager.
	$(KUBECTL) kustomize config/default | sed -e 's|image: controller:latest$$|image: $(IMG)|' -e 's|value: tls-agent:latest$$|value: $(TLS_AGENT_IMG)|' | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: ## Remove the operator, its RBAC and the CRD (and every Memcached) from the cluster.
	$(KUBECTL) kustomize config/default | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -
