#!/usr/bin/env bash
# Build the raftq image offline: wheels for raftq and its dependencies from this checkout, then
# deploy/Dockerfile. Without a registry (no python:3.11-slim to pull), builds the offline base.
#   deploy/build-image.sh [TAG]          (default raftq:dev)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-raftq:dev}"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] && py=.venv/bin/python
# The wheels are built here for the image's interpreter: they must match it.
if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) or sys.platform != "linux")'; then
  echo "build-image.sh: needs Python 3.11 on Linux (the image's) to build its wheels;" \
       "set PYTHON=python3.11" >&2
  exit 1
fi
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
"$py" -m pip wheel --quiet --wheel-dir "$ctx/wheels" '.[server]'
cp deploy/Dockerfile "$ctx/Dockerfile"
base="${BASE_IMAGE:-}"
if [ -z "$base" ]; then
  if docker image inspect python:3.11-slim >/dev/null 2>&1; then
    base=python:3.11-slim
  else
    bash deploy/build-base-image.sh raftq-base:bookworm
    base=raftq-base:bookworm
  fi
fi
DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE_IMAGE=$base" -t "$tag" "$ctx" >/dev/null
echo "built $tag from $base"
