"""Applying a batch of lifecycle entries: one call of the apply function (``FCALL``) per up to
``COMMANDS_PER_CALL`` entries, one pipeline per batch.

The function does, for each command in turn, the dedupe check, the seq rule, the state
transition, the mutation and the XADD of the result, then one XACK of every command it
answered, all in one atomic call, so a crash leaves each entry either untouched (still pending,
redelivered later) or completely done.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from schemas.commands import (
    COMMAND_TYPES,
    MAX_ENVELOPE_EXTRA_BYTES,
    PauseCommand,
    ResumeCommand,
    SpawnCommand,
    TerminateCommand,
)
from worker.connections import AnyRedis, shard_urls
from worker.consumers.dead_letters import dead_letter
from worker.credentials import mask
from worker.keys import LIFECYCLE_GROUP, SessionKeys, StreamKeys, shard_of
from worker.lifecycle.channel import ScriptChannel
from worker.lifecycle.future_ids import FutureIds, redis_clock
from worker.lifecycle.intake import Accepted, Refused, Unusable, copied_fields, parse_entry
from worker.lifecycle.result_ids import (
    default_checkpoint_id,
    life_of,
    result_head,
    result_id_and_record,
    utc_now_iso,
)
from worker.redis_conditions import is_server_condition
from worker.scripts import function, script
from worker.settings import Settings

_PLACEHOLDER = "!"
"""Stands for an id that failed validation; '!' is no id character, so it names no session."""

APPLY = function("apply_command.lua")
COMMANDS_PER_CALL = 64
"""Commands per call of the apply function. One call per command costs ~15k more Redis
instructions a command (calling at all, the call's context and streams, an XACK each:
BENCHMARKS.md); a call runs alone in Redis, so it is kept short (64 commands: ~1.5 ms)."""
DEAD_LETTER = script("dead_letter.lua")


@dataclass(slots=True)
class Plan:
    """A parsed batch: script calls to send, and what each entry's outcome will be made of."""

    shard: int
    entries: Sequence[tuple[bytes | str, Mapping[bytes, bytes]]]
    received: float
    dead_letters: bool
    commands: list[list[Any]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    slots: list[tuple[int, int] | None] = field(default_factory=list)
    """Per entry, where its reply is (it makes the outcome): ``(command, -1)`` for a command
    of its own (a dead letter), ``(command, i)`` for the i-th reply of an apply call, None
    when nothing was sent for it (its planned outcome stands)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one entry.

    ``status``: applied, rejected, duplicate, wait (seq ahead), dead (DLQ) or error.
    """

    entry_id: str
    status: str
    detail: str = ""
    command: str | None = None
    reason: str | None = None
    project_id: str | None = None
    session_id: str | None = None
    event_id: str | None = None


class CommandApplier:
    """Applies batches of entries from one consumer group's point of view."""

    def __init__(self, redis: AnyRedis, settings: Settings, group: str = LIFECYCLE_GROUP) -> None:
        self.redis = redis
        self.settings = settings
        self.group = group
        self._urls: dict[int, str] = dict.fromkeys(range(settings.shards), settings.redis_url)
        self._resolved = not (settings.redis_cluster or settings.redis_sentinel_service)
        self._channels: dict[str, ScriptChannel] = {}
        self._settings_arg: tuple[Settings, bool, str] | None = None
        self.pressure = False
        """Redis is (nearly) full: each applied command's entry is deleted with its XACK
        (XDEL), not kept for the replay window; its result still is (and goes to Postgres)."""
        self.commands_per_call = COMMANDS_PER_CALL
        """Commands per apply call (the worker makes it 1 while Redis is nearly full)."""
        self.future_ids = FutureIds()

    def settings_arg(self) -> str:
        """The worker's settings, the first lines of every apply call's context (see
        ``context_arg``): group, default session TTL, dedupe TTL, tombstone TTL (in ms), max
        checkpoints, memory pressure (1: delete a command's entry once applied) and the spawn
        wait (ms, at most the seq-gap window), one per line."""
        cached = self._settings_arg
        if cached is None or cached[0] is not self.settings or cached[1] != self.pressure:
            s = self.settings
            values = (
                self.group,
                s.session_ttl_seconds * 1000,
                s.dedupe_ttl_seconds * 1000,
                # The tombstone holds the session's dedupe records: it lasts both windows.
                max(s.tombstone_ttl_seconds, s.dedupe_ttl_seconds) * 1000,
                s.max_checkpoints_per_session,
                1 if self.pressure else 0,
                int(min(s.spawn_wait_seconds, s.seq_gap_timeout_seconds) * 1000),
            )
            text = "\n".join(str(v) for v in values)
            cached = self._settings_arg = (s, self.pressure, text)
        return cached[2]

    def context_arg(self, now_ms: int, now_iso: str) -> str:
        """The first argument of every apply call of one batch, its context (see
        apply_command.lua): the settings (``settings_arg``), then the batch's clock in ms and
        as RFC 3339, one per line."""
        return f"{self.settings_arg()}\n{now_ms}\n{now_iso}"

    async def resolve(self) -> None:
        """Learn which server holds each shard (a cluster node, the Sentinel's master)."""
        urls = await shard_urls(self.settings)
        for url in set(self._channels) - set(urls.values()):
            await self._channels.pop(url).close()
        self._urls, self._resolved = urls, True

    def url_of(self, shard: int) -> str:
        """The URL of the server holding ``shard`` (after ``resolve`` on a cluster)."""
        return self._urls[shard]

    def channel_for(self, shard: int) -> ScriptChannel:
        """The pipelined connection to the server of ``shard`` (one per server)."""
        url = self._urls[shard]
        channel = self._channels.get(url)
        if channel is None:
            channel = self._channels[url] = ScriptChannel(
                url, reply_timeout=self.settings.reply_timeout_seconds
            )
        return channel

    async def ping(self) -> None:
        """Raise unless every server this applier writes to answers as a writable primary."""
        for shard in {url: s for s, url in self._urls.items()}.values():
            (role,) = await self.channel_for(shard).execute([["ROLE"]])
            if isinstance(role, Exception) or role[0] != b"master":
                raise RedisConnectionError(f"{mask(self.url_of(shard))} is not a writable primary")

    async def ensure_scripts(self, *, look_first: bool = False) -> None:
        """Load the apply function and the DLQ script; ``look_first`` (the operator's replay:
        it may call the function, not load it): only where ``FUNCTION LIST`` lacks it."""
        if not self._resolved:
            await self.resolve()
        for shard in {url: s for s, url in self._urls.items()}.values():
            channel, dlq_script = self.channel_for(shard), ["SCRIPT", "LOAD", DEAD_LETTER.source]
            if look_first:
                listed, _ = await channel.execute([APPLY.list_command(), dlq_script])
                if isinstance(listed, list) and listed:
                    continue  # there (a user without FUNCTION LIST: loaded below)
            loaded, _ = await channel.execute([APPLY.load_command(), dlq_script])
            APPLY.loaded(loaded)  # e.g. OOM on a full server: a condition the caller holds on

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def dead_letter(
        self,
        shard: int,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        reason: str,
        error: str,
        deliveries: int,
    ) -> str:
        """Move one entry to the DLQ now, acknowledging it at its source."""
        streams = StreamKeys(self.settings.stream_prefix, shard)
        args = self.letter_args(streams, entry_id, fields, reason, error, deliveries)
        result = await DEAD_LETTER(self.redis, [streams.dlq, streams.lifecycle], args)
        if result is None:  # no longer pending: someone else handled it
            return ""
        return result.decode() if isinstance(result, bytes) else str(result)

    def letter_args(
        self,
        streams: StreamKeys,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        reason: str,
        error: str,
        deliveries: int,
    ) -> list[str | bytes | int]:
        """The dead-letter script's arguments for one entry: an entry over what the stream
        door accepts is kept as an excerpt (``worker.consumers.dead_letters.dead_letter``)."""
        letter = dead_letter(
            fields=fields,
            source_stream=streams.lifecycle,
            source_id=entry_id,
            group=self.group,
            reason=reason,
            error=error,
            deliveries=deliveries,
            keep_bytes=self.settings.max_event_bytes + MAX_ENVELOPE_EXTRA_BYTES,
        )
        args: list[str | bytes | int] = [self.group, entry_id]
        for k, v in letter.items():
            args += [k, v]
        return args

    async def screen(
        self, shard: int, entries: Sequence[tuple[bytes | str, Mapping[bytes, bytes]]]
    ) -> dict[str, str]:
        """Entries whose id was given explicitly, far ahead of the clock: entry id → why
        (``worker.lifecycle.future_ids``). No I/O while the ids follow the clock."""
        ahead = self.future_ids.ahead(shard, entries)
        if not ahead:
            return {}
        stream = StreamKeys(self.settings.stream_prefix, shard).lifecycle
        clock = redis_clock(self.channel_for(shard))
        return await self.future_ids.screen(self.redis, stream, shard, entries, ahead, clock)

    def plan(
        self,
        shard: int,
        entries: Sequence[tuple[bytes | str, Mapping[bytes, bytes]]],
        received: float | None = None,
        *,
        dead_letters: bool = True,
        future: Mapping[str, str] | None = None,
    ) -> Plan:
        """Parse entries and build one script call per entry (pure CPU, no I/O).

        With ``dead_letters`` false (a replay) unusable entries are reported, not re-queued.
        ``future``: entries ``screen`` found with an explicit id ahead of the clock (dead
        letters, reason ``future_id``).
        """
        received = time.perf_counter() if received is None else received
        settings = self.settings
        streams = StreamKeys(settings.stream_prefix, shard)
        now_iso = utc_now_iso()
        context = self.context_arg(int(time.time() * 1000), now_iso)
        plan = Plan(shard, entries, received, dead_letters)
        # The apply call being filled: its keys and arguments, and the entries it answers.
        keys: list[str] = [streams.results, streams.lifecycle]
        argv: list[str | bytes | int] = [context]
        answers: list[int] = []

        def flush() -> None:
            index = len(plan.commands)
            plan.commands.append(APPLY.command(keys, argv))
            for position, entry in enumerate(answers):
                plan.slots[entry] = (index, position)
            del keys[2:], argv[1:], answers[:]

        for raw_id, fields in entries:
            entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            built = None
            reason = "unparseable"
            try:
                if future and entry_id in future:
                    intake: Accepted | Refused | Unusable = Unusable(future[entry_id])
                    reason = "future_id"
                else:
                    intake = parse_entry(fields, shard, settings)
                duration = (time.perf_counter() - received) * 1000
                if not isinstance(intake, Unusable):
                    built = self._build(intake, shard, streams, entry_id, now_iso, duration)
            except Exception as exc:  # one odd entry must not poison its whole batch
                intake = Unusable(f"could not be prepared for applying: {exc!r:.300}")
            if isinstance(intake, Unusable):
                plan.outcomes.append(Outcome(entry_id, "dead", intake.error, reason=reason))
                if dead_letters:
                    args = self.letter_args(streams, entry_id, fields, reason, intake.error, 1)
                    plan.slots.append((len(plan.commands), -1))
                    plan.commands.append(
                        DEAD_LETTER.command([streams.dlq, streams.lifecycle], args)
                    )
                else:
                    plan.slots.append(None)
                continue
            assert built is not None
            command_keys, command_args, outcome = built
            keys += command_keys
            argv.append(len(command_args))
            argv += command_args
            answers.append(len(plan.outcomes))
            plan.outcomes.append(outcome)
            plan.slots.append(None)  # set by flush
            if len(answers) >= self.commands_per_call:
                flush()
        if answers:
            flush()
        return plan

    def finish(self, plan: Plan, replies: Sequence[Any]) -> list[Outcome] | None:
        """Outcomes from a plan's replies; None when the server lacked a script or the apply
        function (restarted without persistence, flushed): load them, and redo the plan."""
        if any(
            isinstance(r, ResponseError) and (str(r).startswith("NOSCRIPT") or APPLY.is_missing(r))
            for r in replies
        ):
            return None
        outcomes = []
        for planned, slot in zip(plan.outcomes, plan.slots, strict=True):
            if slot is None:
                outcomes.append(planned)
                continue
            index, position = slot
            reply = replies[index]
            if position >= 0 and not isinstance(reply, Exception):
                reply = reply[3 * position : 3 * position + 3]  # status, detail, reason
                if reply[0] == b"error":  # this command raised; the others in its call applied
                    reply = ResponseError(reply[1].decode(errors="replace"))
            outcomes.append(self._outcome(planned, reply))
        return outcomes

    async def apply(
        self,
        shard: int,
        entries: Sequence[tuple[bytes | str, Mapping[bytes, bytes]]],
        received: float | None = None,
        *,
        dead_letters: bool = True,
    ) -> list[Outcome]:
        """Apply entries of ``P:lifecycle:{shard}`` in one round trip; one Outcome per entry."""
        if not entries:
            return []
        future = await self.screen(shard, entries)
        plan = self.plan(shard, entries, received, dead_letters=dead_letters, future=future)
        for _attempt in range(3):
            outcomes = self.finish(plan, await self.channel_for(shard).execute(plan.commands))
            if outcomes is not None:
                return outcomes
            await self.ensure_scripts()
        raise RuntimeError(
            "the server keeps forgetting memworker's scripts (SCRIPT FLUSH or FUNCTION FLUSH?)"
        )

    @staticmethod
    def _outcome(planned: Outcome, reply: Any) -> Outcome:
        if isinstance(reply, ResponseError | Exception):
            # A server-wide condition (worker.redis_conditions: full, busy, loading, a failover,
            # a resharding) says nothing about the entry: it did nothing, and is held and
            # retried without counting as a failed delivery.
            moved = is_server_condition(reply)
            return Outcome(
                planned.entry_id,
                "unreachable" if moved else "error",
                str(reply),
                planned.command,
                project_id=planned.project_id,
                session_id=planned.session_id,
                event_id=planned.event_id,
            )
        if planned.status == "dead":
            return planned
        status = reply[0].decode()
        detail = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        reason = reply[2].decode() or None  # '' when the command has no reason
        return Outcome(
            planned.entry_id,
            status,
            detail,
            planned.command,
            reason,
            planned.project_id,
            planned.session_id,
            planned.event_id,
        )

    def _build(
        self,
        intake: Accepted | Refused,
        shard: int,
        streams: StreamKeys,
        entry_id: str,
        now_iso: str,
        duration_ms: float,
    ) -> tuple[list[str], list[str | bytes | int], Outcome]:
        """One command's keys and arguments in an apply call (see apply_command.lua)."""
        settings = self.settings
        if isinstance(intake, Accepted):
            cmd = intake.command
            project_id: str | None = cmd.project_id
            session_id: str | None = cmd.session_id
            event_id = cmd.event_id
            command_type: str | None = cmd.type
            copied: dict[str, Any] = {
                "project_id": project_id,
                "session_id": session_id,
                "agent_instance_id": cmd.agent_instance_id,
                "agent_type_id": cmd.agent_type_id,
                "seq": cmd.seq,
                "correlation_id": cmd.correlation_id,
                "metadata": cmd.metadata,
            }
            if isinstance(cmd, SpawnCommand) and cmd.user_id is not None:  # only when given
                copied["user_id"] = cmd.user_id
            seq: int | None = cmd.seq
            session_known = True
        else:
            raw = intake.raw
            event_id = intake.event_id
            copied = copied_fields(raw, keep_metadata=intake.reason != "limit_exceeded")
            project_id = copied["project_id"]
            session_id = copied["session_id"]
            kind = raw.get("type")
            command_type = kind if isinstance(kind, str) and kind in COMMAND_TYPES else None
            session_known = (
                project_id is not None
                and session_id is not None
                and shard_of(project_id, session_id, settings.shards) == shard
            )
            seq = copied["seq"] if session_known else None
        result_id, record = result_id_and_record(project_id, event_id)
        if session_known and project_id is not None and session_id is not None:
            session = SessionKeys(settings.stream_prefix, shard, project_id, session_id)
        else:
            session = SessionKeys(settings.stream_prefix, shard, _PLACEHOLDER, _PLACEHOLDER)
        # The meta key names the session: the function derives its other keys from it.
        keys = [session.meta]
        prefix = result_head(result_id, event_id, command_type, copied, now_iso, duration_ms)
        argv: list[str | bytes | int] = [
            "",
            entry_id,
            prefix,
            seq if seq is not None else "",
            intake.traceparent or "",
            record,
        ]
        if isinstance(intake, Refused):  # its record gets a key of its own (see the function)
            keys.append(streams.dedupe(project_id or _PLACEHOLDER, event_id))
            argv[5] = b""
            argv[0] = "reject"
            user = intake.spawn_user if session_known else ""  # next to last, as a spawn's
            argv += [intake.reason, intake.detail, user, ""]
        else:
            cmd = intake.command
            argv[0] = cmd.type
            if isinstance(cmd, SpawnCommand):
                ttl = (cmd.ttl_seconds or settings.session_ttl_seconds) * 1000
                argv += [
                    cmd.agent_instance_id,
                    cmd.agent_type_id or "",
                    ttl,
                    len(intake.encoded_state),
                ]
                for key, text in intake.encoded_state:
                    argv += [key, text]
                argv.append(cmd.user_id or "")  # next to last (see spawn in the function)
            elif isinstance(cmd, PauseCommand):
                argv += [
                    cmd.checkpoint_id or default_checkpoint_id(cmd.project_id, event_id),
                    cmd.description or "",
                ]
            elif isinstance(cmd, ResumeCommand):
                argv += [cmd.checkpoint_id or "", "1" if cmd.clear_current else "0"]
            elif isinstance(cmd, TerminateCommand):
                extra = orjson.dumps(
                    {
                        "task_description": cmd.task_description,
                        "lessons_learned": cmd.lessons_learned,
                        "tokens_used": cmd.tokens_used,
                        "importance": cmd.importance,
                    }
                )
                argv += [
                    cmd.outcome,
                    "1" if cmd.consolidate else "0",
                    "1" if cmd.cleanup else "0",
                    b"," + extra[1:-1],
                ]
            # Last, every op: the life this command is for (see apply_command.lua).
            argv.append(life_of(event_id if isinstance(cmd, SpawnCommand) else cmd.spawn_event_id))
        outcome = Outcome(
            entry_id,
            "planned",
            command=command_type,
            project_id=project_id,
            session_id=session_id,
            event_id=event_id,
        )
        return keys, argv, outcome
