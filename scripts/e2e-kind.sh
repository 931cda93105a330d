#!/usr/bin/env bash
# The e2e scenario suite on a kind cluster (where Docker and kind exist; on machines without
# Docker, scripts/cluster.sh makes the same kind of real cluster). Creates a cluster, builds both
# images with `docker build`, loads them with `kind load docker-image`, and runs
# `cargo test -p haptic-e2e --test scenarios` with HAPTIC_E2E_CLUSTER=kind: the suite's
# real-cluster backend (shared with scripts/cluster.sh) installs charts/haptic with helm itself.
# Then it deletes the cluster.
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
  # Two workers: the two-node scenario spreads the HAProxy pods over them and stops one.
  printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: control-plane\n- role: worker\n- role: worker\n' |
    kind create cluster --name "$name" --wait 180s --config -
fi
trap cleanup EXIT
kubeconfig=$(mktemp)
kind get kubeconfig --name "$name" >"$kubeconfig"
export KUBECONFIG=$kubeconfig

tag=e2e
docker build -f Dockerfile.agent -t "haptic-agent:$tag" .
docker build -f Dockerfile.controller -t "haptic-controller:$tag" .
kind load docker-image --name "$name" "haptic-agent:$tag" "haptic-controller:$tag"

# The suite installs the chart itself (the same backend as scripts/cluster.sh's real cluster):
# these values name the loaded images.
values=$(mktemp --suffix .yaml)
cat >"$values" <<EOF
images:
  agent: {repository: docker.io/library/haptic-agent, tag: "$tag", pullPolicy: Never}
  controller: {repository: docker.io/library/haptic-controller, tag: "$tag", pullPolicy: Never}
config:
  name: edge
EOF
export HAPTIC_E2E_CLUSTER=kind HAPTIC_E2E_VALUES=$values HAPTIC_HELM=$helm
cargo test --locked -p haptic-e2e --test scenarios every_scenario_on_a_real_cluster -- --nocapture
