"""A local OTLP/gRPC trace receiver: what ``make run`` and the tests point Envoy, BBR and
the EPPs at, so a trace can be read without a collector.

It serves the real ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` call (the
messages come from PyPI ``opentelemetry-proto``), keeps every span in memory and appends each
as one JSON line to a file. ``python -m devkit.otlp FILE`` prints that file as trace trees::

    trace 4bf92f3577b34da6a3ce929d0e0e4736
      client-request [client]
        ingress [envoy-gateway] 3.1 ms
          async envoy.service.ext_proc.v3.ExternalProcessor.Process egress [envoy-gateway]
            gateway.request [bbr] 0.4 ms  gen_ai.request.model=llama
        ...
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc
from opentelemetry.proto.common.v1 import common_pb2


@dataclass(slots=True)
class ReceivedSpan:
    """One span as it arrived, ids in hex."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status: int = 0

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def decode(request: ts.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """The spans of one Export call."""
    out = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        service = str(resource.get("service.name", "?"))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(), name=s.name, service=service,
                    kind=s.kind, start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes={kv.key: _value(kv.value) for kv in s.attributes},
                    status=s.status.code))
    return out


class _TraceService(ts_grpc.TraceServiceServicer):
    def __init__(self, sink: Callable[[ts.ExportTraceServiceRequest], None]) -> None:
        self.sink = sink

    def Export(self, request: ts.ExportTraceServiceRequest,
               context: Any) -> ts.ExportTraceServiceResponse:
        self.sink(request)
        return ts.ExportTraceServiceResponse()


class OtlpReceiver:
    """OTLP/gRPC on ``127.0.0.1:port`` (0: a free one); spans kept and written to ``path``.

    ``count_only``: spans are counted (``count``), not kept - an answer as quick as a
    collector's, for benchmarks (building :class:`ReceivedSpan` objects in Python takes ~50 µs
    a span, and an exporter waiting on a slow answer costs its process CPU: bench/RESULTS.md)."""

    def __init__(self, port: int = 0, path: Path | None = None,
                 host: str = "127.0.0.1", count_only: bool = False) -> None:
        self.spans: list[ReceivedSpan] = []
        self.count = 0
        self.count_only = count_only
        self.path = path
        self._lock = threading.Condition()
        self._file: TextIO | None = None
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        ts_grpc.add_TraceServiceServicer_to_server(_TraceService(self._add), self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.host = host

    @property
    def endpoint(self) -> str:
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> OtlpReceiver:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w")
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1).wait()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _add(self, request: ts.ExportTraceServiceRequest) -> None:
        if self.count_only:
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with self._lock:
                self.count += n
            return
        spans = decode(request)
        with self._lock:
            self.count += len(spans)
            self.spans.extend(spans)
            if self._file is not None:
                for s in spans:
                    self._file.write(json.dumps(asdict(s)) + "\n")
                self._file.flush()
            self._lock.notify_all()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """Every span received so far for ``trace_id``."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool],
                 timeout: float = 20.0) -> list[ReceivedSpan]:
        """Wait until ``done(spans)`` holds; returns the spans (TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({f"{s.service}:{s.name}" for s in self.spans})
                    raise TimeoutError(f"spans not received in {timeout:g}s; got {names}")
                self._lock.wait(left)
            return list(self.spans)


# -- reading -------------------------------------------------------------------------------

def load(path: Path) -> list[ReceivedSpan]:
    """The spans a receiver wrote to ``path``."""
    return [ReceivedSpan(**json.loads(line)) for line in path.read_text().splitlines()
            if line.strip()]


#: Attributes shown beside a span in the tree (the rest are in the file).
SHOWN = ("gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
         "gen_ai.usage.output_tokens", "gen_ai.server.time_to_first_token",
         "llm_d.epp.scheduling.picked", "llm_d.epp.scorer.weight", "llm_d.epp.scorer.score.max",
         "llm_d.epp.scorer.scores", "llm_d.epp.picker.picked", "http.response.status_code",
         "upstream_address")


def render(spans: Sequence[ReceivedSpan], shown: Iterable[str] = SHOWN) -> str:
    """Trace trees, one per trace id, children under their parent in start order."""
    shown = tuple(shown)
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    lines = []
    for trace_id, members in by_trace.items():
        lines.append(f"trace {trace_id}")
        ids = {s.span_id for s in members}
        children: dict[str, list[ReceivedSpan]] = {}
        for s in members:
            children.setdefault(s.parent_span_id if s.parent_span_id in ids else "", []
                                ).append(s)

        _walk(children, "", 1, shown, lines)
    return "\n".join(lines)


def _walk(children: dict[str, list[ReceivedSpan]], parent: str, depth: int,
          shown: tuple[str, ...], lines: list[str]) -> None:
    for s in sorted(children.get(parent, []), key=lambda x: x.start_ns):
        extra = "  ".join(f"{k}={s.attributes[k]}" for k in shown if k in s.attributes)
        lines.append(f"{'  ' * depth}{s.name} [{s.service}] {s.duration_ms:.2f} ms"
                     + (f"  {extra}" if extra else ""))
        _walk(children, s.span_id, depth + 1, shown, lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m devkit.otlp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, help="a receiver's span file (run/traces.jsonl)")
    ap.add_argument("--last", type=int, default=5, help="show the last N traces (default 5)")
    args = ap.parse_args(argv)
    try:
        spans = load(args.file)
    except OSError as e:
        ap.error(f"cannot read {args.file}: {e.strerror or e}")
    except (ValueError, TypeError) as e:
        ap.error(f"{args.file} is not a span file written by devkit.otlp: {e}")
    order = list(dict.fromkeys(s.trace_id for s in spans))[-args.last:]
    keep = set(order)
    print(render([s for s in spans if s.trace_id in keep]))


if __name__ == "__main__":
    main()
