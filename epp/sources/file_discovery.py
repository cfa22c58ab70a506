"""``file-discovery`` (llm-d v0.10, ``dataLayer.discovery``): the pool's endpoints listed in
a YAML or JSON file, so the EPP runs without Kubernetes (bare metal, Slurm, a laptop)::

    endpoints:
    - name: vllm-0            # required, unique in the file
      namespace: default      # optional
      address: 10.0.0.1       # required, an IPv4 address
      port: "8000"            # required, 1-65535 (string or number)
      labels: {llm-d.ai/role: decode}   # optional

Each entry is one endpoint (no pool selector, no target ports: the file is the pool). As
upstream: an entry that does not validate is logged and skipped; a file that cannot be read
or parsed, or is over 1 MiB, stops the start (and, on a reload, keeps the last good state);
with ``watchFile`` the file is re-read when it changes and endpoints gone from it leave the
pool. The pool is named ``--pool-name`` (default ``file-discovery``) in ``--pool-namespace``.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
import yaml

from epp.datastore import Datastore, Endpoint, ObjectRef, Pool, Snapshot
from epp.datastore.models import EngineType
from epp.datastore.objects import POOL_V1
from epp.scheduling.plugin import Plugin

log = structlog.get_logger(__name__)

#: Largest endpoints file read (upstream's limit).
MAX_FILE_BYTES: Final = 1 << 20
DEFAULT_POOL_NAME: Final = "file-discovery"
ENGINE_TYPE_LABEL: Final = "inference.networking.k8s.io/engine-type"


class DiscoveryError(ValueError):
    """The endpoints file cannot be used; the message names the file (and entry)."""


@dataclass(frozen=True, slots=True)
class FileDiscoveryParameters:
    """``path`` (required): the endpoints file. ``watchFile``: re-read it on change."""

    path: str = ""
    watch_file: bool = False

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path: the endpoints file is required")


def _entry(raw: Any, where: str, namespace: str) -> Endpoint:
    if not isinstance(raw, Mapping):
        raise DiscoveryError(f"{where}: must be a mapping")
    unknown = set(raw) - {"name", "namespace", "address", "port", "labels"}
    if unknown:
        raise DiscoveryError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise DiscoveryError(f"{where}.name: required")
    address = raw.get("address")
    try:
        ip = ipaddress.IPv4Address(str(address))
    except ValueError:
        raise DiscoveryError(f"{where}.address: not an IPv4 address: {address!r}") from None
    port_raw = raw.get("port")
    try:
        port = int(str(port_raw))
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise DiscoveryError(f"{where}.port: must be 1-65535, got {port_raw!r}")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise DiscoveryError(f"{where}.labels: must be a mapping")
    labels = {str(k): str(v) for k, v in labels.items()}
    try:
        engine = EngineType(labels.get(ENGINE_TYPE_LABEL, EngineType.VLLM.value))
    except ValueError:
        engine = EngineType.VLLM
    return Endpoint(name=name, pod_name=name, namespace=str(raw.get("namespace") or namespace),
                    address=str(ip), port=port, rank=0, labels=labels, engine=engine)


def parse_endpoints(text: bytes, source: str, namespace: str) -> tuple[Endpoint, ...]:
    """The valid entries of an endpoints file (bad entries logged and skipped)."""
    if len(text) > MAX_FILE_BYTES:
        raise DiscoveryError(f"{source}: larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DiscoveryError(f"{source}: not valid YAML/JSON: {' '.join(str(e).split())}"
                             ) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping) or set(doc) - {"endpoints"}:
        raise DiscoveryError(f"{source}: must be a mapping with one key, endpoints")
    entries = doc.get("endpoints") or []
    if not isinstance(entries, list):
        raise DiscoveryError(f"{source}: endpoints: must be a list")
    out: dict[str, Endpoint] = {}
    for i, raw in enumerate(entries):
        where = f"{source}: endpoints[{i}]"
        try:
            ep = _entry(raw, where, namespace)
        except DiscoveryError as e:
            log.warning("skipping an invalid endpoint entry", error=str(e))
            continue
        if ep.name in out:
            log.warning("skipping a duplicate endpoint name", where=where, name=ep.name)
            continue
        out[ep.name] = ep
    return tuple(out.values())


class FileDiscovery(Plugin):
    """Keeps the datastore's pool equal to the endpoints file (see the module docstring).
    Named by ``dataLayer.discovery.pluginRef``; the EPP then reads neither the Kubernetes
    API nor ``--manifests``."""

    type_name = "file-discovery"
    parameters_type = FileDiscoveryParameters
    params: FileDiscoveryParameters
    #: How often a watched file is checked (content hash, so a rename or symlink swap is
    #: seen as well as an in-place write).
    poll_interval: float = 0.5

    def bind(self, datastore: Datastore, *, pool_name: str | None, namespace: str) -> None:
        """Which datastore to feed and the pool's name (from the flags)."""
        self.datastore = datastore
        self.pool = Pool(ref=ObjectRef("InferencePool", namespace,
                                       pool_name or DEFAULT_POOL_NAME),
                         api_version=POOL_V1, selector={}, target_ports=())
        self._digest: bytes | None = None

    def _read(self) -> bytes:
        path = Path(self.params.path)
        try:
            return path.read_bytes()
        except OSError as e:
            raise DiscoveryError(f"{path}: cannot read: {e.strerror or e}") from None

    def load(self) -> Snapshot:
        """Read the file now and install the pool (startup: errors raise)."""
        text = self._read()
        endpoints = parse_endpoints(text, self.params.path, self.pool.namespace)
        self._digest = hashlib.blake2b(text, digest_size=16).digest()
        snapshot = Snapshot(pool=self.pool, endpoints=endpoints)
        self.datastore.replace(snapshot)
        log.info("file discovery loaded", path=self.params.path, endpoints=len(endpoints))
        return snapshot

    def reload_if_changed(self) -> bool:
        """Re-read when the content changed; a bad file keeps the last good pool."""
        try:
            text = self._read()
        except DiscoveryError as e:
            log.warning("endpoints file unreadable; keeping the last good state", error=str(e))
            return False
        digest = hashlib.blake2b(text, digest_size=16).digest()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            endpoints = parse_endpoints(text, self.params.path, self.pool.namespace)
        except DiscoveryError as e:
            log.warning("endpoints file changed but is invalid; keeping the last good state",
                        error=str(e))
            return False
        self.datastore.replace(Snapshot(pool=self.pool, endpoints=endpoints))
        log.info("file discovery reloaded", path=self.params.path, endpoints=len(endpoints))
        return True

    async def run(self) -> None:
        """With ``watchFile``: follow the file until cancelled; else nothing to do."""
        if not self.params.watch_file:
            await asyncio.Event().wait()
        while True:
            await asyncio.sleep(self.poll_interval)
            self.reload_if_changed()
