#!/usr/bin/env bash
# `make cluster-test`: the stack on a Redis Cluster (docker-compose.cluster.yml over
# docker-compose.yml), for real, from a machine where no engine runs. Like deploy/stack-test.sh:
#
#  1. Debian's docker.io and debootstrap when missing; a dockerd of our own on a private
#     socket (deploy/engine.sh); Compose v2; the images (deploy/images.sh)
#  2. docker compose up -d --wait: 6 Redis nodes made a cluster of 3 masters and 3 replicas,
#     Postgres, 2 workers, 2 consolidators, 1 indexer, 1 api; `memworker stats` shard → node
#  3. deploy/cluster_check.py load: steady load from the host while a Redis master's container
#     is SIGKILLed (its replica promoted), then a worker's, then a consolidator's, then
#     Postgres restarted; the verdict and the figures
#  4. docker compose down -v --remove-orphans; no container, network or volume left
#  5. the dockerd stopped, with its containerd and shims
# Steps 4 and 5 also run when anything fails (a trap). It shares stack-test's engine lock:
# one of them at a time. With DOCKER_HOST set to an engine that answers, that engine is used
# and left running.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/dotenv.sh

PYTHON="${PYTHON:-.venv/bin/python}"
ENGINE_DIR="${MEMWORKER_ENGINE_DIR:-/run/memworker-engine}"
export COMPOSE_PROJECT_NAME=memworker-cluster-test
export COMPOSE_FILE=docker-compose.yml:docker-compose.cluster.yml
export MEMWORKER_ENGINE_DIR="$ENGINE_DIR"

RUN_STARTED=$SECONDS
OURS=false
UP=false

say() { printf '\n== %s (%d s)\n' "$1" $((SECONDS - RUN_STARTED)); }
fail() { echo "cluster-test: $*" >&2; exit 1; }

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    if [ "$status" -ne 0 ] && $UP; then
        echo "== the stack when it failed" >&2
        docker compose ps -a >&2
        docker compose logs --tail 15 >&2
    fi
    if $UP; then
        say "docker compose down -v --remove-orphans"
        docker compose down -v --remove-orphans --timeout 30 > /dev/null 2>&1
        local label="label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"
        left="$(docker ps -aq --filter "$label"; docker network ls -q --filter "$label"; docker volume ls -q --filter "$label")"
        [ -z "$left" ] || { echo "cluster-test: left after down: $left" >&2; status=1; }
    fi
    if $OURS; then
        say "stop dockerd (and its containerd, shims)"
        deploy/engine.sh stop
        if pgrep -f "dockerd --host unix://$ENGINE_DIR/" > /dev/null \
            || pgrep -f "containerd.*$ENGINE_DIR/" > /dev/null; then
            echo "cluster-test: a dockerd, containerd or shim of this run is still running" >&2
            status=1
        fi
    fi
    printf '%5d s  total\n' $((SECONDS - RUN_STARTED))
    if [ "$status" -eq 0 ]; then echo "cluster-test: passed"; else echo "cluster-test: FAILED" >&2; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

LOCK="$ENGINE_DIR.lock"  # stack-test's: one engine run at a time
if [ "$(id -u)" -ne 0 ]; then
    mkdir -p build
    LOCK=build/stack-test.lock
fi
exec 9> "$LOCK"
flock --nonblock 9 || { echo "cluster-test: another stack-test or cluster-test runs (lock $LOCK)" >&2; trap - EXIT; exit 1; }

[ -x "$PYTHON" ] || fail "no $PYTHON: run make install first"

if [ -n "${DOCKER_HOST:-}" ] && docker info > /dev/null 2>&1; then
    echo "using the engine at $DOCKER_HOST (left running)"
else
    say "install docker.io, debootstrap (when missing); start dockerd"
    deploy/engine.sh install
    deploy/engine.sh stop
    OURS=true
    started="$(deploy/engine.sh start)" || fail "the dockerd did not start (see above)"
    eval "$started"
    export DOCKER_HOST
fi

say "compose v2 (when missing), images"
PYTHON="$PYTHON" deploy/compose-plugin.sh
PYTHON="$PYTHON" deploy/images.sh

say "docker compose up -d --wait (6 Redis nodes, a cluster of 3 masters + 3 replicas)"
UP=true
mkdir -p build
docker compose up --detach --no-build --wait --wait-timeout 240 > build/cluster-up.log 2>&1 \
    || { tail -30 build/cluster-up.log >&2; fail "the stack did not come up healthy"; }
docker compose ps --format '  {{.Service}}: {{.Status}}'
docker compose logs redis-cluster | grep -E 'master|slave' | sed 's/^/  /' | cut -c1-150 || true

say "memworker stats: shard → node"
docker compose exec -T -e REDIS_URL="redis://operator:${REDIS_OPERATOR_PASSWORD:-dev-operator-change-me}@redis:6379/0" \
    api memworker stats --rate-seconds 0 | grep -E '^shards on' | sed 's/^/  /'

say "load; SIGKILL a Redis master, a worker, a consolidator; restart Postgres"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" deploy/cluster_check.py load
