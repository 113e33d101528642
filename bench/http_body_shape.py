"""Peak traced Python memory of one hostile ``POST /v1/<tool>`` body through ``memworker
serve``'s ASGI app, in process (no Redis or Postgres: each body is refused before any tool
runs), and the answer it gets. Run it with an earlier tree on ``PYTHONPATH`` for the figures
before a change (``git archive <commit> worker schemas | tar -x -C /tmp/before``):

    PYTHONPATH=. .venv/bin/python bench/http_body_shape.py
    PYTHONPATH=/tmp/before .venv/bin/python bench/http_body_shape.py

The times are taken under ``tracemalloc`` (several times slower than without): compare the
memory, not them.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from typing import Any

import httpx

from worker.access.http_api import create_app

LIMIT = 2_097_152
"""``MEMWORKER_API_MAX_REQUEST_BYTES``'s default."""


def filled(unit: bytes, head: bytes = b"[", tail: bytes = b"]") -> bytes:
    """``head unit,unit,… tail`` as long as the body limit allows."""
    count = (LIMIT - len(head) - len(tail)) // (len(unit) + 1)
    return head + b",".join([unit] * count) + tail


def listed(units: list[bytes], head: bytes = b"[", tail: bytes = b"]") -> bytes:
    return head + b",".join(units) + tail


BODIES: dict[str, tuple[str, bytes]] = {
    "2 MB of [": ("recall", b"[" * LIMIT),
    "[[],[],…]": ("recall", filled(b"[]")),
    "[{},{},…]": ("recall", filled(b"{}")),
    "[0,0,…]": ("recall", filled(b"0")),
    "[1e1,…]": ("recall", filled(b"1e1")),
    '["ab",…]': ("recall", filled(b'"ab"')),
    '[{"a":0},…]': ("recall", filled(b'{"a":0}')),
    "[[0],…]": ("recall", filled(b"[0]")),
    "wm_set value [{},…]": (
        "wm_set",
        filled(b"{}", b'{"session_id":"s","key":"k","value":[', b"]}"),
    ),
    "19,990 x 0": ("recall", listed([b"0"] * 19_990)),
    '19,990 x "ab"': ("recall", listed([b'"ab"'] * 19_990)),
    '19,990 x {"a":0}': ("recall", listed([b'{"a":0}'] * 19_990)),
    "19,900 unknown keys": ("recall", listed([b'"%06d":0' % i for i in range(19_900)], b"{", b"}")),
    "99,000 unknown keys": ("recall", listed([b'"%06d":0' % i for i in range(99_000)], b"{", b"}")),
}


async def one(app: Any, tool: str, body: bytes) -> tuple[int, float, float, str]:
    """(status, peak MB, ms, the answer's start) of one POST."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        tracemalloc.start()
        started = time.perf_counter()
        try:
            answer = await http.post(
                f"/v1/{tool}", content=body, headers={"content-type": "application/json"}
            )
            status, text = answer.status_code, answer.text[:90]
        except Exception as exc:  # the tool was reached: no servers here
            status, text = 0, f"reached the tool ({type(exc).__name__})"
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return status, peak / 1e6, took * 1000, text


async def main() -> None:
    app = create_app(lambda: None, token=None, max_bytes=LIMIT)  # type: ignore[arg-type,return-value]
    for name, (tool, body) in BODIES.items():
        status, peak, ms, text = await one(app, tool, body)
        print(
            f"{name:22} {len(body) / 1e6:5.2f} MB -> {status}  peak {peak:6.1f} MB  "
            f"{ms:7.1f} ms  {text}"
        )


if __name__ == "__main__":
    asyncio.run(main())
