"""Polls every endpoint's ``/metrics`` and writes the result into the datastore.

One aiohttp session for all endpoints and one task per endpoint, so a slow or hanging
server only delays its own updates. Picking never waits for a scrape: the scheduler reads
whatever metrics are installed, and each endpoint's ``updated_at`` tells how old they are.

A failed scrape (a timeout, a non-200, a page without load metrics) leaves the endpoint on
its last metrics, which go stale, as upstream: a hung ``/metrics`` says nothing about
inference. After ``failure_threshold`` failures in a row the datastore drops the endpoint
from the candidates, until a scrape succeeds, only when there is nothing to serve on: its
metrics were never read, or its server refuses connections on the port it serves
(:meth:`Scraper._refused`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import structlog

from epp.datastore import Datastore, EndpointView, Snapshot
from epp.metrics.dialects import Anomaly, MetricsError, ParsedMetrics, parse_metrics

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ScraperConfig:
    """How and how often endpoints are scraped."""

    #: Seconds between the starts of two scrapes of one endpoint (``--refresh-metrics-interval``).
    interval: float = 0.05
    #: Whole-request timeout in seconds. Upstream uses 10 s; 2 s is our default because a
    #: server that cannot answer in 2 s is past the staleness threshold anyway, and a hung
    #: request given up sooner lets the next try see a recovered server sooner.
    timeout: float = 2.0
    path: str = "/metrics"
    #: ``http`` or ``https``.
    scheme: str = "http"
    #: With https: accept any server certificate (model servers mostly self-sign).
    insecure_skip_verify: bool = True
    #: Scrape this port instead of the endpoint's target port (metrics on a side port).
    port: int | None = None
    #: A bigger page is a failed scrape (a vLLM page is ~100 KB; an endless one must not
    #: grow the EPP's memory until the timeout).
    max_page_bytes: int = 16 * 1024 * 1024


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The response body, or :class:`MetricsError` as soon as it passes ``limit`` bytes."""
    if resp.content_length is not None and resp.content_length > limit:
        raise MetricsError(f"metrics page of {resp.content_length} bytes is over {limit}")
    body = bytearray()
    async for piece in resp.content.iter_chunked(1 << 16):
        body += piece
        if len(body) > limit:
            raise MetricsError(f"metrics page is over {limit} bytes")
    return bytes(body)


#: Reads one page for one endpoint: (page text, endpoint, now) → metrics.
Extract = Callable[[str, EndpointView, float], ParsedMetrics]


def _by_engine_label(text: str, view: EndpointView, now: float) -> ParsedMetrics:
    return parse_metrics(text, view.endpoint.engine, now)


class Scraper:
    """Keeps one scrape loop per endpoint of ``datastore``, following snapshot changes;
    ``extract`` reads each page (default: the dialect of the endpoint's engine label)."""

    def __init__(self, datastore: Datastore, config: ScraperConfig | None = None,
                 extract: Extract | None = None) -> None:
        self.datastore = datastore
        self.config = config or ScraperConfig()
        self.extract = extract or _by_engine_label
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[str, tuple[EndpointView, asyncio.Task[None]]] = {}
        self._warned: dict[str, set[Anomaly | str]] = {}
        self._running = False

    async def start(self) -> None:
        """Open the session and start scraping (also follows later snapshot changes)."""
        if self._running:
            return
        self._running = True
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.config.timeout),
            # No pool-wide connection cap: one keep-alive connection per endpoint.
            connector=aiohttp.TCPConnector(limit=0, force_close=False, ssl=self._ssl()),
            headers={"Accept": "text/plain"},
        )
        self.datastore.subscribe(self._on_snapshot)
        self._reconcile()

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.config.scheme != "https" or not self.config.insecure_skip_verify:
            return True  # aiohttp's default verification (unused for http)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    async def stop(self) -> None:
        """Stop every loop and close the session."""
        self._running = False
        tasks = [t for _, t in self._tasks.values()]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Scraper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def url(self, view: EndpointView) -> str:
        """The metrics URL of ``view``."""
        ep = view.endpoint
        host = f"[{ep.address}]" if ":" in ep.address else ep.address
        c = self.config
        return f"{c.scheme}://{host}:{c.port or ep.port}{c.path}"

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        if self._running:
            self._reconcile()

    def _reconcile(self) -> None:
        live = {v.key: v for v in self.datastore.views()}
        for key, (view, task) in list(self._tasks.items()):
            if live.get(key) is not view:
                task.cancel()
                del self._tasks[key]
                self._warned.pop(key, None)
        for key, view in live.items():
            if key not in self._tasks:
                task = asyncio.get_running_loop().create_task(
                    self._loop(view), name=f"scrape {key}"
                )
                self._tasks[key] = (view, task)

    async def _loop(self, view: EndpointView) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.scrape_once(view)
            await asyncio.sleep(max(0.0, self.config.interval - (loop.time() - started)))

    async def scrape_once(self, view: EndpointView) -> bool:
        """Scrape ``view`` once and record the outcome; True on success."""
        session = self._session
        if session is None:
            raise RuntimeError("scraper not started")
        view.begin_scrape()
        try:
            async with session.get(self.url(view)) as resp:
                if resp.status != 200:
                    raise MetricsError(f"HTTP {resp.status}")
                body = await _read_capped(resp, self.config.max_page_bytes)
            parsed = self.extract(body.decode("utf-8", "replace"), view, time.monotonic())
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, MetricsError, OSError) as e:
            self._failed(view, e, refused=self._refused(view, e))
            return False
        except Exception as e:  # a page no rule foresaw must not end this endpoint's loop
            log.warning("metrics page could not be read", endpoint=view.key,
                        error=f"{type(e).__name__}: {e}")
            self._failed(view, e)
            return False
        was_failing = (not view.healthy
                       or view.consecutive_failures >= self.datastore.failure_threshold)
        self.datastore.record_scrape(view, parsed.metrics)
        if was_failing:
            log.info("endpoint metrics recovered", endpoint=view.key)
        self._warn_once(view, parsed.anomalies, parsed.missing)
        return True

    def _refused(self, view: EndpointView, error: BaseException) -> bool:
        """True when ``error`` says the server itself is down: the connection to the port
        it serves on could not be made (refused, unreachable), TLS aside. A metrics side
        port that refuses says nothing about inference."""
        port = self.config.port
        return (isinstance(error, aiohttp.ClientConnectorError)
                and not isinstance(error, aiohttp.ClientSSLError)
                and (port is None or port == view.endpoint.port))

    def _failed(self, view: EndpointView, error: BaseException, *, refused: bool = False) -> None:
        reason = str(error) or type(error).__name__
        if self.datastore.record_scrape_failure(view, refused=refused):
            log.warning(
                "endpoint out of the candidates: metrics scrapes keep failing"
                + (" (connection refused)" if refused else " (metrics never read)"),
                endpoint=view.key,
                pod=view.endpoint.pod_name,
                failures=view.consecutive_failures,
                error=reason,
            )
        elif view.healthy and view.consecutive_failures == self.datastore.failure_threshold:
            log.warning(
                "metrics scrapes keep failing; serving the endpoint on its last metrics",
                endpoint=view.key,
                pod=view.endpoint.pod_name,
                failures=view.consecutive_failures,
                error=reason,
            )
        else:
            log.debug("metrics scrape failed", endpoint=view.key, error=reason)

    def _warn_once(
        self, view: EndpointView, anomalies: tuple[Anomaly, ...], missing: tuple[str, ...]
    ) -> None:
        if not anomalies and not missing:
            return
        seen = self._warned.setdefault(view.key, set())
        for a in anomalies:
            if a not in seen:
                seen.add(a)
                log.warning("model server reports an impossible metric value",
                            endpoint=view.key, family=a.family, problem=a.problem)
        for m in missing:
            if m not in seen:
                seen.add(m)
                log.warning("model server does not report a load metric; assuming 0",
                            endpoint=view.key, metric=m, engine=view.endpoint.engine.value)
