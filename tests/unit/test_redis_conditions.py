"""One classification of server-wide Redis conditions: what each reply or error means."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from worker.memory.errors import RedisUnavailableError, WorkingMemoryError
from worker.redis_conditions import RedisConditionError, ServerCondition, server_condition


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # as redis-py raises them (it strips the code of the ones it knows)
        (rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "full"),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (rx.ReadOnlyError("You can't write against a read only replica."), "readonly"),
        (rx.MasterDownError("Link with MASTER is down"), "masterdown"),
        (rx.TryAgainError("Multiple keys request during rehashing of slot"), "tryagain"),
        (rx.ClusterDownError("The cluster is down"), "clusterdown"),
        (rx.ResponseError("BUSY Redis is busy running a script. You can only call ..."), "busy"),
        (rx.ResponseError("MISCONF Redis is configured to save RDB snapshots, ..."), "misconf"),
        (rx.ResponseError("NOREPLICAS Not enough good replicas to write."), "noreplicas"),
        (rx.ConnectionError("Error 111 connecting to 127.0.0.1:6379."), "unreachable"),
        (rx.TimeoutError("Timeout reading from socket"), "unreachable"),
        (ConnectionResetError("reset by peer"), "unreachable"),
        # as the worker's pipelined channel returns them (hiredis keeps the code)
        (
            rx.ResponseError(
                "OOM command not allowed when used memory > 'maxmemory'. script: 2248ea7f, "
                "on @user_script:1."
            ),
            "full",
        ),
        (rx.ResponseError("LOADING Redis is loading the dataset in memory"), "loading"),
        (rx.ResponseError("READONLY You can't write against a read only replica."), "readonly"),
        (rx.ResponseError("MASTERDOWN Link with MASTER is down"), "masterdown"),
        (rx.ResponseError("CLUSTERDOWN Hash slot not served"), "clusterdown"),
        (rx.ResponseError("TRYAGAIN Multiple keys request during rehashing"), "tryagain"),
        (rx.ResponseError("MOVED 3999 127.0.0.1:6381"), "moved"),
        (rx.ResponseError("ASK 3999 127.0.0.1:6381"), "moved"),
        # an older server wraps a script's error
        (
            rx.ResponseError(
                "ERR Error running script (call to f_1): @user_script:1: -OOM command not "
                "allowed when used memory > 'maxmemory'"
            ),
            "full",
        ),
        # reply text alone
        ("BUSY Valkey is busy running a script.", "busy"),
    ],
)
def test_every_server_wide_condition_is_recognised(error: BaseException | str, kind: str) -> None:
    condition = server_condition(error)
    assert condition is not None
    assert condition.kind == kind
    assert condition.message  # a sentence for a person


@pytest.mark.parametrize(
    "error",
    [
        rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rx.ResponseError("BUSYGROUP Consumer Group name already exists"),
        rx.ResponseError("BUSYKEY Target key name already exists."),
        rx.ResponseError("NOGROUP No such key 'x' or consumer group 'g'"),
        rx.ResponseError("ERR Error running script: memworker: unknown op x"),
        rx.ResponseError("WM_LIMIT_KEYS 10000"),
        rx.NoScriptError("No matching script."),
        ValueError("not JSON"),
        "ERR unknown command",
    ],
)
def test_an_entry_s_own_problem_is_not_a_server_condition(error: BaseException | str) -> None:
    assert server_condition(error) is None


def test_a_full_redis_says_what_to_do() -> None:
    condition = server_condition(rx.OutOfMemoryError("command not allowed"))
    assert condition == ServerCondition(
        "full",
        "Redis is full: used_memory reached maxmemory; free memory, raise maxmemory, or lower "
        "retention/windows (see docs/guides/capacity.md)",
    )


def test_working_memory_s_error_is_the_one_error_callers_catch() -> None:
    full = ServerCondition("full", "Redis is full")
    error = RedisUnavailableError("Redis is full: used_memory 10mb reached maxmemory 5mb", full)
    assert isinstance(error, RedisConditionError)
    assert isinstance(error, WorkingMemoryError)
    assert isinstance(error, ConnectionError)
    assert error.condition.kind == "full"
    assert RedisUnavailableError("Redis at x is unavailable").condition.kind == "unreachable"


def test_a_full_or_busy_redis_is_not_called_unreachable() -> None:
    """Before: "cannot reach Redis at …: Redis is full: …", which sends an operator looking
    for a network problem."""
    from worker.errors import one_line
    from worker.redis_conditions import RedisConditionError, ServerCondition

    full = RedisConditionError(
        "Redis is full: used_memory 57.90M reached maxmemory 58.71M (Redis at redis://h:1/0)",
        ServerCondition("full", "Redis is full"),
    )
    assert one_line(full).startswith("Redis is full: used_memory 57.90M")
    nearly = RedisConditionError("Redis is nearly full: …", ServerCondition("nearly_full", "x"))
    assert one_line(nearly) == "Redis is nearly full: …"
    down = RedisConditionError("Redis is unreachable: refused")
    assert one_line(down).startswith("cannot reach Redis at ")
