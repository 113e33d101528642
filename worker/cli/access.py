"""``memworker mcp`` and ``memworker serve``: the agent tools (``worker.access``) as an MCP
server (stdio, or streamable HTTP) and as an HTTP API with OpenAPI. The project comes from
``--project`` (default ``MEMWORKER_DEFAULT_PROJECT``), the user, when the server is pinned to
one, from ``--user`` (``MEMWORKER_API_USER``)."""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from worker.cli.common import CliError, check_write_ids, run_async, settings_from_env
from worker.logs import configure_logging

if TYPE_CHECKING:
    from worker.access.scope import Access
    from worker.settings import Settings

ProjectOption = Annotated[
    str | None,
    typer.Option(
        "--project", "-p", help="The project served (default: MEMWORKER_DEFAULT_PROJECT)."
    ),
]
UserOption = Annotated[
    str | None,
    typer.Option(
        "--user",
        "-u",
        help="Serve this user's memory only (default: MEMWORKER_API_USER; none: each call "
        "names its user).",
    ),
]
AllowedHostOption = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host",
        help="A host name clients call this server by (repeatable; also "
        "MEMWORKER_API_ALLOWED_HOSTS). localhost and IP addresses always work; a request "
        "naming another Host is refused 421 (DNS rebinding).",
    ),
]
HostOption = Annotated[
    str | None,
    typer.Option(
        help="The address to listen on (default: 0.0.0.0 with MEMWORKER_API_TOKEN set, "
        "127.0.0.1 without)."
    ),
]


def _scope(
    project: str | None, user: str | None, *, logging_now: bool = True
) -> tuple[Settings, str, str | None]:
    """The settings, project and user served; logging configured, or (``logging_now`` false:
    the stdio MCP server, whose first answer should not wait ~0.1 s for structlog and rich)
    when the first tool call opens the scope (nothing logs before: ``_maker``)."""
    settings = settings_from_env()
    project_id = settings.default_project if project is None else project
    user_id = settings.api_user if user is None else user
    # The server writes under them (remember, blocks, facts): the write rule, not "..".
    check_write_ids(project_id=project_id, **({"user_id": user_id} if user_id is not None else {}))
    if logging_now:
        configure_logging(settings.log_level, settings.log_json)
    return settings, project_id, user_id


def _maker(settings: Settings, project_id: str, user_id: str | None) -> Any:
    def make() -> Access:
        from worker.access.scope import Access

        return Access(settings, project_id, user_id)

    return make


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
TLS_PAGE = "deploy/TLS.md (docs/guides/deploying.md: TLS)"


def _host(settings: Settings, host: str | None) -> str:
    """The listening address: ``--host``, else all addresses with a token, else this machine."""
    return host or ("0.0.0.0" if settings.api_token else "127.0.0.1")


def _say_exposure(settings: Settings, chosen: str, host: str | None) -> None:
    """Without a token, or with one over plain HTTP past this machine, said on stderr (loudly
    when anyone on the network can reach it), once the port is known to be free."""
    local = chosen in LOOPBACK or chosen.startswith("127.")
    if not settings.api_token and local:
        print(
            f"memworker: MEMWORKER_API_TOKEN is not set: no authentication; listening on "
            f"{chosen} only{'' if host else ' (--host to choose)'}",
            file=sys.stderr,
        )
    elif not settings.api_token:
        print(
            f"memworker: WARNING: MEMWORKER_API_TOKEN is not set and this server listens on "
            f"{chosen}: ANYONE WHO CAN REACH IT READS AND ERASES EVERY USER'S MEMORY; set "
            "MEMWORKER_API_TOKEN, or listen on 127.0.0.1",
            file=sys.stderr,
        )
    elif not local:
        print(
            f"memworker: WARNING: plain HTTP on {chosen}: the bearer token and every memory "
            f"cross the network unencrypted; put a TLS proxy in front ({TLS_PAGE})",
            file=sys.stderr,
        )


def _allowed_hosts(settings: Settings, chosen: str, given: list[str] | None) -> frozenset[str]:
    """Host names served: the settings', ``--allowed-host``'s and the listening address."""
    return frozenset([*settings.api_allowed_hosts, *(given or []), chosen])


def _check_secrets(settings: Settings) -> None:
    from worker.credentials import refuse_shipped_secrets

    refuse_shipped_secrets(settings)


def _listening_socket(host: str, port: int, option: str) -> socket.socket:
    """A socket bound to ``host:port``, for uvicorn to serve on; a port another process holds
    (or an address this machine does not have) is one line naming it, exit status 1."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"port {port} is already in use (another server?): choose a free one with {option}"
            ) from exc
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


async def _serve_uvicorn(
    app: Any, sock: socket.socket, host: str, port: int, what: str, proxies: list[str]
) -> None:
    import uvicorn

    config = uvicorn.Config(  # log_config None: its lines go through ours, which mask passwords
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        log_config=None,
        # X-Forwarded-For only from the proxies named (uvicorn trusts 127.0.0.1's by default:
        # a local client could then name any address and dodge the sign-in lockout)
        proxy_headers=bool(proxies),
        forwarded_allow_ips=list(proxies) or None,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        print(f"memworker: {what} on http://{host}:{port}", file=sys.stderr, flush=True)
    await task
    if not server.started:
        raise OSError(98, f"cannot listen on {host}:{port}: is the port in use?")


def mcp(
    project: ProjectOption = None,
    user: UserOption = None,
    http: Annotated[
        int | None,
        typer.Option(
            "--http",
            metavar="PORT",
            min=0,
            max=65_535,
            help="Serve streamable HTTP on PORT (path /mcp) instead of stdio.",
        ),
    ] = None,
    host: HostOption = None,
    allowed_host: AllowedHostOption = None,
) -> None:
    """An MCP server for agents: remember, recall, facts, pinned blocks, profile, forget and a
    live session's working memory, on stdio (or streamable HTTP with --http PORT)."""
    settings, project_id, user_id = _scope(project, user, logging_now=http is not None)
    make = _maker(settings, project_id, user_id)
    from worker.access import mcp_server

    if http is None:
        if sys.stdin.isatty():  # typed at a prompt: a silent wait would look like a hang
            print(
                "memworker: an MCP server on stdio, waiting for a client's JSON-RPC messages "
                "(an MCP client starts this command itself: docs/guides/agents.md); Ctrl-D "
                "or Ctrl-C stops it",
                file=sys.stderr,
                flush=True,
            )

        def logged_make() -> Access:
            configure_logging(settings.log_level, settings.log_json)
            return make()  # type: ignore[no-any-return]

        run_async(mcp_server.run_stdio(logged_make))
        return
    _check_secrets(settings)
    chosen = _host(settings, host)
    sock = _listening_socket(chosen, http, "--http")
    _say_exposure(settings, chosen, host)
    server, app = mcp_server.http_app(
        make,
        token=settings.api_token,
        max_bytes=settings.api_max_request_bytes,
        allowed_hosts=_allowed_hosts(settings, chosen, allowed_host),
        allowed_origins=frozenset(settings.api_allowed_origins),
        max_sessions=settings.mcp_max_sessions,
        idle_seconds=settings.mcp_session_idle_seconds,
        body_timeout_s=settings.api_body_timeout_seconds,
        direct_calls=settings.mcp_direct_calls,
    )

    async def go() -> None:
        try:
            await _serve_uvicorn(
                app,
                sock,
                chosen,
                http,
                f"MCP of project {project_id} at /mcp",
                settings.api_trusted_proxies,
            )
        finally:
            await mcp_server.close(server)

    run_async(go())


def serve(
    project: ProjectOption = None,
    user: UserOption = None,
    port: Annotated[int, typer.Option(min=0, max=65_535, help="The port to listen on.")] = 8080,
    host: HostOption = None,
    allowed_host: AllowedHostOption = None,
) -> None:
    """An HTTP API over the same tools as `memworker mcp` (POST /v1/<tool>), OpenAPI at
    /openapi.json, /healthz /readyz /metrics, the memory inspector at /ui; bearer token
    MEMWORKER_API_TOKEN."""
    settings, project_id, user_id = _scope(project, user)
    _check_secrets(settings)
    chosen = _host(settings, host)
    sock = _listening_socket(chosen, port, "--port")
    _say_exposure(settings, chosen, host)
    from worker.access.guesses import GuessLimiter
    from worker.access.http_api import create_app
    from worker.inspector.app import Shared
    from worker.inspector.server import with_inspector

    shared = Shared(_maker(settings, project_id, user_id))  # one Access for both doors
    guard: dict[str, Any] = {
        "guesses": GuessLimiter(),  # one count of wrong tokens for both doors
        "token": settings.api_token,
        "max_bytes": settings.api_max_request_bytes,
        "allowed_hosts": _allowed_hosts(settings, chosen, allowed_host),
        "allowed_origins": frozenset(settings.api_allowed_origins),
        "body_timeout_s": settings.api_body_timeout_seconds,
    }
    app = create_app(shared, **guard)
    if settings.ui_enabled:  # the memory inspector at /ui (MEMWORKER_UI_ENABLED)
        app = with_inspector(app, shared, **guard)
    what = f"memory API of project {project_id}"
    run_async(_serve_uvicorn(app, sock, chosen, port, what, settings.api_trusted_proxies))
