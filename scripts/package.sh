#!/usr/bin/env bash
# Builds the Debian package target/debian/qlsched_<version>-1_<arch>.deb with cargo-deb
# ([package.metadata.deb] in Cargo.toml; notes in docs/packaging.md). The man pages and
# shell completions are generated from the command-line definitions first
# (examples/gen-docs.rs), so they always match the binary.
#
#   scripts/package.sh                 release build (what operators install)
#   scripts/package.sh --profile dev   unoptimised build, for tests of the package itself
#
# Prints the path of the .deb on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
# The cargo-deb this packaging is tested with (it accepts the dev profile that
# scripts/test-package.sh uses; see docs/packaging.md).
CARGO_DEB_VERSION=3.8.0
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=${2:?--profile needs a value}; shift 2 ;;
    *) echo "usage: scripts/package.sh [--profile PROFILE]" >&2; exit 2 ;;
  esac
done

if ! cargo deb --version >/dev/null 2>&1; then
  echo "cargo-deb missing: installing it (cargo install --locked cargo-deb --version $CARGO_DEB_VERSION)…" >&2
  cargo install --locked cargo-deb --version "$CARGO_DEB_VERSION" >&2
fi
for tool in dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool missing: install the Debian package dpkg-dev" >&2; exit 1; }
done

rm -rf target/gen-docs target/debian
cargo run --quiet --profile "$profile" --example gen-docs -- target/gen-docs >/dev/null
# --strip: the release profile keeps line tables for backtraces; the package ships a
# stripped binary (lintian: unstripped-binary-or-object).
cargo deb --profile "$profile" --strip --no-dbgsym --output target/debian/ >&2
deb=$(ls target/debian/qlsched_*.deb)
echo "$deb"
