#!/usr/bin/env bash
# Register QEMU user emulation for a foreign architecture with binfmt_misc (flag F), so an amd64 engine
# builds and runs arm64 images (`make docker-edge PLATFORM=linux/arm64`, `make docker-test-arm64`).
#
# Uses Debian's qemu-user-static (its static interpreters, and the binfmt entry it ships in
# /usr/lib/binfmt.d); no image is pulled (tonistiigi/binfmt and multiarch/qemu-user-static do the same
# from a registry). Flag F ("fix binary") makes the kernel open the interpreter once, at registration, so
# it works inside containers and chroots that do not have it. Idempotent.
#
# QEMU must emulate /proc/cpuinfo for the guest (QEMU 8.1 and later; Debian bookworm's 7.2 shows the host's
# x86 /proc/cpuinfo, and ONNX Runtime's CPU detection (pytorch/cpuinfo) then crashes with SIGSEGV at import):
# on bookworm install it from bookworm-backports (apt-get install -t bookworm-backports qemu-user-static).
# The entry is always registered again: with flag F the kernel keeps the interpreter file it opened at
# registration, so an upgraded qemu-user-static only takes effect once re-registered.
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

# Debian's qemu-user-static, from the release's backports suite when the release's own QEMU is older than 8.1
# (bookworm: 7.2). The backports entry is this machine's own Debian source with the suite renamed, so it uses
# whatever mirror the machine is set up with.
install_emulators() {
  command -v apt-get >/dev/null || { echo "ensure-binfmt: no apt-get; install QEMU >= 8.1 user emulation" >&2; exit 1; }
  local codename target=()
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  if [[ "$codename" == "bookworm" ]]; then
    local backports=/etc/apt/sources.list.d/tfship-backports.sources main=/etc/apt/sources.list.d/debian.sources
    if [[ ! -f "$backports" && -f "$main" ]]; then
      awk -v suite="$codename-backports" 'BEGIN{RS=""; ORS="\n\n"} /Suites:[^\n]*'"$codename"'( |\n|$)/ && !/security/ {
        sub(/Suites:[^\n]*/, "Suites: " suite); print; exit}' "$main" >"$backports"
    fi
    target=(-t "$codename-backports")
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${target[@]}" qemu-user-static binfmt-support
}
[[ -f "$CONF" ]] || install_emulators

# The package's own entry (the `:name:type:offset:magic:mask:interpreter:flags` line), with F added if missing.
line="$(grep -v '^#' "$CONF" | head -n 1)"
interpreter="$(echo "$line" | cut -d: -f7)"
emulator="$(command -v "qemu-$QEMU-static" || command -v "qemu-$QEMU" || echo "$interpreter")"
version="$("$emulator" --version | sed -n 's/.*version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n 1)"
read -r major minor <<<"${version:-0 0}"
if (( major < 8 || (major == 8 && minor < 1) )); then
  install_emulators
  version="$("$emulator" --version | sed -n 's/.*version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n 1)"
  read -r major minor <<<"${version:-0 0}"
fi
if (( major < 8 || (major == 8 && minor < 1) )); then
  echo "ensure-binfmt: $emulator is QEMU $major.$minor; the edge image needs 8.1 or later (emulated" \
       "/proc/cpuinfo, else ONNX Runtime crashes at import): apt-get install -t bookworm-backports qemu-user-static" >&2
  exit 1
fi
if [[ ! -f "$BINFMT/register" ]]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT"
fi
[[ -f "$ENTRY" ]] && echo -1 >"$ENTRY"  # again, so the kernel opens the interpreter installed now (flag F)
flags="${line##*:}"
[[ "$flags" == *F* ]] || line="${line}F"
printf '%s' "$line" >"$BINFMT/register"
grep -qx enabled "$ENTRY" || { echo "ensure-binfmt: qemu-$QEMU did not register" >&2; exit 1; }
echo "ensure-binfmt: registered qemu-$QEMU $major.$minor ($(grep '^interpreter' "$ENTRY"), $(grep '^flags' "$ENTRY"))"
