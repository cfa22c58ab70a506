"""``models-data-source`` and ``models-data-extractor`` (llm-d): each endpoint's OpenAI
``/v1/models`` listing, as an endpoint attribute.

The EPP uses it to know which base models and LoRA adapters every endpoint serves, beside
what the metrics' labels say: servers whose metrics name no model (TRT-LLM, Triton) then
still count for ``--reject-unknown-models``, and a request for a listed adapter is scheduled
as a LoRA request.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import aiohttp
import orjson
import structlog

from epp.datalayer.plugin import DataSource, Extractor
from epp.datastore import Datastore, EndpointView
from epp.scheduling.plugin import Plugin
from shared.plugins import Duration

log = structlog.get_logger(__name__)

OPENAI_MODELS = "openai-models"
#: Largest listing read (a real one is a few KB).
MAX_LISTING_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One ``data[]`` entry: ``id`` and, for an adapter, the base model it belongs to."""

    id: str
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class ServedModels:
    """The endpoint attribute: what its ``/v1/models`` listed, when."""

    entries: tuple[ModelEntry, ...]
    updated_at: float

    @property
    def base_models(self) -> frozenset[str]:
        return frozenset(e.id for e in self.entries if e.parent is None)

    @property
    def adapters(self) -> frozenset[str]:
        return frozenset(e.id for e in self.entries if e.parent is not None)


def parse_listing(body: bytes) -> tuple[ModelEntry, ...]:
    """``{"object": "list", "data": [{"id": ..., "parent": ...}]}`` → entries; ValueError
    when the body is not such a listing."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("no 'data' list")
    out = []
    for item in data:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
            parent = item.get("parent")
            out.append(ModelEntry(item["id"], parent if isinstance(parent, str) and parent
                                  else None))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ModelsSourceParameters:
    """llm-d's ``scheme``, ``path``, ``insecureSkipVerify``; ``refreshInterval`` (ours) is
    how often each endpoint is asked (listings change only when adapters load); llm-d v0.10
    calls it ``interval``."""

    ALIASES: ClassVar[dict[str, str]] = {"interval": "refresh_interval"}

    scheme: Literal["http", "https"] = "http"
    path: str = "/v1/models"
    insecure_skip_verify: bool = True
    refresh_interval: Duration = Duration(2.0)  # noqa: RUF009 (immutable)

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"path: must start with '/', got {self.path!r}")
        if self.refresh_interval <= 0:
            raise ValueError("refreshInterval: must be > 0")


class ModelsDataSource(Plugin, DataSource):
    """Every ``refreshInterval``, GET ``<scheme>://<endpoint>/<path>`` of every endpoint
    (concurrently, 2 s timeout); a parsed listing goes to the extractors. A failed request
    keeps the endpoint's previous attribute (it is logged once per endpoint)."""

    type_name = "models-data-source"
    parameters_type = ModelsSourceParameters
    output_type = OPENAI_MODELS
    params: ModelsSourceParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        Plugin.__init__(self, name, params)
        DataSource.__init__(self)
        self._failing: set[str] = set()

    def url(self, view: EndpointView) -> str:
        ep = view.endpoint
        host = f"[{ep.address}]" if ":" in ep.address else ep.address
        return f"{self.params.scheme}://{host}:{ep.port}{self.params.path}"

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.params.scheme != "https" or not self.params.insecure_skip_verify:
            return True
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    async def poll_once(self, datastore: Datastore, session: aiohttp.ClientSession) -> None:
        """Ask every endpoint once."""
        await asyncio.gather(*(self._poll(view, session) for view in datastore.views()))

    async def _poll(self, view: EndpointView, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url(view)) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await resp.content.read(MAX_LISTING_BYTES + 1)
                if len(body) > MAX_LISTING_BYTES:
                    raise ValueError(f"listing over {MAX_LISTING_BYTES} bytes")
            entries = parse_listing(body)
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            if view.key not in self._failing:
                self._failing.add(view.key)
                log.warning("cannot read the models listing", endpoint=view.key,
                            url=self.url(view), error=str(e) or type(e).__name__)
            return
        self._failing.discard(view.key)
        now = asyncio.get_running_loop().time()
        for extractor in self.extractors:
            made = extractor.extract(entries, view, now)
            if made is not None:
                view.attributes[type(made)] = made

    async def run(self, datastore: Datastore) -> None:
        timeout = aiohttp.ClientTimeout(total=2.0)
        connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl())
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                with contextlib.suppress(Exception):
                    await self.poll_once(datastore, session)
                await asyncio.sleep(self.params.refresh_interval)


class ModelsDataExtractor(Plugin, Extractor):
    """The listing → a :class:`ServedModels` attribute on the endpoint."""

    type_name = "models-data-extractor"
    input_type = OPENAI_MODELS

    def extract(self, data: Any, view: EndpointView, now: float) -> ServedModels:
        return ServedModels(tuple(data), now)
