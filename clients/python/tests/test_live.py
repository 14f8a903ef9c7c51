"""Every route of docs/api.md against the real server, through each client in each format
(the `api` fixture)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from conftest import REPO, Server
from rankserve_client import AsyncClient, Client, Document, RankserveError


def _features(api: Any, ranker: str, rows: int, seed: int) -> np.ndarray:
    """A random feature matrix of `rows` documents for `ranker`, some values missing (NaN)."""
    width = len(api.ranker(ranker).features)
    matrix = np.random.default_rng(seed).uniform(-1.0, 3.0, size=(rows, width))
    matrix.flat[5::17] = np.nan
    return matrix


def _hit_document(doc_id: str, title: list[list[int]], body: list[list[int]]) -> Document:
    return {
        "id": doc_id,
        "hits": {
            "streams": {
                "title": {"length": 8, "phrases": [title]},
                "body": {"length": 400, "phrases": [body[:2], body[2:]]},
            },
            "static": {"static_rank": 0.5},
        },
    }


def test_health_and_readiness(api: Any) -> None:
    for readiness in (api.health(), api.ready()):
        assert readiness.ready
        assert readiness.rankers_loaded == 2
        assert readiness.gpu is not None and "cpu" in readiness.gpu


def test_rankers_are_listed_and_described(api: Any) -> None:
    names = {r.name: r for r in api.rankers()}
    assert set(names) == {"small", "medium"}
    assert names["small"].file_bytes == (REPO / "rankers" / "small.json").stat().st_size
    small = api.ranker("small")
    assert small.name == "small"
    assert len(small.features) > 0 and small.trees >= 0
    assert "cpu" in small.resident


def test_a_numpy_matrix_scores_as_its_rows_sent_one_by_one(api: Any) -> None:
    matrix = _features(api, "medium", rows=64, seed=1)
    result = api.rank("medium", matrix, k=5, explain=True)
    assert result.scores.dtype == np.float64 and result.scores.shape == (64,)
    assert np.isfinite(result.scores).all()
    assert result.backend == "cpu"
    # The same rows as document maps with `None` for the missing values.
    rows: list[Document] = [
        {"features": [None if np.isnan(v) else float(v) for v in row]} for row in matrix
    ]
    one_by_one = api.rank("medium", documents=rows)
    np.testing.assert_array_equal(result.scores, one_by_one.scores)
    assert one_by_one.order is None
    # `order`: the 5 best, best first, ties by smaller index.
    expected = sorted(range(64), key=lambda i: (-result.scores[i], i))[:5]
    assert result.order is not None and result.order.tolist() == expected
    # `explain` gives back each row as the server read it, NaN where it was missing.
    assert result.explain is not None and len(result.explain) == 64
    echoed = np.stack([e.features for e in result.explain])
    np.testing.assert_array_equal(echoed, matrix)
    assert result.timings.total_us > 0


def test_hit_documents_are_ranked(api: Any) -> None:
    result = api.rank(
        "small",
        documents=[
            _hit_document("a", [[0, 1], [1, 2]], [[0, 10], [1, 11], [0, 90], [1, 200]]),
            _hit_document("b", [], [[1, 40], [1, 41], [1, 300], [1, 301]]),
        ],
        query={"terms": 2, "idf": [2.3, 1.1]},
        stats={"avg_length": {"title": 9.0, "body": 350.0}},
        k=2,
    )
    assert result.scores.shape == (2,) and np.isfinite(result.scores).all()
    assert result.order is not None
    assert result.order.tolist() == ([0, 1] if result.scores[0] >= result.scores[1] else [1, 0])


def test_search_with_and_without_a_ranker(api: Any) -> None:
    ranked = api.search("kitchen ranking", mode="or", k=5, ranker="small")
    assert 0 < len(ranked.hits) <= 5
    assert ranked.backends == {"select": "cpu", "rank": "cpu"}
    assert all(h.id.startswith("doc-") for h in ranked.hits)
    assert (np.diff(ranked.scores) <= 0).all()
    bm25 = api.search(terms=["kitchen", "ranking"], mode="or", k=3)
    assert bm25.backends["rank"] == "none"
    assert [h.score for h in bm25.hits] == [h.selection_score for h in bm25.hits]


def test_errors_carry_the_server_code_and_message(api: Any) -> None:
    with pytest.raises(RankserveError) as caught:
        api.rank("nosuch", np.zeros((1, 3)))
    assert caught.value.status == 404
    assert caught.value.code == "unknown_ranker"
    assert caught.value.message == 'no ranker named "nosuch"'
    assert caught.value.request_id
    with pytest.raises(RankserveError) as caught:
        api.rank("small", np.zeros((2, 3)))
    assert (caught.value.status, caught.value.code) == (400, "invalid_request")
    with pytest.raises(RankserveError) as caught:
        api.search("x", terms=["x"])
    assert caught.value.code == "invalid_request"


def test_admin_routes_upload_load_and_delete(api: Any, server: Server) -> None:
    name = f"copy-{id(api)}"
    uploaded = api.put_ranker(name, REPO / "rankers" / "small.json")
    assert uploaded.name == name
    assert (server.rankers / f"{name}.json").is_file()
    assert api.load_ranker(name).resident == ["cpu"]
    matrix = _features(api, "small", rows=3, seed=2)
    np.testing.assert_array_equal(api.rank(name, matrix).scores, api.rank("small", matrix).scores)
    # Bytes work as well as a path; a file that is no ranker is refused, the old one kept.
    api.put_ranker(name, (REPO / "rankers" / "small.json").read_bytes())
    with pytest.raises(RankserveError) as caught:
        api.put_ranker(name, b"{}")
    assert caught.value.code == "bad_ranker"
    assert api.ranker(name).name == name
    # A model in another library's format, detected or named; an unknown format name refused.
    text_model = REPO / "fixtures" / "trees" / "lgbt_lambdarank.model.txt"
    assert api.put_ranker(name, text_model).name == name
    assert api.put_ranker(name, text_model, format="lightgbm-text").name == name
    with pytest.raises(RankserveError) as caught:
        api.put_ranker(name, text_model, format="tensorflow")
    assert caught.value.code == "invalid_request"
    assert api.delete_ranker(name) is None
    with pytest.raises(RankserveError) as caught:
        api.ranker(name)
    assert caught.value.code == "unknown_ranker"


def test_admin_routes_need_the_token(server: Server) -> None:
    with Client(server.url) as anonymous, pytest.raises(RankserveError) as caught:
        anonymous.delete_ranker("small")
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")


def test_index_reload_metrics_and_openapi(api: Any) -> None:
    index = api.reload_index()
    assert index.docs == 200 and index.forward
    again = api.reload_index(index.dir)
    assert again.dir == index.dir
    metrics = api.metrics()
    assert "rankserve_documents_ranked_total" in metrics
    document = api.openapi()
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]["/v1/rankers/{name}"]) == {"get", "put", "delete"}


def test_async_requests_run_concurrently(server: Server) -> None:
    async def main() -> list[np.ndarray]:
        async with AsyncClient(server.url) as client:
            width = len((await client.ranker("small")).features)
            matrices = [np.full((4, width), float(i)) for i in range(8)]
            results = await asyncio.gather(*(client.rank("small", m) for m in matrices))
            return [r.scores for r in results]

    scores = asyncio.run(main())
    assert len(scores) == 8
    # Each reply is its own request's: identical rows score identically within a reply.
    assert all((s == s[0]).all() for s in scores)
