"""The pool as the Kubernetes API describes it: the EPP's production source.

:class:`KubernetesSource` watches, in the pool's namespace:

- the InferencePools of ``--pool-group`` (``inference.networking.k8s.io`` → ``v1``;
  ``inference.networking.x-k8s.io`` → legacy ``v1alpha2``);
- the Pods (all of the namespace, as upstream's cache does; the pool's selector is applied
  when the snapshot is built, so a selector edit needs no new watch);
- InferenceObjectives and InferenceModelRewrites in ``llm-d.ai/v1alpha2`` and in their
  deprecated group ``inference.networking.x-k8s.io/v1alpha2``, and legacy InferenceModels (their
  CRDs may be absent: a 404 counts as "none"). When the API server serves a kind in both
  groups, only ``llm-d.ai`` is read and the deprecated group's objects of that kind are ignored
  (llm-d-router v0.10 does the same; it is decided again whenever a CRD appears or goes).

Each resource has a :class:`~shared.reflector.Reflector` thread doing list+watch; its
changes are marshalled onto the EPP's event loop with ``loop.call_soon_threadsafe``, parsed
with :func:`epp.datastore.parse_object` (the same validation the manifests file gets) and,
once every resource has been listed, turned into a snapshot by
:func:`epp.datastore.build_snapshot` and installed with :meth:`Datastore.replace`: the
scheduler only ever sees whole snapshots. A burst of events costs one rebuild.

An object that does not validate is logged and skipped; if an earlier version of it was
valid, that version stays in use (the same "last good state" rule as the manifests file).

Standalone mode (``--endpoint-selector`` + ``--endpoint-target-ports``): no InferencePool and
no CRDs; pods matching the selector form a synthesised pool.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

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
from epp.datastore.objects import GROUP_LLMD, GROUP_V1, GROUP_X
from epp.sources.standalone import STANDALONE_POOL_NAME as STANDALONE_POOL_NAME
from epp.sources.standalone import parse_endpoint_selector as parse_endpoint_selector
from epp.sources.standalone import parse_target_ports as parse_target_ports
from epp.sources.standalone import standalone_pool
from shared.reflector import (
    Delete,
    Delta,
    RawObject,
    Reflector,
    Replace,
    Upsert,
    WatchTiming,
    load_api_client,
    object_key,
)

log = structlog.get_logger(__name__)

#: Reflector names of the kinds in both groups: (llm-d.ai's, the deprecated group's).
BOTH_GROUPS: dict[str, tuple[str, str]] = {
    "InferenceObjective": ("llm-d.ai/inferenceobjectives", "inferenceobjectives"),
    "InferenceModelRewrite": ("llm-d.ai/inferencemodelrewrites", "inferencemodelrewrites"),
}

#: Seconds a stopping source waits for its watch threads (a blocked read is interrupted;
#: a list in flight ends with the API server's answer).
JOIN_TIMEOUT = 2.0


def pool_version(pool_group: str) -> str:
    """The served InferencePool version of ``--pool-group``."""
    if pool_group == GROUP_V1:
        return "v1"
    if pool_group == GROUP_X:
        return "v1alpha2"
    raise ValueError(f"--pool-group must be {GROUP_V1} or {GROUP_X}, got {pool_group!r}")


class KubernetesSource:
    """Feeds a :class:`Datastore` from the Kubernetes API (see the module docstring).

    Use ``await source.run()`` as a background task (it stops the watches when cancelled),
    or :meth:`start` / :meth:`stop` from code already on ``loop``. Health: the datastore's
    ``synced`` event is set by the first snapshot, i.e. once every resource has been listed
    and the pool was found.
    """

    def __init__(
        self,
        datastore: Datastore,
        pool_name: str | None,
        pool_namespace: str,
        pool_group: str = GROUP_V1,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        api_client: Any = None,
        endpoint_selector: str | None = None,
        target_ports: str | Sequence[int] | None = None,
        timing: WatchTiming | None = None,
    ) -> None:
        self.datastore = datastore
        self.pool_namespace = pool_namespace
        self.timing = timing or WatchTiming()
        self._loop = loop
        self._api_client = api_client
        self._standalone_pool: Pool | None = None
        if endpoint_selector is not None or target_ports is not None:
            if not endpoint_selector or not target_ports:
                raise ValueError(
                    "--endpoint-selector and --endpoint-target-ports go together"
                )
            self._standalone_pool = standalone_pool(
                endpoint_selector, target_ports, pool_name=pool_name, namespace=pool_namespace)
            self.pool_name: str | None = self._standalone_pool.name
            self.pool_group = GROUP_V1
            self._endpoint_selector: str | None = ",".join(
                f"{k}={v}" for k, v in self._standalone_pool.selector.items())
        else:
            self.pool_name = pool_name
            self.pool_group = pool_group
            self._endpoint_selector = None
            pool_version(pool_group)  # reject a bad group before anything starts
        #: Parsed objects by resource name, then (namespace, name); only touched on the loop.
        self._objects: dict[str, dict[tuple[str, str], PoolObject]] = {}
        self._listed: set[str] = set()
        self._reflectors: list[Reflector] = []
        self._rebuild_pending = False
        self._waiting_logged = False
        self._both_logged: set[str] = set()
        self._deprecation_logged: set[str] = set()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def standalone(self) -> bool:
        """True in ``--endpoint-selector`` mode (no InferencePool, no CRDs)."""
        return self._standalone_pool is not None

    @property
    def synced(self) -> bool:
        """Every resource has been listed and a snapshot installed."""
        return self.datastore.is_synced

    def start(self) -> None:
        """Start the watches (call on the event loop, or pass ``loop`` to the constructor)."""
        if self._reflectors:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._api_client is None:
            self._api_client = load_api_client()
        self._reflectors = self._make_reflectors()
        for r in self._reflectors:
            self._objects.setdefault(r.name, {})
            r.start()
        log.info("watching Kubernetes", namespace=self.pool_namespace, pool=self.pool_name,
                 resources=[r.name for r in self._reflectors], standalone=self.standalone)

    def stop(self) -> None:
        """Stop every watch (returns at once; the threads end on their own)."""
        for r in self._reflectors:
            r.stop()

    async def run(self) -> None:
        """Start, then keep running until cancelled; stops the watches on the way out and
        waits (briefly) for their threads, so none hands the loop a delta while it closes."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.stop()
            await asyncio.to_thread(self.join, JOIN_TIMEOUT)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the reflector threads to end."""
        deadline = time.monotonic() + timeout
        for r in self._reflectors:
            r.join(max(0.0, deadline - time.monotonic()))

    # -- wiring ---------------------------------------------------------------------------

    def _make_reflectors(self) -> list[Reflector]:
        from kubernetes import client

        core = client.CoreV1Api(self._api_client)
        custom = client.CustomObjectsApi(self._api_client)
        ns = self.pool_namespace

        def reflector(name: str, func: Callable[..., Any], *, optional: bool = False,
                      label_selector: str | None = None) -> Reflector:
            # An RBAC written for GIE v1.5 has no llm-d.ai rule: then its 403 means "not
            # installed", and the deprecated group is read as before.
            return Reflector(name, func, self._handler(name), optional=optional,
                             forbidden_is_absent=name.startswith(GROUP_LLMD + "/"),
                             label_selector=label_selector, timing=self.timing)

        def crd(group: str, version: str, plural: str) -> Callable[..., Any]:
            return functools.partial(custom.list_namespaced_custom_object, group, version, ns,
                                     plural)

        pods = reflector("pods", functools.partial(core.list_namespaced_pod, ns),
                         label_selector=self._endpoint_selector)
        if self.standalone:
            return [pods]
        return [
            reflector("inferencepools",
                      crd(self.pool_group, pool_version(self.pool_group), "inferencepools")),
            pods,
            reflector("llm-d.ai/inferenceobjectives",
                      crd(GROUP_LLMD, "v1alpha2", "inferenceobjectives"), optional=True),
            reflector("llm-d.ai/inferencemodelrewrites",
                      crd(GROUP_LLMD, "v1alpha2", "inferencemodelrewrites"), optional=True),
            reflector("inferenceobjectives", crd(GROUP_X, "v1alpha2", "inferenceobjectives"),
                      optional=True),
            reflector("inferencemodelrewrites",
                      crd(GROUP_X, "v1alpha2", "inferencemodelrewrites"), optional=True),
            reflector("inferencemodels", crd(GROUP_X, "v1alpha2", "inferencemodels"),
                      optional=True),
        ]

    def _handler(self, resource: str) -> Callable[[Delta], None]:
        """The reflector's handler: hop from its thread onto the event loop."""

        def handle(delta: Delta) -> None:
            loop = self._loop
            assert loop is not None
            try:
                loop.call_soon_threadsafe(self._apply, resource, delta)
            except RuntimeError:  # the loop is closed: the EPP is shutting down
                for r in self._reflectors:
                    r.stop()

        return handle

    # -- on the event loop ----------------------------------------------------------------

    def _apply(self, resource: str, delta: Delta) -> None:
        store = self._objects.setdefault(resource, {})
        if isinstance(delta, Replace):
            fresh: dict[tuple[str, str], PoolObject] = {}
            for raw in delta.items:
                self._parse_into(fresh, raw, previous=store)
            self._objects[resource] = fresh
            self._listed.add(resource)
        elif isinstance(delta, Upsert):
            self._parse_into(store, delta.obj, previous=store)
        elif isinstance(delta, Delete):
            store.pop(object_key(delta.obj), None)
        if not self._rebuild_pending:
            # Deltas already queued run first, so a burst of events costs one rebuild.
            self._rebuild_pending = True
            asyncio.get_running_loop().call_soon(self._rebuild)

    def _parse_into(self, into: dict[tuple[str, str], PoolObject], raw: RawObject, *,
                    previous: dict[tuple[str, str], PoolObject]) -> None:
        key = object_key(raw)
        try:
            obj = parse_object(raw)
        except ObjectError as e:
            kept = previous.get(key)
            log.warning("invalid object skipped" + ("; keeping its last valid version"
                                                    if kept else ""),
                        object=e.obj, namespace=key[0], field=e.field, error=e.message)
            if kept is not None:
                into[key] = kept
            return
        if obj is not None:
            into[key] = obj

    def _all_objects(self) -> Iterable[PoolObject]:
        if self._standalone_pool is not None:
            yield self._standalone_pool
        ignored = self._ignored_legacy()
        for resource, store in self._objects.items():
            if resource not in ignored:
                yield from store.values()
                self._warn_deprecated(resource, store)

    def _warn_deprecated(self, resource: str, store: dict[tuple[str, str], PoolObject]) -> None:
        """Once per kind: objects are read from the deprecated group (as upstream warns)."""
        for kind, (_, legacy) in BOTH_GROUPS.items():
            if resource == legacy and store and kind not in self._deprecation_logged:
                self._deprecation_logged.add(kind)
                log.warning(f"{GROUP_X}/v1alpha2 {kind} is deprecated: use {GROUP_LLMD}/v1alpha2 "
                            "(install its CRD and move the objects)", kind=kind,
                            objects=len(store))

    def _ignored_legacy(self) -> set[str]:
        """The deprecated-group resources not read because llm-d.ai serves their kind."""
        served = {r.name: r.served for r in self._reflectors}
        ignored = set()
        for kind, (current, legacy) in BOTH_GROUPS.items():
            if served.get(current) and served.get(legacy):
                ignored.add(legacy)
                if kind not in self._both_logged:
                    self._both_logged.add(kind)
                    log.warning(f"both {GROUP_X} and {GROUP_LLMD} {kind} CRDs are installed: "
                                f"only {GROUP_LLMD} is read, {GROUP_X} objects are ignored",
                                kind=kind, ignored=len(self._objects.get(legacy, {})))
            else:
                self._both_logged.discard(kind)
            if served.get(current) is False:  # gone (or forbidden) since it was listed
                ignored.add(current)
        return ignored

    def _rebuild(self) -> None:
        self._rebuild_pending = False
        if any(r.name not in self._listed for r in self._reflectors):
            return  # serve nothing until every resource has been listed once
        try:
            snapshot = build_snapshot(self._all_objects(), pool_name=self.pool_name,
                                      pool_namespace=self.pool_namespace)
        except SnapshotError as e:
            if self.datastore.is_synced:
                # The pool went away: serve no endpoints rather than a stale pool.
                log.warning("pool no longer servable; serving no endpoints", error=str(e))
                self.datastore.replace(Snapshot())
            elif not self._waiting_logged:
                self._waiting_logged = True
                log.warning("waiting for the InferencePool", error=str(e),
                            namespace=self.pool_namespace, pool=self.pool_name)
            return
        first = not self.datastore.is_synced
        self.datastore.replace(snapshot)
        if first:
            log.info("synced", pool=self.pool_name, endpoints=len(snapshot.endpoints))
