"""``k8s-notification-source``: add / update / delete events of one Kubernetes kind in the
pool's namespace, for extractor plugins (as upstream's source of the same name)::

    plugins:
    - type: k8s-notification-source
      parameters: {group: "", version: v1, kind: ConfigMap}
    - type: my-configmap-extractor          # a NotificationExtractor plugin
    dataLayer:
      sources:
      - pluginRef: k8s-notification-source
        extractors: [{pluginRef: my-configmap-extractor}]

The kind's resource name is guessed as Kubernetes' own ``UnsafeGuessKindToResource`` does
(``ConfigMap`` → ``configmaps``, ``Policy`` → ``policies``; no discovery call), and the
objects are listed and watched by :class:`shared.reflector.Reflector` (resume, 410 re-list,
backoff). It needs the Kubernetes API: with ``--manifests`` the EPP refuses to start.
"""

from __future__ import annotations

import asyncio
import functools
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from epp.datalayer.endpoint_events import EventKind
from epp.datalayer.plugin import DataSource, Extractor
from epp.datastore import Datastore, EndpointView
from epp.scheduling.plugin import Plugin
from shared.plugins import snake
from shared.reflector import Delete, Delta, Reflector, Replace, Upsert, object_key

log = structlog.get_logger(__name__)

K8S_NOTIFICATIONS = "k8s-notifications"


def guess_resource(kind: str) -> str:
    """Kubernetes' guess of a kind's plural resource name."""
    lower = kind.lower()
    if lower == "endpoints":
        return lower
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


@dataclass(frozen=True, slots=True)
class NotificationEvent:
    """One change of a watched object (its raw dict, as the API server sent it)."""

    kind: EventKind
    object: Mapping[str, Any]


class NotificationExtractor(Extractor):
    """Receives every :class:`NotificationEvent` of its source, in order."""

    input_type = K8S_NOTIFICATIONS

    @abstractmethod
    def on_notification(self, event: NotificationEvent) -> None:
        """Called on the event loop; keep it short."""

    def extract(self, data: Any, view: EndpointView, now: float) -> None:
        self.on_notification(data)


@dataclass(frozen=True, slots=True)
class NotificationSourceParameters:
    """Upstream's ``group`` (``""`` for the core group), ``version``, ``kind``."""

    group: str = ""
    version: str = ""
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.version or not self.kind:
            raise ValueError("version and kind must be given")


class K8sNotificationSource(Plugin, DataSource):
    """Lists, then watches the kind in the pool's namespace; the first list arrives as
    ``added`` events, a re-list as the differences to what was known. An extractor that
    raises is logged and the others still run."""

    type_name = "k8s-notification-source"
    parameters_type = NotificationSourceParameters
    output_type = K8S_NOTIFICATIONS
    params: NotificationSourceParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        Plugin.__init__(self, name, params)
        DataSource.__init__(self)
        self._known: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._list_func: Callable[..., Any] | None = None
        self.reflector: Reflector | None = None

    @property
    def resource(self) -> str:
        return guess_resource(self.params.kind)

    def connect(self, api_client: Any, namespace: str, **reflector_options: Any) -> None:
        """Where to watch (the EPP calls this in Kubernetes mode before :meth:`run`)."""
        from kubernetes import client

        p = self.params
        if p.group:
            self._list_func = functools.partial(
                client.CustomObjectsApi(api_client).list_namespaced_custom_object,
                p.group, p.version, namespace, self.resource)
        else:
            core = client.CoreV1Api(api_client)
            method = getattr(core, f"list_namespaced_{snake(p.kind)}", None)
            if method is None or p.version != "v1":
                raise ValueError(f"{self.name}: no namespaced core kind {p.version}/{p.kind}")
            self._list_func = functools.partial(method, namespace)
        self._options = reflector_options

    def dispatch(self, change: Delta) -> None:
        """Turn a reflector change into events for the extractors (on the event loop)."""
        events: list[NotificationEvent] = []
        if isinstance(change, Replace):
            now = {object_key(o): o for o in change.items}
            events += [NotificationEvent(EventKind.DELETED, o)
                       for k, o in self._known.items() if k not in now]
            for k, o in now.items():
                before = self._known.get(k)
                if before is None:
                    events.append(NotificationEvent(EventKind.ADDED, o))
                elif _version(before) != _version(o):
                    events.append(NotificationEvent(EventKind.UPDATED, o))
            self._known = now
        elif isinstance(change, Upsert):
            k = object_key(change.obj)
            kind = EventKind.UPDATED if k in self._known else EventKind.ADDED
            self._known[k] = change.obj
            events.append(NotificationEvent(kind, change.obj))
        elif isinstance(change, Delete):
            self._known.pop(object_key(change.obj), None)
            events.append(NotificationEvent(EventKind.DELETED, change.obj))
        stamp = time.monotonic()
        for event in events:
            for extractor in self.extractors:
                try:
                    extractor.extract(event, None, stamp)  # type: ignore[arg-type]
                except Exception:
                    log.exception("notification extractor failed", extractor=repr(extractor),
                                  event=event.kind.value)

    async def run(self, datastore: Datastore) -> None:
        if self._list_func is None:
            raise RuntimeError(f"{self.name}: not connected to the Kubernetes API")
        loop = asyncio.get_running_loop()

        def handler(change: Delta) -> None:  # on the reflector's thread
            loop.call_soon_threadsafe(self.dispatch, change)

        self.reflector = Reflector(f"{self.name}/{self.resource}", self._list_func, handler,
                                   optional=bool(self.params.group), **self._options)
        self.reflector.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.reflector.stop()


def _version(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")
