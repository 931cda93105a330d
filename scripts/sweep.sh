#!/usr/bin/env bash
# Runs the bench's `sweep` case (HTTPRoutes 10 → 1,000 → 10 under steady load on the local
# control plane, 3 HAProxy 3.4 pods, release binaries) and draws it: OUT_DIR/sweep.json (the
# steps), OUT_DIR/sweep.md (the bench's rows) and OUT_DIR/sweep.png (memory and latency per
# step, drawn by sweep-plot from the JSON). HAProxy and the control plane come from the project's
# install scripts (cached under target/); the plot's font from Debian's fonts-dejavu-core.
# Usage: scripts/sweep.sh [OUT_DIR]   (default docs/benchmarks)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-docs/benchmarks}"
mkdir -p "$out"

hap_paths=$(scripts/install-haproxy.sh)
hap=$(grep '/3\.4/haproxy$' <<<"$hap_paths") || { echo "scripts/install-haproxy.sh gave no HAProxy 3.4" >&2; exit 1; }
k8s_paths=$(scripts/install-k8s.sh)
mapfile -t k8s <<<"$k8s_paths"
export HAPTIC_KUBE_APISERVER="${k8s[0]}" HAPTIC_ETCD="${k8s[1]}"

font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [ ! -f "$font" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fonts-dejavu-core >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fonts-dejavu-core >/dev/null; }
fi

# The bench starts the agent and controller built beside it (one command per package set: a
# `--bin` filter applies to every package of its command).
cargo build --release --locked -p haptic-agent -p haptic-controller
cargo build --release --locked -p haptic-e2e --bin bench --bin sweep-plot
env -u HAPTIC_AGENT_BIN -u HAPTIC_CONTROLLER_BIN target/release/bench --only sweep --haproxy "$hap" \
  --sweep-json "$out/sweep.json" --markdown "$out/sweep.md"
target/release/sweep-plot "$out/sweep.json" "$out/sweep.png" --font "$font"
