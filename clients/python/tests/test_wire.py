"""The feature-matrix encodings against the plain encoding of the same request, row by row."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np
import pytest

from rankserve_client.wire import Format, feature_matrix, rank_body

FIELDS = {"ranker": "small", "k": 3, "explain": True}


def naive(fields: dict[str, Any], matrix: np.ndarray, missing: Any) -> dict[str, Any]:
    """The request as a dict built row by row, `missing` for NaN."""
    rows = [[missing if np.isnan(v) else float(v) for v in row] for row in matrix]
    return {**fields, "documents": [{"features": row} for row in rows]}


@pytest.mark.parametrize("shape", [(5, 7), (1, 1), (0, 4), (3, 0)])
def test_msgpack_matrix_is_the_plain_encoding_byte_for_byte(shape: tuple[int, int]) -> None:
    matrix = np.random.default_rng(0).normal(size=shape)
    matrix.flat[::3] = np.nan
    body = rank_body(Format.MSGPACK, FIELDS, features=matrix)
    assert body == msgpack.packb(naive(FIELDS, matrix, float("nan")), use_bin_type=True)


@pytest.mark.parametrize("shape", [(5, 7), (1, 1), (0, 4), (3, 0)])
def test_json_matrix_is_the_plain_encoding(shape: tuple[int, int]) -> None:
    matrix = np.random.default_rng(1).normal(size=shape) * 1e300
    matrix.flat[::3] = np.nan
    for fields in (FIELDS, {}):
        body = rank_body(Format.JSON, fields, features=matrix)
        assert json.loads(body) == naive(fields, matrix, None)


def test_json_values_round_trip_exactly() -> None:
    matrix = np.array([[0.1, 1 / 3, -0.0, 5e-324, 1.7976931348623157e308]])
    decoded = json.loads(rank_body(Format.JSON, FIELDS, features=matrix))
    assert decoded["documents"][0]["features"] == matrix[0].tolist()


def test_json_refuses_infinity_and_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="infinite"):
        rank_body(Format.JSON, FIELDS, features=np.array([[np.inf]]))
    with pytest.raises(ValueError, match="2-D"):
        feature_matrix([1.0, 2.0])
    with pytest.raises(ValueError, match="one of the two"):
        rank_body(Format.MSGPACK, FIELDS)
    assert feature_matrix(np.ones((2, 3), dtype=np.float32)).dtype == np.float64


def test_formats_by_name_and_reply_type() -> None:
    assert Format.named("json") is Format.JSON
    with pytest.raises(ValueError, match="msgpack"):
        Format.named("xml")
    assert Format.of_reply("application/msgpack; charset=utf-8") is Format.MSGPACK
    assert Format.of_reply("application/x-msgpack") is Format.MSGPACK
    assert Format.of_reply("text/plain") is None
