"""The memory inspector in a real browser (headless Chromium, Selenium) against a real
``memworker serve`` on real Redis and Postgres (with pgvector): sign in, remember (through the
API) → the users page → the user's page (pinned blocks, the facts timeline with the superseded
one struck) → recall (the scores and the floor) → forget (the dry run, the confirmation, the
receipt, and the turn gone); a change arriving live on the live page; a block edited after a
confirmation; a turn holding ``<script>`` inert; a phone-sized screen; the keyboard alone.
Each main page is photographed (``docs/images/inspector-*.png`` with ``make screenshots``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tests.cli_process import GENEROUS
from tests.inspector_server import TOKEN, env_for, serving
from worker.settings import Settings

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCRIPT = (
    "<script>document.title='owned';window.owned=1</script> and <img src=x onerror=window.owned=2>"
)
TURNS = [
    ("trip", "I take the ferry to Cacilhas every morning", "Noted: the Cacilhas ferry."),
    ("trip", "Which ferry is quieter, the 7:10 or the 7:40?", "The 7:40 is usually quieter."),
    ("cooking", "My favourite dish is bacalhau à brás", "A Lisbon classic."),
    ("notes", SCRIPT, "stored as text"),
]


def shot(browser: Any, path: Path) -> None:
    """The whole page, however long, as a PNG (the window stretched for it, then restored)."""
    size = browser.get_window_size()
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(size["width"], min(max(height + 120, size["height"]), 2400))
    browser.save_screenshot(str(path))
    browser.set_window_size(size["width"], size["height"])


def wait(browser: Any) -> WebDriverWait:  # type: ignore[type-arg]
    return WebDriverWait(browser, GENEROUS)


async def _seed(http: httpx.AsyncClient) -> None:
    for session, said, answer in TURNS:
        body = {"user_id": "ann", "session_id": session, "input": said, "output": answer}
        reply = await http.post("/v1/remember", json=body, headers=AUTH)
        assert reply.status_code == 200, reply.text
    for city in ("Lisbon", "Porto"):
        fact = {"user_id": "ann", "subject": "ann", "predicate": "lives_in", "object": city}
        assert (await http.post("/v1/add_fact", json=fact, headers=AUTH)).status_code == 200
    fact = {"user_id": "ann", "subject": "ann", "predicate": "commutes_by", "object": "ferry"}
    assert (await http.post("/v1/add_fact", json=fact, headers=AUTH)).status_code == 200
    for name, content in (
        ("persona", "Ann lives in Porto, commutes by ferry."),
        ("preferences", "Quiet boats; short answers."),
    ):
        block = {"user_id": "ann", "name": name, "content": content}
        assert (await http.post("/v1/update_block", json=block, headers=AUTH)).status_code == 200
    other = {"user_id": "bob", "session_id": "b1", "input": "hello", "output": "hi"}
    assert (await http.post("/v1/remember", json=other, headers=AUTH)).status_code == 200


def _sign_in(browser: Any, base: str) -> None:
    browser.get(f"{base}/ui/users/ann")
    assert browser.title.startswith("Sign in")
    field = browser.find_element(By.ID, "token")
    field.send_keys(TOKEN + Keys.ENTER)  # the keyboard alone
    wait(browser).until(ec.title_contains("User ann"))
    cookie = browser.get_cookie("memworker_ui")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert browser.execute_script("return document.cookie") == "", "the cookie is not readable"


@pytest.fixture
async def inspector(redis: Redis, settings: Settings, vector_database_url: str) -> Any:
    with serving(env_for(settings, vector_database_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            await _seed(http)
            yield base, http


async def test_remember_recall_forget_live_and_edit_in_a_browser(
    inspector: Any, browser: Any, shots: Path
) -> None:
    base, http = inspector
    _sign_in(browser, base)
    browser.get(f"{base}/ui/")
    assert browser.title == "Project inspect-demo · memworker inspector"
    users = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "tbody td:first-child a")]
    assert set(users) == {"ann", "bob"}
    shot(browser, shots / "inspector-users.png")
    browser.find_element(By.LINK_TEXT, "ann").click()
    wait(browser).until(ec.title_contains("User ann"))
    blocks = [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".blocks h3")]
    assert blocks == ["persona", "preferences"], "pinned blocks in pin order"
    struck = browser.find_elements(By.CSS_SELECTOR, ".timeline li.superseded del")
    assert len(struck) == 1 and "Lisbon" in struck[0].text
    shot(browser, shots / "inspector-user.png")

    # the script turn: shown as text, never run
    browser.find_element(By.LINK_TEXT, "notes").click()
    wait(browser).until(ec.title_contains("Session notes"))
    assert "<script>document.title='owned'" in browser.find_element(By.TAG_NAME, "main").text
    assert browser.execute_script("return window.owned === undefined")
    assert "owned" not in browser.title

    # recall, with the scores and the floor
    browser.back()
    wait(browser).until(ec.title_contains("User ann"))
    browser.find_element(By.LINK_TEXT, "Recall").click()
    box = wait(browser).until(ec.presence_of_element_located((By.ID, "q")))
    box.send_keys("which ferry is quiet" + Keys.ENTER)
    rows = wait(browser).until(
        ec.presence_of_all_elements_located((By.CSS_SELECTOR, "#matches tbody tr"))
    )
    assert "7:40" in rows[0].text, "the quiet-ferry turn first"
    first = rows[0].find_elements(By.TAG_NAME, "td")
    assert first[2].text.split()[0] != "–", "a vector score"
    assert "Relevance floor" in browser.find_element(By.TAG_NAME, "main").text
    [fact] = browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr")  # by its word "ferry"
    cells = [td.text for td in fact.find_elements(By.TAG_NAME, "td")]
    assert "commutes_by ferry" in cells[1] and float(cells[3]) > 0 and float(cells[4]) > 0
    shot(browser, shots / "inspector-recall.png")

    # live: a change arrives while the page is open
    browser.get(f"{base}/ui/live?user=ann")
    wait(browser).until(ec.text_to_be_present_in_element((By.ID, "feed-state"), "Live"))
    fact = {"user_id": "ann", "subject": "ann", "predicate": "likes", "object": "tea"}
    assert (await http.post("/v1/add_fact", json=fact, headers=AUTH)).status_code == 200
    wait(browser).until(ec.text_to_be_present_in_element((By.ID, "changes"), "fact.added"))
    shot(browser, shots / "inspector-live.png")

    # forget one session: the dry run, the confirmation, the receipt
    browser.get(f"{base}/ui/users/ann/forget")
    browser.find_element(By.ID, "session_id").send_keys("trip")
    browser.find_element(By.ID, "preview-forget").click()
    receipt = wait(browser).until(ec.presence_of_element_located((By.ID, "receipt-lines")))
    assert receipt.text.startswith("would forget project inspect-demo, user ann, session trip")
    assert "postgres episodes: 2" in receipt.text
    still = await http.post(
        "/v1/recall", json={"user_id": "ann", "query": "Cacilhas"}, headers=AUTH
    )
    assert any("Cacilhas" in m["episode"]["input"] for m in still.json()), "nothing erased yet"
    shot(browser, shots / "inspector-forget.png")
    browser.find_element(By.ID, "confirm-forget").click()
    done = wait(browser).until(ec.presence_of_element_located((By.ID, "receipt-lines")))
    assert done.text.startswith("forgot user ann, session trip")
    gone = await http.post("/v1/recall", json={"user_id": "ann", "query": "Cacilhas"}, headers=AUTH)
    assert not any("Cacilhas" in m["episode"]["input"] for m in gone.json()), gone.text

    # a block edited, after a confirmation
    browser.get(f"{base}/ui/users/ann")
    browser.find_element(By.LINK_TEXT, "Edit persona").click()
    area = wait(browser).until(ec.presence_of_element_located((By.ID, "content")))
    area.clear()
    area.send_keys("Ann moved to Porto.")
    area.submit()
    wait(browser).until(ec.presence_of_element_located((By.ID, "confirm-block"))).click()
    wait(browser).until(ec.title_contains("User ann"))
    assert "Ann moved to Porto." in browser.find_element(By.CSS_SELECTOR, ".blocks").text


async def test_a_phone_sized_screen_and_the_keyboard(
    inspector: Any, browser: Any, shots: Path
) -> None:
    base, _http = inspector
    _sign_in(browser, base)
    browser.set_window_size(390, 844)
    browser.get(f"{base}/ui/users/ann")
    width = browser.execute_script("return document.documentElement.scrollWidth")
    inner = browser.execute_script("return window.innerWidth")
    assert width <= inner, f"the page scrolls sideways: {width} > {inner}"
    shot(browser, shots / "inspector-phone.png")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    focused = browser.switch_to.active_element
    assert focused.text == "Skip to content" or focused.get_attribute("class") == "skip"
    links = browser.find_elements(By.CSS_SELECTOR, "main a[href]")
    assert links and all(a.get_attribute("href").startswith(base) for a in links)
