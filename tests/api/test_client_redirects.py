"""The client against several instances: it follows a 307 to a topic's owner with its token,
sends that topic's requests to the owner from then on, and looks the topic up again after a
503 or when the owner cannot be reached. The instances here are an ``httpx.MockTransport``
playing two hosts (the real thing: tests/e2e/test_several_instances.py)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from api.client import AsyncClient, AuthenticationToken, Client, TransportError

A, B = "http://a.test:8080", "http://b.test:8080"
PRODUCE = "/topics/persistent/public/default/t"


class TwoInstances:
    """``a`` redirects every request for the topic to ``b``, which owns it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []  # host, path, Authorization
        self.b_answers: list[int] = []  # statuses b answers first (then 200)
        self.b_down = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.seen.append((host, request.url.path, request.headers.get("authorization")))
        if host == "a.test":
            return httpx.Response(
                307, json={"reason": "owned by b"}, headers={"Location": B + request.url.raw_path.decode()}
            )
        if self.b_down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.b_answers:
            return httpx.Response(self.b_answers.pop(0), json={"reason": "lease lapsed"})
        return httpx.Response(200, json={"messageIds": ["1:0"]})


def test_follows_the_redirect_with_the_token_and_remembers_the_owner() -> None:
    instances = TwoInstances()
    with Client(
        A, transport=httpx.MockTransport(instances), authentication=AuthenticationToken("tok")
    ) as client:
        producer = client.create_producer("public/default/t")
        producer.send(b"1", key="k")
        producer.send(b"2", key="k")
    # Opening the producer (a lookup of the topic's compaction status) is redirected; from then
    # on every request about the topic goes to the owner directly.
    assert [(h, p == PRODUCE) for h, p, _ in instances.seen] == [
        ("a.test", False),
        ("b.test", False),
        ("b.test", True),
        ("b.test", True),
    ]
    assert {auth for _, _, auth in instances.seen} == {"Bearer tok"}


def test_a_503_or_an_unreachable_owner_sends_the_retry_through_lookup_again() -> None:
    instances = TwoInstances()
    with Client(A, transport=httpx.MockTransport(instances)) as client:
        producer = client.create_producer("public/default/t")
        producer.send(b"1", key="k")
        instances.seen.clear()
        instances.b_answers = [503]
        producer.send(b"2", key="k")
        assert [h for h, p, _ in instances.seen if p == PRODUCE] == ["b.test", "a.test", "b.test"]
        instances.seen.clear()
        instances.b_down = True
        client.retry_unavailable_s = 0.3
        with pytest.raises(TransportError):  # b stays down: the client gives up in time
            producer.send(b"3", key="k")
        hosts = [h for h, p, _ in instances.seen if p == PRODUCE]
        assert hosts[:3] == ["b.test", "a.test", "b.test"]


def test_several_service_urls_are_tried_in_turn_and_async_follows_too() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        if request.url.host == "down.test":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=["persistent://public/default/t"])

    with Client("http://down.test:1,http://up.test:2", transport=httpx.MockTransport(handler)) as client:
        assert client.admin.topics.list("public/default") == ["persistent://public/default/t"]
    assert calls == ["down.test", "up.test"]

    instances = TwoInstances()

    async def run() -> None:
        async with AsyncClient(A, transport=httpx.MockTransport(instances)) as client:
            producer = await client.create_producer("public/default/t")
            await producer.send(b"1", key="k")
            await producer.send(b"2", key="k")

    asyncio.run(run())
    assert [h for h, _, _ in instances.seen] == ["a.test", "b.test", "b.test", "b.test"]
