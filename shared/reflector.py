"""List+watch of one Kubernetes resource in a thread: the part of a source that talks to the
API server, kept apart from what is done with the objects (as kopf and client-go do).

A :class:`Reflector` lists, then watches from the list's ``resourceVersion`` and hands every
change to its ``handler`` as a :class:`Replace` (a full list), :class:`Upsert` or
:class:`Delete` of raw object dicts (camelCase, exactly as the API server sent them), in order,
on the reflector's thread. It owns the watch protocol:

- watches ask for ``allowWatchBookmarks`` so an idle watch's resume point stays fresh;
- a dropped connection resumes from the last ``resourceVersion`` seen (no re-list);
- 410 Gone (the resume point was compacted away) re-lists at once;
- other failures (403, 5xx, refused connections) are logged and retried with capped,
  jittered exponential backoff;
- every ``resync_period`` the resource is re-listed in full to heal any drift;
- an ``optional`` resource whose CRD is not installed (404) counts as empty and synced.

Why threads and the sync ``kubernetes`` client rather than ``kubernetes-asyncio``: a source
has a handful of long-lived streams, so a thread each costs nothing; the official client is
the one users already configure and debug; and JSON decoding of big lists stays off the
event loop that serves requests. Consumers marshal changes onto their loop themselves.

This module imports nothing from ``epp`` or ``bbr``: both services' Kubernetes sources use it.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

# The kubernetes client is imported where a reflector runs, not here: it costs ~0.35 s of CPU
# per process start, and every epp/bbr process imports this module whether or not it talks
# to an API server (--manifests, --base-models, tests).

log = structlog.get_logger(__name__)

RawObject = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Replace:
    """The resource's complete current state (after a list)."""

    items: tuple[RawObject, ...]


@dataclass(frozen=True, slots=True)
class Upsert:
    """One object was added or changed."""

    obj: RawObject


@dataclass(frozen=True, slots=True)
class Delete:
    """One object was deleted (or stopped matching the label selector)."""

    obj: RawObject


Delta = Replace | Upsert | Delete
#: Receives every change, in order, on the reflector's thread.
Handler = Callable[[Delta], None]
#: A ``kubernetes`` client list function with its path arguments bound (namespace, plural...).
ListFunc = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class WatchTiming:
    """Timings of the list/watch loop (defaults follow client-go's reflector)."""

    #: First retry delay after a failure; doubles up to ``backoff_max`` (with ±25 % jitter).
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    #: Each watch asks the server to end it after a random time in [min, 2·min] seconds, so
    #: many clients do not reconnect in step.
    min_watch_timeout: float = 300.0
    #: Full re-list period; 0 disables (watches alone keep the state current).
    resync_period: float = 1800.0
    #: Connect timeout of every request; reads wait up to the watch timeout plus this.
    connect_timeout: float = 10.0


class Gone(Exception):
    """The watch's resourceVersion has been compacted away: the resource must be re-listed."""


class Backoff:
    """Capped exponential backoff with jitter."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay * random.uniform(0.75, 1.25)

    def reset(self) -> None:
        self._next = self.initial


def object_key(obj: RawObject) -> tuple[str, str]:
    """``(namespace, name)`` of a raw object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _resource_version(obj: RawObject) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


class Reflector:
    """Keeps one resource's objects flowing into ``handler`` until :meth:`stop`."""

    def __init__(
        self,
        name: str,
        list_func: ListFunc,
        handler: Handler,
        *,
        label_selector: str | None = None,
        optional: bool = False,
        forbidden_is_absent: bool = False,
        timing: WatchTiming | None = None,
    ) -> None:
        self.name = name
        #: An optional resource whose 403 counts as a 404 (logged): for a group that an
        #: older RBAC has no rule for, so that such a deployment keeps working without it.
        self.forbidden_is_absent = forbidden_is_absent and optional
        self.list_func = list_func
        self.handler = handler
        self.label_selector = label_selector
        self.optional = optional
        self.timing = timing or WatchTiming()
        #: Set after the first successful list (or a 404 of an optional resource).
        self.synced = threading.Event()
        #: Whether the API server serves the resource: True after a list, False after a 404
        #: of an optional resource (its CRD is not installed), None before either.
        self.served: bool | None = None
        #: The resume point: the newest resourceVersion seen (list, event or bookmark).
        self.resource_version: str | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{name}", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop soon: interrupts a blocked watch read; does not wait for the thread."""
        self._stop.set()
        with self._lock:
            resp = self._response
        if resp is not None:
            # Unblocks a read in progress on the reflector's thread; best effort, as the
            # thread is a daemon anyway.
            with contextlib.suppress(Exception):
                resp.shutdown()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = Backoff(self.timing.backoff_initial, self.timing.backoff_max)
        next_resync = 0.0
        while not self._stop.is_set():
            try:
                if self.resource_version is None or (
                    self.timing.resync_period > 0 and time.monotonic() >= next_resync
                ):
                    self._list()
                    next_resync = time.monotonic() + self.timing.resync_period
                    backoff.reset()
                if self._watch(next_resync):
                    backoff.reset()
                    continue
            except Gone:
                log.info("watch resourceVersion expired; re-listing", resource=self.name)
                self.resource_version = None
                continue
            except ApiException as e:
                if self._stop.is_set():
                    return
                self._api_error(e)
            except Exception as e:
                if self._stop.is_set():
                    return
                log.warning("watch connection failed; reconnecting", resource=self.name,
                            error=f"{type(e).__name__}: {e}")
            self._stop.wait(backoff.next())

    def _api_error(self, e: ApiException) -> None:
        message = _status_message(e)
        if e.status == 403 and self.forbidden_is_absent and self.served is not False:
            log.error("forbidden by RBAC: treating the resource as not installed; grant the "
                      "service account get, list and watch on it", resource=self.name,
                      status=e.status, message=message)
        if (e.status == 404 and self.optional) or (e.status == 403 and self.forbidden_is_absent):
            # The CRD is not installed (e.g. legacy InferenceModel): nothing to serve from it.
            self.served = False
            if not self.synced.is_set():
                log.info("resource not served by the API server; treating it as empty",
                         resource=self.name)
                self.handler(Replace(()))
                self.synced.set()
            return
        if e.status == 403:
            log.error(
                "forbidden by RBAC: grant the service account get, list and watch on this "
                "resource; retrying", resource=self.name, status=e.status, message=message)
            return
        if e.status == 410:  # a list at a compacted version
            self.resource_version = None
            return
        log.warning("API request failed; retrying", resource=self.name, status=e.status,
                    message=message)

    def _call(self, **kwargs: Any) -> Any:
        """Call the list function for a raw response (no model deserialization)."""
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        return self.list_func(_preload_content=False, **kwargs)

    def _list(self) -> None:
        resp = self._call(_request_timeout=(self.timing.connect_timeout, 60.0))
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        list_kind = str(body.get("kind") or "")
        kind = list_kind[:-4] if list_kind.endswith("List") else list_kind
        api_version = body.get("apiVersion")
        items: list[RawObject] = []
        for item in body.get("items") or []:
            # List items carry no kind/apiVersion; parsers need them, as in watch events.
            items.append({"kind": kind, "apiVersion": api_version, **item})
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "0")
        self.served = True
        self.handler(Replace(tuple(items)))
        if not self.synced.is_set():
            log.info("listed", resource=self.name, items=len(items))
        self.synced.set()

    def _watch(self, until: float) -> bool:
        """Watch from the resume point until the server ends the watch (or the next resync).

        True when the watch was useful (delivered events or lasted a while); False sends the
        loop through backoff, so a server that ends watches at once is not hammered. Raises
        on failure.
        """
        t = self.timing
        timeout = random.uniform(t.min_watch_timeout, 2 * t.min_watch_timeout)
        if t.resync_period > 0:
            timeout = min(timeout, max(1.0, until - time.monotonic()))
        timeout_s = max(1, int(timeout))
        resp = self._call(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=timeout_s,
            _request_timeout=(t.connect_timeout, timeout_s + t.connect_timeout),
        )
        with self._lock:
            self._response = resp
        if self._stop.is_set():  # stop() ran before the response was registered
            resp.release_conn()
            return False
        started = time.monotonic()
        delivered = False
        clean = False
        try:
            for event in self._events(resp):
                self._apply(event)
                delivered = True
            clean = True
        finally:
            with self._lock:
                self._response = None
            if not clean:
                resp.close()  # a half-read stream must not go back to the connection pool
            resp.release_conn()
        return delivered or time.monotonic() - started >= 1.0

    def _events(self, resp: Any) -> Iterator[Mapping[str, Any]]:
        from kubernetes.watch.watch import iter_resp_lines

        for line in iter_resp_lines(resp):
            if self._stop.is_set():
                return
            if line:
                yield json.loads(line)

    def _apply(self, event: Mapping[str, Any]) -> None:
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(obj.get("message", ""))
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=code, reason=f"{obj.get('reason')}: {obj.get('message')}")
        rv = _resource_version(obj)
        if etype == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if etype in ("ADDED", "MODIFIED"):
            self.handler(Upsert(obj))
        elif etype == "DELETED":
            self.handler(Delete(obj))
        else:
            log.warning("unknown watch event type", resource=self.name, type=etype)
        if rv:
            self.resource_version = rv


def _status_message(e: ApiException) -> str:
    """The ``message`` of the Status body the API server sent, else the HTTP reason."""
    try:
        body = json.loads(e.body or "")
        return str(body.get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


class KubernetesConfigError(ValueError):
    """Neither in-cluster configuration nor a kubeconfig could be loaded."""


def load_api_client() -> Any:
    """An ``ApiClient`` from the in-cluster service account, else ``KUBECONFIG``/~/.kube."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException as in_cluster:
        try:
            config.load_kube_config(client_configuration=cfg)
        except (config.ConfigException, OSError) as kubeconfig:
            raise KubernetesConfigError(
                f"no Kubernetes configuration: not in a cluster ({in_cluster}) and no usable "
                f"kubeconfig ({kubeconfig}); use --manifests to run without Kubernetes"
            ) from None
    return client.ApiClient(cfg)
