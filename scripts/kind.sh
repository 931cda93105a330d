#!/usr/bin/env bash
# A kind cluster running haptic, for a first look: one node, both haptic images built from this
# checkout's binaries and loaded, charts/haptic installed twice (release `haptic` with
# ingress.enabled in namespace haptic, release `haptic-gateway` with gateway.enabled in namespace
# haptic-gateway: one HAProxyConfig serves either Ingresses or a GatewayClass), the Gateway API
# CRDs, and an example app (busybox httpd, the e2e suite's web image) behind an Ingress and an
# HTTPRoute. Prints the curl lines that reach them from this machine.
#
#   scripts/kind.sh up [--name NAME]      # default name: haptic
#   scripts/kind.sh down [--name NAME]    # deletes the cluster; stops the dockerd it started
#   scripts/kind.sh cluster NAME WORKERS  # only a cluster (control plane + WORKERS workers), for
#                                         # scripts/e2e-kind.sh; prints its kubeconfig path
#   scripts/kind.sh images                # builds localhost/haptic-{agent,controller}:kind and
#                                         # localhost/haptic-e2e-web:1 into Docker
#   scripts/kind.sh node-image            # only the node image (pulled or built); prints its name
#   scripts/kind.sh env                   # prints `export DOCKER_HOST=...; export PATH=...` (kind)
#
# Needs root where Docker is missing (scripts/install-docker.sh runs a private dockerd) and Go
# (kind v0.33.0, helm, and the Kubernetes binaries build from the Go module proxy).
#
# The node image: kind's default (kindest/node) where Docker can pull it. Where it cannot (no
# registry reachable), one is built here, once, as localhost/kind-node:v<k8s>-haptic.<rev>:
#   - a base image from kind's own images/base files (entrypoint, systemd units, containerd
#     config; read from the kind module in the Go module cache at build time) over a debootstrap
#     trixie rootfs (as scripts/images.sh makes it) with Debian's systemd, containerd, runc and
#     CNI plugins, plus crictl built from the Go module proxy;
#   - kubeadm, kubelet, kubectl and the control-plane images from scripts/install-k8s.sh --kind,
#     etcd from Debian (scripts/install-k8s.sh), pause as a static C program, every image tagged
#     as kubeadm names it and preloaded into the node's containerd, so nothing is pulled;
#   - no kindnetd image: such clusters set networking.disableDefaultCNI and this script writes
#     each node's CNI config (ptp + host-local on the node's podCIDR, as kindnet does) and the
#     routes between nodes itself.
# Caches: target/kind (kind, crictl, the build contexts), target/docker (the private daemon's
# images), target/k8s, target/images/rootfs-trixie.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
kind_version=v0.33.0
crictl_version=v1.34.0
node_rev=1
work="$root/target/kind"
start=$(date +%s)

log() { echo "kind.sh: [$(($(date +%s) - start))s] $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

export GOTOOLCHAIN=local CGO_ENABLED=0
# helm's API discovery cache: here, not in ~/.kube.
export KUBECACHEDIR="$work/kube-cache"
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then PATH="/usr/local/go/bin:$PATH"; fi

# ------------------------------------------------------------------ tools
docker_up() {
  DOCKER_HOST=$("$root/scripts/install-docker.sh" start)
  export DOCKER_HOST
}

kind_bin() { # sets KIND
  KIND="$work/$kind_version/kind"
  if [ ! -x "$KIND" ] || [[ $("$KIND" version 2>/dev/null) != "kind $kind_version "* ]]; then
    command -v go >/dev/null || die "go is required to build kind $kind_version"
    log "building kind $kind_version from the Go module proxy"
    mkdir -p "$work/$kind_version"
    GOBIN="$work/$kind_version" go install -trimpath "sigs.k8s.io/kind@$kind_version" >&2
  fi
}

crictl_bin() {
  local bin="$work/crictl-$crictl_version/crictl"
  if [ ! -x "$bin" ]; then
    log "building crictl $crictl_version from the Go module proxy"
    mkdir -p "$work/crictl-$crictl_version"
    GOBIN="$work/crictl-$crictl_version" go install -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version" >&2
  fi
  echo "$bin"
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# ------------------------------------------------------------------ local images
# localhost/haptic-base:trixie-slim: debian:trixie-slim where it can be pulled, else the
# debootstrap rootfs scripts/images.sh makes, imported.
base_img=localhost/haptic-base:trixie-slim
base_image() {
  have_image "$base_img" && return 0
  # Where a registry answers, the official image the Dockerfiles name by default.
  if timeout 120 docker pull -q docker.io/library/debian:trixie-slim >/dev/null 2>&1; then
    docker tag docker.io/library/debian:trixie-slim "$base_img"
    return 0
  fi
  local rootfs="$root/target/images/rootfs-trixie" mirror="${HAPTIC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  if [ ! -f "$rootfs/.complete" ]; then
    command -v debootstrap >/dev/null || { apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    log "debootstrap --variant=minbase trixie (once; about 90 s)"
    rm -rf "$rootfs"
    mkdir -p "$(dirname "$rootfs")"
    debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
      trixie "$rootfs" "$mirror" >"$root/target/images/debootstrap.log" 2>&1 ||
      die "debootstrap (see target/images/debootstrap.log)"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
      "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    echo "deb $mirror trixie main" >"$rootfs/etc/apt/sources.list"
    touch "$rootfs/.complete"
  fi
  log "docker import $base_img"
  tar -C "$rootfs" --exclude=./.complete -c . |
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "$base_img" >/dev/null
}

# `docker build` with the classic builder on the host network (apt inside RUN): no BuildKit
# frontend image to pull, no bridge needed.
build() {
  mkdir -p "$work"
  DOCKER_BUILDKIT=0 docker build --force-rm --network host "$@" >"$work/docker-build.log" 2>&1 ||
    { tail -30 "$work/docker-build.log" >&2; return 1; }
}

# Debian's apt options the images need behind a snapshot mirror (as scripts/images.sh).
apt_options() {
  local c
  c=$(apt-config dump 2>/dev/null || true)
  if grep -q '^Acquire::Check-Valid-Until "false"' <<<"$c"; then echo "-o Acquire::Check-Valid-Until=false -o Acquire::Check-Date=false"; fi
}

# The haptic images from host binaries: each Dockerfile's `runtime` stage as written, then the
# final stage's COPY/USER/STOPSIGNAL/ENTRYPOINT/CMD with the host's binary (as
# scripts/images.sh --prebuilt does with buildah). HAPTIC_BIN_DIR: where the binaries are
# (default target/debug, built with cargo when missing).
haptic_images() {
  base_image
  local bindir="${HAPTIC_BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/debug}" which ctx file old key
  if [ ! -x "$bindir/haptic-agent" ] || [ ! -x "$bindir/haptic-controller" ]; then
    log "cargo build (haptic-agent, haptic-controller) into $bindir"
    cargo build --locked -p haptic-agent --bin haptic-agent -p haptic-controller --bin haptic-controller >&2
  fi
  for which in agent controller; do
    file="$root/Dockerfile.$which"
    ctx="$work/images/$which"
    # Rebuilt only when the binary or the Dockerfile changed.
    key=$(cat "$bindir/haptic-$which" "$file" | sha256sum | cut -c1-16)
    if [ "$(docker image inspect -f '{{index .Config.Labels "dev.haptic.key"}}' "localhost/haptic-$which:kind" 2>/dev/null)" = "$key" ]; then
      continue
    fi
    rm -rf "$ctx" && mkdir -p "$ctx"
    cp "$bindir/haptic-$which" "$ctx/haptic-$which"
    strip --strip-debug "$ctx/haptic-$which" 2>/dev/null || true
    {
      echo "ARG BASE_IMAGE"
      # The runtime stage, verbatim.
      awk '/^FROM .* AS runtime/{on=1} on && /^FROM / && !/AS runtime/{exit} on' "$file"
      # The final stage, the build stage's binary replaced by the host's.
      awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$file" |
        sed "s#^COPY --from=build /out/haptic-$which #COPY haptic-$which #"
    } >"$ctx/Dockerfile"
    log "docker build localhost/haptic-$which:kind (runtime stage of Dockerfile.$which + $bindir/haptic-$which)"
    old=$(docker image inspect -f '{{.Id}}' "localhost/haptic-$which:kind" 2>/dev/null || true)
    # shellcheck disable=SC2046
    build --build-arg "BASE_IMAGE=$base_img" --build-arg "REVISION=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
      --build-arg "APT_OPTIONS=$(apt_options)" --label "dev.haptic.key=$key" -t "localhost/haptic-$which:kind" "$ctx" ||
      die "docker build of localhost/haptic-$which:kind (context $ctx)"
    # The previous build of the tag, now untagged.
    if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "localhost/haptic-$which:kind")" ]; then
      docker rmi "$old" >/dev/null 2>&1 || true
    fi
  done
  web_image
}

# The e2e suite's web image (scripts/cluster.sh makes the same): busybox-static's httpd.
web_image() {
  have_image localhost/haptic-e2e-web:1 && return 0
  local d="$work/images/web"
  rm -rf "$d" && mkdir -p "$d/root/bin" "$d/root/www" "$d/root/tmp"
  if ! compgen -G "$work/images/busybox-static_*.deb" >/dev/null; then
    (cd "$work/images" && { apt-get download busybox-static >/dev/null 2>&1 || { apt-get update -qq && apt-get download busybox-static >/dev/null; }; })
  fi
  dpkg-deb -x "$work"/images/busybox-static_*.deb "$d/deb"
  cp "$d/deb/bin/busybox" "$d/root/bin/busybox"
  local a
  for a in sh httpd hostname cat echo sleep wget; do ln -sf busybox "$d/root/bin/$a"; done
  tar -C "$d/root" -c . | docker import --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - localhost/haptic-e2e-web:1 >/dev/null
  log "built localhost/haptic-e2e-web:1 (busybox httpd)"
}

# kind's base image, from the kind module's images/base files over the trixie rootfs.
kind_base_image() { # IMAGE
  have_image "$1" && return 0
  base_image
  local mod ctx
  mod=$(go env GOMODCACHE)/sigs.k8s.io/kind@$kind_version
  [ -d "$mod/images/base/files" ] || (cd "$work" && go mod download "sigs.k8s.io/kind@$kind_version")
  [ -d "$mod/images/base/files" ] || die "no images/base/files in $mod"
  ctx="$work/node/base"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp -r "$mod/images/base/files" "$ctx/files"
  chmod -R u+w "$ctx/files"
  cp "$(crictl_bin)" "$ctx/crictl"
  cat >"$ctx/Dockerfile" <<EOF
FROM $base_img
# kind's base image, with Debian's systemd, containerd, runc and CNI plugins instead of the
# binaries kind's Dockerfile downloads (the same packages and steps otherwise).
RUN apt-get $(apt_options) update \\
 && DEBIAN_FRONTEND=noninteractive apt-get $(apt_options) install -y --no-install-recommends \\
      systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod \\
      libseccomp2 pigz bash ca-certificates curl jq procps \\
      containerd runc containernetworking-plugins \\
 && apt-get clean -y \\
 && rm -rf /var/lib/apt/lists/* /var/log/* /usr/share/doc/* /usr/share/man/*
COPY files/ /
COPY crictl /usr/local/bin/crictl
RUN chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/* \\
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \\
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \\
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \\
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \\
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \\
 && ln -sf /usr/lib/systemd/systemd /sbin/init \\
 && ln -sf /usr/bin/containerd /usr/local/bin/containerd \\
 && mkdir -p /opt/cni/bin && ln -sf /usr/lib/cni/* /opt/cni/bin/ \\
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \\
 && systemctl mask systemd-binfmt.service \\
 && rm -f /etc/systemd/system/containerd-fuse-overlayfs.service \\
 && mkdir -p /etc/kubernetes/manifests \\
 && ctr oci spec \\
    | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \\
    | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \\
 && sed -i '/^\\[proxy_plugins\\]/,/^  address/d' /etc/containerd/config.toml \\
 && containerd --version && runc --version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]
EOF
  log "docker build $1 (kind's images/base files, Debian packages)"
  build -t "$1" "$ctx" || die "docker build of $1 (context $ctx)"
}

# One image per control-plane binary (and etcd, pause), tagged as kubeadm names them.
component_images() { # K8S_BIN_DIR ETCD -> prints the tags
  local bin=$1 etcd=$2 runtime=localhost/kind-k8s-runtime:trixie ctx="$work/node/images" c tag
  mkdir -p "$ctx"
  if ! have_image "$runtime"; then
    base_image
    printf 'FROM %s\nRUN apt-get %s update && DEBIAN_FRONTEND=noninteractive apt-get %s install -y --no-install-recommends iptables conntrack ipset kmod ca-certificates && rm -rf /var/lib/apt/lists/*\n' \
      "$base_img" "$(apt_options)" "$(apt_options)" >"$ctx/Dockerfile.runtime"
    log "docker build $runtime (iptables, conntrack: kube-proxy's)"
    build -t "$runtime" -f "$ctx/Dockerfile.runtime" "$ctx" || die "docker build of $runtime"
  fi
  local images
  images=$("$bin/kubeadm" config images list --kubernetes-version "v$k8s_version" 2>/dev/null)
  for c in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
    tag=$(grep "/$c:" <<<"$images")
    if ! have_image "$tag"; then
      cp "$bin/$c" "$ctx/$c"
      printf 'FROM %s\nCOPY %s /usr/local/bin/%s\n' "$runtime" "$c" "$c" >"$ctx/Dockerfile.$c"
      build -t "$tag" -f "$ctx/Dockerfile.$c" "$ctx" || die "docker build of $tag"
      rm -f "$ctx/$c"
    fi
    echo "$tag"
  done
  # etcd: Debian's 3.5 (the ClusterConfiguration patch in cluster_config names this tag).
  tag="registry.k8s.io/etcd:$etcd_tag"
  if ! have_image "$tag"; then
    cp "$etcd" "$ctx/etcd"
    printf 'FROM %s\nCOPY etcd /usr/local/bin/etcd\n' "$runtime" >"$ctx/Dockerfile.etcd"
    build -t "$tag" -f "$ctx/Dockerfile.etcd" "$ctx" || die "docker build of $tag"
    rm -f "$ctx/etcd"
  fi
  echo "$tag"
  # pause: kubeadm's tag and the one kind's containerd config names.
  local pause_tags
  pause_tags=$( { grep '/pause:' <<<"$images"; echo registry.k8s.io/pause:3.10; } | sort -u)
  if ! have_image "$(head -1 <<<"$pause_tags")"; then
    mkdir -p "$ctx/pause"
    gcc -Os -static -o "$ctx/pause/pause" "$root/scripts/pause.c" && strip "$ctx/pause/pause"
    printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$ctx/pause/Dockerfile"
    build -t "$(head -1 <<<"$pause_tags")" "$ctx/pause" || die "docker build of the pause image"
  fi
  for tag in $pause_tags; do docker tag "$(head -1 <<<"$pause_tags")" "$tag"; echo "$tag"; done
}

# The node image built here (see the header).
etcd_tag=3.5-debian
local_node_image() { # IMAGE
  local img=$1 base="localhost/kind-base:trixie-haptic.$node_rev" paths bin etcd tags c
  have_image "$img" && [ "${HAPTIC_KIND_REBUILD:-0}" != 1 ] && return 0
  kind_base_image "$base"
  paths=$("$root/scripts/install-k8s.sh" --kind)
  bin=$(dirname "$(sed -n 1p <<<"$paths")")
  etcd=$(sed -n 2p <<<"$paths")
  mapfile -t tags < <(component_images "$bin" "$etcd")
  log "building $img: kubeadm, kubelet, kubectl v$k8s_version + preloaded ${tags[*]}"
  c=kind-node-build-$$
  docker rm -f "$c" >/dev/null 2>&1 || true
  docker run -d --name "$c" --privileged --network none --entrypoint sleep "$base" infinity >/dev/null
  local ok=0
  {
    for b in kubeadm kubelet kubectl; do docker cp "$bin/$b" "$c:/usr/bin/$b"; done
    docker exec "$c" sh -c "chown root:root /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl && echo v$k8s_version >/kind/version"
    # kind applies this at create time (its local-path provisioner image is not built here):
    # the StorageClass only.
    docker exec -i "$c" sh -c 'mkdir -p /kind/manifests && cat >/kind/manifests/default-storage.yaml' <<'EOF'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOF
    docker exec "$c" sh -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
    docker exec "$c" sh -c 'for i in $(seq 1 50); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 0.2; done; exit 1'
    docker save "${tags[@]}" | docker exec -i "$c" ctr --namespace=k8s.io images import \
      --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack -
    docker exec "$c" sh -c 'pkill containerd; sleep 1; rm -rf /tmp/* /var/log/*'
    docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$c" "$img" >/dev/null
    ok=1
  } || true
  docker rm -f "$c" >/dev/null
  [ "$ok" = 1 ] || die "building the node image $img"
  log "built $img"
}

k8s_version=$(sed -n 's#^[[:space:]]*k8s.io/kubernetes v\(1\.[0-9.]*\).*#\1#p' "$root/e2e/k8s-tools/go.mod" | head -1)

# Sets NODE_IMAGE and LOCAL_NODE (1: built here, with its CNI and etcd settings).
node_image() {
  LOCAL_NODE=0
  if [ -n "${HAPTIC_KIND_NODE_IMAGE:-}" ]; then NODE_IMAGE=$HAPTIC_KIND_NODE_IMAGE; return 0; fi
  local default
  default=$(sed -n 's/^const Image = "\(.*\)"$/\1/p' "$(go env GOMODCACHE)/sigs.k8s.io/kind@$kind_version/pkg/apis/config/defaults/image.go" 2>/dev/null || true)
  if [ "${HAPTIC_KIND_LOCAL_NODE:-0}" != 1 ] && [ -n "$default" ] &&
    { have_image "$default" || timeout 120 docker pull "$default" >/dev/null 2>&1; }; then
    NODE_IMAGE=$default
    return 0
  fi
  log "kind's node image ${default:-(unknown)} cannot be pulled here: building one"
  NODE_IMAGE="localhost/kind-node:v$k8s_version-haptic.$node_rev"
  LOCAL_NODE=1
  local_node_image "$NODE_IMAGE"
}

# ------------------------------------------------------------------ cluster
cap_missing() { # the capability bounding set lacks CAP_SYS_RESOURCE (bit 24)
  [ $(((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status) >> 24) & 1)) = 0 ]
}

cluster_config() { # WORKERS [extra lines for the control-plane node]
  local workers=$1 extra=${2:-} i
  echo "kind: Cluster"
  echo "apiVersion: kind.x-k8s.io/v1alpha4"
  if [ "$LOCAL_NODE" = 1 ]; then printf 'networking:\n  disableDefaultCNI: true\n'; fi
  echo "nodes:"
  echo "- role: control-plane"
  [ -z "$extra" ] || echo "$extra"
  for ((i = 0; i < workers; i++)); do echo "- role: worker"; done
  echo "kubeadmConfigPatches:"
  if [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    # cgroup v1 (kubelet 1.34 refuses it unless told otherwise).
    printf -- '- |\n  kind: KubeletConfiguration\n  failCgroupV1: false\n'
  fi
  if [ "$LOCAL_NODE" = 1 ]; then
    printf -- '- |\n  kind: ClusterConfiguration\n  etcd:\n    local:\n      imageTag: "%s"\n' "$etcd_tag"
  fi
  if cap_missing; then
    # No CAP_SYS_RESOURCE: the nodes' containerd must not raise oom_score_adj.
    printf 'containerdConfigPatches:\n- |\n  [plugins."io.containerd.grpc.v1.cri"]\n    restrict_oom_score_adj = true\n'
  fi
}

# ptp + host-local on each node's podCIDR and routes to the other nodes' (what kindnetd does).
cni() { # NAME
  local name=$1 nodes n cidr other ocidr oip
  mapfile -t nodes < <("$KIND" get nodes --name "$name")
  declare -A cidrs ips
  for n in "${nodes[@]}"; do
    cidr=""
    for _ in $(seq 1 60); do
      cidr=$(kubectl_ "$name" get node "$n" -o 'jsonpath={.spec.podCIDR}' 2>/dev/null || true)
      [ -n "$cidr" ] && break
      sleep 1
    done
    [ -n "$cidr" ] || die "node $n has no podCIDR"
    cidrs[$n]=$cidr
    ips[$n]=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$n")
  done
  for n in "${nodes[@]}"; do
    docker exec -i "$n" sh -c 'mkdir -p /etc/cni/net.d && cat >/etc/cni/net.d/10-kind.conflist.tmp && mv /etc/cni/net.d/10-kind.conflist.tmp /etc/cni/net.d/10-kind.conflist && sysctl -qw net.ipv4.ip_forward=1' <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kind",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state",
              "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "${cidrs[$n]}"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
    for other in "${nodes[@]}"; do
      [ "$other" = "$n" ] && continue
      ocidr=${cidrs[$other]} oip=${ips[$other]}
      docker exec "$n" ip route replace "$ocidr" via "$oip"
    done
  done
  log "CNI: ptp on $(for n in "${nodes[@]}"; do printf '%s=%s ' "$n" "${cidrs[$n]}"; done)"
}

kubectl_() { # NAME ARGS... (the control plane's own kubectl: none needed on the host)
  local name=$1; shift
  docker exec -i "$name-control-plane" kubectl --kubeconfig /etc/kubernetes/admin.conf "$@"
}

create_cluster() { # NAME WORKERS [extra control-plane lines]
  local name=$1 workers=$2 extra=${3:-}
  docker_up
  kind_bin
  node_image
  if "$KIND" get clusters 2>/dev/null | grep -qx "$name"; then
    log "cluster $name exists"
  else
    log "kind create cluster --name $name --image $NODE_IMAGE ($workers worker(s))"
    cluster_config "$workers" "$extra" >"$work/$name.kind.yaml"
    # Its own kubeconfig file: ~/.kube/config stays as it is.
    "$KIND" create cluster --name "$name" --image "$NODE_IMAGE" --config "$work/$name.kind.yaml" \
      --kubeconfig "$work/$name.kubeconfig" >&2 ||
      die "kind create cluster (config $work/$name.kind.yaml)"
  fi
  if [ "$LOCAL_NODE" = 1 ]; then cni "$name"; fi
  kubectl_ "$name" wait --for condition=Ready node --all --timeout 180s >&2
  mkdir -p "$work"
  "$KIND" get kubeconfig --name "$name" >"$work/$name.kubeconfig"
}

load_images() { # NAME IMAGE...
  local name=$1; shift
  "$KIND" load docker-image --name "$name" "$@" >&2
}

# ------------------------------------------------------------------ up / down
curl_ok() { # URL HOST
  local i code
  for i in $(seq 1 90); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 -H "Host: $2" "$1" || true)
    [ "$code" = 200 ] && return 0
    sleep 1
  done
  log "$1 (Host: $2) answered $code"
  return 1
}

up() { # NAME
  local name=$1 helm kc crds node_ip gw_port values
  create_cluster "$name" 0 "$(printf '  extraPortMappings:\n  - {containerPort: 30080, hostPort: %s, listenAddress: "127.0.0.1"}' "${HAPTIC_KIND_HTTP_PORT:-8080}")"
  kc="$work/$name.kubeconfig"
  haptic_images
  load_images "$name" localhost/haptic-agent:kind localhost/haptic-controller:kind localhost/haptic-e2e-web:1
  helm=$("$root/scripts/install-helm.sh")

  # The Gateway API CRDs the tests use: the standard channel of the conformance tools' module.
  crds=$(cd "$root/conformance/tools" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/standard
  [ -d "$crds" ] || die "no Gateway API CRDs at $crds"
  local f
  for f in "$crds"/*.yaml; do echo ---; cat "$f"; done | kubectl_ "$name" apply --server-side --force-conflicts -f - >/dev/null
  kubectl_ "$name" wait --for condition=Established --timeout 60s crd/gateways.gateway.networking.k8s.io \
    crd/httproutes.gateway.networking.k8s.io crd/gatewayclasses.gateway.networking.k8s.io >/dev/null
  log "Gateway API CRDs applied ($(basename "$(dirname "$(dirname "$(dirname "$crds")")")"))"

  values="$work/$name.values.yaml"
  cat >"$values" <<'EOF'
images:
  agent: {repository: localhost/haptic-agent, tag: kind, pullPolicy: Never}
  controller: {repository: localhost/haptic-controller, tag: kind, pullPolicy: Never}
haproxy:
  replicas: 1
EOF
  log "helm install haptic (ingress.enabled) and haptic-gateway (gateway.enabled)"
  KUBECONFIG=$kc "$helm" upgrade --install haptic "$root/charts/haptic" --namespace haptic --create-namespace \
    --values "$values" --set ingress.enabled=true --set haproxy.service.type=NodePort \
    --set haproxy.service.nodePorts.http=30080 --wait --timeout 5m >/dev/null
  KUBECONFIG=$kc "$helm" upgrade --install haptic-gateway "$root/charts/haptic" --namespace haptic-gateway --create-namespace \
    --values "$values" --set gateway.enabled=true --set gateway.service.type=NodePort --wait --timeout 5m >/dev/null

  log "the example app: Deployment + Service web, Ingress web, Gateway gw + HTTPRoute web (namespace default)"
  kubectl_ "$name" apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: web
          image: localhost/haptic-e2e-web:1   # busybox httpd; any HTTP server works
          imagePullPolicy: Never
          command: ["/bin/sh", "-c", "hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  ingressClassName: haptic
  rules:
    - host: web.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: haptic
  listeners:
    - {name: http, protocol: HTTP, port: 80}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{name: gw}]
  hostnames: [web.example.com]
  rules:
    - matches: [{path: {type: PathPrefix, value: /}}]
      backendRefs: [{name: web, port: 80}]
EOF
  kubectl_ "$name" rollout status deployment/web --timeout 120s >/dev/null
  # The Gateway's Service (the controller makes it in the fleet's namespace): its node port.
  local i
  gw_port=""
  for i in $(seq 1 60); do
    gw_port=$(kubectl_ "$name" -n haptic-gateway get svc -l gateway.networking.k8s.io/gateway-name=gw \
      -o 'jsonpath={.items[0].spec.ports[0].nodePort}' 2>/dev/null || true)
    [ -n "$gw_port" ] && break
    sleep 1
  done
  [ -n "$gw_port" ] || die "the Gateway gw has no Service with a node port in namespace haptic-gateway"
  node_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$name-control-plane")
  local ingress_url="http://127.0.0.1:${HAPTIC_KIND_HTTP_PORT:-8080}/" gateway_url="http://$node_ip:$gw_port/"
  curl_ok "$ingress_url" web.example.com || die "the Ingress does not answer 200 at $ingress_url"
  curl_ok "$gateway_url" web.example.com || die "the HTTPRoute does not answer 200 at $gateway_url"
  log "up: cluster $name, haptic serving the Ingress and the HTTPRoute"
  cat <<EOF

The Ingress web (IngressClass haptic, release haptic in namespace haptic):
  curl -H 'Host: web.example.com' $ingress_url
The HTTPRoute web on Gateway gw (GatewayClass haptic, release haptic-gateway):
  curl -H 'Host: web.example.com' $gateway_url
The cluster:
  export KUBECONFIG=$kc DOCKER_HOST=$DOCKER_HOST
  kubectl get pods -A        # or: docker exec $name-control-plane kubectl --kubeconfig /etc/kubernetes/admin.conf ...
Remove it all: scripts/kind.sh down${name:+ --name $name}
EOF
}

down() { # NAME
  local name=$1 host
  if host=$("$root/scripts/install-docker.sh" status 2>/dev/null); then
    export DOCKER_HOST=$host
    KIND="$work/$kind_version/kind"
    if [ -x "$KIND" ] && "$KIND" get clusters 2>/dev/null | grep -qx "$name"; then
      log "kind delete cluster --name $name"
      "$KIND" delete cluster --name "$name" --kubeconfig "$work/$name.kubeconfig" >&2
    fi
    # The "kind" network, once no cluster uses it.
    if docker network inspect kind >/dev/null 2>&1 && [ -z "$(docker ps -aq --filter network=kind)" ]; then
      docker network rm kind >/dev/null
    fi
  fi
  rm -f "$work/$name.kubeconfig"
  # The private dockerd (never the machine's own), when no other container runs on it.
  if [ "$host" = "unix://$root/target/docker/docker.sock" ] && [ -z "$(docker ps -aq)" ]; then
    "$root/scripts/install-docker.sh" stop
  fi
  log "down: cluster $name removed"
}

# ------------------------------------------------------------------ main
cmd=${1:-}
[ $# -gt 0 ] && shift
name=haptic
case "$cmd" in
  up | down)
    while [ $# -gt 0 ]; do
      case "$1" in
        --name) name=${2:?--name needs a value}; shift ;;
        *) die "unknown argument $1" ;;
      esac
      shift
    done
    "$cmd" "$name"
    ;;
  cluster)
    create_cluster "${1:?cluster NAME WORKERS}" "${2:?cluster NAME WORKERS}"
    echo "$work/$1.kubeconfig"
    ;;
  images) docker_up; haptic_images ;;
  node-image) docker_up; node_image; echo "$NODE_IMAGE" ;;
  env)
    docker_up
    kind_bin
    echo "export DOCKER_HOST=$DOCKER_HOST PATH=$(dirname "$KIND"):\$PATH"
    ;;
  -h | --help) sed -n '2,36p' "$0" ;;
  *) echo "usage: $0 up|down [--name NAME] | cluster NAME WORKERS | images | node-image | env (try --help)" >&2; exit 2 ;;
esac
