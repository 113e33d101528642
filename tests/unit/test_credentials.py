"""``worker.credentials``: every password form a URL or a line can carry is masked, nothing
else is touched; the secrets the repository ships are recognised, others are not."""

from __future__ import annotations

import pytest

from worker.credentials import is_shipped, mask, shipped_secret, url_password
from worker.settings import Settings


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        ("redis://publisher:S3cret@host:6399/0", "redis://publisher:***@host:6399/0"),
        ("rediss://:S3cret@host:6380/0", "rediss://:***@host:6380/0"),
        ("redis://u:p@ss@w0rd@h:1/0", "redis://u:***@h:1/0"),
        ("redis://u:S3cret@h1:26379,h2:26379/0", "redis://u:***@h1:26379,h2:26379/0"),
        (
            "cannot reach Postgres at postgresql+asyncpg://app:S3cret@db:5432/m?ssl=require: x",
            "cannot reach Postgres at postgresql+asyncpg://app:***@db:5432/m?ssl=require: x",
        ),
        ("redis://h:1/0?password=S3cret&db=1", "redis://h:1/0?password=***&db=1"),
        ("unix:///run/r.sock?db=0&password=S3cret", "unix:///run/r.sock?db=0&password=***"),
        ('{"error": "to redis://a:S3cret@h/0"}', '{"error": "to redis://a:***@h/0"}'),
        ("host=db password=S3cret dbname=m", "host=db password=*** dbname=m"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        # a lone userinfo: redis-cli -u reads it as the password
        ("redis://S3cretXYZ@127.0.0.1:1/0", "redis://***@127.0.0.1:1/0"),
        ("error: rediss://S3cret@h:6380 down", "error: rediss://***@h:6380 down"),
        ("postgresql://postgres@127.0.0.1/postgres", "postgresql://postgres@127.0.0.1/postgres"),
        (
            "no secret here: user ann@example.com said a=b",
            "no secret here: user ann@example.com said a=b",
        ),
    ],
)
def test_every_password_form_is_masked_and_nothing_else(shown: str, expected: str) -> None:
    assert mask(shown) == expected


def test_the_secrets_the_repository_ships_are_known() -> None:
    for shipped in ("dev-api-token-change-me", "dev-lifecycle-worker-change-me", "CHANGE-ME"):
        assert is_shipped(shipped), shipped
    for own in ("change-me-not", "a-real-token", "", None):
        assert not is_shipped(own), own
    assert url_password("redis://u:dev-u-change-me@h/0") == "dev-u-change-me"
    assert url_password("redis://h/0?password=x%40y") == "x@y"
    assert url_password("redis://u:p%3A@h1:1,h2:2/0") == "p:"
    named = Settings(redis_url="redis://operator:dev-operator-change-me@h:6379/0")
    assert shipped_secret(named) == "REDIS_URL"
    assert shipped_secret(named.model_copy(update={"allow_default_secrets": True})) is None


@pytest.mark.parametrize(
    "password", ["S3c'ret9", 'ab"cd', "pa ss", "sec\tx", "a@b", "a/b", "a#b", "a%b", "x'y\"z @/#%w"]
)
@pytest.mark.parametrize("scheme", ["redis", "postgresql"])
def test_mask_hides_a_password_of_any_characters_inside_an_error(
    scheme: str, password: str
) -> None:
    text = f"cannot reach {scheme}://user:{password}@127.0.0.1:1/0: Connection refused"
    masked = mask(text)
    assert password not in masked
    assert masked == f"cannot reach {scheme}://user:***@127.0.0.1:1/0: Connection refused"


@pytest.mark.parametrize("user", ["o'brien", 'pub"lisher', "pub lisher", "a\tb"])
@pytest.mark.parametrize("scheme", ["redis", "rediss", "postgresql+asyncpg"])
def test_mask_hides_the_password_whatever_the_user_name_holds(scheme: str, user: str) -> None:
    # a Redis ACL user may be named o'brien: the password after it is masked all the same
    text = f"cannot reach Redis at {scheme}://{user}:S3cretQ@127.0.0.1:6399/0: Error 111"
    masked = mask(text)
    assert "S3cretQ" not in masked
    assert masked == f"cannot reach Redis at {scheme}://{user}:***@127.0.0.1:6399/0: Error 111"
    lone = mask(f"down: redis://{user}@127.0.0.1:6399/0")
    assert lone == "down: redis://***@127.0.0.1:6399/0"
