#!/usr/bin/env bash
# Runs the NVMe judge (judges/nvme.sh) against the guest kernel's own nvmet-tcp on the
# guest's loopback: checks the judge itself, with no blockwire involved. Prints the
# console; the last line is the verdict. Usage: nvmet-self-check.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/guest.sh" <<'GUEST'
. /lib/judges/nvmet-target.sh
NQN=nqn.2026-11.dev.blockwire:nvmet-self-check
ADDR=127.0.0.1 PORT=4420 DPORT=4420
SIZE_BYTES=$((256 << 20)) MODEL=Linux DATA_OFFSET_MIB=64 DATA_MIB=64
target_down() { nvmet_port_off "$NQN"; }
target_up() { sleep 3; nvmet_port_on "$NQN"; }
nvmet_export "$NQN" /tmp/nvmet.img 256 "$ADDR" "$PORT"
. /lib/judges/nvme.sh
GUEST
"$here/boot.sh" "$work/guest.sh" "$work"
