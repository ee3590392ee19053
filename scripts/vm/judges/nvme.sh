# The NVMe/TCP judge (issue 33): the guest kernel's NVMe/TCP host against a target at
# ADDR. Sourced by a guest script that sets:
#   NQN          the subsystem under test
#   ADDR PORT    its I/O port;   DPORT  the discovery controller's port
#   SIZE_BYTES   the namespace's size, checked against Identify Namespace
#   MODEL        a word the controller's model number (mn) must contain (any case), or empty
#   DATA_OFFSET_MIB DATA_MIB   where the data check writes, in MiB
#   target_down target_up   functions that stop the target and start it again;
#                    the defaults suit a target on the host: target_down prints the
#                    marker `MARKER restart-target`, on which the harness stops the
#                    target and starts it again a few seconds later on the same port,
#                    and target_up does nothing
# and prints `DATA md5=... offset_mib=... mib=...` for the host to compare with the
# served file.

command -v target_down >/dev/null 2>&1 || target_down() {
  marker restart-target
}
command -v target_up >/dev/null 2>&1 || target_up() {
  :
}

# The controller (nvmeN) of subsystem $1 on TCP, if connected.
ctrl_of() {
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] || continue
    [ "$(cat "$c/subsysnqn")" = "$1" ] && [ "$(cat "$c/transport")" = tcp ] &&
      { basename "$c"; return 0; }
  done
  return 1
}

# The namespace block device of subsystem $1 (the multipath head when there is one).
ns_of() {
  for b in /sys/block/nvme*; do
    name=$(basename "$b")
    case $name in nvme*c*n*) continue ;; esac
    [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && { echo "/dev/$name"; return 0; }
  done
  return 1
}

# Connects to NQN with extra options, waits for its namespace; sets CTRL and NS.
connect() {
  must nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" "$@"
  retry 20 ctrl_of "$NQN" >/dev/null || fail "no controller for $NQN after connect"
  CTRL=/dev/$(ctrl_of "$NQN")
  retry 20 ns_of "$NQN" >/dev/null || fail "no namespace of $NQN after connect"
  NS=$(ns_of "$NQN")
  retry 10 test -b "$NS" || fail "$NS is not a block device"
  echo "connected: $CTRL $NS ($*)"
}

disconnect() {
  must nvme disconnect -n "$NQN"
  retry 20 sh -c "! ls /sys/class/nvme/ | grep -q . || ! grep -qx '$NQN' /sys/class/nvme/*/subsysnqn" ||
    fail "$NQN still connected after disconnect"
}

# The value of FIELD in `nvme id-ctrl`/`id-ns` output ($1: the output).
field() {
  echo "$1" | sed -n "s/^$2 *: *//p" | head -n1 | sed 's/ *$//'
}

ctrl_state() {
  cat "/sys/class/nvme/$(basename "$CTRL")/state" 2>/dev/null
}

step "discover"
out=$(nvme discover -t tcp -a "$ADDR" -s "$DPORT") || fail "nvme discover exited $?"
echo "$out"
echo "$out" | grep -q "subnqn: *$NQN\$" || fail "discovery log does not list $NQN"
echo "$out" | grep -q "trsvcid: *$PORT\$" || fail "discovery log does not list port $PORT"
# A target on the host's loopback may list its subsystems at 127.0.0.1 (its listening
# address), which is the guest itself here: connect-all then needs the guest's
# 127.0.0.1:PORT (and DPORT, for referrals) forwarded to the host. Each forwarder is
# busybox nc, one child per connection, bytes copied unchanged.
if [ "$ADDR" != 127.0.0.1 ] && echo "$out" | grep -q "traddr: *127\.0\.0\.1\$"; then
  echo "the discovery log lists 127.0.0.1: forwarding the guest's 127.0.0.1:$PORT and :$DPORT to $ADDR"
  for p in $(printf "%s\n" "$PORT" "$DPORT" | sort -u); do
    nc -ll -p "$p" -e nc "$ADDR" "$p" &
  done
  sleep 1
fi

step "connect-all"
must nvme connect-all -t tcp -a "$ADDR" -s "$DPORT"
retry 20 ns_of "$NQN" >/dev/null || fail "connect-all did not connect $NQN"
CTRL=/dev/$(ctrl_of "$NQN")
NS=$(ns_of "$NQN")

step "id-ctrl"
idc=$(nvme id-ctrl "$CTRL") || fail "nvme id-ctrl exited $?"
echo "$idc" | grep -E '^(vid|sn|mn|fr|mdts|cntlid|ver|subnqn|nn|ioccsz|iorcsz|sgls|vwc|oncs) '
[ "$(field "$idc" subnqn)" = "$NQN" ] || fail "id-ctrl subnqn is '$(field "$idc" subnqn)', not $NQN"
[ -n "$(field "$idc" mn)" ] || fail "id-ctrl has no model number"
[ -z "$MODEL" ] || field "$idc" mn | grep -qi "$MODEL" || fail "id-ctrl mn '$(field "$idc" mn)' lacks '$MODEL'"
nn=$(field "$idc" nn)
[ -n "$nn" ] && [ "$((nn))" -ge 1 ] || fail "id-ctrl nn is '$nn'"

step "id-ns"
idn=$(nvme id-ns "$NS") || fail "nvme id-ns exited $?"
echo "$idn" | grep -E '^(nsze|ncap|nuse|nsfeat|nlbaf|flbas|nguid|eui64) |in use'
nsze=$(field "$idn" nsze)
lbads=$(echo "$idn" | sed -n 's/.*lbads:\([0-9]*\).*(in use).*/\1/p')
[ -n "$nsze" ] && [ -n "$lbads" ] || fail "id-ns without nsze or the LBA format in use"
[ "$((nsze << lbads))" = "$SIZE_BYTES" ] ||
  fail "id-ns: nsze $nsze of 2^$lbads bytes is $((nsze << lbads)), not $SIZE_BYTES"
[ "$(blockdev --getsize64 "$NS")" = "$SIZE_BYTES" ] || fail "$NS is $(blockdev --getsize64 "$NS") bytes"
disconnect

step "connect (no digests): mkfs.ext4, fsck, flush"
connect
must mkfs.ext4 -q -F "$NS"
must e2fsck -fn "$NS"
must nvme flush "$NS"
disconnect

step "connect (header and data digests): ${DATA_MIB} MiB written and read back"
connect --hdr-digest --data-digest --ctrl-loss-tmo 120 --reconnect-delay 1
# One I/O queue per guest CPU, each its own TCP connection, beside the admin queue's:
# count this host's established connections to ADDR:PORT (/proc/net/tcp writes the
# address as a little-endian hex word).
cpus=$(grep -c '^processor' /proc/cpuinfo)
peer=$(echo "$ADDR" | awk -F. '{ printf "%02X%02X%02X%02X", $4, $3, $2, $1 }'):$(printf '%04X' "$PORT")
conns=$(grep -c " $peer 01 " /proc/net/tcp)
echo "TCP connections to the target: $conns ($cpus CPUs)"
[ "$conns" = $((cpus + 1)) ] || fail "$conns TCP connections for $cpus CPUs (want an admin queue and one I/O queue per CPU)"
must dd if=/dev/urandom of=/tmp/data bs=1M count="$DATA_MIB" 2>/dev/null
want=$(md5_of /tmp/data "$DATA_MIB")
must dd if=/tmp/data of="$NS" bs=1M seek="$DATA_OFFSET_MIB" conv=fsync 2>/dev/null
must nvme flush "$NS"
echo 3 >/proc/sys/vm/drop_caches
got=$(dd if="$NS" bs=1M skip="$DATA_OFFSET_MIB" count="$DATA_MIB" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "read back md5 $got, wrote $want"
echo "DATA md5=$want offset_mib=$DATA_OFFSET_MIB mib=$DATA_MIB"

step "target restart"
target_down
# The controller must notice (not live) and come back (live), and I/O issued while it
# is away must complete once it is back.
retry 60 sh -c "[ \"\$(cat /sys/class/nvme/$(basename "$CTRL")/state)\" != live ]" ||
  fail "the controller stayed live through the target restart"
echo "controller state: $(ctrl_state)"
dd if="$NS" of=/tmp/again bs=1M skip="$DATA_OFFSET_MIB" count="$DATA_MIB" iflag=direct 2>/dev/null &
reader=$!
target_up
retry 120 sh -c "[ \"\$(cat /sys/class/nvme/$(basename "$CTRL")/state)\" = live ]" ||
  fail "the controller did not come back (state $(ctrl_state))"
echo "controller state: $(ctrl_state)"
wait $reader || fail "a read issued during the restart failed"
[ "$(md5_of /tmp/again "$DATA_MIB")" = "$want" ] || fail "data read after the restart differs"
rm -f /tmp/again /tmp/data

step "disconnect"
disconnect
