#!/usr/bin/env bash
# Debian packages some tests use when present (`make test` runs this first; best effort: a test
# whose tool is missing skips with the reason). Installs only as root on a machine with apt-get.
#   promtool (package prometheus): tests/node/test_metrics_names.py, test_deploy_observability.py
set -u
command -v promtool >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "note: promtool not installed (needs root and apt-get); its checks will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
{ apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; } >/dev/null 2>&1 \
    || echo "note: apt-get could not install prometheus (promtool); its checks will be skipped" >&2
exit 0
