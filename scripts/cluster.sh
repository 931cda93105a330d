#!/usr/bin/env bash
# A real Kubernetes v1.34 cluster on this machine, without Docker or kind: the control plane on the
# host, one or two nodes, each a network namespace running containerd + runc + kubelet + kube-proxy
# with bridge CNI. What kind gives a developer, on any Linux machine with root.
#
#   scripts/cluster.sh up [NODES]    start a cluster (NODES 1 or 2, default 2); last line KUBECONFIG=...
#   scripts/cluster.sh load          build both haptic images (scripts/images.sh --prebuilt) and
#                                    import them into every node (HAPTIC_IMAGES_PROFILE=debug|release,
#                                    default release)
#   scripts/cluster.sh install [--release NAME] [HELM ARGS...]
#                                    helm install charts/haptic as release NAME (default haptic) into
#                                    namespace NAME with the loaded images (imagePullPolicy Never)
#                                    and wait for the rollout
#   scripts/cluster.sh gateway-crds [standard|experimental]
#                                    apply the Gateway API CRDs of that channel (default standard)
#                                    of the conformance tools' pinned module (server-side) and wait
#                                    until established; experimental replaces standard ones
#   scripts/cluster.sh status        nodes, pods, HAProxyConfigs
#   scripts/cluster.sh down          stop and remove everything `up` made; exit 1 if anything is left
#   scripts/cluster.sh stop-node N   kill node N's kubelet and containerd (its containers keep running)
#   scripts/cluster.sh ctr N ARGS... `ctr` against node N's containerd (namespace k8s.io)
#
# Everything lives under target/cluster/ (binaries come from scripts/install-k8s.sh --cluster, the
# same Go tools module and version as the tests' control plane). Needs root and Debian (apt-get
# installs containerd, runc, the CNI plugins and iptables when missing).
#
# Network (only our own namespaces; nothing reaches past this host):
#  - node N is network namespace haptic-nodeN, joined to the host by veth hpt<N>h (host,
#    10.99.0.4N+1/30) <-> hpt<N>n (node, 10.99.0.4N+2/30: the node IP). containerd, kubelet and
#    kube-proxy run in it through `nsenter --net` (not `ip netns exec`: that adds a private mount
#    namespace and hides the kubelet's mounts from containerd and from `down`).
#  - the apiserver listens on 10.99.0.1 (hpt0h), etcd on 127.0.0.1.
#  - pods: 10.88.N.0/24 on bridge hptbr0 inside the node, no masquerade, no default route (only
#    10.88.0.0/16, 10.0.0.0/24 and 10.99.0.0/16). ip_forward is enabled only inside the node
#    namespaces, never on the host; the host's default route is never touched.
#  - the host gets routes 10.88.N.0/24 via node N and 10.0.0.0/24 (ClusterIPs) via node 0, so tests
#    and kubectl reach pods and Services. Two nodes talk over a direct veth between their namespaces.
# One cluster per machine (fixed names and addresses).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S="$root/target/cluster"
R="$S/run"
KC="$S/kubeconfig"
APIIP=10.99.0.1 AP=16443 EP=12379
API="https://$APIIP:$AP"
NS_PREFIX=haptic-node
export PATH="$PATH:/usr/sbin:/sbin" LC_NUMERIC=C

log() { echo "cluster: [$(date +%T)] $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }
nodes() { seq 0 $(($(cat "$R/nodes" 2>/dev/null || echo 2) - 1)); }
# Whether a daemon we started (pidfile) still runs, and is ours (its command line names $S).
alive() {
  local p
  [ -f "$R/$1.pid" ] && p=$(cat "$R/$1.pid") && kill -0 "$p" 2>/dev/null && tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF "$S/"
}
# curl with a non-curl user agent: the apiserver pretty-prints JSON for curl.
api() { curl -sS -A haptic-cluster --max-time 10 --cacert "$R/pki/ca.crt" -H "Authorization: Bearer $(cat "$R/pki/token")" "$@"; }
wait_for() { # TRIES CMD... (every 0.2 s)
  local n=$1 i; shift
  for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
start() { # NAME CMD...: a daemon in its own session, pid recorded
  local name=$1; shift
  setsid "$@" >"$R/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$R/$name.pid"
}

# ------------------------------------------------------------------ what `up` needs (cached)
ensure_packages() {
  local p missing=()
  for p in containerd runc containernetworking-plugins iptables gcc libc6-dev openssl curl buildah; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # containerd is started by us, inside the node namespaces; a packaged service would share paths.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active -q containerd 2>/dev/null; then
    log "note: the system's containerd service runs too; ours use their own sockets and state under $S"
  fi
  if [ ! -x /usr/lib/cni/bridge ] || [ ! -x /usr/lib/cni/host-local ]; then die "CNI plugins missing in /usr/lib/cni"; fi
}

binaries() { # sets BIN (kube-*) and ETCD
  local paths
  paths=$("$root/scripts/install-k8s.sh" --cluster)
  BIN=$(dirname "$(sed -n 1p <<<"$paths")")
  ETCD=$(sed -n 2p <<<"$paths")
}

buildah_() { buildah --storage-driver vfs "$@"; }

# The pause image (scripts/pause.c, static: sleeps, reaps, exits on SIGTERM) and the tests' web image
# (busybox httpd), as OCI archives under $S/images.
base_images() {
  local d="$S/images" c
  [ -f "$d/pause.tar" ] && [ -f "$d/web.tar" ] && return
  mkdir -p "$d"
  gcc -Os -static -o "$d/pause" "$root/scripts/pause.c" && strip "$d/pause"
  rm -rf "$d/web" && mkdir -p "$d/web/bin" "$d/web/www" "$d/web/tmp"
  # busybox-static's binary, from its .deb (installing the package could replace a dynamic busybox).
  if ! compgen -G "$d/busybox-static_*.deb" >/dev/null; then
    (cd "$d" && { apt-get download busybox-static >/dev/null 2>&1 || { apt-get update -qq && apt-get download busybox-static >/dev/null; }; })
  fi
  rm -rf "$d/bbdeb" && dpkg-deb -x "$d"/busybox-static_*.deb "$d/bbdeb"
  cp "$d/bbdeb/bin/busybox" "$d/web/bin/busybox"
  for a in sh httpd hostname cat echo sleep wget; do ln -sf busybox "$d/web/bin/$a"; done
  c=$(buildah_ from scratch)
  buildah_ copy "$c" "$d/pause" /pause >/dev/null
  buildah_ config --entrypoint '["/pause"]' "$c"
  buildah_ commit -q "$c" localhost/pause:haptic >/dev/null
  buildah_ rm "$c" >/dev/null
  c=$(buildah_ from scratch)
  buildah_ copy "$c" "$d/web/" / >/dev/null
  buildah_ config --env PATH=/bin --cmd '["/bin/sh"]' "$c"
  buildah_ commit -q "$c" localhost/haptic-e2e-web:1 >/dev/null
  buildah_ rm "$c" >/dev/null
  rm -f "$d"/*.tmp
  buildah_ push -q localhost/pause:haptic "oci-archive:$d/pause.tar.tmp:localhost/pause:haptic"
  buildah_ push -q localhost/haptic-e2e-web:1 "oci-archive:$d/web.tar.tmp:localhost/haptic-e2e-web:1"
  mv "$d/pause.tar.tmp" "$d/pause.tar"
  mv "$d/web.tar.tmp" "$d/web.tar"
}

# ------------------------------------------------------------------ cluster phases
make_pki() {
  local P="$R/pki"
  mkdir -p "$P"
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=haptic-cluster-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out a.csr -subj /CN=kube-apiserver 2>/dev/null
    # SAN 10.0.0.1 (the `kubernetes` Service): pods use in-cluster config with the CA the
    # controller-manager publishes (kube-root-ca.crt).
    printf 'subjectAltName=IP:10.0.0.1,IP:%s,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' "$APIIP" >a.ext
    openssl x509 -req -in a.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile a.ext 2>/dev/null
    # The apiserver's client certificate to the kubelets (logs, exec, port-forward).
    openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out c.csr \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    openssl x509 -req -in c.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet-client.crt -days 30 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >token
    echo "$(cat token),admin,admin,system:masters" >tokens.csv
  )
  cat >"$KC" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: haptic
  cluster: {server: "$API", certificate-authority: $P/ca.crt}
users:
- name: admin
  user: {token: $(cat "$P/token")}
contexts:
- name: haptic
  context: {cluster: haptic, user: admin, namespace: haptic}
current-context: haptic
EOF
}

make_network() {
  local n H NIP NS
  for n in $(nodes); do
    H=10.99.0.$((4 * n + 1)) NIP=10.99.0.$((4 * n + 2)) NS=$NS_PREFIX$n
    ip netns add "$NS"
    ip link add "hpt${n}h" type veth peer name "hpt${n}n"
    ip link set "hpt${n}n" netns "$NS"
    ip addr add "$H/30" dev "hpt${n}h"
    ip link set "hpt${n}h" up
    ip -n "$NS" link set lo up
    ip -n "$NS" addr add "$NIP/30" dev "hpt${n}n"
    ip -n "$NS" link set "hpt${n}n" up
    # The apiserver's address sits on hpt0h: the host delivers it locally (no forwarding).
    [ "$n" -gt 0 ] && ip -n "$NS" route add "$APIIP/32" via "$H"
    ip route add "10.88.$n.0/24" via "$NIP"
    nsenter --net="/run/netns/$NS" sysctl -qw net.ipv4.ip_forward=1
    nsenter --net="/run/netns/$NS" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null ||
      log "warning: no br_netfilter: a pod reaching its own Service may fail"
  done
  ip route add 10.0.0.0/24 via 10.99.0.2
  if [ "$(cat "$R/nodes")" -gt 1 ]; then
    ip link add hptl0 netns "${NS_PREFIX}0" type veth peer name hptl1 netns "${NS_PREFIX}1"
    ip -n "${NS_PREFIX}0" addr add 10.99.1.1/30 dev hptl0
    ip -n "${NS_PREFIX}0" link set hptl0 up
    ip -n "${NS_PREFIX}0" route add 10.88.1.0/24 via 10.99.1.2
    ip -n "${NS_PREFIX}1" addr add 10.99.1.2/30 dev hptl1
    ip -n "${NS_PREFIX}1" link set hptl1 up
    ip -n "${NS_PREFIX}1" route add 10.88.0.0/24 via 10.99.1.1
  fi
}

start_control_plane() {
  mkdir -p "$R/etcd"
  start etcd "$ETCD" --data-dir "$R/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
    --listen-peer-urls "http://127.0.0.1:$((EP + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((EP + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((EP + 1))" --listen-metrics-urls "http://127.0.0.1:$((EP + 2))"
  start apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$EP" \
    --secure-port "$AP" --bind-address "$APIIP" --advertise-address "$APIIP" \
    --tls-cert-file "$R/pki/apiserver.crt" --tls-private-key-file "$R/pki/apiserver.key" \
    --cert-dir "$R/pki/apiserver-selfsigned" --authorization-mode Node,RBAC \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$R/pki/sa.key" --service-account-signing-key-file "$R/pki/sa.key" \
    --client-ca-file "$R/pki/ca.crt" --token-auth-file "$R/pki/tokens.csv" \
    --kubelet-client-certificate "$R/pki/kubelet-client.crt" --kubelet-client-key "$R/pki/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP
}

start_containerds() {
  local n N c
  for n in $(nodes); do
    N="$R/node$n"
    mkdir -p "$N/cni/net.d" "$N/kubelet" "$N/podlogs"
    # Per-node cgroup roots: two kubelets sharing one garbage-collect each other's pod cgroups.
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
      mkdir -p "/sys/fs/cgroup/$NS_PREFIX$n" && echo "/sys/fs/cgroup/$NS_PREFIX$n" >>"$R/cgroups"
    else
      for c in /sys/fs/cgroup/*/; do
        [ -L "${c%/}" ] && continue
        mkdir -p "$c$NS_PREFIX$n" && echo "$c$NS_PREFIX$n" >>"$R/cgroups"
      done
    fi
    cat >"$N/containerd.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$N/containerd.sock"
[ttrpc]
  address = "$N/containerd.sock.ttrpc"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/pause:haptic"
    # Without CAP_SYS_RESOURCE (containers, CI machines) runc fails lowering oom_score_adj.
    restrict_oom_score_adj = true
    # Pod network namespaces under our state dir, so that down finds them by path.
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          # Per node: the default runc state dir would be shared by both containerds.
          Root = "$N/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$N/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "$N/containerd/opt"
EOF
    cat >"$N/cni/net.d/10-haptic.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "haptic", "plugins": [{"type": "bridge", "bridge": "hptbr0",
  "isGateway": true, "isDefaultGateway": false, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "dataDir": "$N/cni/ipam",
           "ranges": [[{"subnet": "10.88.$n.0/24", "gateway": "10.88.$n.1"}]],
           "routes": [{"dst": "10.88.0.0/16"}, {"dst": "10.0.0.0/24"}, {"dst": "10.99.0.0/16"}]}}]}
EOF
    start "containerd$n" nsenter --net="/run/netns/$NS_PREFIX$n" containerd --config "$N/containerd.toml"
  done
}

import_images() { # ARCHIVE... into every node's containerd
  local n a
  for n in $(nodes); do
    wait_for 150 test -S "$R/node$n/containerd.sock" || die "containerd$n did not start (see $R/logs/containerd$n.log)"
    for a in "$@"; do
      ctr -a "$R/node$n/containerd.sock" -n k8s.io images import "$a" >/dev/null
    done
  done
}

start_node_agents() {
  wait_for 300 api -f "$API/readyz" || die "the apiserver is not ready (see $R/logs/apiserver.log)"
  local kc=(--kubeconfig "$KC" --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC")
  start scheduler "$BIN/kube-scheduler" "${kc[@]}" --leader-elect=false --secure-port 30259 --bind-address 127.0.0.1
  # A node that stops reporting is NotReady after 20 s (default 50 s), its pods then leave Services.
  start controller-manager "$BIN/kube-controller-manager" "${kc[@]}" --leader-elect=false \
    --secure-port 30257 --bind-address 127.0.0.1 --node-monitor-grace-period 20s \
    --service-account-private-key-file "$R/pki/sa.key" --root-ca-file "$R/pki/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file "$R/pki/ca.crt" --cluster-signing-key-file "$R/pki/ca.key" --controllers '*,-nodeipam'
  local n N NIP
  for n in $(nodes); do
    N="$R/node$n" NIP=10.99.0.$((4 * n + 2))
    # The node IP must not be loopback; per-node pod-log dirs (kubelets GC each other's).
    cat >"$N/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$NS_PREFIX$n
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$N/containerd.sock
address: $NIP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
podLogsDir: $N/podlogs
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $R/pki/ca.crt}}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [10.0.0.10]
resolvConf: /etc/resolv.conf
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
EOF
    start "kubelet$n" nsenter --net="/run/netns/$NS_PREFIX$n" "$BIN/kubelet" --config "$N/kubelet.yaml" \
      --kubeconfig "$KC" --hostname-override "$NS_PREFIX$n" --node-ip "$NIP" \
      --root-dir "$N/kubelet" --cert-dir "$N/kubelet/pki" --v=1
    # NodePorts only on the node IP; conntrack 0: leave the machine-wide conntrack sysctls alone.
    start "kube-proxy$n" nsenter --net="/run/netns/$NS_PREFIX$n" "$BIN/kube-proxy" --kubeconfig "$KC" \
      --proxy-mode iptables --cluster-cidr 10.88.0.0/16 --hostname-override "$NS_PREFIX$n" \
      --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 --nodeport-addresses primary \
      --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
  done
}

node_ready() { api -f "$API/api/v1/nodes/$1" | grep -q '"type":"Ready","status":"True"'; }
wait_cluster() {
  local n
  for n in $(nodes); do
    wait_for 400 node_ready "$NS_PREFIX$n" || die "$NS_PREFIX$n is not Ready (see $R/logs/kubelet$n.log)"
  done
  wait_for 200 api -f "$API/api/v1/namespaces/default/serviceaccounts/default" || die "no default ServiceAccount"
  wait_for 200 api -f "$API/api/v1/namespaces/default/configmaps/kube-root-ca.crt" || die "no kube-root-ca.crt"
}

is_up() {
  local n p
  [ -f "$R/nodes" ] || return 1
  for p in etcd apiserver scheduler controller-manager; do alive "$p" || return 1; done
  for n in $(nodes); do alive "containerd$n" && alive "kubelet$n" && alive "kube-proxy$n" || return 1; done
  api -f "$API/readyz" >/dev/null 2>&1
}
# The processes inside any of our network namespaces.
netns_pids() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v p="$NS_PREFIX" 'index($1, p) == 1 {print $1}'); do
    ip netns pids "$ns" 2>/dev/null
  done
}
anything_left() {
  compgen -G "$R/*.pid" >/dev/null || grep -qF " $S/" /proc/mounts || ip netns list | grep -q "^$NS_PREFIX" ||
    ip -br link | grep -q '^hpt'
}

up_failed() {
  trap - EXIT INT TERM
  if [ "$1" != 0 ]; then
    log "up failed (logs kept in $S/last-failed-logs); cleaning up"
    cp -r "$R/logs" "$S/last-failed-logs" 2>/dev/null || true
    cmd_down >&2 || true
  fi
  exit "$1"
}

cmd_up() {
  local nodes=${1:-2}
  [[ $nodes =~ ^[12]$ ]] || die "NODES must be 1 or 2, not '$nodes'"
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, mounts, cgroups)"
  if is_up; then
    die "a cluster is already running ($(cat "$R/nodes") node(s), KUBECONFIG=$KC): use it, or run '$0 down' first"
  fi
  if [ ! -f "$R/nodes" ] && ip netns list | grep -q "^$NS_PREFIX"; then
    # A namespace outlives the processes of a cluster whose session ended without a down; a
    # cluster that still runs has its containerd, kubelet and kube-proxy inside them.
    if [ -n "$(netns_pids)" ]; then
      die "network namespaces $NS_PREFIX* exist with processes in them but $S has no cluster: another checkout's cluster? (one per machine; run its scripts/cluster.sh down)"
    fi
    log "network namespaces $NS_PREFIX* of an earlier cluster are left with no process in them: reclaiming them"
  fi
  if anything_left; then
    log "the state of an earlier cluster is left: tearing it down first"
    cmd_down >&2 || die "could not clean up the earlier cluster"
  fi
  local t0=$SECONDS rf0
  rf0=$(cat /proc/sys/net/ipv4/ip_forward)
  # An interrupted or failed up leaves nothing behind.
  trap 'up_failed $?' EXIT
  trap 'exit 130' INT TERM
  log "packages";                ensure_packages
  log "kubernetes binaries";     binaries
  log "pause and web images";    base_images
  rm -rf "$R" "$S/last-failed-logs"
  mkdir -p "$R/logs"
  echo "$nodes" >"$R/nodes"
  # `ip netns add` makes /run/netns a mount; dirs kubelet and containerd insist on.
  awk '$2=="/run/netns"' /proc/mounts | grep -q . && touch "$R/pre-run-netns-mount"
  for d in /run/containerd /var/lib/cni /var/lib/kubelet /var/log/containers /var/log/pods; do
    [ -e "$d" ] || echo "$d" >>"$R/created-dirs"
  done
  log "pki";                     make_pki
  log "network namespaces";      make_network
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$rf0" ] || die "BUG: the host's ip_forward changed"
  log "etcd, apiserver, containerd"
  start_control_plane
  start_containerds
  log "images into the nodes";   import_images "$S/images/pause.tar" "$S/images/web.tar"
  log "scheduler, controller-manager, kubelets, kube-proxies"
  start_node_agents
  log "waiting for the nodes";   wait_cluster
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$rf0" ] || die "BUG: the host's ip_forward changed"
  trap - EXIT INT TERM
  log "up: $nodes node(s) in $((SECONDS - t0)) s; kubectl: KUBECONFIG=$KC $BIN/kubectl get nodes"
  echo "KUBECONFIG=$KC"
}

# ------------------------------------------------------------------ load and install
tag=${HAPTIC_IMAGE_TAG:-dev}
cmd_load() {
  is_up || die "no cluster is running (scripts/cluster.sh up)"
  local profile=${HAPTIC_IMAGES_PROFILE:-release} d="$S/images" which
  HAPTIC_IMAGE_TAG=$tag "$root/scripts/images.sh" --prebuilt "$profile"
  for which in agent controller; do
    rm -f "$d/haptic-$which.tar.tmp"
    buildah_ push -q "localhost/haptic-$which:$tag" "oci-archive:$d/haptic-$which.tar.tmp:localhost/haptic-$which:$tag"
    mv "$d/haptic-$which.tar.tmp" "$d/haptic-$which.tar"
  done
  import_images "$d/haptic-agent.tar" "$d/haptic-controller.tar"
  values >/dev/null
  log "loaded localhost/haptic-agent:$tag and localhost/haptic-controller:$tag into $(nodes | wc -l) node(s); chart values for them: $S/values.yaml"
}

# The chart values for the loaded images (`install` and the e2e suite's real-cluster backend use them).
values() {
  cat >"$S/values.yaml" <<EOF
# Written by scripts/cluster.sh install: the images loaded by 'load', never pulled.
images:
  agent: {repository: localhost/haptic-agent, tag: "$tag", pullPolicy: Never}
  controller: {repository: localhost/haptic-controller, tag: "$tag", pullPolicy: Never}
config:
  name: edge
haproxy:
  # One HAProxy pod per node where possible.
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels: {app.kubernetes.io/name: haptic, app.kubernetes.io/component: haproxy}
EOF
  echo "$S/values.yaml"
}

cmd_install() {
  is_up || die "no cluster is running (scripts/cluster.sh up)"
  [ -f "$S/values.yaml" ] || die "no images loaded yet (scripts/cluster.sh load)"
  local helm release=haptic d
  if [ "${1:-}" = --release ]; then release=${2:?--release wants a name}; shift 2; fi
  helm=$("$root/scripts/install-helm.sh")
  KUBECONFIG=$KC "$helm" upgrade --install "$release" "$root/charts/haptic" --namespace "$release" --create-namespace \
    --values "$S/values.yaml" --wait --timeout 5m "$@" >&2
  for d in $(KUBECONFIG=$KC "$BIN/kubectl" -n "$release" get deployments -o name); do
    KUBECONFIG=$KC "$BIN/kubectl" -n "$release" rollout status "$d" --timeout 120s >&2
  done
  log "installed: KUBECONFIG=$KC $BIN/kubectl -n $release get hapc,pods -o wide"
}

# The Gateway API CRDs of a channel (standard by default), of the version the conformance suite
# pins (conformance/tools/go.mod), so the cluster serves what haptic is tested against.
cmd_gateway_crds() {
  is_up || die "no cluster is running (scripts/cluster.sh up)"
  local channel=${1:-standard} crds f files=()
  [[ $channel =~ ^(standard|experimental)$ ]] || die "gateway-crds takes standard or experimental, not '$channel'"
  command -v go >/dev/null || die "go is not installed (it fetches the pinned Gateway API module)"
  crds=$(cd "$root/conformance/tools" && export GOTOOLCHAIN=local GOFLAGS=-mod=readonly &&
    go mod download sigs.k8s.io/gateway-api && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/$channel
  [ -d "$crds" ] || die "no Gateway API CRDs at $crds"
  if [ "$channel" = experimental ]; then
    # The admission policy refuses experimental CRDs over standard ones (it is applied again
    # once they are in).
    KUBECONFIG=$KC "$BIN/kubectl" delete --ignore-not-found validatingadmissionpolicybinding,validatingadmissionpolicy \
      safe-upgrades.gateway.networking.k8s.io >/dev/null
  else
    # The experimental channel's own kinds go: the conformance suite refuses a cluster whose
    # Gateway API CRDs are of two channels.
    local x
    x=$(KUBECONFIG=$KC "$BIN/kubectl" get crd -o name | grep '\.gateway\.networking\.x-k8s\.io$' || true)
    # shellcheck disable=SC2086 # one name a word
    [ -z "$x" ] || KUBECONFIG=$KC "$BIN/kubectl" delete --wait $x >/dev/null
  fi
  # Each CRD's own file (the directory also holds a ValidatingAdmissionPolicy, which has no
  # Established condition, and the experimental one a kustomization).
  for f in "$crds"/*.yaml; do [[ $f == *_vap_* || $f == */kustomization.yaml ]] || files+=(-f "$f"); done
  # The API server may still hold a deleted admission policy for a moment: tried for 30 s.
  local i
  for ((i = 0; ; i++)); do
    KUBECONFIG=$KC "$BIN/kubectl" apply --server-side --force-conflicts "${files[@]}" >/dev/null 2>"$R/crds.err" && break
    ((i < 30)) || { cat "$R/crds.err" >&2; die "the $channel CRDs were refused"; }
    sleep 1
  done
  # The channel's admission policy once its CRDs are in (it refuses experimental CRDs over
  # standard ones, whichever channel it comes with).
  KUBECONFIG=$KC "$BIN/kubectl" apply --server-side --force-conflicts -f "$crds"/*_vap_*.yaml >/dev/null
  KUBECONFIG=$KC "$BIN/kubectl" wait --for condition=Established --timeout 60s "${files[@]}" >/dev/null
  log "Gateway API $channel CRDs applied from $crds"
}

# ------------------------------------------------------------------ down
stop() { # NAME: by the recorded pid; SIGTERM, SIGKILL after 10 s
  alive "$1" || { rm -f "$R/$1.pid"; return 0; }
  local p i
  p=$(cat "$R/$1.pid")
  kill "$p" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$p" 2>/dev/null; then kill -9 "$p"; log "$1: SIGKILL"; fi
  rm -f "$R/$1.pid"
}
# Our daemons and the containerd shims they spawned: a cluster binary whose arguments name $S.
our_pids() {
  ps -eo pid=,comm=,args= | S="$S/" awk '$2 ~ /^(etcd|kube-|kubelet|containerd|nsenter|setsid)/ && index($0, ENVIRON["S"]) {print $1}'
}
delete_workloads() { # through the API while the kubelets run: CNI DEL and unmounts happen
  local ns r i
  for ns in $(api "$API/api/v1/namespaces" | grep -o '"metadata":{"name":"[^"]*"' | cut -d'"' -f6); do
    for r in deployments statefulsets daemonsets replicasets; do
      api -X DELETE "$API/apis/apps/v1/namespaces/$ns/$r?propagationPolicy=Background" >/dev/null 2>&1 || true
    done
  done
  # Grace 1 s first (the kubelets unmount and CNI DEL); after 15 s force (a stopped node's pods
  # never finish terminating; down cleans up after its containers itself).
  local grace
  for ((i = 0; i < 60; i++)); do
    api "$API/api/v1/pods" 2>/dev/null | grep -q '"items":\[\]' && return 0
    grace=1; [ "$i" -ge 15 ] && grace=0
    for ns in $(api "$API/api/v1/pods" | grep -o '"namespace":"[^"]*"' | cut -d'"' -f4 | sort -u); do
      api -X DELETE "$API/api/v1/namespaces/$ns/pods?gracePeriodSeconds=$grace" >/dev/null 2>&1 || true
    done
    sleep 1
  done
  log "warning: pods still present after 60 s; forcing"
}

cmd_down() {
  local n c t ids=() x m p left=0 cgroups=() created=() mounts=()
  # Our cgroup dirs: the recorded ones and any by our name (an interrupted up may not have
  # recorded its last one).
  [ -f "$R/cgroups" ] && mapfile -t cgroups <"$R/cgroups"
  mapfile -t -O "${#cgroups[@]}" cgroups < <(find /sys/fs/cgroup -maxdepth 2 -name "$NS_PREFIX*" 2>/dev/null)
  [ -f "$R/created-dirs" ] && mapfile -t created <"$R/created-dirs"
  if [ -d "$R" ]; then
    if alive apiserver && [ -f "$R/pki/token" ]; then
      for n in $(nodes); do
        if alive "kubelet$n"; then log "deleting the workloads through the API"; delete_workloads; break; fi
      done
    fi
    # Waits on these stops only: in a failed `up` this shell's children include the daemons.
    local stops=()
    for n in $(nodes); do
      stop "kube-proxy$n" & stops+=($!)
      stop "kubelet$n" & stops+=($!)
    done
    stop controller-manager & stops+=($!)
    stop scheduler & stops+=($!)
    wait "${stops[@]}"
    for n in $(nodes); do # containers left: kill the tasks, remove the containers
      alive "containerd$n" || continue
      c=(ctr -a "$R/node$n/containerd.sock" -n k8s.io)
      for t in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks kill -s SIGKILL "$t" 2>/dev/null || true; done
      sleep 0.5
      for t in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks rm -f "$t" >/dev/null 2>&1 || true; done
      for t in $("${c[@]}" containers ls -q 2>/dev/null); do ids+=("$t"); "${c[@]}" containers rm "$t" >/dev/null 2>&1 || true; done
    done
    stops=()
    for n in $(nodes); do stop "containerd$n" & stops+=($!); done
    wait "${stops[@]}"
    # Every sandbox and container any of our containerds knew, also a stopped node's: their CNI
    # result cache entries are removed below.
    for x in "$R"/node*/containerd/root/io.containerd.grpc.v1.cri/{sandboxes,containers}/* \
      "$R"/node*/containerd/state/io.containerd.runtime.v2.task/k8s.io/*; do
      [ -e "$x" ] && ids+=("$(basename "$x")")
    done
    # Container processes left in our cgroups (a stopped node's, a killed shim's).
    for x in "${cgroups[@]}"; do
      [ -d "$x" ] || continue
      for p in $(find "$x" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u); do kill -9 "$p" 2>/dev/null || true; done
    done
    for p in $(our_pids); do kill -9 "$p" 2>/dev/null || true; done
    stop apiserver
    stop etcd
    for _ in 1 2 3; do # deepest first: overlay rootfs, shm, projected tmpfs, pod netns, kubelet root
      mapfile -t mounts < <(awk '{print $2}' /proc/mounts | grep "^$S/" | sort -r)
      for m in "${mounts[@]}"; do
        grep -q " $m " /proc/mounts && { umount "$m" 2>/dev/null || umount -l "$m"; }
      done
    done
  fi
  ip route del 10.0.0.0/24 via 10.99.0.2 2>/dev/null || true
  for n in 0 1; do
    ip route del "10.88.$n.0/24" via "10.99.0.$((4 * n + 2))" 2>/dev/null || true
    ip netns del "$NS_PREFIX$n" 2>/dev/null || true
    ip link del "hpt${n}h" 2>/dev/null || true
  done
  if [ -d "$R" ] && [ ! -f "$R/pre-run-netns-mount" ] && awk '$2=="/run/netns"' /proc/mounts | grep -q . &&
    [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns
    rmdir /run/netns 2>/dev/null || true
  fi
  for x in "${cgroups[@]}"; do
    if [ -d "$x" ]; then find "$x" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
  done
  for x in /var/log/containers/*.log; do [ -L "$x" ] && readlink "$x" | grep -q "^$S/" && rm -f "$x"; done
  rm -f /var/lib/cni/results/haptic-*
  for t in "${ids[@]}"; do rm -f /var/lib/cni/results/*-"$t"-*; done
  pgrep -x kubelet >/dev/null || rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  # /run/containerd, when we made it and no containerd runs any more: the sockets of shims that
  # outlived their containerd (a stopped node) stay there.
  if printf '%s\n' "${created[@]}" | grep -qx /run/containerd && ! pgrep -x containerd >/dev/null; then
    rm -rf /run/containerd
  fi
  # A directory we created goes with what is left in it of ours: sockets a stopped process left
  # (kubelet's device-plugins/kubelet.sock when it did not exit cleanly), then empty directories.
  for x in "${created[@]}"; do
    if [ -d "$x" ]; then
      find "$x" -type s -delete 2>/dev/null || true
      find "$x" -depth -type d -empty -delete 2>/dev/null || true
    fi
  done
  # Check: nothing of ours is left.
  chk() {
    printf '  %-10s %s\n' "$1" "$2" >&2
    [ "$2" = 0 ] || left=1
  }
  log "down: what is left (0 = clean)"
  chk processes "$(our_pids | wc -l)"
  chk mounts "$(awk '{print $2}' /proc/mounts | grep -c "^$S/")"
  chk netns "$(ip netns list 2>/dev/null | grep -c "^$NS_PREFIX")"
  chk links "$(ip -br link | grep -c '^hpt')"
  chk routes "$(ip route | grep -cE '^10\.88\.|^10\.0\.0\.0/24 via 10\.99\.|^10\.99\.')"
  chk cgroups "$(find /sys/fs/cgroup -maxdepth 2 -name "$NS_PREFIX*" 2>/dev/null | wc -l)"
  chk logs "$(for x in /var/log/containers/*.log; do [ -L "$x" ] && readlink "$x" | grep "^$S/"; done | wc -l)"
  chk cni-cache "$(find /var/lib/cni/results -name 'haptic-*' 2>/dev/null | wc -l)"
  chk new-dirs "$(for x in "${created[@]}"; do [ -e "$x" ] && echo "$x"; done | wc -l)"
  if [ $left = 0 ]; then
    rm -rf "$R"
    log "down: clean"
  else
    log "down: LEFTOVERS (above); run '$0 down' again or inspect $R"
    return 1
  fi
}

cmd_status() {
  is_up || { echo "no cluster is running (state: $S)"; return 1; }
  local k=("$BIN/kubectl" --kubeconfig "$KC")
  "${k[@]}" get nodes -o wide
  echo
  "${k[@]}" get pods -A -o wide
  if "${k[@]}" get crd haproxyconfigs.haptic.dev >/dev/null 2>&1; then echo; "${k[@]}" get hapc -A; fi
}

cmd_stop_node() {
  local n=${1:-}
  if ! [[ $n =~ ^[01]$ ]] || [ "$n" -ge "$(cat "$R/nodes" 2>/dev/null || echo 0)" ]; then
    die "stop-node wants a node number of this cluster"
  fi
  # As a crash: SIGKILL. The shims keep the containers running; the node stops reporting.
  for p in "kubelet$n" "containerd$n"; do
    if alive "$p"; then kill -9 "$(cat "$R/$p.pid")"; fi
  done
  log "stopped the kubelet and containerd of $NS_PREFIX$n (down cleans up its containers)"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) binaries; cmd_status ;;
  load) cmd_load ;;
  install) shift; binaries; cmd_install "$@" ;;
  gateway-crds) shift; binaries; cmd_gateway_crds "$@" ;;
  stop-node) shift; cmd_stop_node "$@" ;;
  ctr) shift; n=${1:?ctr wants a node number}; shift; exec ctr -a "$R/node$n/containerd.sock" -n k8s.io "$@" ;;
  -h | --help) sed -n '2,25p' "$0" ;;
  *) echo "usage: $0 up [1|2] | load | install [--release NAME] [HELM ARGS] | gateway-crds [standard|experimental] | status | down | stop-node N | ctr N ARGS..." >&2; exit 2 ;;
esac
