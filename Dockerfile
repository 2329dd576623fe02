# syntax=docker/dockerfile:1
# tfship model server images: one Dockerfile, two targets.
#
#   cloud  TensorFlow (CUDA wheels) + onnxruntime-gpu + LiteRT: serves SavedModel, ONNX and TFLite.
#          Runs on GPU when one is visible (docker run --gpus all), on CPU otherwise.
#   edge   No TensorFlow: LiteRT + ONNX Runtime (CPU) behind the same server; linux/amd64 and
#          linux/arm64 (docker buildx build --platform linux/amd64,linux/arm64 --target edge .).
#
# Both serve the TF Serving layout $MODEL_BASE_PATH/$MODEL_NAME/<version>/ on 8500 (gRPC),
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

# Stage order matters for the classic builder, which builds every stage above its target:
# the cloud deps come after the edge image so `--target edge` never downloads CUDA wheels.
FROM builder AS edge-deps
COPY deploy/requirements-edge.txt /tmp/requirements.txt
COPY pyproject.toml README.md /tmp/tfship/
COPY core /tmp/tfship/core
COPY serving /tmp/tfship/serving
COPY pipeline /tmp/tfship/pipeline
COPY signatures /tmp/tfship/signatures
COPY tflite /tmp/tfship/tflite
COPY deploy/__init__.py deploy/__main__.py deploy/cli.py deploy/engine.py /tmp/tfship/deploy/
# tfship's TF-free install (README: `pip install -c requirements.lock .`), pinned by the edge file, which
# lists every package; pip check proves nothing is missing and no TensorFlow came along.
RUN pip install -c /tmp/requirements.txt /tmp/tfship \
 && pip check \
 && if python3 -c "import tensorflow" 2>/dev/null; then echo "TensorFlow in the edge image" >&2; exit 1; fi \
 && pip uninstall --yes pip setuptools \
 && find /opt/venv -name '*.dist-info' -prune -o -type d -name tests -path '*/site-packages/*' -prune -exec rm -rf {} + \
 && rm -rf /tmp/requirements.txt /tmp/tfship

# ---------------------------------------------------------------- runtime: shared settings
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
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python3", "/opt/tfship/bin/healthcheck.py"]
STOPSIGNAL SIGTERM
# exec form: the server is PID 1 and receives SIGTERM itself (entrypoint.py exec()s it).
ENTRYPOINT ["python3", "/opt/tfship/bin/entrypoint.py"]

# ---------------------------------------------------------------- tfship's own code (the cloud target)
FROM scratch AS app
COPY deploy/docker/entrypoint.py deploy/docker/healthcheck.py /opt/tfship/bin/
COPY core /opt/tfship/src/core
COPY pipeline /opt/tfship/src/pipeline
COPY serving /opt/tfship/src/serving
COPY signatures /opt/tfship/src/signatures
COPY tflite /opt/tfship/src/tflite

# ---------------------------------------------------------------- edge
FROM runtime AS edge
ENV TFSHIP_IMAGE_TARGET=edge
COPY --from=edge-deps /opt/venv /opt/venv
COPY deploy/docker/entrypoint.py deploy/docker/healthcheck.py /opt/tfship/bin/
USER 10001:10001

FROM builder AS cloud-deps
COPY deploy/requirements-cloud.txt /tmp/requirements.txt
# setuptools stays: TensorFlow lists it as a runtime dependency.
RUN pip install --no-deps -r /tmp/requirements.txt \
 && pip check \
 && pip uninstall --yes pip \
 && rm -f /tmp/requirements.txt

# ---------------------------------------------------------------- cloud (last: the default target)
FROM runtime AS cloud
# The CUDA libraries come from the nvidia-* wheels; onnxruntime-gpu finds them on LD_LIBRARY_PATH,
# TensorFlow finds them by itself. Without a GPU both run on CPU.
ARG SITE=/opt/venv/lib/python3.11/site-packages/nvidia
ENV TFSHIP_IMAGE_TARGET=cloud \
    PYTHONPATH=/opt/tfship/src \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=${SITE}/cublas/lib:${SITE}/cuda_runtime/lib:${SITE}/cudnn/lib:${SITE}/cufft/lib:${SITE}/curand/lib:${SITE}/cusolver/lib:${SITE}/cusparse/lib:${SITE}/nvjitlink/lib:${SITE}/cuda_nvrtc/lib:${SITE}/nccl/lib
COPY --from=cloud-deps /opt/venv /opt/venv
COPY --from=app /opt/tfship /opt/tfship
USER 10001:10001
