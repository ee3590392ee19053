# The kernel's nvmet-tcp as the peer for our initiator: serves a fresh file of
# SIZE_MIB (default 256) as namespace 1 of NQN (default
# nqn.2026-11.dev.blockwire:nvmet) on the guest's 0.0.0.0:4420, discovery included,
# prints `MARKER nvmet-ready` and waits to be killed. The host reaches it through a
# qemu forward (boot.sh's BLOCKWIRE_VM_NETDEV=hostfwd=tcp:127.0.0.1:HOSTPORT-:4420,
# or tests/src/vm.rs's Vm::boot_forwarding). The discovery log lists the guest's own
# address (10.0.2.15), which the host cannot reach: connect to the forward instead.
. /lib/judges/nvmet-target.sh
NQN=${NQN:-nqn.2026-11.dev.blockwire:nvmet}
step "nvmet-tcp on 0.0.0.0:4420"
nvmet_export "$NQN" /tmp/nvmet.img "${SIZE_MIB:-256}" 0.0.0.0 4420
marker nvmet-ready
while :; do sleep 3600; done
