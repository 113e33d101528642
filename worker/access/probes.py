"""``/healthz``, ``/readyz`` and ``/metrics`` of both HTTP servers (``memworker serve``,
``memworker mcp --http``), as every memworker service serves them: alive; ready (Redis and
Postgres answer: else 503 with the one line saying why, no password in it); Prometheus."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from worker.access.scope import Access
from worker.credentials import mask
from worker.metrics import READY


def probe_routes(access: Callable[[Request], Access]) -> list[Route]:
    """The three probes; ``access`` gives the server's ``Access`` for a request."""

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        problem = await access(request).ready()
        READY.set(0 if problem else 1)
        if problem:
            return JSONResponse({"error": mask(problem)}, status_code=503)
        return PlainTextResponse("ready\n")

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"], include_in_schema=False),
        Route("/readyz", readyz, methods=["GET"], include_in_schema=False),
        Route("/metrics", metrics, methods=["GET"], include_in_schema=False),
    ]
