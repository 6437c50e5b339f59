"""Redis URLs: redis-py's own, and redis+sentinel:// for a Redis that fails over."""

from __future__ import annotations

import pytest

from wire.redis_url import RedisUrlError, SentinelUrl, parse_sentinel_url, redacted


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    assert parse_sentinel_url("redis+sentinel://:s3cret@10.0.0.1:26379,[::1]:26380/main/2") == SentinelUrl(
        (("10.0.0.1", 26379), ("::1", 26380)), "main", 2, "s3cret"
    )
    assert parse_sentinel_url("redis+sentinel://h:26379/main") == SentinelUrl((("h", 26379),), "main")
    assert parse_sentinel_url("redis://localhost:6379/0") is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "name the master"),
        ("redis+sentinel://h:26379/", "name the master"),
        ("redis+sentinel://h/main", "HOST:PORT"),
        ("redis+sentinel://h:26379,:1/main", "HOST:PORT"),
        ("redis+sentinel://h:26379/main/zero", "database"),
    ],
)
def test_a_wrong_sentinel_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError, match=says):
        parse_sentinel_url(url)


def test_the_password_is_never_shown() -> None:
    assert redacted("redis+sentinel://:s3cret@h:1,h:2/main") == "redis+sentinel://:***@h:1,h:2/main"
    assert redacted("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"
