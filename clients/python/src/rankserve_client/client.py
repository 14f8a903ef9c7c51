"""`Client` (blocking) and `AsyncClient` (asyncio) for every route of docs/api.md.

Both build each call the same way (`_Routes`: method, path, body, how to read the reply) and
differ only in how they send it and wait between retries. A 503 with `Retry-After` (the
server's `overloaded`: the request was not admitted, so sending it again is safe) is retried
after the time the server asks for, at most `retries` times and only while that time is at
most `max_retry_wait` seconds; any other reply outside 2xx raises `RankserveError`.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import numpy.typing as npt

from .errors import RankserveError
from .types import (
    Backend,
    CorpusStats,
    Document,
    IndexDescription,
    Mode,
    QueryInfo,
    RankerDescription,
    RankResult,
    Readiness,
    SearchResult,
    StoredRanker,
)
from .wire import Format, feature_matrix, rank_body

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One request and how to read its reply."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    body: bytes | None = None
    content_type: str | None = None
    admin: bool = False
    # Statuses whose body is the reply rather than an error (`/readyz` answers 503 with one).
    ok: frozenset[int] = frozenset({200})


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how long at most, to wait out a 503 with `Retry-After`."""

    retries: int = 3
    max_retry_wait: float = 10.0

    def wait(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before sending again after `response` (the reply to try
        `attempt`, from 0), or `None` to give the reply to the caller."""
        if response.status_code != 503 or attempt >= self.retries:
            return None
        after = retry_after(response)
        if after is None or after > self.max_retry_wait:
            return None
        return after


def retry_after(response: httpx.Response) -> float | None:
    """The reply's `Retry-After` in seconds (delta-seconds or an HTTP date), if it has one."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _error(response: httpx.Response) -> RankserveError:
    """The exception for a reply outside the call's statuses."""
    fmt = Format.of_reply(response.headers.get("content-type"))
    code, message = f"http_{response.status_code}", response.text[:200]
    if fmt is not None:
        try:
            error = fmt.decode(response.content)["error"]
            code, message = str(error["code"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            pass  # not the server's error body: keep the status and the text
    return RankserveError(
        response.status_code,
        code,
        message,
        request_id=response.headers.get("x-request-id"),
        retry_after=retry_after(response),
    )


def _decoded(parse: Callable[[Any], T]) -> Callable[[httpx.Response], T]:
    """Reads a JSON or MessagePack reply (by its Content-Type) with `parse`."""

    def read(response: httpx.Response) -> T:
        fmt = Format.of_reply(response.headers.get("content-type"))
        if fmt is None:
            raise RankserveError(
                response.status_code,
                "bad_reply",
                f"unexpected Content-Type {response.headers.get('content-type')!r}",
                request_id=response.headers.get("x-request-id"),
            )
        return parse(fmt.decode(response.content))

    return read


def _ranker_path(name: str, suffix: str = "") -> str:
    # Quoted whole, so a name with '/' reaches the server as one (invalid) name.
    return f"/v1/rankers/{quote(name, safe='')}{suffix}"


def _int(value: int | None) -> int | None:
    """`value` as a Python int (a numpy integer is neither JSON nor packable as is)."""
    return None if value is None else int(value)


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that were given (`None` and `False` are the server's defaults)."""
    return {k: v for k, v in fields.items() if v is not None and v is not False}


class _Routes:
    """Settings shared by both clients and the calls of every route."""

    def __init__(
        self,
        url: str,
        format: str,
        admin_token: str | None,
        retries: int,
        max_retry_wait: float,
    ) -> None:
        self.url = url.rstrip("/")
        self.format = Format.named(format)
        self._admin_token = admin_token
        self.retry = RetryPolicy(retries, max_retry_wait)

    def _headers(self, call: _Call[Any]) -> dict[str, str]:
        headers = {"accept": self.format.value}
        if call.content_type is not None:
            headers["content-type"] = call.content_type
        if call.admin and self._admin_token is not None:
            headers["authorization"] = f"Bearer {self._admin_token}"
        return headers

    def _body(self, value: Any) -> tuple[bytes, str]:
        return self.format.encode(value), self.format.value

    def _rank(
        self,
        ranker: str,
        features: npt.ArrayLike | None,
        documents: Sequence[Document] | None,
        query: QueryInfo | None,
        stats: CorpusStats | None,
        k: int | None,
        backend: Backend | None,
        explain: bool,
        timeout_ms: int | None,
    ) -> _Call[RankResult]:
        fields = _given(
            ranker=ranker,
            query=query,
            stats=stats,
            k=_int(k),
            backend=backend,
            explain=explain,
            timeout_ms=_int(timeout_ms),
        )
        matrix = None if features is None else feature_matrix(features)
        body = rank_body(self.format, fields, features=matrix, documents=documents)
        return _Call(
            "POST", "/v1/rank", _decoded(RankResult.from_wire), body, self.format.value
        )

    def _search(
        self,
        query: str | None,
        terms: Sequence[str] | None,
        k: int | None,
        candidates: int | None,
        mode: Mode | None,
        ranker: str | None,
        backend: Backend | None,
        explain: bool,
        timeout_ms: int | None,
    ) -> _Call[SearchResult]:
        body, content_type = self._body(
            _given(
                query=query,
                terms=None if terms is None else list(terms),
                k=_int(k),
                candidates=_int(candidates),
                mode=mode,
                ranker=ranker,
                backend=backend,
                explain=explain,
                timeout_ms=_int(timeout_ms),
            )
        )
        return _Call("POST", "/v1/search", _decoded(SearchResult.from_wire), body, content_type)

    def _rankers(self) -> _Call[list[StoredRanker]]:
        return _Call(
            "GET",
            "/v1/rankers",
            _decoded(lambda wire: [StoredRanker.from_wire(r) for r in wire["rankers"]]),
        )

    def _ranker(self, name: str) -> _Call[RankerDescription]:
        return _Call("GET", _ranker_path(name), _decoded(RankerDescription.from_wire))

    def _put_ranker(
        self, name: str, model: bytes | str | os.PathLike[str], format: str | None
    ) -> _Call[RankerDescription]:
        if not isinstance(model, bytes):
            with open(model, "rb") as file:
                model = file.read()
        query = "" if format is None else f"?format={quote(format, safe='')}"
        return _Call(
            "PUT",
            _ranker_path(name, query),
            _decoded(RankerDescription.from_wire),
            model,
            # The server recognises the file by its content, whatever this says.
            "application/octet-stream",
            admin=True,
        )

    def _delete_ranker(self, name: str) -> _Call[None]:
        return _Call("DELETE", _ranker_path(name), lambda _: None, admin=True, ok=frozenset({204}))

    def _load_ranker(self, name: str) -> _Call[RankerDescription]:
        return _Call(
            "POST", _ranker_path(name, "/load"), _decoded(RankerDescription.from_wire), admin=True
        )

    def _reload_index(self, dir: str | os.PathLike[str] | None) -> _Call[IndexDescription]:
        body, content_type = (
            (None, None) if dir is None else self._body({"dir": os.fspath(dir)})
        )
        return _Call(
            "POST",
            "/v1/index/reload",
            _decoded(IndexDescription.from_wire),
            body,
            content_type,
            admin=True,
        )

    def _health(self, path: str) -> _Call[Readiness]:
        ok = frozenset({200, 503}) if path == "/readyz" else frozenset({200})
        return _Call("GET", path, _decoded(Readiness.from_wire), ok=ok)

    def _metrics(self) -> _Call[str]:
        return _Call("GET", "/metrics", lambda response: response.text)

    def _openapi(self) -> _Call[dict[str, Any]]:
        return _Call("GET", "/openapi.json", _decoded(dict))


def _outcome(call: _Call[T], response: httpx.Response) -> T:
    if response.status_code in call.ok:
        return call.read(response)
    raise _error(response)


class Client(_Routes):
    """A blocking client. Use as a context manager, or call `close()`.

    `format` is the body format both ways, `"msgpack"` (the default) or `"json"`;
    `admin_token` is sent on the admin routes; `timeout` is httpx's, in seconds.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        format: str = "msgpack",
        admin_token: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        max_retry_wait: float = 10.0,
    ) -> None:
        super().__init__(url, format, admin_token, retries, max_retry_wait)
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call[T]) -> T:
        attempt = 0
        while True:
            response = self._http.request(
                call.method, call.path, content=call.body, headers=self._headers(call)
            )
            wait = self.retry.wait(response, attempt)
            if wait is None:
                return _outcome(call, response)
            time.sleep(wait)
            attempt += 1

    def rank(
        self,
        ranker: str,
        features: npt.ArrayLike | None = None,
        *,
        documents: Sequence[Document] | None = None,
        query: QueryInfo | None = None,
        stats: CorpusStats | None = None,
        k: int | None = None,
        backend: Backend | None = None,
        explain: bool = False,
        timeout_ms: int | None = None,
    ) -> RankResult:
        """Scores documents with `ranker` (`POST /v1/rank`).

        Give the documents as `features`, a 2-D matrix (numpy array or nested sequences; rows
        are documents, columns the ranker's features in its order, NaN for a missing value),
        or as `documents`, maps with `features` (a list, or a map by name) or `hits` (a hit
        document; then `query` and `stats` are needed). `k` asks for `order`, the k best;
        `explain` for each document's feature vector and model inputs.
        """
        return self._send(
            self._rank(ranker, features, documents, query, stats, k, backend, explain, timeout_ms)
        )

    def search(
        self,
        query: str | None = None,
        *,
        terms: Sequence[str] | None = None,
        k: int | None = None,
        candidates: int | None = None,
        mode: Mode | None = None,
        ranker: str | None = None,
        backend: Backend | None = None,
        explain: bool = False,
        timeout_ms: int | None = None,
    ) -> SearchResult:
        """Selects by BM25 and ranks (`POST /v1/search`): give `query` (text) or `terms`."""
        return self._send(
            self._search(query, terms, k, candidates, mode, ranker, backend, explain, timeout_ms)
        )

    def rankers(self) -> list[StoredRanker]:
        """The rankers in the store (`GET /v1/rankers`)."""
        return self._send(self._rankers())

    def ranker(self, name: str) -> RankerDescription:
        """Describes one ranker, loading it if needed (`GET /v1/rankers/{name}`)."""
        return self._send(self._ranker(name))

    def put_ranker(
        self, name: str, model: bytes | str | os.PathLike[str], format: str | None = None
    ) -> RankerDescription:
        """Uploads a model file (its bytes, or a path to read) under `name`, replacing any
        ranker of that name (`PUT /v1/rankers/{name}`, admin). `format` names the file's
        format (`lightgbm-text`, `xgboost-ubj`, `catboost`, `onnx`, ...; docs/api.md); `None`
        lets the server detect it."""
        return self._send(self._put_ranker(name, model, format))

    def delete_ranker(self, name: str) -> None:
        """Deletes a ranker (`DELETE /v1/rankers/{name}`, admin)."""
        return self._send(self._delete_ranker(name))

    def load_ranker(self, name: str) -> RankerDescription:
        """Re-reads a ranker's file into the caches (`POST /v1/rankers/{name}/load`, admin)."""
        return self._send(self._load_ranker(name))

    def reload_index(self, dir: str | os.PathLike[str] | None = None) -> IndexDescription:
        """Swaps in the index at `dir` (the one served when `None`) (`POST /v1/index/reload`,
        admin)."""
        return self._send(self._reload_index(dir))

    def health(self) -> Readiness:
        """`GET /healthz`: the process answers."""
        return self._send(self._health("/healthz"))

    def ready(self) -> Readiness:
        """`GET /readyz`: `ready` is false (a 503 on the wire) until every ranker is loaded
        and the GPU probe has run."""
        return self._send(self._health("/readyz"))

    def metrics(self) -> str:
        """`GET /metrics`: Prometheus text."""
        return self._send(self._metrics())

    def openapi(self) -> dict[str, Any]:
        """`GET /openapi.json`: the OpenAPI document of the API."""
        return self._send(self._openapi())


class AsyncClient(_Routes):
    """The asyncio client: `Client`'s methods as coroutines. Use as an async context manager,
    or await `aclose()`."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        format: str = "msgpack",
        admin_token: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        max_retry_wait: float = 10.0,
    ) -> None:
        super().__init__(url, format, admin_token, retries, max_retry_wait)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call[T]) -> T:
        attempt = 0
        while True:
            response = await self._http.request(
                call.method, call.path, content=call.body, headers=self._headers(call)
            )
            wait = self.retry.wait(response, attempt)
            if wait is None:
                return _outcome(call, response)
            await asyncio.sleep(wait)
            attempt += 1

    async def rank(
        self,
        ranker: str,
        features: npt.ArrayLike | None = None,
        *,
        documents: Sequence[Document] | None = None,
        query: QueryInfo | None = None,
        stats: CorpusStats | None = None,
        k: int | None = None,
        backend: Backend | None = None,
        explain: bool = False,
        timeout_ms: int | None = None,
    ) -> RankResult:
        """As `Client.rank`."""
        return await self._send(
            self._rank(ranker, features, documents, query, stats, k, backend, explain, timeout_ms)
        )

    async def search(
        self,
        query: str | None = None,
        *,
        terms: Sequence[str] | None = None,
        k: int | None = None,
        candidates: int | None = None,
        mode: Mode | None = None,
        ranker: str | None = None,
        backend: Backend | None = None,
        explain: bool = False,
        timeout_ms: int | None = None,
    ) -> SearchResult:
        """As `Client.search`."""
        return await self._send(
            self._search(query, terms, k, candidates, mode, ranker, backend, explain, timeout_ms)
        )

    async def rankers(self) -> list[StoredRanker]:
        """As `Client.rankers`."""
        return await self._send(self._rankers())

    async def ranker(self, name: str) -> RankerDescription:
        """As `Client.ranker`."""
        return await self._send(self._ranker(name))

    async def put_ranker(
        self, name: str, model: bytes | str | os.PathLike[str], format: str | None = None
    ) -> RankerDescription:
        """As `Client.put_ranker`."""
        return await self._send(self._put_ranker(name, model, format))

    async def delete_ranker(self, name: str) -> None:
        """As `Client.delete_ranker`."""
        return await self._send(self._delete_ranker(name))

    async def load_ranker(self, name: str) -> RankerDescription:
        """As `Client.load_ranker`."""
        return await self._send(self._load_ranker(name))

    async def reload_index(self, dir: str | os.PathLike[str] | None = None) -> IndexDescription:
        """As `Client.reload_index`."""
        return await self._send(self._reload_index(dir))

    async def health(self) -> Readiness:
        """As `Client.health`."""
        return await self._send(self._health("/healthz"))

    async def ready(self) -> Readiness:
        """As `Client.ready`."""
        return await self._send(self._health("/readyz"))

    async def metrics(self) -> str:
        """As `Client.metrics`."""
        return await self._send(self._metrics())

    async def openapi(self) -> dict[str, Any]:
        """As `Client.openapi`."""
        return await self._send(self._openapi())

