"""How the service ends an ext_proc stream. By default Envoy resets the stream once the HTTP
exchange is over, and grpc.aio leaks the native memory of any gRPC batch (a read, a write, the
final status) that the reset finds in flight (grpc/grpc#43360). So the service ends the stream
itself once nothing is left to answer, and after the response's end it waits on a plain timer
for that reset. The request stream here stays open after its last message, as Envoy's does
until the HTTP request is over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from shared.extproc import RESET_WAIT, BodyMode, Exchange, ExtProcServicer
from tests.support.inprocess import body_msgs, headers_msg

REQUEST = [headers_msg([(":method", "POST"), (":path", "/v1/completions")]),
           *body_msgs(b'{"model": "m"}', [5])]
RESPONSE = [headers_msg([(":status", "200")], response=True),
            *body_msgs(b'{"choices": []}', [3], response=True)]


def _name(mode: BodyMode) -> str:
    return mode.name


class RequestOnly(Exchange):
    wants_response = False


class Recording(Exchange):
    closed: list[bool] = []

    def on_close(self, completed: bool) -> None:
        self.closed.append(completed)


class OpenStream:
    """``msgs``, then nothing more and no end (Envoy has not half-closed); records whether the
    service asked for another message after the last one."""

    def __init__(self, msgs: list[pb.ProcessingRequest]) -> None:
        self.msgs = msgs
        self.read_past_end = False

    async def __aiter__(self) -> AsyncIterator[pb.ProcessingRequest]:
        for m in self.msgs:
            yield m
        self.read_past_end = True
        await asyncio.Event().wait()


async def consume(responses: AsyncIterator[pb.ProcessingResponse]) -> None:
    async for _ in responses:
        pass


def ends_by_itself(servicer: ExtProcServicer, msgs: list[pb.ProcessingRequest]) -> bool:
    async def go() -> bool:
        try:
            await asyncio.wait_for(consume(servicer.Process(OpenStream(msgs), None)), 1.0)
        except TimeoutError:
            return False
        return True

    return asyncio.run(go())


def duplex_servicer(response_mode: BodyMode) -> ExtProcServicer:
    Recording.closed = []
    return ExtProcServicer(Recording, request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                           response_mode=response_mode)


@pytest.mark.parametrize("mode", [BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED], ids=_name)
def test_a_request_only_exchange_ends_the_stream_once_the_request_is_answered(
        mode: BodyMode) -> None:
    assert ends_by_itself(ExtProcServicer(RequestOnly, request_mode=mode), REQUEST)


def test_a_request_only_exchange_passes_a_response_body_envoy_sends_it_through() -> None:
    # Envoy configured to send the response body (the BBR chart's Istio filter) waits for
    # every chunk back; ending the stream after the request lost the body in a race.
    servicer = ExtProcServicer(RequestOnly, request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               response_mode=BodyMode.FULL_DUPLEX_STREAMED)
    assert not ends_by_itself(servicer, REQUEST)

    async def go() -> bytes:
        out = b""
        async for resp in servicer.Process(OpenStream([*REQUEST, *RESPONSE]), None):
            out += resp.response_body.response.body_mutation.streamed_response.body
        return out

    assert asyncio.run(asyncio.wait_for(go(), 2.0)) == b'{"choices": []}'


def test_an_exchange_that_wants_the_response_keeps_reading_until_its_end() -> None:
    servicer = duplex_servicer(BodyMode.FULL_DUPLEX_STREAMED)
    assert not ends_by_itself(servicer, REQUEST)
    assert not ends_by_itself(servicer, [*REQUEST, *RESPONSE[:-1]])
    assert Recording.closed == [False, False]


@pytest.mark.parametrize("mode", [BodyMode.STREAMED, BodyMode.FULL_DUPLEX_STREAMED], ids=_name)
def test_after_the_response_the_stream_waits_for_the_reset_then_ends_itself(
        mode: BodyMode) -> None:
    stream = OpenStream([*REQUEST, *RESPONSE])

    async def go() -> float:
        responses = duplex_servicer(mode).Process(stream, None)
        async for _ in responses:
            answered = time.monotonic()
        return time.monotonic() - answered

    waited = asyncio.run(asyncio.wait_for(go(), 2.0))
    assert waited >= RESET_WAIT * 0.9
    assert not stream.read_past_end  # no read in flight for the reset to find
    assert Recording.closed == [True]  # once, before the wait (request metrics stay exact)


def test_a_reset_during_that_wait_ends_the_stream_quietly() -> None:
    async def go() -> asyncio.Future[pb.ProcessingResponse]:
        responses = duplex_servicer(BodyMode.FULL_DUPLEX_STREAMED).Process(
            OpenStream([*REQUEST, *RESPONSE]), None)
        async for resp in responses:
            if resp.response_body.response.body_mutation.streamed_response.end_of_stream:
                break  # the last answer; the generator stays suspended right after it
        waiting = asyncio.ensure_future(responses.__anext__())
        await asyncio.sleep(0)  # it is now in the wait, the exchange already told it is over
        assert Recording.closed == [True]
        waiting.cancel()  # what grpc.aio does to the handler when Envoy resets the stream
        await asyncio.gather(waiting, return_exceptions=True)
        return waiting

    assert asyncio.run(go()).cancelled()
    assert Recording.closed == [True]
