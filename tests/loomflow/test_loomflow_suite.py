"""LoomFlow 0.20's own memory tests, run against ``worker.Memory`` on real Redis and Postgres.

The tests come from LoomFlow's sdist (downloaded from the package index into a cache, never
copied here): every test module of it that builds an ``InMemoryMemory`` or an
``InMemoryFactStore``, with ``memworker_loomflow_shim`` swapping those classes for memworker's
(each instance a project of its own). What the shim marks as different by design (LoomFlow's
class identity and private attributes) must still fail; everything else must pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from tests import servers
from tests.sealed_home import user_cache

LOOMFLOW = "loomflow==0.20.0"
SDIST_ROOT = "loomflow-0.20.0"
HERE = Path(__file__).parent
REPO = HERE.parent.parent


def _cache() -> Path:
    return user_cache() / "loomflow-sdist"


def loomflow_sources() -> Path:
    """LoomFlow's sdist, unpacked (downloaded once per cache)."""
    cache = _cache()
    root = cache / SDIST_ROOT
    if (root / "tests").is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            str(cache),
            LOOMFLOW,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    archives = sorted(cache.glob(f"{SDIST_ROOT}.tar.gz"))
    if done.returncode != 0 or not archives:
        servers.unavailable("LoomFlow's sdist", (done.stderr or done.stdout).strip()[-300:])
    with tarfile.open(archives[0]) as archive:
        archive.extractall(cache, filter="data")
    return root


def memory_test_modules(root: Path) -> list[str]:
    """LoomFlow's test modules that use its in-memory backend (the live ones need an API key)."""
    found = []
    for path in sorted((root / "tests").glob("test_*.py")):
        text = path.read_text()
        if ("InMemoryMemory" in text or "InMemoryFactStore" in text) and "live" not in path.name:
            found.append(f"tests/{path.name}")
    return found


async def test_loomflows_memory_tests_pass_on_memworker(
    vector_database_url: str, redis_url: str, prefix: str
) -> None:
    root = loomflow_sources()
    modules = memory_test_modules(root)
    assert len(modules) >= 30, modules
    env = {
        **os.environ,
        "MEMWORKER_DATABASE_URL": vector_database_url,
        "MEMWORKER_REDIS_URL": redis_url,
        "MEMWORKER_STREAM_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)]),
    }
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "memworker_loomflow_shim",
            "-c",
            "pyproject.toml",
            "--rootdir",
            ".",
            *modules,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    counts = {
        kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|xfailed|errors?)", summary)
    }
    assert counts.get("passed", 0) >= 650, summary
    assert "failed" not in counts and "error" not in counts and "errors" not in counts, summary
    print(summary)


def test_the_shim_names_only_tests_that_exist() -> None:
    sys.path.insert(0, str(HERE))
    try:
        import memworker_loomflow_shim as shim  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(HERE))
    root = loomflow_sources()
    for test in (*shim.DIFFERENT_BY_DESIGN, *shim.TIMING):
        module, name = test.split("::")
        assert f"def {name}(" in (root / "tests" / module).read_text(), test
