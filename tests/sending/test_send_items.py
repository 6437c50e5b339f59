"""What one instance of a site hands another with the word of new work: the send-queue items themselves."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from msgbusd.sending.send_items import SendItems
from msgbusd.store.queues import Store
from wire import keys
from wire.envelope import Envelope


def test_items_carried_to_another_instance_are_the_items_it_would_have_read(
    async_redis: aioredis.Redis,
) -> None:
    items = SendItems(Store(async_redis), twin=1)
    original = Envelope(uid="caller-uid", cmd="svc.do", exp=60, retries=3, dat="aGk=\n", dst=(2, 3), ret="me")
    request = items.request("2.17", original, failures=1)
    reply = items.reply(
        keys.reply_key(4, "4.9"),
        Envelope(uid="4.9", cmd="svc.do", dat="b2s=", dst=(4,), src=1),
        {"first": 1.5},
    )
    carried = items.pack([request, reply])
    assert items.unpack(carried) == [request, reply]
    # The word of two batches is their two packs one after the other.
    assert items.unpack(carried + b"\n" + items.pack([reply])) == [request, reply, reply]
    assert request.envelope.uid == "2.17" and request.envelope.retries == 2 and request.envelope.dst == (2,)


@pytest.mark.parametrize(
    "carried",
    [
        b"",
        b'["req:2.1",0]',
        b'["req:2.1",0]\n{"not":"an envelope"',
        b'{"entry":"req:2.1"}\n{}',
        b'["req:nodestination",0]\n{}',
        b'["req:2.1",{"first":1}]\n{}',
        b'["rep:1|2.1",0]\n{}',
        b'["other",0]\n{}',
        b"\xff\n\xfe",
    ],
)
def test_carried_work_that_is_not_items_is_refused(async_redis: aioredis.Redis, carried: bytes) -> None:
    with pytest.raises(ValueError):
        SendItems(Store(async_redis), twin=1).unpack(carried)
