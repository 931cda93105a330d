#!/usr/bin/env bash
# The README's test command: installs HAProxy 2.6, 3.0, 3.2 and 3.4 (scripts/install-haproxy.sh), the local
# Kubernetes control plane (scripts/install-k8s.sh), helm (scripts/install-helm.sh), promtool and
# actionlint (scripts/install-promtool.sh, scripts/install-actionlint.sh), then runs
# formatting, clippy and the whole test suite against real HAProxy processes and a real
# kube-apiserver on 127.0.0.1; then a real cluster on this machine (scripts/cluster.sh: up, our
# images loaded, the e2e suite with the chart installed by helm, the Gateway API conformance
# suite (scripts/conformance.sh), down; needs root or sudo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A failing test prints its message and location, not a stack of runtime frames that pushes the
# message out of a CI log's excerpt (HAPTIC_TEST_BACKTRACE=1 brings the stacks back).
export RUST_BACKTRACE="${HAPTIC_TEST_BACKTRACE:-0}"

echo "==> installing HAProxy (2.6 from Debian; 3.0, 3.2 and 3.4 from trixie, forky and experimental into target/haproxy)"
# (Not `mapfile < <(script)`: a failing install must stop the run.)
hap_paths=$(scripts/install-haproxy.sh)
mapfile -t bins <<<"$hap_paths"
export HAPTIC_HAPROXY_BINS="${HAPTIC_HAPROXY_BINS:-$(IFS=:; echo "${bins[*]}")}"
for b in "${bins[@]}"; do echo "    $("$b" -v | head -1)  ($b)"; done

echo "==> installing the local Kubernetes control plane (kube-apiserver from Go, etcd from trixie, into target/k8s)"
k8s_paths=$(scripts/install-k8s.sh)
mapfile -t k8s <<<"$k8s_paths"
export HAPTIC_KUBE_APISERVER="${HAPTIC_KUBE_APISERVER:-${k8s[0]}}" HAPTIC_ETCD="${HAPTIC_ETCD:-${k8s[1]}}"
echo "    $("$HAPTIC_KUBE_APISERVER" --version)  ($HAPTIC_KUBE_APISERVER)"
echo "    $("$HAPTIC_ETCD" --version 2>/dev/null | sed -n 1p)  ($HAPTIC_ETCD)"

echo "==> installing helm (the Go module's CLI, pinned, into target/helm)"
HAPTIC_HELM="${HAPTIC_HELM:-$(scripts/install-helm.sh)}"
export HAPTIC_HELM
echo "    helm $("$HAPTIC_HELM" version --short)  ($HAPTIC_HELM)"

echo "==> installing promtool (Prometheus's, the Go module's CLI, pinned, into target/promtool)"
HAPTIC_PROMTOOL="${HAPTIC_PROMTOOL:-$(scripts/install-promtool.sh)}"
export HAPTIC_PROMTOOL
echo "    $("$HAPTIC_PROMTOOL" --version | head -1)  ($HAPTIC_PROMTOOL)"

echo "==> installing actionlint (the Go module's CLI, pinned, into target/actionlint)"
HAPTIC_ACTIONLINT="${HAPTIC_ACTIONLINT:-$(scripts/install-actionlint.sh)}"
export HAPTIC_ACTIONLINT
echo "    actionlint $("$HAPTIC_ACTIONLINT" -version | head -1)  ($HAPTIC_ACTIONLINT)"

echo "==> shellcheck (every script, the CI entry; shellcheck from Debian)"
if ! command -v shellcheck >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq shellcheck >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq shellcheck >/dev/null; }
fi
shellcheck scripts/*.sh .ci/run

echo "==> docs/crd-reference.md is the CRD's schema (scripts/crd-reference.sh --check)"
scripts/crd-reference.sh --check

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

echo "==> local control plane and kubelet stand-in (output shown: start-up time)"
cargo test --locked -p haptic-e2e --test control_plane -- --nocapture
echo "==> fuzz targets, bounded run (scripts/fuzz.sh runs them longer)"
PROPTEST_CASES="${HAPTIC_FUZZ_CASES:-256}" cargo test --locked -p haptic-protocol -p haptic-haproxy --test fuzz

echo "==> Helm chart: lint, render, assertions, server-side dry run against the real apiserver (output shown)"
cargo test --locked -p haptic-e2e --test chart -- --nocapture

echo "==> GitHub Actions workflows: actionlint (with shellcheck on every run: step), the release against the chart"
cargo test --locked -p haptic-e2e --test workflows

echo "==> cargo test (whole workspace)"
cargo test --workspace --locked -- --test-threads="${HAPTIC_TEST_THREADS:-2}"

echo "==> a real cluster on this machine: scripts/cluster.sh up (kubelet + containerd nodes), our images, the e2e suite with the chart installed by helm, down"
# Debug binaries in the images: the ones built above (the images' runtime stages come from the
# Dockerfiles; scripts/images.sh --prebuilt). HAPTIC_TEST_CLUSTER=0 skips this step.
if [ "${HAPTIC_TEST_CLUSTER:-1}" = 1 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  trap '$sudo scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
  cluster_t0=$SECONDS
  kubeconfig=$($sudo scripts/cluster.sh up 2 | tail -1)
  echo "    cluster up in $((SECONDS - cluster_t0)) s"
  $sudo env HAPTIC_IMAGES_PROFILE=debug ${CARGO_TARGET_DIR:+CARGO_TARGET_DIR="$CARGO_TARGET_DIR"} scripts/cluster.sh load
  HAPTIC_E2E_CLUSTER=real HAPTIC_E2E_VALUES="$PWD/target/cluster/values.yaml" \
    env "$kubeconfig" cargo test --locked -p haptic-e2e --test scenarios every_scenario_on_a_real_cluster -- --nocapture
  $sudo scripts/cluster.sh down
  # The upstream Gateway API conformance suite (v1.6.3, four profiles) on a fresh one-node cluster
  # (the e2e suite above stops a node on purpose): scripts/conformance.sh builds it (cached),
  # loads its images, installs the chart with gateway.enabled and writes
  # conformance/report.yaml (the experimental channel's run, report-experimental.yaml, only with
  # HAPTIC_CONFORMANCE_EXPERIMENTAL=1: see conformance/README.md); then our own Gateway steps.
  # HAPTIC_TEST_CONFORMANCE=0 skips both.
  if [ "${HAPTIC_TEST_CONFORMANCE:-1}" = 1 ]; then
    conformance_t0=$SECONDS
    kubeconfig=$($sudo scripts/cluster.sh up 1 | tail -1)
    $sudo env HAPTIC_IMAGES_PROFILE=debug ${CARGO_TARGET_DIR:+CARGO_TARGET_DIR="$CARGO_TARGET_DIR"} scripts/cluster.sh load
    $sudo env HAPTIC_CONFORMANCE_EXPERIMENTAL="${HAPTIC_CONFORMANCE_EXPERIMENTAL:-0}" scripts/conformance.sh
    # Our own Gateway API steps on the same cluster (its CRDs are there now): scale under load
    # behind an HTTPRoute, a weight shift, a refused route, routes timed to their first 200.
    HAPTIC_E2E_CLUSTER=real HAPTIC_E2E_VALUES="$PWD/target/cluster/values.yaml" \
      env "$kubeconfig" cargo test --locked -p haptic-e2e --test gateway_cluster -- --nocapture
    # Every command of the README's Quickstart, Ingress and HTTPRoute sections, as written, on
    # the same cluster (about 2.5 min); the blocks it does not run are the ones .ci/run runs.
    HAPTIC_E2E_CLUSTER=real HAPTIC_E2E_VALUES="$PWD/target/cluster/values.yaml" \
      env "$kubeconfig" cargo test --locked -p haptic-e2e --test readme_cluster -- --nocapture
    $sudo scripts/cluster.sh down
    echo "    the conformance suite took $((SECONDS - conformance_t0)) s (cluster up, images, suite, down)"
  fi
  trap - EXIT
  echo "    the real-cluster step took $((SECONDS - cluster_t0)) s"
fi

if [ -f e2e/src/bin/bench/main.rs ]; then
  echo "==> benchmark smoke run: every case once, debug build, untimed (speed goals are judged only in release runs)"
  cargo run --locked -p haptic-e2e --bin bench -- --quick --only runtime_apply
fi
echo "==> all tests passed"
