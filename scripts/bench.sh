#!/usr/bin/env bash
# The benchmark (examples/bench/main.rs says what each mode measures): builds the release
# binaries, then runs MODE (quick when none; `--quick` is read as `quick`), or compares two
# result files: scripts/bench.sh compare A.json B.json [--band 0.10].
set -euo pipefail; cd "$(dirname "$0")/.."; mode=${1:-quick}; [ $# -gt 0 ] && shift
cargo build --release --quiet --bin qlsched --example bench && exec target/release/examples/bench "${mode#--}" "$@"
