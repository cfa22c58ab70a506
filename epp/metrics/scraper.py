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

A hostile or broken server costs little: a response is read only up to the caps
(:data:`MAX_WIRE_BYTES`, :data:`MAX_PAGE_BYTES`), and an endpoint whose scrapes keep failing
is scraped less and less often, up to :data:`MAX_BACKOFF` apart (:func:`backoff`).
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
from prometheus_client import Counter

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


#: Caps on one ``/metrics`` response. Upstream has none (and no flag), so they are constants.
#: A real vLLM page (histograms, LoRA info) is tens of KB, ~100 KB with many models: both
#: caps are far above any real page, and low enough that a hostile or broken server (an
#: endless page, a gzip bomb) costs one bounded read per scrape. Bytes on the wire: the
#: ``Content-Length`` (refused before reading), else the body bytes received, compressed
#: or not.
MAX_WIRE_BYTES = 4 * 1024 * 1024
#: Bytes of the page after decompression.
MAX_PAGE_BYTES = 16 * 1024 * 1024
#: Longest wait between the starts of two scrapes of an endpoint whose scrapes keep failing
#: (or the interval, if longer). It bounds what a failing server costs (about one capped
#: read a second) and how late a recovered one is seen (at most this long after).
MAX_BACKOFF = 1.0


class PageTooLarge(MetricsError):
    """The response is over :data:`MAX_WIRE_BYTES` on the wire or :data:`MAX_PAGE_BYTES`
    decompressed: a failed scrape."""


async def _read_capped(resp: aiohttp.ClientResponse) -> bytes:
    """The (decompressed) response body, or :class:`PageTooLarge` as soon as it passes a cap.

    aiohttp (>= 3.14, see pyproject.toml) decompresses a body only as fast as it is read,
    in bounded pieces, so stopping here also stops the decompression of a gzip bomb;
    ``total_raw_bytes`` counts what arrived before decompression."""
    if resp.content_length is not None and resp.content_length > MAX_WIRE_BYTES:
        raise PageTooLarge(f"metrics page of {resp.content_length} bytes is over "
                           f"{MAX_WIRE_BYTES} on the wire")
    body = bytearray()
    async for piece in resp.content.iter_any():
        body += piece
        if len(body) > MAX_PAGE_BYTES:
            raise PageTooLarge(f"metrics page is over {MAX_PAGE_BYTES} bytes decompressed")
        if resp.content.total_raw_bytes > MAX_WIRE_BYTES:
            raise PageTooLarge(f"metrics page is over {MAX_WIRE_BYTES} bytes on the wire")
    return bytes(body)


#: The data-layer error counters (upstream v0.10 names, both the deprecated
#: ``llm_d_inference_scheduler_*`` and the ``llm_d_epp_*`` twin): a failed fetch is a poll
#: error of ``metrics-data-source``, a page that could not be read an extract error of
#: ``core-metrics-extractor``.
SOURCE_TYPE, EXTRACTOR_TYPE = "metrics-data-source", "core-metrics-extractor"
_POLL_ERRORS = [Counter(p + "datalayer_poll_errors_total", "Data-source poll failures.",
                        ["source_type"]).labels(SOURCE_TYPE)
                for p in ("llm_d_inference_scheduler_", "llm_d_epp_")]
_EXTRACT_ERRORS = [Counter(p + "datalayer_extract_errors_total", "Extractor failures.",
                           ["source_type", "extractor_type"]).labels(SOURCE_TYPE, EXTRACTOR_TYPE)
                   for p in ("llm_d_inference_scheduler_", "llm_d_epp_")]


def datalayer_error(extracting: bool) -> None:
    """Count one failed scrape: in the extractor when the page arrived, else in the poll."""
    for counter in _EXTRACT_ERRORS if extracting else _POLL_ERRORS:
        counter.inc()


def backoff(interval: float, failures: int, threshold: int) -> float:
    """Seconds from one scrape's start to the next after ``failures`` failed scrapes in a
    row: the interval until ``threshold`` failures (a dead server is still noticed within
    ``threshold`` intervals), then doubling with each further failure, at most
    :data:`MAX_BACKOFF` (or the interval, if longer)."""
    extra = failures - threshold + 1
    if extra <= 0:
        return interval
    return min(max(MAX_BACKOFF, interval), interval * 2.0 ** min(extra, 32))


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
            wait = backoff(self.config.interval, view.consecutive_failures,
                           self.datastore.failure_threshold)
            await asyncio.sleep(max(0.0, wait - (loop.time() - started)))

    async def scrape_once(self, view: EndpointView) -> bool:
        """Scrape ``view`` once and record the outcome; True on success."""
        session = self._session
        if session is None:
            raise RuntimeError("scraper not started")
        view.begin_scrape()
        extracting = False
        try:
            async with session.get(self.url(view)) as resp:
                if resp.status != 200:
                    raise MetricsError(f"HTTP {resp.status}")
                body = await _read_capped(resp)
            extracting = True
            parsed = self.extract(body.decode("utf-8", "replace"), view, time.monotonic())
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, MetricsError, OSError) as e:
            datalayer_error(extracting)
            self._failed(view, e, refused=self._refused(view, e))
            return False
        except Exception as e:  # a page no rule foresaw must not end this endpoint's loop
            log.warning("metrics page could not be read", endpoint=view.key,
                        error=f"{type(e).__name__}: {e}")
            datalayer_error(extracting)
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
        if isinstance(error, PageTooLarge):
            seen = self._warned.setdefault(view.key, set())
            if "too large" not in seen:  # once per endpoint, not once per scrape
                seen.add("too large")
                log.warning("metrics page over the size cap; its scrapes fail",
                            endpoint=view.key, pod=view.endpoint.pod_name, error=reason)
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
