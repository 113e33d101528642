"""The suite's own HOME: a test run never reads or writes the user's files.

``make test`` beside ``make run`` must neither pick up the running ``memworker dev`` (the CLI
reads ``dev.env`` from the default data dir, ``$XDG_DATA_HOME/memworker`` or
``~/.local/share/memworker``) nor write into the user's data. ``sealed`` points HOME and the XDG
base directories at a fresh temporary directory for the whole session, in this process and so in
every subprocess it starts, and unsets the user's ``MEMWORKER_*`` settings (a sourced
``dev.env``'s stream prefix among them: every test has its own). ``REDIS_URL`` and
``DATABASE_URL`` stay when set (they name the servers the tests use, ``tests.servers``, each
test in a key prefix and a database of its own), unless they are the user's ``memworker dev``'s
(its ``dev.env``, sourced in this shell): then the suite starts servers of its own.

The one thing kept is memworker's cache (the embedding model's built ONNX file, made there once
if missing; LoomFlow's sdist): ``MEMWORKER_EMBEDDING_CACHE_DIR`` names the user's, so the model
is not built again each run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

XDG_HOMES = {
    "XDG_DATA_HOME": ".local/share",
    "XDG_CONFIG_HOME": ".config",
    "XDG_CACHE_HOME": ".cache",
    "XDG_STATE_HOME": ".local/state",
}


KEPT = ("MEMWORKER_TEST_", "MEMWORKER_FAULTS_REPORT", "MEMWORKER_EMBEDDING_CACHE_DIR")
"""The settings of the test run itself (which server images, where the model's cache is)."""


def user_cache() -> Path:
    """memworker's cache directory as the user's environment names it (before sealing)."""
    explicit = os.environ.get("MEMWORKER_EMBEDDING_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memworker"


def _dev_servers() -> dict[str, str]:
    """REDIS_URL and DATABASE_URL as the user's ``memworker dev`` wrote them (its ``dev.env`` in
    the default data dir), before sealing; empty when there is none."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    found = {}
    try:
        lines = (Path(base) / "memworker" / "dev.env").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        key, _, value = line.removeprefix("export ").partition("=")
        if key in ("REDIS_URL", "DATABASE_URL") and value:
            found[key] = shlex.split(value)[0]
    return found


@contextmanager
def sealed(environ: MutableMapping[str, str] = os.environ) -> Iterator[Path]:
    """HOME and XDG_*_HOME in ``environ`` under a new temporary directory (removed afterwards),
    the model cache kept as the user's; ``environ`` restored on exit. Yields the new HOME."""
    settings = [k for k in environ if k.startswith("MEMWORKER_") and not k.startswith(KEPT)]
    settings += [k for k, v in _dev_servers().items() if environ.get(k) == v]
    saved = {
        k: environ.get(k) for k in ("HOME", "MEMWORKER_EMBEDDING_CACHE_DIR", *XDG_HOMES, *settings)
    }
    cache = user_cache()
    root = Path(tempfile.mkdtemp(prefix="memworker-test-home-"))
    home = root / "home"
    home.mkdir()
    try:
        for name in settings:  # a sourced dev.env's stream prefix, the user's own shards, …
            del environ[name]
        environ["MEMWORKER_EMBEDDING_CACHE_DIR"] = str(cache)
        environ["HOME"] = str(home)
        for name, sub in XDG_HOMES.items():
            environ[name] = str(home / sub)
        yield home
    finally:
        for key, value in saved.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
