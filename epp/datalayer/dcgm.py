"""``dcgm-data-source`` and ``dcgm-extractor`` (llm-d-router v0.10): each endpoint's GPU
utilization from NVIDIA's DCGM exporter, as the numeric endpoint attribute
``GPUUtilization/<extractor name>`` that ``endpoint-attribute-filter`` and
``endpoint-attribute-scorer`` read.

The exporter runs beside the model server (sidecar: the pod's IP, ``port`` 9400) or, with
``useNodeAddress``, as a DaemonSet on the node's IP (the pod's ``status.hostIP``); an endpoint
whose node address is unknown (a pod without ``status.hostIP``, a file-discovery endpoint) is
not scraped, with one warning, rather than scraping the wrong address. The project's simulator
serves the exporter's page at ``/dcgm/metrics`` on its own port.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import structlog

from epp.datalayer.custom_metrics import publish_scalars
from epp.datalayer.plugin import DataSource, Extractor
from epp.datalayer.tls import check_tls_files, client_ssl
from epp.datastore import Datastore, EndpointView
from epp.handle import EppHandle
from epp.metrics.parser import scan
from epp.scheduling.plugin import Plugin
from shared.plugins import Duration, Handle

log = structlog.get_logger(__name__)

DCGM_TEXT = "dcgm-prometheus-text"
GPU_UTIL_FAMILY = "DCGM_FI_DEV_GPU_UTIL"
MAX_PAGE_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class DcgmSourceParameters:
    """Upstream's ``scheme`` (http), ``path`` (/metrics), ``port`` (9400),
    ``insecureSkipVerify`` (true), ``caCertPath``, ``clientCertPath``/``clientKeyPath``,
    ``interval`` (default the EPP's ``--refresh-metrics-interval``), ``useNodeAddress``
    (false: the pod's IP; true: the node's, see the module docstring)."""

    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    port: int = 9400
    insecure_skip_verify: bool = True
    ca_cert_path: str | None = None
    client_cert_path: str | None = None
    client_key_path: str | None = None
    interval: Duration | None = None
    use_node_address: bool = False

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"path: must start with '/', got {self.path!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port: must be 1-65535, got {self.port}")
        if self.interval is not None and self.interval <= 0:
            raise ValueError("interval: must be > 0")
        check_tls_files(self.ca_cert_path, self.client_cert_path, self.client_key_path)


class DcgmDataSource(Plugin, DataSource):
    """Every ``interval``, GET ``<scheme>://<endpoint ip>:<port><path>`` of every endpoint
    (concurrently, 2 s timeout); the page goes to the extractors. A failed scrape leaves the
    endpoint's previous attribute (logged once per endpoint until it recovers)."""

    type_name = "dcgm-data-source"
    parameters_type = DcgmSourceParameters
    output_type = DCGM_TEXT
    params: DcgmSourceParameters

    def __init__(self, name: str = "", params: Any = None,
                 default_interval: float = 0.05) -> None:
        Plugin.__init__(self, name, params)
        DataSource.__init__(self)
        self.interval = float(self.params.interval or default_interval)
        self._failing: set[str] = set()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> DcgmDataSource:
        if isinstance(handle, EppHandle):
            return cls(name, params, handle.settings.scraper.interval)
        return cls(name, params)

    def url(self, view: EndpointView) -> str:
        """Where ``view``'s exporter answers ("" when on a node whose address is unknown)."""
        address = view.endpoint.host_ip if self.params.use_node_address else view.endpoint.address
        if not address:
            return ""
        host = f"[{address}]" if ":" in address else address
        return f"{self.params.scheme}://{host}:{self.params.port}{self.params.path}"

    async def poll_once(self, datastore: Datastore, session: aiohttp.ClientSession) -> None:
        """Scrape every endpoint once."""
        await asyncio.gather(*(self._poll(view, session) for view in datastore.views()))

    async def _poll(self, view: EndpointView, session: aiohttp.ClientSession) -> None:
        url = self.url(view)
        try:
            if not url:
                raise ValueError("useNodeAddress: the endpoint's node address (status.hostIP) "
                                 "is unknown")
            async with session.get(url) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await resp.content.read(MAX_PAGE_BYTES + 1)
                if len(body) > MAX_PAGE_BYTES:
                    raise ValueError(f"page over {MAX_PAGE_BYTES} bytes")
            text = body.decode(errors="replace")
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            if view.key not in self._failing:
                self._failing.add(view.key)
                log.warning("cannot scrape the DCGM exporter", endpoint=view.key,
                            url=url, error=str(e) or type(e).__name__)
            return
        self._failing.discard(view.key)
        now = asyncio.get_running_loop().time()
        for extractor in self.extractors:
            extractor.extract(text, view, now)

    async def run(self, datastore: Datastore) -> None:
        p = self.params
        timeout = aiohttp.ClientTimeout(total=2.0)
        connector = aiohttp.TCPConnector(limit=0, ssl=client_ssl(
            p.scheme, p.insecure_skip_verify, p.ca_cert_path, p.client_cert_path,
            p.client_key_path))
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                with contextlib.suppress(Exception):
                    await self.poll_once(datastore, session)
                await asyncio.sleep(self.interval)


class DcgmExtractor(Plugin, Extractor):
    """GPUUtilization(e) = max over the page's ``DCGM_FI_DEV_GPU_UTIL`` samples whose ``pod``
    label is e's pod (samples without a ``pod`` label count too) / 100, in [0, 1]; no sample:
    no attribute."""

    type_name = "dcgm-extractor"
    input_type = DCGM_TEXT

    @property
    def key(self) -> str:
        """The attribute this instance publishes (upstream's key string)."""
        return f"GPUUtilization/{self.name}"

    def extract(self, data: Any, view: EndpointView, now: float) -> None:
        samples = scan(str(data), (GPU_UTIL_FAMILY,)).families.get(GPU_UTIL_FAMILY, ())
        pod = view.endpoint.pod_name
        mine = [s.value for s in samples
                if "pod" not in s.labels or not pod or s.labels["pod"] == pod]
        values = {self.key: min(1.0, max(0.0, max(mine) / 100.0))} if mine else {}
        publish_scalars(view, self.name, values)


__all__ = ["DcgmDataSource", "DcgmExtractor", "DcgmSourceParameters"]
