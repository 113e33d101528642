"""The inspector's sign-in (``worker.inspector.auth``): a cookie is good only as issued, with
this token, within its 12 hours; a CSRF token only for its own session; the bearer header with
the scheme in any case; a server without a token issues its own sessions."""

from __future__ import annotations

from worker.inspector.auth import HEADER_NONCE, SESSION_SECONDS, Keys, SignInLimiter


def test_a_cookie_is_good_only_as_issued_with_this_token_and_in_time() -> None:
    keys = Keys("token-a")
    nonce, cookie = keys.cookie(now=1_000_000)
    assert keys.session_of(cookie, now=1_000_000 + 60) == nonce
    assert keys.session_of(cookie, now=1_000_000 + SESSION_SECONDS + 1) is None
    assert keys.session_of(cookie, now=1_000_000 - 10) is None, "issued in the future"
    assert Keys("token-b").session_of(cookie, now=1_000_000) is None, "the token changed"
    issued, _nonce, mac = cookie.split(".")
    for forged in (
        f"{int(issued) + 3600}.{nonce}.{mac}",
        f"{issued}.{'0' * 32}.{mac}",
        f"{issued}.{nonce}.{'0' * 64}",
        f"{issued}.{nonce}",
        "",
        "a.b.c",
    ):
        assert keys.session_of(forged, now=1_000_000) is None, forged


def test_a_csrf_token_belongs_to_its_session() -> None:
    keys = Keys("token-a")
    mine, _ = keys.cookie()
    theirs, _ = keys.cookie()
    assert keys.csrf_matches(mine, keys.csrf(mine))
    assert not keys.csrf_matches(mine, keys.csrf(theirs))
    assert not keys.csrf_matches(mine, "")
    assert not Keys("token-b").csrf_matches(mine, keys.csrf(mine))


def test_the_header_the_scheme_in_any_case_and_no_token_means_a_session_of_its_own() -> None:
    keys = Keys("token-a")
    for header in ("Bearer token-a", "bearer token-a", "BEARER  token-a "):
        session = keys.authenticate(None, header)
        assert session is not None and session.nonce == HEADER_NONCE, header
    for header in ("Bearer token-b", "Basic token-a", "token-a", "", "Bearer "):
        assert keys.authenticate(None, header) is None, header
    assert keys.authenticate("garbage", None) is None
    open_server = Keys(None)
    session = open_server.authenticate(None, None)
    assert session is not None and session.issue is not None
    assert open_server.session_of(session.issue) == session.nonce
    assert not open_server.token_matches(""), "no token: the login form matches nothing"


def test_sign_in_failures_hold_an_address_for_the_rest_of_the_window_only() -> None:
    limiter = SignInLimiter(failures=3, window=60, addresses=2)
    for at in (0.0, 1.0, 2.0):
        assert limiter.wait("a", at) == 0
        limiter.failed("a", at)
    assert limiter.wait("a", 10.0) == 50.0  # until the first failure leaves the window
    assert limiter.wait("b", 10.0) == 0  # another address is not held
    assert limiter.wait("a", 60.5) == 0  # one failure left the window: it may try again
    limiter.failed("b", 70.0)
    limiter.failed("c", 70.0)
    assert set(limiter.seen) == {"b", "c"}  # bounded: the least recent address dropped
