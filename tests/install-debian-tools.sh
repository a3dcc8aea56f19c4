#!/usr/bin/env bash
# Debian packages some tests use when present (`make test` runs this first; best effort: a test
# whose tool is missing skips with the reason). Installs only as root on a machine with apt-get.
#   promtool (package prometheus): tests/node/test_metrics_names.py, test_deploy_observability.py
#   chromium-headless-shell: tests/console (the web console in a real browser, driven by
#     Playwright from PyPI with executable_path: nothing downloads a browser)
set -u
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null \
    || missing+=(chromium-headless-shell)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "note: ${missing[*]} not installed (needs root and apt-get); their tests will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null 2>&1
for pkg in "${missing[@]}"; do  # (one at a time: a package this Debian lacks spoils no other)
    apt-get install -y -q --no-install-recommends "$pkg" >/dev/null 2>&1 \
        || echo "note: apt-get could not install $pkg; the tests that need it will be skipped" >&2
done
exit 0
