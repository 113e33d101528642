#!/usr/bin/env bash
# `make stack-test`: the whole compose stack, for real, from a machine where no engine runs.
#
#  1. Debian's docker.io and debootstrap, when missing (root; otherwise one line saying so)
#  2. a dockerd of our own on a private socket (deploy/engine.sh): nothing else on the machine
#     sees it, and it touches neither iptables nor the host's bridges
#  3. Docker Compose v2 (deploy/compose-plugin.sh), the images (deploy/images.sh)
#  4. docker compose up -d --wait
#  5. from the host: spawn and terminate through the published Redis port as `publisher`, the
#     results, the episode in Postgres, the episode recalled by meaning (deploy/stack_check.py)
#  6. traffic while one worker container is SIGKILLed: exactly one result per command
#  7. docker compose stop: every container exited 0 (the killed worker aside)
#  8. docker compose down -v --remove-orphans; no container, network or volume left
#  9. the dockerd stopped, with its containerd and shims
# Steps 8 and 9 also run when anything fails (a trap). Images, and the app's build stage, stay
# in /var/lib/docker: the next run reuses them (deploy/images.sh prunes untagged ones).
#
# With DOCKER_HOST set to an engine that answers, that engine is used and left running.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/dotenv.sh
. deploy/engine-run.sh

PYTHON="${PYTHON:-.venv/bin/python}"
RUN_NAME=stack-test
export COMPOSE_PROJECT_NAME=memworker-stack-test  # never the `memworker` stack of a user

RUN_STARTED=$SECONDS
STEP_STARTED=$SECONDS
STEP=""
TIMES=()
KILLED=""

step() {
    finish_step
    STEP="$1"
    STEP_STARTED=$SECONDS
    printf '\n== %s\n' "$STEP"
}

finish_step() {
    if [ -n "$STEP" ]; then
        TIMES+=("$(printf '%5d s  %s' $((SECONDS - STEP_STARTED)) "$STEP")")
        STEP=""
    fi
}

announce() { step "$1"; }

fail() {
    echo "stack-test: $*" >&2
    exit 1
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    engine_teardown "$status" || status=1
    finish_step
    printf '\n== wall time per step\n'
    printf '%s\n' "${TIMES[@]}"
    printf '%5d s  total\n' $((SECONDS - RUN_STARTED))
    if [ "$status" -eq 0 ]; then echo "stack-test: passed"; else echo "stack-test: FAILED" >&2; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

engine_lock  # one run at a time: a second would stop the first one's engine
[ -x "$PYTHON" ] || fail "no $PYTHON: run make install first (or make stack-test, which does)"
engine_start

step "compose v2 (when missing)"
PYTHON="$PYTHON" deploy/compose-plugin.sh

step "make images"
PYTHON="$PYTHON" deploy/images.sh

step "docker compose up -d --wait"
UP=true
mkdir -p build
docker compose up --detach --no-build --wait --wait-timeout 180 > build/stack-up.log 2>&1 \
    || { tail -30 build/stack-up.log >&2; fail "the stack did not come up healthy"; }
docker compose ps --format '  {{.Service}}: {{.Status}}'

step "spawn, terminate, episode, recall by meaning"
"$PYTHON" deploy/stack_check.py roundtrip

step "SIGKILL a worker under traffic: nothing lost"
out="$("$PYTHON" deploy/stack_check.py kill-worker)" || { echo "$out"; fail "kill-worker failed"; }
echo "$out" | grep -v '^KILLED '
KILLED="$(echo "$out" | awk '/^KILLED / {print $2}')"

step "docker compose stop: every container exits 0"
docker compose stop --timeout 60 > /dev/null 2>&1
bad=""
for id in $(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"); do
    read -r name code < <(docker inspect -f '{{.Name}} {{.State.ExitCode}}' "$id")
    name="${name#/}"
    if [ -n "$KILLED" ] && [[ "$KILLED" == "$id"* ]]; then
        echo "  $name: $code (SIGKILLed on purpose)"
        continue
    fi
    echo "  $name: $code"
    [ "$code" = 0 ] || bad="$bad $name=$code"
done
[ -z "$bad" ] || fail "containers that did not exit 0:$bad"
