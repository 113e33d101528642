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
            procs.append(_node(base, port))
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


@contextlib.contextmanager
def redis_cluster_with_replicas(
    base: Path, *options: str
) -> Iterator[tuple[list[int], list[int], dict[int, subprocess.Popen[bytes]]]]:
    """Three masters (a third of the slots each) and a replica of each, failing over after
    1 s; yields the masters' ports, their replicas' (in the same order) and each port's
    process, to kill. ``options``: more ``redis-server`` arguments for every node."""
    masters = [cluster_port() for _ in SLOT_RANGES]
    replicas = [cluster_port() for _ in SLOT_RANGES]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for port in masters + replicas:
            procs[port] = _node(base, port, "--cluster-node-timeout", "1000", *options)
        clients = {p: redis.Redis(host="127.0.0.1", port=p) for p in masters + replicas}
        for client in clients.values():
            _wait(lambda c=client: bool(c.ping()))
        for port, (low, high) in zip(masters, SLOT_RANGES, strict=True):
            clients[port].execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)  # type: ignore[no-untyped-call]
        for port in masters[1:] + replicas:
            clients[masters[0]].execute_command("CLUSTER", "MEET", "127.0.0.1", port)  # type: ignore[no-untyped-call]
        for client in clients.values():
            _wait(lambda c=client: _healthy(c, 6))
        for master, replica in zip(masters, replicas, strict=True):
            node_id = clients[master].execute_command("CLUSTER", "MYID")  # type: ignore[no-untyped-call]
            _wait(
                lambda r=clients[replica], n=node_id: bool(
                    r.execute_command("CLUSTER", "REPLICATE", n)
                )
            )
        for replica in replicas:
            _wait(lambda c=clients[replica]: c.info("replication")["master_link_status"] == "up")
        for client in clients.values():
            client.close()
        yield masters, replicas, procs
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def _node(base: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    data = base / str(port)
    data.mkdir(parents=True)
    return subprocess.Popen(
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
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


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
