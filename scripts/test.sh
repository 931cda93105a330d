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

echo "==> building the agent and controller binaries the tests and the bench start"
# Integration tests outside the agent crate and the bench start these as processes. They use
# exactly these builds (never a stale binary left in target/ by an older checkout).
cargo build --locked -p haptic-agent --bin haptic-agent -p haptic-controller --bin haptic-controller
export HAPTIC_AGENT_BIN="$PWD/target/debug/haptic-agent"
export HAPTIC_CONTROLLER_BIN="$PWD/target/debug/haptic-controller"
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  export HAPTIC_AGENT_BIN="$CARGO_TARGET_DIR/debug/haptic-agent"
  export HAPTIC_CONTROLLER_BIN="$CARGO_TARGET_DIR/debug/haptic-controller"
fi

echo "==> real-HAProxy harness on every version (output shown)"
cargo test --locked -p haptic-e2e --test harness -- --nocapture --test-threads=1

echo "==> cargo test (whole workspace)"
cargo test --workspace --locked -- --test-threads="${HAPTIC_TEST_THREADS:-2}"

if [ -f e2e/src/bin/bench/main.rs ]; then
  echo "==> benchmark smoke run: every case once, debug build, untimed (speed goals are judged only in release runs)"
  cargo run --locked -p haptic-e2e --bin bench -- --quick --only runtime_apply
fi
echo "==> all tests passed"
