#!/usr/bin/env bash
# Packages charts/haptic for a release: the chart's version and appVersion both set to VERSION
# (a leading `v` is dropped, so a tag `v1.2.0` gives 1.2.0 — the image tag the release workflow
# pushes and the chart's images default to), `helm lint --strict` first, then `helm package` into
# target/release/. Charts/haptic/Chart.yaml itself is left as it is. Prints the package's path.
# Running it again with the same version replaces the package (same contents; new timestamps).
#
#   scripts/package-chart.sh 1.2.0        # -> target/release/haptic-1.2.0.tgz
#
# helm: HAPTIC_HELM, else the pinned one from scripts/install-helm.sh (built once, cached).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "package-chart: $*" >&2; }

[ $# -eq 1 ] || { log "usage: scripts/package-chart.sh VERSION   (e.g. 1.2.0 or v1.2.0)"; exit 2; }
version=${1#v}
# SemVer 2 (helm refuses anything else as a chart version; checked here for a clear message).
semver='^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'
[[ $version =~ $semver ]] || { log "'$1' is not a SemVer version (MAJOR.MINOR.PATCH[-PRE][+BUILD])"; exit 2; }

helm="${HAPTIC_HELM:-$("$root/scripts/install-helm.sh")}"
out="$root/target/release"
mkdir -p "$out"
# Private helm homes: packaging reads no repository, cache or plugin of the user's.
homes=$(mktemp -d)
trap 'rm -rf "$homes"' EXIT
export HELM_CACHE_HOME="$homes/cache" HELM_CONFIG_HOME="$homes/config" HELM_DATA_HOME="$homes/data"

"$helm" lint --strict "$root/charts/haptic" >&2
"$helm" package "$root/charts/haptic" --version "$version" --app-version "$version" \
  --destination "$out" >&2
pkg="$out/haptic-$version.tgz"
[ -f "$pkg" ] || { log "helm package did not write $pkg"; exit 1; }
# The package must say what it was asked to (helm keeps Chart.yaml's other fields as they are).
meta=$("$helm" show chart "$pkg")
grep -qx "version: $version" <<<"$meta" || { log "$pkg: version is not $version"; exit 1; }
grep -Eqx "appVersion: \"?$version\"?" <<<"$meta" || { log "$pkg: appVersion is not $version"; exit 1; }
echo "$pkg"
