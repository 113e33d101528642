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
. deploy/engine-run.sh

PYTHON="${PYTHON:-.venv/bin/python}"
RUN_NAME=cluster-test
export COMPOSE_PROJECT_NAME=memworker-cluster-test
export COMPOSE_FILE=docker-compose.yml:docker-compose.cluster.yml
# Shorter than the defaults (30 s each), and still well above what a live server or worker
# takes: a read blocks MEMWORKER_BLOCK_MS (100 ms) and a batch's replies come in milliseconds,
# so 5 s without a reply is a dead node; a live worker's entries are acknowledged within the
# reply timeout or held with their leases renewed, so one idle 10 s belongs to a dead worker
# (a command applied twice is answered once: the apply function dedupes on its event_id).
export MEMWORKER_REPLY_TIMEOUT_SECONDS="${MEMWORKER_REPLY_TIMEOUT_SECONDS:-5}"
export MEMWORKER_RECLAIM_IDLE_MS="${MEMWORKER_RECLAIM_IDLE_MS:-10000}"

RUN_STARTED=$SECONDS

say() { printf '\n== %s (%d s)\n' "$1" $((SECONDS - RUN_STARTED)); }
announce() { say "$1"; }
fail() { echo "cluster-test: $*" >&2; exit 1; }

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    engine_teardown "$status" || status=1
    printf '%5d s  total\n' $((SECONDS - RUN_STARTED))
    if [ "$status" -eq 0 ]; then echo "cluster-test: passed"; else echo "cluster-test: FAILED" >&2; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

engine_lock  # stack-test's lock: one engine run at a time
[ -x "$PYTHON" ] || fail "no $PYTHON: run make install first"
engine_start

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
