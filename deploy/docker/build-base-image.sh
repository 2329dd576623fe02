#!/usr/bin/env bash
# Build a local Debian bookworm base image with python3 when no registry can be pulled from.
#
# The Dockerfile's default BASE_IMAGE is the official python slim image. Where no registry is
# reachable (air-gapped build hosts, this project's CI), this script makes a stand-in from the Debian
# mirror apt already uses: debootstrap minbase + python3, python3-venv, python3-pip, ca-certificates,
# imported as $TFSHIP_BASE_IMAGE (default tfship/base:bookworm). Bookworm's python3 is 3.11, like
# the project's. The host's CA bundle is copied in so that pip inside the build trusts the same
# certificate authorities the host does (a TLS-inspecting proxy's, for one).
#
# ARCH=arm64 makes an arm64 base (tagged tfship/base:bookworm-arm64) for a cross-build of the edge
# image with the classic builder; it needs qemu-user-static registered with binfmt_misc (flag F).
#
# Idempotent: does nothing when the image already exists (FORCE=1 rebuilds it).
# Needs root, debootstrap and a reachable Docker engine (deploy/docker/ensure-dockerd.sh).
set -euo pipefail

HOST_ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
ARCH="${ARCH:-$HOST_ARCH}"
if [[ "$ARCH" == "$HOST_ARCH" ]]; then
  IMAGE="${TFSHIP_BASE_IMAGE:-tfship/base:bookworm}"
else
  IMAGE="${TFSHIP_BASE_IMAGE:-tfship/base:bookworm-$ARCH}"
fi
SUITE="${SUITE:-bookworm}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
PACKAGES="python3,python3-venv,python3-pip,ca-certificates"

if [[ "${FORCE:-0}" != "1" ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "build-base-image: $IMAGE already exists; nothing to do (FORCE=1 rebuilds)"
  exit 0
fi

# The mirror apt uses here: deb822 sources first, then one-line sources.
mirror_from_apt() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk '/^URIs:/ {print $2; exit}' "$f"
    return
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' "$f"
    return
  done
}
MIRROR="${MIRROR:-$(mirror_from_apt)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

command -v debootstrap >/dev/null || {
  echo "build-base-image: needs debootstrap (apt-get install -y debootstrap)" >&2; exit 1; }
[[ "$(id -u)" == "0" ]] || { echo "build-base-image: debootstrap needs root" >&2; exit 1; }
[[ -f "$CA_BUNDLE" ]] || { echo "build-base-image: no CA bundle at $CA_BUNDLE" >&2; exit 1; }

WORK="$(mktemp -d /tmp/tfship-base.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/root"

echo "build-base-image: debootstrap $SUITE/$ARCH from $MIRROR (minbase + $PACKAGES)"
debootstrap --arch="$ARCH" --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
  tail -n 30 "$WORK/debootstrap.log" >&2; exit 1; }

# Trust what the host trusts, then leave no caches behind.
cp "$CA_BUNDLE" "$ROOT/etc/ssl/certs/ca-certificates.crt"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/log/* \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/*

CHANGES=(ENV "LANG=C.UTF-8" ENV "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" CMD '["python3"]')
if [[ "$ARCH" == "$HOST_ARCH" ]]; then
  echo "build-base-image: importing as $IMAGE"
  tar -C "$ROOT" -c . | docker import \
    --change "${CHANGES[0]} ${CHANGES[1]}" --change "${CHANGES[2]} ${CHANGES[3]}" --change "${CHANGES[4]} ${CHANGES[5]}" \
    - "$IMAGE" >/dev/null
else
  # `docker import --platform` is ignored by older engines (the image would claim the host's
  # architecture), so a foreign root file system goes in through FROM scratch, which records it.
  echo "build-base-image: building $IMAGE for linux/$ARCH from the root file system"
  tar -C "$ROOT" -cf "$WORK/rootfs.tar" .
  printf 'FROM scratch\nADD rootfs.tar /\n%s %s\n%s %s\n%s %s\n' "${CHANGES[@]}" >"$WORK/Dockerfile"
  DOCKER_BUILDKIT=0 docker build --quiet --platform "linux/$ARCH" -t "$IMAGE" "$WORK" >/dev/null
fi
docker run --rm --network host --platform "linux/$ARCH" "$IMAGE" python3 -c 'import sys, ssl, venv; print("python", sys.version.split()[0])'
docker image ls "$IMAGE"
