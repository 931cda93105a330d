#!/usr/bin/env bash
# Installs the real helm CLI, idempotently, from the Go module proxy (no release downloads here):
#   GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN=target/helm/<version> go install helm.sh/helm/v3/cmd/helm@<version>
# The version is pinned. Prints the binary's path. A second run does nothing.
# Needs `go` (any recent toolchain; GOTOOLCHAIN=local keeps it from downloading another).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version="${HAPTIC_HELM_VERSION:-v3.22.0}"
dir="${HAPTIC_HELM_DIR:-$root/target/helm/$version}"
bin="$dir/helm"

log() { echo "install-helm: $*" >&2; }

is_version() { local v; v=$("$1" version --short 2>/dev/null) || return 1; [[ $v == "$version"* ]]; }
if [ -x "$bin" ] && is_version "$bin"; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then PATH="/usr/local/go/bin:$PATH"; else
    log "go is required to build helm $version (https://go.dev/dl/), or set HAPTIC_HELM to a helm binary"
    exit 1
  fi
fi
log "building helm $version with $(go version) into $dir (about 70 s on 2 cores)"
mkdir -p "$dir"
# The version stamp `make` would set (else `helm version` says only the minor, e.g. v3.22).
GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$dir" GOFLAGS=-trimpath \
  go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
  "helm.sh/helm/v3/cmd/helm@$version" >&2
is_version "$bin" || { log "built $bin but it does not report $version"; exit 1; }
echo "$bin"
