"""The service ends each ext_proc stream itself (OK status) once nothing is left to answer,
instead of waiting for Envoy, which would end it with a reset that grpc.aio leaks native
memory on (grpc/grpc#43360). The request stream here stays open after its last message, as
Envoy's does until the HTTP request is over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from shared.extproc import BodyMode, Exchange, ExtProcServicer
from tests.reliability.inprocess import body_msgs, headers_msg

REQUEST = [headers_msg([(":method", "POST"), (":path", "/v1/completions")]),
           *body_msgs(b'{"model": "m"}', [5])]
RESPONSE = [headers_msg([(":status", "200")], response=True),
            *body_msgs(b'{"choices": []}', [3], response=True)]


def _name(mode: BodyMode) -> str:
    return mode.name


class RequestOnly(Exchange):
    wants_response = False


async def open_stream(msgs: list[pb.ProcessingRequest]) -> AsyncIterator[pb.ProcessingRequest]:
    """``msgs``, then nothing more and no end: Envoy has not half-closed."""
    for m in msgs:
        yield m
    await asyncio.Event().wait()


def ends_by_itself(servicer: ExtProcServicer, msgs: list[pb.ProcessingRequest]) -> bool:
    async def go() -> bool:
        responses = servicer.Process(open_stream(msgs), None)
        try:
            await asyncio.wait_for(consume(responses), 1.0)
        except TimeoutError:
            return False
        return True

    async def consume(responses: AsyncIterator[pb.ProcessingResponse]) -> None:
        async for _ in responses:
            pass

    return asyncio.run(go())


@pytest.mark.parametrize("mode", [BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED], ids=_name)
def test_a_request_only_exchange_ends_the_stream_once_the_request_is_answered(
        mode: BodyMode) -> None:
    assert ends_by_itself(ExtProcServicer(RequestOnly, request_mode=mode), REQUEST)


@pytest.mark.parametrize("mode", [BodyMode.STREAMED, BodyMode.FULL_DUPLEX_STREAMED], ids=_name)
def test_an_exchange_that_wants_the_response_ends_the_stream_after_its_end(
        mode: BodyMode) -> None:
    closed: list[bool] = []

    class Recording(Exchange):
        def on_close(self, completed: bool) -> None:
            closed.append(completed)

    servicer = ExtProcServicer(Recording, request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               response_mode=mode)
    assert not ends_by_itself(servicer, REQUEST)
    assert not ends_by_itself(servicer, [*REQUEST, *RESPONSE[:-1]])
    assert closed == [False, False]
    assert ends_by_itself(servicer, [*REQUEST, *RESPONSE])
    assert closed[-1] is True
