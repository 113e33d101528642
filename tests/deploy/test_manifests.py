"""The Dockerfile, docker-compose.yml and deploy/k8s reference only what the project has.

No Docker engine or cluster runs here, so these check what can be checked without one: every
file parses; every `memworker` command is a real subcommand; every environment variable is a
real setting; ports, probes and health checks agree with the metrics port each process serves;
every Secret, ConfigMap, Deployment and file referenced exists; the stream names and groups KEDA
watches are the ones the worker uses; the credentials in the compose file are users of the ACL
file and the roles of roles.sql.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from tests.deploy.acl_redis import dev_password
from worker.cli.app import app
from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
ACL_FILE = DEPLOY / "redis" / "users.acl"
MEMWORKER_IMAGES = {"memworker", "memworker:local"}
PREFIX = "agents"


def memworker_commands() -> dict[str, Any]:
    """Every `memworker` subcommand (a click command) by name, ``dlq list`` as "dlq list"."""
    root: Any = typer.main.get_command(app)
    found: dict[str, Any] = {}
    for name, command in root.commands.items():
        found[name] = command
        for sub, subcommand in getattr(command, "commands", {}).items():
            found[f"{name} {sub}"] = subcommand
    return found


TLS_VARIABLES = {"SSL_CERT_FILE", "SSL_CERT_DIR", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"}
"""Read by OpenSSL and asyncpg, not by Settings: the CA and client certificates (deploy/TLS.md)."""

MODEL_VARIABLES = {"MEMWORKER_EMBEDDING_CACHE_DIR"}
"""Read by the local embedder, not by Settings: where the int8 ONNX file is (the image's copy)."""

GENERATED_SOURCES = {"build/wheels"}
"""COPY sources `make images` makes before it builds (deploy/images.sh), git-ignored."""


def setting_variables() -> set[str]:
    names = {"REDIS_URL", "DATABASE_URL"} | TLS_VARIABLES | MODEL_VARIABLES
    return names | {f"MEMWORKER_{field.upper()}" for field in Settings.model_fields}


def assert_memworker_args(args: list[str], where: str) -> None:
    """``args`` (after the entry point) name a real subcommand with real options."""
    commands = memworker_commands()
    assert args, f"{where}: no memworker subcommand"
    name = " ".join(args[:2]) if " ".join(args[:2]) in commands else args[0]
    assert name in commands, f"{where}: `memworker {args[0]}` is not a memworker command"
    options = {opt for param in commands[name].params for opt in getattr(param, "opts", [])}
    for arg in args[len(name.split()) :]:
        if arg.startswith("--"):
            assert arg.split("=")[0] in options, f"{where}: `memworker {name}` has no {arg}"


def metrics_port_of(args: list[str]) -> int | None:
    if "--metrics-port" in args:
        return int(args[args.index("--metrics-port") + 1])
    return None


def resolve(value: str) -> str:
    """Compose interpolation with the defaults (``${VAR:-default}``), as with no .env file."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def acl_users() -> dict[str, str]:
    """User → the SHA-256 password hash users.acl gives it (enabled users only)."""
    users: dict[str, str] = {}
    for line in ACL_FILE.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "user" and "on" in parts:
            hashes = [p[1:] for p in parts if p.startswith("#")]
            users[parts[1]] = hashes[0] if hashes else ""
    return users


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- Dockerfile --------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_the_image_is_slim_runs_as_a_non_root_user_and_starts_the_lifecycle_worker() -> None:
    instructions = dockerfile_instructions()
    # every stage's base is the BASE build argument: `make images` passes the Debian base it
    # makes from Debian's packages, a user with Docker Hub passes debian:bookworm-slim
    bases = [rest.split()[0] for kw, rest in instructions if kw == "FROM"]
    assert bases and all(b == "${BASE}" for b in bases)
    assert ("ARG", "BASE=memworker-base:bookworm") in instructions
    users = [rest for kw, rest in instructions if kw == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert ("ENTRYPOINT", '["memworker"]') in instructions
    cmd = [yaml.safe_load(rest) for kw, rest in instructions if kw == "CMD"]
    assert cmd[-1] == ["run"]
    assert_memworker_args(cmd[-1], "Dockerfile CMD")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["memworker"] == "worker.cli:main"
    installs = [rest for kw, rest in instructions if kw == "RUN" and "pip install" in rest]
    assert installs and all("[dev]" not in r and "-e " not in r for r in installs)


def test_the_image_copies_only_sources_that_exist_and_the_dockerignore_lets_them_in() -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for keyword, rest in dockerfile_instructions():
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = rest.split()
        for source in sources:
            if source in GENERATED_SOURCES:
                assert source in (DEPLOY / "images.sh").read_text(), source
                assert REPO.joinpath(".gitignore").read_text().count("build/") >= 1
                assert source.rstrip("/") in allowed, f"COPY {source}: excluded by .dockerignore"
                continue
            assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
            let_in = {source.rstrip("/"), *(str(p) for p in Path(source).parents)}
            assert let_in & allowed, f"COPY {source}: excluded by .dockerignore"


def test_the_image_health_check_asks_readyz_on_the_port_it_exposes() -> None:
    instructions = dict(dockerfile_instructions())
    assert "/readyz" in instructions["HEALTHCHECK"]
    assert "curl" not in instructions["HEALTHCHECK"] and "wget" not in instructions["HEALTHCHECK"]
    env = instructions["ENV"]
    port = re.search(r"MEMWORKER_METRICS_PORT=(\d+)", env)
    assert port is not None
    assert instructions["EXPOSE"] == port.group(1)
    for name in re.findall(r"(MEMWORKER_[A-Z_]+)=", env):
        assert name in setting_variables()


# -- docker-compose.yml ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def memworker_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if resolve(service.get("image", "")) in MEMWORKER_IMAGES
    }


def test_compose_builds_the_image_from_the_dockerfile_and_runs_real_commands(
    compose: dict[str, Any],
) -> None:
    services = memworker_services(compose)
    assert set(services) == {"migrate", "worker", "consolidator", "indexer", "api"}
    for name, service in services.items():
        build = service["build"]
        assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert_memworker_args(service["command"], f"compose service {name}")
    assert services["worker"]["command"][0] == "run"
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["consolidator"]["command"][0] == "consolidate"
    assert services["migrate"]["command"] == ["migrate"]
    assert services["indexer"]["command"][0] == "index"
    assert services["api"]["command"][0] == "serve"


def test_compose_serves_the_api_with_a_token_and_probes_its_readyz(
    compose: dict[str, Any],
) -> None:
    api = compose["services"]["api"]
    command = api["command"]
    port = int(command[command.index("--port") + 1])
    assert f"http://127.0.0.1:{port}/readyz" in " ".join(api["healthcheck"]["test"])
    assert [resolve(p) for p in api["ports"]] == [f"127.0.0.1:{port}:{port}"]
    assert resolve(api["environment"]["MEMWORKER_API_TOKEN"])
    url = urlsplit(resolve(api["environment"]["REDIS_URL"]))
    assert url.username == "operator" and sha256(url.password or "") == acl_users()["operator"]


def test_compose_sets_only_real_settings(compose: dict[str, Any]) -> None:
    for name, service in memworker_services(compose).items():
        for variable in service.get("environment", {}):
            assert variable in setting_variables(), f"{name}: {variable} is no setting"
        env = service["environment"]
        assert env["MEMWORKER_STREAM_PREFIX"] == PREFIX
        assert (
            env["MEMWORKER_SHARDS"]
            == compose["services"]["worker"]["environment"]["MEMWORKER_SHARDS"]
        )


def test_compose_health_checks_ask_readyz_on_the_metrics_port_each_process_serves(
    compose: dict[str, Any],
) -> None:
    for name in ("worker", "consolidator", "indexer"):
        service = compose["services"][name]
        port = metrics_port_of(service["command"])
        assert port is not None
        assert service["environment"]["MEMWORKER_METRICS_PORT"] == str(port)
        check = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in check
        assert "curl" not in check and "wget" not in check
        assert service["restart"] == "unless-stopped"
        for published in service.get("ports", []):
            assert resolve(published).endswith(f":{port}")
    assert compose["services"]["migrate"]["restart"] == "no"


def test_compose_runs_redis_with_an_append_only_file_and_the_acl_file(
    compose: dict[str, Any],
) -> None:
    redis = compose["services"]["redis"]
    # our image (Redis 8 from Debian trixie: users.acl's selectors need 7.2 or later)
    assert resolve(redis["image"]) == "memworker-redis:local"
    assert (REPO / redis["build"]["context"] / "Dockerfile").exists()
    command = redis["command"]
    pairs = dict(zip(command[1::2], command[2::2], strict=False))
    assert pairs["--appendonly"] == "yes"
    assert pairs["--appendfsync"] == "everysec"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in redis["volumes"] if v.startswith("./")}
    assert (REPO / mounts[pairs["--aclfile"]]).resolve() == ACL_FILE
    check = " ".join(redis["healthcheck"]["test"])
    assert "ping" in check and "--user healthcheck" in check
    assert resolve(redis["environment"]["REDIS_HEALTHCHECK_PASSWORD"]) == dev_password(
        "healthcheck"
    )
    assert "healthcheck" in acl_users()
    postgres = compose["services"]["postgres"]
    assert any(v.startswith("postgres-data:") for v in postgres["volumes"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_compose_orders_roles_migration_grants_and_workers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for needed, condition in service.get("depends_on", {}).items():
            assert needed in services, f"{name} depends on a missing service {needed}"
            assert condition["condition"] in {
                "service_healthy",
                "service_completed_successfully",
                "service_started",
            }
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[needed]

    def after(name: str) -> dict[str, str]:
        return {k: v["condition"] for k, v in services[name]["depends_on"].items()}

    assert after("db-roles") == {"postgres": "service_healthy"}
    assert after("migrate") == {"db-roles": "service_completed_successfully"}
    assert after("db-grants") == {"migrate": "service_completed_successfully"}
    assert after("worker") == {"redis": "service_healthy"}
    assert after("consolidator") == {
        "redis": "service_healthy",
        "db-grants": "service_completed_successfully",
    }
    for name in ("db-roles", "db-grants"):
        mounts = [v for v in services[name]["volumes"] if v.startswith("./")]
        assert [(REPO / m.split(":")[0]).resolve() for m in mounts] == [
            DEPLOY / "postgres" / "roles.sql"
        ]


def test_compose_credentials_are_the_acl_users_and_the_postgres_roles(
    compose: dict[str, Any],
) -> None:
    users = acl_users()
    expected = {"worker": "lifecycle-worker", "consolidator": "consolidator", "indexer": "indexer"}
    for name, user in expected.items():
        url = urlsplit(resolve(compose["services"][name]["environment"]["REDIS_URL"]))
        assert url.username == user
        assert url.password is not None and sha256(url.password) == users[user]
        assert url.hostname == "redis" and url.port == 6379
    options = resolve(compose["services"]["db-roles"]["environment"]["PGOPTIONS"])
    passwords = dict(re.findall(r"memworker\.(\w+)_password=(\S+)", options))
    roles = {"migrate": "owner", "consolidator": "runtime", "indexer": "runtime", "api": "runtime"}
    for name, role in roles.items():
        url = urlsplit(resolve(compose["services"][name]["environment"]["DATABASE_URL"]))
        assert url.username == f"memworker_{role}"
        assert url.password == passwords[role]
        assert url.hostname == "postgres" and url.path == "/memworker"
    assert "DATABASE_URL" not in compose["services"]["worker"]["environment"]


def test_every_acl_user_has_its_documented_development_password() -> None:
    users = acl_users()
    assert set(users) == {
        "healthcheck",
        "lifecycle-worker",
        "consolidator",
        "publisher",
        "subscriber",
        "agent",
        "operator",
        "keda",
        "indexer",
    }
    for user, digest in users.items():
        assert digest == sha256(dev_password(user)), user
    first = ACL_FILE.read_text().splitlines()[0].split()
    assert first[:3] == ["user", "default", "off"]


def test_the_acl_key_patterns_are_written_for_the_configured_stream_prefix() -> None:
    patterns = set(re.findall(r"~([^\s)]+)", ACL_FILE.read_text()))
    patterns.discard("*")
    assert patterns and all(p.startswith(f"{PREFIX}:") for p in patterns)


# -- deploy/k8s --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's own file, not a resource
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert isinstance(doc, dict), f"{path.name}: not a mapping"
            assert {"apiVersion", "kind"} <= set(doc), f"{path.name}: no apiVersion/kind"
            doc["_file"] = path.name
            docs.append(doc)
    return docs


def of_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests if d["kind"] == kind}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def test_kustomization_lists_every_manifest_but_the_example_secrets(
    manifests: list[dict[str, Any]],
) -> None:
    loaded = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert loaded["kind"] == "Kustomization"
    assert all(doc["kind"] != "Kustomization" for doc in manifests)
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(loaded["resources"]) == files


def test_workloads_run_real_memworker_commands_with_real_settings(
    manifests: list[dict[str, Any]],
) -> None:
    config_maps = of_kind(manifests, "ConfigMap")
    secrets = of_kind(manifests, "Secret")
    workloads = [*of_kind(manifests, "Deployment").values(), *of_kind(manifests, "Job").values()]
    assert workloads
    for variable in config_maps["memworker-settings"]["data"]:
        assert variable in setting_variables(), f"ConfigMap sets {variable}, no setting"
    assert config_maps["memworker-settings"]["data"]["MEMWORKER_STREAM_PREFIX"] == PREFIX
    for workload in workloads:
        for container in all_containers(pod_spec(workload)):
            where = f"{workload['metadata']['name']}/{container['name']}"
            for ref in container.get("envFrom", []):
                assert ref["configMapRef"]["name"] in config_maps, where
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] in secrets, f"{where}: no Secret {ref['name']}"
                    assert ref["key"] in secrets[ref["name"]]["stringData"], where
            if container["image"] not in MEMWORKER_IMAGES:
                # the psql steps: `make images` builds memworker-postgres (psql and pgvector)
                assert container["image"] == "memworker-postgres:local", where
                assert container["command"][:1] == ["psql"], where
                continue
            assert "command" not in container, f"{where}: keep the image's entry point"
            assert_memworker_args(container["args"], where)
            for env in container.get("env", []):
                assert env["name"] in setting_variables(), f"{where}: {env['name']} no setting"


def test_deployments_probe_readyz_and_healthz_on_the_metrics_port_they_serve(
    manifests: list[dict[str, Any]],
) -> None:
    deployments = of_kind(manifests, "Deployment")
    assert set(deployments) == {
        "memworker-worker",
        "memworker-consolidator",
        "memworker-indexer",
        "memworker-api",
    }
    commands = {"memworker-worker": "run", "memworker-consolidator": "consolidate"}
    commands["memworker-indexer"] = "index"
    commands["memworker-api"] = "serve"  # its probes and /metrics are on the API's port
    for name, deployment in deployments.items():
        spec = pod_spec(deployment)
        (container,) = spec["containers"]
        args = container["args"]
        assert args[0] == commands[name]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        port: int | None
        if name == "memworker-api":
            port = int(args[args.index("--port") + 1])
            assert ports == {"http": port}
        else:
            port = metrics_port_of(args)
            assert ports == {"metrics": port}
        ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
        assert ready["path"] == "/readyz" and live["path"] == "/healthz"
        assert ports[ready["port"]] == port and ports[live["port"]] == port
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"])
        assert "memory" in resources["limits"]
        assert spec["terminationGracePeriodSeconds"] >= 60
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()


def test_each_deployment_has_a_pod_disruption_budget_selecting_its_pods(
    manifests: list[dict[str, Any]],
) -> None:
    budgets = of_kind(manifests, "PodDisruptionBudget")
    for name, deployment in of_kind(manifests, "Deployment").items():
        budget = budgets[name]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"].get("minAvailable", 0) < deployment["spec"]["replicas"]


def test_the_migrate_job_runs_roles_migrate_and_grants_in_order(
    manifests: list[dict[str, Any]],
) -> None:
    job = of_kind(manifests, "Job")["memworker-migrate"]
    spec = pod_spec(job)
    steps = [c["name"] for c in all_containers(spec)]
    assert steps == ["db-roles", "migrate", "db-grants"]
    migrate = spec["initContainers"][1]
    assert migrate["args"] == ["migrate"]
    assert {e["name"] for e in migrate["env"]} == {"DATABASE_URL"}  # not the admin password
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in (spec["initContainers"][0], spec["containers"][0]):
        assert container["command"][:1] == ["psql"]
        assert "/sql/roles.sql" in container["command"]
        (mount,) = container["volumeMounts"]
        assert volumes[mount["name"]]["configMap"]["name"] == "memworker-postgres-roles"
    assert spec["restartPolicy"] == "Never"


def test_keda_scales_each_group_on_the_streams_the_workers_read(
    manifests: list[dict[str, Any]],
) -> None:
    deployments = of_kind(manifests, "Deployment")
    auths = of_kind(manifests, "TriggerAuthentication")
    secrets = of_kind(manifests, "Secret")
    scaled = of_kind(manifests, "ScaledObject")
    streams = StreamKeys(PREFIX, 0)
    expected = {
        "memworker-worker": (streams.lifecycle, LIFECYCLE_GROUP),
        "memworker-consolidator": (streams.results, CONSOLIDATION_GROUP),
    }
    assert set(scaled) == set(expected)
    for name, obj in scaled.items():
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
        assert obj["spec"]["minReplicaCount"] >= 1
        triggers = obj["spec"]["triggers"]
        assert all(t["type"] == "redis-streams" for t in triggers)
        for trigger in triggers:
            meta = trigger["metadata"]
            assert (meta["stream"], meta["consumerGroup"]) == expected[name]
            auth = auths[trigger["authenticationRef"]["name"]]
            for ref in auth["spec"]["secretTargetRef"]:
                assert ref["key"] in secrets[ref["name"]]["stringData"]
        assert any("pendingEntriesCount" in t["metadata"] for t in triggers)
    keda_user = secrets["memworker-keda"]["stringData"]["username"]
    assert keda_user in acl_users()


def test_every_workload_runs_an_image_make_images_builds(manifests: list[dict[str, Any]]) -> None:
    workloads = [*of_kind(manifests, "Deployment").values(), *of_kind(manifests, "Job").values()]
    images = {c["image"] for w in workloads for c in all_containers(pod_spec(w))}
    assert images == {"memworker:local", "memworker-postgres:local"}
    makefile = (REPO / "Makefile").read_text()
    for image in images:
        assert image in makefile, f"{image}: `make images` does not build it"


def test_each_example_secret_names_a_redis_acl_user_and_a_postgres_role_of_roles_sql(
    manifests: list[dict[str, Any]],
) -> None:
    examples = [d for d in yaml.safe_load_all((K8S / "secret.example.yaml").read_text()) if d]
    roles = set(
        re.findall(r"\b(memworker_[a-z]+)\b", (DEPLOY / "postgres" / "roles.sql").read_text())
    )
    users = acl_users()
    used = {ref["name"] for ref in secret_refs(manifests)}
    assert used <= {d["metadata"]["name"] for d in examples}, (
        "a workload reads a Secret with no example"
    )
    for secret in examples:
        data = secret["stringData"]
        where = secret["metadata"]["name"]
        if "REDIS_URL" in data:
            assert urlsplit(data["REDIS_URL"]).username in users, f"{where}: no such ACL user"
        if "DATABASE_URL" in data:
            assert urlsplit(data["DATABASE_URL"]).username in roles, f"{where}: no such role"
    indexer = next(d for d in examples if d["metadata"]["name"] == "memworker-indexer")
    assert urlsplit(indexer["stringData"]["REDIS_URL"]).username == "indexer"  # its own user


def secret_refs(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workloads = [*of_kind(manifests, "Deployment").values(), *of_kind(manifests, "Job").values()]
    refs = []
    for workload in workloads:
        for container in all_containers(pod_spec(workload)):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    refs.append(ref)
    return refs
