"""Driving the lifecycle worker: ``publish`` a command, ``tail`` its streams as entries
arrive, and find a session's ``shard``."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Annotated, Any

import orjson
import typer
from redis.asyncio import Redis

from schemas.inputs import json_text_problem
from worker.cli.common import (
    check_ids,
    check_write_ids,
    fail,
    json_shown,
    out,
    run_async,
    settings_from_env,
    shown,
    with_redis,
)
from worker.keys import StreamKeys, episodes_stream, shard_of

REJECTED_EXIT_STATUS = 3
"""``publish --wait``: the command was answered ``command.rejected``."""


def _no_constant(name: str) -> Any:
    """``json.loads`` would read NaN and Infinity, which JSON has not (nor the streams)."""
    raise ValueError(f"{name} is not JSON")


class _NotFiniteError(Exception):
    """A JSON number past a float's range (``1e400``): no field can take it."""


def _finite(raw: str) -> float:
    if not math.isfinite(number := float(raw)):
        raise _NotFiniteError(raw)
    return number


def _json(raw: str) -> Any:
    """``raw`` as strict JSON; ValueError when it is not, ``_NotFiniteError`` for a number
    too large to be one (``json.loads`` would make ``1e400`` Infinity)."""
    return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)


def _parse_assignments(values: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--set")
        try:
            fields[name] = _json(raw)
        except ValueError:
            fields[name] = raw
        except _NotFiniteError:
            raise typer.BadParameter(
                f"{name}: {raw} is not a finite number", param_hint="--set"
            ) from None
        if (bad := json_text_problem(fields[name], name)) is not None:
            raise typer.BadParameter(f"{bad[0]} {bad[1]}", param_hint="--set")
    return fields


def publish(
    command_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="spawn, pause, resume or terminate.")
    ],
    project: Annotated[str, typer.Option("--project", "-p", help="project_id")],
    session: Annotated[str, typer.Option("--session", "-s", help="session_id")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="agent_instance_id")] = "cli",
    user: Annotated[
        str | None,
        typer.Option("--user", "-u", help="spawn: user_id, the user the session works for."),
    ] = None,
    field: Annotated[
        list[str] | None,
        typer.Option("--set", help="Another field, NAME=VALUE (VALUE parsed as JSON if it can)."),
    ] = None,
    state: Annotated[
        str | None, typer.Option(help="spawn: initial_state as a JSON object.")
    ] = None,
    event_id: Annotated[str | None, typer.Option(help="event_id (default: a new UUID).")] = None,
    no_seq: Annotated[bool, typer.Option("--no-seq", help="Do not assign a seq.")] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait for and print the result; exit status 3 if the command was rejected.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 10.0,
) -> None:
    """Publish one lifecycle command.

    Exit status with --wait: 0 when the command was applied, 3 when it was rejected
    (command.rejected: the result is still printed, its reason on stderr), 1 when no result
    came within --timeout.
    """
    if command_type not in ("spawn", "pause", "resume", "terminate"):
        raise typer.BadParameter("must be spawn, pause, resume or terminate", param_hint="TYPE")
    body: dict[str, Any] = {
        "type": command_type,
        "project_id": project,
        "session_id": session,
        "agent_instance_id": agent,
        **_parse_assignments(field or []),
    }
    if state is not None:
        try:
            body["initial_state"] = _json(state)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--state") from exc
        if not isinstance(body["initial_state"], dict):
            kind = type(body["initial_state"]).__name__
            raise typer.BadParameter(f"must be a JSON object, not {kind}", param_hint="--state")
        if (bad := json_text_problem(body["initial_state"], "initial_state")) is not None:
            raise typer.BadParameter(f"{bad[0]} {bad[1]}", param_hint="--state")
    if event_id:
        body["event_id"] = event_id
    if user is not None:
        if command_type != "spawn":
            raise typer.BadParameter("only a spawn names the user", param_hint="--user")
        body["user_id"] = user
    check_write_ids(project_id=project, session_id=session)
    check_ids(agent_instance_id=agent)
    if user is not None:
        check_write_ids(user_id=user)
    settings = settings_from_env()

    async def go(redis: Redis) -> Any:
        from worker.lifecycle.client import LifecycleClient, ResultTimeoutError

        client = LifecycleClient(redis, settings)
        sent = await client.publish(body, assign_seq=not no_seq)
        if not wait:
            print(sent, flush=True)
            return None
        try:
            result = await client.wait(sent, timeout)
        except ResultTimeoutError as exc:
            fail(str(exc))
        print(result.model_dump_json(indent=2), flush=True)
        return result

    result = run_async(with_redis(settings, go))
    if result is not None and result.type == "command.rejected":
        print(f"memworker: rejected: {result.reason}: {result.detail}", file=sys.stderr)
        raise typer.Exit(REJECTED_EXIT_STATUS)


def _print_entry(
    stream: str, entry_id: str, fields: dict[bytes, bytes], as_json: bool, letter: bool
) -> None:
    """One entry as ``tail`` shows it; ``letter``: a dead letter (its stream is a DLQ: a
    command's own ``source_stream`` field never makes it one)."""
    decoded = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
    data: Any = decoded.get("data")
    if data is not None:
        with contextlib.suppress(orjson.JSONDecodeError):
            data = orjson.loads(data)
    if as_json:
        print(
            json_shown(
                json.dumps(
                    {
                        "stream": stream,
                        "id": entry_id,
                        "data": data,
                        **{k: v for k, v in decoded.items() if k != "data"},
                    },
                    ensure_ascii=False,
                )
            ),
            flush=True,
        )
        return
    if isinstance(data, dict) and not letter:
        kind = data.get("type", "?")
        who = f"{data.get('project_id', '')}/{data.get('session_id', '')}"
        extra = data.get("reason") or data.get("episode_id") or data.get("checkpoint_id") or ""
        kind, who, extra = _plain(kind), _plain(who), _plain(extra)
        out.print(f"[dim]{entry_id}[/dim] [bold]{kind}[/bold] {who} {extra}", highlight=False)
    else:
        reason, error = _plain(decoded.get("reason", "")), _plain(decoded.get("error", ""))
        out.print(f"[dim]{entry_id}[/dim] [red]{reason}[/red] {error}", highlight=False)


def _plain(value: object) -> str:
    """An entry's field inside rich markup: ``shown`` and its own ``[`` never markup."""
    from rich.markup import escape

    return escape(shown(str(value)))


def tail(
    what: Annotated[str, typer.Argument(help="results, episodes, dlq or lifecycle.")] = "results",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Start at the oldest entry, not new ones.")
    ] = False,
    count: Annotated[int | None, typer.Option(help="Stop after this many entries.")] = None,
) -> None:
    """Follow results, episodes, the DLQ or commands as they arrive."""
    if what not in ("results", "episodes", "dlq", "lifecycle"):
        raise typer.BadParameter("must be results, episodes, dlq or lifecycle", param_hint="WHAT")
    settings = settings_from_env()
    if what == "episodes":
        names = [episodes_stream(settings.stream_prefix)]
    else:
        names = [
            getattr(StreamKeys(settings.stream_prefix, i), what) for i in range(settings.shards)
        ]

    async def go(redis: Redis) -> None:
        positions: dict[str, str] = {name: "0-0" if from_start else "$" for name in names}
        seen = 0
        while count is None or seen < count:
            reply: Any = await redis.xread(positions, count=100, block=1000)  # type: ignore[arg-type]
            for stream, entries in reply or []:
                name = stream.decode()
                for entry_id, fields in entries:
                    positions[name] = entry_id.decode()
                    _print_entry(name, entry_id.decode(), fields, as_json, what == "dlq")
                    seen += 1
                    if count is not None and seen >= count:
                        return

    run_async(with_redis(settings, go))


def shard(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[str, typer.Option("--session", "-s")],
) -> None:
    """Print the shard of a session: crc32(project/session) mod MEMWORKER_SHARDS."""
    check_ids(project_id=project, session_id=session)
    settings = settings_from_env()
    out.print(str(shard_of(project, session, settings.shards)))
