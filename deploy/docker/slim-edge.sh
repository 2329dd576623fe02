#!/bin/sh
# Cut what a TensorFlow-free server does not need out of the edge image's root file system.
#
# Runs as root in the Dockerfile's `edge-root` stage, after the venv is in place; the `edge` target then
# copies the result into an empty image (FROM scratch), so what is removed here is really gone (a later
# layer deleting files would not make the image smaller). deploy/README.md tables the sizes before and after.
#
# Kept: the Debian package database (/var/lib/dpkg: scanners such as trivy read it to find vulnerable
# packages; what is purged below is purged through dpkg, so the database stays true), Python's standard
# library, the shared libraries, every module the server imports, with its bytecode.
# Removed, each with why:
#   - pip, setuptools, wheel and the venv module (dpkg --purge, or files of a /usr/local Python): the image
#     installs nothing at run time;
#   - apt with its keys and TLS stack, e2fsprogs, and perl-base last (an Essential package, so with dpkg's
#     --force-remove-essential): package management and file system tools, not needed to serve. Each is
#     purged through dpkg, which refuses any package another installed package still depends on (listed as kept);
#   - translations, documentation, manual pages (/usr/share/{locale,doc,man,info}): the server logs in English;
#   - glibc's iconv modules (gconv): Python's codecs are its own, and neither runtime converts charsets;
#   - standard-library parts for developers (lib2to3, pydoc_data, ensurepip, idlelib, tkinter, turtledemo, test);
#   - ONNX Runtime's C API library (libonnxruntime.so.*: the Python binding links the runtime in itself; checked
#     below) and its Python tools (transformers, quantization, tools: model conversion, not inference);
#   - LiteRT's WebGPU accelerator (loaded only when a GPU delegate is asked for; the server runs the CPU
#     interpreter), its NPU vendor plug-ins, ahead-of-time compiler and plug-in tool, and libLiteRt.so (the
#     CompiledModel API's library: `ai_edge_litert` loads it only when present; the Interpreter is
#     libpywrap_litert_common.so, and the docker tests serve every TFLite mode without it);
#   - numpy's build helpers (f2py, distutils, C headers and static libraries);
#   - type stubs (*.pyi), and the bytecode of modules the server never imports: every __pycache__ is removed,
#     then the server's modules are imported once to write theirs again (`$PY -c ...` below).
set -eu

VENV=/opt/venv
PY="$VENV/bin/python3"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
STDLIB="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
before="$(du -sxm / | cut -f1)"

# --- the operating system -----------------------------------------------------------------------------
if command -v dpkg >/dev/null 2>&1; then
  # shellcheck disable=SC2046  # one package name per word
  dpkg --purge $(dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' \
      python3-pip python3-setuptools python3-wheel python3-pkg-resources python3-venv python3.11-venv \
      python3-pip-whl python3-setuptools-whl 2>/dev/null | awk '$1 == "ii" {print $2}') >/dev/null
fi
for dist in "$(dirname "$STDLIB")"/python3*/site-packages /usr/local/lib/python3*/site-packages; do
  [ -d "$dist" ] || continue  # a base image's own Python (the official image keeps it in /usr/local)
  rm -rf "$dist"/pip "$dist"/pip-* "$dist"/setuptools "$dist"/setuptools-* "$dist"/wheel "$dist"/wheel-* \
         "$dist"/pkg_resources "$dist"/_distutils_hack "$dist"/distutils-precedence.pth
done
rm -f /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel
if command -v dpkg >/dev/null 2>&1; then
  kept=""
  for package in apt gpgv debian-archive-keyring libapt-pkg6.0 libgnutls30 libp11-kit0 libtasn1-6 libhogweed6 \
                 libnettle8 libidn2-0 libunistring2 libseccomp2 libxxhash0 libudev1 e2fsprogs logsave libss2 \
                 libext2fs2 perl-base; do
    dpkg-query -W -f '${db:Status-Abbrev}' "$package" 2>/dev/null | grep -q '^ii' || continue
    dpkg --purge --force-remove-essential "$package" >/dev/null 2>&1 || kept="$kept $package"
  done
  [ -z "$kept" ] || echo "slim-edge: kept (other packages depend on them):$kept"
fi
rm -rf /usr/share/locale/* /usr/share/doc/* /usr/share/man/* /usr/share/info/* /usr/share/lintian \
       /usr/lib/*-linux-gnu/gconv /var/cache/debconf/*-old /var/lib/apt/lists/* /var/log/*
for part in lib2to3 pydoc_data ensurepip idlelib tkinter turtledemo test; do
  rm -rf "${STDLIB:?}/$part"
done

# --- the venv ---------------------------------------------------------------------------------------------
binding="$(ls "$SITE"/onnxruntime/capi/onnxruntime_pybind11_state*.so)"
if grep -q 'libonnxruntime\.so' "$binding"; then
  echo "slim-edge: $binding names libonnxruntime.so; keeping it" >&2
else
  rm -f "$SITE"/onnxruntime/capi/libonnxruntime.so*
fi
rm -rf "$SITE"/onnxruntime/transformers "$SITE"/onnxruntime/quantization "$SITE"/onnxruntime/tools \
       "$SITE"/ai_edge_litert/libLiteRtWebGpuAccelerator.so "$SITE"/ai_edge_litert/vendors \
       "$SITE"/ai_edge_litert/aot "$SITE"/ai_edge_litert/tools/apply_plugin_main "$SITE"/ai_edge_litert/libLiteRt.so \
       "$SITE"/numpy/f2py "$SITE"/numpy/distutils "$SITE"/numpy/_core/include "$SITE"/numpy/_core/lib \
       "$VENV"/bin/f2py "$VENV"/bin/numpy-config
find "$SITE" -name '*.pyi' -delete

# --- bytecode: only the server's modules --------------------------------------------------------------
find / -xdev -type d -name __pycache__ -prune -exec rm -rf {} +
# What `python -m tfship.serving` imports to serve both edge backends, the health check and `query`.
# Modules left out still run, compiled in memory when imported (read-only root: nothing is written).
"$PY" -c '
import tfship.serving.cli, tfship.serving.server, tfship.serving.query
import tfship.serving.runtimes.onnx, tfship.serving.runtimes.tflite, tfship.serving.runtimes.litert
import tfship.serving.runtimes.published, tfship.serving.tfs.rest, tfship.serving.workers, tfship.serving.operations.logs
import onnxruntime, ai_edge_litert.interpreter
import grpc_health.v1.health_pb2_grpc
'
after="$(du -sxm / | cut -f1)"
echo "slim-edge: root file system ${before} MB -> ${after} MB"
