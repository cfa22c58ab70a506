"""``--manifests PATH``: the pool described by YAML files instead of the Kubernetes API.

PATH is a file or a directory (``*.yaml``, ``*.yml``, ``*.json``, read in name order), each
holding one or more YAML documents (``---``) or ``kind: List`` objects. InferencePool (v1
and v1alpha2), InferenceObjective, InferenceModelRewrite, legacy InferenceModel and Pod
objects are used; other kinds are ignored. A Pod needs ``status.podIP``; without
``status.conditions`` it counts as Ready.

With ``--endpoint-selector`` (standalone mode, :mod:`epp.sources.standalone`) the pool is the
one the flags describe: InferencePools in the files are ignored, the Pods matching the selector
are its endpoints, and objectives/rewrites whose ``poolRef`` names it (``--pool-name``, default
``standalone``) apply to it.

:meth:`ManifestSource.watch` re-reads PATH when its content changes and installs the new
snapshot; an edit that does not validate is logged and the last good state stays live.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import structlog
import yaml

from epp.datastore import (
    Datastore,
    ObjectError,
    Pool,
    PoolObject,
    Snapshot,
    SnapshotError,
    build_snapshot,
    parse_object,
)
from epp.datastore.objects import DEFAULT_NAMESPACE, object_ref

log = structlog.get_logger(__name__)

SUFFIXES: Final = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    """A manifests file that cannot be used; the message names file, object and field."""

    def __init__(self, file: str, message: str, *, obj: str = "", field: str = "") -> None:
        parts = [file]
        if obj:
            parts.append(obj)
        if field:
            parts.append(field)
        super().__init__(": ".join([*parts, message]))
        self.file = file
        self.obj = obj
        self.field = field


def manifest_files(path: Path) -> list[Path]:
    """The files PATH stands for (a directory: its YAML/JSON files in name order)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
    if path.exists():
        return [path]
    raise ManifestError(str(path), "no such file or directory")


def _documents(file: Path, text: str) -> Iterator[Mapping[str, Any]]:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        raise ManifestError(str(file), f"not valid YAML: {e}") from None
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise ManifestError(
                str(file), f"document {i + 1} must be a mapping, got {type(doc).__name__}"
            )
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            for item in doc["items"]:
                if isinstance(item, Mapping):
                    yield item
            continue
        yield doc


def parse_files(files: list[Path]) -> list[PoolObject]:
    """Every usable object in ``files``, validated; :class:`ManifestError` on the first bad
    one (and on the same object defined twice)."""
    objects: list[PoolObject] = []
    seen: dict[tuple[str, str, str], Path] = {}
    for file in files:
        try:
            text = file.read_text()
        except OSError as e:
            raise ManifestError(str(file), f"cannot read: {e.strerror}") from None
        for doc in _documents(file, text):
            try:
                obj = parse_object(doc)
            except ObjectError as e:
                raise ManifestError(str(file), e.message, obj=e.obj, field=e.field) from None
            if obj is None:
                continue
            ref = object_ref(doc)
            ident = (ref.kind, ref.namespace or DEFAULT_NAMESPACE, ref.name)
            if ident in seen:
                raise ManifestError(
                    str(file), f"defined twice (also in {seen[ident]})", obj=str(ref)
                )
            seen[ident] = file
            objects.append(obj)
    return objects


def load_snapshot(path: str | Path, *, pool_name: str | None, pool_namespace: str,
                  standalone: Pool | None = None) -> Snapshot:
    """Read PATH and build the pool's snapshot; :class:`ManifestError` when it can't.

    ``standalone``: the pool ``--endpoint-selector`` synthesised, used instead of any
    InferencePool in the files."""
    p = Path(path)
    objects = parse_files(manifest_files(p))
    if standalone is not None:
        objects = [standalone, *(o for o in objects if not isinstance(o, Pool))]
        pool_name, pool_namespace = standalone.name, standalone.namespace
    try:
        return build_snapshot(objects, pool_name=pool_name, pool_namespace=pool_namespace)
    except SnapshotError as e:
        raise ManifestError(str(p), str(e)) from None


class ManifestSource:
    """Feeds a :class:`Datastore` from a manifests file or directory."""

    def __init__(
        self,
        path: str | Path,
        datastore: Datastore,
        *,
        pool_name: str | None = None,
        pool_namespace: str = DEFAULT_NAMESPACE,
        poll_interval: float = 0.5,
        standalone: Pool | None = None,
    ) -> None:
        self.path = Path(path)
        self.standalone = standalone
        self.datastore = datastore
        self.pool_name = pool_name
        self.pool_namespace = pool_namespace
        self.poll_interval = poll_interval
        self._fingerprint: bytes | None = None

    def _content_fingerprint(self) -> bytes:
        # Hashing the content (not mtimes) catches edits within one mtime tick and ignores
        # touches; manifests are small, so reading them twice a second costs nothing.
        h = hashlib.blake2b(digest_size=16)
        try:
            for f in manifest_files(self.path):
                h.update(str(f).encode() + b"\0")
                h.update(f.read_bytes())
                h.update(b"\0")
        except (ManifestError, OSError) as e:
            h.update(f"error {e}".encode())
        return h.digest()

    def load(self) -> Snapshot:
        """Read now and install the snapshot; raises :class:`ManifestError` (startup path)."""
        fingerprint = self._content_fingerprint()
        snapshot = load_snapshot(
            self.path, pool_name=self.pool_name, pool_namespace=self.pool_namespace,
            standalone=self.standalone)
        self._fingerprint = fingerprint
        self.datastore.replace(snapshot)
        return snapshot

    def reload_if_changed(self) -> bool:
        """Re-read when the content changed; True when a new snapshot was installed.

        A change that does not validate keeps the current snapshot and logs why.
        """
        fingerprint = self._content_fingerprint()
        if fingerprint == self._fingerprint:
            return False
        self._fingerprint = fingerprint
        try:
            snapshot = load_snapshot(
                self.path, pool_name=self.pool_name, pool_namespace=self.pool_namespace,
                standalone=self.standalone)
        except ManifestError as e:
            log.warning("manifests changed but are invalid; keeping the last good state",
                        path=str(self.path), error=str(e))
            return False
        self.datastore.replace(snapshot)
        log.info("manifests reloaded", path=str(self.path), endpoints=len(snapshot.endpoints))
        return True

    async def run(self) -> None:
        """Poll for changes forever (cancel the task to stop)."""
        if self._fingerprint is None:
            self.reload_if_changed()
        while True:
            await asyncio.sleep(self.poll_interval)
            # File reads are small and local; doing them on the loop keeps this simple.
            self.reload_if_changed()
