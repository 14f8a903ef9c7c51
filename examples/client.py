#!/usr/bin/env python3
"""A minimal rankserve client: describe a ranker, rank two documents, optionally search.

    python3 examples/client.py                               # http://127.0.0.1:8080, ranker small
    python3 examples/client.py --url http://host:8080 --ranker medium --format json
    python3 examples/client.py --search "kitchen ranking"    # also POST /v1/search

Speaks MessagePack when the `msgpack` package is installed (`pip install msgpack`), JSON
otherwise (or with --format json); only the standard library is needed besides. Prints the
rank reply as one JSON line on stdout (and the search reply on a second line with --search).
Exits 1 with the server's error code and message when a call fails.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

try:
    import msgpack
except ImportError:  # JSON only
    msgpack = None

MSGPACK = "application/msgpack"
JSON = "application/json"


class RankserveError(Exception):
    """A non-2xx reply: the HTTP status and the body's {"error": {"code", "message"}}."""

    def __init__(self, status, code, message):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code = status, code


class Client:
    def __init__(self, url, fmt):
        self.url = url.rstrip("/")
        self.content_type = MSGPACK if fmt == "msgpack" else JSON

    def _encode(self, body):
        if self.content_type == MSGPACK:
            return msgpack.packb(body, use_bin_type=True)
        return json.dumps(body).encode()

    def _decode(self, data, content_type):
        if content_type.startswith(MSGPACK):
            return msgpack.unpackb(data, raw=False)
        return json.loads(data)

    def call(self, method, path, body=None):
        data = None if body is None else self._encode(body)
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", self.content_type)
        if data is not None:
            request.add_header("Content-Type", self.content_type)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return self._decode(reply.read(), reply.headers.get("Content-Type", JSON))
        except urllib.error.HTTPError as err:
            reply = self._decode(err.read(), err.headers.get("Content-Type", JSON))
            error = reply.get("error", {})
            raise RankserveError(err.code, error.get("code"), error.get("message")) from None


def hit_document(doc_id, title_hits, body_hits):
    """A hit document (docs/api.md, HIT_DOC): per stream its length and phrases of [term, position]."""
    return {
        "id": doc_id,
        "hits": {
            "streams": {
                "title": {"length": 8, "phrases": [title_hits]},
                "body": {"length": 400, "phrases": [body_hits[:2], body_hits[2:]]},
            },
            "static": {"static_rank": 0.5},
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--ranker", default="small")
    parser.add_argument("--format", choices=["msgpack", "json"],
                        default="msgpack" if msgpack else "json")
    parser.add_argument("--search", metavar="QUERY", help="also run POST /v1/search")
    args = parser.parse_args()
    if args.format == "msgpack" and msgpack is None:
        parser.error("--format msgpack needs the msgpack package (pip install msgpack)")
    client = Client(args.url, args.format)
    try:
        ranker = client.call("GET", f"/v1/rankers/{args.ranker}")
        print(f"{ranker['name']}: {len(ranker['features'])} features, inputs {ranker['inputs']}, "
              f"{len(ranker['layers'])} layers, {ranker['trees']} ensemble trees", file=sys.stderr)
        # Two documents for a two-term query: one matching both terms in its title, one
        # matching only the second term, in its body.
        reply = client.call("POST", "/v1/rank", {
            "ranker": args.ranker,
            "query": {"terms": 2, "idf": [2.3, 1.1]},
            "stats": {"avg_length": {"title": 9.0, "body": 350.0}},
            "documents": [
                hit_document("a", [[0, 1], [1, 2]], [[0, 10], [1, 11], [0, 90], [1, 200]]),
                hit_document("b", [], [[1, 40], [1, 41], [1, 300], [1, 301]]),
            ],
            "k": 2,
        })
        print(json.dumps(reply))
        if args.search:
            found = client.call("POST", "/v1/search",
                                {"query": args.search, "mode": "or", "k": 5, "ranker": args.ranker})
            print(json.dumps(found))
    except RankserveError as err:
        print(f"rankserve: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
