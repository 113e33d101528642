"""Settings read from the environment as the contract names them."""

from __future__ import annotations

import pytest

from worker.settings import Settings


def test_plain_postgres_urls_get_the_asyncpg_driver_and_sslmode_becomes_ssl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db.example/mem?sslmode=require")
    assert Settings().database_url == "postgresql+asyncpg://u:p@db.example/mem?ssl=require"


def test_contract_variables_and_prefixed_settings_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://cache:6380/2")
    monkeypatch.setenv("MEMWORKER_STREAM_PREFIX", "tenant-a")
    monkeypatch.setenv("MEMWORKER_SHARDS", "8")
    settings = Settings()
    assert settings.redis_url == "redis://cache:6380/2"
    assert settings.stream_prefix == "tenant-a"
    assert settings.shards == 8


def test_an_invalid_setting_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMWORKER_SHARDS", "0")
    with pytest.raises(ValueError, match="shards"):
        Settings()


def test_an_empty_setting_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MEMWORKER_METRICS_PORT=`` (a line of an env file left blank) is its default."""
    monkeypatch.setenv("MEMWORKER_METRICS_PORT", "")
    monkeypatch.setenv("MEMWORKER_SHARDS", "")
    monkeypatch.setenv("REDIS_URL", "")
    settings = Settings()
    assert settings.metrics_port == Settings.model_fields["metrics_port"].default
    assert settings.shards == Settings.model_fields["shards"].default
    assert settings.redis_url == Settings.model_fields["redis_url"].default


@pytest.mark.parametrize("token", [" ", "\t", "  \n "])
def test_a_whitespace_only_api_token_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    from pydantic import ValidationError

    from worker.errors import one_line

    monkeypatch.setenv("MEMWORKER_API_TOKEN", token)
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert one_line(raised.value).startswith(
        "invalid configuration: MEMWORKER_API_TOKEN: is only whitespace"
    )


def test_a_redis_host_list_needs_the_sentinel_service() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="MEMWORKER_REDIS_SENTINEL_SERVICE"):
        Settings(redis_url="redis://h1:26379,h2:26379/0")
    assert Settings(redis_url="redis://h1:26379,h2:26379/0", redis_sentinel_service="m")


@pytest.mark.parametrize("given", ["localhost:3000", "ftp://a.example", "https://a.example/app"])
def test_an_allowed_origin_that_is_no_origin_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    from pydantic import ValidationError

    from worker.errors import one_line

    monkeypatch.setenv("MEMWORKER_API_ALLOWED_ORIGINS", f"https://ok.example, {given}")
    with pytest.raises(ValidationError) as raised:
        Settings()
    line = one_line(raised.value)
    assert "MEMWORKER_API_ALLOWED_ORIGINS" in line and repr(given) in line, line
    monkeypatch.setenv("MEMWORKER_API_ALLOWED_ORIGINS", "https://ok.example, http://localhost:3000")
    assert Settings().api_allowed_origins == ["https://ok.example", "http://localhost:3000"]
