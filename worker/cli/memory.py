"""Memory: a session's working memory (``inspect``) and the long-term episodes in Postgres
(``episodes``, ``recall``, ``remember``, ``reindex``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from redis.asyncio import Redis

from worker.cli.common import (
    cell,
    check_ids,
    database_engine,
    fail,
    json_shown,
    new_table,
    out,
    run_async,
    settings_from_env,
    with_redis,
)
from worker.ids import InvalidIdError, validate_id
from worker.logs import configure_logging
from worker.settings import Settings

T = TypeVar("T")


def inspect(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[str, typer.Option("--session", "-s")],
) -> None:
    """Show one session's working memory, state and checkpoints (JSON)."""
    settings = settings_from_env()
    check_ids(project_id=project, session_id=session)

    async def go(redis: Redis) -> dict[str, Any]:
        from worker.ops.inspection import inspect_session

        return await inspect_session(redis, settings, project, session)

    view = run_async(with_redis(settings, go))
    if not view["exists"]:
        fail(f"no session {project}/{session} (never spawned, expired, or cleaned up)")
    print(json_shown(json.dumps(view, indent=2, default=str, ensure_ascii=False)))


episodes_app = typer.Typer(
    help="Read the episodes the consolidator stored in Postgres.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


async def _with_episode_store(settings: Settings, use: Callable[[Any], Awaitable[T]]) -> T:
    from worker.episodes.store import EpisodeStore

    async with database_engine(settings) as engine:
        return await use(EpisodeStore(engine))


def what_it_was(episode: dict[str, Any]) -> str:
    """A session's episode by its task; a turn of user memory by what was said (input → output)."""
    if episode.get("turn_id") is not None:
        return f"{episode.get('input') or ''} → {episode.get('output') or ''}"
    return str(episode.get("task_description") or "")


@episodes_app.command("list")
def episodes_list(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[str | None, typer.Option("--session", "-s")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """A project's episodes, newest first (one per finished life of a session id)."""
    check_ids(project_id=project, **({"session_id": session} if session else {}))
    settings = settings_from_env()

    async def go(store: Any) -> list[Any]:
        return list(await store.list_episodes(project, session_id=session, limit=limit))

    rows = run_async(_with_episode_store(settings, go))
    if as_json:
        print(json_shown(json.dumps([r.to_dict() for r in rows], indent=2, ensure_ascii=False)))
        return
    table = new_table(
        "episode id", "session", "outcome", "finished", "task (a turn: input → output)"
    )
    for r in rows:
        table.add_row(
            str(r.id),
            cell(r.session_id),
            cell(r.outcome),
            r.occurred_at.isoformat(timespec="seconds"),
            cell(what_it_was(r.to_dict())[:60]),
        )
    out.print(table)


@episodes_app.command("show")
def episodes_show(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[
        str | None,
        typer.Option("--session", "-s", help="The session's episode (its latest life's)."),
    ] = None,
    episode_id: Annotated[
        str | None, typer.Argument(help="An episode id (from `episodes list`).")
    ] = None,
) -> None:
    """One episode in full (JSON): lessons, context summary, snapshot of working memory."""
    if session is None and episode_id is None:
        raise typer.BadParameter("give an EPISODE_ID or --session (`episodes list` shows both)")
    if session is not None and episode_id is not None:
        raise typer.BadParameter("give an EPISODE_ID or --session, not both")
    check_ids(project_id=project, **({"session_id": session} if session else {}))
    settings = settings_from_env()

    async def go(store: Any) -> tuple[Any, Any]:
        if episode_id is not None:
            return await store.get_episode(project, episode_id), None
        found = await store.list_episodes(project, session_id=session, limit=1)
        if found:
            return found[0], None
        from worker.db.erasures import session_erasure

        async with store.engine.connect() as conn:
            return None, await session_erasure(conn, project, session)

    episode, erasure = run_async(_with_episode_store(settings, go))
    if erasure is not None:
        named, cutoff = erasure
        when = cutoff.isoformat(timespec="seconds")
        fail(
            f"no episode for session {project}/{session}: it was forgotten (memworker forget "
            f"-s {session}, {when})"
            if named
            else f"no episode for session {project}/{session}: the project's data before "
            f"{when} was forgotten (memworker forget); a session of that time is gone"
        )
    if episode is None:
        which = f"session {project}/{session}" if session else f"id {episode_id} in {project}"
        fail(
            f"no episode for {which} (not terminated yet, consolidate: false, or not consolidated)"
        )
    print(json_shown(json.dumps(episode.to_dict(), indent=2, ensure_ascii=False)))


def recall(
    query: Annotated[str, typer.Argument(help="What to recall, in your own words.")],
    project: Annotated[str, typer.Option("--project", "-p")],
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many episodes.")] = 10,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="JSON array, best first, with similarity and components."),
    ] = False,
    user: Annotated[
        str | None, typer.Option("--user", "-u", help="Only this user's episodes (user_id).")
    ] = None,
    min_score: Annotated[
        float | None,
        typer.Option(
            min=-1.0,
            max=1.0,
            help="Only episodes whose similarity (cosine, -1..1) is at least this; an episode "
            "without a vector is left out.",
        ),
    ] = None,
    agent_type: Annotated[
        str | None, typer.Option("--agent-type", help="Only this agent type's episodes.")
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(help="Only this outcome (success, failure, partial, abandoned; turn)."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Episodes from this time (RFC 3339, or ago: 90m, 36h, 7d)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Episodes before this time (RFC 3339, or ago).")
    ] = None,
) -> None:
    """Recall a project's episodes by meaning and words (hybrid: vectors + full-text)."""
    from worker.consolidation.replay import parse_instant

    settings = settings_from_env()
    try:
        validate_id(project, "project_id")
        if user is not None:
            validate_id(user, "user_id")
    except InvalidIdError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if outcome is not None:
        from typing import get_args

        from schemas.commands import Outcome
        from worker.db.models import TURN_OUTCOME

        known = (*get_args(Outcome), TURN_OUTCOME)
        if outcome not in known:
            raise typer.BadParameter(f"must be one of {', '.join(known)}", param_hint="--outcome")
    instants = {}
    for hint, raw in (("--since", since), ("--until", until)):
        try:
            instants[hint] = None if raw is None else parse_instant(raw)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=hint) from exc
    configure_logging(settings.log_level, settings.log_json)

    async def go() -> list[dict[str, Any]]:
        from worker.episodes.embedding import embedder_from_settings
        from worker.episodes.store import EpisodeStore

        async with database_engine(settings) as engine:
            store = EpisodeStore(
                engine,
                embedder_from_settings(settings),
                exact_below=settings.recall_exact_below,
            )
            hits = await store.recall(
                project,
                query,
                limit,
                user_id=user,
                agent_type_id=agent_type,
                outcome=outcome,
                since=instants["--since"],
                until=instants["--until"],
                min_score=min_score,
            )
            return [hit.to_dict() for hit in hits]

    hits = run_async(go())
    if as_json:
        print(json_shown(json.dumps(hits, indent=2, ensure_ascii=False)))
        return
    table = new_table(
        "score",
        "similarity",
        "occurred at",
        "outcome",
        "session",
        "task (a turn: input → output)",
        "lessons",
    )
    for hit in hits:
        table.add_row(
            f"{hit['score']:.3f}",
            "-" if hit["similarity"] is None else f"{hit['similarity']:.3f}",
            hit["occurred_at"][:19],
            cell(hit["outcome"]),
            cell(hit["session_id"]),
            cell(what_it_was(hit)),
            cell("; ".join(str(lesson) for lesson in hit["lessons_learned"])),
        )
    out.print(table)


def reindex(
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Only this project.")
    ] = None,
    keep_old: Annotated[
        bool,
        typer.Option(
            "--keep-old", help="Keep other models' vectors (a later run without it deletes them)."
        ),
    ] = False,
) -> None:
    """Embed episodes that have no vector of the configured model (a backfill, or a new model).

    A new model's vectors are written beside the old ones, so recall by the old model keeps
    working while this runs; once every episode has its new vector, the old ones are deleted
    (unless --keep-old)."""
    settings = settings_from_env()
    configure_logging(settings.log_level, settings.log_json)

    async def go() -> tuple[int, int]:
        from worker.db.vectors import drop_other_models
        from worker.episodes.embedding import embedder_from_settings
        from worker.episodes.vectorising import reindex as backfill

        async with database_engine(settings) as engine:
            embedder = embedder_from_settings(settings)
            count = await backfill(engine, embedder, project_id=project)
            if keep_old:
                return count, 0
            async with engine.begin() as conn:
                return count, await drop_other_models(conn, embedder.name, project)

    from worker.episodes.embedding import EmbeddingError

    try:
        count, dropped = run_async(go())
    except EmbeddingError as exc:
        fail(str(exc))
    dropped_line = f"; deleted {dropped} vectors of other models" if dropped else ""
    out.print(f"embedded {count} episodes{dropped_line}")


def remember(
    project: Annotated[str, typer.Option("--project", "-p")],
    memory_id: Annotated[str, typer.Option("--id", help="Your id: remembering twice is once.")],
    task: Annotated[str, typer.Option("--task", help="What the episode was about.")],
    lesson: Annotated[list[str] | None, typer.Option("--lesson", help="A lesson (repeat).")] = None,
    outcome: Annotated[str, typer.Option(help="success, failure, partial, abandoned.")] = "success",
    importance: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.5,
) -> None:
    """Write an episode directly (no session needed); it is announced and indexed."""
    settings = settings_from_env()

    async def go(redis: Redis) -> Any:
        from worker.episodes.remember import remember as store

        async with database_engine(settings) as engine:
            return await store(
                engine,
                redis,
                settings.stream_prefix,
                project,
                memory_id,
                task_description=task,
                lessons_learned=lesson or [],
                outcome=outcome,
                importance=importance,
            )

    try:
        remembered = run_async(with_redis(settings, go))
    except (ValueError, InvalidIdError) as exc:
        fail(str(exc))
    out.print(f"episode {remembered.episode_id}")
