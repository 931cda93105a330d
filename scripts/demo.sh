#!/usr/bin/env bash
# haptic demo: three local "pods" (HAProxy + haptic-agent each) driven by haptic-controller in
# standalone mode, with a narrated tour of what the controller does for each kind of change.
#
#   scripts/demo.sh          # tour, then keeps running: edit the render dir it prints, Ctrl-C stops
#   scripts/demo.sh --once   # tour, then stops everything and exits (0 = every step went as told)
#   scripts/demo.sh --kubernetes [--once]
#                            # the same tour on a real cluster on this machine (scripts/cluster.sh,
#                            # needs root): helm install of charts/haptic with our images, then each
#                            # step with `kubectl get hapc` and the status table; the cluster stays
#                            # up afterwards (--once: torn down)
#   scripts/demo.sh --kubernetes-local
#                            # the Kubernetes tour without root: a local control plane (etcd +
#                            # kube-apiserver), 3 HAProxy pods run by a kubelet stand-in, 2
#                            # controller replicas, all on loopback
#
# Everything lives under target/demo/ (logs, trees, sockets). Every process this script starts is
# stopped on exit or Ctrl-C (by pid). HAProxy: the 3.0 build from scripts/install-haproxy.sh when
# present, else Debian's /usr/sbin/haproxy (2.6); HAPTIC_DEMO_HAPROXY=/path overrides.
# Ports (127.0.0.1 only): HAPTIC_DEMO_PORT_BASE (default 18000) + 80 frontend, +101..103 demo apps,
# +201..203 agents, +301..303 bootstrap health, +180 controller admin.
set -euo pipefail

ONCE=0
KUBE=0
for a in "$@"; do
  case "$a" in
    --once) ONCE=1 ;;
    --kubernetes) KUBE=1 ;;
    --kubernetes-local) KUBE=local ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $a (try --help)" >&2; exit 2 ;;
  esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "$KUBE" = 1 ]; then
  # The real cluster (scripts/cluster.sh): up unless one runs, our images, then the tour.
  cd "$ROOT"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  started=0
  if ! $sudo scripts/cluster.sh status >/dev/null 2>&1; then
    $sudo scripts/cluster.sh up 2 >/dev/null
    started=1
  fi
  if [ "$ONCE" = 1 ] && [ "$started" = 1 ]; then trap '$sudo scripts/cluster.sh down' EXIT; fi
  cargo build -q -p haptic-agent --bin haptic-agent -p haptic-controller --bin haptic-controller -p haptic-e2e --bin demo-k8s
  target=${CARGO_TARGET_DIR:-$ROOT/target}
  $sudo env HAPTIC_IMAGES_PROFILE=debug ${CARGO_TARGET_DIR:+CARGO_TARGET_DIR="$CARGO_TARGET_DIR"} scripts/cluster.sh load
  kubectl="$(dirname "$(scripts/install-k8s.sh --cluster | head -1)")/kubectl"
  helm=$(scripts/install-helm.sh)
  export KUBECONFIG="$ROOT/target/cluster/kubeconfig" HAPTIC_E2E_VALUES="$ROOT/target/cluster/values.yaml" \
    HAPTIC_HELM="$helm" HAPTIC_KUBECTL="$kubectl"
  "$target/debug/demo-k8s" --real
  echo
  echo "Try it yourself:"
  echo "  export KUBECONFIG=$KUBECONFIG"
  echo "  $kubectl -n haptic get hapc,pods -o wide"
  echo "  scripts/cluster.sh status"
  [ "$ONCE" = 1 ] || echo "  scripts/cluster.sh down      # when done: stops and removes everything"
  exit 0
fi

if [ "$KUBE" = local ]; then
  # The Kubernetes tour is a program of the e2e crate (the same scenarios the e2e suite runs);
  # it starts and stops every process itself. Debug builds: the tour is not about speed.
  cd "$ROOT"
  hap=$(scripts/install-haproxy.sh | tail -1)
  k8s=$(scripts/install-k8s.sh)
  cargo build -q -p haptic-agent --bin haptic-agent -p haptic-controller --bin haptic-controller -p haptic-e2e --bin demo-k8s
  target=${CARGO_TARGET_DIR:-$ROOT/target}
  export HAPTIC_AGENT_BIN="$target/debug/haptic-agent" HAPTIC_CONTROLLER_BIN="$target/debug/haptic-controller"
  HAPTIC_KUBE_APISERVER=$(echo "$k8s" | sed -n 1p) HAPTIC_ETCD=$(echo "$k8s" | sed -n 2p)
  export HAPTIC_KUBE_APISERVER HAPTIC_ETCD
  export HAPTIC_DEMO_HAPROXY="${HAPTIC_DEMO_HAPROXY:-$hap}"
  exec "$target/debug/demo-k8s"
fi
W="$ROOT/target/demo"
BASE=${HAPTIC_DEMO_PORT_BASE:-18000}
FE=$((BASE + 80))
ADMIN=$((BASE + 180))
PIDS=()

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
say() { printf '   %s\n' "$*"; }
die() { printf '\ndemo: %s\n' "$*" >&2; exit 1; }

cleanup() {
  local code=$?
  trap - EXIT INT TERM
  if [ ${#PIDS[@]} -gt 0 ]; then
    printf '\nstopping %d processes...\n' "${#PIDS[@]}"
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do
      local alive=0
      for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break
      sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  fi
  exit $code
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. HAProxy and the build ------------------------------------------------------------------
if [ -z "${HAPTIC_DEMO_HAPROXY:-}" ] && ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  bold "Installing HAProxy (scripts/install-haproxy.sh)"
  "$ROOT/scripts/install-haproxy.sh" >/dev/null
fi
if [ -n "${HAPTIC_DEMO_HAPROXY:-}" ]; then
  HAPROXY=$HAPTIC_DEMO_HAPROXY
elif [ -x "$ROOT/target/haproxy/3.0/haproxy" ]; then
  HAPROXY="$ROOT/target/haproxy/3.0/haproxy"
else
  HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
fi
"$HAPROXY" -v >/dev/null 2>&1 || die "$HAPROXY does not run"
# HAPTIC_DEMO_PROFILE=debug: the debug build (CI runs the tour with the binaries its tests built).
case "${HAPTIC_DEMO_PROFILE:-release}" in
  release) profile_flag=--release profile_dir=release ;;
  debug) profile_flag="" profile_dir=debug ;;
  *) die "HAPTIC_DEMO_PROFILE is release or debug" ;;
esac
bold "Building haptic (cargo build ${profile_flag:---profile dev})"
(cd "$ROOT" && cargo build $profile_flag --locked -p haptic-agent -p haptic-controller --bins)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
AGENT="$TARGET_DIR/$profile_dir/haptic-agent"
CTL="$TARGET_DIR/$profile_dir/haptic-controller"

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in $FE $ADMIN $((BASE + 101)) $((BASE + 102)) $((BASE + 103)) $((BASE + 201)) $((BASE + 202)) \
  $((BASE + 203)) $((BASE + 301)) $((BASE + 302)) $((BASE + 303)); do
  port_busy "$p" && die "port $p on 127.0.0.1 is in use (another demo running? set HAPTIC_DEMO_PORT_BASE)"
done

rm -rf "$W"
mkdir -p "$W/render/maps" "$W/render/files" "$W/apps"
printf 'demo:%s\n' "$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" >"$W/credentials"
chmod 600 "$W/credentials"

# GET with a Host header through bash's /dev/tcp (no curl needed); prints the body.
http() {
  local port=$1 host=$2 path=$3
  timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port
    printf 'GET $path HTTP/1.0\r\nHost: $host\r\n\r\n' >&3
    sed -e '1,/^\r\$/d' <&3" 2>/dev/null || echo "(no answer)"
}

wait_for() { # wait_for DESCRIPTION SECONDS COMMAND...
  local what=$1 secs=$2
  shift 2
  for _ in $(seq $((secs * 10))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "timed out waiting for $what (logs in $W/*.log)"
}

# --- 2. Upstream apps (one plain HAProxy answering "hello from app-N") and three pods -----------
cat >"$W/apps/haproxy.cfg" <<EOF
global
    stats timeout 30s
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
EOF
for n in 1 2 3; do
  cat >>"$W/apps/haproxy.cfg" <<EOF
frontend app$n
    bind 127.0.0.1:$((BASE + 100 + n))
    http-request return status 200 content-type text/plain string "hello from app-$n"
EOF
done
"$HAPROXY" -db -f "$W/apps/haproxy.cfg" >"$W/apps.log" 2>&1 &
PIDS+=($!)
disown

AGENT_URLS=()
start_pod() { # start_pod N: HAProxy (master-worker, master CLI) + haptic-agent
  local n=$1 d="$W/pod$1"
  mkdir -p "$d/run"
  if [ ! -e "$d/root/current" ]; then
    "$AGENT" init --root "$d/root" --health-bind "127.0.0.1:$((BASE + 300 + n))" >>"$d/agent.log" 2>&1
  fi
  "$HAPROXY" -W -db -S "$d/run/master.sock,level,admin" -f "$d/root/current/haproxy.cfg" >>"$d/haproxy.log" 2>&1 &
  echo $! >"$d/haproxy.pid"
  PIDS+=($!)
  disown
  wait_for "pod $n's master socket" 10 test -S "$d/run/master.sock"
  "$AGENT" run --listen "127.0.0.1:$((BASE + 200 + n))" --root "$d/root" --master-socket "$d/run/master.sock" \
    --haproxy-bin "$HAPROXY" --credentials-file "$W/credentials" --min-reload-interval 2s >>"$d/agent.log" 2>&1 &
  echo $! >"$d/agent.pid"
  PIDS+=($!)
  disown
  wait_for "pod $n's agent" 20 port_busy $((BASE + 200 + n))
}
stop_pod() { # kill -9, like a crashed pod
  local d="$W/pod$1"
  kill -KILL "$(cat "$d/agent.pid")" "$(cat "$d/haproxy.pid")" 2>/dev/null || true
  # The master's workers exit when their master dies; wait until the agent port is free.
  for _ in $(seq 50); do port_busy $((BASE + 200 + $1)) || break; sleep 0.1; done
  rm -f "$d/run/master.sock"
}

bold "Starting 3 pods with $("$HAPROXY" -v | head -1 | awk '{print $1, $3}') ($HAPROXY)"
for n in 1 2 3; do
  start_pod "$n"
  AGENT_URLS+=(--agent "http://127.0.0.1:$((BASE + 200 + n))")
  say "pod$n: HAProxy master socket $W/pod$n/run/master.sock, agent http://127.0.0.1:$((BASE + 200 + n))"
done

# --- 3. The render and the controller --------------------------------------------------------
SRV1="127.0.0.1:$((BASE + 101))"
SRV2="127.0.0.1:$((BASE + 102))"
SRV3="127.0.0.1:$((BASE + 103))"
render() { # render SRV_1 SRV_2 SRV_2_STATE EXTRA_FRONTEND_LINE EXTRA_BACKEND_LINE
  cat >"$W/render/haproxy.cfg.tmp" <<EOF
global
    default-path config
    stats timeout 30s

defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s

frontend fe_main
    bind 127.0.0.1:$FE
    http-request return status 200 content-type text/plain lf-string "route: %[req.hdr(host),lower,map(maps/hosts.map,unknown)]" if { path /route }
$4
    default_backend be_app

backend be_app
    balance roundrobin
    server SRV_1 $1 weight 10
    server SRV_2 $2 weight 10 $3
$5
EOF
  mv "$W/render/haproxy.cfg.tmp" "$W/render/haproxy.cfg"
}
printf 'shop.example be_shop\n' >"$W/render/maps/hosts.map"
printf 'Not loaded by haproxy.cfg: a change here is file_only.\n' >"$W/render/files/README.txt"
render "$SRV1" "$SRV2" disabled "" ""

"$CTL" run --standalone --config-dir "$W/render" "${AGENT_URLS[@]}" --credentials-file "$W/credentials" \
  --admin-listen "127.0.0.1:$ADMIN" --haproxy-bin "$HAPROXY" --state-dir "$W/controller-state" \
  --identity demo-controller --drift-interval 5s --settle 300ms >"$W/controller.log" 2>&1 &
PIDS+=($!)
disown
wait_for "the controller's admin port" 20 port_busy "$ADMIN"

status_json() { "$CTL" status --admin "http://127.0.0.1:$ADMIN" --output json; }
# A key of the pretty-printed status: top-level ones are indented by 2, gate/controller ones by 4.
key() { grep -m1 -E "^ {2,4}\"$1\": " | sed -e 's/.*": *//' -e 's/[",]//g'; }
# The status is read whole before it is searched: `grep -m1` may stop reading early.
field() { local s; s=$(status_json) || return 1; key "$1" <<<"$s"; }
table() { echo; "$CTL" status --admin "http://127.0.0.1:$ADMIN" | sed 's/^/   /'; }
converged_on_new() { # converged_on_new OLD_TARGET: all pods converged on a target != OLD_TARGET
  local s target converged total
  s=$(status_json) || return 1
  target=$(key target <<<"$s")
  converged=$(key converged <<<"$s")
  total=$(key total <<<"$s")
  [ "$target" != "null" ] && [ "$target" != "$1" ] && [ "$converged" = "$total" ] && [ "$total" = 3 ]
}
all_converged() { converged_on_new "none"; }
metric() { # the whole scrape first, then the search (a reader that stops early would cut the writer off)
  local m
  m=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ADMIN; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3") || return 1
  awk -v k="$1" '$1 == k {print $2; exit}' <<<"$m"
}
step_done() { table; }

# --- 4. The tour ------------------------------------------------------------------------------
bold "1/7  First deploy: the pods run a bootstrap config; the controller sends the render (a reload)"
wait_for "the first deploy" 60 all_converged
step_done
say "GET / through the fleet: $(http $FE shop.example /)"

bold "2/7  Endpoint change: SRV_2 moves to app-3 and is enabled -> runtime (server.set), 0 reloads"
T=$(field target)
render "$SRV1" "$SRV3" "" "" ""
wait_for "the endpoint change" 30 converged_on_new "$T"
step_done
say "reloads avoided so far: $(metric haptic_reloads_avoided_total)"
say "GET / x6 through the fleet: $(for _ in 1 2 3 4 5 6; do printf '%s | ' "$(http $FE shop.example /)"; done)"

bold "3/7  Map change: maps/hosts.map gets a route -> runtime (map.replace), 0 reloads"
T=$(field target)
printf 'shop.example be_shop\nblog.example be_blog\n' >"$W/render/maps/hosts.map.tmp"
mv "$W/render/maps/hosts.map.tmp" "$W/render/maps/hosts.map"
wait_for "the map change" 30 converged_on_new "$T"
step_done
say "GET /route (Host: blog.example): $(http $FE blog.example /route)"

bold "4/7  Frontend change: a response header -> one paced, verified reload per pod"
T=$(field target)
render "$SRV1" "$SRV3" "" "    http-response set-header X-Served-By haptic" ""
wait_for "the frontend change" 30 converged_on_new "$T"
step_done

bold "5/7  A broken config -> refused: the fleet stays on the last good render and keeps serving"
say "the gate is optimistic (the default): the render goes to the pods at once, while the gate checks it;"
say "each pod's own haproxy -c refuses it (422, nothing changes on the pod), then the gate's check refuses"
say "it too and pins the fleet on the last good render until a render passes (--gate pessimistic would hold"
say "every render until the gate passed it, and no pod would see this one)"
GOOD=$(field target)
render "$SRV1" "$SRV3" "" "    http-response set-header X-Served-By haptic" "    balance no-such-algorithm"
gate_pinned() { [ "$(field pinned)" = true ]; }
wait_for "the gate to refuse it" 30 gate_pinned
back_on_good() { [ "$(field target)" = "$GOOD" ] && all_converged; }
wait_for "the fleet back on the last good render" 30 back_on_good
step_done
say "refused by the pods' own haproxy -c: $(metric 'haptic_apply_rejected_total{haproxy_pod="127.0.0.1:'$((BASE + 201))'"}' || true) + \
$(metric 'haptic_apply_rejected_total{haproxy_pod="127.0.0.1:'$((BASE + 202))'"}' || true) + \
$(metric 'haptic_apply_rejected_total{haproxy_pod="127.0.0.1:'$((BASE + 203))'"}' || true) applies; by the gate: $(metric haptic_gate_rejections_total) render"
say "GET / through the fleet still answers: $(http $FE shop.example /)"
say "fixing the config again (the next good render deploys and unpins the gate)"
render "$SRV1" "$SRV3" "" "    http-response set-header X-Served-By haptic" "    # fixed"
unpinned() { [ "$(field pinned)" = false ] && all_converged; }
wait_for "the fixed render" 30 unpinned
step_done

bold "6/7  A file edited behind the controller's back on pod2 -> drift repair rewrites it (verify=1)"
R0=$(metric haptic_drift_repairs_total)
LIVE_MAP="$W/pod2/root/current/maps/hosts.map"
rm -f "$LIVE_MAP" && printf 'evil.example be_evil\n' >"$LIVE_MAP"
say "pod2's live map now says: $(cat "$LIVE_MAP")"
repaired() { [ "$(metric haptic_drift_repairs_total)" != "${R0:-0}" ] && cmp -s "$LIVE_MAP" "$W/render/maps/hosts.map"; }
wait_for "the drift repair" 30 repaired
step_done
say "pod2's live map again: $(tr '\n' ' ' <"$LIVE_MAP")  (drift repairs: $(metric haptic_drift_repairs_total))"

bold "7/7  pod3 is killed (-9, HAProxy and agent), the config changes meanwhile, pod3 restarts -> it converges"
stop_pod 3
T=$(field target)
render "$SRV2" "$SRV3" "" "    http-response set-header X-Served-By haptic" "    # fixed"
pod3_failed() { local s; s=$(status_json) && grep -q '"phase": "failed"' <<<"$s"; }
wait_for "the deployment to reach pods 1 and 2" 30 pod3_failed
table
say "restarting pod3 (HAProxy starts from its last applied tree; the agent reports it)"
start_pod 3
wait_for "pod3 to converge" 60 converged_on_new "$T"
step_done

bold "Tour complete."
if [ "$ONCE" = 1 ]; then
  exit 0
fi
say "The controller keeps running. Edit the render directory and watch the status:"
say "  render dir:  $W/render   (haproxy.cfg, maps/hosts.map, files/README.txt)"
say "  status:      $CTL status --admin http://127.0.0.1:$ADMIN"
say "  metrics:     http://127.0.0.1:$ADMIN/metrics     logs: $W/*.log $W/pod*/*.log"
say "  traffic:     http://127.0.0.1:$FE/"
say "Ctrl-C stops every process this demo started."
while true; do sleep 3600; done
