#!/usr/bin/env bash
# Installs the four HAProxy builds haptic is tested against, idempotently:
#   - Debian's haproxy (2.6 on bookworm) via apt-get, if missing;
#   - HAProxy 3.0 (Debian trixie), 3.2 (forky) and 3.4 (experimental) into private prefixes under
#     target/haproxy/<version>, each with its own loader and libraries (they need a glibc newer
#     than bookworm's). System sources and libc are untouched.
# Prints the four binary paths, one per line, oldest first. A second run does nothing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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

# 2. HAProxy 3.0, 3.2 and 3.4 from Debian into private prefixes: each build's own package with the
# libraries of the same suite, unpacked (`dpkg -x`) and its binary pointed at its own loader and
# library dir (`patchelf`; `--force-rpath`, so the libraries' own dependencies resolve there too).
# 3.0 from trixie, 3.2 from forky (testing), 3.4 from experimental with sid's libraries (3.4 needs
# libc6 >= 2.38, libpcre2-8-0 >= 10.47, libssl3t64 >= 3.5.1).
# (No `| grep -q` / `| head` on a binary's output: with pipefail, an early-closing reader can
# kill the writer with SIGPIPE and fail the check at random.)
is_version() { local v; v=$("$1" -v 2>/dev/null) || return 1; [[ $v == "HAProxy version $2."* ]]; }
# install_build VERSION PREFIX HAPROXY_SUITE LIBRARY_SUITE SUITES...: prints the binary's path.
install_build() {
  local version=$1 prefix=$2 hsuite=$3 lsuite=$4
  shift 4
  local bin="$prefix/haproxy"
  if [ -x "$bin" ] && is_version "$bin" "$version"; then echo "$bin"; return; fi
  log "installing HAProxy $version from Debian $hsuite into $prefix"
  local work="$prefix.work"
  rm -rf "$work" "$prefix"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/sources" "$work/debs" "$prefix/root"
  cat >"$work/sources/debian.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: $*
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  local apt_opts=(-o "Dir::Etc::SourceParts=$work/sources" -o Dir::Etc::SourceList=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq >&2
  local libs=(libc6 libcrypt1 libjemalloc2 liblua5.4-0 libpcre2-8-0 libssl3t64 libstdc++6 libgcc-s1
    zlib1g libzstd1)
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download "haproxy/$hsuite" "${libs[@]/%//$lsuite}" >&2)
  # 3.0 in trixie also links the opentracing libraries; later builds do not.
  if [ "$version" = 3.0 ]; then
    (cd "$work/debs" && apt-get "${apt_opts[@]}" download libopentracing-c-wrapper0t64/trixie libopentracing1/trixie >&2)
  fi
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$prefix/root"; done
  local libdir="$prefix/root/usr/lib/x86_64-linux-gnu"
  cp "$prefix/root/usr/sbin/haproxy" "$bin.tmp"
  patchelf --set-interpreter "$libdir/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$libdir" "$bin.tmp"
  mv "$bin.tmp" "$bin"
  rm -rf "$work"
  is_version "$bin" "$version" || {
    log "the $version binary does not run or reports another version: $("$bin" -v 2>&1 | sed -n 1p)"
    exit 1
  }
  echo "$bin"
}
base="${HAPTIC_HAPROXY_PREFIX:-$root/target/haproxy}"
bin30=$(install_build 3.0 "$base/3.0" trixie trixie trixie)
bin32=$(install_build 3.2 "$base/3.2" forky forky forky)
bin34=$(install_build 3.4 "$base/3.4" experimental sid sid experimental)

echo "$bin26"
echo "$bin30"
echo "$bin32"
echo "$bin34"
