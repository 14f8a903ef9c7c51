"""Retries on 503 with `Retry-After`, against a local stub that answers from a script (the
real server's `overloaded` needs a full queue, which no test can hold still)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import msgpack
import pytest

from rankserve_client import AsyncClient, Client, RankserveError
from rankserve_client.client import retry_after

READY = {"ready": True, "rankers_loaded": 1, "gpu": None}
OVERLOADED = {"error": {"code": "overloaded", "message": "the queue for ranker \"m\" is full"}}


class Stub:
    """Answers each request with the next (status, headers, body) of `replies`, repeating the
    last; records every request's path and headers."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, dict[str, str], bytes]] = []
        self.seen: list[tuple[str, dict[str, str]]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.seen.append((self.path, dict(self.headers)))
                status, headers, body = stub.replies[min(len(stub.seen), len(stub.replies)) - 1]
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"


@pytest.fixture
def stub() -> Iterator[Stub]:
    stub = Stub()
    thread = threading.Thread(target=stub.http.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield stub
    stub.http.shutdown()
    stub.http.server_close()


def overloaded(after: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"content-type": "application/msgpack"}
    if after is not None:
        headers["retry-after"] = after
    return 503, headers, msgpack.packb(OVERLOADED)


def ready() -> tuple[int, dict[str, str], bytes]:
    return 200, {"content-type": "application/json"}, json.dumps(READY).encode()


def test_a_503_with_retry_after_is_retried_until_it_passes(stub: Stub) -> None:
    stub.replies = [overloaded("0"), overloaded("0.2"), ready()]
    started = time.monotonic()
    with Client(stub.url) as client:
        assert client.health().ready
    assert len(stub.seen) == 3
    assert time.monotonic() - started >= 0.2  # the server's wait was kept
    assert stub.seen[0][1]["accept"] == "application/msgpack"


def test_async_retries_the_same_way(stub: Stub) -> None:
    stub.replies = [overloaded("0"), ready()]

    async def main() -> bool:
        async with AsyncClient(stub.url, format="json") as client:
            return (await client.health()).ready

    assert asyncio.run(main())
    assert len(stub.seen) == 2


def test_retries_are_bounded(stub: Stub) -> None:
    stub.replies = [overloaded("0")]
    with Client(stub.url, retries=2) as client, pytest.raises(RankserveError) as caught:
        client.health()
    assert len(stub.seen) == 3
    assert (caught.value.status, caught.value.code) == (503, "overloaded")
    assert caught.value.retry_after == 0.0


def test_a_wait_longer_than_allowed_is_not_waited(stub: Stub) -> None:
    stub.replies = [overloaded("60")]
    with Client(stub.url, max_retry_wait=5) as client, pytest.raises(RankserveError) as caught:
        client.health()
    assert len(stub.seen) == 1
    assert caught.value.retry_after == 60.0


def test_a_503_without_retry_after_is_not_retried(stub: Stub) -> None:
    stub.replies = [overloaded(None)]
    with Client(stub.url) as client, pytest.raises(RankserveError):
        client.health()
    assert len(stub.seen) == 1


def test_an_error_not_in_the_server_format_keeps_status_and_text(stub: Stub) -> None:
    stub.replies = [(502, {"content-type": "text/html"}, b"<h1>Bad Gateway</h1>")]
    with Client(stub.url) as client, pytest.raises(RankserveError) as caught:
        client.health()
    assert (caught.value.status, caught.value.code) == (502, "http_502")
    assert "Bad Gateway" in caught.value.message


def test_retry_after_reads_seconds_and_http_dates() -> None:
    def reply(value: str) -> httpx.Response:
        return httpx.Response(503, headers={"retry-after": value})

    assert retry_after(reply("3")) == 3.0
    assert retry_after(reply("-1")) == 0.0
    assert retry_after(reply("soon")) is None
    assert retry_after(httpx.Response(503)) is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    after = retry_after(reply(later))
    assert after is not None and 25 <= after <= 31
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after(reply(past)) == 0.0
