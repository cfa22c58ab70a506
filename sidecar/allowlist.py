"""Which prefillers the sidecar may send a prefill leg to (SSRF protection).

The ``x-prefiller-host-port`` header is only a *request* for a prefiller: the sidecar honours
it only when the address is a ready endpoint of its own InferencePool whose
``llm-d.ai/role`` label lets it prefill, read from the same source the EPP reads (the
Kubernetes API, or a manifests file) with the EPP's own datastore code. So a client that
reaches the sidecar directly, or slips the header past the gateway, can at most pick a pod
the EPP could have picked itself, never an arbitrary address.

Stricter than llm-d's allow-list, which matches the host only: here ``ip:port`` must match
an endpoint (pod IP x one of the pool's target ports).
"""

from __future__ import annotations

from typing import Protocol

from epp.datastore import Datastore, Snapshot
from modelserver.pd import can_encode, can_prefill


class PrefillerPolicy(Protocol):
    """Decides whether a ``host:port`` may serve a prefill leg, or be a KV-cache source."""

    def allows(self, host_port: str) -> bool:
        """True when the sidecar may send a prefill leg to ``host_port``."""
        ...

    def allows_source(self, host_port: str) -> bool:
        """True when ``host_port`` may be named as a KV-cache source (any pool endpoint)."""
        ...

    def allows_encoder(self, host_port: str) -> bool:
        """True when the sidecar may send multimodal items to ``host_port`` to encode."""
        ...


class AllowAny:
    """``--enable-ssrf-protection=false``: every address is accepted (llm-d's default)."""

    def allows(self, host_port: str) -> bool:
        """Always true."""
        return True

    def allows_source(self, host_port: str) -> bool:
        """Always true."""
        return True

    def allows_encoder(self, host_port: str) -> bool:
        """Always true."""
        return True


class PoolPrefillers:
    """Ready, prefill-capable endpoints of the pool, kept current from a :class:`Datastore`."""

    def __init__(self, datastore: Datastore) -> None:
        self._allowed: frozenset[str] = frozenset()
        self._members: frozenset[str] = frozenset()
        self._encoders: frozenset[str] = frozenset()
        datastore.subscribe(self._update)
        self._update(datastore.snapshot)

    def _update(self, snapshot: Snapshot) -> None:
        self._allowed = frozenset(
            e.key for e in snapshot.endpoints if can_prefill(e.labels))
        self._members = frozenset(e.key for e in snapshot.endpoints)
        self._encoders = frozenset(e.key for e in snapshot.endpoints if can_encode(e.labels))

    @property
    def allowed(self) -> frozenset[str]:
        """The ``ip:port`` keys accepted right now."""
        return self._allowed

    def allows(self, host_port: str) -> bool:
        """Exact ``ip:port`` match against the pool's prefill endpoints."""
        return host_port.strip().lower() in self._allowed

    def allows_source(self, host_port: str) -> bool:
        """Exact ``ip:port`` match against any endpoint of the pool."""
        return host_port.strip().lower() in self._members

    def allows_encoder(self, host_port: str) -> bool:
        """Exact ``ip:port`` match against the pool's encode endpoints."""
        return host_port.strip().lower() in self._encoders
