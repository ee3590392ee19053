#!/usr/bin/env bash
# Builds the Debian package: blockwire_VERSION_amd64.deb in target/debian/ (or
# $CARGO_TARGET_DIR/debian/), with the binary, the blockwire service, the example
# configuration as a conffile, the manual pages and the bash, zsh and fish
# completions. The pages and completions are generated from the binary itself
# (clap_mangen, clap_complete) into packaging/generated/ first.
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

# The binary was just built; cargo-deb strips a copy of it into the package.
cargo deb -p blockwire --no-build --strip --quiet 2>&1 | tail -n 1
