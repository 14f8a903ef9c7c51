"""`examples/client.py` against the real server: the example stays true to the API."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, Server

SCRIPT = str(REPO / "examples" / "client.py")


@pytest.mark.parametrize("ranker", ["small", "medium"])
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_the_example_ranks_and_searches(server: Server, ranker: str, fmt: str) -> None:
    out = subprocess.run(
        [sys.executable, SCRIPT, "--url", server.url, "--ranker", ranker, "--format", fmt,
         "--search", "kitchen ranking"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    hits_line, matrix_line, search_line = out.stdout.splitlines()
    ranked = json.loads(hits_line)
    assert len(ranked["scores"]) == 2
    best = 0 if ranked["scores"][0] >= ranked["scores"][1] else 1
    assert ranked["order"] == [best, 1 - best]
    scored = json.loads(matrix_line)
    assert len(scored["best"]) == 3 and scored["scores"] == sorted(scored["scores"], reverse=True)
    assert 0 < len(json.loads(search_line)) <= 5


def test_the_example_exits_1_with_the_error_code(server: Server) -> None:
    out = subprocess.run(
        [sys.executable, SCRIPT, "--url", server.url, "--ranker", "nosuch"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 1
    assert "unknown_ranker" in out.stderr
