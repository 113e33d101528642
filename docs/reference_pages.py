"""The site's reference, generated from the code at build time (an MkDocs hook, mkdocs.yml).

A page holds a marker line ``<!-- reference: NAME -->``; the build replaces it with what
``REFERENCES[NAME]()`` returns, so nothing in the reference is typed twice:

- ``cli``: every command of the Typer app (``worker.cli.app``), its usage, help and options;
- ``settings``: every field of ``worker.settings.Settings`` (environment name, default, the
  field's docstring);
- ``http``: every route of ``memworker serve``'s OpenAPI document;
- ``streams``: the streams of the AsyncAPI document and the events of ``memworker schema``;
- ``alerts``: every alert of ``deploy/prometheus/alerts.yml``;
- ``metrics``: every metric of ``worker/metrics.py`` (name, type, labels, help).

``tests/unit/test_docs_reference.py`` imports this file to check that every setting, command
and route has its line. Nothing here reaches a server or the network.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import typer.main
import yaml

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- reference: (\w+) -->$", re.M)


def _cell(text: str) -> str:
    """``text`` fit for one table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


# -- the command line ---------------------------------------------------------------------


def cli_commands() -> Iterator[tuple[str, Any]]:
    """Every command of ``memworker`` (groups' commands too) as ``(full name, command)``."""
    from worker.cli.app import app

    # Typer carries its own copy of Click: commands and parameters are told apart by shape.
    def walk(prefix: str, command: Any) -> Iterator[tuple[str, Any]]:
        if hasattr(command, "commands"):
            for name in sorted(command.commands):
                yield from walk(f"{prefix} {name}", command.commands[name])
        else:
            yield prefix, command

    yield from walk("memworker", typer.main.get_command(app))


def _option_line(param: Any) -> str:
    if getattr(param, "param_type_name", "") == "option":
        names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
        help_text = param.help or ""
        default = param.default
        shown = (
            f" (default: `{default}`)"
            if default not in (None, False, (), []) and not callable(default)
            else ""
        )
        return f"| {names} | {_cell(help_text)}{shown} |"
    metavar = (param.name or "").upper()
    return f"| `{metavar}` | {_cell(getattr(param, 'help', None) or 'argument')} |"


def cli_markdown() -> str:
    """One section per command: its usage line, its help, a table of its options."""
    out = []
    for name, command in cli_commands():
        context = command.context_class(command, info_name=name)
        usage = " ".join(command.collect_usage_pieces(context))
        out += [f"### `{name}`", "", "```text", f"{name} {usage}".rstrip(), "```", ""]
        out += [inspect.cleandoc(command.help or ""), ""]
        params = [p for p in command.params if p.name != "help" and not p.hidden]
        if params:
            out += ["| option | meaning |", "|---|---|", *map(_option_line, params), ""]
    return "\n".join(out)


# -- settings -----------------------------------------------------------------------------


def setting_docs() -> dict[str, str]:
    """Each ``Settings`` field's docstring (the string right after it in the class body)."""
    source = (ROOT / "worker" / "settings.py").read_text()
    [cls] = [
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Settings"
    ]
    docs = {}
    body = cls.body
    for node, after in pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def setting_env_names() -> dict[str, list[str]]:
    """Each ``Settings`` field's environment variables, the first the one to set."""
    from pydantic import AliasChoices

    from worker.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    names = {}
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names[field] = [str(a) for a in alias.choices]
        elif isinstance(alias, str):
            names[field] = [alias]
        else:
            names[field] = [f"{prefix}{field}".upper()]
    return names


def settings_markdown() -> str:
    from pydantic_core import PydanticUndefined

    from worker.settings import Settings

    docs = setting_docs()
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for field, env in setting_env_names().items():
        info = Settings.model_fields[field]
        default = info.default
        if default is PydanticUndefined and info.default_factory is not None:
            default = info.default_factory()  # type: ignore[call-arg]
        shown = "none" if default is None else f"`{default}`"
        also = f" (or `{'`, `'.join(env[1:])}`)" if len(env) > 1 else ""
        rows.append(f"| `{env[0]}`{also} | {_cell(shown)} | {_cell(docs.get(field, ''))} |")
    return "\n".join(rows) + "\n"


# -- the HTTP API -------------------------------------------------------------------------


def openapi() -> dict[str, Any]:
    """``memworker serve``'s OpenAPI document, as ``/openapi.json`` serves it."""
    from worker.access.http_api import create_app

    app: Any = create_app(lambda: None, token=None, max_bytes=1)  # type: ignore[arg-type,return-value]
    while not hasattr(app, "openapi"):
        app = app.app  # Guard → JsonBodies → the FastAPI app
    document: dict[str, Any] = app.openapi()
    return document


def http_routes() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in openapi()["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def _schema_fields(document: dict[str, Any], ref: str) -> list[str]:
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    required = set(schema.get("required", []))
    return [
        f"`{name}`" + ("" if name in required else "?") for name in schema.get("properties", {})
    ]


def http_markdown() -> str:
    document = openapi()
    out = [_cell(document["info"].get("description", "")), ""]
    for method, path, operation in http_routes():
        out += [f"### `{method} {path}`", ""]
        out += [operation.get("description") or operation.get("summary") or "", ""]
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        ref = body.get("schema", {}).get("$ref")
        if ref:
            fields = ", ".join(_schema_fields(document, ref))
            out += [f"Body (JSON; `?` optional): {fields}.", ""]
    return "\n".join(out)


# -- streams and events -------------------------------------------------------------------


def asyncapi() -> dict[str, Any]:
    from worker.ops.spec import asyncapi_document
    from worker.settings import Settings

    return asyncapi_document(Settings())


def event_models() -> dict[str, Any]:
    from worker.ops.spec import EVENT_MODELS

    return dict(EVENT_MODELS)


def streams_markdown() -> str:
    document = asyncapi()
    out = ["| channel | stream | what flows |", "|---|---|---|"]
    for name, channel in document.get("channels", {}).items():
        address = channel.get("address", "")
        out.append(f"| `{name}` | `{address}` | {_cell(channel.get('description', ''))} |")
    out += ["", "Every event `memworker schema` writes a JSON Schema for:", ""]
    out += ["| event | fields (`?` optional) | what it is |", "|---|---|---|"]
    for name, model in event_models().items():
        schema = model.model_json_schema()
        required = set(schema.get("required", []))
        props = schema.get("properties", {})
        fields = ", ".join(f"`{p}`" + ("" if p in required else "?") for p in props)
        doc = (inspect.getdoc(model) or "").split("\n\n")[0]
        out.append(f"| `{name}` | {fields or '(a union: see its schema)'} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# -- metrics ------------------------------------------------------------------------------


def metrics() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """Every metric of ``worker/metrics.py`` as ``(name as scraped, type, help, labels)``."""
    from prometheus_client.metrics import MetricWrapperBase

    import worker.metrics

    found = []
    for value in vars(worker.metrics).values():
        if isinstance(value, MetricWrapperBase):
            [family] = value.describe()
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = tuple(getattr(value, "_labelnames", ()))
            found.append((name, family.type, family.documentation, labels))
    return found


def metrics_markdown() -> str:
    out = ["| metric | type | labels | what it measures |", "|---|---|---|---|"]
    for name, kind, documentation, labels in metrics():
        shown = ", ".join(f"`{label}`" for label in labels) or "—"
        out.append(f"| `{name}` | {kind} | {shown} | {_cell(documentation)} |")
    return "\n".join(out) + "\n"


# -- alerts -------------------------------------------------------------------------------


def alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def alerts_markdown() -> str:
    out = ["| alert | fires when | for | what to do |", "|---|---|---|---|"]
    for rule in alerts():
        expr = " ".join(str(rule["expr"]).split())
        annotations = rule.get("annotations", {})
        out.append(
            f"| `{rule['alert']}` | `{_cell(expr)}` | {rule.get('for', '—')} "
            f"| {_cell(annotations.get('description', ''))} |"
        )
    return "\n".join(out) + "\n"


REFERENCES: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "settings": settings_markdown,
    "http": http_markdown,
    "streams": streams_markdown,
    "alerts": alerts_markdown,
    "metrics": metrics_markdown,
}


def render(markdown: str) -> str:
    """``markdown`` with every reference marker replaced by its generated text."""

    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in REFERENCES:
            raise ValueError(f"no reference named {name!r} (known: {', '.join(REFERENCES)})")
        return REFERENCES[name]()

    return MARKER.sub(generated, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The MkDocs hook."""
    return render(markdown)


if __name__ == "__main__":  # print one reference: python docs/reference_pages.py settings
    import sys

    print(REFERENCES[sys.argv[1]]())
