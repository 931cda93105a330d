#!/usr/bin/env bash
# Builds the two haptic images here, without Docker, from Dockerfile.agent and Dockerfile.controller
# exactly as written (buildah bud, with a debootstrap base passed in through the ARGs), then smoke-runs them and runs a pod from them.
#
#   scripts/images.sh              # build + smoke + pod
#   scripts/images.sh --no-pod     # build + smoke only
#   scripts/images.sh --bases      # only the two base images (step 1)
#   scripts/images.sh --smoke      # reuse the built images: smoke + pod only
#   scripts/images.sh --clean      # remove the images, the base images and working containers
#   scripts/images.sh --prebuilt [debug|release]
#                                  # the same images from binaries built on this host (default
#                                  # release; `cargo build` first if missing): each Dockerfile's
#                                  # `runtime` stage (`--target runtime`, cached), plus the binary
#                                  # and the final stage's USER/ENTRYPOINT/CMD/STOPSIGNAL read from the file.
#                                  # Seconds instead of two in-container release builds; what
#                                  # scripts/cluster.sh load uses. No smoke runs (the
#                                  # cluster that loads them runs every container).
#
# 1. Base images, made locally when missing (no registry is needed):
#    - localhost/haptic-base:trixie-slim: `debootstrap --variant=minbase trixie` once, cached in
#      target/images/rootfs-trixie (BASE_IMAGE);
#    - localhost/haptic-rust:<rustc version>-trixie: that rootfs + gcc, libc6-dev, ca-certificates
#      + this machine's Rust toolchain (copied, dereferenced, to /usr/local/rustup), standing in for
#      the official `rust` image (RUST_IMAGE).
# 2. `buildah bud` of both Dockerfiles with those two images passed through the ARGs, tagged
#    localhost/haptic-agent:dev and localhost/haptic-controller:dev.
# 3. Smoke: versions, `haproxy -vv` (3.4), uid 65532, `haptic-agent init` into a bind mount,
#    `haptic-controller validate` on a sample render (and a refused one). Prints image sizes.
# 4. A pod: init, then the HAProxy container and the agent container from the agent image sharing
#    bind-mounted /etc/haproxy and /run/haptic, host network on free loopback ports; the controller
#    image in standalone mode applies one render; the script waits for traffic through HAProxy.
#
# Needs root (buildah chroot isolation, debootstrap) and 8 GiB free disk (vfs copies layers;
# 3 GiB with --prebuilt).
# Everything it starts is stopped on exit.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
work="$root/target/images"
tag="${HAPTIC_IMAGE_TAG:-dev}"
agent_img="localhost/haptic-agent:$tag"
ctl_img="localhost/haptic-controller:$tag"
base_img="localhost/haptic-base:trixie-slim"
mirror="${HAPTIC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
B=(buildah --storage-driver vfs)
# The images take HAProxy 3.4 from Debian experimental and its libraries from sid. Where this
# machine's apt skips the Release files' freshness check (a snapshot mirror, whose sid and
# experimental Release files expire while trixie's never do), the image builds skip it too.
# (Read whole first: `apt-config dump | grep -q` under pipefail fails when grep's early exit
# kills apt-config with SIGPIPE.)
apt_options=""
apt_config=$(apt-config dump 2>/dev/null || true)
if grep -q '^Acquire::Check-Valid-Until "false"' <<<"$apt_config"; then
  apt_options="-o Acquire::Check-Valid-Until=false -o Acquire::Check-Date=false"
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; B=(sudo "${B[@]}"); fi
start=$(date +%s)

log() { echo "images: [$(($(date +%s) - start))s] $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

mode=all
case "${1:-}" in
  "") ;;
  --no-pod) mode=nopod ;;
  --bases) mode=bases ;;
  --smoke) mode=smoke ;;
  --clean) mode=clean ;;
  --prebuilt)
    mode=prebuilt profile=${2:-release}
    [[ $profile =~ ^(debug|release)$ ]] || die "--prebuilt takes debug or release, not '$profile'"
    ;;
  *) die "unknown argument $1 (use --no-pod, --bases, --smoke, --prebuilt or --clean)" ;;
esac

# Containers and processes this run made; removed/stopped on exit.
containers=()
pgids=()
cleanup() {
  local rc=$?
  for g in "${pgids[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  sleep 0.5
  for g in "${pgids[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  for c in "${containers[@]}"; do "${B[@]}" rm "$c" >/dev/null 2>&1 || true; done
  exit "$rc"
}
trap cleanup EXIT
# `from IMAGE` sets $ctr to a new working container and remembers it for cleanup (no command
# substitution: an array append in a subshell would be lost).
from() { ctr=$("${B[@]}" from "$1"); containers+=("$ctr"); }
have_image() { "${B[@]}" inspect --type image "$1" >/dev/null 2>&1; }

if [ "$mode" = clean ]; then
  for i in "$agent_img" "$ctl_img" "localhost/haptic-rust:*" "$base_img"; do
    for id in $("${B[@]}" images --noheading --format '{{.Name}}:{{.Tag}}' | grep -F "${i%\*}" || true); do
      "${B[@]}" rmi -f "$id" >/dev/null || true
    done
  done
  "${B[@]}" rm --all >/dev/null || true
  log "removed the images (the debootstrap rootfs in $work stays; rm -rf it to start over)"
  exit 0
fi

# 0. Tools and disk.
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v curl >/dev/null 2>&1 || need+=(curl)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
mkdir -p "$work"
avail_kb=$(df -Pk "$work" | awk 'NR==2 {print $4}')
storage=$( "${B[@]}" info --format '{{.store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)
log "buildah $("${B[@]}" --version | awk '{print $3}'), storage $storage, $((avail_kb / 1024 / 1024)) GiB free"
# vfs keeps a full copy of every layer. Building the Rust stage inside (the default) needs about
# 8 GiB; --prebuilt images only the Dockerfiles' runtime stages plus one binary each: 1.4 GiB
# measured with debug binaries, so 3 GiB leaves room for the cluster's copies of them.
need_gib=8
[ "$mode" = prebuilt ] && need_gib=3
[ "$avail_kb" -gt $((need_gib * 1024 * 1024)) ] || die "less than $need_gib GiB free under $work (vfs storage copies every layer)"

# 1a. The Debian trixie base image.
rootfs="$work/rootfs-trixie"
if ! have_image "$base_img"; then
  if [ ! -f "$rootfs/.complete" ]; then
    log "debootstrap --variant=minbase trixie (once; about 90 s)"
    $sudo rm -rf "$rootfs"
    $sudo debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
      trixie "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || die "debootstrap (see $work/debootstrap.log)"
    # Slim it like debian:trixie-slim: no apt lists, caches, docs or man pages.
    $sudo rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
      "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    echo "deb $mirror trixie main" | $sudo tee "$rootfs/etc/apt/sources.list" >/dev/null
    $sudo touch "$rootfs/.complete"
  fi
  log "committing $base_img from $rootfs"
  from scratch; c=$ctr
  m=$("${B[@]}" mount "$c")
  $sudo cp -a "$rootfs/." "$m/"
  $sudo rm -f "$m/.complete"
  "${B[@]}" unmount "$c" >/dev/null
  "${B[@]}" config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  "${B[@]}" commit --quiet "$c" "$base_img" >/dev/null
fi

# Prebuilt: the Dockerfiles' runtime stages + host binaries (see the header).
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$mode" = prebuilt ]; then
  bindir="${CARGO_TARGET_DIR:-$root/target}/$profile"
  if [ ! -x "$bindir/haptic-agent" ] || [ ! -x "$bindir/haptic-controller" ]; then
    flag=(); [ "$profile" = release ] && flag=(--release)
    log "cargo build ${flag[*]} (haptic-agent, haptic-controller)"
    cargo build --locked "${flag[@]}" -p haptic-agent --bin haptic-agent -p haptic-controller --bin haptic-controller >&2
  fi
  base_id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$base_img")
  for which in agent controller; do
    file="Dockerfile.$which"
    runtime_img="localhost/haptic-$which-runtime:trixie"
    # The runtime stage is rebuilt only when the Dockerfile or the base image changed.
    key=$( { cat "$file"; echo "$base_id"; } | sha256sum | cut -c1-16)
    if [ "$("${B[@]}" inspect --type image --format '{{index .ImageAnnotations "dev.haptic.key"}}' "$runtime_img" 2>/dev/null)" != "$key" ]; then
      log "buildah bud --target runtime -f $file -t $runtime_img"
      "${B[@]}" bud --isolation chroot --network host --layers=false --target runtime \
        --build-arg "BASE_IMAGE=$base_img" --build-arg "REVISION=$revision" --build-arg "APT_OPTIONS=$apt_options" \
        --annotation "dev.haptic.key=$key" -f "$file" -t "$runtime_img" . >"$work/build-$which-runtime.log" 2>&1 ||
        { tail -30 "$work/build-$which-runtime.log" >&2; die "building $runtime_img (see $work/build-$which-runtime.log)"; }
    fi
    # The final stage's settings, from the Dockerfile (JSON forms).
    final=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$file")
    user=$(sed -n 's/^USER //p' <<<"$final")
    entrypoint=$(sed -n 's/^ENTRYPOINT //p' <<<"$final")
    cmd=$(sed -n 's/^CMD //p' <<<"$final")
    stopsignal=$(sed -n 's/^STOPSIGNAL //p' <<<"$final")
    dest=$(sed -n 's#^COPY --from=build /out/[^ ]* \(.*\)$#\1#p' <<<"$final")
    if [ -z "$user" ] || [ -z "$entrypoint" ] || [ -z "$dest" ]; then die "cannot read USER/ENTRYPOINT/COPY of the final stage of $file"; fi
    img="localhost/haptic-$which:$tag"
    from "$runtime_img"; c=$ctr
    stripped="$work/haptic-$which.$profile"
    cp "$bindir/haptic-$which" "$stripped.tmp" && strip --strip-debug "$stripped.tmp" && mv "$stripped.tmp" "$stripped"
    "${B[@]}" copy --chmod 0755 "$c" "$stripped" "$dest" >/dev/null
    "${B[@]}" config --user "$user" --entrypoint "$entrypoint" ${cmd:+--cmd "$cmd"} ${stopsignal:+--stop-signal "$stopsignal"} \
      --label "org.opencontainers.image.revision=$revision" "$c"
    old_id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$img" 2>/dev/null || true)
    "${B[@]}" commit --quiet "$c" "$img" >/dev/null
    new_id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$img")
    if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then "${B[@]}" rmi "$old_id" >/dev/null 2>&1 || true; fi
    log "built $img from $runtime_img + $bindir/haptic-$which"
  done
fi

# 1b. The Rust build base: the same rootfs + a C toolchain + this machine's Rust toolchain.
if [ "$mode" != prebuilt ]; then
  sysroot=$(rustc --print sysroot)
  toolchain=$(basename "$sysroot")
  rust_version=$(rustc --version | awk '{print $2}')
  rust_img="localhost/haptic-rust:$rust_version-trixie"
  if ! have_image "$rust_img"; then
    log "making $rust_img ($toolchain from $sysroot)"
    from "$base_img"; c=$ctr
    "${B[@]}" run --isolation chroot --network host "$c" -- sh -c \
      'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*' \
      || die "apt-get in $rust_img"
    m=$("${B[@]}" mount "$c")
    dest="$m/usr/local/rustup/toolchains/$toolchain"
    $sudo mkdir -p "$dest" "$m/usr/local/cargo/bin"
    # Dereferenced copy (the toolchain dir may be a symlink); no docs or sources.
    tar -C "$sysroot" -chf - --exclude=./share/doc --exclude=./lib/rustlib/src --exclude=./lib/rustlib/rustc-src \
      --exclude='./lib/rustlib/*/analysis' . | $sudo tar -C "$dest" -xf -
    # This machine's CA bundle, so cargo inside RUN reaches crates.io through whatever TLS proxy the
    # machine trusts (an official rust image elsewhere needs nothing). Only the build base gets it.
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
      $sudo cp /etc/ssl/certs/ca-certificates.crt "$m/etc/ssl/certs/ca-certificates.crt"
    fi
    "${B[@]}" unmount "$c" >/dev/null
    # The toolchain's own bin/ first on PATH: the rustup proxies would try to sync the channel online.
    "${B[@]}" config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
      --env "PATH=/usr/local/rustup/toolchains/$toolchain/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --env RUST_VERSION="$rust_version" "$c"
    "${B[@]}" commit --quiet "$c" "$rust_img" >/dev/null
    "${B[@]}" rm "$c" >/dev/null
  fi

fi

if [ "$mode" = bases ]; then
  log "base images ready: $base_img, $rust_img"
  exit 0
fi

# 2. The images, from the Dockerfiles as written.
for which in agent controller; do
  [ "$mode" = prebuilt ] && break
  img="localhost/haptic-$which:$tag"
  if [ "$mode" = smoke ] && have_image "$img"; then log "reusing $img"; continue; fi
  log "buildah bud -f Dockerfile.$which -t $img (RUST_IMAGE=$rust_img BASE_IMAGE=$base_img)"
  t0=$(date +%s)
  old_id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$img" 2>/dev/null || true)
  # HTTPS from inside RUN (crates.io) uses the build base's CA bundle (the machine's, copied in
  # above). No `-v /etc/ssl/certs` bind: it would apply to every RUN, and the final stage's
  # `apt-get install ca-certificates` must write there.
  "${B[@]}" bud --isolation chroot --network host --layers=false \
    --build-arg "RUST_IMAGE=$rust_img" --build-arg "BASE_IMAGE=$base_img" \
    --build-arg "REVISION=$revision" --build-arg "APT_OPTIONS=$apt_options" \
    -f "Dockerfile.$which" -t "$img" . >"$work/build-$which.log" 2>&1 ||
    { tail -30 "$work/build-$which.log" >&2; die "building $img (see $work/build-$which.log)"; }
  log "built $img in $(($(date +%s) - t0))s"
  # The previous build of this tag, now untagged (vfs keeps full copies): removed.
  new_id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$img")
  if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then "${B[@]}" rmi "$old_id" >/dev/null 2>&1 || true; fi
done

if [ "$mode" = prebuilt ]; then
  # Each smoke run costs a vfs copy of the image (~12 s); the cluster that loads these images
  # runs every container of them anyway.
  log "done (prebuilt, no smoke): $(($(date +%s) - start))s"
  exit 0
fi

# 3. Smoke runs.
# Splits "[buildah run options...] -- CMD..." into the arrays opts and cmd.
split_args() {
  opts=(); cmd=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  cmd=("$@")
}
run_in() { # IMAGE [buildah run options...] -- CMD...   (often inside $(...): removes its container)
  local img=$1; shift
  local opts cmd rc=0 ctr; from "$img"
  split_args "$@"
  "${B[@]}" run --isolation chroot --network host "${opts[@]}" "$ctr" -- "${cmd[@]}" 2>&1 || rc=$?
  "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true
  return "$rc"
}
expect() { # WHAT PATTERN OUTPUT
  if [[ $3 =~ $2 ]]; then log "ok: $1"; else echo "$3" >&2; die "$1: want /$2/"; fi
}
out=$(run_in "$agent_img" -- haptic-agent --version) || die "agent --version"; expect "agent: $out" '^haptic-agent [0-9]' "$out"
out=$(run_in "$agent_img" -- haproxy -vv) || die "haproxy -vv"; expect "agent image: $(head -1 <<<"$out")" 'HAProxy version 3\.4\.' "$out"
out=$(run_in "$agent_img" -- id -u) || die "id -u"; expect "agent image runs as uid $out" '^65532' "$out"
out=$(run_in "$ctl_img" -- haptic-controller --version) || die "controller --version"; expect "controller: $out" '^haptic-controller [0-9]' "$out"
out=$(run_in "$ctl_img" -- haproxy -v) || die "haproxy -v"; expect "controller image: $(head -1 <<<"$out")" 'HAProxy version 3\.4\.' "$out"
out=$(run_in "$ctl_img" -- id -u) || die "id -u"; expect "controller image runs as uid $out" '^65532' "$out"

smoke="$work/smoke"
$sudo rm -rf "$smoke"
mkdir -p "$smoke/init" "$smoke/render" "$smoke/bad"
chown 65532:65532 "$smoke/init" 2>/dev/null || $sudo chown 65532:65532 "$smoke/init"
run_in "$agent_img" -v "$smoke/init:/etc/haproxy" -- haptic-agent init --root /etc/haproxy --health-bind :8404 >/dev/null
[ -f "$smoke/init/current/haproxy.cfg" ] || die "haptic-agent init wrote no $smoke/init/current/haproxy.cfg"
owner=$(stat -c %u "$smoke/init/current/haproxy.cfg")
[ "$owner" = 65532 ] || die "init's files belong to uid $owner, not 65532"
log "ok: haptic-agent init wrote the bootstrap tree into a bind mount as uid 65532"

sample_cfg() { # TRAFFIC_PORT HEALTH_PORT
  cat <<CFG
global
    default-path config

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend health
    bind 127.0.0.1:$2
    http-request return status 200 content-type text/plain string "ok" if { path /healthz }
    http-request return status 200 content-type text/plain string "ready" if { path /ready }

frontend http
    bind 127.0.0.1:$1
    http-request return status 200 content-type text/plain file hello.txt
CFG
}
sample_cfg 18080 18404 >"$smoke/render/haproxy.cfg"
echo "hello from the haptic images" >"$smoke/render/hello.txt"
printf 'global\n    default-path config\nfrontend x\n    bind :1\n    no-such-keyword\n' >"$smoke/bad/haproxy.cfg"
chmod -R a+rX "$smoke/render" "$smoke/bad"
out=$(run_in "$ctl_img" -v "$smoke/render:/render:ro" -- haptic-controller validate /render) ||
  { echo "$out" >&2; die "controller validate refused the sample render"; }
log "ok: controller validate accepts the sample render"
if run_in "$ctl_img" -v "$smoke/bad:/render:ro" -- haptic-controller validate /render >"$smoke/bad.out" 2>&1; then
  die "controller validate passed a broken render"
fi
log "ok: controller validate refuses a broken render: $(grep -m1 -o 'ALERT.*' "$smoke/bad.out" || head -1 "$smoke/bad.out")"

log "image sizes:"
"${B[@]}" images --format '{{.Name}}:{{.Tag}}  {{.Size}}' | grep -E "haptic-(agent|controller|base|rust)" >&2 || true

if [ "$mode" = nopod ]; then
  log "done (no pod): $(($(date +%s) - start))s"
  exit 0
fi

# 4. A pod from the images: host network, loopback ports, shared bind mounts.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port=$(free_port); health_port=$(free_port); agent_port=$(free_port); admin_port=$(free_port)
pod="$work/pod"
$sudo rm -rf "$pod"
mkdir -p "$pod/etc-haproxy" "$pod/run-haptic" "$pod/creds" "$pod/render" "$pod/ctl-state"
echo "haptic:$(head -c 18 /dev/urandom | base64 | tr -d '/+=')" >"$pod/creds/credentials"
chown -R 65532:65532 "$pod"
chmod 0400 "$pod/creds/credentials"
sample_cfg "$http_port" "$health_port" >"$pod/render/haproxy.cfg.tmp"
echo "hello from the haptic pod" >"$pod/render/hello.txt"
mv "$pod/render/haproxy.cfg.tmp" "$pod/render/haproxy.cfg"
chown -R 65532:65532 "$pod/render"
mounts=(-v "$pod/etc-haproxy:/etc/haproxy" -v "$pod/run-haptic:/run/haptic")

log "pod: init (health on 127.0.0.1:$health_port)"
run_in "$agent_img" "${mounts[@]}" -- haptic-agent init --root /etc/haproxy --health-bind "127.0.0.1:$health_port" >/dev/null
background() { # NAME IMAGE [options] -- CMD...
  local name=$1 img=$2; shift 2
  local opts cmd; from "$img"
  split_args "$@"
  setsid "${B[@]}" run --isolation chroot --network host "${opts[@]}" "$ctr" -- "${cmd[@]}" >"$pod/$name.log" 2>&1 &
  pgids+=("$!")
}
log "pod: HAProxy container"
background haproxy "$agent_img" "${mounts[@]}" -- \
  haproxy -W -db -S /run/haptic/master.sock,level,admin -f /etc/haproxy/current/haproxy.cfg
log "pod: agent container (127.0.0.1:$agent_port)"
background agent "$agent_img" "${mounts[@]}" -v "$pod/creds:/etc/haptic/credentials:ro" -- \
  haptic-agent run --listen "127.0.0.1:$agent_port" --root /etc/haproxy --master-socket /run/haptic/master.sock \
  --haproxy-bin /usr/sbin/haproxy --credentials-file /etc/haptic/credentials/credentials --min-reload-interval 500ms
wait_for() { # WHAT URL PATTERN SECONDS
  local deadline=$(($(date +%s) + $4)) body
  while true; do
    body=$(curl -s --max-time 2 "$2" 2>/dev/null || true)
    if [[ $body =~ $3 ]]; then log "ok: $1"; return 0; fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      for f in "$pod"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
      die "$1: $2 never answered /$3/ (last: $body)"
    fi
    sleep 0.3
  done
}
wait_for "HAProxy runs the bootstrap config (/healthz 200)" "http://127.0.0.1:$health_port/healthz" '^ok' 30
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$health_port/ready" || true)
[ "$code" = 503 ] || die "bootstrap /ready answered $code, not 503"
log "ok: bootstrap /ready is 503 (not Ready before the first apply)"
wait_for "agent /readyz (the master CLI answers through the shared socket)" "http://127.0.0.1:$agent_port/readyz" '.' 30
log "pod: controller (standalone) applies one render"
background controller "$ctl_img" -v "$pod/render:/render" -v "$pod/creds:/etc/haptic/credentials:ro" \
  -v "$pod/ctl-state:/state" -- \
  haptic-controller run --standalone --config-dir /render --state-dir /state --agent "http://127.0.0.1:$agent_port" \
  --credentials-file /etc/haptic/credentials/credentials --admin-listen "127.0.0.1:$admin_port" \
  --haproxy-bin /usr/sbin/haproxy
t0=$(date +%s)
wait_for "the apply landed: traffic flows through HAProxy on 127.0.0.1:$http_port" \
  "http://127.0.0.1:$http_port/" 'hello from the haptic pod' 60
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$health_port/ready" || true)
[ "$code" = 200 ] || die "/ready answered $code after the apply, not 200"
log "ok: /ready is 200 after the apply ($(($(date +%s) - t0))s from controller start)"
owner=$(stat -c %u "$pod/etc-haproxy/current/haproxy.cfg")
[ "$owner" = 65532 ] || die "the applied tree belongs to uid $owner"
log "done: $(($(date +%s) - start))s"
