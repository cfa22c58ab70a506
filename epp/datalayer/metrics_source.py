"""``metrics-data-source``: polls every endpoint's Prometheus ``/metrics`` over HTTP(S)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from epp.datalayer.plugin import DataSource
from epp.datastore import Datastore, EndpointView
from epp.handle import EppHandle
from epp.metrics.dialects import MetricsError, ParsedMetrics
from epp.metrics.scraper import Scraper, ScraperConfig
from epp.scheduling.plugin import Plugin
from shared.plugins import Duration, Handle

PROMETHEUS_TEXT = "prometheus-text"


@dataclass(frozen=True, slots=True)
class MetricsSourceParameters:
    """Upstream's ``scheme``, ``path``, ``insecureSkipVerify``; ``refreshInterval`` and
    ``port`` are ours. Unset ones come from the flags (``--model-server-metrics-scheme``,
    ``--model-server-metrics-path``, ``--model-server-metrics-https-insecure-skip-verify``,
    ``--refresh-metrics-interval``, ``--model-server-metrics-port``; defaults http,
    /metrics, true, 50ms, the target port); set ones win. ``interval`` is llm-d v0.10's name
    of ``refreshInterval``."""

    ALIASES: ClassVar[dict[str, str]] = {"interval": "refresh_interval"}

    scheme: Literal["http", "https"] | None = None
    path: str | None = None
    insecure_skip_verify: bool | None = None
    refresh_interval: Duration | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError(f"path: must start with '/', got {self.path!r}")
        if self.refresh_interval is not None and self.refresh_interval <= 0:
            raise ValueError("refreshInterval: must be > 0")


class MetricsDataSource(Plugin, DataSource):
    """One scrape loop per endpoint (see :mod:`epp.metrics.scraper`); the page goes to the
    extractors, the first one's metrics are installed on the endpoint."""

    type_name = "metrics-data-source"
    parameters_type = MetricsSourceParameters
    output_type = PROMETHEUS_TEXT
    params: MetricsSourceParameters

    def __init__(self, name: str = "", params: Any = None,
                 defaults: ScraperConfig | None = None) -> None:
        Plugin.__init__(self, name, params)
        DataSource.__init__(self)
        p, d = self.params, defaults or ScraperConfig()
        self.config = replace(
            d, scheme=p.scheme if p.scheme is not None else d.scheme,
            insecure_skip_verify=(p.insecure_skip_verify if p.insecure_skip_verify is not None
                                  else d.insecure_skip_verify),
            path=p.path if p.path is not None else d.path,
            interval=p.refresh_interval if p.refresh_interval is not None else d.interval,
            port=p.port if p.port is not None else d.port)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> MetricsDataSource:
        defaults = handle.settings.scraper if isinstance(handle, EppHandle) else None
        return cls(name, params, defaults)

    def scraper(self, datastore: Datastore) -> Scraper:
        """A scraper reading pages through this source's extractors."""
        return Scraper(datastore, self.config, self._extract)

    def _extract(self, text: str, view: EndpointView, now: float) -> ParsedMetrics:
        """Core metrics go to the endpoint's ``metrics`` (the scraper installs them); any
        other attribute lands in ``view.attributes`` under its class."""
        core: ParsedMetrics | None = None
        for extractor in self.extractors:
            made = extractor.extract(text, view, now)
            if isinstance(made, ParsedMetrics):
                core = core or made
            elif made is not None:
                view.attributes[type(made)] = made
        if core is None:
            raise MetricsError("no core-metrics extractor reads this page")
        return core

    async def run(self, datastore: Datastore) -> None:
        async with self.scraper(datastore):
            await asyncio.Event().wait()
