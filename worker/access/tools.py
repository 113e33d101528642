"""The tools agents reach memory by, defined once: each ``Tool`` has a name, a description, an
argument model (its JSON Schema is what MCP clients and the OpenAPI document show) and a
function that calls ``worker.Memory`` or ``WorkingMemory``. ``memworker mcp`` and
``memworker serve`` only list and call these (``call``), with no logic of their own.

``recall``'s ``min_score`` is a floor on relevance: a match is kept when its cosine similarity
to the query (``vector_score``, −1..1) is at least ``min_score``, or, while it has no vector
(not embedded yet, or no vector search on the project), when words matched it
(``bm25_score`` set). The fused ``score`` only orders matches, so it is not compared.
Without ``min_score`` nothing is dropped; a query nothing matches returns the newest episodes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from schemas.inputs import EARLIEST, LATEST
from schemas.limits import MAX_REMEMBER_BATCH
from worker.access.tool_arguments import (
    AddFactArguments,
    Arguments,
    BlockArguments,
    ForgetArguments,
    RecallArguments,
    RecallFactsArguments,
    RememberArguments,
    RememberManyArguments,
    SessionMessagesArguments,
    UserArguments,
    WmGetArguments,
    WmSetArguments,
)
from worker.logs import get_logger
from worker.memory.api import validate_key
from worker.metrics import ACCESS_CALLS, ACCESS_SECONDS
from worker.user_memory.models import Episode, Fact

if TYPE_CHECKING:
    # The scope (connections, the Memory and SQLAlchemy behind it) loads with the first call,
    # not with the tools' list: an MCP client's initialize and list_tools need none of it.
    from worker.access.scope import Access

log = get_logger("worker.access")


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


async def remember(access: Access, a: RememberArguments) -> Any:
    fields: dict[str, Any] = {"id": a.id, "occurred_at": a.occurred_at}
    episode = Episode(
        session_id=a.session_id,
        user_id=access.user(a.user_id),
        input=a.input,
        output=a.output,
        **{k: v for k, v in fields.items() if v is not None},
    )
    return {"id": await access.memory.remember(episode)}


async def remember_many(access: Access, a: RememberManyArguments) -> Any:
    user = access.user(a.user_id)
    if len(a.turns) > MAX_REMEMBER_BATCH:
        from worker.user_memory.writes import BatchTooLargeError

        raise BatchTooLargeError(
            f"turns: {len(a.turns)} turns in one batch; the most is {MAX_REMEMBER_BATCH}"
            " (MAX_REMEMBER_BATCH): send smaller batches"
        )
    episodes = []
    for turn in a.turns:
        fields: dict[str, Any] = {"id": turn.id, "occurred_at": turn.occurred_at}
        episodes.append(
            Episode(
                session_id=turn.session_id,
                user_id=user,
                input=turn.input,
                output=turn.output,
                **{k: v for k, v in fields.items() if v is not None},
            )
        )
    return {"ids": await access.memory.remember_many(episodes)}


def relevant(match: Any, min_score: float | None) -> bool:
    """Whether a match reaches ``min_score`` (module doc)."""
    if min_score is None:
        return True
    if match.vector_score is not None:
        return bool(match.vector_score >= min_score)
    return match.bm25_score is not None and match.bm25_score > 0


async def recall(access: Access, a: RecallArguments) -> Any:
    if a.since is not None and a.until is not None and a.since > a.until:
        from worker.access.scope import AccessError

        raise AccessError(f"since {a.since.isoformat()} is after until {a.until.isoformat()}")
    time_range = None
    if a.since is not None or a.until is not None:
        time_range = (a.since or EARLIEST, a.until or LATEST)
    matches = await access.memory.recall_scored(
        a.query, limit=a.limit, time_range=time_range, user_id=access.user(a.user_id)
    )
    return [_dump(m) for m in matches if relevant(m, a.min_score)]


async def recall_facts(access: Access, a: RecallFactsArguments) -> Any:
    found = await access.memory.recall_facts(
        a.query, limit=a.limit, valid_at=a.valid_at, user_id=access.user(a.user_id)
    )
    return [_dump(f) for f in found]


async def recall_facts_scored(access: Access, a: RecallFactsArguments) -> Any:
    found = await access.memory.recall_facts_scored(
        a.query, limit=a.limit, valid_at=a.valid_at, user_id=access.user(a.user_id)
    )
    return [_dump(m) for m in found]


async def add_fact(access: Access, a: AddFactArguments) -> Any:
    user = access.user(a.user_id)
    fields: dict[str, Any] = {} if a.valid_from is None else {"valid_from": a.valid_from}
    fact = Fact(
        user_id=user,
        subject=a.subject,
        predicate=a.predicate,
        object=a.object,
        confidence=a.confidence,
        **fields,
    )
    return {"id": await access.memory.facts.append(fact)}  # the stored one's: same claim


async def working(access: Access, a: UserArguments) -> Any:
    return [_dump(b) for b in await access.memory.working(user_id=access.user(a.user_id))]


async def update_block(access: Access, a: BlockArguments) -> Any:
    await access.memory.update_block(a.name, a.content, user_id=access.user(a.user_id))
    return {"ok": True}


async def append_block(access: Access, a: BlockArguments) -> Any:
    await access.memory.append_block(a.name, a.content, user_id=access.user(a.user_id))
    return {"ok": True}


async def session_messages(access: Access, a: SessionMessagesArguments) -> Any:
    found = await access.memory.session_messages(
        a.session_id, user_id=access.user(a.user_id), limit=a.limit
    )
    return [_dump(m) for m in found]


async def profile(access: Access, a: UserArguments) -> Any:
    return _dump(await access.memory.profile(user_id=access.user(a.user_id)))


async def forget(access: Access, a: ForgetArguments) -> Any:
    from worker.access.scope import AccessError

    if a.anonymous and a.user_id is not None:
        raise AccessError(
            "anonymous: true forgets the anonymous bucket (data of no user); it cannot be "
            f"given with user_id ({a.user_id}); nothing was forgotten"
        )
    if a.anonymous and access.user_id is not None:
        raise AccessError(
            f"anonymous: this server serves user {access.user_id} only: it may not forget the "
            "anonymous bucket; nothing was forgotten",
            403,
        )
    if a.session_id is None and a.user_id is None and not a.anonymous:
        raise AccessError(
            "forget needs a selector: user_id (everything of that user), anonymous: true "
            "(everything stored without a user) or session_id (that session's episodes); "
            "nothing was forgotten"
        )
    chosen = a.model_dump(include={"session_id", "before", "since"})  # ids and times, checked
    removed = await access.memory.forget(user_id=access.user(a.user_id), **chosen)
    return {"forgotten": removed}


async def wm_get(access: Access, a: WmGetArguments) -> Any:
    if a.key is not None:
        validate_key(a.key)
    async with await access.working_memory(a.session_id) as memory:
        if a.key is None:
            return {"variables": await memory.get_all()}
        missing = object()
        value = await memory.get(a.key, missing)
        if value is missing:
            return {"key": a.key, "found": False, "value": None}
        return {"key": a.key, "found": True, "value": value}


async def wm_set(access: Access, a: WmSetArguments) -> Any:
    validate_key(a.key)  # every argument before the session is looked up
    async with await access.working_memory(a.session_id) as memory:
        await memory.set(a.key, a.value, a.ttl_seconds)
    return {"ok": True}


@dataclass(frozen=True)
class Tool:
    """One tool: ``name``, ``description`` (what an agent reads to choose it), ``arguments``
    (its model: the JSON Schema), ``run`` (the library call) and whether it only reads."""

    name: str
    description: str
    arguments: type[Arguments]
    run: Callable[[Access, Any], Awaitable[Any]]
    read_only: bool

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments."""
        return self.arguments.model_json_schema()


TOOLS: tuple[Tool, ...] = (
    Tool(
        "remember",
        "Store one conversation turn (what the user said, what the agent answered) in the "
        "user's long-term memory; returns its id. Recallable by words at once, by meaning once "
        "indexed.",
        RememberArguments,
        remember,
        False,
    ),
    Tool(
        "remember_many",
        "Store a batch of conversation turns (up to "
        f"{MAX_REMEMBER_BATCH}, one user) in one call, e.g. to import history; returns their "
        "ids in order. A batch with a bad turn is refused whole, naming its index.",
        RememberManyArguments,
        remember_many,
        False,
    ),
    Tool(
        "recall",
        "The user's past turns and sessions best matching a query (words and meaning fused), "
        "best first, with their scores; optionally only those at least min_score relevant, "
        "and within a time range (since, until).",
        RecallArguments,
        recall,
        True,
    ),
    Tool(
        "recall_facts",
        "The user's facts (subject, predicate, object, valid from/until) best matching a "
        "query, optionally only those true at valid_at.",
        RecallFactsArguments,
        recall_facts,
        True,
    ),
    Tool(
        "recall_facts_scored",
        "recall_facts' facts, in its order, each with its scores: score (the fused score that "
        "orders them: reciprocal rank fusion of the rank by words and by meaning), "
        "vector_score (the cosine to the query, -1..1; null: no vector yet) and word_score "
        "(the full-text rank; null: no word of the query in it).",
        RecallFactsArguments,
        recall_facts_scored,
        True,
    ),
    Tool(
        "add_fact",
        "Record a fact about the user (subject, predicate, object); a contradicting one is "
        "superseded from valid_from on; the same claim twice is one fact. Returns its id.",
        AddFactArguments,
        add_fact,
        False,
    ),
    Tool(
        "working",
        "The user's pinned memory blocks (name, content), in pin order: what to keep in view.",
        UserArguments,
        working,
        True,
    ),
    Tool(
        "update_block",
        "Replace a pinned block's content (a new block takes the next pin slot).",
        BlockArguments,
        update_block,
        False,
    ),
    Tool(
        "append_block",
        "Append text to a pinned block (a new block takes the next pin slot).",
        BlockArguments,
        append_block,
        False,
    ),
    Tool(
        "session_messages",
        "A session's most recent turns as messages (user, assistant), oldest first.",
        SessionMessagesArguments,
        session_messages,
        True,
    ),
    Tool(
        "profile",
        "The user's profile: episode and fact counts, last seen, recent sessions, the ten "
        "most recently recorded facts.",
        UserArguments,
        profile,
        True,
    ),
    Tool(
        "forget",
        "Forget a user's memory everywhere it is kept: all of it (user_id), all of the "
        "anonymous bucket's (anonymous: true), or one session's episodes (session_id), "
        "optionally only what is older than 'before'. Refused without user_id, anonymous or "
        "session_id. Returns how many episodes, facts and blocks went.",
        ForgetArguments,
        forget,
        False,
    ),
    Tool(
        "wm_get",
        "A live agent session's working memory: one variable (key) or all of them.",
        WmGetArguments,
        wm_get,
        True,
    ),
    Tool(
        "wm_set",
        "Set a variable in a live agent session's working memory (any JSON value).",
        WmSetArguments,
        wm_set,
        False,
    ),
)
BY_NAME = {tool.name: tool for tool in TOOLS}


async def call(access: Access, name: str, arguments: dict[str, Any] | None) -> Any:
    """Validate ``arguments`` for the tool ``name`` and run it; its result as JSON values.
    Raises ``AccessError`` (unknown tool) or ``ValidationError`` (bad arguments): bad input,
    to be reported with ``scope.failure``."""
    tool = BY_NAME.get(name)
    if tool is None:
        from worker.access.scope import AccessError

        raise AccessError(f"no tool {name!r}: the tools are {', '.join(BY_NAME)}", 404)
    parsed = tool.arguments.model_validate(arguments or {})
    return await tool.run(access, parsed)


async def invoke(
    access: Access, server: str, name: str, arguments: dict[str, Any] | Arguments | None
) -> tuple[int, Any]:
    """``call`` as both servers answer: (200, the result) or (the status, ``{"error": one
    line}``), counted in ``memworker_access_calls_total``. Nothing raised reaches a client:
    an unexpected failure is logged here and answered with its one line."""
    tool = BY_NAME.get(name)
    label = name if tool is not None else "unknown"
    started = time.perf_counter()
    try:
        if isinstance(arguments, Arguments) and tool is not None:
            result: Any = await tool.run(access, arguments)
        else:
            result = await call(access, name, arguments)  # type: ignore[arg-type]
        status = 200
    except Exception as exc:
        from worker.access.scope import failure

        status, line = failure(exc)
        if status >= 500:
            log.warning("tool call failed", server=server, tool=name, error=line)
        result = {"error": line}
    ACCESS_CALLS.labels(server, label, str(status)).inc()
    ACCESS_SECONDS.labels(server, label).observe(time.perf_counter() - started)
    return status, result
