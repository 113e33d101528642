"""``memworker memory …``: a user's memory (``worker.Memory``) from the command line: pinned
blocks, recall of turns and sessions, facts, the profile and the export.

Every subcommand takes ``--user`` (none: the anonymous bucket, said in one line on stderr) and
``--project`` (default: ``MEMWORKER_DEFAULT_PROJECT``), and runs the same code as the Python
API. Blocks, turns and facts live in Postgres; a write also publishes its change event on
``P:changes:{i}`` (one left owed in Postgres when Redis is away, as ``Memory`` does).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import orjson
import typer

from schemas.inputs import EARLIEST, LATEST
from worker.cli.common import (
    cell,
    check_ids,
    check_out,
    check_write_ids,
    fail,
    json_shown,
    new_table,
    out,
    run_async,
    settings_from_env,
    shown,
    write_private,
)
from worker.logs import configure_logging

if TYPE_CHECKING:
    from worker.settings import Settings
    from worker.user_memory.memory import Memory

T = TypeVar("T")

memory_app = typer.Typer(
    help="A user's memory (worker.Memory): pinned blocks, recall of turns and sessions, facts, "
    "profile and export, in Postgres.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

UserOption = Annotated[
    str | None,
    typer.Option(
        "--user", "-u", help="The user (user_id); without it, the anonymous bucket (no user id)."
    ),
]
ProjectOption = Annotated[
    str | None,
    typer.Option("--project", "-p", help="The project (default: MEMWORKER_DEFAULT_PROJECT)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON instead of a table.")]


def _scope(project: str | None, user: str | None) -> tuple[Settings, str]:
    """The settings and the project; ids checked (usage error, exit status 2); the anonymous
    bucket announced on stderr."""
    settings = settings_from_env()
    project_id = settings.default_project if project is None else project
    check_ids(project_id=project_id, **({"user_id": user} if user is not None else {}))
    if user is None:
        print(
            f"memworker: no --user: using the anonymous bucket of project {project_id} "
            "(what was stored without a user id)",
            file=sys.stderr,
        )
    configure_logging(settings.log_level, settings.log_json)
    return settings, project_id


def _writing(project_id: str, user: str | None) -> None:
    """A write names its project and user by the write rule (usage error): not ``.`` or ``..``
    alone, which a link drops (reading and exporting what an older version stored under them
    still works)."""
    check_write_ids(project_id=project_id, **({"user_id": user} if user is not None else {}))


def _with_memory(settings: Settings, project: str, use: Callable[[Memory], Awaitable[T]]) -> T:
    """Run ``use`` on a ``Memory`` of ``project`` whose connections this command owns: a write
    publishes its change event itself (``Memory`` does, once), so nothing is flushed again on
    the way out, and a Postgres that failed is not asked again (one error line, not two)."""

    async def go() -> T:
        from worker.connections import client_for
        from worker.db.engine import create_database_engine
        from worker.user_memory.memory import Memory
        from worker.user_memory.models import IsolationWarning

        engine = create_database_engine(settings.database_url, pool=False)
        redis: Any = client_for(settings)
        try:
            with warnings.catch_warnings():
                # The anonymous bucket is said on stderr already, in one line.
                warnings.simplefilter("ignore", IsolationWarning)
                memory = Memory(project, settings=settings, engine=engine, redis=redis)
                return await use(memory)
        finally:
            await redis.aclose()
            await engine.dispose()

    return run_async(go())


def _instant(raw: str | None, hint: str) -> datetime | None:
    if raw is None:
        return None
    from worker.consolidation.replay import parse_instant

    try:
        return parse_instant(raw)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from exc


def _print_json(value: Any) -> None:
    sys.stdout.write(json_shown(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()) + "\n")


def _when(value: datetime | None) -> str:
    return "" if value is None else value.isoformat(timespec="seconds")


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


@memory_app.command("blocks")
def blocks(
    user: UserOption = None,
    project: ProjectOption = None,
    set_name: Annotated[
        str | None,
        typer.Option("--set", metavar="NAME", help="Replace this block's content (--content)."),
    ] = None,
    append_name: Annotated[
        str | None,
        typer.Option("--append", metavar="NAME", help="Append --content to this block."),
    ] = None,
    content: Annotated[
        str | None,
        typer.Option(help="The text for --set or --append ('-': read it from stdin)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The user's pinned blocks in pin order; --set or --append NAME --content TEXT writes one
    (a new block takes the next pin slot)."""
    if set_name is not None and append_name is not None:
        raise typer.BadParameter("give --set or --append, not both")
    name = set_name if set_name is not None else append_name
    if name is None and content is not None:
        raise typer.BadParameter("--content goes with --set NAME or --append NAME")
    if name is not None and content is None:
        raise typer.BadParameter(f"--{'set' if set_name is not None else 'append'} needs --content")
    if name is not None and not name.strip():
        raise typer.BadParameter(
            "a block needs a name", param_hint="--set" if set_name is not None else "--append"
        )
    if content == "-":
        # As the shell's $(…) reads it: a line's end is not part of the text (echo, heredocs).
        content = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    settings, project_id = _scope(project, user)
    if name is not None:
        _writing(project_id, user)

    async def go(memory: Memory) -> list[Any]:
        if name is not None and content is not None:
            if set_name is not None:
                await memory.update_block(name, content, user_id=user)
            else:
                await memory.append_block(name, content, user_id=user)
        return list(await memory.working(user_id=user))

    try:
        found = _with_memory(settings, project_id, go)
    except (ValueError, TypeError) as exc:  # too large, no name: nothing was changed
        fail(str(exc))
    if name is not None:
        [block] = [b for b in found if b.name == name]
        if as_json:
            _print_json(block.model_dump(mode="json"))
        else:
            verb = "set" if set_name is not None else "appended to"
            out.print(
                f"{verb} block {name!r} (slot {block.pinned_order}, "
                f"{len(block.content.encode()):,} bytes)",
                highlight=False,
                markup=False,
            )
        return
    if as_json:
        _print_json([b.model_dump(mode="json") for b in found])
        return
    table = new_table("slot", "name", "bytes", "updated", "content")
    for b in found:
        table.add_row(
            str(b.pinned_order),
            cell(b.name),
            f"{len(b.content.encode()):,}",
            _when(b.updated_at),
            cell(b.content),
        )
    out.print(table, markup=False)


@memory_app.command("recall")
def recall(
    query: Annotated[str, typer.Argument(help="What to recall ('': the most recent).")],
    user: UserOption = None,
    project: ProjectOption = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many episodes.")] = 10,
    since: Annotated[
        str | None,
        typer.Option(help="Only episodes at or after this (RFC 3339, or ago: 90m, 36h, 7d)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Only episodes at or before this (RFC 3339, or ago: 90m, 36h, 7d)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON array, best first.")] = False,
) -> None:
    """The user's episodes (turns and finished sessions) best matching QUERY, with their
    scores (words and meaning fused)."""
    lo, hi = _instant(since, "--since"), _instant(until, "--until")
    if lo is not None and hi is not None and lo > hi:
        raise typer.BadParameter(f"--since {since} is after --until {until}")
    time_range = None if lo is None and hi is None else (lo or EARLIEST, hi or LATEST)
    settings, project_id = _scope(project, user)

    async def go(memory: Memory) -> list[Any]:
        return list(
            await memory.recall_scored(query, limit=limit, time_range=time_range, user_id=user)
        )

    matches = _with_memory(settings, project_id, go)
    if as_json:
        _print_json([m.model_dump(mode="json") for m in matches])
        return
    table = new_table("score", "bm25", "vector", "occurred at", "session", "input", "output")
    for m in matches:
        e = m.episode
        table.add_row(
            _score(m.score),
            _score(m.bm25_score),
            _score(m.vector_score),
            _when(e.occurred_at),
            cell(e.session_id),
            cell(e.input),
            cell(e.output),
        )
    out.print(table, markup=False)


@memory_app.command("facts")
def facts(
    query: Annotated[
        str, typer.Argument(help="Words to match (none: the most recently recorded).")
    ] = "",
    user: UserOption = None,
    project: ProjectOption = None,
    valid_at: Annotated[
        str | None,
        typer.Option(help="Only facts valid at this time (RFC 3339, or ago: 90m, 36h, 7d)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="How many facts.")] = 10,
    add: Annotated[
        tuple[str, str, str] | None,
        typer.Option(
            "--add",
            metavar="SUBJECT PREDICATE OBJECT",
            help="Add this fact, valid from now (it supersedes a contradicting one).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The user's facts best matching QUERY (valid at --valid-at); --add SUBJECT PREDICATE
    OBJECT adds one."""
    when = _instant(valid_at, "--valid-at")
    if add is not None and (query or when is not None):
        raise typer.BadParameter("--add takes no QUERY and no --valid-at")
    if add is not None and not all(part.strip() for part in add):
        raise typer.BadParameter(
            "SUBJECT, PREDICATE and OBJECT must not be empty", param_hint="--add"
        )
    settings, project_id = _scope(project, user)
    if add is not None:
        _writing(project_id, user)

    async def go(memory: Memory) -> list[Any]:
        if add is not None:
            from worker.user_memory.models import Fact

            subject, predicate, object_ = add
            fact = Fact(user_id=user, subject=subject, predicate=predicate, object=object_)
            stored = await memory.facts.append(fact)  # the stored one's id: same claim
            same = await memory.facts.query(
                subject=fact.subject,
                predicate=fact.predicate,
                object_=fact.object,
                user_id=user,
                limit=1_000,
            )
            return [f for f in same if f.id == stored]
        return list(await memory.recall_facts(query, limit=limit, valid_at=when, user_id=user))

    found = _with_memory(settings, project_id, go)
    if add is not None and not as_json:
        [fact] = found
        out.print(shown(f"fact {fact.id}: {fact.format()}"), highlight=False, markup=False)
        return
    if as_json:
        if add is not None:
            _print_json(found[0].model_dump(mode="json"))
        else:
            _print_json([f.model_dump(mode="json") for f in found])
        return
    table = new_table("subject", "predicate", "object", "confidence", "valid from", "until", "id")
    for f in found:
        table.add_row(
            cell(f.subject),
            cell(f.predicate),
            cell(f.object),
            f"{f.confidence:.2f}",
            _when(f.valid_from),
            _when(f.valid_until),
            cell(f.id),
        )
    out.print(table, markup=False)


@memory_app.command("profile")
def profile(user: UserOption = None, project: ProjectOption = None) -> None:
    """The user's profile (JSON): episode and fact counts, last seen, recent sessions, the ten
    most recently recorded facts."""
    settings, project_id = _scope(project, user)

    async def go(memory: Memory) -> Any:
        return await memory.profile(user_id=user)

    _print_json(_with_memory(settings, project_id, go).model_dump(mode="json"))


@memory_app.command("export")
def export(
    user: UserOption = None,
    project: ProjectOption = None,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the JSON here instead of stdout (a new file, mode 0600; never through "
            "a symbolic link).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="With --out: overwrite the file if it exists.")
    ] = False,
) -> None:
    """Everything kept about the user in the project (JSON): episodes oldest first, facts,
    blocks."""
    settings, project_id = _scope(project, user)
    if out_file is not None:
        check_out(out_file, force)

    async def go(memory: Memory) -> Any:
        return await memory.export(user_id=user)

    exported = _with_memory(settings, project_id, go)
    document = orjson.dumps(exported.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n"
    if out_file is None:
        document = json_shown(document.decode()).encode()
        sys.stdout.buffer.write(document)
        sys.stdout.flush()
        return
    write_private(out_file, document, force)
