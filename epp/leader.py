"""Active-passive EPP replicas: leader election on a ``coordination.k8s.io/v1`` Lease.

Follows client-go's ``leaderelection`` package:

- a candidate tries to take the Lease every ``retry_period``; it may when the Lease is free
  (no holder) or when the holder has not renewed it for ``lease_duration``, measured on the
  candidate's own clock from when it last saw the record change (so clock skew between
  nodes does not matter);
- the leader renews every ``retry_period``; when it has not managed to renew for
  ``renew_deadline`` it stops leading (before anyone else may take over, since
  renew_deadline < lease_duration);
- writes carry the Lease's ``resourceVersion``: of two candidates racing, the loser gets
  409 Conflict and stays a follower;
- on shutdown the leader releases the Lease (empty holder), so a stand-by takes over within
  one ``retry_period`` rather than a whole ``lease_duration``.

Only the leader reports ready (the EPP's health ANDs :attr:`LeaderElector.is_leader` with the
datastore being synced), so Envoy's picker Service always points at one replica.

The Lease calls use the sync ``kubernetes`` client in a worker thread (``asyncio.to_thread``)
while the election's state lives on the event loop: one owner, no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import structlog

log = structlog.get_logger(__name__)

#: client-go defaults.
LEASE_DURATION: Final = 15.0
RENEW_DEADLINE: Final = 10.0
RETRY_PERIOD: Final = 2.0


def lease_name_for(pool_namespace: str, pool_name: str) -> str:
    """The Lease the EPP replicas of one pool compete for (one election per pool)."""
    return f"epp-{pool_namespace}-{pool_name}.inference-gateway"[:253]


def default_identity() -> str:
    """``$POD_NAME`` (set by the chart) or the hostname, plus a random suffix so a restarted
    process never mistakes its predecessor's Lease for its own."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election-relevant part of a Lease."""

    holder: str
    lease_duration: float
    renew_time: datetime | None
    transitions: int
    resource_version: str | None


class LeaderElector:
    """Competes for a Lease; exposes :attr:`is_leader`, :attr:`leading` and a callback."""

    def __init__(
        self,
        lease_name: str,
        namespace: str,
        *,
        api_client: Any = None,
        identity: str | None = None,
        lease_duration: float = LEASE_DURATION,
        renew_deadline: float = RENEW_DEADLINE,
        retry_period: float = RETRY_PERIOD,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self.lease_name = lease_name
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_change = on_change
        #: Set while this replica leads; cleared when it stops leading.
        self.leading = asyncio.Event()
        #: The opposite of :attr:`leading` (set while following), so both edges can be awaited.
        self.following = asyncio.Event()
        self.following.set()
        self._api_client = api_client
        self._api: Any = None
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # monotonic time the record last changed, as seen here

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the Lease."""
        return self.leading.is_set()

    # -- the election loop ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Campaign, lead, and campaign again after losing, until cancelled or ``stop`` is
        set; then release the Lease. Pass the event that starts the EPP's drain as ``stop``
        so a stand-by takes over at once rather than after the drain."""
        from kubernetes import client

        if self._api_client is None:
            from shared.reflector import load_api_client

            self._api_client = load_api_client()
        self._api = client.CoordinationV1Api(self._api_client)
        log.info("leader election started", lease=self.lease_name, identity=self.identity)
        campaign = asyncio.ensure_future(self._campaign())
        waiters: set[asyncio.Future[Any]] = {campaign}
        if stop is not None:
            waiters.add(asyncio.ensure_future(stop.wait()))
        try:
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            failed = campaign in done  # the campaign never ends by itself: an error
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            if self.is_leader:
                self._set_leading(False)
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.to_thread(self._release))
        if failed:
            campaign.result()

    async def _campaign(self) -> None:
        while True:
            await self._acquire()
            self._set_leading(True)
            await self._renew_until_lost()
            self._set_leading(False)

    async def _acquire(self) -> None:
        while not await self._try(self._try_acquire_or_renew):
            await asyncio.sleep(self.retry_period * random.uniform(1.0, 1.2))

    async def _renew_until_lost(self) -> None:
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_period)
            if await self._try(self._try_acquire_or_renew):
                last_renew = time.monotonic()
            elif time.monotonic() - last_renew >= self.renew_deadline:
                log.warning("leader lost the lease (could not renew in time)",
                            lease=self.lease_name, identity=self.identity)
                return

    async def _try(self, attempt: Callable[[], bool]) -> bool:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result when a
        # cancel() lands as the thread finishes, and the cancelled campaign then renews
        # forever, so run() never returns (a stop that hangs).
        try:
            async with asyncio.timeout(self.renew_deadline):
                return await asyncio.to_thread(attempt)
        except Exception as e:  # API trouble of any kind = not acquired this round
            log.warning("lease update failed", lease=self.lease_name,
                        error=f"{type(e).__name__}: {e}")
            return False

    def _set_leading(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        if leading:
            self.leading.set()
            self.following.clear()
            log.info("became leader", lease=self.lease_name, identity=self.identity)
        else:
            self.leading.clear()
            self.following.set()
            log.info("stopped leading", lease=self.lease_name, identity=self.identity)
        if self.on_change is not None:
            self.on_change(leading)

    # -- one attempt (in a worker thread) -------------------------------------------------

    def _try_acquire_or_renew(self) -> bool:
        from kubernetes.client.exceptions import ApiException

        now = datetime.now(UTC)
        try:
            lease = self._api.read_namespaced_lease(self.lease_name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return self._create(now)
        record = _record(lease)
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        held_by_other = record.holder and record.holder != self.identity
        expires = self._observed_at + record.lease_duration
        if held_by_other and time.monotonic() < expires:
            return False
        spec = lease.spec
        taking_over = record.holder != self.identity
        if taking_over:
            spec.acquire_time = now
            spec.lease_transitions = record.transitions + (1 if record.holder else 0)
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = max(1, int(self.lease_duration))
        spec.renew_time = now
        try:
            updated = self._api.replace_namespaced_lease(self.lease_name, self.namespace, lease)
        except ApiException as e:
            if e.status == 409:  # someone else wrote first
                return False
            raise
        self._observed = _record(updated)
        self._observed_at = time.monotonic()
        return True

    def _create(self, now: datetime) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.lease_name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, int(self.lease_duration)),
                acquire_time=now, renew_time=now, lease_transitions=0,
            ),
        )
        try:
            created = self._api.create_namespaced_lease(self.namespace, lease)
        except ApiException as e:
            if e.status == 409:  # created by another candidate in the meantime
                return False
            raise
        self._observed = _record(created)
        self._observed_at = time.monotonic()
        return True

    def _release(self) -> None:
        """Hand the Lease back (empty holder) so a stand-by needn't wait for it to expire."""
        lease = self._api.read_namespaced_lease(self.lease_name, self.namespace)
        if (lease.spec.holder_identity or "") != self.identity:
            return
        now = datetime.now(UTC)
        lease.spec.holder_identity = ""
        lease.spec.lease_duration_seconds = 1
        lease.spec.renew_time = now
        lease.spec.acquire_time = now
        self._api.replace_namespaced_lease(self.lease_name, self.namespace, lease)
        log.info("released the lease", lease=self.lease_name, identity=self.identity)


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity or "",
        lease_duration=float(spec.lease_duration_seconds or LEASE_DURATION),
        renew_time=spec.renew_time,
        transitions=spec.lease_transitions or 0,
        resource_version=lease.metadata.resource_version,
    )


async def report_readiness(
    set_serving: Callable[[bool], Awaitable[None]],
    synced: asyncio.Event,
    elector: LeaderElector | None = None,
) -> None:
    """Keep health = synced AND (no election, or leading), until cancelled.

    Use as the ``ready`` hook of :func:`shared.server.serve`:
    ``ready=lambda h: report_readiness(h.set_serving, datastore.synced, elector)``.
    """
    await synced.wait()
    if elector is None:
        await set_serving(True)
        return
    while True:
        await elector.leading.wait()
        await set_serving(True)
        await elector.following.wait()
        await set_serving(False)
