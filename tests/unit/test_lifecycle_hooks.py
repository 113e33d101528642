"""LifecycleHooks without a server: registration, the event a hook gets, what runs and when."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from schemas.results import RESULT_ADAPTER, Result
from worker import LifecycleEvent, LifecycleHooks
from worker.consumers.callbacks import is_unavailable
from worker.db.models import episode_id_for


def result(type_: str, **fields: Any) -> Result:
    return RESULT_ADAPTER.validate_python(
        {
            "event_id": "r-1",
            "type": type_,
            "causation_id": "c-1",
            "command": type_.removeprefix("agent.") if type_ != "command.rejected" else "spawn",
            "project_id": "p",
            "session_id": "s",
            "agent_instance_id": "a",
            "agent_type_id": "researcher",
            "metadata": {"run": 7},
            "occurred_at": "2026-01-02T03:04:05Z",
            "duration_ms": 0.5,
            **fields,
        }
    )


async def test_each_decorator_registers_its_hook_and_returns_it_unchanged() -> None:
    hooks = LifecycleHooks()
    seen: list[tuple[str, str]] = []

    @hooks.on_spawn
    async def spawned(event: LifecycleEvent) -> None:
        seen.append(("async", event.event_type))

    @hooks.on_spawn
    def also_spawned(event: LifecycleEvent) -> None:
        seen.append(("sync", event.event_type))

    @hooks.on_terminate
    def terminated(event: LifecycleEvent) -> None:
        seen.append(("terminate", event.event_type))

    assert callable(spawned)
    assert callable(also_spawned)
    assert await hooks.run(result("agent.spawned", initial_items=2)) == 2
    assert seen == [("async", "spawn"), ("sync", "spawn")]
    assert await hooks.run(result("agent.paused", checkpoint_id="cp", items_saved=1)) == 0


async def test_a_hook_gets_the_seeds_event_fields_and_the_calls_data() -> None:
    hooks = LifecycleHooks()
    events: list[LifecycleEvent] = []
    hooks.on_terminate(events.append)
    terminated = result(
        "agent.terminated",
        outcome="partial",
        items_cleared=3,
        consolidate=True,
        lessons_learned=[],
        importance=0.6,
    )
    await hooks.run(terminated)
    [event] = events
    assert (event.event_type, event.project_id, event.agent_instance_id) == ("terminate", "p", "a")
    assert (event.agent_type_id, event.session_id, event.metadata) == (
        "researcher",
        "s",
        {"run": 7},
    )
    assert event.timestamp.isoformat() == "2026-01-02T03:04:05+00:00"
    assert event.data == {
        "episode_id": str(episode_id_for("r-1")),
        "items_cleared": 3,
        "outcome": "partial",
    }


async def test_a_rejected_command_runs_no_hook() -> None:
    hooks = LifecycleHooks()
    hooks.on_spawn(lambda event: pytest.fail("a rejection must not run a hook"))
    rejected = result("command.rejected", reason="already_exists", detail="exists")
    assert await hooks.run(rejected) == 0


async def test_a_hook_that_raises_is_not_swallowed() -> None:
    hooks = LifecycleHooks()

    @hooks.on_resume
    def broken(event: LifecycleEvent) -> None:
        raise RuntimeError("the hook broke")

    with pytest.raises(RuntimeError, match="the hook broke"):
        await hooks.run(result("agent.resumed", checkpoint_id="cp", items_restored=1))


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="pause hook must be callable"):
        LifecycleHooks().on_pause("not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "exc",
    [
        RedisConnectionError("Connection refused"),
        ConnectionRefusedError("webhook down"),
        TimeoutError("no answer"),
        ResponseError("LOADING Redis is loading the dataset in memory"),
        ResponseError("OOM command not allowed when used memory > 'maxmemory'"),
        ResponseError("BUSY Redis is busy running a script"),
    ],
    ids=repr,
)
def test_a_server_wide_condition_is_an_outage_not_a_failed_hook(exc: Exception) -> None:
    assert is_unavailable(exc)


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("bug"), KeyError("x"), ResponseError("WRONGTYPE"), FileNotFoundError("f")],
    ids=repr,
)
def test_any_other_error_is_a_failed_hook(exc: Exception) -> None:
    assert not is_unavailable(exc)
