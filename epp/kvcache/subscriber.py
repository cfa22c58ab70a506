"""ZMQ SUB sockets feeding the model servers' KV events into the block index.

Two socket modes, as llm-d has them: :class:`KVEventSubscriber` connects one SUB socket to
each endpoint's PUB socket (``discoverPods``); :class:`KVEventCollector` binds one SUB socket
that every server's publisher connects to (``zmqEndpoint``), and tells the endpoints apart by
the message topic (``kv@<pod ip>[:port]@<model>``). Both hand each endpoint's batches to one
:class:`EndpointStream`, the per-endpoint state machine below.

Keeping in sync is the streams' and sockets' business, never the index's or the scorer's:

* **Sequence numbers.** Each batch carries the publisher's counter. A jump forward is a gap:
  the missed range is asked for on the server's replay socket (``replay_address``) and
  applied in order; when there is no replay socket, it does not answer in time, or its
  buffer no longer reaches back, the endpoint is *resynced*: everything the index held for
  it is forgotten and rebuilt from the live stream (vLLM has no "send me your whole cache").
  A jump backwards means a new publisher (a restarted server, empty cache): forget it too.
* **Broken streams.** ZMTP heartbeats drop a silent peer so a vanished server is noticed; a
  lost connection closes the socket and a new one connects after a backoff (``reconnect_min``
  doubling to ``reconnect_max`` while no batch gets through; libzmq's own reconnect interval
  follows the same bounds while the server is unreachable). A lost connection makes the
  endpoint *unknown*: the index forgets it (a server that went away may come back cold, and a
  restarted publisher's sequence cannot be told from the old one's once it catches up) and
  relearns it from the stream, asking the replay socket for the new publisher's history when
  it has one.
* **Hostile input.** Wrong frames, garbage or truncated msgpack, oversized payloads and
  impossible events are counted (``inference_extension_kv_events_malformed_total{reason}``),
  logged at a bounded rate and skipped; they never stop the subscriber.
* **A bound socket** cannot tell one lost publisher from another (connections have no
  topic): a restarted server shows as its sequence going backwards, and an endpoint that
  leaves the pool is forgotten by :meth:`KVEventCollector.sync`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from epp.kvcache.index import KVBlockIndex, UnindexableEvent
from epp.kvcache.metrics import KVEventMetrics, track_subscriptions
from modelserver.kvevents import (
    MAX_BLOCKS_PER_EVENT,
    MAX_PAYLOAD_BYTES,
    MalformedMessage,
    decode_batch,
    parse_message,
    parse_replay_reply,
    replay_request,
    zmq_context,
)

log = structlog.get_logger(__name__)

_POLL_MS = 250
_DRAIN = 256
#: Batches, and their bytes, waiting per endpoint on the bound socket (see ``_Lane``).
_LANE_DEPTH = 10_000
_LANE_BYTES = 64 << 20
_EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


@dataclass(frozen=True, slots=True)
class KVEventSource:
    """Where one endpoint publishes its KV events."""

    #: The endpoint the events describe, as the scheduler names it (``ip:port``).
    endpoint: str
    #: ZMQ address of its PUB socket, e.g. ``tcp://10.0.0.7:5557``.
    address: str
    #: Base model served there; roots the keys of non-adapter blocks.
    model: str
    #: ZMQ address of its replay (ROUTER) socket, if it has one.
    replay_address: str | None = None
    #: Topic prefix to subscribe to (``""``: all; llm-d uses ``kv@``).
    topic_filter: str = ""


@dataclass(frozen=True, slots=True)
class SubscriberConfig:
    """Timing and limits shared by all subscribers."""

    reconnect_min: float = 0.1
    reconnect_max: float = 5.0
    replay_timeout: float = 2.0
    heartbeat: float = 1.0
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    max_blocks_per_event: int = MAX_BLOCKS_PER_EVENT

    def __post_init__(self) -> None:
        if not 0 < self.reconnect_min <= self.reconnect_max:
            raise ValueError("need 0 < reconnect_min <= reconnect_max")
        if self.replay_timeout <= 0 or self.heartbeat <= 0:
            raise ValueError("replay_timeout and heartbeat must be positive")


class _WarnLimiter:
    """Counts a noisy kind of warning and logs only the 1st and every 1000th."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, message: str, **fields: object) -> None:
        self.count += 1
        if self.count == 1 or self.count % 1000 == 0:  # bounded: a hostile peer is noisy
            log.warning(message, dropped=self.count, **fields)


def count_malformed(metrics: KVEventMetrics, warn: _WarnLimiter, exc: MalformedMessage,
                    **where: object) -> None:
    """Count one dropped message and warn at a bounded rate."""
    metrics.malformed.labels(exc.reason).inc()
    warn("kv events: dropped malformed message", error=str(exc), **where)


class EndpointStream:
    """One endpoint's batches, in sequence: the state machine both socket modes share.

    It applies batches in order, asks the replay socket for a missed range (or forgets the
    endpoint when that fails), and forgets the endpoint when a new publisher appears (the
    sequence went backwards). It does no socket I/O of its own except the replay request.
    """

    def __init__(self, source: KVEventSource, index: KVBlockIndex, metrics: KVEventMetrics,
                 config: SubscriberConfig, on_cold: Callable[[str], None] | None = None,
                 warn: _WarnLimiter | None = None) -> None:
        self.source = source
        self.index = index
        self.metrics = metrics
        self.config = config
        #: Called with the endpoint when its cache must be presumed cold (the stream was
        #: lost, or a new publisher appeared): whoever else guesses at that cache forgets too.
        self.on_cold = on_cold
        self.warn = warn or _WarnLimiter()
        #: Next sequence number expected; ``None`` until the first batch (or after a restart).
        self.expected: int | None = None
        self.batches = 0
        ep = source.endpoint
        self._m_batches = metrics.batches.labels(ep)
        self._m_events = {t: metrics.events.labels(t) for t in _EVENT_TYPES}
        self._m_blocks = {t: metrics.blocks.labels(t) for t in _EVENT_TYPES}

    def forget(self) -> int:
        """The endpoint is unknown from here on (its stream was lost): forget what the index
        holds for it and tell whoever else guesses at its cache. Returns blocks forgotten."""
        self.expected = None
        forgotten = self.index.clear_endpoint(self.source.endpoint)
        self._cold()
        return forgotten

    def _cold(self) -> None:
        if self.on_cold is not None:
            self.on_cold(self.source.endpoint)

    def malformed(self, exc: MalformedMessage) -> None:
        count_malformed(self.metrics, self.warn, exc, endpoint=self.source.endpoint)

    async def on_batch(self, seq: int, payload: bytes) -> None:
        """Apply batch ``seq``, first catching up (or resyncing) if batches were missed."""
        ep = self.source.endpoint
        expected = self.expected
        if expected is not None and seq < expected:
            # A new publisher (the server restarted): what we knew of its cache is gone.
            self.metrics.restarts.labels(ep).inc()
            self.forget()
            log.info("kv events: publisher restarted", endpoint=ep, seq=seq, expected=expected)
            expected = None
        if expected is None:
            if seq > 0 and self.source.replay_address:
                await self._catch_up(0, seq)  # history of a server that ran before us
        elif seq > expected:
            if self.source.replay_address and await self._catch_up(expected, seq):
                self.metrics.gaps.labels("replayed").inc()
            else:
                self.metrics.gaps.labels("resynced").inc()
                self.index.clear_endpoint(ep)
                log.warning("kv events: missed batches, endpoint resynced", endpoint=ep,
                            first_missed=expected, received=seq)
        self._apply(payload)
        self.expected = seq + 1

    async def _catch_up(self, start: int, until: int) -> bool:
        """Replay ``[start, until)``; applied only when complete. Returns success."""
        got = await self._replay(start)
        if got is None:
            return False
        wanted = [(s, p) for s, p in got if start <= s < until]
        if [s for s, _ in wanted] != list(range(start, until)):
            return False
        for _, payload in wanted:
            self._apply(payload)
        return True

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Everything the replay socket still has from ``start`` on; ``None`` on failure."""
        address = self.source.replay_address
        assert address is not None
        sock = zmq_context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        deadline = time.monotonic() + self.config.replay_timeout
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(address)
            await sock.send_multipart(replay_request(start))
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not await sock.poll(int(left * 1000) + 1):
                    log.warning("kv events: replay timed out", endpoint=self.source.endpoint)
                    return None
                try:
                    item = parse_replay_reply(await sock.recv_multipart())
                except MalformedMessage as exc:
                    self.malformed(exc)
                    return None
                if item is None:
                    return out
                out.append(item)
        except zmq.ZMQError as exc:
            log.warning("kv events: replay failed", endpoint=self.source.endpoint,
                        error=str(exc))
            return None
        finally:
            sock.close(linger=0)

    def _apply(self, payload: bytes) -> None:
        cfg = self.config
        try:
            batch = decode_batch(payload, max_bytes=cfg.max_payload_bytes,
                                 max_blocks=cfg.max_blocks_per_event)
        except MalformedMessage as exc:
            self.malformed(exc)
            return
        index = self.index
        ep = self.source.endpoint
        model = self.source.model
        for ev in batch.events:
            kind = type(ev).__name__
            try:
                n = index.apply(ep, ev, model)
            except UnindexableEvent as exc:
                self.metrics.skipped.labels(exc.reason).inc()
                continue
            self._m_events[kind].inc()
            if n:
                self._m_blocks[kind].inc(n)
        self.batches += 1
        self._m_batches.inc()
        self.metrics.lag.observe(max(0.0, time.time() - batch.ts))


def _sub_socket(cfg: SubscriberConfig, topic_filter: str) -> zmq.asyncio.Socket:
    sock = zmq_context().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(cfg.heartbeat * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(cfg.heartbeat * 3000))
    sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_payload_bytes + 65_536)
    sock.setsockopt(zmq.SUBSCRIBE, topic_filter.encode())
    return sock


class KVEventSubscriber:
    """Subscribes to one endpoint's KV events (connecting to its PUB socket) and keeps the
    index in step with them."""

    def __init__(self, source: KVEventSource, index: KVBlockIndex, metrics: KVEventMetrics,
                 config: SubscriberConfig | None = None,
                 on_cold: Callable[[str], None] | None = None) -> None:
        self.source = source
        self.metrics = metrics
        self.config = config or SubscriberConfig()
        self.stream = EndpointStream(source, index, metrics, self.config, on_cold)
        #: Whether the SUB socket currently has a connection to the publisher.
        self.connected = False
        self._task: asyncio.Task[None] | None = None
        self._reset = False

    @property
    def expected(self) -> int | None:
        """Next sequence number expected (see :attr:`EndpointStream.expected`)."""
        return self.stream.expected

    @property
    def batches(self) -> int:
        """Batches applied so far."""
        return self.stream.batches

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the subscriber task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kv-events {self.source.endpoint}")

    async def stop(self) -> None:
        """Stop the task and close the socket."""
        await cancel_task(self._task)
        self._task = None

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        cfg = self.config
        delay = cfg.reconnect_min
        while True:
            try:
                sock = self._open()
            except zmq.ZMQError as exc:
                self.metrics.zmq_errors.labels(self.source.endpoint, "connect").inc()
                log.warning("kv events: cannot open subscriber", endpoint=self.source.endpoint,
                            address=self.source.address, error=str(exc))
            else:
                try:
                    applied = self.batches
                    await self._consume(sock)
                    if self.batches > applied:  # the stream worked: start the backoff again
                        delay = cfg.reconnect_min
                except zmq.ZMQError as exc:
                    self.metrics.zmq_errors.labels(self.source.endpoint, "recv").inc()
                    log.warning("kv events: subscriber failed", endpoint=self.source.endpoint,
                                error=str(exc))
                finally:
                    sock.close(linger=0)
            self.metrics.reconnects.labels(self.source.endpoint).inc()
            self.metrics.reconnections.labels(self.source.endpoint).inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.reconnect_max)

    def _open(self) -> zmq.asyncio.Socket:
        cfg = self.config
        sock = _sub_socket(cfg, self.source.topic_filter)
        sock.setsockopt(zmq.RECONNECT_IVL, int(cfg.reconnect_min * 1000))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(cfg.reconnect_max * 1000))
        return sock

    async def _consume(self, sock: zmq.asyncio.Socket) -> None:
        self._reset = False
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(self.source.address)  # after the monitor, so it sees the connection
        poller = zmq.asyncio.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not self._reset:
                ready = dict(await poller.poll(_POLL_MS))
                if sock in ready:  # data first: batches queued before a disconnect are older
                    await self._drain(sock)
                elif monitor in ready:
                    msg = parse_monitor_message(await monitor.recv_multipart())
                    self._on_socket_event(int(msg["event"]))
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            self.connected = False

    async def _drain(self, sock: zmq.asyncio.Socket) -> None:
        """Handle the queued messages (up to a bound, so the monitor gets its turn)."""
        received = self.metrics.messages.labels(self.source.endpoint)
        for _ in range(_DRAIN):
            try:
                frames = await sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            received.inc()
            try:
                _topic, seq, payload = parse_message(frames)
            except MalformedMessage as exc:
                self.stream.malformed(exc)
            else:
                await self.stream.on_batch(seq, payload)

    def _on_socket_event(self, event: int) -> None:
        ep = self.source.endpoint
        if event == zmq.EVENT_CONNECTED:
            self.connected = True
            log.info("kv events: connected", endpoint=ep, address=self.source.address)
            return
        self.connected = False
        # libzmq reconnects after a network error but not after a protocol error (e.g. a
        # frame over MAXMSGSIZE): a new socket, after the backoff, covers both.
        self._reset = True
        self.metrics.disconnects.labels(ep).inc()
        forgotten = self.stream.forget()
        log.warning("kv events: stream lost, endpoint unknown until it publishes again",
                    endpoint=ep, forgotten_blocks=forgotten)


async def cancel_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class KVEventSubscriptions:
    """The set of subscribers for a pool: follows the endpoints as they come and go."""

    def __init__(self, index: KVBlockIndex, metrics: KVEventMetrics,
                 config: SubscriberConfig | None = None,
                 on_cold: Callable[[str], None] | None = None) -> None:
        self.index = index
        self.metrics = metrics
        self.config = config or SubscriberConfig()
        #: See :attr:`EndpointStream.on_cold`.
        self.on_cold = on_cold
        self.subscribers: dict[str, KVEventSubscriber] = {}
        track_subscriptions(self)

    def live(self, endpoint: str) -> bool:
        """Whether ``endpoint``'s subscriber is connected to its publisher."""
        sub = self.subscribers.get(endpoint)
        return sub is not None and sub.connected

    async def sync(self, sources: Iterable[KVEventSource]) -> None:
        """Subscribe to new sources, drop vanished ones (and what the index held for them)."""
        wanted = {s.endpoint: s for s in sources}
        for ep, sub in list(self.subscribers.items()):
            if wanted.get(ep) != sub.source:
                await sub.stop()
                del self.subscribers[ep]
                self.index.clear_endpoint(ep)
                self.metrics.forget_subscriber(ep)
        for ep, src in wanted.items():
            if ep not in self.subscribers:
                sub = KVEventSubscriber(src, self.index, self.metrics, self.config,
                                        self.on_cold)
                self.subscribers[ep] = sub
                sub.start()

    async def stop(self) -> None:
        """Stop every subscriber."""
        for sub in self.subscribers.values():
            await sub.stop()
        self.subscribers.clear()


class BindError(ValueError):
    """The collector's address cannot be bound (in use, not an address of this host...)."""


def topic_pod(topic: bytes) -> str:
    """The pod identifier of a topic ``kv@<pod>@<model>`` (llm-d's convention); a topic of
    another shape is its own identifier, as llm-d's vLLM adapter reads it."""
    text = topic.decode("utf-8", "replace")
    parts = text.split("@")
    return parts[1] if len(parts) == 3 else text


class _Lane:
    """One endpoint's batches from the bound socket, applied in order on their own task, so
    a replay one endpoint waits for never holds up the others. At most ``_LANE_DEPTH``
    batches of at most ``_LANE_BYTES`` in all wait; more are dropped, which the stream then
    sees as a gap (replayed or resynced)."""

    def __init__(self, stream: EndpointStream) -> None:
        self.stream = stream
        self.queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=_LANE_DEPTH)
        self.queued_bytes = 0
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"kv-events {stream.source.endpoint}")

    def put(self, seq: int, payload: bytes) -> None:
        if self.queued_bytes + len(payload) > _LANE_BYTES or self.queue.full():
            return
        self.queued_bytes += len(payload)
        self.queue.put_nowait((seq, payload))

    async def _run(self) -> None:
        while True:
            seq, payload = await self.queue.get()
            self.queued_bytes -= len(payload)
            await self.stream.on_batch(seq, payload)


class KVEventCollector:
    """One SUB socket bound at ``address`` that every server's publisher connects to
    (llm-d's ``kvEventsConfig.zmqEndpoint``, the *centralized* mode).

    The endpoint of a batch is named by its topic's pod identifier: an exact ``ip:port``
    match with a pool endpoint first, else a bare IP names the one endpoint at that IP. A
    batch naming no pool endpoint, or an IP several endpoints share, is skipped and counted
    (``inference_extension_kv_events_unmatched_batches_total{reason}``). Each endpoint's
    batches go to its own :class:`EndpointStream` (sequence numbers are per publisher) on
    its own task, created with the endpoint's first batch: an endpoint that joins the pool
    later starts its sequence tracking fresh.
    """

    def __init__(self, address: str, index: KVBlockIndex, metrics: KVEventMetrics,
                 config: SubscriberConfig | None = None,
                 on_cold: Callable[[str], None] | None = None, topic_filter: str = "") -> None:
        #: Where to bind (llm-d's ``kvEventsConfig.zmqEndpoint``, named so in errors).
        self.address = address
        self.topic_filter = topic_filter
        self.index, self.metrics = index, metrics
        self.config = config or SubscriberConfig()
        #: See :attr:`EndpointStream.on_cold`.
        self.on_cold = on_cold
        #: The pool's endpoints (``ip:port`` -> source) and, per IP, the endpoints there.
        self.sources: dict[str, KVEventSource] = {}
        self._by_ip: dict[str, list[str]] = {}
        #: Lanes (and streams) of the endpoints heard from, by endpoint.
        self._lanes: dict[str, _Lane] = {}
        #: The bound address (a ``*`` port resolved) once :meth:`bind` succeeded.
        self.bound: str | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._warn_malformed = _WarnLimiter()
        self._warn_unmatched = _WarnLimiter()

    @property
    def streams(self) -> dict[str, EndpointStream]:
        """The streams of the endpoints heard from, by endpoint."""
        return {ep: lane.stream for ep, lane in self._lanes.items()}

    def live(self, endpoint: str) -> bool:
        """Whether ``endpoint``'s publisher has been heard from (and not lost since)."""
        lane = self._lanes.get(endpoint)
        return lane is not None and lane.stream.expected is not None

    # -- lifecycle -------------------------------------------------------------------------
    def bind(self) -> None:
        """Bind the socket now (idempotent); :class:`BindError` names the parameter."""
        if self._sock is not None:
            return
        sock = _sub_socket(self.config, self.topic_filter)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise BindError(f"kvEventsConfig.zmqEndpoint: cannot bind {self.address}: "
                            f"{exc}") from None
        self._sock = sock
        self.bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("kv events: collector bound", address=self.bound)

    def start(self) -> None:
        """Bind if needed and start receiving (idempotent; a bind error is raised)."""
        self.bind()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="kv-events collector")

    async def stop(self) -> None:
        """Stop receiving and close the socket."""
        await cancel_task(self._task)
        self._task = None
        for lane in self._lanes.values():
            await cancel_task(lane.task)
        self._lanes.clear()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def sync(self, sources: Iterable[KVEventSource]) -> None:
        """The pool now holds exactly these endpoints: forget the ones that left."""
        wanted = {s.endpoint: s for s in sources}
        for ep, lane in list(self._lanes.items()):
            if wanted.get(ep) != lane.stream.source:
                del self._lanes[ep]
                await cancel_task(lane.task)
                self.index.clear_endpoint(ep)
        self.sources = wanted
        by_ip: dict[str, list[str]] = {}
        for ep in wanted:
            by_ip.setdefault(ep.rpartition(":")[0].strip("[]"), []).append(ep)
        self._by_ip = by_ip

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                frames = await sock.recv_multipart()
            except zmq.ZMQError as exc:  # the socket itself broke: keep trying, slowly
                log.warning("kv events: collector receive failed", error=str(exc))
                await asyncio.sleep(self.config.reconnect_max)
                continue
            try:
                topic, seq, payload = parse_message(frames)
            except MalformedMessage as exc:
                count_malformed(self.metrics, self._warn_malformed, exc, address=self.bound)
                continue
            lane = self._lane_for(topic)
            if lane is not None:
                lane.put(seq, payload)

    def resolve(self, pod: str) -> str | None:
        """The pool endpoint a topic's pod identifier names; None (counted) when none or
        several do."""
        if pod in self.sources:
            return pod
        at_ip = self._by_ip.get(pod.strip("[]"), ())
        if len(at_ip) == 1:
            return at_ip[0]
        reason = "ambiguous_endpoint" if at_ip else "no_endpoint"
        self.metrics.unmatched.labels(reason).inc()
        self._warn_unmatched("kv events: batch for no single pool endpoint skipped",
                             reason=reason, pod=pod[:128])
        return None

    def _lane_for(self, topic: bytes) -> _Lane | None:
        ep = self.resolve(topic_pod(topic))
        if ep is None:
            return None
        lane = self._lanes.get(ep)
        if lane is None:
            lane = self._lanes[ep] = _Lane(EndpointStream(
                self.sources[ep], self.index, self.metrics, self.config, self.on_cold,
                self._warn_malformed))
        return lane
