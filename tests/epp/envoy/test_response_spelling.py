"""The client's model name comes back through the real Envoy whatever JSON spelling the model
server uses: SSE events with spaces and escapes, and a pretty-printed whole body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.picker import Pool, start_pool, start_servers
from tests.support.processes import BackgroundLoop

pytestmark = pytest.mark.envoy


def spaced(obj: object) -> bytes:
    """Python's default ``json.dumps``: spaces after ``:`` and ``,``, ``\\u`` escapes."""
    return json.dumps(obj).encode()


def pretty(obj: object) -> bytes:
    return json.dumps(obj, indent=2).encode()


@pytest.fixture
def spaced_pool(bg: BackgroundLoop, tmp_path: Path) -> Iterator[Pool]:
    servers = start_servers(bg, 2)
    pool = start_pool(bg, tmp_path, servers)
    yield pool
    pool.envoy.stop()
    pool.epp.stop()
    for s in servers:
        bg.run(s.stop())


def test_spaced_sse_events_get_the_clients_model_back(spaced_pool: Pool) -> None:
    for s in spaced_pool.servers:
        s.dumps = spaced
    body = orjson.dumps({"model": "food-review", "prompt": "x", "stream": True})
    with httpx.stream("POST", spaced_pool.url(), content=body, timeout=10) as r:
        text = r.read().decode()
    assert r.status_code == 200
    events = [json.loads(line[5:]) for line in text.splitlines()
              if line.startswith("data: {")]
    assert len(events) == 4
    assert {e["model"] for e in events} == {"food-review"}
    assert '"model": "food-review"' in text  # the server's spacing is kept


def test_pretty_printed_body_gets_the_clients_model_back(spaced_pool: Pool) -> None:
    for s in spaced_pool.servers:
        s.dumps = pretty
    r = httpx.post(spaced_pool.url(), content=orjson.dumps(
        {"model": "food-review", "prompt": "x"}), timeout=10)
    assert r.status_code == 200
    assert r.json()["model"] == "food-review"
    assert r.json()["usage"]["completion_tokens"] == 3
