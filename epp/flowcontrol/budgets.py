"""``token-budget-admitter`` (ours): per-tenant token budgets, in tokens per minute.

A tenant is a fairness id (the flow-control header, ``default-flow`` without one). Its use
is the prompt + completion tokens of its responses (1 s buckets), exact from each response's
``usage``. A tenant with budget ``B`` tokens a minute and ``burst`` seconds is admitted while,
for every window of the last ``w`` = 1..60 seconds, its use is under

    limit(w) = min(B, B * (w + burst) / 60)

that is, at most ``B`` in any minute, and at an even pace of ``B/60`` tokens a second once it
has used a ``burst`` seconds' allowance ahead of that pace (a token bucket of ``B * burst /
60`` tokens filled at ``B/60`` a second, under the minute's cap). A tenant sending far over
its budget gets, each minute, ``burst`` seconds at twice the pace, then the pace, then a
pause of ``burst`` seconds. The pace is why: with the minute's cap alone (``burst: 60s``), a
tenant sending 3x its budget is admitted at its full rate for the first 20 s of every minute
and not at all for 40 s, and the other tenants' TTFT takes those bursts. Over the limit, a
new request of that tenant is refused with **429** and ``retry-after`` (the seconds until
the windows admit it again), or with ``onExceed: queue`` waits (one at a time per tenant)
until they do, at most ``maxWait`` (then 429).

A request admitted reserves its estimated prompt tokens at once, so a burst of one tenant's
requests cannot all pass before the first response is counted; the response's exact usage
replaces the estimate when it ends (a request refused further on keeps its reservation:
the error is on the side of the budget).

**Shared by active-active replicas** through the EPP's Valkey state store
(``--state-store valkey://…``): every ``syncInterval`` each replica adds its new tokens to
``<ns>:budget:<tenant>`` (a hash of 1 s bucket → tokens, expiring after 2 minutes) and reads
back the pool-wide buckets, so each replica holds the tenant to one budget, lagging by at most
one sync. When the store cannot be reached, budgets **fail open** to this replica's own use
(no client sees an error; two replicas may then admit up to a budget each) and re-join when
it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import structlog
import valkey.asyncio as avalkey
from valkey.exceptions import ValkeyError

from epp.datastore import EndpointView
from epp.flowcontrol.types import DROPPED_REASON_HEADER, fairness_id
from epp.requestcontrol.plugin import Admitter, Response, ResponseComplete
from epp.scheduling.request import LLMRequest
from epp.statestore import StateStore, ValkeyStateStore
from shared.errors import TooManyRequests
from shared.plugins import Duration, Handle, Plugin

log = structlog.get_logger(__name__)

#: The budget window (seconds) and its bucket width.
WINDOW = 60
#: Seconds the shared buckets of a tenant live in the store.
KEY_TTL = 2 * WINDOW


async def _done(reply: Awaitable[Any] | Any) -> Any:
    """The client's set commands are typed as maybe-awaitable; the asyncio client awaits."""
    return await reply if inspect.isawaitable(reply) else reply


class BudgetExceeded(TooManyRequests):
    """429: the tenant used its tokens-per-minute budget."""

    code = "token_budget_exceeded"

    def __init__(self, tenant: str, budget: int, retry_after: int) -> None:
        super().__init__(f"tenant {tenant!r} is over its budget of {budget} tokens per "
                         "minute; retry later")
        self.retry_after = retry_after
        self.extra_headers = {DROPPED_REASON_HEADER: "rejected-token-budget"}


@dataclass(frozen=True, slots=True)
class TokenBudgetParameters:
    """``tokensPerMinute`` for every tenant (0: no budget) and ``tenants`` overriding it per
    fairness id; ``burst``: how many seconds' worth of budget a tenant may use ahead of an
    even pace (``60s``: the minute's cap alone); ``onExceed``: ``reject`` (429 at once) or
    ``queue`` (wait up to ``maxWait``); ``syncInterval``: how often a shared budget is
    exchanged with the store."""

    tokens_per_minute: int = 0
    tenants: dict[str, int] = field(default_factory=dict)
    burst: Duration = Duration(10.0)  # noqa: RUF009 (immutable)
    on_exceed: Literal["reject", "queue"] = "reject"
    max_wait: Duration = Duration(60.0)  # noqa: RUF009 (immutable)
    sync_interval: Duration = Duration(0.1)  # noqa: RUF009 (immutable)

    def __post_init__(self) -> None:
        if self.tokens_per_minute < 0:
            raise ValueError(f"tokensPerMinute: must be >= 0, got {self.tokens_per_minute}")
        for tenant, budget in self.tenants.items():
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise ValueError(f"tenants[{tenant!r}]: must be an integer >= 0, got "
                                 f"{budget!r}")
        if not self.tokens_per_minute and not any(self.tenants.values()):
            raise ValueError("no budget set: give tokensPerMinute or tenants")
        if self.sync_interval <= 0:
            raise ValueError("syncInterval: must be > 0")
        if not 0 < self.burst <= WINDOW:
            raise ValueError(f"burst: must be > 0s and <= {WINDOW}s, got {float(self.burst):g}s")


class BudgetLedger:
    """Tokens used per tenant per 1 s bucket: this replica's own, and the pool's as last
    read from the store (when shared)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        #: Wall-clock seconds: buckets must mean the same second on every replica.
        self.clock = clock
        self.own: dict[str, dict[int, int]] = {}
        #: Tokens not pushed to the store yet, per tenant and bucket.
        self.unpushed: dict[str, dict[int, int]] = {}
        #: The pool-wide buckets as last read (None: not shared / store down).
        self.shared: dict[str, dict[int, int]] | None = None

    def charge(self, tenant: str, tokens: int) -> None:
        """Add ``tokens`` (may be negative: an estimate corrected) to the current bucket."""
        if tokens == 0:
            return
        b = int(self.clock())
        own = self.own.setdefault(tenant, {})
        own[b] = own.get(b, 0) + tokens
        pending = self.unpushed.setdefault(tenant, {})
        pending[b] = pending.get(b, 0) + tokens

    def used(self, tenant: str) -> int:
        """Tokens the tenant used in the last minute (pool-wide when shared)."""
        return sum(self._window(tenant).values())

    def seconds_until_allowed(self, tenant: str, budget: int, burst: float) -> float:
        """Seconds until, with no new use, the tenant's use is under ``limit(w)`` (the
        module docstring) on every window of the last 1..60 s (0: it is now)."""
        buckets = self._window(tenant)
        now = self.clock()
        for ahead in range(WINDOW + 1):
            t = int(now) + ahead
            used = 0
            for w in range(1, WINDOW + 1):
                used += buckets.get(t - w + 1, 0)
                if used >= min(budget, budget * (w + burst) / WINDOW):
                    break
            else:
                return max(0.0, t - now)
        return float(WINDOW)

    def _window(self, tenant: str) -> dict[int, int]:
        lo = int(self.clock()) - WINDOW + 1
        if self.shared is None:
            src: Mapping[int, int] = self.own.get(tenant, {})
            return {b: n for b, n in src.items() if b >= lo}
        out = {b: n for b, n in self.shared.get(tenant, {}).items() if b >= lo}
        for b, n in self.unpushed.get(tenant, {}).items():
            if b >= lo:
                out[b] = out.get(b, 0) + n
        return out

    def prune(self) -> None:
        """Forget buckets older than the window (and tenants with none left)."""
        lo = int(self.clock()) - WINDOW + 1
        for table in (self.own, self.unpushed):
            for tenant in list(table):
                kept = {b: n for b, n in table[tenant].items() if b >= lo}
                if kept:
                    table[tenant] = kept
                else:
                    del table[tenant]


class SharedBudgets:
    """Exchanges a :class:`BudgetLedger` with Valkey (see the module docstring)."""

    def __init__(self, ledger: BudgetLedger, store: ValkeyStateStore, interval: float) -> None:
        self.ledger = ledger
        self.store = store
        self.interval = interval
        self.prefix = f"{store.namespace}:budget:"
        self._client: avalkey.Valkey | None = None
        self._task: asyncio.Task[None] | None = None
        self.up = False

    def ensure_running(self) -> None:
        """Start the sync loop (called from the event loop, on first use)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="token-budget-sync")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.interval)

    async def sync(self) -> None:
        """Push the new tokens, read the pool's buckets; fall back to local on failure."""
        if self._client is None:
            u = self.store.url
            kwargs: dict[str, Any] = {"ssl": True, **u.tls_options} if u.tls else {}
            self._client = avalkey.Valkey(host=u.host, port=u.port, db=u.db,
                                          username=u.username, password=u.password,
                                          socket_timeout=u.timeout,
                                          socket_connect_timeout=u.timeout, **kwargs)
        ledger = self.ledger
        ledger.prune()
        pushing = ledger.unpushed
        ledger.unpushed = {}
        index = self.prefix + "tenants"
        try:
            async with asyncio.timeout(self.store.url.timeout * 4):
                pipe = self._client.pipeline(transaction=False)
                for tenant, buckets in pushing.items():
                    key = self.prefix + tenant
                    for b, n in buckets.items():
                        pipe.hincrby(key, str(b), n)
                    pipe.expire(key, KEY_TTL)
                    pipe.sadd(index, tenant)
                if pushing:
                    pipe.expire(index, KEY_TTL)
                pipe.smembers(index)
                *_, members = await pipe.execute()
                tenants = sorted({m.decode() if isinstance(m, bytes) else str(m)
                                  for m in members} | set(ledger.own))
                pipe = self._client.pipeline(transaction=False)
                for tenant in tenants:
                    pipe.hgetall(self.prefix + tenant)
                replies = await pipe.execute()
        except (ValkeyError, OSError, TimeoutError) as exc:
            for tenant, buckets in pushing.items():  # keep them for the next try
                pending = ledger.unpushed.setdefault(tenant, {})
                for b, n in buckets.items():
                    pending[b] = pending.get(b, 0) + n
            if self.up or ledger.shared is not None:
                log.warning("token budgets: state store unreachable; each replica holds "
                            "budgets on its own use", error=str(exc) or type(exc).__name__)
            self.up = False
            ledger.shared = None
            return
        shared: dict[str, dict[int, int]] = {}
        gone = []
        for tenant, raw in zip(tenants, replies, strict=True):
            buckets = {int(k): int(v) for k, v in (raw or {}).items()}
            if buckets:
                shared[tenant] = buckets
            elif tenant not in ledger.own:
                gone.append(tenant)
        if gone:  # their hashes expired: keep the index small
            with contextlib.suppress(ValkeyError, OSError):
                await _done(self._client.srem(index, *gone))
        ledger.shared = shared
        if not self.up:
            log.info("token budgets shared through the state store")
        self.up = True


class TokenBudgetAdmitter(Plugin, Admitter, ResponseComplete):
    """Holds each tenant to its tokens-per-minute budget (see the module docstring)."""

    type_name: ClassVar[str] = "token-budget-admitter"
    parameters_type = TokenBudgetParameters
    params: TokenBudgetParameters

    def __init__(self, name: str = "", params: Any = None,
                 store: StateStore | None = None) -> None:
        super().__init__(name, params)
        self.ledger = BudgetLedger()
        self.sharing: SharedBudgets | None = None
        if isinstance(store, ValkeyStateStore):
            self.sharing = SharedBudgets(self.ledger, store, float(self.params.sync_interval))
        #: Per tenant with requests queued (``onExceed: queue``): its lock and how many wait.
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        self._key = f"{self.name}.reserved"

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> TokenBudgetAdmitter:
        return cls(name, params, getattr(handle, "state_store", None))

    def budget(self, tenant: str) -> int:
        """The tenant's tokens per minute (0: no budget)."""
        return self.params.tenants.get(tenant, self.params.tokens_per_minute)

    def admit(self, request: LLMRequest,
              endpoints: Sequence[EndpointView]) -> Any:
        if self.sharing is not None:
            self.sharing.ensure_running()
        tenant = fairness_id(request)
        budget = self.budget(tenant)
        if not budget:
            return None
        if tenant not in self._locks and not self._wait_for(tenant, budget):
            self._reserve(request, tenant)
            return None
        if self.params.on_exceed == "reject":
            raise self._refusal(tenant, budget)
        return self._wait(request, tenant, budget)

    async def _wait(self, request: LLMRequest, tenant: str, budget: int) -> None:
        lock = self._locks.setdefault(tenant, asyncio.Lock())
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        deadline = time.monotonic() + float(self.params.max_wait)
        try:
            async with lock:  # one waiter per tenant: budget freed goes to one at a time
                while wait := self._wait_for(tenant, budget):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._refusal(tenant, budget)
                    await asyncio.sleep(min(max(wait, 0.01), 0.25, left))
                self._reserve(request, tenant)
        finally:
            n = self._waiting[tenant] - 1
            if n:
                self._waiting[tenant] = n
            else:  # the last waiter: new requests of this tenant may pass directly again
                del self._waiting[tenant]
                self._locks.pop(tenant, None)

    def _wait_for(self, tenant: str, budget: int) -> float:
        return self.ledger.seconds_until_allowed(tenant, budget, float(self.params.burst))

    def _refusal(self, tenant: str, budget: int) -> BudgetExceeded:
        return BudgetExceeded(tenant, budget, max(1, math.ceil(self._wait_for(tenant, budget))))

    def _reserve(self, request: LLMRequest, tenant: str) -> None:
        self.ledger.charge(tenant, request.prompt_tokens)
        request.plugin_state[self._key] = (tenant, request.prompt_tokens)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        reserved = request.plugin_state.pop(self._key, None)
        if reserved is None:
            return
        tenant, estimate = reserved
        if response.prompt_tokens or response.completion_tokens:
            exact = response.prompt_tokens + response.completion_tokens
            self.ledger.charge(tenant, exact - estimate)


BUDGET_PLUGINS: tuple[type[Plugin], ...] = (TokenBudgetAdmitter,)
