"""What a consumer group's handler is given and gives back: entries, outcomes, the protocol.

``GroupHandler`` is all a group supplies to ``worker.consumers.loop.GroupConsumer``: the group
and its streams, the DLQ of a stream, how to prepare a batch (``prepare``: parse, build rows; no
I/O needed) and how to finish it (``finish``: store it, and say which entries are done,
rejected or failed), which exceptions mean "storage unavailable", and how to check the
storage. A minimal handler, printing each entry::

    class Printer:
        group = "printer"
        streams = ("demo:results:{0}",)
        storage_errors: tuple[type[BaseException], ...] = ()
        failure_reason = "print_failed"

        def dlq_stream(self, stream: str) -> str:
            return "demo:dlq:{0}"

        async def prepare(self, entries: Sequence[StreamEntry]) -> Sequence[StreamEntry]:
            return entries

        async def finish(self, batch: Sequence[StreamEntry]) -> BatchOutcome:
            outcome = BatchOutcome()
            for entry in batch:
                if b"data" not in entry.fields and "data" not in entry.fields:
                    outcome.rejected.append(Rejection(entry, "unparseable", "no 'data'"))
                    continue
                print(entry.entry_id, entry.fields)
                outcome.done.append(entry)
            return outcome

        async def check_storage(self) -> None:
            pass

    await GroupConsumer(redis, Printer()).run(stop)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar


class StorageUnavailableError(RuntimeError):
    """The handler's storage does not answer; nothing was acknowledged, the batch is retried."""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One stream entry as read: field names are text unless the handler keeps them raw."""

    stream: str
    entry_id: str
    fields: dict[Any, Any]


@dataclass(frozen=True, slots=True)
class Rejection:
    """An entry that can never be handled: dead-lettered at once with ``reason``."""

    entry: StreamEntry
    reason: str
    error: str


@dataclass(frozen=True, slots=True)
class Failure:
    """An entry whose handling failed this time: retried, dead-lettered after the cap.
    ``context`` is logged with it (ids that help a person find it)."""

    entry: StreamEntry
    error: str
    context: Mapping[str, Any] = field(default_factory=dict)
    exc: BaseException | None = None
    """The exception, if any: a server-wide Redis condition or a storage error here is an
    outage, not the entry's failure (the batch is retried and no attempt is counted)."""


@dataclass(slots=True)
class BatchOutcome:
    """What became of a batch. The handler fills ``done`` (stored: the loop acknowledges
    them), ``rejected`` and ``failed``; the loop fills ``dead_lettered`` and ``retrying``."""

    done: list[StreamEntry] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    dead_lettered: int = 0
    retrying: list[StreamEntry] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Entries acknowledged: done or dead-lettered."""
        return len(self.done) + self.dead_lettered


B = TypeVar("B")


class GroupHandler(Protocol[B]):
    """What a consumer group does with its entries (see the module docstring)."""

    @property
    def group(self) -> str: ...

    @property
    def streams(self) -> Sequence[str]: ...

    @property
    def storage_errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions of ``finish``/``check_storage`` that mean "storage unavailable"."""
        ...

    @property
    def failure_reason(self) -> str:
        """The DLQ ``reason`` of an entry that failed ``max_attempts`` times."""
        ...

    def dlq_stream(self, stream: str) -> str: ...

    async def prepare(self, entries: Sequence[StreamEntry]) -> B:
        """Turn entries (each with fields) into a batch; must not raise for a bad entry."""
        ...

    async def finish(self, batch: B) -> BatchOutcome:
        """Store the batch; raise one of ``storage_errors`` if the storage is unavailable."""
        ...

    async def check_storage(self) -> None:
        """Raise one of ``storage_errors`` unless the storage can be used now."""
        ...


# Optional members a handler may define (read with ``getattr``, so the protocol stays small):
#   acknowledges: bool = False -- the handler acknowledges ``done`` entries itself (the
#       lifecycle's apply function XACKs atomically with the effect); the loop acks nothing.
#   raw_fields: bool = False -- entries keep the field names Redis returned (bytes), not
#       decoded to text: the lifecycle hands them to its apply function as they are.
#   async def reclaimed(self, stream: str, entries: Sequence[StreamEntry]) -> Collection[str]
#       -- called with entries just taken over from another consumer, before they are handled;
#       returns the ids of those it disposed of itself (dead-lettered): they are not handled.
