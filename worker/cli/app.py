"""The ``memworker`` command line (docs/reference/cli.md): the root app, its command groups
in help order, and ``main``, the one place failures become exit statuses.

Exit status: 0 on success, 2 on a usage error, 1 on failure, with one clear line on stderr.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
import typer.core

from worker.cli import access, erasure, lifecycle, memory, operations, services, user_memory
from worker.cli.common import CliError
from worker.cli.dead_letters import dlq_app
from worker.credentials import mask
from worker.errors import one_line
from worker.redis_conditions import RedisConditionError

app = typer.Typer(
    name="memworker",
    help="Agent-memory lifecycle worker: commands in on Redis Streams, working memory in "
    "Redis, episodes in Postgres.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Click's plain help: flags show as flags (rich help labels each one `<bool>`), and a
    # usage error is a short "Error: …" line rather than a box.
    rich_markup_mode=None,
)


def _version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"memworker {version('memworker')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Agent-memory lifecycle worker: commands in on Redis Streams, working memory in Redis,
    episodes in Postgres."""


# Help lists the commands in this order, then the groups.
for command in (
    services.run,
    services.consolidate,
    operations.migrate,
    services.dev,
    lifecycle.publish,
    lifecycle.tail,
    memory.inspect,
    operations.stats,
    operations.replay,
    operations.schema,
    lifecycle.shard,
    memory.recall,
    services.index,
    memory.reindex,
    memory.remember,
    erasure.export,
    erasure.forget,
    access.mcp,
    access.serve,
):
    app.command()(command)
app.add_typer(dlq_app, name="dlq")
app.add_typer(memory.episodes_app, name="episodes")
app.add_typer(user_memory.memory_app, name="memory")


def _usage_name(self: typer.core.TyperArgument) -> str:
    """An argument in the usage line as Click and man pages write it: ``QUERY``, ``[NAME]``
    (Typer 0.2x writes a required one as ``{query}``)."""
    name = self.metavar or (self.name or "").upper()
    if not self.required:
        name = f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def plain_help(typer_app: typer.Typer) -> None:
    """Click's plain help for ``typer_app`` and every sub-app registered on it, whoever added
    them: flags show as flags (rich help labels each one ``<bool>``)."""
    typer_app.rich_markup_mode = None
    typer.core.TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)


def main() -> None:
    """Entry point: map failures to one stderr line and the contract's exit statuses.

    Usage errors are Typer's (exit status 2, with the usage line); everything raised by a
    command is reported here as ``memworker: error: …`` with exit status 1, translated to one
    line a person can act on by ``worker.errors.one_line``.
    """
    plain_help(app)
    try:
        app()
    except (CliError, RedisConditionError) as exc:
        print(f"memworker: error: {mask(str(exc))}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("MEMWORKER_DEBUG"):
            raise
        print(f"memworker: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
