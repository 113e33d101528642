#!/usr/bin/env bash
# Debian's chromium and chromium-driver, when missing, for the inspector's browser tests
# (tests/browser: Selenium drives headless Chromium; no browser is downloaded). Needs root to
# install; otherwise one line saying what to install.
set -euo pipefail
missing=()
command -v chromium > /dev/null || missing+=(chromium)
command -v chromedriver > /dev/null || missing+=(chromium-driver)
[ ${#missing[@]} -eq 0 ] && exit 0
[ "$(id -u)" -eq 0 ] || { echo "browser.sh: needs ${missing[*]} (Debian packages): run as root, or apt-get install -y ${missing[*]} first" >&2; exit 1; }
echo "installing ${missing[*]} (apt-get)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null \
    || { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null; }
