"""Pure functions of the shared package."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import grpc
import pytest

from shared import responses as r
from shared.errors import BadRequest
from shared.flags import boolean, duration
from shared.openai import ApiKind, api_kind, parse_request
from shared.tls import CERT_FILE, KEY_FILE, ReloadingCertificate, self_signed


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("50ms", 0.05), ("2s", 2.0), ("1m30s", 90.0), ("1h", 3600.0), ("250us", 250e-6),
     ("1.5s", 1.5), ("0.2", 0.2), ("10ns", 1e-8)],
)
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ms", "5 parsecs", "1x", "s5"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


@pytest.mark.parametrize(("text", "value"), [("true", True), ("FALSE", False), ("1", True),
                                             ("0", False), ("t", True), ("f", False)])
def test_go_booleans_parse(text: str, value: bool) -> None:
    assert boolean(text) is value


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/v1/chat/completions", ApiKind.CHAT), ("/v1/completions?x=1", ApiKind.COMPLETIONS),
     ("/v1/embeddings", ApiKind.EMBEDDINGS), ("/v1/responses", ApiKind.RESPONSES),
     ("/v1/models", ApiKind.OTHER)],
)
def test_api_kind_from_path(path: str, kind: ApiKind) -> None:
    assert api_kind(path) is kind


def test_parse_request_reads_model_and_stream() -> None:
    req = parse_request(b'{"model": "m", "messages": [], "stream": true}', "/v1/chat/completions")
    assert (req.model, req.stream, req.kind, req.messages) == ("m", True, ApiKind.CHAT, [])


@pytest.mark.parametrize(
    ("body", "path", "code"),
    [
        (b"{", "/v1/completions", "invalid_json"),
        (b"[]", "/v1/completions", "invalid_json"),
        (b'{"prompt": "x"}', "/v1/completions", "missing_model"),
        (b'{"model": 1, "prompt": "x"}', "/v1/completions", "invalid_model"),
        (b'{"model": "", "prompt": "x"}', "/v1/completions", "missing_model"),
        (b'{"model": "m"}', "/v1/completions", "invalid_body"),
        (b'{"model": "m"}', "/v1/chat/completions", "invalid_body"),
        (b'{"model": "m", "messages": "hi"}', "/v1/chat/completions", "invalid_body"),
    ],
)
def test_unroutable_requests_raise_bad_request(body: bytes, path: str, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request(body, path)
    assert info.value.code == code
    assert info.value.to_json()["error"]["code"] == code


@pytest.mark.parametrize("size", [0, 1, 61_999, 62_000, 62_001, 124_000, 124_001])
def test_streamed_body_chunks_stay_under_the_limit_and_rejoin(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    out = list(r.streamed_body(body, response=False))
    chunks = [o.request_body.response.body_mutation.streamed_response for o in out]
    assert all(len(c.body) <= r.MAX_CHUNK for c in chunks)
    assert b"".join(c.body for c in chunks) == body
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_immediate_error_is_openai_json() -> None:
    resp = r.immediate_error(BadRequest("nope", code="invalid_json"))
    assert resp.immediate_response.status.code == 400
    assert resp.immediate_response.body == (
        b'{"error":{"message":"nope","type":"invalid_request_error","code":"invalid_json"}}')


def test_certificate_files_are_reloaded_when_they_change(tmp_path: Path) -> None:
    key, cert = self_signed()
    (tmp_path / KEY_FILE).write_bytes(key)
    (tmp_path / CERT_FILE).write_bytes(cert)
    source = ReloadingCertificate(tmp_path)
    assert source.fetch() is None  # unchanged
    key2, cert2 = self_signed()
    (tmp_path / KEY_FILE).write_bytes(key2)
    (tmp_path / CERT_FILE).write_bytes(cert2)
    later = time.time() + 5
    for f in (KEY_FILE, CERT_FILE):
        os.utime(tmp_path / f, (later, later))
    assert isinstance(source.fetch(), grpc.ServerCertificateConfiguration)
    assert source.pair == (key2, cert2)


@pytest.mark.parametrize(("header", "status"), [
    ("Bearer s3cret", 200), ("bearer s3cret", 200), ("BEARER  s3cret", 200),
    ("Bearer wrong", 401), ("Basic s3cret", 401), ("s3cret", 401), ("", 401),
    ("Bearer s3cr\u00e9t", 401),
])
async def test_the_metrics_token_takes_the_bearer_scheme_in_any_case(
        header: str, status: int) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from shared.metrics_server import build_app

    async with TestClient(TestServer(build_app(token="s3cret"))) as client:
        resp = await client.get("/metrics", headers={"Authorization": header} if header else {})
        assert resp.status == status
