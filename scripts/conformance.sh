#!/usr/bin/env bash
# The upstream Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance v1.6.3, profiles
# GATEWAY-HTTP, -GRPC, -TLS and -TCP, on the standard and then the experimental channel's CRDs)
# against haptic on the real cluster of scripts/cluster.sh.
#
#   scripts/conformance.sh              run it (a cluster must be up and our images loaded:
#                                       scripts/cluster.sh up && scripts/cluster.sh load)
#   scripts/conformance.sh --build      only build what it needs (no cluster)
#
# What it does, each step cached or idempotent:
#  1. builds, with the machine's Go through the Go module proxy, from the tools module
#     conformance/tools (go.mod + go.sum pin sigs.k8s.io/gateway-api and .../conformance v1.6.3):
#     the suite's own test binary (`go test -c` of the conformance package), its echo backend
#     (echo-basic), and coredns v1.12.2 (the suite's base manifests run it and wait for every
#     pod to be Ready), into target/conformance/;
#  2. makes `FROM scratch` images of echo-basic and coredns (buildah) and imports them into every
#     node under the names the suite's manifests use (they pull IfNotPresent);
#  3. applies the v1.6.3 standard-channel CRDs from the pinned module (server-side);
#  4. installs our chart with gateway.enabled (GatewayClass `haptic`);
#  5. runs the profiles with the features the GatewayClass's status claims, but those whose
#     fields only the experimental channel has, and writes the suite's report to
#     conformance/report.yaml (its log to target/conformance/v1.6.3/run-standard.log);
#  6. replaces the CRDs with the experimental channel's and runs the profiles again with every
#     claimed feature: conformance/report-experimental.yaml (run-experimental.log);
#     HAPTIC_CONFORMANCE_EXPERIMENTAL=0 skips this run;
#  7. uninstalls the chart (the CRDs stay: the cluster is thrown away by `cluster.sh down`).
# Exit status: the suite's. Needs root (images, nodes), like scripts/cluster.sh.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
V=v1.6.3
COREDNS=v1.12.2
tools="$root/conformance/tools"
out="$root/target/conformance/$V"
S="$root/target/cluster"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
# The features to test: by default those the GatewayClass's status.supportedFeatures lists (the
# translator's one list), or these, comma-separated.
FEATURES=${HAPTIC_CONFORMANCE_FEATURES:-}
# The profiles it runs.
PROFILES=${HAPTIC_CONFORMANCE_PROFILES:-GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP}

log() { echo "conformance: [$(date +%T)] $*" >&2; }
die() { log "error: $*"; exit 1; }

build() {
  command -v go >/dev/null || die "go is not installed"
  mkdir -p "$out"
  if [ ! -x "$out/conformance.test" ]; then
    log "building the suite's test binary ($V; about 4 min cold on 2 cores)"
    (cd "$tools" && go test -c -trimpath -o "$out/conformance.test.tmp" sigs.k8s.io/gateway-api/conformance)
    mv "$out/conformance.test.tmp" "$out/conformance.test"
  fi
  if [ ! -x "$out/echo-basic" ]; then
    log "building echo-basic ($V)"
    (cd "$tools" && go build -trimpath -o "$out/echo-basic.tmp" sigs.k8s.io/gateway-api/conformance/echo-basic)
    mv "$out/echo-basic.tmp" "$out/echo-basic"
  fi
  local cd="$root/target/conformance/coredns-$COREDNS"
  if [ ! -x "$cd/coredns" ]; then
    log "building coredns $COREDNS (about 10 min cold on 2 cores)"
    mkdir -p "$cd.tmp"
    GOFLAGS="" GOBIN="$cd.tmp" go install "github.com/coredns/coredns@$COREDNS"
    rm -rf "$cd" && mv "$cd.tmp" "$cd"
  fi
}

if [ "${1:-}" = "--build" ]; then
  build
  exit 0
fi

if [ ! -f "$S/kubeconfig" ] || [ ! -f "$S/values.yaml" ]; then
  die "no cluster with our images (scripts/cluster.sh up && scripts/cluster.sh load)"
fi
export KUBECONFIG="$S/kubeconfig"
kubectl=$(dirname "$(sed -n 1p <<<"$("$root/scripts/install-k8s.sh" --cluster)")")/kubectl
helm=$("$root/scripts/install-helm.sh")
build

# 2. Images: scratch images of the two binaries, imported into every node under every name.
B=(buildah --storage-driver vfs)
image() { # NAME BINARY ARCHIVE: a FROM scratch image running BINARY, pushed to ARCHIVE once
  local name=$1 bin=$2 archive=$3 c
  [ -f "$archive" ] && [ "$archive" -nt "$bin" ] && return 0
  c=$("${B[@]}" from scratch)
  "${B[@]}" copy "$c" "$bin" "/$(basename "$bin")" >/dev/null
  "${B[@]}" config --entrypoint "[\"/$(basename "$bin")\"]" "$c"
  "${B[@]}" commit -q "$c" "$name" >/dev/null
  "${B[@]}" rm "$c" >/dev/null
  rm -f "$archive.tmp"
  "${B[@]}" push -q "$name" "oci-archive:$archive.tmp:$name"
  mv "$archive.tmp" "$archive"
}
image localhost/haptic-conformance-echo:$V "$out/echo-basic" "$out/echo.tar"
image localhost/haptic-conformance-coredns:$COREDNS "$root/target/conformance/coredns-$COREDNS/coredns" "$out/coredns.tar"
nodes=$(cat "$S/run/nodes" 2>/dev/null || echo 1)
# The names the suite's manifests use, read from the pinned module (never typed here).
mod=$(cd "$tools" && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
echo_names=$(grep -rhoE 'registry\.k8s\.io/gateway-api/echo-basic:[^" ]+' "$mod/base" "$mod/tests" | sort -u)
coredns_names=$(grep -rhoE 'registry\.k8s\.io/coredns/coredns:[^" ]+' "$mod/base" "$mod/tests" | sort -u)
for ((n = 0; n < nodes; n++)); do
  "$root/scripts/cluster.sh" ctr "$n" images import "$out/echo.tar" >/dev/null
  "$root/scripts/cluster.sh" ctr "$n" images import "$out/coredns.tar" >/dev/null
  for name in $echo_names; do
    "$root/scripts/cluster.sh" ctr "$n" images rm "$name" >/dev/null 2>&1 || true
    "$root/scripts/cluster.sh" ctr "$n" images tag "localhost/haptic-conformance-echo:$V" "$name" >/dev/null
  done
  for name in $coredns_names; do
    "$root/scripts/cluster.sh" ctr "$n" images rm "$name" >/dev/null 2>&1 || true
    "$root/scripts/cluster.sh" ctr "$n" images tag "localhost/haptic-conformance-coredns:$COREDNS" "$name" >/dev/null
  done
done
log "echo-basic and coredns imported into $nodes node(s) as: $(echo "$echo_names" "$coredns_names" | tr '\n' ' ')"

# 3. The standard-channel CRDs of the pinned module.
"$root/scripts/cluster.sh" gateway-crds
log "Gateway API $V standard CRDs applied"

# 4. Our chart, serving the GatewayClass haptic.
# shellcheck disable=SC2317 # run by the EXIT trap
uninstall() {
  "$helm" uninstall haptic --namespace haptic --wait --timeout 2m >/dev/null 2>&1 || true
}
trap uninstall EXIT
# No load-balancer provider here: the Gateways' Services are ClusterIP (reached from the host).
# This test cluster lets Gateways put any `spec.infrastructure` key on their Services
# (GatewayInfrastructure); the chart's default lets none through.
"$root/scripts/cluster.sh" install --set gateway.enabled=true --set gateway.service.type=ClusterIP \
  --set 'gateway.infrastructureKeys={*}'
claimed=""
for _ in $(seq 120); do
  claimed=$("$kubectl" get gatewayclass haptic -o jsonpath='{.status.supportedFeatures[*].name}' 2>/dev/null || true)
  [ -n "$claimed" ] && break
  sleep 1
done
[ -n "$claimed" ] || die "the GatewayClass haptic lists no supportedFeatures after 120 s"

# What the fleet did: the controllers' counters (only the Lease holder deploys; summed over both
# replicas), read before and after the suite. `haptic_applies` counts one per HAProxy pod and
# plan, by the mode it landed in; `haptic_deployments` one per render deployed to the fleet.
scrape() { # every controller replica's /metrics, one after the other
  local ips ip
  ips=$("$kubectl" -n haptic get pods -l app.kubernetes.io/component=controller \
    -o jsonpath='{.items[*].status.podIP}')
  for ip in $ips; do curl -s --max-time 5 "http://$ip:9180/metrics" || true; done
}
counters() { # of a scrape on stdin
  awk '/^haptic_deployments_total[{ ]/ {d += $NF}
         /^haptic_applies_total\{/ && /result="ack"/ {
           m = $0; sub(/.*mode="/, "", m); sub(/".*/, "", m); a[m] += $NF }
         END { printf "%d %d %d\n", d, a["runtime"], a["reload"] }'
}

# Reloads by cause (`haptic_reload_causes_total{cause}`), as "cause count" lines.
causes() { # of a scrape on stdin
  awk '/^haptic_reload_causes_total\{/ { c = $0; sub(/.*cause="/, "", c); sub(/".*/, "", c); n[c] += $NF }
         END { for (c in n) printf "%s %d\n", c, n[c] }' | sort
}

# The claimed features whose fields only the experimental channel's CRDs have (`rules[].retry`):
# the standard run leaves them out (the API server would drop the field), the experimental run
# tests every claimed feature.
experimental_only="HTTPRouteRetry HTTPRouteRetryBackendTimeout HTTPRouteRetryConnectionError"

# 5. The suite, once per channel: CHANNEL FEATURES REPORT (FEATURES comma-separated).
mkdir -p "$root/conformance"
pods=$("$kubectl" -n haptic get pods -l app.kubernetes.io/component=haproxy --no-headers | wc -l)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
read -ra extra <<<"${HAPTIC_CONFORMANCE_ARGS:-}"
# GatewayStaticAddresses: a Gateway's static address is its Service's cluster IP, so a usable
# one is free in the cluster's Service range (scripts/cluster.sh: 10.0.0.0/24; the low addresses
# are the range's static band, which the API server never hands out on its own; 10.0.0.10 is
# the cluster DNS) and an unusable one is outside it.
usable=${HAPTIC_CONFORMANCE_USABLE_ADDRESS:-10.0.0.12}
unusable=${HAPTIC_CONFORMANCE_UNUSABLE_ADDRESS:-192.0.2.1}
suite() {
  local channel=$1 features=$2 report=$3 log="$out/run-$1.log" before after rc t0 d0 rt0 rl0 d1 rt1 rl1
  before=$(scrape)
  read -r d0 rt0 rl0 <<<"$(counters <<<"$before")"
  log "running $PROFILES on the $channel channel ($features); log: $log"
  t0=$SECONDS
  set +e
  "$out/conformance.test" -test.run '^TestConformance$' -test.v -test.timeout 90m \
    --gateway-class=haptic --conformance-profiles="$PROFILES" --supported-features="$features" \
    --report-output="$report.tmp" --organization=haptic --project=haptic \
    --url=https://github.com/haptic/haptic --version="v$version" --contact=haptic-maintainers \
    --mode=default --cleanup-base-resources=true \
    --usable-address="$usable" --unusable-address="$unusable" \
    --timeout-config-overrides="${HAPTIC_CONFORMANCE_TIMEOUTS:-MaxTimeToConsistency:60}" \
    "${extra[@]}" >"$log" 2>&1
  rc=$?
  set -e
  log "the suite ($channel) ended with status $rc after $((SECONDS - t0)) s"
  after=$(scrape)
  read -r d1 rt1 rl1 <<<"$(counters <<<"$after")"
  log "the fleet during the suite: $((d1 - d0)) renders deployed to $pods HAProxy pod(s); applies landed at runtime: $((rt1 - rt0)), with a reload: $((rl1 - rl0)) (summed over the pods)"
  # One apply may reload for several causes, so these add up to at least the reloads above.
  log "reloads by cause: $(join -a 2 -e 0 -o 0,1.2,2.2 <(causes <<<"$before") <(causes <<<"$after") |
    awk '$3 - $2 > 0 { printf "%s%s %d", sep, $1, $3 - $2; sep = ", " }')"
  grep -E '^(--- |=== RUN|FAIL|ok|PASS)' "$log" | grep -E '^--- (FAIL|SKIP)|^(FAIL|ok|PASS)' | head -80 >&2 || true
  if [ -s "$report.tmp" ]; then
    mv "$report.tmp" "$report"
    log "report: $report"
    grep -E '^(  - name|    (result|summary)|      (Passed|Failed|Skipped)):' "$report" >&2 || true
  fi
  return "$rc"
}

all=${FEATURES:-$(tr ' ' ',' <<<"$claimed")}
standard=$(tr ',' '\n' <<<"$all" | grep -vxF -f <(tr ' ' '\n' <<<"$experimental_only") | paste -sd, -)
rc=0
suite standard "$standard" "$root/conformance/report.yaml" || rc=$?
# The experimental channel: its CRDs replace the standard ones, and every feature is tested.
if [ "${HAPTIC_CONFORMANCE_EXPERIMENTAL:-1}" = 1 ]; then
  "$root/scripts/cluster.sh" gateway-crds experimental
  suite experimental "$all" "$root/conformance/report-experimental.yaml" || rc=$?
fi
exit "$rc"
