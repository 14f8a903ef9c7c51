#!/usr/bin/env python3
"""Rank with rankserve from Python: describe a ranker, rank two hit documents and a numpy
feature matrix, optionally search. Uses the client package (`pip install ./clients/python`).

    python3 examples/client.py                               # http://127.0.0.1:8080, ranker small
    python3 examples/client.py --url http://host:8080 --ranker medium --format json
    python3 examples/client.py --search "kitchen ranking"    # also POST /v1/search

Prints the hit documents' scores and order as one JSON line on stdout, the matrix's scores on a
second line (and the search's hits on a third with --search). Exits 1 with the server's error
code and message when a call fails.
"""

import argparse
import json
import sys

import numpy as np

from rankserve_client import Client, Document, RankserveError


def hit_document(doc_id: str, title_hits: list[list[int]], body_hits: list[list[int]]) -> Document:
    """A hit document (docs/api.md, HIT_DOC): per stream its length and phrases of
    [term, position]."""
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--ranker", default="small")
    parser.add_argument("--format", choices=["msgpack", "json"], default="msgpack")
    parser.add_argument("--search", metavar="QUERY", help="also run POST /v1/search")
    args = parser.parse_args()
    try:
        with Client(args.url, format=args.format) as client:
            ranker = client.ranker(args.ranker)
            print(f"{ranker.name}: {len(ranker.features)} features, inputs {ranker.inputs}, "
                  f"{len(ranker.layers)} layers, {ranker.trees} ensemble trees", file=sys.stderr)
            # Two documents for a two-term query: one matching both terms in its title, one
            # matching only the second term, in its body. Feature extraction runs on the server.
            ranked = client.rank(
                args.ranker,
                documents=[
                    hit_document("a", [[0, 1], [1, 2]], [[0, 10], [1, 11], [0, 90], [1, 200]]),
                    hit_document("b", [], [[1, 40], [1, 41], [1, 300], [1, 301]]),
                ],
                query={"terms": 2, "idf": [2.3, 1.1]},
                stats={"avg_length": {"title": 9.0, "body": 350.0}},
                k=2,
            )
            print(json.dumps({"scores": ranked.scores.tolist(), "order": ranked.order.tolist(),
                              "backend": ranked.backend, "total_us": ranked.timings.total_us}))
            # Ready feature vectors: a matrix of documents x features, NaN for missing values.
            features = np.random.default_rng(7).uniform(0.0, 1.0, (100, len(ranker.features)))
            features[::10, 0] = np.nan
            scored = client.rank(args.ranker, features, k=3)
            best = scored.order
            print(json.dumps({"best": best.tolist(), "scores": scored.scores[best].tolist()}))
            if args.search:
                found = client.search(args.search, mode="or", k=5, ranker=args.ranker)
                print(json.dumps([{"id": h.id, "score": h.score} for h in found.hits]))
    except RankserveError as err:
        print(f"rankserve: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
