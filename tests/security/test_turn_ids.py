"""Turn ids are no oracle across users: on one database and Redis, two ``memworker serve``
processes each pinned to a user with its own token (a shared server's tenants), bob remembering
an id ann holds gets what he gets for an id nobody holds (200, his own turn), never a 409;
he cannot claim ids ann will use; each reads only their own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
from redis.asyncio import Redis

from tests.helpers import worker_env
from tests.integration.results_factory import migrated_engine
from tests.security.processes import free_port, listening
from worker.settings import Settings

PROJECT = "shared-ids"
TOKENS = {"ann": "ann-token-7f3a", "bob": "bob-token-c21d"}


@contextmanager
def pinned_servers(settings: Settings) -> Iterator[dict[str, httpx.Client]]:
    """A ``serve`` per user, pinned to them, each with its own token: user -> a client."""
    with ExitStack() as stack:
        clients = {}
        for user, token in TOKENS.items():
            env = worker_env(settings, MEMWORKER_API_TOKEN=token, MEMWORKER_API_USER=user)
            port = free_port()
            args = ["serve", "--port", str(port), "--project", PROJECT, "--host", "127.0.0.1"]
            stack.enter_context(listening(args, env, "memory API of project"))
            clients[user] = stack.enter_context(
                httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=60,
                )
            )
        yield clients


def remember(http: httpx.Client, user: str, turn_id: str, words: str) -> httpx.Response:
    body = {"user_id": user, "session_id": "chat", "id": turn_id, "input": words, "output": "ok"}
    return http.post("/v1/remember", json=body)


def inputs(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    found: Any = answer.json()
    return sorted(m["episode"]["input"] for m in found)


async def test_another_users_turn_id_is_no_oracle_and_cannot_be_claimed(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    with pinned_servers(settings.model_copy(update={"database_url": database_url})) as http:
        ann, bob = http["ann"], http["bob"]
        assert remember(ann, "ann", "turn-1", "ann's salary is 90k").status_code == 200

        held = remember(bob, "bob", "turn-1", "bob likes ferries")  # ann's id
        fresh = remember(bob, "bob", "turn-9", "bob likes ferries")  # nobody's
        assert (held.status_code, fresh.status_code) == (200, 200), (held.text, fresh.text)
        assert (held.json(), fresh.json()) == ({"id": "turn-1"}, {"id": "turn-9"})
        batch = {
            "user_id": "bob",
            "turns": [
                {"session_id": "chat", "id": i, "input": "bob's batch", "output": "ok"}
                for i in ("turn-2", "turn-3")
            ],
        }
        claimed = bob.post("/v1/remember_many", json=batch)  # turn-2: an id ann uses next
        assert claimed.status_code == 200, claimed.text

        assert remember(ann, "ann", "turn-2", "ann's next turn").status_code == 200
        assert remember(ann, "ann", "turn-1", "ann's salary is 90k").status_code == 200
        mine = remember(bob, "bob", "turn-1", "bob changed his mind")  # his own id: his conflict
        assert mine.status_code == 409 and "ann" not in mine.text, mine.text

        query = {"query": "salary ferries next batch", "limit": 10}
        assert inputs(ann.post("/v1/recall", json={**query, "user_id": "ann"})) == [
            "ann's next turn",
            "ann's salary is 90k",
        ]
        assert inputs(bob.post("/v1/recall", json={**query, "user_id": "bob"})) == [
            "bob likes ferries",
            "bob likes ferries",
            "bob's batch",
            "bob's batch",
        ]
        # bob's server serves bob alone: ann's turns are not his to read
        assert bob.post("/v1/recall", json={**query, "user_id": "ann"}).status_code == 403
