"""Sites whose Redis wants a password and speaks TLS only: production Redis set-ups work as they are."""

from __future__ import annotations

import shutil

import pytest
import redis

from testing.local_sites import LocalCluster
from tests.support.services import RawService, pop_replies, push_request


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="making a test certificate needs openssl")
def test_round_trip_through_password_protected_tls_redis() -> None:
    cluster = LocalCluster(size=2, redis_password="s3cret pass", redis_tls=True).start()
    try:
        url = cluster.redis[0].url
        assert url.startswith("rediss://:s3cret pass@")
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(url.replace("rediss://", "redis://").split("?")[0]).ping()
        with redis.Redis.from_url(url) as site1, RawService(cluster.redis[1].url, "echo.tls"):
            (reply,) = pop_replies(site1, push_request(site1, [2], "echo.tls", b"over tls"), 1)
        assert (reply.err, reply.payload) == ("", b"over tls")
        for site in cluster.sites:
            assert "s3cret" not in site.log(), "the password is never logged"
    finally:
        cluster.cleanup()
