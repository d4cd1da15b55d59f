#!/usr/bin/env bash
# Chromium for the web page's browser test (scripts/web-ui-test.sh): Debian's package,
# installed when no Chromium is on the PATH (as root, or with sudo when there is one);
# does nothing otherwise. Prints the browser's path.
set -euo pipefail
for c in "${CHROMIUM:-}" chromium chromium-browser; do
    if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1; then
        command -v "$c"
        exit 0
    fi
done
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-chromium: not root and no sudo: install Debian's chromium package" >&2; exit 1; }
    sudo="sudo"
fi
echo "installing chromium" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium
