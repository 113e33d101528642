"""A three-node Redis (Valkey) Cluster the test starts on free ports and tears down."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.redis_process import server_binary

SLOT_RANGES = [(0, 5460), (5461, 10922), (10923, 16383)]


@contextlib.contextmanager
def redis_cluster(base: Path) -> Iterator[list[int]]:
    """Start three masters, give each a third of the slots, join them; yields their ports."""
    ports = [cluster_port() for _ in SLOT_RANGES]
    procs = []
    try:
        for port in ports:
            data = base / str(port)
            data.mkdir(parents=True)
            procs.append(
                subprocess.Popen(
                    [
                        server_binary(),
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--dir",
                        str(data),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--logfile",
                        str(data / "server.log"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        clients = [redis.Redis(host="127.0.0.1", port=port) for port in ports]
        for client in clients:
            _wait(lambda c=client: bool(c.ping()))
        for client, (low, high) in zip(clients, SLOT_RANGES, strict=True):
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)  # type: ignore[no-untyped-call]
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)  # type: ignore[no-untyped-call]
        for client in clients:
            _wait(lambda c=client: _healthy(c, len(ports)))
        for client in clients:
            client.close()
        yield ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below 65536."""
    for _ in range(200):
        port = random.randint(20_000, 45_000)
        if _free(port) and _free(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _healthy(client: redis.Redis, nodes: int) -> bool:
    info = client.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text and f"cluster_known_nodes:{nodes}" in text


def _wait(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.ConnectionError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"the test cluster did not come up: {last!r}")
