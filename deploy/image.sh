#!/usr/bin/env bash
# Builds the beatd image from deploy/Dockerfile.scratch without pulling
# anything: a static binary, the host's CA bundle and a passwd line.
#   deploy/image.sh [TAG]      default tag: beatd:latest
# BUILDER=docker uses docker instead of podman; BEATD_BIN=FILE uses that
# static binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-beatd:latest}
builder=${BUILDER:-podman}
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
if [ -n "${BEATD_BIN:-}" ]; then
  cp "$BEATD_BIN" "$ctx/beatd"
else
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/beatd/beatd/internal/version.version=${version}" -o "$ctx/beatd" ./cmd/beatd
fi
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
echo 'beatd:x:65532:65532:beatd:/var/lib/beatd:/sbin/nologin' > "$ctx/passwd"
echo 'beatd:x:65532:' > "$ctx/group"
mkdir "$ctx/data"
"$builder" build --pull=never -f deploy/Dockerfile.scratch -t "$tag" "$ctx"
