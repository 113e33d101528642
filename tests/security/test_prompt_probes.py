"""``/readyz`` answers promptly whatever a store does. Before, with ``REDIS_URL`` naming
Sentinels that nothing answers on and ``MEMWORKER_REDIS_SENTINEL_SERVICE`` set, ``/readyz`` of
``serve`` gave no answer within 60 s (a load balancer's probe timing out, not a 503)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.security.processes import Recorded, clean_env, free_port


async def test_readyz_answers_503_promptly_when_the_sentinels_never_answer(
    tmp_path: Path,
) -> None:
    env = clean_env(
        REDIS_URL=f"redis://u:pw9secret@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/0",
        MEMWORKER_REDIS_SENTINEL_SERVICE="mymaster",
    )
    port = free_port()
    serve = Recorded(["serve", "--port", str(port), "--host", "127.0.0.1"], env, tmp_path / "s")
    try:
        serve.wait_for("memory API of project")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=45) as http:
            for _ in range(2):  # and again: nothing left hanging by the first
                got = await http.get("/readyz")
                assert got.status_code == 503, got.text
                assert "Redis" in got.json()["error"], got.text
                assert "pw9secret" not in got.text
            assert (await http.get("/healthz")).status_code == 200
    finally:
        output = serve.finish()
    assert "pw9secret" not in output
