"""An in-process fake Kubernetes API server that speaks the real list/watch HTTP protocol.

No kube-apiserver runs on these machines, so the Kubernetes sources are tested against this
server with the real ``kubernetes`` client (``Configuration(host="http://127.0.0.1:PORT")``)
left unchanged. What it implements, as the real server does:

- ``/api/v1/...`` and ``/apis/<group>/<version>/...`` paths, namespaced and across all
  namespaces: list, get, create (409 AlreadyExists), replace (409 Conflict on a stale
  ``metadata.resourceVersion``), delete;
- one global, increasing ``resourceVersion``; lists carry ``metadata.resourceVersion``; list
  items have no ``kind``/``apiVersion`` (as in a real ``PodList``);
- ``?watch=true``: a chunked stream of ``{"type", "object"}`` lines starting after the given
  ``resourceVersion``; ``allowWatchBookmarks`` BOOKMARK events; ``timeoutSeconds``; an object
  that stops (starts) matching the label selector arrives as DELETED (ADDED);
- compaction: a watch from a ``resourceVersion`` older than the last :meth:`compact` gets
  ``{"type": "ERROR", "object": Status 410}``; a list at such a version gets HTTP 410;
- label selectors (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a)``);
- RBAC-style 403 per resource when a test calls :meth:`forbid`.

Tests change state through the Python methods (:meth:`apply`, :meth:`delete`), and can cut
watches (:meth:`sever_watches` / :meth:`resume_watches`) to simulate a network partition.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource type the server knows: where it lives and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool"),
    Resource("inference.networking.x-k8s.io", "v1alpha2", "inferencepools", "InferencePool"),
    Resource("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives",
             "InferenceObjective"),
    Resource("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites",
             "InferenceModelRewrite"),
    Resource("inference.networking.x-k8s.io", "v1alpha2", "inferencemodels", "InferenceModel"),
    Resource("llm-d.ai", "v1alpha2", "inferenceobjectives", "InferenceObjective"),
    Resource("llm-d.ai", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"),
    Resource("inference.networking.x-k8s.io", "v1alpha1", "inferencepoolimports",
             "InferencePoolImport"),
)

#: Resources are keyed by (group, plural): one storage per group, as the API server has.
ResKey = tuple[str, str]


@dataclass(slots=True)
class _Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    old: dict[str, Any] | None
    new: dict[str, Any]


@dataclass(slots=True)
class _Store:
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)


# -- label selectors ------------------------------------------------------------------------

_SET_EXPR = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    """Split on commas that are not inside ``(...)``."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def selector_matches(selector: str | None, labels: Mapping[str, str]) -> bool:
    """True when ``labels`` satisfy the label selector string (empty selects everything)."""
    if not selector:
        return True
    for req in _split_selector(selector):
        req = req.strip()
        m = _SET_EXPR.match(req)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            inside = key in labels and labels[key] in values
            if inside != (op == "in"):
                return False
        elif "!=" in req:
            key, value = (s.strip() for s in req.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in req:
            key, value = (s.strip() for s in req.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` body as the API server writes it."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeApiServer:
    """A small real HTTP server with the API server's list/watch semantics (see module doc)."""

    def __init__(self, *, bookmark_interval: float = 0.2) -> None:
        self.bookmark_interval = bookmark_interval
        self._cond = threading.Condition()
        self._rv = 1000
        self._floor = 0  # watches from below this resourceVersion get 410 Gone
        self._stores: dict[ResKey, _Store] = {(r.group, r.plural): _Store() for r in RESOURCES}
        self._forbidden: set[str] = set()
        #: Resources answered with 404 (their CRD "not installed"): ``plural`` or
        #: ``plural.group``. llm-d.ai's start so, as in a cluster with GIE v1.5's CRDs only;
        #: a test installs them with :meth:`serve`.
        self._unserved: set[str] = {"inferenceobjectives.llm-d.ai",
                                    "inferencemodelrewrites.llm-d.ai"}
        self._severed = False
        self._watch_sockets: set[socket.socket] = set()
        #: Every request as ``(method, path, query)``, for assertions on what clients did.
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        #: Seconds a list waits before it is answered (a slow API server).
        self.list_delay = 0.0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True,
                                        name="fake-apiserver")
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._httpd.shutdown()
        self._kill_watch_sockets()
        self._httpd.server_close()

    # -- state changes made by tests ------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update ``obj`` (found by apiVersion/kind) and notify watchers."""
        res = self._resource_of(obj)
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", ""), meta["name"])
        with self._cond:
            store = self._stores[(res.group, res.plural)]
            old = store.objects.get(key)
            self._stamp(new, old)
            store.objects[key] = new
            store.events.append(_Event(self._rv, "MODIFIED" if old else "ADDED", old, new))
            self._cond.notify_all()
            return copy.deepcopy(new)

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> None:
        """Delete an object and notify watchers (KeyError when it does not exist)."""
        res = self._resource_of({"apiVersion": api_version, "kind": kind})
        with self._cond:
            store = self._stores[(res.group, res.plural)]
            old = store.objects.pop((namespace if res.namespaced else "", name))
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            store.events.append(_Event(self._rv, "DELETED", old, gone))
            self._cond.notify_all()

    def get(self, api_version: str, kind: str, name: str,
            namespace: str = "default") -> dict[str, Any] | None:
        """The stored object, or None."""
        res = self._resource_of({"apiVersion": api_version, "kind": kind})
        with self._cond:
            obj = self._stores[(res.group, res.plural)].objects.get(
                (namespace if res.namespaced else "", name))
            return copy.deepcopy(obj) if obj else None

    def compact(self) -> int:
        """Forget history up to now: watches (and lists) from an older resourceVersion get
        410 Gone; watches that are caught up carry on, as with etcd compaction."""
        with self._cond:
            self._floor = self._rv
            for store in self._stores.values():
                store.events.clear()
            self._cond.notify_all()
            return self._floor

    def bump(self, n: int = 1) -> None:
        """Advance the global resourceVersion (writes to resources nobody here watches)."""
        with self._cond:
            self._rv += n
            self._cond.notify_all()

    def forbid(self, plural: str, group: str | None = None) -> None:
        """Answer 403 Forbidden to every request on resource ``plural`` (of every group, or
        of ``group`` only): RBAC missing."""
        with self._cond:
            self._forbidden.add(plural if group is None else f"{plural}.{group}")

    def unserve(self, plural: str, group: str | None = None) -> None:
        """Answer 404 for resource ``plural`` (of every group, or of ``group`` only), as when
        its CRD is not installed."""
        with self._cond:
            self._unserved.add(plural if group is None else f"{plural}.{group}")

    def serve(self, plural: str, group: str | None = None) -> None:
        """Undo :meth:`unserve` (the CRD was installed)."""
        with self._cond:
            self._unserved.discard(plural if group is None else f"{plural}.{group}")

    def allow(self, plural: str) -> None:
        """Undo :meth:`forbid`."""
        with self._cond:
            self._forbidden.discard(plural)

    def sever_watches(self) -> None:
        """Cut every open watch and hold new ones until :meth:`resume_watches` (a partition)."""
        with self._cond:
            self._severed = True
            self._cond.notify_all()
        self._kill_watch_sockets()

    def drop_watches(self) -> None:
        """Cut every open watch connection; clients may reconnect at once."""
        self._kill_watch_sockets()

    def resume_watches(self) -> None:
        with self._cond:
            self._severed = False
            self._cond.notify_all()

    def count(self, method: str, plural: str, *, watch: bool | None = None) -> int:
        """How many requests of ``method`` hit ``plural`` (optionally only (non-)watches)."""
        n = 0
        for m, path, query in list(self.requests):
            if m != method or path.rstrip("/").split("/")[-1] != plural:
                continue
            is_watch = query.get("watch") in ("true", "1")
            if watch is None or watch == is_watch:
                n += 1
        return n

    # -- internals ------------------------------------------------------------------------

    def _kill_watch_sockets(self) -> None:
        with self._cond:
            socks = list(self._watch_sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _resource_of(self, obj: Mapping[str, Any]) -> Resource:
        api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for r in RESOURCES:
            if r.api_version == api and r.kind == kind:
                return r
        raise KeyError(f"fake API server does not serve {api} {kind}")

    def _stamp(self, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Set server-owned metadata; caller holds the lock."""
        self._rv += 1
        meta = new["metadata"]
        meta["resourceVersion"] = str(self._rv)
        if old is not None:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        else:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())

    def _route(self, path: str) -> tuple[Resource, str | None, str | None] | None:
        """``(resource, namespace or None, name or None)`` for an API path."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        ns: str | None = None
        if len(rest) >= 2 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not 1 <= len(rest) <= 2:
            return None
        for r in RESOURCES:
            if (r.group, r.version, r.plural) == (group, version, rest[0]):
                return r, ns, rest[1] if len(rest) == 2 else None
        return None

    def _visible(self, obj: Mapping[str, Any], ns: str | None, selector: str | None) -> bool:
        if ns is not None and (obj.get("metadata") or {}).get("namespace") != ns:
            return False
        return selector_matches(selector, _labels(obj))

    def list_objects(self, res: Resource, ns: str | None,
                     selector: str | None) -> tuple[list[dict[str, Any]], int]:
        with self._cond:
            store = self._stores[(res.group, res.plural)]
            items = [copy.deepcopy(o) for (_, _), o in sorted(store.objects.items())
                     if self._visible(o, ns, selector)]
            for o in items:  # as in a real XxxList: items carry no kind/apiVersion
                o.pop("kind", None)
                o.pop("apiVersion", None)
            return items, self._rv

    def watch_events(self, res: Resource, ns: str | None, selector: str | None, since: int,
                     *, bookmarks: bool, timeout: float | None,
                     ) -> Iterator[dict[str, Any]]:
        """Watch events for one client: history after ``since``, then live ones."""
        store = self._stores[(res.group, res.plural)]
        deadline = time.monotonic() + timeout if timeout else None
        next_bookmark = time.monotonic() + self.bookmark_interval
        sent = since  # every event up to here has been delivered to this client
        while True:
            with self._cond:
                if self._closed or self._severed:
                    return
                if sent < self._floor:
                    # Asked for (or fell behind into) compacted history, as etcd answers.
                    yield {"type": "ERROR", "object": status(
                        410, "Expired", f"too old resource version: {sent} ({self._floor})")}
                    return
                out: list[dict[str, Any]] = []
                for ev in store.events:
                    if ev.rv <= sent:
                        continue
                    kind = self._event_type(ev, ns, selector)
                    if kind:
                        out.append({"type": kind, "object": copy.deepcopy(ev.new)})
                sent = self._rv
            yield from out
            now_t = time.monotonic()
            if bookmarks and now_t >= next_bookmark:
                next_bookmark = now_t + self.bookmark_interval
                yield {"type": "BOOKMARK", "object": {
                    "kind": res.kind, "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(sent)}}}
            if deadline is not None and now_t >= deadline:
                return
            with self._cond:
                if self._rv == sent and not self._closed and not self._severed:
                    wait = self.bookmark_interval if bookmarks else 0.5
                    if deadline is not None:
                        wait = min(wait, max(0.0, deadline - now_t))
                    self._cond.wait(wait)

    def _event_type(self, ev: _Event, ns: str | None, selector: str | None) -> str | None:
        """What one watcher sees of ``ev``: selectors turn updates into ADDED/DELETED."""
        was = ev.old is not None and self._visible(ev.old, ns, selector)
        now = self._visible(ev.new, ns, selector)
        if ev.type == "DELETED":
            return "DELETED" if was else None
        if was and now:
            return "MODIFIED"
        if now:
            return "ADDED"
        if was:
            return "DELETED"  # stopped matching the selector
        return None

    def wait_unsevered(self) -> None:
        with self._cond:
            while self._severed and not self._closed:
                self._cond.wait(0.5)


def _handler_for(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else ~40 ms per keep-alive request (Nagle)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        # -- plumbing ---------------------------------------------------------------------

        def _send_json(self, code: int, body: Mapping[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _fail(self, code: int, reason: str, message: str) -> None:
            self._send_json(code, status(code, reason, message))

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def _prepare(self, method: str) -> tuple[Resource, str | None, str | None,
                                                 dict[str, str]] | None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            server.requests.append((method, url.path, query))
            route = server._route(url.path)
            if route is None:
                self._fail(404, "NotFound", f"the server could not find the requested "
                                            f"resource ({url.path})")
                return None
            res, ns, name = route
            if res.plural in server._forbidden or f"{res.plural}.{res.group}" in server._forbidden:
                verb = {"GET": "watch" if query.get("watch") in ("true", "1") else
                        ("get" if name else "list"), "POST": "create", "PUT": "update",
                        "DELETE": "delete"}[method]
                where = f" in the namespace \"{ns}\"" if ns else " at the cluster scope"
                group = f" in API group \"{res.group}\""
                self._fail(403, "Forbidden",
                           f"{res.plural} is forbidden: User \"system:serviceaccount:test:epp\" "
                           f"cannot {verb} resource \"{res.plural}\"{group}{where}")
                return None
            # after RBAC, as the real server authorizes before it looks for the resource
            if res.plural in server._unserved or f"{res.plural}.{res.group}" in server._unserved:
                self._fail(404, "NotFound", "the server could not find the requested resource")
                return None
            return res, ns, name, query

        # -- verbs ------------------------------------------------------------------------

        def do_GET(self) -> None:
            prepared = self._prepare("GET")
            if prepared is None:
                return
            res, ns, name, query = prepared
            if name is not None:
                obj = server.get(res.api_version, res.kind, name, ns or "")
                if obj is None:
                    self._fail(404, "NotFound", f"{res.plural} \"{name}\" not found")
                else:
                    self._send_json(200, obj)
                return
            selector = query.get("labelSelector")
            if query.get("watch") in ("true", "1"):
                self._watch(res, ns, selector, query)
                return
            rv = query.get("resourceVersion")
            if rv and rv != "0" and int(rv) < server._floor:
                self._fail(410, "Expired", f"too old resource version: {rv}")
                return
            if server.list_delay:
                time.sleep(server.list_delay)
            items, current = server.list_objects(res, ns, selector)
            self._send_json(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                  "metadata": {"resourceVersion": str(current)},
                                  "items": items})

        def _watch(self, res: Resource, ns: str | None, selector: str | None,
                   query: dict[str, str]) -> None:
            server.wait_unsevered()
            since = int(query.get("resourceVersion") or 0) or server.list_objects(
                res, ns, selector)[1]
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
            bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            sock = self.connection
            with server._cond:
                server._watch_sockets.add(sock)
            try:
                for event in server.watch_events(res, ns, selector, since,
                                                 bookmarks=bookmarks, timeout=timeout):
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                if server._severed or server._closed:
                    self.close_connection = True  # cut: no clean end-of-stream chunk
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True
            finally:
                with server._cond:
                    server._watch_sockets.discard(sock)

        def do_POST(self) -> None:
            prepared = self._prepare("POST")
            if prepared is None:
                return
            res, ns, _, _ = prepared
            body = self._body()
            body.setdefault("apiVersion", res.api_version)
            body.setdefault("kind", res.kind)
            meta = body.setdefault("metadata", {})
            if ns:
                meta["namespace"] = ns
            if server.get(res.api_version, res.kind, meta.get("name", ""), ns or ""):
                self._fail(409, "AlreadyExists",
                           f"{res.plural} \"{meta.get('name')}\" already exists")
                return
            meta.pop("resourceVersion", None)
            self._send_json(201, server.apply(body))

        def do_PUT(self) -> None:
            prepared = self._prepare("PUT")
            if prepared is None:
                return
            res, ns, name, _ = prepared
            body = self._body()
            body.setdefault("apiVersion", res.api_version)
            body.setdefault("kind", res.kind)
            meta = body.setdefault("metadata", {})
            meta["namespace"] = ns
            with server._cond:  # check-and-set must be atomic, as etcd's is
                current = server.get(res.api_version, res.kind, name or "", ns or "")
                if current is None:
                    self._fail(404, "NotFound", f"{res.plural} \"{name}\" not found")
                    return
                want = meta.get("resourceVersion")
                if want and want != current["metadata"]["resourceVersion"]:
                    self._fail(409, "Conflict",
                               f"Operation cannot be fulfilled on {res.plural} \"{name}\": "
                               "the object has been modified; please apply your changes to "
                               "the latest version and try again")
                    return
                stored = server.apply(body)
            self._send_json(200, stored)

        def do_DELETE(self) -> None:
            prepared = self._prepare("DELETE")
            if prepared is None:
                return
            res, ns, name, _ = prepared
            try:
                server.delete(res.api_version, res.kind, name or "", ns or "")
            except KeyError:
                self._fail(404, "NotFound", f"{res.plural} \"{name}\" not found")
                return
            self._send_json(200, status(200, "", "deleted") | {"status": "Success"})

    return Handler


def api_client(server: FakeApiServer) -> Any:
    """A real ``kubernetes.client.ApiClient`` pointed at ``server``."""
    from kubernetes import client

    cfg = client.Configuration(host=server.url)
    return client.ApiClient(cfg)


def kubeconfig(path: Path, server: FakeApiServer) -> Path:
    """Write a kubeconfig at ``path`` that points clients at ``server``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "fake", "user": {"token": "test"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path
