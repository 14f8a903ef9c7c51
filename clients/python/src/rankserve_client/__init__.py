"""rankserve-client: a typed client for the rankserve HTTP API (docs/api.md).

    from rankserve_client import Client

    with Client("http://127.0.0.1:8080") as client:
        result = client.rank("small", features)   # features: a (documents x features) array
        result.scores                             # numpy float64, request order

`AsyncClient` has the same methods as coroutines. MessagePack is the default body format,
`format="json"` the other; a reply outside 2xx raises `RankserveError` with the server's code.
"""

from .client import DEFAULT_URL, AsyncClient, Client, RetryPolicy
from .errors import RankserveError
from .types import (
    Backend,
    CorpusStats,
    Crossover,
    CrossoverPoint,
    Document,
    Explanation,
    HitDocument,
    HitStream,
    IndexDescription,
    LayerShape,
    Mode,
    QueryInfo,
    RankerDescription,
    RankResult,
    RankTimings,
    Readiness,
    SearchHit,
    SearchResult,
    SearchTimings,
    StoredRanker,
)

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "Backend",
    "Client",
    "CorpusStats",
    "Crossover",
    "CrossoverPoint",
    "Document",
    "Explanation",
    "HitDocument",
    "HitStream",
    "IndexDescription",
    "LayerShape",
    "Mode",
    "QueryInfo",
    "RankResult",
    "RankTimings",
    "RankerDescription",
    "RankserveError",
    "Readiness",
    "RetryPolicy",
    "SearchHit",
    "SearchResult",
    "SearchTimings",
    "StoredRanker",
]
