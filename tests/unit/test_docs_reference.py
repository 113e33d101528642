"""The documentation site's reference is generated from the code (docs/reference_pages.py, an
MkDocs hook): every setting, command and HTTP route has its line there, with words a reader can
use, and the site builds with ``mkdocs build --strict`` (a broken link or a missing page fails)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _reference_pages() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "reference_pages", ROOT / "docs/reference_pages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pages = _reference_pages()


def _rows(markdown: str) -> dict[str, str]:
    """A table's rows by their first cell's first code span."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            key = line.split("`")[1]
            rows[key] = line
    return rows


def test_every_setting_has_a_line_with_its_meaning() -> None:
    from worker.settings import Settings

    rows = _rows(pages.settings_markdown())
    names = pages.setting_env_names()
    assert set(names) == set(Settings.model_fields)
    for field, env in names.items():
        assert env[0] in rows, f"setting {field} ({env[0]}) has no line in the reference"
        meaning = rows[env[0]].rstrip(" |").rsplit("|", 1)[-1].strip()
        assert meaning, f"{env[0]} has no docstring in worker/settings.py: say what it does"


def test_every_setting_is_in_the_configuration_table_too() -> None:
    table = (ROOT / "docs/reference/configuration.md").read_text().split("## Every setting")[0]
    missing = [env[0] for env in pages.setting_env_names().values() if f"`{env[0]}`" not in table]
    assert not missing, f"no row in docs/reference/configuration.md's table: {missing}"


def test_every_command_has_a_section_with_its_help() -> None:
    import typer.main

    from worker.cli.app import app

    text = pages.cli_markdown()
    names = [name for name, _ in pages.cli_commands()]
    root = typer.main.get_command(app)
    top = {f"memworker {n}" for n in root.commands}  # type: ignore[attr-defined]
    assert top <= {n if n.count(" ") == 1 else " ".join(n.split()[:2]) for n in names}
    for name, command in pages.cli_commands():
        assert f"### `{name}`" in text, f"{name} has no section in the CLI reference"
        assert (command.help or "").strip(), f"{name} has no help: say what it does"
    assert "memworker memory recall" in names and "memworker dlq redrive" in names


def test_every_route_has_a_section_with_its_description() -> None:
    text = pages.http_markdown()
    routes = list(pages.http_routes())
    assert any(path == "/v1/remember" for _, path, _ in routes)
    for method, path, operation in routes:
        assert f"### `{method} {path}`" in text, f"{method} {path} has no section"
        assert operation.get("description"), f"{method} {path} has no description"


def test_every_event_and_stream_is_listed() -> None:
    text = pages.streams_markdown()
    for name in pages.event_models():
        assert f"| `{name}` |" in text, f"event {name} is not in the streams reference"
    for channel in pages.asyncapi()["channels"]:
        assert f"| `{channel}` |" in text, f"stream {channel} is not in the streams reference"


def test_every_alert_is_listed() -> None:
    text = pages.alerts_markdown()
    for rule in pages.alerts():
        assert f"| `{rule['alert']}` |" in text


def test_every_metric_is_listed_with_what_it_measures() -> None:
    text = pages.metrics_markdown()
    found = pages.metrics()
    assert any(name == "memworker_stream_lag" for name, *_ in found)
    assert any(name == "memworker_commands_total" for name, *_ in found)
    for name, _, documentation, _ in found:
        assert f"| `{name}` |" in text, f"metric {name} is not in the metrics reference"
        assert documentation.strip(), f"{name} has no help text in worker/metrics.py"


def test_an_unknown_reference_marker_fails_the_build() -> None:
    with pytest.raises(ValueError, match="no reference named 'nope'"):
        pages.render("text\n<!-- reference: nope -->\n")


def test_every_page_with_a_marker_names_a_known_reference() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        for name in pages.MARKER.findall(page.read_text()):
            assert name in pages.REFERENCES, f"{page.name}: unknown reference {name!r}"


# Where each generated reference is placed: a marker taken off its page would leave every
# setting, command, route or stream without its line, and the tests above would still pass.
PLACED = {
    "settings": "reference/configuration.md",
    "cli": "reference/cli.md",
    "http": "reference/http.md",
    "streams": "reference/streams.md",
    "alerts": "guides/metrics.md",
    "metrics": "guides/metrics.md",
}


def test_every_reference_is_placed_on_its_page() -> None:
    assert set(PLACED) == set(pages.REFERENCES), "say which page shows each reference"
    for name, page in PLACED.items():
        text = (ROOT / "docs" / page).read_text()
        assert name in pages.MARKER.findall(text), (
            f"docs/{page} no longer places the {name} reference: its lines would be missing"
        )


# The Python API reference: these classes (and the models) have a `:::` line in
# docs/reference/python.md, and every public method they define has a docstring to show there.
PYTHON_API = {
    "worker.memory.api.WorkingMemory",
    "worker.user_memory.memory.Memory",
    "worker.user_memory.facts.FactStore",
    "worker.lifecycle.client.LifecycleClient",
    "worker.agents.manager.AgentLifecycleManager",
    "worker.user_memory.models",
}


def _python_reference() -> list[object]:
    """Every object a `:::` line of the Python API page renders: the object it names, or the
    members its options list."""
    import importlib

    text = (ROOT / "docs/reference/python.md").read_text()
    objects: list[object] = []
    for match in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, re.M):
        path, options = match.group(1), match.group(2)
        members = re.findall(r"^        - (\w+)$", options, re.M)
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError:
            parent, _, name = path.rpartition(".")
            objects.append(getattr(importlib.import_module(parent), name))
            continue
        public = members or [
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == path
        ]
        objects += [getattr(module, name) for name in public]
    return objects


def test_the_python_reference_renders_each_named_class() -> None:
    text = (ROOT / "docs/reference/python.md").read_text()
    missing = [name for name in PYTHON_API if f"::: {name}\n" not in text]
    assert not missing, f"docs/reference/python.md has no `:::` line for {missing}"


def test_every_class_and_method_the_python_reference_shows_has_a_docstring() -> None:
    import inspect

    undocumented = []
    for obj in _python_reference():
        if not inspect.isclass(obj):
            continue
        if not (obj.__doc__ or "").strip():
            undocumented.append(obj.__qualname__)
        for name, member in vars(obj).items():
            function = getattr(member, "__func__", member)
            if name.startswith("_") or not inspect.isfunction(function):
                continue
            if not (function.__doc__ or "").strip():
                undocumented.append(f"{obj.__qualname__}.{name}")
    assert not undocumented, f"no docstring for the Python API reference: {undocumented}"


def _mkdocs() -> str | None:
    beside = Path(sys.executable).parent / "mkdocs"
    return str(beside) if beside.exists() else shutil.which("mkdocs")


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """``make docs``: any warning (a broken link, a page missing from the navigation, an
    object mkdocstrings cannot find) fails the build. CI installs mkdocs (the ``docs`` extra)."""
    mkdocs = _mkdocs()
    if mkdocs is None:
        assert not os.environ.get("CI"), "CI must install the docs extra: mkdocs is missing"
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    built = (tmp_path / "site" / "reference" / "settings").exists() or (
        tmp_path / "site" / "reference" / "configuration" / "index.html"
    ).read_text()
    assert built
    page = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    assert "MEMWORKER_SHARDS" in page and "reference:" not in page


def test_the_readme_stays_a_short_door_into_the_site() -> None:
    """The README says what memworker is, how to start, and where each page is; the rest lives
    in the site. Every page it links to exists, and every page of the navigation is linked from
    the site's home page."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200, "move new sections into a page of docs/"
    for target in re.findall(r"\]\((docs/[^)#\s]+)", readme):
        assert (ROOT / target).is_file(), target
    home = (ROOT / "docs" / "index.md").read_text()
    nav = re.findall(r"^\s*- (?:.*: )?([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    missing = [page for page in nav if page != "index.md" and f"]({page}" not in home]
    assert not missing, f"docs/index.md links to no {missing}"
