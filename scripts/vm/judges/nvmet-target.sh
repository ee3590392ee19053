# The kernel's own NVMe/TCP target (nvmet-tcp) inside the judge VM, configured through
# configfs: the peer our initiator is judged against, and the self-check of the NVMe
# judge (scripts/vm/nvmet-self-check.sh). Sourced by a guest script.

NVMET=/sys/kernel/config/nvmet

# nvmet_export NQN FILE SIZE_MIB ADDR PORT: serves a new FILE of SIZE_MIB as namespace
# 1 of subsystem NQN, open to any host, on tcp ADDR:PORT (the discovery subsystem
# answers on the same port).
nvmet_export() {
  nqn=$1 file=$2 size_mib=$3 addr=$4 port=$5
  must dd if=/dev/zero of="$file" bs=1M count=0 seek="$size_mib" 2>/dev/null
  must mkdir "$NVMET/subsystems/$nqn"
  echo 1 >"$NVMET/subsystems/$nqn/attr_allow_any_host" || fail "nvmet: allow_any_host"
  must mkdir "$NVMET/subsystems/$nqn/namespaces/1"
  echo "$file" >"$NVMET/subsystems/$nqn/namespaces/1/device_path" || fail "nvmet: device_path"
  # The file sits on the initramfs' tmpfs, which has no O_DIRECT.
  echo 1 >"$NVMET/subsystems/$nqn/namespaces/1/buffered_io" || fail "nvmet: buffered_io"
  echo 1 >"$NVMET/subsystems/$nqn/namespaces/1/enable" || fail "nvmet: enable namespace"
  must mkdir "$NVMET/ports/1"
  echo tcp >"$NVMET/ports/1/addr_trtype"
  echo ipv4 >"$NVMET/ports/1/addr_adrfam"
  echo "$addr" >"$NVMET/ports/1/addr_traddr"
  echo "$port" >"$NVMET/ports/1/addr_trsvcid"
  must ln -s "$NVMET/subsystems/$nqn" "$NVMET/ports/1/subsystems/$nqn"
}

# nvmet_port_off NQN / nvmet_port_on NQN: takes the subsystem off its port (its
# controllers fail, as on a target restart) and puts it back.
nvmet_port_off() {
  must rm "$NVMET/ports/1/subsystems/$1"
}

nvmet_port_on() {
  must ln -s "$NVMET/subsystems/$1" "$NVMET/ports/1/subsystems/$1"
}
