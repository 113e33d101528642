"""``JsonBodies``: the ASGI middleware that reads every tool call's body as JSON, whatever its
``Content-Type`` says. ``curl -d '{}'`` sends ``application/x-www-form-urlencoded``; the API
takes JSON objects only, so such a call gets the tool's answer (or ``the body is not JSON``),
not a complaint about a form. A header naming JSON (``application/json``, ``…+json``) is kept."""

from __future__ import annotations

from worker.access.guard import App, Receive, Scope, Send

TOOL_PATHS = "/v1/"


def _names_json(value: bytes) -> bool:
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class JsonBodies:
    """Sets ``content-type: application/json`` on a ``POST /v1/…`` that names another type or
    none; every other request passes unchanged."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and str(scope.get("path", "")).startswith(TOOL_PATHS)
        ):
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            given = [v for k, v in scope["headers"] if k.lower() == b"content-type"]
            if not (given and _names_json(given[0])):
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
