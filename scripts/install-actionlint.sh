#!/usr/bin/env bash
# Installs actionlint (the GitHub Actions workflow checker), idempotently, from the Go module proxy
# (no release downloads here):
#   GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN=target/actionlint/<version> go install github.com/rhysd/actionlint/cmd/actionlint@<version>
# The version is pinned. Prints the binary's path. A second run does nothing.
# Needs `go` 1.25 or newer (actionlint's go.mod; GOTOOLCHAIN=local keeps it from downloading another).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version="${HAPTIC_ACTIONLINT_VERSION:-v1.7.12}"
dir="${HAPTIC_ACTIONLINT_DIR:-$root/target/actionlint/$version}"
bin="$dir/actionlint"

log() { echo "install-actionlint: $*" >&2; }

# `actionlint -version` prints the version on its first line (from the module's build info).
is_version() { local v; v=$("$1" -version 2>/dev/null | head -1) || return 1; [[ $v == "$version"* ]]; }
if [ -x "$bin" ] && is_version "$bin"; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then PATH="/usr/local/go/bin:$PATH"; else
    log "go is required to build actionlint $version (https://go.dev/dl/), or set HAPTIC_ACTIONLINT to an actionlint binary"
    exit 1
  fi
fi
log "building actionlint $version with $(go version) into $dir (under a minute on 2 cores)"
mkdir -p "$dir"
GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$dir" GOFLAGS=-trimpath \
  go install -ldflags "-s -w" "github.com/rhysd/actionlint/cmd/actionlint@$version" >&2
is_version "$bin" || { log "built $bin but it does not report $version"; exit 1; }
echo "$bin"
