"""What every inspector page shares: the server's ``Access`` (``Shared``), rendering (Jinja2
with autoescaping on, so whatever memory holds, a turn with ``<script>`` too, is shown as
text; every page sent with a Content-Security-Policy allowing no inline script), the
endpoint wrapper (``page``: signed in by the session cookie or the bearer header, a wrong
header counted as a guess, the CSRF token of a form checked, failures as one line) and signing
in and out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from worker.access.scope import Access, failure
from worker.inspector.auth import COOKIE, SESSION_SECONDS, Keys, Session, SignInLimiter
from worker.logs import get_logger

log = get_logger("worker.inspector")
HERE = Path(__file__).parent
PREFIX = "/ui"
Handler = Callable[[Request, "Inspector"], Awaitable[Response]]


class Shared:
    """The server's one ``Access``, made when the API app starts (``make``, called by its
    lifespan) and read by the inspector: both doors share its connections."""

    def __init__(self, make: Callable[[], Access]) -> None:
        self.make = make
        self.access: Access | None = None

    def __call__(self) -> Access:
        self.access = self.make()
        return self.access


def when(value: datetime | None) -> str:
    return "never" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def score(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def user_url(user_id: str) -> str:
    return f"{PREFIX}/users/{quote(user_id, safe='')}"


@dataclass
class Inspector:
    """What every page needs: the shared ``Access``, the keys, the templates."""

    shared: Shared
    keys: Keys
    templates: Environment
    sign_ins: SignInLimiter = field(default_factory=SignInLimiter)

    @property
    def access(self) -> Access:
        if self.shared.access is None:
            raise RuntimeError("the server is starting: try again in a moment")
        return self.shared.access

    def render(
        self, request: Request, template: str, title: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        session: Session | None = getattr(request.state, "session", None)
        access = self.shared.access
        html = self.templates.get_template(template).render(
            title=title,
            project=access.project_id if access else "",
            pinned=access.user_id if access else None,
            signed_in=session is not None and self.keys.token is not None,
            csrf=self.keys.csrf(session.nonce) if session is not None else "",
            user_url=user_url,
            **context,
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def error(self, request: Request, status: int, message: str, back: str = "/ui/") -> Response:
        return self.render(
            request, "error.html", f"Error {status}", status, message=message, back=back
        )


SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form's Origin "null"
    "Cache-Control": "no-store",
}
"""Sent with every page: no inline script runs (even one that got into a page), no framing."""


def page(handler: Handler, *, writes: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """A route's endpoint: signed in (else the login form, 401), a form's CSRF token checked
    (``writes``; else 403), any failure shown as its one line with its status (never 500 for
    bad input), and the cookie issued when the session is new."""

    async def endpoint(request: Request) -> Response:
        ui: Inspector = request.app.state.ui
        session = ui.keys.authenticate(
            request.cookies.get(COOKIE), request.headers.get("authorization")
        )
        if session is None:
            if request.headers.get("authorization"):  # a wrong token in the header: a guess
                address = request.client.host if request.client else ""
                if wait := ui.sign_ins.refuse(address):
                    return too_many(request, ui, wait)
            return login_form(request, ui, "Sign in to see this page.", 401)
        request.state.session = session
        try:
            if writes:
                form = await request.form()
                given = form.get("csrf")
                if not isinstance(given, str) or not ui.keys.csrf_matches(session.nonce, given):
                    return ui.error(
                        request,
                        403,
                        "forbidden: the form's CSRF token is missing "
                        "or wrong; reload the page and submit it again",
                    )
            response = await handler(request, ui)
        except HTTPException as exc:  # the form parser's: a field over its size, a bad body
            detail = str(exc.detail)
            status = 413 if "maximum size" in detail else exc.status_code
            response = ui.error(request, status if status < 500 else 400, f"the form: {detail}")
        except Exception as exc:
            status, line = failure(exc)
            if status >= 500:
                log.warning("inspector page failed", path=request.url.path, error=line)
            response = ui.error(request, status, line)
        if session.issue is not None:
            set_cookie(response, request, session.issue)
        return response

    return endpoint


def set_cookie(response: Response, request: Request, value: str) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=SESSION_SECONDS,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _next(value: object) -> str:
    """Where to go after signing in: a page of the inspector only (no open redirect)."""
    text = value if isinstance(value, str) else ""
    ok = text.startswith(PREFIX + "/") and not text.startswith("//") and "\\" not in text
    return text if ok and "//" not in text else PREFIX + "/"


def login_form(request: Request, ui: Inspector, message: str, status: int) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return ui.render(request, "login.html", "Sign in", status, message=message, next=_next(target))


def too_many(request: Request, ui: Inspector, seconds: int) -> Response:
    """The sign-in form, 429, while the client's address must wait (``auth``)."""
    message = f"Too many wrong tokens from your address: try again in {seconds} s."
    answer = login_form(request, ui, message, 429)
    answer.headers["Retry-After"] = str(seconds)
    return answer


async def login(request: Request) -> Response:
    ui: Inspector = request.app.state.ui
    if ui.keys.token is None:
        return RedirectResponse(PREFIX + "/", 303)
    if request.method == "GET":
        return login_form(request, ui, "", 200)
    form = await request.form()
    given, target = form.get("token"), _next(form.get("next"))
    if not isinstance(given, str) or not ui.keys.token_matches(given):
        # a guess: counted, or 429 while the address waits; the right token is never refused
        # (one address shared behind a NAT or proxy cannot lock every operator out)
        if wait := ui.sign_ins.refuse(request.client.host if request.client else ""):
            return too_many(request, ui, wait)
        return login_form(request, ui, "Wrong token.", 401)
    _nonce, value = ui.keys.cookie()
    response = RedirectResponse(target, 303)
    set_cookie(response, request, value)
    return response


async def logout(request: Request, ui: Inspector) -> Response:
    ui.keys.revoke(request.cookies.get(COOKIE))  # the old cookie is refused from now on
    response = RedirectResponse(PREFIX + "/login" if ui.keys.token else PREFIX + "/", 303)
    response.delete_cookie(COOKIE, path=PREFIX)
    return response
