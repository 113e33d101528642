# Sourced by deploy/stack-test.sh and deploy/cluster-test.sh: what both do around their stack.
#
#   engine_lock       one run of either at a time (a second would stop the first one's engine)
#   engine_start      the engine at DOCKER_HOST when it answers (left running), else Debian's
#                     docker.io installed when missing and a dockerd of our own (deploy/engine.sh)
#   engine_teardown   (from the EXIT trap) with the run's status: the stack's state shown when
#                     it failed, docker compose down -v, nothing of the project left, our
#                     dockerd stopped with its containerd and shims; returns 1 if anything is left
#
# The sourcing script sets RUN_NAME (its messages' prefix) and COMPOSE_PROJECT_NAME, and
# defines `announce TITLE` (how it prints a step) and `fail MESSAGE`. It reads UP (true once
# the stack may have containers); engine_start sets OURS (true: this run started the engine).

ENGINE_DIR="${MEMWORKER_ENGINE_DIR:-/run/memworker-engine}"
export MEMWORKER_ENGINE_DIR="$ENGINE_DIR"
OURS=false
UP=false

engine_lock() {
    # the lock beside the engine's directory, which only root may create; a run on someone
    # else's engine locks in build/
    local lock="$ENGINE_DIR.lock"
    if [ "$(id -u)" -ne 0 ]; then
        mkdir -p build
        lock=build/stack-test.lock
    fi
    exec 9> "$lock"
    if ! flock --nonblock 9; then
        echo "$RUN_NAME: another stack-test or cluster-test runs (lock $lock)" >&2
        trap - EXIT
        exit 1
    fi
}

engine_start() {
    if [ -n "${DOCKER_HOST:-}" ] && docker info > /dev/null 2>&1; then
        echo "using the engine at $DOCKER_HOST (left running)"
        return 0
    fi
    announce "install docker.io, debootstrap (when missing)"
    deploy/engine.sh install
    announce "start dockerd"
    deploy/engine.sh stop  # a dockerd a killed run left behind
    OURS=true  # from here the trap stops whatever part of the engine started
    local started
    started="$(deploy/engine.sh start)" || fail "the dockerd did not start (see above)"
    eval "$started"
    [ -n "${DOCKER_HOST:-}" ] || fail "deploy/engine.sh start named no DOCKER_HOST"
    export DOCKER_HOST
}

project_objects() {
    local label="label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"
    docker ps -aq --filter "$label"
    docker network ls -q --filter "$label"
    docker volume ls -q --filter "$label"
}

engine_teardown() {
    local status="$1" left=""
    if [ "$status" -ne 0 ] && $UP; then
        echo "== the stack when it failed" >&2
        docker compose ps -a >&2
        docker compose logs --tail 20 >&2
    fi
    status=0
    if $UP; then
        announce "docker compose down -v --remove-orphans"
        docker compose down -v --remove-orphans --timeout 60 > /dev/null 2>&1
        left="$(project_objects)"
        [ -z "$left" ] || { echo "$RUN_NAME: left after down: $left" >&2; status=1; }
    fi
    if $OURS; then
        announce "stop dockerd (and its containerd, shims)"
        deploy/engine.sh stop
        if pgrep -f "dockerd --host unix://$ENGINE_DIR/" > /dev/null \
            || pgrep -f "containerd.*$ENGINE_DIR/" > /dev/null; then
            echo "$RUN_NAME: a dockerd, containerd or shim of this run is still running" >&2
            status=1
        fi
    fi
    return "$status"
}
