# Helpers for the guest scripts of the kernel judges, sourced by /init before
# /test.sh. A guest script fails with `fail REASON` (or any `must` command failing);
# /init turns its exit status into the verdict line.

# The host's loopback, as qemu's user network shows it to the guest.
HOST=10.0.2.2

# Announces a step on the console and remembers it for the verdict.
step() {
  echo "STEP $*"
  echo "$*" >/tmp/last-step
}

# Ends the guest script with REASON as the verdict's.
fail() {
  echo "FAIL $*"
  echo "$* (step: $(cat /tmp/last-step 2>/dev/null))" >/tmp/verdict-reason
  exit 1
}

# Runs a command; fails the script, naming it, if it fails.
must() {
  "$@" || fail "'$*' exited $?"
}

# A line the host-side harness waits for (VmRun::wait_for_marker), on its own line.
marker() {
  echo
  echo "MARKER $*"
}

# Retries a command every second until it succeeds or SECONDS pass; returns its last
# status.
retry() {
  seconds=$1
  shift
  while ! "$@"; do
    seconds=$((seconds - 1))
    [ "$seconds" -le 0 ] && return 1
    sleep 1
  done
}

# The MD5 of LEN MiB of a file or device from offset 0.
md5_of() {
  dd if="$1" bs=1M count="$2" 2>/dev/null | md5sum | cut -d' ' -f1
}
