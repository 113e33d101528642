"""Credentials: never shown, and never the ones the repository ships.

``mask(text)`` is the one masking function: every URL password (``scheme://user:PASSWORD@``,
Redis, Sentinel and Cluster URLs, Postgres URLs; a Redis URL's lone userinfo,
``redis://SECRET@host``, which ``redis-cli -u`` reads as the password) and every
``password=``/``token=``-style parameter in ``text`` becomes ``***``. Errors
(``worker.errors.one_line``), log lines (``worker.logs``), probes and the CLI's output pass
through it.

``shipped_secret(settings)`` names the setting that holds a secret this repository ships
(``dev-<user>-change-me`` of ``deploy/redis/users.acl`` and ``docker-compose.yml``, the
``change-me`` and ``CHANGE-ME`` placeholders of the README and the Kubernetes example):
the servers and workers refuse to start with one, unless ``MEMWORKER_ALLOW_DEFAULT_SECRETS``
says the stack is a throwaway.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from worker.settings import Settings

MASK = "***"

_URL_PASSWORD = re.compile(
    # scheme://user:password@ — the password may hold an '@' only when another follows
    # (the user name, too, may hold quotes and spaces: a Redis ACL user such as o'brien)
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\n:/@]*:)"
    # the password is everything up to the last '@' before the host, whatever it holds
    # (quotes, spaces, tabs, '@', '/', '#', '%'): the host is what follows an '@' up to a
    # '/', a quote, a space, a comma, a bracket or the end of the line.
    r"(?P<secret>[^\n]*?)@(?=[^\s'\"/@]*(?:[/\s'\",)\]>?#][^\s@]*(?:\s|$)|$))"
)
_REDIS_LONE_USERINFO = re.compile(
    # redis://SECRET@host: redis-py reads a lone userinfo as the user name, but redis-cli -u
    # (and so a URL copied from it) as the password: shown as neither.
    r"(?P<head>(?<![A-Za-z0-9+.-])(?:redis|rediss|valkey|valkeys|unix)://)"
    r"(?P<secret>[^\n:/@]+)@"
)
_PARAMETER = re.compile(
    r"(?P<head>\b(?:password|passwd|pwd|pass|token|api_key|apikey|access_token|secret)=)"
    r"(?P<secret>[^&\s'\";#,]+)",
    re.IGNORECASE,
)


def mask(text: str) -> str:
    """``text`` with every password of a URL and every ``password=…`` value as ``***``."""
    if "=" not in text and "@" not in text:
        return text  # the common case: nothing that could carry one
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    text = _REDIS_LONE_USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _PARAMETER.sub(lambda m: f"{m['head']}{MASK}", text)


_SHIPPED = re.compile(r"(?:dev-[a-z0-9-]+-)?change-?me", re.IGNORECASE)
"""``dev-<user>-change-me`` (compose, users.acl), ``change-me``/``CHANGE-ME`` (README, k8s)."""


def is_shipped(secret: str | None) -> bool:
    """Whether ``secret`` is one this repository ships (anyone can read it)."""
    return secret is not None and _SHIPPED.fullmatch(secret.strip()) is not None


def url_password(url: str) -> str | None:
    """The password a URL carries (in its user part, or as ``?password=``), if any."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    netloc = parts.netloc.split(",", 1)[0]  # Sentinel: the first host carries it
    if "@" in netloc:
        userinfo = netloc.rsplit("@", 1)[0]
        if ":" in userinfo:
            return unquote(userinfo.split(":", 1)[1])
    found = re.search(r"(?:^|&)password=([^&]*)", parts.query)
    return unquote(found.group(1)) if found else None


def shipped_secret(settings: Settings) -> str | None:
    """The setting (its variable's name) holding a secret the repository ships, or None
    (always None with ``MEMWORKER_ALLOW_DEFAULT_SECRETS``)."""
    if settings.allow_default_secrets:
        return None
    if is_shipped(settings.api_token):
        return "MEMWORKER_API_TOKEN"
    if is_shipped(url_password(settings.redis_url)):
        return "REDIS_URL"
    if is_shipped(url_password(settings.database_url)):
        return "DATABASE_URL"
    return None


def refuse_shipped_secrets(settings: Settings) -> None:
    """Raise ``ShippedSecretError`` (one line naming the setting) for a shipped secret."""
    name = shipped_secret(settings)
    if name is not None:
        raise ShippedSecretError(
            f"{name} holds a password this repository ships (anyone can read it): set your "
            "own, or MEMWORKER_ALLOW_DEFAULT_SECRETS=1 for a throwaway stack"
        )


class ShippedSecretError(Exception):
    """A setting holds a secret published in this repository."""
