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


def memworker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    shown = memworker("--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"memworker {version('memworker')}\n"


def test_dev_help_and_the_command_list_name_the_indexer() -> None:
    assert "indexer" in " ".join(memworker("dev", "--help").stdout.split())
    listed = [line for line in memworker("--help").stdout.splitlines() if line.startswith("  dev ")]
    assert len(listed) == 1 and "indexer" in listed[0], listed
