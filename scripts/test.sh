#!/usr/bin/env bash
# The project's test command (README's second command). On a fresh Debian machine it
# first installs the peer programs the interop tests drive, then runs formatting,
# lints, the release build and every test. Tests whose peer is still missing (not
# root, no apt) skip themselves and say so.
set -euo pipefail
cd "$(dirname "$0")/.."

# program:package pairs the tests and benchmarks use
peers=(
  nbdinfo:libnbd-bin nbdcopy:libnbd-bin
  qemu-img:qemu-utils qemu-io:qemu-utils qemu-nbd:qemu-utils
  fio:fio nbdkit:nbdkit nbd-server:nbd-server iperf3:iperf3
  bon_csv2txt:bonnie++ mkfs.ext4:e2fsprogs
  ip:iproute2 tc:iproute2 vblade:vblade aoe-sancheck:aoetools aoeping:aoetools tshark:tshark
  iscsi-test-cu:libiscsi-bin iscsi-ls:libiscsi-bin iscsi-inq:libiscsi-bin
  iscsi-readcapacity16:libiscsi-bin iscsi-swp:libiscsi-bin iscsi-perf:libiscsi-bin
  tgtd:tgt tgtadm:tgt stdbuf:coreutils g++:g++ openssl:openssl
  prometheus:prometheus systemd-analyze:systemd lintian:lintian man:man-db
  # scripts/vm/build-images.sh (the kernel judges' VM) reads ELF headers and runs depmod
  readelf:binutils depmod:kmod
  # the RBD tests start a throwaway one-node Ceph cluster (one mon, one OSD)
  ceph-mon:ceph-mon ceph-osd:ceph-osd ceph:ceph-common rbd:ceph-common
  # blockwire mount (FUSE; fuser mounts through fusermount) and a file system on it
  fusermount:fuse losetup:mount e2fsck:e2fsprogs bonnie++:bonnie++
  # NFS beside the block protocols: ganesha (userspace server, FSAL_VFS) with rpcbind,
  # libnfs' command-line client as the reference reader
  ganesha.nfsd:nfs-ganesha rpcbind:rpcbind nfs-cat:libnfs-utils nfs-cp:libnfs-utils
)
missing=()
for pair in "${peers[@]}"; do
  program=${pair%%:*} package=${pair##*:}
  command -v "$program" >/dev/null 2>&1 || missing+=("$package")
done
# Build dependencies: NBD's TLS links the system's OpenSSL (the openssl crate finds
# its headers and library through pkg-config).
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
# Libraries the tests load at run time (no program to look for): ganesha's VFS
# backend, and libnfs for `nfs://` targets.
ls /usr/lib/*/ganesha/libfsalvfs.so >/dev/null 2>&1 || missing+=(nfs-ganesha-vfs)
ls /usr/lib/*/libnfs.so.1[0-9]* >/dev/null 2>&1 || missing+=(libnfs13)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
if [ ${#missing[@]} -gt 0 ]; then
  packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing test peers: $packages"
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
  else
    echo "== warning: missing $packages (not root); tests that need them will be skipped" >&2
  fi
fi
# The qemu-utils these machines ship comes from bookworm-backports, and so must
# every qemu package installed beside it: add that suite to apt's sources if missing.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
   ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ &&
   grep -rqs 'bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "== adding bookworm-backports to apt's sources (qemu packages)"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    >/etc/apt/sources.list.d/blockwire-backports.sources
  apt-get update -qq || echo "== warning: apt-get update failed" >&2
fi
# qemu's iSCSI driver (qemu-img/qemu-io iscsi://) is a module in qemu-block-extra,
# which must be the very version of the installed qemu-utils (a backport, say): pin
# it, and never let apt remove anything for it; without it those tests skip.
iscsi_module=$(dpkg -L qemu-block-extra 2>/dev/null | grep -c 'block-iscsi\.so$' || true)
qemu_version=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
if [ "$iscsi_module" = 0 ] && [ -n "$qemu_version" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
     DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-remove \
       "qemu-block-extra=$qemu_version" >/dev/null 2>&1; then
    echo "== installed qemu-block-extra $qemu_version (qemu's iSCSI driver)"
  else
    echo "== warning: no qemu-block-extra $qemu_version; qemu-over-iSCSI tests will be skipped" >&2
  fi
fi

# The kernel judges (tests/tests/kernel_*.rs) boot Debian's cloud kernel under qemu;
# qemu-system-x86 must come from bookworm-backports like the qemu-utils beside it,
# and apt must never remove anything for it. The guest's programs (busybox, nvme-cli,
# nbd-client, e2fsprogs) are fetched with apt-get download into the VM cache, not
# installed; building the images here shows a download problem early.
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
     DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
       --no-install-recommends --no-remove qemu-system-x86 >/dev/null 2>&1; then
    echo "== installed qemu-system-x86 (the kernel judges' VM)"
  else
    echo "== warning: no qemu-system-x86; the kernel judges will be skipped" >&2
  fi
fi
if command -v qemu-system-x86_64 >/dev/null 2>&1; then
  bash scripts/vm/build-images.sh >/dev/null ||
    echo "== warning: cannot build the VM images; the kernel judges will be skipped" >&2
fi

# cargo-deb builds the Debian package (scripts/build-deb.sh; its test skips without it).
if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "== installing cargo-deb"
  cargo install cargo-deb --locked --quiet ||
    echo "== warning: cannot install cargo-deb; the package test will be skipped" >&2
fi

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== cargo build --release"
cargo build --workspace --release
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --release --no-fail-fast 2>&1 | tee "$log" || status=$?
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
# The bench scripts' own checks (how results are kept and ranged).
echo "== bench/lib unit tests"
python3 -m unittest discover -s bench/lib -p 'test_*.py' || status=1
# Every parser that reads the network, fuzzed for a short while from the committed
# seeds (docs/testing.md); a crash or a hang fails the run.
echo "== fuzz (20 s per target)"
bash fuzz/run.sh 20 || status=1
exit $status
