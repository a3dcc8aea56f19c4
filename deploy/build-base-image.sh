#!/usr/bin/env bash
# Build a Python 3.11 base image without a container registry: mmdebstrap a minimal Debian
# bookworm root (python3, venv, tini, ca-certificates) from the Debian mirror apt already uses,
# then `docker import` it. Used where `python:3.11-slim` cannot be pulled (CI here).
#   deploy/build-base-image.sh [TAG]      (default raftq-base:bookworm; no-op if it exists)
set -euo pipefail
tag="${1:-raftq-base:bookworm}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag already present"
  exit 0
fi
if ! command -v mmdebstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-venv,ca-certificates,tini \
  --customize-hook='chroot "$1" ln -sf /usr/bin/python3 /usr/local/bin/python' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
  bookworm "$work/root.tar"
docker import \
  --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  "$work/root.tar" "$tag" >/dev/null
echo "built base image $tag"
