"""Request and reply bodies: MessagePack or JSON, and a numpy feature matrix as the
`documents` of a `/v1/rank` request, encoded without a Python loop over its rows.

The server takes a feature vector per document (`{"features": [...]}`), so a matrix of n rows
becomes n such maps. In MessagePack every row of a float64 matrix has the same size (a
one-entry map header, the key, an array header, and per value the float64 marker and 8
big-endian bytes), so the rows are written as one numpy structured array and its bytes are the
`documents` array's body. NaN goes as a float64 NaN, which the server reads as a missing value
like `null`. In JSON the rows are the text of `ndarray.tolist()` (one C-level `json.dumps`),
with NaN written as `null` and each row wrapped into its map by one string replacement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from .types import Document


class Format(Enum):
    """A body format and its media type."""

    MSGPACK = "application/msgpack"
    JSON = "application/json"

    @classmethod
    def named(cls, name: str) -> Format:
        """`msgpack` or `json`."""
        try:
            return {"msgpack": cls.MSGPACK, "json": cls.JSON}[name]
        except KeyError:
            raise ValueError(f"format {name!r}: expected 'msgpack' or 'json'") from None

    @classmethod
    def of_reply(cls, content_type: str | None) -> Format | None:
        """The format of a reply's `Content-Type` (parameters ignored), `None` for others."""
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if media in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
            return cls.MSGPACK
        if media == "application/json":
            return cls.JSON
        return None

    def encode(self, value: Any) -> bytes:
        if self is Format.MSGPACK:
            packed: bytes = msgpack.packb(value, use_bin_type=True)
            return packed
        # NaN and infinity are not JSON: refused here rather than sent as invalid text.
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()

    def decode(self, data: bytes) -> Any:
        if self is Format.MSGPACK:
            return msgpack.unpackb(data, raw=False)
        return json.loads(data)


def feature_matrix(features: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """`features` as a 2-D float64 array (rows are documents, columns the ranker's features).

    Raises ValueError when it is not two-dimensional.
    """
    matrix = np.asarray(features, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(
            f"features must be a 2-D matrix (documents x features), got shape {matrix.shape}"
        )
    return matrix


def rank_body(
    fmt: Format,
    fields: Mapping[str, Any],
    *,
    features: npt.NDArray[np.float64] | None = None,
    documents: Sequence[Document] | None = None,
) -> bytes:
    """A `/v1/rank` body: `fields` (every field but `documents`) and the documents, from a
    feature matrix or given as maps."""
    if (features is None) == (documents is None):
        raise ValueError(
            "give the documents as a feature matrix or as document maps, one of the two"
        )
    if documents is not None:
        return fmt.encode({**fields, "documents": list(documents)})
    assert features is not None
    if fmt is Format.MSGPACK:
        return _msgpack_rank_body(fields, features)
    return _json_rank_body(fields, features)


def _msgpack_rank_body(fields: Mapping[str, Any], matrix: npt.NDArray[np.float64]) -> bytes:
    packer = msgpack.Packer(use_bin_type=True)
    rows, width = matrix.shape
    head = [packer.pack_map_header(len(fields) + 1)]
    for key, value in fields.items():
        head += [packer.pack(key), packer.pack(value)]
    head += [packer.pack("documents"), packer.pack_array_header(rows)]
    # Each row: {"features": [w float64 values]}, the same bytes up to the values.
    prefix = packer.pack_map_header(1) + packer.pack("features") + packer.pack_array_header(width)
    layout = np.dtype(
        [("prefix", f"V{len(prefix)}"), ("values", [("marker", "u1"), ("value", ">f8")], (width,))]
    )
    encoded = np.empty(rows, dtype=layout)
    encoded["prefix"] = np.void(prefix)
    encoded["values"]["marker"] = 0xCB  # MessagePack float64
    encoded["values"]["value"] = matrix
    return b"".join(head) + encoded.tobytes()


def _json_rank_body(fields: Mapping[str, Any], matrix: npt.NDArray[np.float64]) -> bytes:
    if np.isinf(matrix).any():
        raise ValueError("JSON cannot carry an infinite feature value: use format='msgpack'")
    head = json.dumps(dict(fields), separators=(",", ":"), allow_nan=False)
    if len(matrix) == 0:
        documents = "[]"
    else:
        # "[[1.0,NaN],[2.0,3.0]]" -> '[{"features":[1.0,null]},{"features":[2.0,3.0]}]'. No
        # number's text holds a bracket or "NaN", so the replacements touch only the structure.
        rows = json.dumps(matrix.tolist(), separators=(",", ":")).replace("NaN", "null")
        documents = (
            '[{"features":' + rows[1:-1].replace("],[", ']},{"features":[') + "}]"
        )
    separator = "," if fields else ""
    return (head[:-1] + separator + '"documents":' + documents + "}").encode()
