# syntax=docker/dockerfile:1
# tfship images: one Dockerfile, three targets, each the tfship package installed with one extra.
#
#   edge   `pip install -c requirements.lock .`: no TensorFlow; LiteRT + ONNX Runtime (CPU) behind the
#          server; linux/amd64 and linux/arm64 (docker buildx build --platform linux/amd64,linux/arm64 --target edge .).
#   cloud  `.[cloud]`: adds TensorFlow with its CUDA wheels: serves SavedModel, ONNX and TFLite; SavedModel
#          runs on GPU when one is visible (docker run --gpus all), everything on CPU otherwise.
#   train  `.[cloud,pipeline]`: the pipeline (`tfship run`, configs/ in /opt/tfship/configs) for training jobs.
#
# Every package comes from pyproject.toml (the package's dependencies and the image's extra), pinned by
# requirements.lock used as constraints, so an image cannot install anything the package does not own
# (tests/deploy/test_dockerfile.py). The server images serve the TF Serving layout $MODEL_BASE_PATH/$MODEL_NAME/<version>/ on 8500 (gRPC),
# 8501 (REST) and $METRICS_PORT (Prometheus), as a non-root user; see deploy/README.md.
#
# BASE_IMAGE must be a Debian-based image with python3.11 and python3 -m venv (the official
# python slim image by default; deploy/docker/build-base-image.sh makes a local stand-in where
# no registry can be pulled from).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- builder: one venv per target
FROM ${BASE_IMAGE} AS builder
# pip trusts the system CA bundle (a TLS-inspecting proxy's CA lands there, not in pip's certifi).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=120 \
    PIP_CERT=${PIP_CERT} \
    PATH=/opt/venv/bin:${PATH}
RUN python3 -m venv /opt/venv
# What pip resolves the dependencies from: pyproject.toml (with setup.py, its package list) and the lock, with an
# empty `tfship` package, so the dependency layers stay cached until those files change. The code goes in last
# (`source`).
COPY pyproject.toml setup.py requirements.lock /tmp/deps/
RUN mkdir /tmp/deps/tfship && touch /tmp/deps/tfship/__init__.py /tmp/deps/README.md

# The package's source tree (pyproject.toml's package-dir maps `tfship.<name>` to the top-level folder <name>: one
# COPY per folder), in /src of a base-image stage: the classic builder's cache would hand an arm64 build the amd64 image of an identical FROM scratch stage and then refuse it
# ("does not match the specified platform"); on the base image the stage is per platform.
FROM ${BASE_IMAGE} AS source
COPY pyproject.toml setup.py README.md /src/
COPY tfship /src/tfship
COPY core /src/core
COPY serving /src/serving
COPY pipeline /src/pipeline
COPY signatures /src/signatures
COPY tflite /src/tflite
COPY tfjs /src/tfjs
COPY onnx_format /src/onnx_format
COPY deploy /src/deploy

# Stage order matters for the classic builder, which builds every stage above its target:
# the TensorFlow stages come after the edge image so `--target edge` never downloads CUDA wheels.
FROM builder AS edge-deps
# The README's TF-free install: the dependencies, then the package over its empty stand-in (--no-deps: they
# are the same pyproject's). pip check proves nothing is missing; no TensorFlow may come along.
RUN pip install -c /tmp/deps/requirements.lock /tmp/deps
COPY --from=source /src /tmp/tfship/
RUN pip install --no-deps --force-reinstall /tmp/tfship \
 && pip check \
 && if python3 -c "import tensorflow" 2>/dev/null; then echo "TensorFlow in the edge image" >&2; exit 1; fi \
 && pip uninstall --yes pip setuptools \
 && find /opt/venv -name '*.dist-info' -prune -o -type d -name tests -path '*/site-packages/*' -prune -exec rm -rf {} + \
 && rm -rf /tmp/tfship /tmp/deps

# ---------------------------------------------------------------- runtime: the server images' shared settings
FROM ${BASE_IMAGE} AS runtime
ARG UID=10001
# The image runs as this numeric uid (USER below), so Kubernetes runAsNonRoot can verify it.
RUN useradd --system --uid "${UID}" --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tfship \
 && mkdir -p /models \
 && chown tfship:tfship /models
# HOME=/tmp: the only writable place (read-only root file system in Kubernetes).
ENV PATH=/opt/venv/bin:${PATH} \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    MODEL_NAME=model \
    MODEL_BASE_PATH=/models \
    GRPC_PORT=8500 \
    REST_PORT=8501 \
    METRICS_PORT=9090
EXPOSE 8500 8501 9090
WORKDIR /opt/tfship
COPY deploy/docker/entrypoint.py deploy/docker/healthcheck.py /opt/tfship/bin/
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python3", "/opt/tfship/bin/healthcheck.py"]
STOPSIGNAL SIGTERM
# exec form: the server is PID 1 and receives SIGTERM itself (entrypoint.py exec()s it).
ENTRYPOINT ["python3", "/opt/tfship/bin/entrypoint.py"]

# ---------------------------------------------------------------- edge
# The edge image's root file system: the base, the venv and the entry point, then deploy/docker/slim-edge.sh
# cuts what a TensorFlow-free server does not need (pip, translations, ONNX Runtime's C API library, LiteRT's
# GPU and NPU plug-ins, unused bytecode; the list and the reasons are in the script).
FROM ${BASE_IMAGE} AS edge-root
ARG UID=10001
RUN useradd --system --uid "${UID}" --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tfship \
 && mkdir -p /models \
 && chown tfship:tfship /models
COPY --from=edge-deps /opt/venv /opt/venv
COPY deploy/docker/entrypoint.py deploy/docker/healthcheck.py /opt/tfship/bin/
COPY deploy/docker/slim-edge.sh /tmp/slim-edge.sh
RUN sh /tmp/slim-edge.sh && rm /tmp/slim-edge.sh

# One layer, copied from edge-root into an empty image, so the cuts count (a later layer deleting files does
# not shrink an image). The settings are the runtime stage's (tests/deploy/test_dockerfile.py holds them equal),
# plus the two the base image's own (LANG, PATH) that an empty image does not inherit.
FROM scratch AS edge
# hadolint ignore=DL3067  # copying the whole root is the point: one layer, without what slim-edge.sh removed
COPY --from=edge-root / /
ENV LANG=C.UTF-8 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    MODEL_NAME=model \
    MODEL_BASE_PATH=/models \
    GRPC_PORT=8500 \
    REST_PORT=8501 \
    METRICS_PORT=9090 \
    TFSHIP_IMAGE_TARGET=edge
EXPOSE 8500 8501 9090
WORKDIR /opt/tfship
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python3", "/opt/tfship/bin/healthcheck.py"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "/opt/tfship/bin/entrypoint.py"]
USER 10001:10001

# ---------------------------------------------------------------- TensorFlow venvs (cloud, train)
FROM builder AS tensorflow-deps
# `cloud`: TensorFlow with the CUDA wheels it names (pinned in the extra: requirements.lock is the CPU lock).
# setuptools stays: TensorFlow lists it as a runtime dependency.
RUN pip install -c /tmp/deps/requirements.lock "/tmp/deps[cloud,tracing,signing]"

FROM tensorflow-deps AS train-deps
# `pipeline` on top: training, export, conversion and the gate (the cloud layers stay shared in the cache).
RUN pip install -c /tmp/deps/requirements.lock "/tmp/deps[cloud,pipeline,tracing,signing]"
COPY --from=source /src /tmp/tfship/
RUN pip install --no-deps --force-reinstall /tmp/tfship \
 && pip check \
 && pip uninstall --yes pip \
 && rm -rf /tmp/tfship /tmp/deps

# ---------------------------------------------------------------- train: `tfship` as the entry point
FROM ${BASE_IMAGE} AS train
ARG UID=10001
# Runs and published versions land in /work (mount volumes there: runs/ and models/ by the config's defaults).
RUN useradd --system --uid "${UID}" --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tfship \
 && mkdir -p /work \
 && chown tfship:tfship /work
ENV PATH=/opt/venv/bin:${PATH} \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    TFSHIP_IMAGE_TARGET=train
COPY --from=train-deps /opt/venv /opt/venv
COPY configs /opt/tfship/configs
WORKDIR /work
USER 10001:10001
ENTRYPOINT ["tfship"]
CMD ["run", "--config", "/opt/tfship/configs/digits.toml"]

FROM tensorflow-deps AS cloud-deps
COPY --from=source /src /tmp/tfship/
RUN pip install --no-deps --force-reinstall /tmp/tfship \
 && pip check \
 && pip uninstall --yes pip \
 && rm -rf /tmp/tfship /tmp/deps

# ---------------------------------------------------------------- cloud (last: the default target)
FROM runtime AS cloud
# TensorFlow finds the CUDA libraries in the nvidia-* wheels by itself. Without a GPU it runs on CPU.
ENV TFSHIP_IMAGE_TARGET=cloud \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=cloud-deps /opt/venv /opt/venv
USER 10001:10001
