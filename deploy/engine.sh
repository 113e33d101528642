#!/usr/bin/env bash
# A Docker engine of our own, for `make stack-test`: started on a private socket and stopped
# again, so nothing else on the machine (another checkout's test suite, which switches to
# testcontainers whenever an engine answers on the default socket) ever sees it.
#
#   deploy/engine.sh install   Debian's docker.io and debootstrap, when missing (needs root)
#   deploy/engine.sh start     dockerd in the background; prints `export DOCKER_HOST=…`
#   deploy/engine.sh stop      stops the dockerd `start` started, its containerd and shims
#
# Images and the build cache live in the usual data root (/var/lib/docker) and stay there
# between runs: a later run reuses them. MEMWORKER_ENGINE_DIR moves the socket and state.
set -euo pipefail

DIR="${MEMWORKER_ENGINE_DIR:-/run/memworker-engine}"
SOCKET="unix://$DIR/docker.sock"
PIDFILE="$DIR/dockerd.pid"

die() { echo "engine.sh: $*" >&2; exit 1; }

install() {
    local missing=()
    command -v dockerd > /dev/null || missing+=(docker.io)
    command -v debootstrap > /dev/null || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "needs ${missing[*]} (Debian packages): run as root, or apt-get install -y ${missing[*]} first"
    echo "installing ${missing[*]} (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null \
        || { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null; }
}

start() {
    [ "$(id -u)" -eq 0 ] || die "dockerd needs root: run as root, or start an engine yourself and set DOCKER_HOST"
    command -v dockerd > /dev/null || die "no dockerd: run deploy/engine.sh install (as root) first"
    mkdir -p "$DIR"
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2> /dev/null; then
        die "a dockerd started by this script already runs (pid $(cat "$PIDFILE")): deploy/engine.sh stop"
    fi
    # Its own exec root (and so its own containerd): nothing shared with another engine. It
    # leaves the host's network alone: no iptables rules, no ip_forward, no docker0 bridge (a
    # stopped dockerd would leave all three behind). Compose's own bridge network joins the
    # containers, published ports go through docker-proxy, and builds use the host's network
    # (images.sh: `docker build --network host`) to reach the package mirrors.
    # (fd 9, the lock of a running stack-test, is not handed down: it ends with that run)
    nohup dockerd --host "$SOCKET" --exec-root "$DIR/exec" --pidfile "$DIR/docker.pid.dockerd" \
        --iptables=false --ip-forward=false --bridge=none > "$DIR/dockerd.log" 2>&1 9>&- &
    echo $! > "$PIDFILE"
    for _ in $(seq 1 120); do
        if DOCKER_HOST="$SOCKET" docker info > /dev/null 2>&1; then
            echo "export DOCKER_HOST=$SOCKET"
            return 0
        fi
        kill -0 "$(cat "$PIDFILE")" 2> /dev/null || { tail -5 "$DIR/dockerd.log" >&2; die "dockerd exited"; }
        sleep 0.5
    done
    tail -5 "$DIR/dockerd.log" >&2
    die "dockerd did not answer within 60 s"
}

stop() {
    [ -f "$PIDFILE" ] || return 0
    local pid
    pid="$(cat "$PIDFILE")"
    if kill -0 "$pid" 2> /dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 60); do
            kill -0 "$pid" 2> /dev/null || break
            sleep 0.5
        done
        kill -0 "$pid" 2> /dev/null && kill -KILL "$pid"
    fi
    # dockerd stops its containerd; killed, it leaves its containerd, and a shim of a container
    # it could not stop would outlive it: both run under our exec root
    local left
    left="$(pgrep -f "containerd.*$DIR/exec" || true)"
    [ -n "$left" ] && kill -TERM $left 2> /dev/null && sleep 2
    left="$(pgrep -f "containerd.*$DIR/exec" || true)"
    [ -n "$left" ] && kill -KILL $left 2> /dev/null || true
    rm -f "$PIDFILE"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *) die "usage: deploy/engine.sh install|start|stop" ;;
esac
