#!/usr/bin/env bash
# Register QEMU user emulation for a foreign architecture with binfmt_misc (flag F), so an amd64 engine
# builds and runs arm64 images (`make docker-edge PLATFORM=linux/arm64`, `make docker-test-arm64`).
#
# Uses Debian's qemu-user-static (its static interpreters, and the binfmt entry it ships in
# /usr/lib/binfmt.d); no image is pulled (tonistiigi/binfmt and multiarch/qemu-user-static do the same
# from a registry). Flag F ("fix binary") makes the kernel open the interpreter once, at registration, so
# it works inside containers and chroots that do not have it. Idempotent: an enabled entry is left alone.
#
# Env: ARCH (default arm64; Debian's name) selects the emulated architecture. Needs root.
set -euo pipefail

ARCH="${ARCH:-arm64}"
case "$ARCH" in
  arm64) QEMU=aarch64 ;;
  armhf|arm) QEMU=arm ;;
  *) QEMU="$ARCH" ;;
esac
BINFMT=/proc/sys/fs/binfmt_misc
ENTRY="$BINFMT/qemu-$QEMU"
CONF="/usr/lib/binfmt.d/qemu-$QEMU.conf"
HOST_ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"

if [[ "$ARCH" == "$HOST_ARCH" ]]; then
  echo "ensure-binfmt: $ARCH is this machine's own architecture; nothing to register"
  exit 0
fi
[[ "$(id -u)" == "0" ]] || { echo "ensure-binfmt: registering with binfmt_misc needs root" >&2; exit 1; }
[[ -f "$CONF" ]] || {
  echo "ensure-binfmt: no $CONF; install Debian's emulators: apt-get install -y qemu-user-static binfmt-support" >&2
  exit 1; }

if [[ ! -f "$BINFMT/register" ]]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT"
fi
if [[ -f "$ENTRY" ]] && grep -qx enabled "$ENTRY"; then
  if grep -q '^flags:.*F' "$ENTRY"; then
    echo "ensure-binfmt: qemu-$QEMU already registered ($(grep '^interpreter' "$ENTRY"), $(grep '^flags' "$ENTRY"))"
    exit 0
  fi
  echo "ensure-binfmt: qemu-$QEMU is registered without flag F; re-registering"
  echo -1 >"$ENTRY"
fi
# The package's own entry (the `:name:type:offset:magic:mask:interpreter:flags` line), with F added if missing.
line="$(grep -v '^#' "$CONF" | head -n 1)"
flags="${line##*:}"
[[ "$flags" == *F* ]] || line="${line}F"
printf '%s' "$line" >"$BINFMT/register"
grep -qx enabled "$ENTRY" || { echo "ensure-binfmt: qemu-$QEMU did not register" >&2; exit 1; }
echo "ensure-binfmt: registered qemu-$QEMU ($(grep '^interpreter' "$ENTRY"), $(grep '^flags' "$ENTRY"))"
