#!/usr/bin/env bash
# Boots a kernel judge's VM with a guest script and prints its serial console on
# stdout; the VM powers off after the verdict line (`VERDICT PASS` or
# `VERDICT FAIL: reason`). See docs/testing.md.
#
# Usage: boot.sh GUEST_SCRIPT [WORKDIR]
#
# GUEST_SCRIPT runs as /test.sh under busybox sh, with scripts/vm/guest-lib.sh's
# helpers; WORKDIR receives the guest's initramfs (default: the one folder
# ${TMPDIR:-/tmp}/blockwire-vm-boot, reused by every run). KERNEL, INITRD and BUSYBOX from the environment skip build-images.sh
# (the test harness builds once). BLOCKWIRE_VM_NETDEV adds options to qemu's user
# network (hostfwd=tcp:127.0.0.1:HOSTPORT-:GUESTPORT, to reach a target in the guest);
# BLOCKWIRE_VM_APPEND adds to the kernel's command line. qemu replaces this shell
# (exec): its PID is ours.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=${1:?usage: boot.sh GUEST_SCRIPT [WORKDIR]}
workdir=${2:-${TMPDIR:-/tmp}/blockwire-vm-boot}

if [ -z "${KERNEL:-}" ] || [ -z "${INITRD:-}" ] || [ -z "${BUSYBOX:-}" ]; then
  eval "$("$here/build-images.sh" | grep -E '^(KERNEL|INITRD|BUSYBOX)=')"
fi
command -v qemu-system-x86_64 >/dev/null || { echo "boot.sh: qemu-system-x86_64 is not installed" >&2; exit 3; }

# The guest script as /test.sh in a second archive after the base one: the kernel
# unpacks concatenated archives in turn.
mkdir -p "$workdir/test-root"
cp "$script" "$workdir/test-root/test.sh"
(cd "$workdir/test-root" && echo test.sh | "$BUSYBOX" cpio -o -H newc 2>/dev/null) | gzip -1 >"$workdir/test.cpio.gz"
cat "$INITRD" "$workdir/test.cpio.gz" >"$workdir/initrd.gz"

# TCG: a /dev/kvm may be there and still not run this kernel (nested virtualisation
# on the CI machines hangs it). BLOCKWIRE_VM_KVM=1 asks for KVM where it works.
accel=tcg
[ "${BLOCKWIRE_VM_KVM:-0}" = 1 ] && accel=kvm
exec qemu-system-x86_64 -accel "$accel" -m 1G -smp 2 -nographic -no-reboot \
  -kernel "$KERNEL" -initrd "$workdir/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 ${BLOCKWIRE_VM_APPEND:-}" \
  -netdev "user,id=n0${BLOCKWIRE_VM_NETDEV:+,$BLOCKWIRE_VM_NETDEV}" -device virtio-net-pci,netdev=n0,romfile= \
  -device virtio-rng-pci \
  -monitor none -serial stdio
