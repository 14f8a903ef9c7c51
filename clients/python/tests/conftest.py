"""A real `rankserve serve` on loopback for the tests, and each client in each body format.

The binary is `$RANKSERVE_BIN`, else the repository's `target/debug/rankserve` (what `cargo
test` builds); a missing binary fails the tests rather than skipping them. The server serves
copies of the bundled rankers `small` and `medium` (uploads and deletes touch only the copies)
and the demo index it builds from `fixtures/corpus.jsonl`, on a port the system picks.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankserve_client import AsyncClient, Client

REPO = Path(__file__).resolve().parents[3]
ADMIN_TOKEN = "test-token"


@dataclass(frozen=True)
class Server:
    url: str
    rankers: Path
    log: Path


def _listening_addr(log: Path, process: subprocess.Popen[bytes], timeout: float) -> str:
    """The address from the server's JSON `listening` log line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            try:
                fields = json.loads(line)["fields"]
            except (ValueError, KeyError):
                continue
            if fields.get("message") == "listening":
                return str(fields["addr"])
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"rankserve did not start listening:\n{log.read_text()}")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = Path(os.environ.get("RANKSERVE_BIN", REPO / "target" / "debug" / "rankserve"))
    if not binary.is_file():
        pytest.fail(f"no rankserve binary at {binary}: build it (cargo build) or set RANKSERVE_BIN")
    work = tmp_path_factory.mktemp("rankserve")
    rankers = work / "rankers"
    rankers.mkdir()
    for name in ("small", "medium"):
        shutil.copy(REPO / "rankers" / f"{name}.json", rankers)
    log = work / "server.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [
                str(binary), "serve", "--addr", "127.0.0.1:0", "--log-format", "json",
                "--rankers", str(rankers), "--data-dir", str(work / "data"),
                "--backend", "cpu", "--cpu-threads", "2",
            ],
            cwd=REPO,  # the demo index's corpus is fixtures/corpus.jsonl
            env={**os.environ, "RANKSERVE_ADMIN_TOKEN": ADMIN_TOKEN},
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        url = "http://" + _listening_addr(log, process, timeout=60)
        with Client(url) as client:
            deadline = time.monotonic() + 60
            while not client.ready().ready:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rankserve did not get ready:\n{log.read_text()}")
                time.sleep(0.05)
        yield Server(url, rankers, log)
    finally:
        process.terminate()
        process.wait(timeout=30)


class AsyncAsSync:
    """An `AsyncClient` whose coroutines run to completion on one event loop, so that one
    test body checks both clients."""

    def __init__(self, client: AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop = client, loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(method(*args, **kwargs))

        return run


@pytest.fixture(params=["sync-msgpack", "sync-json", "async-msgpack", "async-json"])
def api(request: pytest.FixtureRequest, server: Server) -> Iterator[Any]:
    """`Client` or `AsyncClient` (driven to completion), in MessagePack or JSON."""
    mode, fmt = str(request.param).split("-")
    if mode == "sync":
        with Client(server.url, format=fmt, admin_token=ADMIN_TOKEN) as client:
            yield client
        return
    loop = asyncio.new_event_loop()
    async_client = AsyncClient(server.url, format=fmt, admin_token=ADMIN_TOKEN)
    try:
        yield AsyncAsSync(async_client, loop)
    finally:
        loop.run_until_complete(async_client.aclose())
        loop.close()
