# The NBD judge: the guest kernel's NBD client (nbd.ko, configured by nbd-client)
# against an NBD server on the host. Sourced by a guest script that sets:
#   PORT EXPORT   the server's port on the host's loopback and the export's name
#   SIZE_BYTES    the export's size, checked against the block device's
#   DATA_OFFSET_MIB DATA_MIB   where the data check writes, in MiB
# and prints `DATA md5=... offset_mib=... mib=...` for the host to compare with the
# served file.

DEV=/dev/nbd0

step "nbd-client connect"
retry 10 test -b "$DEV" || fail "no $DEV (is nbd.ko loaded?)"
must nbd-client -N "$EXPORT" "$HOST" "$PORT" "$DEV"
retry 20 sh -c "[ \"\$(blockdev --getsize64 $DEV)\" != 0 ]" || fail "$DEV stayed empty after connecting"
size=$(blockdev --getsize64 "$DEV")
[ "$size" = "$SIZE_BYTES" ] || fail "$DEV is $size bytes, the export $SIZE_BYTES"

step "mkfs.ext4, fsck"
must mkfs.ext4 -q -F "$DEV"
must e2fsck -fn "$DEV"

step "${DATA_MIB} MiB written and read back"
must dd if=/dev/urandom of=/tmp/data bs=1M count="$DATA_MIB" 2>/dev/null
want=$(md5_of /tmp/data "$DATA_MIB")
must dd if=/tmp/data of="$DEV" bs=1M seek="$DATA_OFFSET_MIB" conv=fsync 2>/dev/null
echo 3 >/proc/sys/vm/drop_caches
got=$(dd if="$DEV" bs=1M skip="$DATA_OFFSET_MIB" count="$DATA_MIB" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "read back md5 $got, wrote $want"
echo "DATA md5=$want offset_mib=$DATA_OFFSET_MIB mib=$DATA_MIB"
rm -f /tmp/data

step "nbd-client disconnect"
must nbd-client -d "$DEV"
