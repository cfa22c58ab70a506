"""Multimodal requests (issue #29): items hashed and counted as llm-d-router v0.10 does,
``encode-filter``, ``always-disagg-multimodal-decider``, the disagg profile handler's E/PD and
E/P/D orders with ``x-encoder-hosts-ports``, and encoder-cache affinity
(``mm-embeddings-cache-producer`` / ``-scorer``)."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Sequence

import orjson
import pytest
import xxhash

from epp.config import ConfigError, Runtime, build, parse_config
from epp.datastore import EndpointView
from epp.scheduling.plugins.multimodal.mm_embeddings_cache_producer import (
    MMEmbeddingsCacheProducer,
)
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from epp.testing import PluginHarness, endpoint, request
from modelserver.multimodal import (
    ENCODER_HEADER,
    image_size,
    mm_items,
    mm_prompt_tokens,
    unique_items,
)
from modelserver.pd import PREFILLER_HEADER, ROLE_LABEL


def png(w: int, h: int) -> str:
    """A real (tiny, valid) PNG of w x h as a data URI."""
    raw = b"".join(b"\x00" + b"\x00\x00\x00" * w for _ in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(data).decode()


def gif(w: int, h: int) -> str:
    data = b"GIF89a" + struct.pack("<HH", w, h) + b"\x00\x00\x00;"
    return "data:image/gif;base64," + base64.b64encode(data).decode()


def jpeg(w: int, h: int) -> str:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"
    return "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8" + app0 + sof + b"\xff\xd9"
                                                        ).decode()


def image(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(*blocks: object, text: str = "what is in these images?") -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *blocks]}]


def mm_request(*urls: str, rid: str = "r") -> LLMRequest:
    messages = chat(*(image(u) for u in urls))
    items = mm_items(messages)
    return LLMRequest(request_id=rid, target_model="m", client_model="m", prompt=b"x",
                      prompt_tokens=mm_prompt_tokens(messages, items), mm_items=items)


# -- items, hashes, tokens ----------------------------------------------------------------

@pytest.mark.parametrize(("url", "size"), [
    (png(64, 32), (64, 32)), (gif(320, 200), (320, 200)), (jpeg(1024, 768), (1024, 768)),
    ("https://example.com/cat.png", None), ("data:image/png;base64,!!!!", None)])
def test_image_size_is_read_from_the_data_uri_header(url: str,
                                                     size: tuple[int, int] | None) -> None:
    assert image_size(url) == size


def test_an_image_costs_width_times_height_over_1024_tokens_else_640x360() -> None:
    items = mm_items(chat(image(jpeg(1024, 768)), image("https://example.com/a.png"),
                          image(png(8, 8))))
    assert [i.tokens for i in items] == [768, 225, 1]  # a tiny image still weighs 1


def test_the_hash_is_xxhash64_of_the_url_in_hex_as_llm_d() -> None:
    url = "https://example.com/cat.png"
    (item,) = mm_items(chat(image(url)))
    assert item.hash == format(xxhash.xxh64_intdigest(url.encode()), "x")
    assert item.modality == "image"
    # the same base64 image twice hashes alike; a different one does not
    a, b, c = mm_items(chat(image(png(4, 4)), image(png(4, 4)), image(png(4, 5))))
    assert a.hash == b.hash != c.hash
    assert len(unique_items([a, b, c])) == 2


def test_video_audio_and_text_blocks() -> None:
    items = mm_items([{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "https://v/x.mp4"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA" * 10, "format": "wav"}},
        {"type": "text", "text": "hi"}]}, {"role": "system", "content": "plain text"}])
    assert [(i.modality, i.tokens) for i in items] == [("video", 20 * 225), ("audio", 11)]
    assert mm_items(chat()) == ()


def test_prompt_tokens_count_text_bytes_plus_placeholders_not_base64() -> None:
    url = png(640, 720)  # 450 tokens
    messages = chat(image(url), text="abcdefgh")  # "user" + 8 bytes = 3 tokens
    assert mm_prompt_tokens(messages, mm_items(messages)) == 3 + 450
    assert len(url) > 4 * 453  # the base64 bytes are not what is counted


# -- plugins ------------------------------------------------------------------------------

def role(i: int, value: str | None, waiting: int = 0) -> EndpointView:
    return endpoint(i, labels={ROLE_LABEL: value} if value else {}, waiting=waiting)


@pytest.mark.parametrize(("value", "keep"), [
    ("encode", True), ("encode-prefill", True), ("encode-prefill-decode", True),
    ("prefill", False), ("decode", False), ("prefill-decode", False), ("both", False),
    (None, False)])
def test_encode_filter_keeps_the_roles_that_encode(value: str | None, keep: bool) -> None:
    assert bool(PluginHarness.of("encode-filter").filter([role(1, value)])) is keep


def test_multimodal_decider_says_yes_only_with_multimodal_items() -> None:
    decider = PluginHarness.of("always-disagg-multimodal-decider").plugin
    assert decider.disaggregate(mm_request("https://x/a.png"), None)  # type: ignore[attr-defined]
    assert not decider.disaggregate(request("text only"), None)  # type: ignore[attr-defined]


# llm-d-router v0.10's deploy/config/sim-e-p-d-epp-config.yaml, as documented (written here)
EPD = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: encode-filter
- type: prefill-filter
- type: decode-filter
- type: disagg-profile-handler
  parameters:
    %s
    deciders: {encode: always-disagg-multimodal-decider, prefill: always-disagg-pd-decider}
- type: always-disagg-multimodal-decider
- type: always-disagg-pd-decider
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}, {pluginRef: queue-scorer}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
"""

EPD_PD = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: encode-filter
- type: decode-filter
- type: always-disagg-multimodal-decider
- type: disagg-profile-handler
  parameters: {deciders: {encode: always-disagg-multimodal-decider}}
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}]
- name: decode
  plugins: [{pluginRef: decode-filter}]
"""


def fleet() -> list[EndpointView]:
    return [role(1, "decode"), role(2, "prefill"), role(3, "encode"),
            role(4, "encode", waiting=5)]


def route(rt: Runtime, req: LLMRequest, pool: Sequence[EndpointView]) -> SchedulingResult:
    """What the director does around the scheduler: producers, schedule, pre-request."""
    for producer in rt.producers:
        producer.produce(req, pool)
    result = rt.scheduler.schedule(req, pool)
    for plugin in rt.pre_request:
        plugin.pre_request(req, result)
    return result


def test_e_p_d_routes_to_decode_and_names_the_encoder_and_the_prefiller() -> None:
    result = route(build(parse_config(EPD % "")), mm_request("https://x/a.png"), fleet())
    assert result.destination == "10.0.0.1:8000"
    assert result.extra_headers[PREFILLER_HEADER] == "10.0.0.2:8000"
    assert result.extra_headers[ENCODER_HEADER] == "10.0.0.3:8000"  # the shorter queue


def test_e_p_d_text_only_skips_the_encode_stage() -> None:
    result = route(build(parse_config(EPD % "")), request("hello"), fleet())
    assert ENCODER_HEADER not in result.extra_headers
    assert "encode" not in result.results
    assert result.extra_headers[PREFILLER_HEADER] == "10.0.0.2:8000"


@pytest.mark.parametrize(("order", "expected"), [
    ("", ["decode", "encode", "prefill"]),
    ("stageOrder: prefill-first", ["prefill", "encode", "decode"])])
def test_stage_orders_as_llm_d(order: str, expected: list[str]) -> None:
    rt = build(parse_config(EPD % order))
    handler = next(p for p in rt.handle if p.type_name == "disagg-profile-handler")
    req = mm_request("https://x/a.png")
    profiles = {p: rt.scheduler.profiles[p] for p in ("encode", "prefill", "decode")}
    full = rt.scheduler.schedule(req, fleet())
    seen: list[str] = []
    while nxt := handler.pick_profiles(req, profiles,  # type: ignore[attr-defined]
                                       {k: full.results[k] for k in seen}):
        seen.append(nxt[0].name)
    assert seen == expected


def test_e_pd_encodes_elsewhere_and_decodes_without_a_prefiller() -> None:
    rt = build(parse_config(EPD_PD))
    result = route(rt, mm_request("https://x/a.png", "https://x/b.png"), fleet())
    assert result.destination == "10.0.0.1:8000"
    assert result.extra_headers[ENCODER_HEADER] in ("10.0.0.3:8000", "10.0.0.4:8000")
    assert PREFILLER_HEADER not in result.extra_headers


def test_an_encode_decider_without_an_encode_profile_is_refused() -> None:
    text = EPD_PD.replace("- name: encode\n  plugins: [{pluginRef: encode-filter}]\n", "")
    with pytest.raises(ConfigError, match="no scheduling profile named 'encode'"):
        build(parse_config(text))


def test_a_pool_without_encoders_decodes_with_no_encoder_header() -> None:
    result = route(build(parse_config(EPD_PD)), mm_request("https://x/a.png"),
                   [role(1, "decode")])
    assert result.destination == "10.0.0.1:8000"
    assert ENCODER_HEADER not in result.extra_headers


# -- encoder-cache affinity ----------------------------------------------------------------

MM_CACHE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: mm-embeddings-cache-producer
  parameters: {cacheSizeInMBPerServer: %d}
- type: mm-embeddings-cache-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: mm-embeddings-cache-scorer, weight: 4}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""


def three() -> list[EndpointView]:
    return [endpoint(1), endpoint(2), endpoint(3)]


def test_the_scorer_prefers_the_endpoint_that_encoded_the_image_before() -> None:
    rt = build(parse_config(MM_CACHE % 2048))
    pool = three()
    first = route(rt, mm_request("https://x/a.png", rid="1"), pool).destination
    # load the first pick so that without affinity the queue scorer would go elsewhere
    busy = next(v for v in pool if v.key == first)
    busy.apply_scrape(type(busy.metrics)(waiting=2, updated_at=busy.metrics.updated_at))
    again = route(rt, mm_request("https://x/a.png", rid="2"), pool).destination
    assert again == first
    other = route(rt, mm_request("https://x/z.png", rid="3"), pool).destination
    assert other != first


def test_scores_are_the_fraction_of_unique_items_held() -> None:
    h = PluginHarness.of("mm-embeddings-cache-scorer",
                         others=[("mm-embeddings-cache-producer", None)])
    producer = h.handle.plugin("mm-embeddings-cache-producer", MMEmbeddingsCacheProducer)
    pool = three()
    seed = mm_request("https://x/a.png", "https://x/b.png")
    producer.produce(seed, pool)
    producer.pre_request(seed, SchedulingResult({"d": ProfileResult("d", [pool[1]])}, "d"))
    req = mm_request("https://x/a.png", "https://x/a.png", "https://x/c.png")
    producer.produce(req, pool)
    assert list(h.plugin.score(req, pool)) == [0.0, 0.5, 0.0]  # type: ignore[attr-defined]
    text = request("no images")
    producer.produce(text, pool)
    assert list(h.plugin.score(text, pool)) == [0.0, 0.0, 0.0]  # type: ignore[attr-defined]


def test_the_lru_holds_cache_size_over_2_mib_items_per_endpoint() -> None:
    rt = build(parse_config(MM_CACHE % 4))  # 2 items
    pool = [endpoint(1)]
    for rid, url in enumerate(["https://x/a", "https://x/b", "https://x/c"]):
        route(rt, mm_request(url, rid=str(rid)), pool)
    producer = next(p for p in rt.handle if p.type_name == "mm-embeddings-cache-producer")
    assert producer.items_held(pool[0].key) == 2  # type: ignore[attr-defined]
    req = mm_request("https://x/a", "https://x/c", rid="x")
    producer.produce(req, pool)  # type: ignore[attr-defined]
    assert producer.match(req).matched == {pool[0].key: 1}  # type: ignore[attr-defined]


def test_a_scorer_without_a_producer_gets_one() -> None:
    text = (MM_CACHE % 1).replace(
        "- type: mm-embeddings-cache-producer\n  parameters: {cacheSizeInMBPerServer: 1}\n", "")
    rt = build(parse_config(text))
    assert any(isinstance(p, MMEmbeddingsCacheProducer) for p in rt.producers)


def test_llm_d_sample_spelling_cache_size_in_mb_is_taken() -> None:
    h = PluginHarness.of("mm-embeddings-cache-producer", {"cacheSizeInMB": 20})
    assert h.plugin.capacity == 10  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="unknown parameters"):
        PluginHarness.of("mm-embeddings-cache-producer", {"cacheSize": 20})


def test_in_e_p_d_the_encode_pick_learns_so_the_image_returns_to_its_encoder() -> None:
    text = (EPD % "").replace(
        "- type: queue-scorer\n", "- type: queue-scorer\n- type: mm-embeddings-cache-scorer\n"
    ).replace("  plugins: [{pluginRef: encode-filter}, {pluginRef: queue-scorer}]",
              "  plugins: [{pluginRef: encode-filter}, {pluginRef: queue-scorer},\n"
              "            {pluginRef: mm-embeddings-cache-scorer, weight: 4}]")
    rt = build(parse_config(text))
    pool = fleet()
    first = route(rt, mm_request("https://x/a.png", rid="1"), pool)
    assert first.extra_headers[ENCODER_HEADER] == "10.0.0.3:8000"
    busy = pool[2]  # now the encoder with the longer queue
    busy.apply_scrape(type(busy.metrics)(waiting=9, updated_at=busy.metrics.updated_at))
    again = route(rt, mm_request("https://x/a.png", rid="2"), pool)
    assert again.extra_headers[ENCODER_HEADER] == "10.0.0.3:8000"
    fresh = route(rt, mm_request("https://x/new.png", rid="3"), pool)
    assert fresh.extra_headers[ENCODER_HEADER] == "10.0.0.4:8000"


# -- through the director -----------------------------------------------------------------

def test_the_director_names_the_encoder_and_strips_a_clients_copy() -> None:
    from epp.requestcontrol import Director
    from tests.epp.unit.test_director import store
    # unlabelled pods: decode-filter keeps them, so let it stand in for encode-filter here
    d = Director.of(build(parse_config(EPD_PD.replace(
        "  plugins: [{pluginRef: encode-filter}]", "  plugins: [{pluginRef: decode-filter}]")),
        store()))
    headers = {":path": "/v1/chat/completions", "x-request-id": "r1",
               ENCODER_HEADER: "10.9.9.9:1"}
    mm = orjson.dumps({"model": "m", "messages": chat(image(png(640, 360)))})
    decision, routed = d.route(headers, mm, {})
    assert decision.set_headers[ENCODER_HEADER] != "10.9.9.9:1"
    assert routed.request.prompt_tokens == 225 + 7  # "user" + the text, then the image
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    text = orjson.dumps({"model": "m", "messages": chat()})
    decision, routed = d.route({**headers, "x-request-id": "r2"}, text, {})
    assert ENCODER_HEADER not in decision.set_headers
    assert ENCODER_HEADER in decision.remove_headers
