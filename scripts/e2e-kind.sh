#!/usr/bin/env bash
# The e2e scenario suite on a kind cluster. scripts/kind.sh makes the cluster (Docker, kind and
# the node image: kind's own where it can be pulled, else built locally) with two workers, builds
# both images from this checkout's binaries (`scripts/kind.sh images`) and loads them with
# `kind load docker-image`, then runs `cargo test -p haptic-e2e --test scenarios` with
# HAPTIC_E2E_CLUSTER=kind: the suite's real-cluster backend (shared with scripts/cluster.sh)
# installs charts/haptic with helm itself. Then it deletes the cluster (`scripts/kind.sh down`,
# which also stops the dockerd scripts/install-docker.sh started).
#
#   scripts/e2e-kind.sh [--keep] [--reuse] [--name NAME]
#     --keep    leave the cluster running afterwards (kubectl --context kind-NAME ...)
#     --reuse   use an existing cluster NAME instead of creating one
#     --name    the kind cluster's name (default haptic-e2e)
# Needs: go (kind, helm, Kubernetes from the Go module proxy), cargo; root where Docker is missing.
set -euo pipefail

name=haptic-e2e keep=0 reuse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --reuse) reuse=1 ;;
    --name) name=${2:?--name needs a value}; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "e2e-kind: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command -v cargo >/dev/null || { echo "e2e-kind: cargo is not installed" >&2; exit 2; }
helm=$(command -v helm || scripts/install-helm.sh)
# DOCKER_HOST (the machine's daemon or scripts/install-docker.sh's) and kind on PATH.
eval "$(scripts/kind.sh env)"

cleanup() {
  if [ "$keep" = 0 ]; then
    [ -z "${cp_ip:-}" ] || $sudo ip route del "$svc_cidr" via "$cp_ip" 2>/dev/null || true
    [ "$reuse" = 1 ] || scripts/kind.sh down --name "$name" || true
  fi
}
trap cleanup EXIT
# Two workers: the two-node scenario spreads the HAProxy pods over them and stops one.
if [ "$reuse" = 0 ]; then
  kubeconfig=$(scripts/kind.sh cluster "$name" 2)
else
  kubeconfig=$(mktemp)
  kind get kubeconfig --name "$name" >"$kubeconfig"
fi
export KUBECONFIG=$kubeconfig

# Some scenarios reach Services' ClusterIPs from this machine (as the host reaches them on
# scripts/cluster.sh's cluster): a route to kind's Service range (10.96.0.0/16) through the
# control-plane node, whose kube-proxy forwards (and masquerades) it. Removed on exit; it would
# go with the kind network's bridge anyway.
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
svc_cidr=10.96.0.0/16
cp_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$name-control-plane")
$sudo ip route replace "$svc_cidr" via "$cp_ip"

tag=kind
scripts/kind.sh images
kind load docker-image --name "$name" "localhost/haptic-agent:$tag" "localhost/haptic-controller:$tag" localhost/haptic-e2e-web:1

# The suite installs the chart itself (the same backend as scripts/cluster.sh's real cluster):
# these values name the loaded images.
values=$(mktemp --suffix .yaml)
cat >"$values" <<EOF
images:
  agent: {repository: localhost/haptic-agent, tag: "$tag", pullPolicy: Never}
  controller: {repository: localhost/haptic-controller, tag: "$tag", pullPolicy: Never}
config:
  name: edge
haproxy:
  # One HAProxy pod per worker where possible (the two-node scenario wants them spread), as
  # scripts/cluster.sh's values say.
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels: {app.kubernetes.io/name: haptic, app.kubernetes.io/component: haproxy}
EOF
# helm's API discovery cache: under target/, not in ~/.kube.
export HAPTIC_E2E_CLUSTER=kind HAPTIC_E2E_VALUES=$values HAPTIC_HELM=$helm KUBECACHEDIR="$root/target/kind/kube-cache"
cargo test --locked -p haptic-e2e --test scenarios every_scenario_on_a_real_cluster -- --nocapture
