"""``concurrency-detector`` ``maxPrefillConcurrency`` (ours): streamed requests per endpoint
that have not shown their first token yet. At the limit an endpoint takes nothing more,
flow control holds the next request, and the first token (or the end of the exchange) of
one of them lets it go; responses that are not streamed never count."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from epp.config import ConfigError
from epp.requestcontrol import Director, Routed
from epp.requestcontrol.plugins import ConcurrencyDetector, ConcurrencyParameters
from shared.plugins import PluginError, parse_parameters
from tests.epp.flowcontrol.test_flowcontrol_wiring import HEADERS, director

STREAMED = orjson.dumps({"model": "m", "prompt": "hello", "stream": True})
NOT_STREAMED = orjson.dumps({"model": "m", "prompt": "hello"})


def config(limit: int = 1, max_concurrency: int = 8, *, gate: bool = True,
           as_detector: bool = True) -> str:
    return (("featureGates: [flowControl]\n" if gate else "")
            + "plugins:\n- type: concurrency-detector\n"
            f"  parameters: {{maxConcurrency: {max_concurrency}, "
            f"maxPrefillConcurrency: {limit}}}\n"
            + ("saturationDetector: {pluginRef: concurrency-detector}\n" if as_detector
               else ""))


async def send(d: Director, rid: str, body: bytes = STREAMED) -> Routed:
    """Admit (waiting in flow control if it must) and pick; the request is on its way."""
    pending = d.prepare({**HEADERS, "x-request-id": rid}, body, {})
    await d.admit(pending)
    _, routed = d.dispatch(pending)
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    return routed


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def end(d: Director, routed: Routed, *, completed: bool = True) -> None:
    d.finish(routed, completed=completed, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=2)


async def test_the_next_request_waits_for_a_first_token_not_for_a_free_slot() -> None:
    d = director(config(limit=1, max_concurrency=8))
    fc = d.runtime.flow_control
    assert fc is not None
    first = await send(d, "r1")  # fast path: nothing is prefilling
    second = asyncio.create_task(send(d, "r2"))
    await settle()
    # 7 slots are free, but the one endpoint is computing a prompt: the request waits
    assert fc.snapshot()["queued"] == 1 and not second.done()
    d.response_chunk(first, b"data: {}\n\n", False)  # a chunk without a token: still waits
    await settle()
    assert not second.done()
    d.response_chunk(first, b'data: {"choices":[{"text":"a"}]}\n\n', True)
    routed = await asyncio.wait_for(second, 5)  # released while `first` still decodes
    assert fc.snapshot()["queued"] == 0 and routed.endpoint.key == first.endpoint.key
    end(d, first)
    end(d, routed)
    await fc.aclose()


async def test_an_exchange_that_ends_before_its_first_token_frees_its_place() -> None:
    d = director(config(limit=1))
    fc = d.runtime.flow_control
    assert fc is not None
    first = await send(d, "r1")
    second = asyncio.create_task(send(d, "r2"))
    await settle()
    assert not second.done()
    end(d, first, completed=False)  # the stream broke (client gone, server error)
    routed = await asyncio.wait_for(second, 5)
    d.response_chunk(routed, b"x", True)
    end(d, routed)  # a first token then the end: counted back once, never below zero
    (detector,) = d.runtime.handle.find(ConcurrencyDetector)
    assert detector.prefilling == {}
    await fc.aclose()


async def test_responses_that_are_not_streamed_do_not_count() -> None:
    """Their first token reaches the EPP only with the last, so counting them would hold the
    endpoint for their whole decode; they still need an endpoint below the limit."""
    d = director(config(limit=1))
    fc = d.runtime.flow_control
    assert fc is not None
    plain = [await send(d, f"p{i}", NOT_STREAMED) for i in range(3)]  # all at once
    streamed = await send(d, "s1")  # goes too: the plain ones are not counted
    after = asyncio.create_task(send(d, "s2", NOT_STREAMED))
    await settle()
    assert not after.done()  # the streamed one holds the endpoint's one prefill place
    end(d, streamed)
    end(d, await asyncio.wait_for(after, 5))
    for r in plain:
        end(d, r)
    await fc.aclose()


async def test_a_limit_of_two_lets_two_prompts_share_the_endpoint() -> None:
    d = director(config(limit=2))
    fc = d.runtime.flow_control
    assert fc is not None
    a, b = await send(d, "r1"), await send(d, "r2")
    third = asyncio.create_task(send(d, "r3"))
    await settle()
    assert not third.done() and fc.snapshot()["queued"] == 1
    d.response_chunk(b, b"x", True)
    c = await asyncio.wait_for(third, 5)
    for r in (a, b, c):
        end(d, r)
    await fc.aclose()


def test_the_detector_never_asks_for_the_response_body() -> None:
    """The prefill limit follows the first-token hook, not every chunk (the director reads
    chunks past the first token only for response-streaming plugins)."""
    limited = director(config())
    assert [p for p in limited.runtime.first_token if isinstance(p, ConcurrencyDetector)]
    assert not [p for p in limited.runtime.response_streaming
                if isinstance(p, ConcurrencyDetector)]


@pytest.mark.parametrize(("text", "message"), [
    (config(gate=False), "maxPrefillConcurrency needs flow control"),
    (config(as_detector=False), "with this plugin as saturationDetector.pluginRef"),
    (config(limit=0), "maxPrefillConcurrency: must be > 0"),
])
def test_a_limit_that_cannot_work_is_a_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        director(text)


def test_a_limit_must_be_an_integer() -> None:
    with pytest.raises(PluginError, match="maxPrefillConcurrency"):
        parse_parameters(ConcurrencyParameters, {"maxPrefillConcurrency": 1.5}, label="cd")
