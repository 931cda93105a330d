#!/usr/bin/env bash
# Installs Prometheus's promtool, idempotently, from the Go module proxy:
#   GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN=target/promtool/<version> go install github.com/prometheus/prometheus/cmd/promtool@<version>
# (Prometheus 3.x is published as module versions v0.3xx.y.) The version is pinned. Prints the
# binary's path. A second run does nothing. Needs `go` (GOTOOLCHAIN=local keeps it from
# downloading another toolchain).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version="${HAPTIC_PROMTOOL_VERSION:-v0.316.0}"
dir="${HAPTIC_PROMTOOL_DIR:-$root/target/promtool/$version}"
bin="$dir/promtool"

log() { echo "install-promtool: $*" >&2; }

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then PATH="/usr/local/go/bin:$PATH"; else
    log "go is required to build promtool $version (https://go.dev/dl/), or set HAPTIC_PROMTOOL to a promtool binary"
    exit 1
  fi
fi
log "building promtool $version with $(go version) into $dir"
mkdir -p "$dir"
GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$dir" GOFLAGS=-trimpath \
  go install -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/promtool@$version" >&2
"$bin" --version >/dev/null 2>&1 || { log "built $bin but it does not run"; exit 1; }
echo "$bin"
