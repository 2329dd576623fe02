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
# Signed versions (docs/security.md, "Signed versions"): SIGNING_KEY (a PEM EC private key) makes `make pipeline`
# sign each version it publishes (publish.signing_key); VERIFY_KEY (its public key) makes `make serve` load only
# versions signed by it (--verify-key). Both empty by default: unsigned, unverified.
SIGNING_KEY ?=
VERIFY_KEY ?=

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: setup tfjs-setup pipeline test test-heavy test-fast serve query inspect clean lint recommender-data

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py requirements.lock requirements-nodeps.lock
	@command -v $(PYTHON) >/dev/null || { echo "tfship needs $(PYTHON) on PATH"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# The TF.js converter's own venv (.venv-tfjs, requirements-tfjs.lock; why: tfjs/venv.py) and the Node.js
# runner's packages (tfjs/node, npm ci). Built on first use by a config with `convert.tfjs = true`.
tfjs-setup: setup
	$(PY) -m tfship.tfjs.venv

pipeline: setup
	$(TFSHIP) run --config $(CONFIG) --repository $(REPOSITORY) $(if $(SIGNING_KEY),--set publish.signing_key=$(SIGNING_KEY))

# The container tests (marker `docker`) build images and need a Docker engine: `make docker-test`.
# The suite runs on TEST_WORKERS pytest-xdist worker processes (default 2; each test file stays whole on one
# worker, --dist loadfile, so its module fixtures are built once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
test: setup
	$(PY) -m pytest -q -m "not docker and not heavy" $(XDIST) $(PYTEST_ARGS)

# The heavy tests (marker `heavy`): training across two hosts in network namespaces (tests/pipeline/
# test_train_hosts.py: kill, link cut, SIGTERM, resume, mismatched workers), minutes each; not in make test.
test-heavy: setup
	$(PY) -m pytest -q -m heavy $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not docker" $(PYTEST_ARGS)

serve: setup
	$(TFSHIP) serve --repository $(REPOSITORY) --model-name $(MODEL_NAME) --port $(GRPC_PORT) --rest-port $(REST_PORT) $(if $(VERIFY_KEY),--verify-key $(VERIFY_KEY))

query: setup
	$(TFSHIP) query --target 127.0.0.1:$(GRPC_PORT) --model-name $(MODEL_NAME) --config $(CONFIG) $(if $(RUN),--run $(RUN))

# Synthetic recommender shards (docs/training.md, "recommender"): make recommender-data RECORDS=1000000 SHARDS=8
recommender-data: setup
	$(TFSHIP) make-recommender-data --out $(or $(DATA_OUT),bench/work/recommender) --records $(or $(RECORDS),100000) --shards $(or $(SHARDS),8)

inspect: setup
	$(TFSHIP) inspect $(REPOSITORY)/$(MODEL_NAME)

# ruff (rules in pyproject.toml), the type checker (basedpyright, pyright's engine: `[tool.basedpyright]`, basic mode,
# the typed records strict; zero errors over the whole package, no baseline) and the
# import-linter contracts (the floors, docs/architecture.md), all over the checkout itself: `tfship/` links each
# top-level folder (docs/architecture.md, "One import name"), so each tool resolves `tfship.*` by path.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/basedpyright
	$(VENV)/bin/lint-imports --config pyproject.toml

clean:
	rm -rf runs models .pytest_cache .hypothesis .venv-edge .venv-tfjs tfjs/node/node_modules bench/work

# ---------------------------------------------------------------- containers (deploy/README.md)
# Docker targets drive the engine through `python -m tfship.deploy` (= `tfship deploy`). Where no
# engine answers, deploy/docker/ensure-dockerd.sh starts one (root only) and records it;
# docker-test stops what it started. BASE_IMAGE empty: the official python slim image when present
# or pullable, else tfship/base:bookworm (made by docker-base from the Debian mirror apt uses).
DEPLOY := $(PY) -m tfship.deploy
BASE_IMAGE ?=
OFFICIAL_BASE_IMAGE := python:3.11-slim-bookworm
METRICS_PORT ?= 9090
DOCKER_BUILD_ARGS = $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE))
# PLATFORM=linux/arm64: the edge image for arm64, built here under QEMU user emulation (Debian's
# qemu-user-static, registered by deploy/docker/ensure-binfmt.sh) on an arm64 base (debootstrap --arch arm64),
# tagged tfship:edge-arm64. The cloud and train images are linux/amd64 only (TensorFlow's CUDA wheels).
PLATFORM ?=
PLATFORM_ARCH = $(lastword $(subst /, ,$(PLATFORM)))
EDGE_PLATFORM_ARGS = $(if $(PLATFORM),--platform $(PLATFORM) --image tfship:edge-$(PLATFORM_ARCH))

.PHONY: docker-engine docker-engine-stop docker-base docker-cloud docker-edge docker-run-edge \
	docker-stop-edge docker-run-cloud docker-stop-cloud docker-train docker-test docker-lint docker-test-arm64 \
	docker-amd64-only bench-edge-startup

docker-engine:
	deploy/docker/ensure-dockerd.sh

docker-engine-stop:
	deploy/docker/stop-dockerd.sh

docker-base: docker-engine
	@if [ -n "$(PLATFORM)" ] && [ "$(PLATFORM)" != linux/amd64 ]; then \
	  ARCH=$(PLATFORM_ARCH) deploy/docker/ensure-binfmt.sh || exit 1; \
	  if [ -n "$(BASE_IMAGE)" ]; then echo "BASE_IMAGE=$(BASE_IMAGE) given"; \
	  elif docker pull -q --platform $(PLATFORM) $(OFFICIAL_BASE_IMAGE) >/dev/null 2>&1; then echo "using $(OFFICIAL_BASE_IMAGE)"; \
	  else ARCH=$(PLATFORM_ARCH) deploy/docker/build-base-image.sh; fi; \
	elif [ -n "$(BASE_IMAGE)" ]; then echo "BASE_IMAGE=$(BASE_IMAGE) given"; \
	elif docker image inspect $(OFFICIAL_BASE_IMAGE) >/dev/null 2>&1 || docker pull -q $(OFFICIAL_BASE_IMAGE) >/dev/null 2>&1; then \
	  echo "using $(OFFICIAL_BASE_IMAGE)"; \
	else echo "cannot pull $(OFFICIAL_BASE_IMAGE): building a local stand-in"; deploy/docker/build-base-image.sh; fi

docker-cloud: setup docker-amd64-only docker-base
	$(DEPLOY) build --target cloud $(DOCKER_BUILD_ARGS)

docker-amd64-only:
	@if [ -n "$(PLATFORM)" ] && [ "$(PLATFORM)" != linux/amd64 ]; then \
	  echo "PLATFORM=$(PLATFORM): the cloud and train images are linux/amd64 only (TensorFlow's GPU builds);" \
	       "only docker-edge takes PLATFORM" >&2; exit 2; fi

docker-edge: setup docker-base
	$(DEPLOY) build --target edge $(DOCKER_BUILD_ARGS) $(EDGE_PLATFORM_ARGS)

# The training image (tfship:train): the pipeline extra, configs/ in /opt/tfship/configs, `tfship` as its entry
# point (deploy/k8s/train runs it).
docker-train: setup docker-amd64-only docker-base
	$(DEPLOY) build --target train $(DOCKER_BUILD_ARGS)

docker-run-edge: docker-edge
	$(DEPLOY) run --target edge --repository $(REPOSITORY) --model-name $(MODEL_NAME) \
	  --grpc-port $(GRPC_PORT) --rest-port $(REST_PORT) --metrics-port $(METRICS_PORT)

docker-stop-edge: setup
	$(DEPLOY) stop --target edge

docker-run-cloud: docker-cloud
	$(DEPLOY) run --target cloud --repository $(REPOSITORY) --model-name $(MODEL_NAME) \
	  --grpc-port $(GRPC_PORT) --rest-port $(REST_PORT) --metrics-port $(METRICS_PORT)

docker-stop-cloud: setup
	$(DEPLOY) stop --target cloud

# Builds the three images, serves the published model from both server images (every backend), queries,
# stops; runs `tfship` in the training image. The images are built first, outside pytest's per-test time limit
# (the first cloud build downloads TensorFlow's CUDA wheels, several GB); the tests then find them cached.
# Not part of `make test` (marker `docker`); needs a published model (`make pipeline`).
docker-test: setup
	@test -d $(REPOSITORY)/$(MODEL_NAME) || $(MAKE) pipeline
	@start=$$(date +%s); status=0; \
	deploy/docker/ensure-dockerd.sh || exit 1; \
	{ $(MAKE) --no-print-directory docker-base && \
	  $(DEPLOY) build --target edge --quiet $(DOCKER_BUILD_ARGS) && \
	  $(DEPLOY) build --target cloud --quiet $(DOCKER_BUILD_ARGS) && \
	  $(DEPLOY) build --target train --quiet $(DOCKER_BUILD_ARGS) && \
	  BASE_IMAGE="$(BASE_IMAGE)" TFSHIP_DOCKER_REPOSITORY="$(abspath $(REPOSITORY))" TFSHIP_DOCKER_MODEL_NAME=$(MODEL_NAME) \
	  $(PY) -m pytest -q -m "docker and not arm64" tests/deploy $(PYTEST_ARGS); } || status=$$?; \
	deploy/docker/stop-dockerd.sh; \
	echo "docker-test: exit $$status after $$(( $$(date +%s) - start ))s"; exit $$status

# The arm64 edge image under QEMU user emulation: builds it (docker-edge PLATFORM=linux/arm64), then serves the
# published model on ONNX and on the float32 and int8 TFLite files and checks the answers as docker-test does.
# Emulated speed means nothing: it reports the time taken, no throughput.
docker-test-arm64: setup
	@test -d $(REPOSITORY)/$(MODEL_NAME) || $(MAKE) pipeline
	@start=$$(date +%s); status=0; \
	deploy/docker/ensure-dockerd.sh || exit 1; \
	{ $(MAKE) --no-print-directory docker-edge PLATFORM=linux/arm64 BASE_IMAGE="$(BASE_IMAGE)" && \
	  built=$$(date +%s) && \
	  TFSHIP_DOCKER_REPOSITORY="$(abspath $(REPOSITORY))" TFSHIP_DOCKER_MODEL_NAME=$(MODEL_NAME) \
	  $(PY) -m pytest -q -m "docker and arm64" tests/deploy $(PYTEST_ARGS); } || status=$$?; \
	deploy/docker/stop-dockerd.sh; \
	echo "docker-test-arm64: exit $$status after $$(( $$(date +%s) - start ))s" \
	  "(tests $$(( $$(date +%s) - $${built:-$$(date +%s)} ))s)"; exit $$status

# Edge image start-up (container start to SERVING, engine timestamps) per edge backend, on the published
# model: bench/results/edge-startup-latest.{json,md}. Needs tfship:edge (make docker-edge) and `make pipeline`.
bench-edge-startup: setup
	$(PY) -m bench.edge_startup --repository $(REPOSITORY) --model-name $(MODEL_NAME)

docker-lint: setup
	$(VENV)/bin/hadolint Dockerfile

# ---------------------------------------------------------------- training (docs/training.md)
TB_PORT ?= 6006
TB_LOGDIR ?= runs

.PHONY: bench-train bench-train-loop tensorboard

# Both training benchmarks: steps/s of the train step (eager, tf.function, tf.function+XLA, float32 and mixed
# precision, on the CNN and a larger MLP; bench/results/train_bench.*), then bench-train-loop.
bench-train: setup
	$(PY) -m bench.train.run_bench --out bench/results
	$(PY) -m bench.train.loop_vs_fit --out bench/results $(BENCH_TRAIN_LOOP_ARGS)

# Issue 39: `tfship train` against a hand-written Keras fit (same files, model, batch, Adam, XLA; both timed over
# their K-step blocks after the first; the reference's steps_per_execution tuned): the tiny MLP on 1 M records,
# the digits CNN, the 5 M-row recommender; end to end: the marginal records/s of whole `tfship train` processes,
# (1 M - 100 k) / (T_1M - T_100k), cold (the scan runs) and with data.split_sizes declared (no scan), against
# plain read + parse; and the recommender's eager / tf.function / XLA, float32 / bfloat16 (the layers' precision
# read back from model.keras), 5 M / 50 k rows through `tfship train`. Each run its own process, 3 rounds, ratios
# within the run; about an hour on 2 cores (docs/benchmarks.md). Data in bench/work/train-loop (kept).
# bench/results/train-loop-latest.{json,md,png}.
# BENCH_TRAIN_LOOP_ARGS="--cases mlp --records 200000 --repeats 1" for a quicker run (~5 min), "--quick --cases mlp
# --e2e-variants cold" for a smoke run (~1.5 min), "--cases mlp,cnn" for some cases.
BENCH_TRAIN_LOOP_ARGS ?=
bench-train-loop: setup
	$(PY) -m bench.train.loop_vs_fit --out bench/results $(BENCH_TRAIN_LOOP_ARGS)

# Streaming input pipeline vs hand-written tf.data (records/s, TFRecord and CSV), peak RSS of `tfship train` on
# 1 M vs 10 M records, input-wait share of the digits CNN from TFRecord shards. Data in bench/work/ (kept).
# bench/results/input-latest.{json,md}. BENCH_INPUT_ARGS="--parts throughput --records 100000" for a quick run.
.PHONY: bench-input
bench-input: setup
	$(PY) -m bench.input.run_bench --out bench/results $(BENCH_INPUT_ARGS)

# The recommender (issue 34): eager / tf.function / XLA x float32 / bfloat16 step time, input-wait share, 50 k vs
# 5 M-row user table, AUC against the planted signal. Data in bench/work/recommender (kept).
# bench/results/recommender-latest.{json,md}. BENCH_RECOMMENDER_ARGS="--records 50000" for a quicker run.
.PHONY: bench-recommender
bench-recommender: setup
	$(PY) -m bench.train.recommender --out bench/results $(BENCH_RECOMMENDER_ARGS)

# 1 M records from 8 shards: trained one epoch, AUC vs planted, shipped (SavedModel, ONNX, TFLite), served, and a
# multi-input Predict over gRPC and REST from every artifact. bench/results/recommender-e2e-latest.{json,md}.
.PHONY: bench-recommender-e2e
bench-recommender-e2e: setup
	$(PY) -m bench.train.recommender_e2e --out bench/results $(BENCH_RECOMMENDER_ARGS)

# TensorBoard over every run's events (<run>/tensorboard); installs the viewer on first use.
tensorboard: setup
	@$(PY) -c "import tensorboard" 2>/dev/null || $(PY) -m pip install --quiet --disable-pip-version-check "tensorboard==2.21.0"
	$(VENV)/bin/tensorboard --logdir $(TB_LOGDIR) --port $(TB_PORT)

# ---------------------------------------------------------------- benchmarks (bench/serve/, bench/pipeline/)
.PHONY: bench-serve bench-pipeline

# Issue 14's serving table in one run: tfship (onnx batching / no batching, saved_model batching, identity)
# against a bare grpc.aio server and a hand-written per-request ONNX Runtime server, REST :predict (row and
# columnar) against bare aiohttp, --num-processes 1 vs 2; 3 alternating rounds, medians, PASS/MISS per
# target. Results in bench/results/serve-latest.{json,md,png}. BENCH_QUICK=1: short windows, one round
# (~3 min); BENCH_PROFILE_S=N: py-spy of the per-request path into bench/results/serve-profile.md.
BENCH_QUICK ?=
BENCH_PROFILE_S ?= 0
bench-serve: setup
	BENCH_QUICK=$(BENCH_QUICK) BENCH_PROFILE_S=$(BENCH_PROFILE_S) $(PY) -m bench.serve.run_bench --out bench/results
	$(PY) -m bench.serve.shadow_tracing --out bench/results

# Issue 33: primary throughput and latency with a 100 % shadow, and with tracing sampled at 1 % and 100 %, against
# the same server without either; the shadow's hand-over cost per request. bench/results/shadow-tracing-latest.*
# (~2 min).
.PHONY: bench-shadow-tracing
bench-shadow-tracing: setup
	$(PY) -m bench.serve.shadow_tracing --out bench/results

# Stage time and peak memory (process + children) for wide MLPs of ~1, 30 and 300 MB of weights built
# here and for ResNet50 (bench/zoo, random weights): export, audit, each conversion, the convert stage
# (conversions side by side within its memory budget), validate, serve-check, publish, then server load
# time, first-request latency and RSS per loaded version. bench/results/pipeline-latest.*.
# BENCH_SIZES=1,30,resnet50 picks sizes (MB) or architectures; BENCH_STAGES=export,convert picks stages;
# BENCH_QUICK=1 runs 1 MB only.
BENCH_SIZES ?=
BENCH_STAGES ?=
bench-pipeline: setup
	BENCH_QUICK=$(BENCH_QUICK) BENCH_SIZES=$(BENCH_SIZES) BENCH_STAGES=$(BENCH_STAGES) $(PY) -m bench.pipeline.run_bench --out bench/results

# Real architectures (keras.applications MobileNetV3Small, EfficientNetB0, ResNet50, DenseNet121, ConvNeXtTiny,
# a Transformer text classifier on raw strings, a GRU over a variable time axis, a two-signature tf.Module),
# random weights with BatchNorm statistics from synthetic photographs (no downloads), each through its export
# routes (.keras file, model.export() SavedModel) with `tfship run --model ... --data ...`: per-artifact outcome,
# time, peak memory. bench/results/zoo-latest.{json,md}. ZOO_MEMBERS=a,b picks members; ZOO_ROUTES=keras
# picks routes; ZOO_BUDGET_S=N starts no run after N seconds; ZOO_ARGS passes more (--small, --set K=V).
.PHONY: zoo
ZOO_MEMBERS ?=
ZOO_ROUTES ?=
ZOO_BUDGET_S ?= 0
ZOO_ARGS ?=
zoo: setup
	ZOO_MEMBERS=$(ZOO_MEMBERS) ZOO_ROUTES=$(ZOO_ROUTES) ZOO_BUDGET_S=$(ZOO_BUDGET_S) \
	  $(PY) -m bench.zoo.run_zoo --out bench/results $(ZOO_ARGS)

# ---------------------------------------------------------------- the GPU path (bench/gpu_check/, docs/benchmarks.md)
.PHONY: gpu-check

# On an NVIDIA GPU host: training (XLA, mixed_float16 + loss scaling, mixed_bfloat16) against CPU, publishing
# from each precision, SavedModel and ONNX Runtime CUDA serving (heavy MLP, ResNet50), two models under
# --per_process_gpu_memory_fraction, the cloud image with --gpus all, and --num-processes 1/2/4/8 scaling on
# CPU. Without a GPU the CPU parts run and each GPU part says why it was skipped. One table, and
# bench/results/gpu-check-latest.{json,md}; GPU_CHECK_ARGS="--parts serving,scaling --budget-s 300".
GPU_CHECK_ARGS ?=
gpu-check: setup
	$(PY) -m bench.gpu_check --out bench/results $(GPU_CHECK_ARGS)

# ---------------------------------------------------------------- reliability attacks (bench/reliability/)
.PHONY: reliability

# The longer attacks: load with hot swaps and corrupt versions, SIGTERM/SIGHUP under load, kill -9 of the
# publisher / a --num-processes server / a parent holding a serve-check server and a TFLite converter / a
# whole `tfship run` (orphan and staging checks), every port under TLS/mTLS/tokens, metrics cardinality,
# memory per request, gRPC port sharing, and the hostile-load round (mixed-protocol load, huge echoed names,
# unrepresentable REST bodies, secret rotation, SIGTERM mid-body, memory after large bodies). Loopback only,
# at most RELIABILITY_BUDGET_S seconds; a summary table (tried, failed, verdict) in
# bench/results/reliability-latest.{json,md}. Exit 1 if any row failed.
RELIABILITY_BUDGET_S ?= 900
RELIABILITY_ARGS ?=
reliability: setup
	$(PY) -m bench.reliability.run --out bench/results --budget-s $(RELIABILITY_BUDGET_S) $(RELIABILITY_ARGS)

# ---------------------------------------------------------------- TF Serving's own suite (docs/tf-serving.md)
.PHONY: tfs-suite

# TF Serving's integration suite (tensorflow_model_server_test.py, 30 tests), run unchanged from a
# tensorflow/serving git snapshot (TFS_SERVING=path, a bare clone is fine) against this checkout's
# tensorflow_model_server, by the harness in ../shared/tfs-suite/ (its README: what it provides; it changes
# no flag, request or assertion). TFS_SUITE_ONLY=testA,testB runs a subset; TFS_SUITE_OUT=DIR keeps the logs.
# TF_USE_LEGACY_KERAS=1: the suite's tf.keras is Keras 2 (tf-keras, pinned), for which it was written: Keras 3
# names a Sequential model's input `inputs`, where the suite's two Keras tests send `x`.
TFS_SERVING ?=
TFS_SUITE_HARNESS ?= ../shared/tfs-suite/run.sh
tfs-suite: setup
	@if [ -z "$(TFS_SERVING)" ]; then \
	  echo "tfs-suite: skipped: give TFS_SERVING=<path to a tensorflow/serving git snapshot>" \
	       "(e.g. git clone --bare https://github.com/tensorflow/serving)"; exit 0; fi; \
	if [ ! -x "$(TFS_SUITE_HARNESS)" ] && [ ! -f "$(TFS_SUITE_HARNESS)" ]; then \
	  echo "tfs-suite: skipped: no harness at $(TFS_SUITE_HARNESS) (set TFS_SUITE_HARNESS)"; exit 0; fi; \
	TF_USE_LEGACY_KERAS=1 bash "$(TFS_SUITE_HARNESS)" "$(CURDIR)" "$(TFS_SERVING)"
