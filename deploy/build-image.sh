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
err="$(mktemp)"
trap 'rm -rf "$ctx" "$err"' EXIT
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
if docker buildx version >/dev/null 2>&1; then
  docker buildx build --quiet --load --build-arg "BASE_IMAGE=$base" -t "$tag" "$ctx" >/dev/null
else
  # Without the buildx plugin the classic builder is the one there is (BuildKit would fail);
  # its "legacy builder is deprecated" banner says nothing about this image: drop it, keep
  # anything else it prints.
  if ! DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE_IMAGE=$base" -t "$tag" "$ctx" \
      >/dev/null 2>"$err"; then
    cat "$err" >&2
    exit 1
  fi
  sed -e '/^DEPRECATED: The legacy builder is deprecated/,/^ *environment-variable\.$/d' \
      -e '/^ *$/d' "$err" >&2
fi
echo "built $tag from $base"
