"""``memworker forget`` and ``memworker export``: the data-subject request in two commands.

Both take the same selectors (``--project``, narrowed by ``--user``, ``--session`` and
``--before``; forget also ``--since``, with ``--before``: a range) and run the same code as
the Python API (``EpisodeStore.forget``/``export``: ``worker.erasure.forget``,
``worker.erasure.export``). Every selector is checked before anything is touched: a bad one
exits 2 naming it.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import orjson
import typer
from redis.asyncio import Redis

from worker.cli.common import (
    check_ids,
    check_out,
    database_engine,
    err,
    fail,
    out,
    run_async,
    settings_from_env,
    with_redis,
    write_private,
)
from worker.erasure.receipt import ForgetReceipt

ProjectOption = Annotated[str, typer.Option("--project", "-p", help="The project.")]
SessionOption = Annotated[
    str | None, typer.Option("--session", "-s", help="Only this session of the project.")
]
UserOption = Annotated[
    str | None,
    typer.Option(
        "--user",
        "-u",
        help="Only this user's data in the project: the sessions whose spawn named the user, "
        "their results and working memory, the user's turns, facts and blocks.",
    ),
]
AnonymousOption = Annotated[
    bool,
    typer.Option(
        "--anonymous",
        help="Only the anonymous bucket: the data of no user (sessions whose spawn named no "
        "user, turns, facts and blocks stored without one). Not with --user.",
    ),
]
BeforeOption = Annotated[
    str | None,
    typer.Option(
        help="Only history older than this (RFC 3339, or ago: 90m, 36h, 7d); live sessions "
        "and their working memory are kept."
    ),
]


SinceOption = Annotated[
    str | None,
    typer.Option(
        help="With --before: only history at or after this (RFC 3339, or ago: 90m, 36h, 7d), "
        "the range [--since, --before)."
    ),
]


def _before(raw: str | None, name: str = "before") -> datetime | None:
    if raw is None:
        return None
    from worker.consolidation.replay import parse_instant
    from worker.erasure.scope import check_before

    try:
        return check_before(parse_instant(raw), name)
    except (ValueError, OverflowError) as exc:  # a time ago too long for a calendar
        message = str(exc) if isinstance(exc, ValueError) else f"{raw!r} is too long ago"
        raise typer.BadParameter(message, param_hint=f"--{name}") from exc


def _range(since: str | None, before: str | None) -> tuple[datetime | None, datetime | None]:
    from worker.erasure.scope import check_range

    start, end = _before(since, "since"), _before(before)
    try:
        return check_range(start, end)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from exc


def _anonymous(anonymous: bool, user: str | None) -> None:
    if anonymous and user is not None:
        raise typer.BadParameter(
            "the anonymous bucket is the data of no user: give --anonymous or --user, not both",
            param_hint="--anonymous",
        )


def _narrowing(user: str | None, session: str | None) -> dict[str, str]:
    ids = {"user_id": user, "session_id": session}
    return {name: value for name, value in ids.items() if value is not None}


def forget(
    project: ProjectOption,
    user: UserOption = None,
    session: SessionOption = None,
    before: BeforeOption = None,
    since: SinceOption = None,
    anonymous: AnonymousOption = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be removed; remove nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the receipt as JSON.")] = False,
    finish_owed: Annotated[
        bool,
        typer.Option(
            "--finish-owed",
            help="Instead: finish the project's forgets that are still owed (one that could "
            "not clear every place), each to exactly the scope and cutoff it recorded.",
        ),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            "-y",
            help="Forget a whole project or user without asking (needed when not on a terminal).",
        ),
    ] = False,
) -> None:
    """Forget a project (or one user's data, one session, or its history before a time)
    everywhere memworker keeps it: working memory, Postgres rows and vectors, every stream
    entry; later commands for a forgotten session are rejected `forgotten`. Prints a
    receipt. A whole project or user is asked for on a terminal (--yes: not asked)."""
    check_ids(project_id=project, **_narrowing(user, session))
    _anonymous(anonymous, user)
    start, when = _range(since, before)
    if finish_owed and (user or anonymous or session or when or dry_run):
        raise typer.BadParameter(
            "finishes what each owed forget recorded: give only --project",
            param_hint="--finish-owed",
        )
    if not (yes or dry_run or finish_owed or session is not None or when is not None):
        whole = f"user {user!r} of project {project!r}" if user else f"project {project!r}"
        whole = f"the anonymous bucket of project {project!r}" if anonymous else whole
        if not sys.stdin.isatty():
            print(
                f"memworker: error: forgetting all of {whole} needs --yes when not on a "
                "terminal (--dry-run shows what would go)",
                file=sys.stderr,
            )
            raise typer.Exit(2)  # a usage error: the command as given is incomplete
        if not typer.confirm(f"Forget all of {whole} everywhere memworker keeps it?"):
            fail(f"nothing forgotten: all of {whole} was not confirmed")
    settings = settings_from_env()
    ttl_ms = 1000 * max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds)

    async def go(redis: Redis) -> object:
        from worker.erasure import forget as forgetting

        async with database_engine(settings) as engine:
            if finish_owed:
                return await forgetting.finish_owed(
                    engine,
                    redis,
                    settings.stream_prefix,
                    marker_ttl_ms=ttl_ms,
                    shards=settings.shards,
                    grace_seconds=0,
                    project_id=project,
                )
            return [
                await forgetting.forget_everywhere(
                    engine,
                    redis,
                    settings.stream_prefix,
                    project,
                    session_id=session,
                    before=when,
                    since=start,
                    dry_run=dry_run,
                    marker_ttl_ms=ttl_ms,
                    shards=settings.shards,
                    user_id=user,
                    anonymous_user=anonymous,
                )
            ]

    receipts = run_async(with_redis(settings, go))
    assert isinstance(receipts, list)
    for receipt in receipts:
        assert isinstance(receipt, ForgetReceipt)
        _print_receipt(receipt, as_json)
    if finish_owed and not receipts:
        out.print(f"no forget of project {project} is owed", highlight=False, markup=False)
    for receipt in receipts:
        _fail_if_incomplete(receipt)


def _print_receipt(receipt: ForgetReceipt, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(receipt.to_dict(), option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
    else:
        for line in receipt.lines():
            out.print(line, highlight=False, markup=False)


def _fail_if_incomplete(receipt: ForgetReceipt) -> None:
    if not receipt.ok:
        owed = f"; it is owed (recorded in {receipt.owed})" if receipt.owed else ""
        fail(
            "forget is incomplete: "
            + "; ".join(receipt.errors)
            + owed
            + " (run it again: what was removed stays removed)"
        )


def export(
    project: ProjectOption,
    user: UserOption = None,
    session: SessionOption = None,
    before: BeforeOption = None,
    anonymous: AnonymousOption = False,
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
    """Export, as one JSON document, everything `memworker forget` with the same selectors
    would remove: episodes (with vectors), results, working memory of live sessions, stream
    entries; with --user also the user's facts, blocks and change-feed rows."""
    check_ids(project_id=project, **_narrowing(user, session))
    _anonymous(anonymous, user)
    when = _before(before)
    if out_file is not None:
        check_out(out_file, force)
    settings = settings_from_env()

    async def go(redis: Redis) -> bytes:
        from rich.progress import Progress, TaskID, TextColumn, TimeElapsedColumn

        from worker.erasure.export import export_project

        # On a terminal, a line per part counting up (stderr: stdout may be the document).
        with Progress(
            TextColumn("exporting {task.description}: {task.completed:,.0f}"),
            TimeElapsedColumn(),
            console=err,
            disable=not err.is_terminal,
        ) as bar:
            tasks: dict[str, TaskID] = {}

            def advance(part: str, n: int) -> None:
                if part not in tasks:
                    tasks[part] = bar.add_task(part, total=None)
                bar.advance(tasks[part], n)

            async with database_engine(settings) as engine:
                exported = await export_project(
                    engine,
                    project,
                    session_id=session,
                    before=when,
                    redis=redis,
                    prefix=settings.stream_prefix,
                    progress=advance,
                    user_id=user,
                    anonymous_user=anonymous,
                )
        return orjson.dumps(exported.to_dict(), option=orjson.OPT_INDENT_2) + b"\n"

    document = run_async(with_redis(settings, go))
    if out_file is None:
        sys.stdout.buffer.write(document)
        sys.stdout.flush()
    else:
        write_private(out_file, document, force)
