"""The ``memworker`` command line (docs/reference/cli.md): the root app, its command groups
in help order, and ``main``, the one place failures become exit statuses.

Exit status: 0 on success, 2 on a usage error, 1 on failure, with one clear line on stderr.

A command's module is imported only when it runs: ``memworker publish …`` imports and builds
``publish`` alone (the other modules and Typer's build of their ~40 commands cost a start
~0.2 s); help, a typo or a leading option get the whole app, as ``app`` (what tests and the
generated reference read) is.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any

import typer
import typer.core

from worker.cli.common import CliError
from worker.credentials import mask
from worker.errors import one_line
from worker.redis_conditions import RedisConditionError


def _new_app() -> typer.Typer:
    return typer.Typer(
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


# Help lists the commands in this order, then the groups: (name, module, function).
COMMANDS = (
    ("run", "services", "run"),
    ("consolidate", "services", "consolidate"),
    ("migrate", "operations", "migrate"),
    ("dev", "services", "dev"),
    ("publish", "lifecycle", "publish"),
    ("tail", "lifecycle", "tail"),
    ("inspect", "memory", "inspect"),
    ("stats", "operations", "stats"),
    ("replay", "operations", "replay"),
    ("schema", "operations", "schema"),
    ("shard", "lifecycle", "shard"),
    ("recall", "memory", "recall"),
    ("index", "services", "index"),
    ("reindex", "memory", "reindex"),
    ("remember", "memory", "remember"),
    ("export", "erasure", "export"),
    ("forget", "erasure", "forget"),
    ("mcp", "access", "mcp"),
    ("serve", "access", "serve"),
)
GROUPS = (
    ("dlq", "dead_letters", "dlq_app"),
    ("episodes", "memory", "episodes_app"),
    ("memory", "user_memory", "memory_app"),
)


def _part(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"worker.cli.{module}"), name)


def build(only: str | None = None) -> typer.Typer:
    """The root app with every command and group, or with the one named ``only``."""
    built = _new_app()
    built.callback()(_root)
    for name, module, function in COMMANDS:
        if only in (None, name):
            built.command()(_part(module, function))
    for name, module, attr in GROUPS:
        if only in (None, name):
            built.add_typer(_part(module, attr), name=name)
    return built


def __getattr__(name: str) -> Any:
    """``app``: the whole command line, built on first use (``from worker.cli.app import app``)."""
    if name == "app":
        globals()["app"] = built = build()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def chosen(argv: list[str]) -> str | None:
    """The command or group ``argv`` runs when its first word names one, else None (help,
    ``--version``, a typo: the whole app answers, with its list and suggestions)."""
    names = {name for name, *_ in (*COMMANDS, *GROUPS)}
    return argv[0] if argv and argv[0] in names else None


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

    Usage errors are Typer's (exit status 2, with the usage line); bad input the input rule
    refuses while a command runs is ``memworker: error: <field>: <why>``, exit status 2;
    everything else raised by a command is reported here as ``memworker: error: …`` with exit
    status 1, translated to one line a person can act on by ``worker.errors.one_line``.
    """
    typer_app = build(chosen(sys.argv[1:]))
    plain_help(typer_app)
    try:
        typer_app()
    except (CliError, RedisConditionError) as exc:
        print(f"memworker: error: {mask(str(exc))}", file=sys.stderr)
        sys.exit(2 if _bad_input(exc) else 1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("MEMWORKER_DEBUG"):
            raise
        print(f"memworker: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2 if _bad_input(exc) else 1)


def _bad_input(exc: BaseException) -> bool:
    """Whether the input rule refused it (itself, or what a command reported it as)."""
    from schemas.inputs import InvalidInputError

    return any(isinstance(e, InvalidInputError) for e in (exc, exc.__cause__, exc.__context__))


if __name__ == "__main__":
    main()
