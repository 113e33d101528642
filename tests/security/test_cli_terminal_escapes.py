"""Stored text never acts on the operator's terminal: a turn, a block and a fact holding an
OSC 52 clipboard write, a screen clear, a title change, the 8-bit CSI and rich's link markup,
printed by ``memworker memory recall|blocks|facts``, ``memworker recall`` and ``episodes list``
(tables) and their ``--json``, the real CLI in a subprocess on real Redis and Postgres. Before,
the tables wrote ``ESC ] 52 ; c ; …  BEL`` raw; now every control character is shown escaped
(``\\x1b``), the JSON ones as JSON escapes (``\\u001b``, ``\\u009b``), and the JSON still reads
back as exactly what was stored. So is every Unicode bidi control (``\\u202e``, the
right-to-left override, which reordered a table's text; the other embeddings, overrides,
isolates and marks): ``\\u202e`` in tables and JSON alike."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

from redis.asyncio import Redis

from tests.helpers import worker_env
from tests.integration.results_factory import migrated_engine
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact

HOSTILE = (
    "ferry \x1b]52;c;cm0gLXJmIH4=\x07 clip \x1b[2J clear \x1b]0;owned\x07 title "
    "\x9b31m csi [link=https://evil.example]click[/link] \u009d8;;x\u009c end"
    " bidi \u202eevil.exe\u202c \u2066iso\u2069 \u202a\u202b\u202d \u200e\u200f\u061c\u2067\u2068"
)
BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI}]")


def strings(value: Any) -> list[str]:
    """Every string in a JSON value, at any depth."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for item in value for s in strings(item)] if isinstance(value, list) else []


def cli(settings: Settings, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env={**worker_env(settings), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


async def test_stored_text_is_printed_escaped_in_tables_and_json(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    settings = settings.model_copy(update={"database_url": database_url})
    async with Memory("demo", settings=settings, redis=redis) as memory:
        await memory.remember(
            Episode(id="t1", session_id="chat", user_id="ann", input=HOSTILE, output=HOSTILE)
        )
        await memory.update_block("persona", HOSTILE, user_id="ann")
        await memory.facts.append(
            Fact(user_id="ann", subject="ann", predicate=HOSTILE, object=HOSTILE)
        )
    tables = [
        ("memory", "recall", "ferry", "-u", "ann", "-p", "demo"),
        ("memory", "blocks", "-u", "ann", "-p", "demo"),
        ("memory", "facts", "-u", "ann", "-p", "demo"),
        ("recall", "-p", "demo", "-u", "ann", "ferry"),
        ("episodes", "list", "-p", "demo"),
    ]
    outputs = await asyncio.gather(*(asyncio.to_thread(cli, settings, *a) for a in tables))
    for args, shown in zip(tables, outputs, strict=True):
        assert not CONTROLS.search(shown), (args, shown)
        assert "\\x1b]52;c;" in shown, (args, shown)
        if args[0] != "episodes":  # its column holds the first 60 characters
            assert "\\x9b31m" in shown and "[link=https://evil.example]" in shown, (args, shown)
            assert "\\u202eevil.exe\\u202c" in shown, (args, shown)
    for args in tables:
        shown = await asyncio.to_thread(cli, settings, *args, "--json")
        assert not CONTROLS.search(shown), (args, shown)
        found: Any = json.loads(shown)
        assert HOSTILE in strings(found), (args, shown)


def test_every_bidi_control_is_escaped_by_shown_cell_and_json_shown() -> None:
    from worker.cli.common import cell, json_shown, shown

    bidi = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
    for code in bidi:
        stored = f"id-{chr(code)}x"
        assert shown(stored) == f"id-\\u{code:04x}x"
        assert cell(stored).plain == f"id-\\u{code:04x}x"
        document = json.dumps({"id": stored}, ensure_ascii=False)
        assert json_shown(document) == f'{{"id": "id-\\u{code:04x}x"}}'
        assert json.loads(json_shown(document)) == {"id": stored}
    assert shown("a\u200db\u00e9") == "a\u200db\u00e9"  # other text is left as it is
