"""The shared state store on Valkey: a local view kept in sync in the background.

Nothing here runs on the request path. Writes land in the local view
(:class:`~epp.statestore.memory.MemoryStateStore`) at once and are queued; every
``sync_interval`` one server-side script call pushes them, and the other replicas' in-flight
counts are pulled.
Prefix-index and session writes are also published on one channel, and every replica applies
the others' as they arrive, so a pick reads a local index that is at most one sync behind the
pool.

Keys (``ns`` = ``<namespace>:<pool>``):

==============================  ==============================================================
``ns:replicas``                 set of replica ids that push in-flight counts; TTL
                                ``inflight_ttl``, renewed by every push
``ns:inflight:<replica>``       sealed JSON ``{"t": wall time, "c": {endpoint: [requests,
                                tokens]}}`` of that replica, written whole every push with TTL
                                ``inflight_ttl``, so a dead replica's counts expire
``ns:prefix-endpoints``         set of endpoints that have a prefix key; TTL ``prefix_ttl``
``ns:prefix:<endpoint>``        sorted set block hash -> last use (wall seconds), trimmed to
                                the endpoint's capacity (LRU); TTL ``prefix_ttl``
``ns:session:<key>``            sealed string, TTL ``session_ttl``
``ns:updates``                  pub/sub channel: sealed ``{"r": replica, "p": [[endpoint,
                                [hash...], capacity]...], "s": {key: sealed value}}``
==============================  ==============================================================

Every key has a TTL. "Sealed" values carry an HMAC of the shared secret when one is set
(:mod:`epp.statestore.codec`): a writer without it cannot speak for a replica. Every value read
is validated; a bad one is dropped, counted in
``inference_extension_state_store_rejected_total{source,reason}`` and logged (at most once per
``REJECT_LOG_INTERVAL`` per source), and the sync goes on. Prefix sorted sets hold bare hashes
(signing each member would cost more than the index): they are read only when a replica
(re)subscribes, and only members that are 64-bit integers are kept.

``inference_extension_state_store_up`` is 1 only while the last push and pull succeeded, the
update feed is subscribed, and both background tasks are alive.

When Valkey cannot be reached the store logs one warning, sets
``inference_extension_state_store_up`` to 0, forgets the other replicas' counts (they can no
longer be known) and goes on with the local view; queued writes are kept (bounded). When
Valkey answers again it logs the re-join, writes its counts, re-subscribes and reloads
the shared index — a restarted, empty Valkey is refilled by the replicas themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable
from typing import Any

import orjson
import structlog
import valkey.asyncio as avalkey
from valkey.exceptions import ValkeyError

from epp.statestore import metrics
from epp.statestore.base import InFlight, RemoteListener, StateStore
from epp.statestore.codec import Codec, Rejected, decode_name, parse_hash
from epp.statestore.memory import MemoryStateStore
from epp.statestore.url import StoreURL

log = structlog.get_logger(__name__)

#: Prefix or session writes kept while Valkey is unreachable; older ones are dropped first.
MAX_PENDING = 10_000
#: Prefix (and session) writes sent in one push at most. One push is one server-side script,
#: and Valkey runs nothing else meanwhile: an unbounded backlog (after an outage, or a burst)
#: would block every replica and outlast the timeout, failing forever. The rest goes in the
#: next pushes, which follow at once while a backlog remains.
PUSH_BATCH = 500
#: Seconds between reconnection attempts while Valkey is unreachable.
RETRY_INTERVAL = 0.5
#: Seconds between two logged rejections of one source (every one is counted).
REJECT_LOG_INTERVAL = 10.0


async def _done(reply: Awaitable[Any] | Any) -> Any:
    """Await a client reply (the client's annotations also allow sync results)."""
    return await reply


#: One sync's writes in one round trip. Packing the commands in Python cost ~0.4 ms of CPU
#: per pick (the client encodes every argument); one script call with two JSON arguments
#: costs a few microseconds. Standalone or primary/replica Valkey only: the keys are built
#: inside the script, which Valkey Cluster does not allow.
PUSH_SCRIPT = """
local ns, replica = ARGV[1], ARGV[2]
local ikey = ns .. ':inflight:' .. replica
redis.call('SET', ikey, ARGV[6], 'PX', ARGV[3])
redis.call('SADD', ns .. ':replicas', replica)
redis.call('PEXPIRE', ns .. ':replicas', ARGV[3])
if ARGV[7] == '' then return 0 end
local update = cjson.decode(ARGV[7])
local now = tonumber(ARGV[8])
local caps = {}
for _, w in ipairs(update.p) do
  local key = ns .. ':prefix:' .. w[1]
  local args = {}
  for _, h in ipairs(w[2]) do
    args[#args + 1] = string.format('%.6f', now)
    args[#args + 1] = h
    now = now + 0.000001
  end
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
  caps[w[1]] = w[3]
end
for ep, cap in pairs(caps) do
  local key = ns .. ':prefix:' .. ep
  if cap > 0 then redis.call('ZREMRANGEBYRANK', key, 0, -(cap + 1)) end
  redis.call('PEXPIRE', key, ARGV[4])
  redis.call('SADD', ns .. ':prefix-endpoints', ep)
  redis.call('PEXPIRE', ns .. ':prefix-endpoints', ARGV[4])
end
for k, v in pairs(update.s) do
  redis.call('SET', ns .. ':session:' .. k, v, 'PX', ARGV[5])
end
redis.call('PUBLISH', ns .. ':updates', ARGV[9])
return 1
"""


def default_replica_id() -> str:
    """``<hostname>-<pid>-<random>``: unique per process, readable in ``ns:replicas``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ValkeyStateStore(StateStore):
    """Routing state shared through Valkey; see the module docstring for the key layout."""

    kind = "valkey"

    def __init__(self, url: StoreURL, *, pool: str = "default", replica: str | None = None,
                 inflight_ttl: float = 5.0, prefix_ttl: float = 3600.0,
                 session_ttl: float = 600.0, secret: bytes | None = None) -> None:
        if url.kind != "valkey":
            raise ValueError(f"ValkeyStateStore needs a valkey:// URL, got {url.redacted()}")
        self.url = url
        self.replica = replica or default_replica_id()
        self.inflight_ttl = inflight_ttl
        self.prefix_ttl = prefix_ttl
        self.session_ttl = session_ttl
        self.codec = Codec(secret)
        self._rejects_logged: dict[str, float] = {}
        self.local = MemoryStateStore(session_ttl=session_ttl)
        ns = self._ns = f"{url.namespace}:{pool}"
        self._k_replicas = f"{ns}:replicas"
        self._k_inflight = f"{ns}:inflight:"
        self._k_endpoints = f"{ns}:prefix-endpoints"
        self._k_prefix = f"{ns}:prefix:"
        self._k_session = f"{ns}:session:"
        self.channel = f"{ns}:updates"
        self._own_update = orjson.dumps({"r": self.replica})[:-1] + b","
        # Writes not yet pushed.
        self._prefix: deque[tuple[str, list[int], int]] = deque(maxlen=MAX_PENDING)
        self._sessions: dict[str, str] = {}
        self._up = False
        self._subscribed = False
        self._closing = False
        self._sync_lock = asyncio.Lock()
        self._client: avalkey.Valkey | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # --- the request path: local only ---------------------------------------------------
    def add_inflight(self, endpoint: str, requests: int, tokens: int = 0) -> None:
        self.local.add_inflight(endpoint, requests, tokens)

    def inflight(self, endpoint: str) -> InFlight:
        return self.local.inflight(endpoint)

    def prefix_add(self, endpoint: str, hashes: list[int], capacity: int) -> None:
        self.local.prefix_add(endpoint, hashes, capacity)
        self._prefix.append((endpoint, list(hashes), capacity))

    def prefix_match(self, hashes: list[int]) -> dict[str, int]:
        return self.local.prefix_match(hashes)

    def prefix_retain(self, endpoints: frozenset[str]) -> None:
        # Local only: the store's keys of a gone endpoint expire after prefix_ttl, and
        # another replica's view of the pool may briefly differ during a rollout.
        self.local.prefix_retain(endpoints)

    def session_set(self, key: str, value: str) -> None:
        self.local.session_set(key, value)
        sessions = self._sessions
        sessions.pop(key, None)
        sessions[key] = value
        if len(sessions) > MAX_PENDING:
            del sessions[next(iter(sessions))]

    def session_get(self, key: str) -> str | None:
        return self.local.session_get(key)

    @property
    def shared(self) -> bool:
        """True while state is shared: the store answers, the feed is subscribed and both
        background tasks run (what ``inference_extension_state_store_up`` reports)."""
        return (self._up and self._subscribed and len(self._tasks) == 2
                and not any(t.done() for t in self._tasks))

    @property
    def prefix_size(self) -> int:
        return self.local.prefix_size

    def on_remote_inflight(self, listener: RemoteListener) -> None:
        self.local.on_remote_inflight(listener)

    @property
    def namespace(self) -> str:
        """``<namespace>:<pool>``: the prefix of this pool's keys (for other shared state,
        e.g. flow control's token budgets)."""
        return self._ns

    @property
    def backlog(self) -> int:
        """Prefix and session writes queued for the store."""
        return len(self._prefix) + len(self._sessions)

    # --- life cycle ---------------------------------------------------------------------
    def _new_client(self) -> avalkey.Valkey:
        u = self.url
        kwargs: dict[str, Any] = {}
        if u.tls:
            kwargs = {"ssl": True, **u.tls_options}
        client = avalkey.Valkey(host=u.host, port=u.port, db=u.db, username=u.username,
                                password=u.password, socket_timeout=u.timeout,
                                socket_connect_timeout=u.timeout, **kwargs)
        # EVALSHA, reloading the script when the server lost it (e.g. after a restart).
        self._push_script = client.register_script(PUSH_SCRIPT)
        return client

    async def start(self) -> None:
        """Connect and start syncing. An unreachable store is not fatal: the replica starts
        on local state and joins when the store answers."""
        metrics.UP.labels(self.kind).set(0)
        self._client = self._new_client()
        await self.sync()
        self._tasks = [asyncio.create_task(self._sync_loop(), name="statestore-sync"),
                       asyncio.create_task(self._subscribe_loop(), name="statestore-subscribe")]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # The loops catch everything; this is the last line, so a dead task can never hide
        # behind a gauge that still says 1.
        self._report_up()
        if self._closing or task.cancelled():
            return
        log.error("state store task ended; routing on this replica's local state",
                  task=task.get_name(), replica=self.replica,
                  error=repr(task.exception()))

    def _report_up(self) -> None:
        metrics.UP.labels(self.kind).set(1 if self.shared else 0)

    async def close(self) -> None:
        """Stop syncing and take this replica's in-flight counts out of the pool's view."""
        # The flag as well as cancel(): a cancellation that lands while the client is
        # finishing a read can be lost inside it, and the loops must still end.
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # an error was logged by _task_ended; closing goes on
        self._tasks = []
        client, self._client = self._client, None
        if client is None:
            return
        if self._up:
            with contextlib.suppress(ValkeyError, OSError, asyncio.TimeoutError):
                await self._push(client)
                await client.delete(self._k_inflight + self.replica)
                await _done(client.srem(self._k_replicas, self.replica))
        await client.aclose()

    # --- background sync ----------------------------------------------------------------
    async def sync(self) -> None:
        """Push this replica's writes, then pull the others' in-flight counts."""
        client = self._client
        if client is None:
            raise RuntimeError("state store not started")
        async with self._sync_lock:  # one push at a time: counts must land in order
            await self._sync(client)

    async def _sync(self, client: avalkey.Valkey) -> None:
        if await self._op("push", self._push(client)) and await self._op("pull",
                                                                          self._pull(client)):
            self._mark_up()

    async def _sync_loop(self) -> None:
        while not self._closing:
            if not self._up:
                await asyncio.sleep(RETRY_INTERVAL)
            elif self.backlog < PUSH_BATCH:
                await asyncio.sleep(self.url.sync_interval)
            else:
                await asyncio.sleep(0)  # a backlog: push the next batch now
            await self.sync()

    async def _op(self, name: str, work: Awaitable[Any]) -> bool:
        """Run one store operation with its metrics; False (and fallback) on failure."""
        labels = (self.kind, name)
        metrics.OPERATIONS.labels(*labels).inc()
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.url.timeout * 4):
                await work
        except (ValkeyError, OSError, TimeoutError) as exc:
            metrics.ERRORS.labels(*labels).inc()
            self._mark_down(name, exc)
            return False
        except Exception as exc:  # a bug or data no check foresaw: never end the task
            metrics.ERRORS.labels(*labels).inc()
            log.exception("state store operation failed", operation=name,
                          replica=self.replica, error=repr(exc))
            self._mark_down(name, exc)
            return False
        metrics.LATENCY.labels(*labels).observe(time.perf_counter() - started)
        return True

    def _mark_down(self, operation: str, exc: BaseException) -> None:
        if self._up or not self._tasks:
            log.warning("state store unreachable; routing on this replica's local state",
                        store=self.url.redacted(), replica=self.replica, operation=operation,
                        error=str(exc) or type(exc).__name__)
        self._up = False
        self.local.set_remote({})
        self._report_up()

    def _mark_up(self) -> None:
        if not self._up:
            log.info("state store reachable; sharing routing state", store=self.url.redacted(),
                     replica=self.replica)
        self._up = True
        self._report_up()

    def reject(self, source: str, exc: Rejected, key: str = "") -> None:
        """Count and (rate-limited) log one refused value read from the store."""
        metrics.REJECTED.labels(self.kind, source, exc.reason).inc()
        now = time.monotonic()
        if now - self._rejects_logged.get(source, -REJECT_LOG_INTERVAL) >= REJECT_LOG_INTERVAL:
            self._rejects_logged[source] = now
            log.warning("state store value rejected", source=source, key=key,
                        reason=str(exc), replica=self.replica)

    async def _push(self, client: avalkey.Valkey) -> None:
        """One script call with this replica's counts and the oldest queued writes."""
        queue = self._prefix
        prefix = [queue.popleft() for _ in range(min(len(queue), PUSH_BATCH))]
        sessions = dict(itertools.islice(self._sessions.items(), PUSH_BATCH))
        for key in sessions:
            del self._sessions[key]
        try:
            await self._send(client, prefix, sessions)
        except BaseException:
            # Requeue what was not pushed ahead of newer writes; over the bound, the oldest go.
            self._prefix = deque(itertools.chain(prefix, self._prefix), maxlen=MAX_PENDING)
            merged = {**sessions, **self._sessions}
            self._sessions = dict(itertools.islice(merged.items(),
                                                   max(0, len(merged) - MAX_PENDING), None))
            raise
        finally:
            metrics.BACKLOG.labels(self.kind).set(self.backlog)

    async def _send(self, client: avalkey.Valkey, prefix: list[tuple[str, list[int], int]],
                    sessions: dict[str, str]) -> None:
        # This replica's counts go whole every time (endpoints with requests in flight only):
        # one small JSON value that also renews the TTL and that readers decode in C.
        codec = self.codec
        counts = codec.seal_inflight(self._k_inflight + self.replica, self.local.own)
        # Hashes travel as strings: Lua numbers are doubles and would round 64-bit hashes.
        update = sealed = b""
        if prefix or sessions:
            update = orjson.dumps({"r": self.replica,
                                   "p": [(ep, [str(h) for h in hs], cap)
                                         for ep, hs, cap in prefix],
                                   "s": {k: codec.seal_session(k, v)
                                         for k, v in sessions.items()}})
            sealed = codec.seal(self.channel, update)
        await self._push_script(
            keys=[], client=client,
            args=[self._ns, self.replica, int(self.inflight_ttl * 1000),
                  int(self.prefix_ttl * 1000), int(self.session_ttl * 1000),
                  counts, update, repr(time.time()), sealed])

    async def _pull(self, client: avalkey.Valkey) -> None:
        """Sum the other live replicas' in-flight counts into the local view."""
        others = []
        for raw in await _done(client.smembers(self._k_replicas)):
            try:
                member = decode_name(raw)
            except Rejected as exc:
                self.reject("replica", exc, self._k_replicas)
                continue
            if member != self.replica:
                others.append(member)
        if not others:
            self.local.set_remote({})
            return
        blobs: list[bytes | None] = await client.mget([self._k_inflight + r for r in others])
        totals: dict[str, list[int]] = {}
        gone = []
        for replica, blob in zip(others, blobs, strict=True):
            if blob is None:
                gone.append(replica)  # expired: that replica stopped syncing
                continue
            key = self._k_inflight + replica
            try:
                counts = self.codec.open_inflight(key, blob, self.inflight_ttl)
            except Rejected as exc:
                self.reject("inflight", exc, key)
                continue
            for endpoint, (requests, tokens) in counts.items():
                total = totals.get(endpoint)
                if total is None:
                    totals[endpoint] = [requests, tokens]
                else:
                    total[0] += requests
                    total[1] += tokens
        if gone:
            await _done(client.srem(self._k_replicas, *gone))
        self.local.set_remote({ep: InFlight(r, t) for ep, (r, t) in totals.items()})

    # --- the update feed ----------------------------------------------------------------
    async def _subscribe_loop(self) -> None:
        while not self._closing:
            client = self._client
            if client is None:
                return
            pubsub = client.pubsub()
            try:
                await self._listen(pubsub)
            except (ValkeyError, OSError, TimeoutError) as exc:
                metrics.ERRORS.labels(self.kind, "subscribe").inc()
                self._mark_down("subscribe", exc)
            except Exception as exc:  # never end the feed: log, count, re-subscribe
                metrics.ERRORS.labels(self.kind, "subscribe").inc()
                log.exception("state store update feed failed", replica=self.replica,
                              error=repr(exc))
            finally:
                self._subscribed = False
                self._report_up()
                with contextlib.suppress(ValkeyError, OSError, TimeoutError):
                    await pubsub.aclose()
            await asyncio.sleep(RETRY_INTERVAL)

    async def _listen(self, pubsub: Any) -> None:
        metrics.OPERATIONS.labels(self.kind, "subscribe").inc()
        async with asyncio.timeout(self.url.timeout * 4):
            await pubsub.subscribe(self.channel)
        # Subscribe first, then load: an update published in between is applied twice
        # (harmless: adds are idempotent) rather than lost.
        client = self._client
        if client is None or not await self._op("load", self._load(client)):
            return
        self._subscribed = True
        self._report_up()
        while not self._closing:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None and message["type"] == "message":
                self.apply_update(message["data"])

    def apply_update(self, data: bytes) -> None:
        """Apply another replica's published writes to the local view; a bad message is
        rejected whole (counted, logged) and changes nothing."""
        if isinstance(data, bytes) and data.partition(b".")[2].startswith(self._own_update):
            return  # our own publication, echoed back: skip it without checking
        try:
            update = self.codec.open_update(self.channel, data)
        except Rejected as exc:
            self.reject("update", exc, self.channel)
            return
        local = self.local
        for endpoint, hashes, capacity in update["p"]:
            local.prefix_add(endpoint, hashes, capacity)
        expires_at = local.clock() + self.session_ttl
        for key, value in update["s"].items():
            local.session_put(key, value, expires_at)

    async def _load(self, client: avalkey.Valkey) -> None:
        """Read the shared prefix index and sessions into the local view."""
        endpoints = []
        for raw in await _done(client.smembers(self._k_endpoints)):
            try:
                endpoints.append(decode_name(raw))
            except Rejected as exc:
                self.reject("prefix", exc, self._k_endpoints)
        if endpoints:
            pipe = client.pipeline(transaction=False)
            for endpoint in endpoints:
                pipe.zrange(self._k_prefix + endpoint, 0, -1)  # oldest first
            blocks: list[list[bytes]] = await pipe.execute()
            expired = []
            for endpoint, hashes in zip(endpoints, blocks, strict=True):
                if hashes:
                    # Capacity 0 here: the key is already trimmed to the endpoint's capacity,
                    # and the next local write trims with the real one.
                    self.local.prefix_add(endpoint, self._hashes(endpoint, hashes), 0)
                else:
                    expired.append(endpoint)
            if expired:
                await _done(client.srem(self._k_endpoints, *expired))
        keys = [k async for k in client.scan_iter(match=self._k_session + "*", count=1000)]
        if keys:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            replies = await pipe.execute()
            now = self.local.clock()
            cut = len(self._k_session)
            for key, value, ttl in zip(keys, replies[::2], replies[1::2], strict=True):
                if value is None or not isinstance(ttl, int) or ttl <= 0:
                    continue
                try:
                    name = decode_name(key)[cut:]
                    self.local.session_put(name, self.codec.session_value(name, value),
                                           now + ttl / 1000)
                except Rejected as exc:
                    self.reject("session", exc, repr(key))

    def _hashes(self, endpoint: str, members: list[bytes]) -> list[int]:
        """The valid block hashes of one prefix key; each bad member is rejected."""
        hashes = []
        for member in members:
            try:
                hashes.append(parse_hash(member))
            except Rejected as exc:
                self.reject("prefix", exc, self._k_prefix + endpoint)
        return hashes

