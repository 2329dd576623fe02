# tfship: every target creates .venv itself (through `setup`) when it is missing or stale.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
TFSHIP := $(VENV)/bin/tfship
STAMP := $(VENV)/.tfship-installed
CONFIG ?= configs/digits.toml
REPOSITORY ?= models
MODEL_NAME ?= digits
GRPC_PORT ?= 8500
REST_PORT ?= 8501
PYTEST_ARGS ?=

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: setup pipeline test test-fast serve query inspect clean lint

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "tfship needs $(PYTHON) on PATH"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

pipeline: setup
	$(TFSHIP) run --config $(CONFIG) --repository $(REPOSITORY)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

serve: setup
	$(TFSHIP) serve --repository $(REPOSITORY) --model-name $(MODEL_NAME) --port $(GRPC_PORT) --rest-port $(REST_PORT)

query: setup
	$(TFSHIP) query --target 127.0.0.1:$(GRPC_PORT) --model-name $(MODEL_NAME) --config $(CONFIG)

inspect: setup
	$(TFSHIP) inspect $(REPOSITORY)/$(MODEL_NAME)

lint: setup
	$(PY) -m ruff check pipeline signatures serving tflite tests

clean:
	rm -rf runs models .pytest_cache
