#!/usr/bin/env bash
# Installs the two HAProxy builds haptic is tested against, idempotently:
#   - Debian's haproxy (2.6 on bookworm) via apt-get, if missing;
#   - HAProxy 3.0 from Debian trixie into a private prefix under target/haproxy/3.0,
#     with its own loader and libraries (it needs glibc ≥ 2.38, newer than bookworm's). System sources
#     and libc are untouched.
# Prints the two binary paths, one per line. A second run does nothing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix="${HAPTIC_HAPROXY_PREFIX:-$root/target/haproxy/3.0}"
bin30="$prefix/haproxy"
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi

log() { echo "install-haproxy: $*" >&2; }

# 1. Debian's HAProxy 2.6 (and the tools tests use).
need=()
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v patchelf >/dev/null 2>&1 || need+=(patchelf)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2
fi
bin26=$(command -v haproxy)
# Debian's package starts a system haproxy service; tests never use it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet haproxy 2>/dev/null; then
  $sudo systemctl stop haproxy >&2 || true
fi

# 2. HAProxy 3.0 from trixie into a private prefix.
# (No `| grep -q` / `| head` on a binary's output: with pipefail, an early-closing reader can
# kill the writer with SIGPIPE and fail the check at random.)
is30() { local v; v=$("$1" -v 2>/dev/null) || return 1; [[ $v == "HAProxy version 3.0."* ]]; }
if ! { [ -x "$bin30" ] && is30 "$bin30"; }; then
  log "installing HAProxy 3.0 from Debian trixie into $prefix"
  work="$prefix.work"
  rm -rf "$work" "$prefix"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/sources" "$work/debs" "$prefix/root"
  cat >"$work/sources/trixie.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt_opts=(-o "Dir::Etc::SourceParts=$work/sources" -o Dir::Etc::SourceList=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq >&2
  pkgs=(haproxy libc6 libcrypt1 libjemalloc2 liblua5.4-0 libopentracing-c-wrapper0t64
    libopentracing1 libpcre2-8-0 libssl3t64 libstdc++6 libgcc-s1 zlib1g libzstd1)
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download "${pkgs[@]/%//trixie}" >&2)
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$prefix/root"; done
  libdir="$prefix/root/usr/lib/x86_64-linux-gnu"
  cp "$prefix/root/usr/sbin/haproxy" "$bin30.tmp"
  patchelf --set-interpreter "$libdir/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$libdir" "$bin30.tmp"
  mv "$bin30.tmp" "$bin30"
  rm -rf "$work"
  is30 "$bin30" || { log "the 3.0 binary does not run: $("$bin30" -v 2>&1 | sed -n 1p)"; exit 1; }
fi

echo "$bin26"
echo "$bin30"
