"""What the client sends and gets back: request shapes as TypedDicts, replies as dataclasses.

Field meanings are docs/api.md's. Scores and feature vectors come back as numpy float64 arrays
(a `null` score, NaN on the server, is NaN here); everything else as plain Python values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
import numpy.typing as npt

Backend = Literal["auto", "cpu", "gpu"]
"""Where a request runs (`backend` in docs/api.md)."""

Mode = Literal["and", "or", "and_or"]
"""How a search's terms combine."""

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]


class HitStream(TypedDict):
    """One stream of a hit document: its length in tokens and, per phrase, `[term, position]`."""

    length: int
    phrases: NotRequired[Sequence[Sequence[Sequence[int]]]]


class HitDocument(TypedDict):
    """A hit request (DESIGN §5): streams by name and static features by name."""

    id: NotRequired[str]
    streams: NotRequired[Mapping[str, HitStream]]
    static: NotRequired[Mapping[str, float]]


class Document(TypedDict):
    """One document of a rank request: exactly one of `features` (in the ranker's order, or by
    name; `None` is missing) and `hits`."""

    id: NotRequired[str]
    features: NotRequired[Sequence[float | None] | Mapping[str, float | None]]
    hits: NotRequired[HitDocument]


class QueryInfo(TypedDict):
    """The query side of hit documents: Q terms and their idf."""

    terms: int
    idf: Sequence[float]


class CorpusStats(TypedDict):
    """Average stream lengths, by stream name."""

    avg_length: Mapping[str, float]


def _floats(values: Sequence[float | None]) -> FloatArray:
    # numpy reads None as NaN for a float dtype: no loop over the values here.
    return np.asarray(values, dtype=np.float64)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Explanation:
    """`explain` detail of one document: its feature vector `V` and its model inputs."""

    features: FloatArray
    inputs: FloatArray

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Explanation:
        return cls(features=_floats(wire["features"]), inputs=_floats(wire["inputs"]))


@dataclass(frozen=True)
class RankTimings:
    """Where a rank request's time went, in microseconds (docs/api.md, `POST /v1/rank`)."""

    read_us: int
    decode_us: int
    fe_us: int
    mit_us: int | None
    me_us: int
    queue_us: int
    batch_docs: int
    batch_requests: int
    total_us: int

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RankTimings:
        return cls(
            read_us=int(wire.get("read_us", 0)),
            decode_us=int(wire.get("decode_us", 0)),
            fe_us=int(wire["fe_us"]),
            mit_us=_opt_int(wire.get("mit_us")),
            me_us=int(wire["me_us"]),
            queue_us=int(wire["queue_us"]),
            batch_docs=int(wire.get("batch_docs", 0)),
            batch_requests=int(wire.get("batch_requests", 0)),
            total_us=int(wire["total_us"]),
        )


@dataclass(frozen=True)
class RankResult:
    """`POST /v1/rank` reply: `scores` in request order (NaN for a missing score); with `k`,
    `order` holds the indices of the k best, best first."""

    scores: FloatArray
    order: IndexArray | None
    backend: str
    timings: RankTimings
    explain: list[Explanation] | None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RankResult:
        order = wire.get("order")
        explain = wire.get("explain")
        return cls(
            scores=_floats(wire["scores"]),
            order=None if order is None else np.asarray(order, dtype=np.intp),
            backend=str(wire["backend"]),
            timings=RankTimings.from_wire(wire["timings"]),
            explain=None if explain is None else [Explanation.from_wire(e) for e in explain],
        )


@dataclass(frozen=True)
class StoredRanker:
    """One entry of `GET /v1/rankers`."""

    name: str
    file_bytes: int
    resident_cpu: bool
    resident_gpu: bool
    crossover_docs: int | None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> StoredRanker:
        return cls(
            name=str(wire["name"]),
            file_bytes=int(wire["file_bytes"]),
            resident_cpu=bool(wire["resident_cpu"]),
            resident_gpu=bool(wire.get("resident_gpu", False)),
            crossover_docs=_opt_int(wire.get("crossover_docs")),
        )


@dataclass(frozen=True)
class CrossoverPoint:
    """One measured batch size of a ranker's CPU/GPU crossover."""

    docs: int
    cpu_us: float
    gpu_us: float


@dataclass(frozen=True)
class Crossover:
    """The measured batch size from which the GPU is faster (`None`: it never was)."""

    docs: int | None
    points: list[CrossoverPoint]

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Crossover:
        return cls(
            docs=_opt_int(wire.get("docs")),
            points=[
                CrossoverPoint(int(p["docs"]), float(p["cpu_us"]), float(p["gpu_us"]))
                for p in wire["points"]
            ],
        )


@dataclass(frozen=True)
class LayerShape:
    """One neural-net layer of a ranker."""

    inputs: int
    outputs: int
    activation: str


@dataclass(frozen=True)
class RankerDescription:
    """`GET /v1/rankers/{name}` reply (also the reply of an upload and a load)."""

    name: str
    features: list[str]
    inputs: dict[str, int]
    layers: list[LayerShape]
    trees: int
    bytes: int
    file_bytes: int
    resident: list[str]
    crossover: Crossover | None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RankerDescription:
        crossover = wire.get("crossover")
        return cls(
            name=str(wire["name"]),
            features=[str(f) for f in wire["features"]],
            inputs={str(k): int(v) for k, v in wire["inputs"].items()},
            layers=[
                LayerShape(int(layer["inputs"]), int(layer["outputs"]), str(layer["activation"]))
                for layer in wire["layers"]
            ],
            trees=int(wire["trees"]),
            bytes=int(wire["bytes"]),
            file_bytes=int(wire["file_bytes"]),
            resident=[str(r) for r in wire["resident"]],
            crossover=None if crossover is None else Crossover.from_wire(crossover),
        )


@dataclass(frozen=True)
class Readiness:
    """`GET /healthz` and `GET /readyz` reply."""

    ready: bool
    rankers_loaded: int
    gpu: str | None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Readiness:
        gpu = wire.get("gpu")
        return cls(
            ready=bool(wire["ready"]),
            rankers_loaded=int(wire["rankers_loaded"]),
            gpu=None if gpu is None else str(gpu),
        )


@dataclass(frozen=True)
class SearchHit:
    """One hit of a search: the document's number and id, its score (NaN for a missing one)
    and the BM25 score that selected it."""

    doc: int
    id: str
    score: float
    selection_score: float
    explain: Explanation | None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> SearchHit:
        score = wire.get("score")
        explain = wire.get("explain")
        return cls(
            doc=int(wire["doc"]),
            id=str(wire["id"]),
            score=float("nan") if score is None else float(score),
            selection_score=float(wire["selection_score"]),
            explain=None if explain is None else Explanation.from_wire(explain),
        )


@dataclass(frozen=True)
class SearchTimings:
    """Where a search's time went, in microseconds."""

    select_us: int
    fe_us: int
    mit_us: int | None
    me_us: int
    queue_us: int
    total_us: int

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> SearchTimings:
        return cls(
            select_us=int(wire["select_us"]),
            fe_us=int(wire["fe_us"]),
            mit_us=_opt_int(wire.get("mit_us")),
            me_us=int(wire["me_us"]),
            queue_us=int(wire["queue_us"]),
            total_us=int(wire["total_us"]),
        )


@dataclass(frozen=True)
class SearchResult:
    """`POST /v1/search` reply: hits best first; `backends` says which processor selected
    (`select`) and ranked (`rank`, `none` without a ranker)."""

    hits: list[SearchHit]
    timings: SearchTimings
    backends: dict[str, str]

    @property
    def scores(self) -> FloatArray:
        """The hits' scores as one array, best first."""
        return np.fromiter((h.score for h in self.hits), dtype=np.float64, count=len(self.hits))

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> SearchResult:
        return cls(
            hits=[SearchHit.from_wire(h) for h in wire["hits"]],
            timings=SearchTimings.from_wire(wire["timings"]),
            backends={str(k): str(v) for k, v in wire["backends"].items()},
        )


@dataclass(frozen=True)
class IndexDescription:
    """`POST /v1/index/reload` reply: the index now served."""

    dir: str
    docs: int
    terms: int
    codec: str
    scoring: str
    forward: bool

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> IndexDescription:
        return cls(
            dir=str(wire["dir"]),
            docs=int(wire["docs"]),
            terms=int(wire["terms"]),
            codec=str(wire["codec"]),
            scoring=str(wire["scoring"]),
            forward=bool(wire["forward"]),
        )
