#!/usr/bin/env bash
# Builds the kernel and base initramfs of the kernel judges (docs/testing.md) from
# Debian packages fetched with `apt-get download`: Debian's cloud kernel (it has the
# nvme-tcp, nvmet-tcp, nbd, aoe and iscsi_tcp modules this host's kernel lacks),
# busybox, nvme-cli, nbd-client and e2fsprogs with the shared libraries they link.
# Nothing is installed on the host.
#
# Usage: build-images.sh          prints KERNEL=, INITRD= and BUSYBOX= lines
#
# The packages and the images live in a cache folder ($BLOCKWIRE_VM_CACHE, else
# /var/cache/blockwire-vm when writable, else ~/.cache/blockwire-vm) and are reused
# until a package version or these scripts change.
#
# Exit status 3 means "the images cannot be had here" (no apt-get, no network, no
# such package): callers skip rather than fail.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

unavailable() {
  echo "build-images: $*" >&2
  exit 3
}

if [ -n "${BLOCKWIRE_VM_CACHE:-}" ]; then
  cache=$BLOCKWIRE_VM_CACHE
elif mkdir -p /var/cache/blockwire-vm 2>/dev/null && [ -w /var/cache/blockwire-vm ]; then
  cache=/var/cache/blockwire-vm
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/blockwire-vm
fi
mkdir -p "$cache/debs"
# One build at a time per cache (two test runs may start together).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/lock"
  flock 9
fi

for tool in apt-get apt-cache dpkg-deb depmod readelf gzip; do
  command -v "$tool" >/dev/null 2>&1 || unavailable "$tool is not installed"
done

# The programs the guest runs; their libraries' packages are found below.
programs="busybox-static nvme-cli nbd-client e2fsprogs"
# The modules the judges load, each with what modules.dep says it needs. NVMe's
# core, ext4 and crc32c are built into this kernel.
modules="virtio_pci virtio_net virtio-rng nvme-tcp nvmet-tcp nbd aoe iscsi_tcp"

# The versioned image package behind the metapackage, e.g. linux-image-6.1.0-56-cloud-amd64.
kernel_package=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
  awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
[ -n "$kernel_package" ] || unavailable "apt knows no linux-image-cloud-amd64 (not Debian?)"
kernel_version=${kernel_package#linux-image-}

# Library packages the programs depend on, directly or not; which of their files the
# guest gets is decided from the binaries' DT_NEEDED entries, not from this list.
libraries=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances $programs 2>/dev/null |
  grep -E '^(lib|zlib)' | grep -Ev 'perl' | sort -u | tr '\n' ' ')

# One line per .deb: 'URI' FILENAME SIZE HASH. The file names carry the versions.
# shellcheck disable=SC2086
# (From an empty folder: apt-get leaves out the files it finds in the current one.)
empty=$(mktemp -d)
uris=$(cd "$empty" && apt-get download --print-uris "$kernel_package" $programs $libraries 2>/dev/null) ||
  { rmdir "$empty"; unavailable "apt-get cannot locate the packages (run apt-get update?)"; }
rmdir "$empty"
[ -n "$uris" ] || unavailable "apt-get lists no packages to download"
files=$(awk '{ print $2 }' <<<"$uris" | sort)
key=$( { echo "$files"; cat "$here/build-images.sh" "$here/init" "$here/guest-lib.sh" "$here"/judges/*.sh; } |
  sha256sum | cut -c1-16)
out=$cache/images-$key

if [ ! -s "$out/initrd.gz" ]; then
  missing=()
  while read -r uri file _; do
    [ -s "$cache/debs/$file" ] || missing+=("$(basename "$file")")
  done <<<"$uris"
  if [ ${#missing[@]} -gt 0 ]; then
    echo "build-images: downloading ${#missing[@]} packages into $cache/debs" >&2
    # apt-get download names its arguments by package, not by file
    names=$(for f in "${missing[@]}"; do echo "${f%%_*}"; done | sort -u)
    # shellcheck disable=SC2086
    (cd "$cache/debs" && apt-get download -qq $names >/dev/null 2>&1) ||
      unavailable "apt-get download failed (no network?)"
  fi

  work=$(mktemp -d "$cache/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  stage=$work/stage root=$work/root
  mkdir -p "$stage" "$root"
  while read -r _ file _; do
    dpkg-deb -x "$cache/debs/$file" "$stage"
  done <<<"$uris"

  # The initramfs tree: busybox applets in /bin, one library folder, Debian's loader path.
  mkdir -p "$root"/{bin,dev,proc,sys,run,tmp,etc/nvme,mnt,lib/x86_64-linux-gnu,lib64,lib/modules}
  ln -s bin "$root/sbin"
  mkdir -p "$root/usr"
  ln -s ../bin "$root/usr/bin"
  ln -s ../bin "$root/usr/sbin"
  ln -s ../lib "$root/usr/lib"
  cp "$stage/bin/busybox" "$root/bin/busybox"
  for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
  done
  # The real tools replace busybox's applets of the same name.
  for tool in usr/sbin/nvme sbin/nbd-client sbin/mke2fs sbin/e2fsck; do
    [ -f "$stage/$tool" ] || { echo "build-images: $tool is not in the packages" >&2; exit 1; }
    rm -f "$root/bin/$(basename "$tool")"
    cp "$stage/$tool" "$root/bin/"
  done
  for alias in mkfs.ext4 mkfs.ext2; do rm -f "$root/bin/$alias"; ln -s mke2fs "$root/bin/$alias"; done
  for alias in fsck.ext4 fsck.ext2; do rm -f "$root/bin/$alias"; ln -s e2fsck "$root/bin/$alias"; done
  cp "$stage/etc/mke2fs.conf" "$root/etc/"

  # Shared libraries: the closure of DT_NEEDED over the staged library folders.
  lib_dirs="$stage/lib/x86_64-linux-gnu $stage/usr/lib/x86_64-linux-gnu"
  find_library() {
    local dir
    for dir in $lib_dirs; do
      [ -e "$dir/$1" ] && { echo "$dir/$1"; return 0; }
    done
    return 1
  }
  queue=("$root/bin/nvme" "$root/bin/nbd-client" "$root/bin/mke2fs" "$root/bin/e2fsck")
  declare -A copied=()
  while [ ${#queue[@]} -gt 0 ]; do
    binary=${queue[0]}
    queue=("${queue[@]:1}")
    for soname in $(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [ -n "${copied[$soname]:-}" ] && continue
      source=$(find_library "$soname") || {
        echo "build-images: $(basename "$binary") needs $soname, which no downloaded package holds" >&2
        exit 1
      }
      cp -L "$source" "$root/lib/x86_64-linux-gnu/$soname"
      copied[$soname]=1
      queue+=("$root/lib/x86_64-linux-gnu/$soname")
    done
  done
  loader=$(find_library ld-linux-x86-64.so.2) || { echo "build-images: no ld-linux-x86-64.so.2" >&2; exit 1; }
  cp -L "$loader" "$root/lib64/ld-linux-x86-64.so.2"

  # Kernel modules in load order (a module's dependencies first), for /init's insmod.
  depmod -b "$stage" "$kernel_version"
  moddir=$stage/lib/modules/$kernel_version
  : >"$root/lib/modules/order"
  for module in $modules; do
    line=$(grep -E "/${module}\.ko(\.[a-z]+)?:" "$moddir/modules.dep") || {
      echo "build-images: the kernel has no module $module" >&2
      exit 1
    }
    # modules.dep lists a module's dependencies so that the last loads first.
    # shellcheck disable=SC2086
    for path in $(echo ${line#*:} | tr ' ' '\n' | tac) "${line%%:*}"; do
      name=$(basename "$path")
      grep -qx "$name" "$root/lib/modules/order" && continue
      cp "$moddir/$path" "$root/lib/modules/$name"
      echo "$name" >>"$root/lib/modules/order"
    done
  done

  cp "$here/init" "$root/init"
  cp "$here/guest-lib.sh" "$root/lib/guest-lib.sh"
  mkdir -p "$root/lib/judges"
  cp "$here"/judges/*.sh "$root/lib/judges/"
  chmod 755 "$root/init"
  echo "$kernel_package" >"$root/etc/kernel-package"

  mkdir -p "$out.tmp"
  cp "$stage/boot/vmlinuz-$kernel_version" "$out.tmp/vmlinuz"
  # busybox is statically linked: boot.sh packs guest scripts with its cpio.
  cp "$root/bin/busybox" "$out.tmp/busybox"
  (cd "$root" && find . | "$root/bin/busybox" cpio -o -H newc 2>/dev/null) | gzip -1 >"$out.tmp/initrd.gz"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  # Older image sets go once nobody could still be starting a VM from them (other
  # work trees may share this cache).
  find "$cache" -maxdepth 1 -name 'images-*' ! -name "images-$key" -mmin +60 -exec rm -rf {} +
  # Packages of superseded versions, likewise.
  for deb in "$cache"/debs/*.deb; do
    grep -qxF "$(basename "$deb")" <<<"$files" || rm -f "$deb"
  done
  echo "build-images: built $out ($kernel_package)" >&2
fi

echo "KERNEL=$out/vmlinuz"
echo "INITRD=$out/initrd.gz"
echo "BUSYBOX=$out/busybox"
