"""The scheduler: runs profiles over a snapshot of endpoints and returns a result. No I/O."""

from __future__ import annotations

import random
from collections.abc import Sequence
from time import perf_counter

from epp.datastore import EndpointView
from epp.scheduling.plugin import (
    EndpointsRemoved,
    PostPick,
    ProfileHandler,
    SchedulerHooks,
)
from epp.scheduling.profile import SchedulingProfile
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from shared.errors import ServiceUnavailable, TooManyRequests
from shared.plugins import Plugin as BasePlugin


class NoCandidates(ServiceUnavailable):
    """503: the scheduler was given no endpoints at all."""


class NoEndpointPicked(TooManyRequests):
    """429: filters or the picker left nothing (e.g. the legacy tree dropped a sheddable
    request, or no endpoint has capacity)."""

    code = "no_capacity"


class Scheduler:
    """Runs the configured profiles for each request.

    Stateless over its inputs apart from plugin-owned learning state (the prefix index),
    which only changes in :meth:`post_pick`.
    """

    def __init__(
        self,
        profiles: Sequence[SchedulingProfile],
        handler: ProfileHandler,
        *,
        plugins: Sequence[BasePlugin] = (),
        rng: random.Random | None = None,
        hooks: SchedulerHooks | None = None,
    ) -> None:
        self.profiles = {p.name: p for p in profiles}
        self.handler = handler
        handler.validate(list(self.profiles))
        self.rng = rng or random.Random()
        self.hooks = hooks or SchedulerHooks()
        seen: dict[int, BasePlugin] = {id(handler): handler}
        for p in profiles:
            for plugin in (*p.filters, *(ws.scorer for ws in p.scorers), p.picker):
                seen.setdefault(id(plugin), plugin)
        for extra in plugins:
            seen.setdefault(id(extra), extra)
        #: Every distinct plugin instance (a plugin shared by two profiles appears once).
        self.plugins: tuple[BasePlugin, ...] = tuple(seen.values())
        self._post_pick = tuple(p for p in self.plugins if isinstance(p, PostPick))
        for each in self.plugins:
            attach = getattr(each, "attach", None)  # third-party plugins may lack it
            if attach is not None:
                attach(self.hooks.for_plugin(each.type_name, each.name))

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointView]
    ) -> SchedulingResult:
        """Pick endpoints for ``request`` among ``candidates``.

        Raises :class:`NoCandidates` (503) for an empty candidate list and
        :class:`NoEndpointPicked` (429) when the primary profile picks nothing.
        """
        if not candidates:
            raise NoCandidates("no ready endpoint in the pool")
        t0 = perf_counter()
        results: dict[str, ProfileResult] = {}
        trace = request.trace
        while True:
            todo = self.handler.pick_profiles(request, self.profiles, results)
            if not todo:
                break
            for profile in todo:
                if trace is None:
                    results[profile.name] = profile.run(request, candidates, self.rng,
                                                        self.hooks)
                    continue
                span = trace.span("run_scheduler_profile", {
                    "llm_d.epp.scheduling.profile.name": profile.name,
                    "llm_d.epp.scheduling.candidate_endpoints": len(candidates)})
                try:
                    res = results[profile.name] = profile.run(request, candidates, self.rng,
                                                              self.hooks, span)
                    span.set_attribute("llm_d.epp.scheduling.picked",
                                       [v.key for v in res.picked])
                    if res.rejected_by:
                        span.set_attribute("llm_d.epp.scheduling.rejected_by", res.rejected_by)
                finally:
                    span.end()
        primary = self.handler.primary_profile(request, results)
        result = SchedulingResult(results, primary)
        if self.hooks.e2e_duration is not None:
            self.hooks.e2e_duration(perf_counter() - t0)
        if not result.primary.picked:
            why = result.primary.rejected_by
            raise NoEndpointPicked(
                f"no endpoint can take the request (rejected by {why})"
                if why
                else "no endpoint can take the request"
            )
        return result

    def post_pick(self, request: LLMRequest, result: SchedulingResult) -> None:
        """Tell learning plugins where the request went (call once it is committed)."""
        for plugin in self._post_pick:
            plugin.post_pick(request, result)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        """Drop plugin state of endpoints no longer in the pool (wire to datastore changes)."""
        for plugin in self.plugins:
            if isinstance(plugin, EndpointsRemoved):
                plugin.retain_endpoints(keys)

    @property
    def prefix_indexer_size(self) -> int:
        """Entries in all prefix indexes (``inference_extension_prefix_indexer_size``)."""
        from epp.statestore import StateStore

        # Prefix plugins keep their index in a state store; several may share one.
        stores = {id(s): s for p in self.plugins
                  if isinstance(s := getattr(p, "store", None), StateStore)}
        return sum(s.prefix_size for s in stores.values())

    def prefix_indexer_sizes(self) -> list[tuple[str, str, int]]:
        """(plugin type, plugin name, entries) of each prefix index, named after the plugin
        keeping it: its producer rather than a scorer reading the producer's index, as the
        hit series are (``llm_d_epp_prefix_indexer_size``)."""
        from epp.statestore import StateStore

        out: dict[int, tuple[str, str, int]] = {}
        readers_last = sorted(self.plugins, key=lambda p: hasattr(p, "producer"))
        for p in readers_last:
            if isinstance(s := getattr(p, "store", None), StateStore) and id(s) not in out:
                out[id(s)] = (p.type_name, p.name, s.prefix_size)
        return list(out.values())
