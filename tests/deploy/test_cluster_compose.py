"""docker-compose.cluster.yml: the stack on a Redis Cluster, as issue 36 and the docs say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


class _Loader(yaml.SafeLoader):
    """Compose's `!reset` and `!override` tags read as the value they carry."""


_Loader.add_constructor("!reset", lambda loader, node: loader.construct_sequence(node))  # type: ignore[arg-type]
_Loader.add_constructor("!override", lambda loader, node: loader.construct_mapping(node))  # type: ignore[arg-type]


def _cluster() -> dict[str, Any]:
    text = (REPO / "docker-compose.cluster.yml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.load(text, Loader=_Loader)
    return loaded


def test_six_nodes_in_cluster_mode_with_their_own_volumes_and_the_acl_users() -> None:
    services = _cluster()["services"]
    nodes = ["redis", *(f"redis-{n}" for n in range(2, 7))]
    volumes = set()
    for name in nodes:
        script = services[name]["command"][-1]
        assert "--cluster-enabled yes" in script and "--appendonly yes" in script
        assert "/etc/redis/users.acl" in script and "--masteruser replication" in script
        volumes.add(services[name]["volumes"][0].split(":")[0])
    assert len(volumes) == 6
    create = services["redis-cluster"]["command"][-1]
    assert "--cluster-replicas 1" in create
    assert "for host in " + " ".join(nodes) + ";" in create


def test_every_app_service_runs_on_the_cluster_with_at_least_12_shards() -> None:
    services = _cluster()["services"]
    for name in ("worker", "consolidator", "indexer", "api"):
        env = services[name]["environment"]
        assert env["MEMWORKER_REDIS_CLUSTER"] == "true"
        assert int(env["MEMWORKER_SHARDS"]) >= 12
        assert services[name]["depends_on"]["redis-cluster"]["condition"] == (
            "service_completed_successfully"
        )
    assert services["consolidator"]["deploy"]["replicas"] == 2
    assert services["consolidator"]["ports"] == []  # two replicas cannot share a host port


def test_the_k8s_cluster_overlay_sets_the_same_settings() -> None:
    overlay = yaml.safe_load((REPO / "deploy/k8s/cluster/kustomization.yaml").read_text())
    assert overlay["resources"] == [".."]
    ops = yaml.safe_load(overlay["patches"][0]["patch"])
    values = {op["path"].rsplit("/", 1)[1]: op["value"] for op in ops}
    assert values == {"MEMWORKER_SHARDS": "12", "MEMWORKER_REDIS_CLUSTER": "true"}
