#!/usr/bin/env bash
# The e2e scenario suite on a kind cluster (where Docker and kind exist; not on the project's own
# machines, which have no Docker daemon). Creates a cluster, builds both images with
# `docker build`, loads them with `kind load docker-image`, installs charts/haptic with helm,
# runs `cargo test -p haptic-e2e --test scenarios` with HAPTIC_E2E_CLUSTER=kind, and deletes the
# cluster.
#
#   scripts/e2e-kind.sh [--keep] [--reuse] [--name NAME]
#     --keep    leave the cluster running afterwards (kubectl --context kind-NAME ...)
#     --reuse   use an existing cluster NAME instead of creating one
#     --name    the kind cluster's name (default haptic-e2e)
# Needs: docker, kind, helm 3 (or scripts/install-helm.sh), cargo.
set -euo pipefail

name=haptic-e2e keep=0 reuse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --reuse) reuse=1 ;;
    --name) name=${2:?--name needs a value}; shift ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "e2e-kind: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
for tool in docker kind cargo; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is not installed" >&2; exit 2; }
done
helm=$(command -v helm || scripts/install-helm.sh)

cleanup() {
  if [ "$keep" = 0 ] && [ "$reuse" = 0 ]; then kind delete cluster --name "$name" || true; fi
}
if [ "$reuse" = 0 ]; then
  kind create cluster --name "$name" --wait 180s
fi
trap cleanup EXIT
kubeconfig=$(mktemp)
kind get kubeconfig --name "$name" >"$kubeconfig"
export KUBECONFIG=$kubeconfig

tag=e2e
docker build -f Dockerfile.agent -t "haptic-agent:$tag" .
docker build -f Dockerfile.controller -t "haptic-controller:$tag" .
kind load docker-image --name "$name" "haptic-agent:$tag" "haptic-controller:$tag"

# The scenarios drive the HAProxyConfig `edge` (Lease haptic-edge, Secret haptic-agent-credentials).
"$helm" upgrade --install haptic charts/haptic --namespace haptic --create-namespace --wait --timeout 5m \
  --set config.name=edge \
  --set images.agent.repository=haptic-agent --set images.agent.tag="$tag" --set images.agent.pullPolicy=Never \
  --set images.controller.repository=haptic-controller --set images.controller.tag="$tag" \
  --set images.controller.pullPolicy=Never

export HAPTIC_E2E_CLUSTER=kind HAPTIC_E2E_NAMESPACE=haptic HAPTIC_E2E_HAPROXY_DEPLOYMENT=haptic-haproxy \
  HAPTIC_E2E_CONFIG_VOLUME=config HAPTIC_E2E_HTTP_PORT=8080 HAPTIC_E2E_AGENT_PORT=9080
cargo test --locked -p haptic-e2e --test scenarios -- --nocapture
