"""What the inspector's tests share (``tests/security/test_inspector.py``,
``tests/browser``): ``memworker serve`` on a free port against the test's own Redis prefix and
database, and its routes as the app lists them (a new one cannot be missed)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.routing import Mount, Route

from tests.helpers import worker_env
from tests.security.processes import free_port, listening
from worker.inspector.app import Shared
from worker.inspector.server import inspector_app
from worker.settings import Settings

TOKEN = "inspector-token-7d2a"
PROJECT = "inspect-demo"
SAID = "memory API of project"


def env_for(settings: Settings, database_url: str, **extra: str) -> dict[str, str]:
    return worker_env(
        settings.model_copy(update={"database_url": database_url}),
        MEMWORKER_API_TOKEN=TOKEN,
        **extra,
    )


@contextmanager
def serving(env: dict[str, str], *extra: str) -> Iterator[str]:
    """``memworker serve`` of ``PROJECT`` until the block ends: its base URL."""
    port = free_port()
    args = ["serve", "--port", str(port), "--project", PROJECT, "--host", "127.0.0.1", *extra]
    with listening(args, env, SAID):
        yield f"http://127.0.0.1:{port}"


def routes() -> list[tuple[str, str]]:
    """(method, path) of every page of the inspector but its static files and ``/ui`` (a
    redirect to ``/ui/``)."""
    app = inspector_app(Shared(lambda: None), TOKEN)  # type: ignore[arg-type,return-value]
    found = []
    for route in app.routes:
        if isinstance(route, Mount) or getattr(route, "path", "") == "/ui":
            continue
        assert isinstance(route, Route)
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                found.append((method, route.path))
    return found


def fill(path: str, **values: str) -> str:
    """A route's path with its parameters given (``{user_id}`` → ``values['user_id']``)."""
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)
