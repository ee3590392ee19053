#!/usr/bin/env bash
# Builds the Debian package: blockwire_VERSION_amd64.deb in target/debian/ (or
# $CARGO_TARGET_DIR/debian/), with the binary, the blockwire service, the example
# configuration as a conffile, the manual pages and the bash, zsh and fish
# completions. The pages and completions are generated from the binary itself
# (clap_mangen, clap_complete) into packaging/generated/ first.
#
# The packaging is cargo-deb's [package.metadata.deb] in crates/cli/Cargo.toml:
# Depends comes from dpkg-shlibdeps on the binary ($auto), and the postinst, prerm
# and postrm are the templates in packaging/debian/ with dh_installsystemd's snippets
# for the unit put in (enable and start on install, restart on upgrade, stop on
# remove, purge the enable state on purge). The script checks both made it into the
# package: cargo-deb only warns when dpkg-shlibdeps fails, and writes no maintainer
# scripts at all without maintainer-scripts.
#
# usage: scripts/build-deb.sh        (prints the path of the .deb last)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "== installing cargo-deb"
  cargo install cargo-deb --locked --quiet
fi

target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p blockwire
binary="$target/release/blockwire"

generated=packaging/generated
rm -rf "$generated"
mkdir -p "$generated/man" "$generated/completions"
"$binary" manpages "$generated/man" >/dev/null
# Debian wants manual pages compressed, and reproducibly (no name, no time stamp).
gzip -9n "$generated"/man/*
"$binary" completions bash >"$generated/completions/blockwire"
"$binary" completions zsh >"$generated/completions/_blockwire"
"$binary" completions fish >"$generated/completions/blockwire.fish"

# The binary was just built; cargo-deb strips a copy of it into the package. It
# prints the path of the package last; anything before that (warnings) goes to
# stderr.
if ! out=$(cargo deb -p blockwire --no-build --strip --quiet 2>&1); then
  printf '%s\n' "$out" >&2
  exit 1
fi
deb=$(printf '%s\n' "$out" | tail -n 1)
printf '%s\n' "$out" | sed '$d' >&2
if [[ "$deb" != *.deb || ! -f "$deb" ]]; then
  echo "cargo deb made no package" >&2
  exit 1
fi

depends=$(dpkg-deb --field "$deb" Depends)
if [[ "$depends" != *libc6* ]]; then
  echo "$deb: Depends does not name the C library: '$depends' (is dpkg-dev installed?)" >&2
  exit 1
fi
control=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
for script in postinst prerm postrm; do
  if ! grep -qx "\./$script" <<<"$control"; then
    echo "$deb: no $script in the control archive: $control" >&2
    exit 1
  fi
done
echo "$deb"
