#!/usr/bin/env bash
# The longer fuzz run: the property-based fuzz targets (apply decoder and path rules; config
# parser, diff, runtime claim and path list; master CLI reply parsers) with many more cases than
# the bounded run inside `scripts/test.sh`. cargo-fuzz is not used: it needs a nightly toolchain
# and libfuzzer. Any failure proptest finds is shrunk and printed; add it as a regression test.
# Usage: scripts/fuzz.sh [CASES]   (default 20000 per target)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PROPTEST_CASES="${1:-20000}"
echo "==> fuzz targets, ${PROPTEST_CASES} cases each"
cargo test --locked -p haptic-protocol --test fuzz
cargo test --locked -p haptic-haproxy --test fuzz
echo "==> fuzz run passed"
