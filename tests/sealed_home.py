"""The suite's own HOME: a test run never reads or writes the user's files.

``make test`` beside ``make run`` must neither pick up the running ``memworker dev`` (the CLI
reads ``dev.env`` from the default data dir, ``$XDG_DATA_HOME/memworker`` or
``~/.local/share/memworker``) nor write into the user's data. ``seal`` points HOME and the XDG
base directories at a fresh temporary directory for the whole session, in this process and so in
every subprocess it starts. The one thing kept is memworker's cache (the embedding model's built
ONNX file, made there once if missing; LoomFlow's sdist): ``MEMWORKER_EMBEDDING_CACHE_DIR`` names
the user's, so the model is not built again for every run.
"""

from __future__ import annotations

import os
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


def user_cache() -> Path:
    """memworker's cache directory as the user's environment names it (before sealing)."""
    explicit = os.environ.get("MEMWORKER_EMBEDDING_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memworker"


@contextmanager
def sealed(environ: MutableMapping[str, str] = os.environ) -> Iterator[Path]:
    """HOME and XDG_*_HOME in ``environ`` under a new temporary directory (removed afterwards),
    the model cache kept as the user's; ``environ`` restored on exit. Yields the new HOME."""
    saved = {k: environ.get(k) for k in ("HOME", "MEMWORKER_EMBEDDING_CACHE_DIR", *XDG_HOMES)}
    cache = user_cache()
    root = Path(tempfile.mkdtemp(prefix="memworker-test-home-"))
    home = root / "home"
    home.mkdir()
    try:
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
