"""The exception a failed call raises."""

from __future__ import annotations


class RankserveError(Exception):
    """A reply outside 2xx, with the server's `{"error": {"code", "message"}}`.

    `code` is the server's stable error code (`unknown_ranker`, `overloaded`, ... listed in
    docs/api.md); a reply without that body (a proxy's, say) gets `http_<status>` and the
    start of its text as the message. `retry_after` is the reply's `Retry-After` in seconds,
    when it had one (a 503 `overloaded` that was retried as often as allowed, or asked for a
    longer wait than the client's limit).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after
