"""In-process builders for the reliability property tests: a real Director over a real
datastore (no Envoy), and an ext_proc stream driven message by message."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from devkit.manifests import pool_manifests
from epp.config import build
from epp.datastore import Datastore, EndpointMetrics
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.handlers.exchange import PickerExchange
from epp.requestcontrol import Director
from shared.extproc import BodyMode, ExtProcServicer

#: The pool every in-process director serves.
POOL_KEYS = ("10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000")


def director(max_queue: int = 0) -> Director:
    """A Director for a three-endpoint pool with fresh, idle metrics."""
    pods = [(f"pod-{i}", key.split(":")[0]) for i, key in enumerate(POOL_KEYS)]
    objects = [parse_object(d) for d in pool_manifests("pool", pods, 8000)]
    store = Datastore()
    store.replace(build_snapshot([o for o in objects if o is not None], pool_name="pool",
                                 pool_namespace="default"))
    for view in store.views():
        view.begin_scrape()
        store.record_scrape(view, EndpointMetrics(waiting=max_queue, running=0, kv_usage=0.0,
                                                  updated_at=time.monotonic() + 3600))
    return Director.of(build(datastore=store, rng=random.Random(0)))


def headers_msg(headers: Iterable[tuple[str, str | bytes]], *, end_of_stream: bool = False,
                response: bool = False) -> pb.ProcessingRequest:
    """A request (or response) headers message; values may be raw bytes."""
    hm = base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v if isinstance(v, bytes) else v.encode())
        for k, v in headers])
    h = pb.HttpHeaders(headers=hm, end_of_stream=end_of_stream)
    return pb.ProcessingRequest(response_headers=h) if response else pb.ProcessingRequest(
        request_headers=h)


def body_msgs(body: bytes, cuts: Iterable[int], *, response: bool = False,
              eos: bool = True) -> list[pb.ProcessingRequest]:
    """``body`` as body messages cut at ``cuts`` (offsets), the last one end_of_stream."""
    points = sorted({c for c in cuts if 0 < c < len(body)})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    out = []
    for i, piece in enumerate(pieces):
        b = pb.HttpBody(body=piece, end_of_stream=eos and i == len(pieces) - 1)
        out.append(pb.ProcessingRequest(response_body=b) if response
                   else pb.ProcessingRequest(request_body=b))
    return out


async def iterate(msgs: list[pb.ProcessingRequest]) -> AsyncIterator[pb.ProcessingRequest]:
    for m in msgs:
        yield m


def run_stream(servicer: ExtProcServicer, msgs: list[pb.ProcessingRequest],
               ) -> list[pb.ProcessingResponse]:
    """Drive one ext_proc stream to its end; any exception escaping it propagates."""

    async def go() -> list[pb.ProcessingResponse]:
        return [r async for r in servicer.Process(iterate(msgs), None)]

    return asyncio.run(go())


def picker_servicer(d: Director, mode: BodyMode, max_body: int = 1 << 20) -> ExtProcServicer:
    """The EPP's servicer over ``d`` with Envoy's ``mode`` both ways."""
    return ExtProcServicer(lambda: PickerExchange(d), request_mode=mode, response_mode=mode,
                           max_body=max_body)


def request_outcome(responses: list[pb.ProcessingResponse]) -> tuple[int, dict[str, str], Any]:
    """(status, headers set, immediate body): status 0 when the request was sent upstream."""
    for resp in responses:
        if resp.HasField("immediate_response"):
            ir = resp.immediate_response
            return ir.status.code, {}, ir.body
        for kind in ("request_headers", "request_body"):
            if resp.HasField(kind):
                cr = getattr(resp, kind).response
                if cr.HasField("header_mutation") and cr.header_mutation.set_headers:
                    return 0, {h.header.key: h.header.raw_value.decode()
                               for h in cr.header_mutation.set_headers}, None
    return 0, {}, None
