"""``--state-store`` URLs: where the shared state lives, validated strictly.

``memory://``                         this process only (the default; no sharing)
``valkey://[user:password@]host[:port][/db][?option=value...]``
``valkeys://...``                     the same over TLS

``redis://`` and ``rediss://`` are accepted as aliases, since Valkey speaks the same protocol and
operators paste the URLs they already have. Options (query string):

- ``namespace``: key prefix, so several pools can share one server (default ``gie``);
- ``timeout``: seconds a store operation may take before it counts as failed (default 0.5);
- ``sync_interval``: seconds between background syncs (default 0.05);
- TLS only: ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile`` (paths), ``ssl_cert_reqs``
  (``required`` | ``optional`` | ``none``), ``ssl_check_hostname`` (``true`` | ``false``).

Anything else is an error that names the offending part, never a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_PORT = 6379
_SCHEMES = {"valkey": False, "redis": False, "valkeys": True, "rediss": True}
_TLS_OPTIONS = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                "ssl_check_hostname"}
_OPTIONS = {"namespace", "timeout", "sync_interval"} | _TLS_OPTIONS


class StoreURLError(ValueError):
    """A ``--state-store`` URL that cannot be used; the message is one line for the operator."""


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed state-store URL."""

    kind: str  # "memory" | "valkey"
    host: str = ""
    port: int = DEFAULT_PORT
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    namespace: str = "gie"
    timeout: float = 0.5
    sync_interval: float = 0.05
    #: Keyword arguments for the client's TLS setup (``ssl_*``), only when ``tls``.
    tls_options: dict[str, str | bool] = field(default_factory=dict)

    def redacted(self) -> str:
        """The URL without its password, for logs."""
        if self.kind == "memory":
            return "memory://"
        scheme = "valkeys" if self.tls else "valkey"
        auth = f"{self.username or ''}:***@" if self.password else ""
        return f"{scheme}://{auth}{self.host}:{self.port}/{self.db}"


def _positive(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise StoreURLError(f"state store URL: option {name}={raw!r} is not a number") from None
    if not value > 0:
        raise StoreURLError(f"state store URL: option {name} must be > 0, got {raw}")
    return value


def parse_store_url(url: str) -> StoreURL:
    """Parse ``url`` or raise :class:`StoreURLError` naming what is wrong."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path.strip("/") or parts.query:
            raise StoreURLError(f"state store URL: memory:// takes nothing after it, got {url!r}")
        return StoreURL(kind="memory")
    if scheme not in _SCHEMES:
        raise StoreURLError(f"state store URL: unknown scheme {parts.scheme!r} in {url!r} "
                            "(use valkey://, valkeys:// or memory://)")
    tls = _SCHEMES[scheme]
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise StoreURLError(f"state store URL: bad port in {url!r}") from None
    if not host:
        raise StoreURLError(f"state store URL: no host in {url!r}")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise StoreURLError(f"state store URL: database {path!r} is not a number in {url!r}")
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if key not in _OPTIONS:
            raise StoreURLError(f"state store URL: unknown option {key!r} "
                                f"(known: {', '.join(sorted(_OPTIONS))})")
        if key in _TLS_OPTIONS and not tls:
            raise StoreURLError(f"state store URL: option {key!r} needs TLS (valkeys://)")
        options[key] = value
    tls_options: dict[str, str | bool] = {}
    for key in _TLS_OPTIONS & options.keys():
        value = options[key]
        if key == "ssl_cert_reqs" and value not in ("required", "optional", "none"):
            raise StoreURLError("state store URL: ssl_cert_reqs must be required, optional "
                                f"or none, got {value!r}")
        if key == "ssl_check_hostname":
            if value not in ("true", "false"):
                raise StoreURLError("state store URL: ssl_check_hostname must be true or "
                                    f"false, got {value!r}")
            tls_options[key] = value == "true"
        else:
            tls_options[key] = value
    namespace = options.get("namespace", "gie")
    if not namespace or any(c in namespace for c in " :{}"):
        raise StoreURLError(f"state store URL: namespace {namespace!r} must be non-empty "
                            "without spaces, ':' or braces")
    return StoreURL(
        kind="valkey",
        host=host,
        port=port or DEFAULT_PORT,
        db=int(path or 0),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=tls,
        namespace=namespace,
        timeout=_positive("timeout", options["timeout"]) if "timeout" in options else 0.5,
        sync_interval=(_positive("sync_interval", options["sync_interval"])
                       if "sync_interval" in options else 0.05),
        tls_options=tls_options,
    )
