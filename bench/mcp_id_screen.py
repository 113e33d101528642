"""What judging a message before the MCP SDK reads it costs (``worker.access.mcp_screen
.screened``: one more JSON parse of every ``POST /mcp`` body and stdio line for its ``id``; on
stdio the body-shape count too, which the ``Guard`` already does for HTTP), beside what the
SDK itself spends reading the same body (``pydantic_core.from_json`` and its message model, as
its streamable HTTP transport does), in process, per body: a small tool call, a 1,000-turn
``remember_many`` near the 2 MB body limit, and a body near the structure limits (10,000
objects: ~20,000 values).

    PYTHONPATH=. .venv/bin/python bench/mcp_id_screen.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import mcp_types as types
import orjson
import pydantic_core

from worker.access.mcp_screen import screened


def call(name: str, arguments: object) -> bytes:
    params = {"name": name, "arguments": arguments}
    return orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})


TURN = {"session_id": "s1", "input": "Book the Lisbon train " * 40, "output": "Booked. " * 90}
BODIES = {
    "recall (small)": call("recall", {"user_id": "ann", "query": "Lisbon train", "limit": 5}),
    "remember_many 1,000 turns": call("remember_many", {"turns": [TURN] * 1_000}),
    "wm_set 10,000 objects": call(
        "wm_set", {"session_id": "s", "key": "k", "value": [{"n": n} for n in range(9_990)]}
    ),
}


def median_ms(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    print(
        f"{'body':28} {'bytes':>10} {'SDK read ms':>12} {'--http screen ms':>17} {'ratio':>6}"
        f" {'stdio screen ms':>16} {'ratio':>6}"
    )
    for name, body in BODIES.items():
        repeat = 2_000 if len(body) < 10_000 else 50
        assert screened(body, shape=True) is None

        def sdk(raw: bytes = body) -> object:
            return types.jsonrpc_message_adapter.validate_python(pydantic_core.from_json(raw))

        sdk_ms = median_ms(sdk, repeat)

        def http(raw: bytes = body) -> object:
            return screened(raw, shape=False)

        def stdio(raw: bytes = body) -> object:
            return screened(raw, shape=True)

        http_ms, stdio_ms = median_ms(http, repeat), median_ms(stdio, repeat)
        print(
            f"{name:28} {len(body):>10,} {sdk_ms:>12.3f} {http_ms:>17.3f} "
            f"{http_ms / sdk_ms:>6.2f} {stdio_ms:>16.3f} {stdio_ms / sdk_ms:>6.2f}"
        )


if __name__ == "__main__":
    main()
