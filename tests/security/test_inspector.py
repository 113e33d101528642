"""Every page of the memory inspector (``/ui``, enumerated from its app: a new one cannot be
missed) against a real ``memworker serve`` on real Redis and Postgres, pinned to user ann: no
sign-in, a wrong token or a forged cookie → 401; bob's pages → 403 and nothing of bob's shown
or erased; a form without its CSRF token, or with another's → 403; hostile ids → 4xx; a Host
not served → 421, another site's Origin → 403; a turn holding ``<script>`` shown as text; the
cookie HttpOnly and SameSite=Strict; no open redirect after signing in; ``/ui`` off with
``MEMWORKER_UI_ENABLED=false``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.inspector_server import PROJECT, TOKEN, csrf_of, env_for, fill, routes, serving
from tests.integration.results_factory import migrated_engine
from worker.inspector.auth import COOKIE, SIGN_IN_FAILURES, SIGN_IN_WINDOW_SECONDS
from worker.settings import Settings, asyncpg_url

PINNED, OTHER = "ann", "bob"
SCRIPT = "<script>document.title='owned'</script>"
SAMPLE = {"user_id": PINNED, "session_id": "ann-chat", "name": "persona"}
FORMS = {
    "/ui/logout": {},
    "/ui/users/{user_id}/forget": {"step": "preview"},
    "/ui/users/{user_id}/blocks/{name}/edit": {"step": "preview", "content": "x"},
    "/ui/live/redrive": {"step": "preview", "stream": "x", "entry_id": "1-0"},
}
"""A body for every form (a new one must be added here)."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def env(redis: Redis, settings: Settings, database_url: str) -> dict[str, str]:
    async with migrated_engine(database_url):
        pass
    return env_for(settings, database_url)


async def _remember(http: httpx.AsyncClient, user: str, turn: str) -> None:
    body = {"user_id": user, "session_id": f"{user}-chat", "input": turn, "output": "ok"}
    answer = await http.post("/v1/remember", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    block = {"user_id": user, "name": "persona", "content": f"{user} {turn}"}
    assert (await http.post("/v1/update_block", json=block, headers=AUTH)).status_code == 200


@pytest.fixture
async def pinned(env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """A server pinned to ann with a turn of ann's (holding a script) and one of bob's
    (written through an unpinned server on the same stores)."""
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await _remember(http, OTHER, "bob's secret ferry")
    with serving({**env, "MEMWORKER_API_USER": PINNED}) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await _remember(http, PINNED, SCRIPT)
            yield http


async def _sign_in(http: httpx.AsyncClient) -> str:
    answer = await http.post("/ui/login", data={"token": TOKEN, "next": "/ui/"})
    assert answer.status_code == 303, answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "Path=/ui" in cookie
    return csrf_of((await http.get("/ui/")).text)


def test_the_forms_cover_every_page_that_writes() -> None:
    assert {path for method, path in routes() if method == "POST"} - {"/ui/login"} == set(FORMS)


async def test_every_page_refuses_no_sign_in_a_wrong_token_and_a_forged_cookie(
    pinned: httpx.AsyncClient,
) -> None:
    guesses = 0  # wrong tokens sent from this address: past SIGN_IN_FAILURES, 429
    for method, path in routes():
        if path == "/ui/login":
            continue
        url = fill(path, **SAMPLE)
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token"},
            {"Authorization": f"Bearer {TOKEN[:-1]}"},
            {"Authorization": TOKEN},
            {"Cookie": "memworker_ui=1.2.3"},
            {"Cookie": f"memworker_ui=9999999999.{'0' * 32}.{'0' * 64}"},
        ):
            data = FORMS.get(path) if method == "POST" else None
            answer = await pinned.request(method, url, headers=headers, data=data)
            guesses += "Authorization" in headers
            held = "Authorization" in headers and guesses > SIGN_IN_FAILURES
            expected = 429 if held else 401
            assert answer.status_code == expected, (method, url, headers, answer.status_code)
            assert "Sign in" in answer.text
            assert "bob" not in answer.text and SCRIPT not in answer.text


async def test_a_pinned_server_shows_and_erases_nothing_of_another_user(
    pinned: httpx.AsyncClient, database_url: str
) -> None:
    csrf = await _sign_in(pinned)
    for method, path in routes():
        if "{user_id}" not in path:
            continue
        url = fill(path, **{**SAMPLE, "user_id": OTHER})
        data = {**FORMS.get(path, {}), "csrf": csrf} if method == "POST" else None
        answer = await pinned.request(method, url, data=data)
        assert answer.status_code == 403, (method, url, answer.text)
        assert f"user {PINNED}" in answer.text and "secret ferry" not in answer.text
    for url in ("/ui/", "/ui/live", "/ui/?q=bo"):
        answer = await pinned.get(url)
        assert answer.status_code == 200, (url, answer.text)
        assert ">bob<" not in answer.text and "secret ferry" not in answer.text
    assert (await pinned.get("/ui/live?user=bob")).status_code == 403
    assert (await pinned.get("/ui/live/changes?user=bob")).status_code == 403
    confirm = {"csrf": csrf, "step": "confirm"}
    assert (await pinned.post("/ui/users/bob/forget", data=confirm)).status_code == 403
    engine = create_async_engine(asyncpg_url(database_url))
    try:
        async with engine.connect() as conn:
            kept = await conn.scalar(
                text("SELECT count(*) FROM episodes WHERE project_id = :p AND user_id = 'bob'"),
                {"p": PROJECT},
            )
    finally:
        await engine.dispose()
    assert kept == 1, "bob's turn was erased through ann's server"


async def test_a_form_without_its_csrf_token_or_with_another_is_refused_403(
    pinned: httpx.AsyncClient,
) -> None:
    await _sign_in(pinned)
    async with httpx.AsyncClient(base_url=str(pinned.base_url), timeout=60) as other:
        foreign = await _sign_in(other)  # another browser's session: its token is not ours
    for method, path in routes():
        if method != "POST" or path == "/ui/login":
            continue
        url = fill(path, **SAMPLE)
        for csrf in (None, "", "0" * 64, foreign):
            data = dict(FORMS[path]) | ({} if csrf is None else {"csrf": csrf})
            for step in ("preview", "confirm"):
                if "step" in data:
                    data["step"] = step
                answer = await pinned.post(url, data=data)
                assert answer.status_code == 403, (url, csrf, answer.text)
                assert "CSRF" in answer.text
    assert (await pinned.get("/ui/users/ann")).status_code == 200, "still signed in"


@pytest.mark.parametrize(
    "url",
    [
        "/ui/users/a%20b",
        "/ui/users/%3Cscript%3E",
        "/ui/users/" + "a" * 129,
        "/ui/users/ann/sessions/x%27%3B--",
        "/ui/users/ann/blocks/%00/edit",
        "/ui/users/ann/recall?limit=-1",
        "/ui/users/ann/recall?limit=1e9",
        "/ui/users/ann?facts=0",
        "/ui/users/ann/forget?session_id=..%2F..",
        "/ui/live?user=%0d%0a",
        "/ui/live/changes?user=a*b",
        "/ui/users/..%2F..%2Fetc%2Fpasswd",
        "/ui/static/..%2F..%2Fapp.py",
        "/ui/?q=" + "x" * 200,
    ],
)
async def test_hostile_ids_and_numbers_are_a_4xx(pinned: httpx.AsyncClient, url: str) -> None:
    answer = await pinned.get(url, headers=AUTH)
    assert 400 <= answer.status_code < 500, (url, answer.status_code, answer.text)
    assert "Traceback" not in answer.text


async def test_hostile_form_values_are_a_4xx_and_erase_nothing(
    pinned: httpx.AsyncClient,
) -> None:
    csrf = await _sign_in(pinned)
    for data in (
        {"step": "preview", "before": "yesterday"},
        {"step": "preview", "before": "99999-01-01T00:00:00Z"},
        {"step": "confirm", "since": "2026-02-01T00:00:00Z", "before": "2026-01-01T00:00:00Z"},
        {"step": "confirm", "since": "2026-01-01T00:00:00Z"},
        {"step": "confirm", "since": "0001-01-01T00:00:00+14:00", "before": "2026-01-01T00:00:00Z"},
        {"step": "confirm", "session_id": "<script>"},
        {"step": "erase-all"},
    ):
        answer = await pinned.post("/ui/users/ann/forget", data={**data, "csrf": csrf})
        assert 400 <= answer.status_code < 500, (data, answer.text)
        assert "since" not in data or "since" in answer.text, answer.text  # named
    for data in (
        {"step": "preview", "stream": "inspsmoke:lifecycle:{0}", "entry_id": "1-0"},
        {"step": "confirm", "stream": "x", "entry_id": "1-0; FLUSHALL"},
    ):
        answer = await pinned.post("/ui/live/redrive", data={**data, "csrf": csrf})
        assert 400 <= answer.status_code < 500, (data, answer.text)
    huge = "x" * 1_500_000  # over the form parser's field size: 413, not 500
    for url, data in (
        ("/ui/users/ann/blocks/persona/edit", {"step": "confirm", "content": huge}),
        ("/ui/users/ann/forget", {"step": "confirm", "before": huge}),
    ):
        answer = await pinned.post(url, data={**data, "csrf": csrf})
        assert answer.status_code == 413, (url, answer.status_code, answer.text[:300])
        assert "maximum size" in answer.text
    page = await pinned.get("/ui/users/ann")
    assert "1</dd>" in page.text, "ann's turn is still there"


async def test_a_turn_holding_a_script_is_shown_as_text(pinned: httpx.AsyncClient) -> None:
    await _sign_in(pinned)
    for url in (
        "/ui/users/ann/sessions/ann-chat",
        "/ui/users/ann/recall?q=document",
        "/ui/users/ann",
    ):
        answer = await pinned.get(url)
        assert answer.status_code == 200, (url, answer.text)
        assert "&lt;script&gt;document.title=" in answer.text, url
        assert SCRIPT not in answer.text, url
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy


async def test_hosts_origins_and_redirects_hold(pinned: httpx.AsyncClient) -> None:
    answer = await pinned.get("/ui/", headers={**AUTH, "Host": "evil.example"})
    assert answer.status_code == 421, answer.text
    answer = await pinned.post(
        "/ui/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"}
    )
    assert answer.status_code == 403, answer.text
    for target in ("//evil.example/", "https://evil.example/ui/", "/ui/..//evil", "/v1/recall"):
        answer = await pinned.post("/ui/login", data={"token": TOKEN, "next": target})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/", (target, answer.headers["location"])
    wrong = await pinned.post("/ui/login", data={"token": "guess"})
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers


async def test_the_inspector_is_off_when_the_setting_says_so(env: dict[str, str]) -> None:
    with serving({**env, "MEMWORKER_UI_ENABLED": "false"}) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for url in ("/ui/", "/ui/login", "/ui/static/live.js"):
                answer = await http.get(url, headers=AUTH)
                assert answer.status_code == 404, (url, answer.text)


def test_every_page_is_documented() -> None:
    """Each route of the inspector has its line in docs/guides/inspector.md."""
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "guides" / "inspector.md").read_text()
    missing = [
        path
        for _method, path in routes()
        if f"`{path}" not in guide.replace("GET ", "").replace("POST ", "")
    ]
    assert not missing, f"docs/guides/inspector.md names no {missing}"


async def test_sign_in_is_rate_limited_per_address_with_a_429_and_retry_after(
    env: dict[str, str],
) -> None:
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for n in range(SIGN_IN_FAILURES):
                wrong = await http.post("/ui/login", data={"token": f"guess-{n}"})
                assert wrong.status_code == 401, (n, wrong.text)
            for n in range(2):  # a wrong token waits now, and is not counted
                held = await http.post("/ui/login", data={"token": f"guess-again-{n}"})
                assert held.status_code == 429, held.text
                assert 0 < int(held.headers["Retry-After"]) <= SIGN_IN_WINDOW_SECONDS
                assert "set-cookie" not in held.headers and "Too many" in held.text
        # the right token signs in from the same address meanwhile: the guesser behind a
        # shared address (a NAT, a proxy) locks no operator out (before: 429 for it too)
        async with httpx.AsyncClient(base_url=base, timeout=60) as operator:
            signed = await operator.post("/ui/login", data={"token": TOKEN, "next": "/ui/"})
            assert signed.status_code == 303, signed.text
            assert COOKIE in signed.headers["set-cookie"]
            assert (await operator.get("/ui/")).status_code == 200
            wrong = await operator.post("/ui/login", data={"token": "guess-from-here"})
            assert wrong.status_code == 429, wrong.text  # its wrong ones still wait


async def test_signing_out_ends_the_session_even_for_a_copy_of_its_cookie(
    env: dict[str, str],
) -> None:
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            csrf = await _sign_in(http)
            cookie = http.cookies[COOKIE]
            out = await http.post("/ui/logout", data={"csrf": csrf})
            assert out.status_code == 303, out.text
        async with httpx.AsyncClient(base_url=base, timeout=60) as stolen:
            stolen.cookies.set(COOKIE, cookie, path="/ui")
            again = await stolen.get("/ui/")
            assert again.status_code == 401, "a signed-out cookie still opened the inspector"


async def test_a_forged_forwarded_address_does_not_dodge_the_sign_in_lockout(
    env: dict[str, str],
) -> None:
    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told whom to trust: a local
    # client could name a fresh address for every guess
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for n in range(SIGN_IN_FAILURES):
                forged = {"X-Forwarded-For": f"10.0.0.{n}"}
                wrong = await http.post("/ui/login", data={"token": f"g-{n}"}, headers=forged)
                assert wrong.status_code == 401, (n, wrong.text)
            held = await http.post(
                "/ui/login", data={"token": "g-x"}, headers={"X-Forwarded-For": "1.2.3.4"}
            )
            assert held.status_code == 429, held.text
            # the header still works: the limit is on guessing the token, not on using it
            assert (await http.get("/ui/", headers=AUTH)).status_code == 200
