"""Every command's ``--help``, through the real CLI: flags read as flags."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import typer

from worker.cli.app import app


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group, as the words that name it on the command line."""
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        paths += command_paths(sub, (*prefix, name))
    return paths


def test_no_help_page_labels_a_flag_with_a_type() -> None:
    paths = command_paths(typer.main.get_command(app))
    assert ("publish",) in paths and ("dlq", "purge") in paths
    for path in paths:
        shown = subprocess.run(
            [sys.executable, "-m", "worker.cli", *path, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, (path, shown.stderr)
        assert "<bool>" not in shown.stdout, (path, shown.stdout)
        assert "--help" in shown.stdout
