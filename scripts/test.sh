#!/usr/bin/env bash
# The README's test command: installs HAProxy 2.6 and 3.0 (scripts/install-haproxy.sh), then runs
# formatting, clippy and the whole test suite against real HAProxy processes on 127.0.0.1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "==> installing HAProxy (2.6 from Debian, 3.0 from trixie into target/haproxy)"
mapfile -t bins < <(scripts/install-haproxy.sh)
export HAPTIC_HAPROXY_BINS="${HAPTIC_HAPROXY_BINS:-$(IFS=:; echo "${bins[*]}")}"
for b in "${bins[@]}"; do echo "    $("$b" -v | head -1)  ($b)"; done

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> real-HAProxy harness on every version (output shown)"
cargo test --locked -p haptic-e2e --test harness -- --nocapture --test-threads=1

echo "==> fuzz targets, bounded run (scripts/fuzz.sh runs them longer)"
PROPTEST_CASES="${HAPTIC_FUZZ_CASES:-256}" cargo test --locked -p haptic-protocol -p haptic-haproxy --test fuzz

echo "==> cargo test (whole workspace)"
cargo test --workspace --locked -- --test-threads="${HAPTIC_TEST_THREADS:-2}"

if [ -f e2e/src/bin/bench/main.rs ]; then
  echo "==> benchmark smoke test (not timed; debug build, beside the debug agent the tests built)"
  cargo run --locked -p haptic-e2e --bin bench -- --quick --only runtime_apply
fi
echo "==> all tests passed"
