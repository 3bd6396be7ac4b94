# pdfleet — kubebuilder-style targets. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP) ## Create .venv with pdfleet and its development dependencies.

manifests: $(STAMP) ## Generate crds/ and the chart's CRDs from the API models.
	$(PY) -m pdfleet.api.crd crds
	$(PY) -m pdfleet.api.crd charts/pdfleet/crds
	$(PY) -m pdfleet.api.docs docs/api.md

lint: $(STAMP) ## Ruff and mypy --strict.
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-unit: $(STAMP) ## Unit tests (pure code, no cluster).
	$(VENV)/bin/pytest tests/unit

verify: lint test-unit ## Lint, types, generated-file drift and unit tests.

toolchain: ## Build the pinned Kubernetes/etcd/kwok/helm/prometheus binaries (cached outside the checkout).
	e2e/toolchain.sh

# Everything that talks to a cluster, a router or Prometheus runs inside one private network
# namespace (e2e/netns.sh): pod IPs are real there and nothing can leave the machine.
test-integration: $(STAMP) toolchain ## Integration tests: real kube-apiserver, router, Prometheus.
	e2e/netns.sh $(VENV)/bin/pytest tests/integration tests/router

test: verify test-integration ## Everything CI runs: lint, types, unit and integration tests.

.PHONY: help install manifests lint test-unit verify toolchain test-integration test
