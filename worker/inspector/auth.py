"""Who may use the inspector and how a form proves it came from it.

A browser signs in once with the server's token (``POST /ui/login``): the answer sets a
session cookie (HttpOnly, SameSite=Strict, path ``/ui``) holding when it was issued, a random
nonce and an HMAC of both keyed by the token, so it is checked without any state kept and every
cookie dies when the token changes. Signing out (``POST /ui/logout``) ends the session for
good: its nonce is kept as revoked until the cookie would have expired anyway (in the process,
at most ``REVOKED_SESSIONS`` of them; a second ``serve`` process behind the same port does not
know of it, and rotating the token ends every session everywhere).
``Authorization: Bearer <token>`` works too. A server with no token needs no sign-in: its
pages issue the cookie themselves (keyed by a random key of the process), so its forms still
carry a CSRF token.

Every state-changing form carries a CSRF token: the HMAC of the session's nonce (the same key),
so a page of another site can neither read nor forge it (and SameSite=Strict keeps the cookie
off its requests anyway).

Guessing is rate-limited per client address (``SignInLimiter``: the server's one
``worker.access.guesses.GuessLimiter``, which the API's guard counts into too): after
``SIGN_IN_FAILURES`` wrong tokens within ``SIGN_IN_WINDOW_SECONDS`` (typed into the form, or
sent as a bearer header to any page), every wrong token from that address, typed or sent, is
answered 429 with ``Retry-After`` until the oldest failure leaves the window. The right token,
typed into the form or in the header, is never refused. The count is kept in the process
(addresses and times only, at most ``SIGN_IN_ADDRESSES`` of them); behind a proxy every client
shares the proxy's address."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from worker.access.guesses import (
    GUESS_ADDRESSES,
    GUESS_FAILURES,
    GUESS_WINDOW_SECONDS,
    GuessLimiter,
)

COOKIE = "memworker_ui"
SESSION_SECONDS = 12 * 3600
"""How long a sign-in lasts."""
REVOKED_SESSIONS = 100_000
"""Signed-out sessions remembered at most (each until its cookie expires); past that the oldest
are forgotten first."""
HEADER_NONCE = "bearer"
"""The nonce of a request authenticated by its ``Authorization`` header (no cookie)."""


@dataclass(frozen=True)
class Session:
    """A request's proof of sign-in: its nonce (the CSRF token derives from it) and whether the
    cookie must be (re)issued on the answer."""

    nonce: str
    issue: str | None = None


class Keys:
    """The inspector's keys: ``token`` (None: no authentication) and the HMAC key derived from
    it (or random for this process)."""

    def __init__(self, token: str | None) -> None:
        self.token = token.encode() if token else None
        base = self.token if self.token is not None else secrets.token_bytes(32)
        self.key = hashlib.sha256(b"memworker-inspector\0" + base).digest()
        self._revoked: dict[str, float] = {}  # nonce -> when its cookie expires (insertion order)

    def revoke(self, value: str | None, now: float | None = None) -> None:
        """Sign out the session of cookie ``value`` (a valid one): it is refused from now on."""
        now = now if now is not None else time.time()
        nonce = self.session_of(value, now)
        if nonce is None:
            return
        for old, until in list(self._revoked.items()):  # expired ones first, oldest first
            if until > now and len(self._revoked) < REVOKED_SESSIONS:
                break
            del self._revoked[old]
        self._revoked[nonce] = int(value.split(".")[0]) + SESSION_SECONDS if value else now

    def _mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        """The token typed into the login form, compared in constant time."""
        return self.token is not None and hmac.compare_digest(given.strip().encode(), self.token)

    def bearer(self, header: str) -> bool:
        """``Authorization: Bearer <token>`` (the scheme in any case)."""
        scheme, _, given = header.strip().partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(given)

    def cookie(self, now: float | None = None) -> tuple[str, str]:
        """A new session: (its nonce, the cookie's value)."""
        issued = str(int(now if now is not None else time.time()))
        nonce = secrets.token_hex(16)
        return nonce, f"{issued}.{nonce}.{self._mac(issued + '.' + nonce)}"

    def session_of(self, value: str | None, now: float | None = None) -> str | None:
        """The nonce of a valid, unexpired cookie, or None."""
        if not value or value.count(".") != 2:
            return None
        issued, nonce, mac = value.split(".")
        if not issued.isdigit() or not hmac.compare_digest(
            mac.encode(), self._mac(issued + "." + nonce).encode()
        ):
            return None
        age = (now if now is not None else time.time()) - int(issued)
        if nonce in self._revoked:
            return None
        return nonce if 0 <= age <= SESSION_SECONDS else None

    def csrf(self, nonce: str) -> str:
        """The CSRF token of a session."""
        return self._mac("csrf:" + nonce)

    def csrf_matches(self, nonce: str, given: str) -> bool:
        return hmac.compare_digest(self.csrf(nonce).encode(), given.encode())

    def authenticate(self, cookie: str | None, authorization: str | None) -> Session | None:
        """The request's session: the cookie's, the bearer header's, or (no token) a new one;
        None: not signed in."""
        nonce = self.session_of(cookie)
        if nonce is not None:
            return Session(nonce)
        if self.token is not None and authorization and self.bearer(authorization):
            return Session(HEADER_NONCE)
        if self.token is None:
            nonce, value = self.cookie()
            return Session(nonce, value)
        return None


SignInLimiter = GuessLimiter
"""The server's one count of wrong tokens (``worker.access.guesses``): the sign-in form's and
the bearer header's failures, and the API's, together."""
SIGN_IN_FAILURES = GUESS_FAILURES
"""Wrong tokens a client address may send within the window before it must wait."""
SIGN_IN_WINDOW_SECONDS = GUESS_WINDOW_SECONDS
SIGN_IN_ADDRESSES = GUESS_ADDRESSES
