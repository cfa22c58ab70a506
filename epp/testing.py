"""Run a plugin against a fake pool snapshot, for plugin authors' unit tests.

    from epp.testing import PluginHarness, endpoint

    h = PluginHarness.of("my-scorer", {"threshold": 3})       # built through the registry
    pool = [endpoint(1, waiting=0), endpoint(2, waiting=9)]
    assert h.score(pool) == [1.0, 0.0]

The harness builds the plugin exactly as the EPP does (strict parameters, the entry-point
group, an :class:`epp.handle.EppHandle` holding any ``others`` it needs), and runs one
request through the extension points the plugin implements. Endpoints are real
:class:`epp.datastore.EndpointView` objects with one scrape installed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epp.config import builtin_registry
from epp.datastore import Endpoint, EndpointMetrics, EndpointView, EngineType, LoraInfo
from epp.handle import EppHandle
from epp.requestcontrol.plugin import Admitter, DataProducer, PreRequest
from epp.scheduling import (
    Filter,
    LLMRequest,
    Picker,
    ProfileResult,
    SchedulingResult,
    Scorer,
)
from shared.plugins import Plugin, PluginRegistry


def endpoint(i: int, *, waiting: int = 0, running: int = 0, kv: float = 0.0,
             lora: LoraInfo | None = None, labels: Mapping[str, str] | None = None,
             num_gpu_blocks: int | None = None) -> EndpointView:
    """Endpoint ``10.0.0.<i>:8000`` (pod ``pod-<i>``) with fresh metrics installed."""
    view = EndpointView(Endpoint(
        name=f"pod-{i}-rank-0", pod_name=f"pod-{i}", namespace="default",
        address=f"10.0.0.{i}", port=8000, rank=0, labels=dict(labels or {}),
        engine=EngineType.VLLM))
    view.begin_scrape()
    view.apply_scrape(EndpointMetrics(waiting=waiting, running=running, kv_usage=kv,
                                      lora=lora, num_gpu_blocks=num_gpu_blocks,
                                      updated_at=time.monotonic()))
    return view


def request(prompt: str = "Hello", *, model: str = "m", priority: int = 0,
            headers: Mapping[str, str] | None = None) -> LLMRequest:
    """A scheduling request as the director would make it from a completions body."""
    data = prompt.encode()
    return LLMRequest(request_id="test", target_model=model, client_model=model, prompt=data,
                      prompt_tokens=(len(data) + 3) // 4, priority=priority,
                      headers=dict(headers or {}))


@dataclass
class PluginHarness:
    """One plugin, built through the registry, and the handle it was built with."""

    plugin: Plugin
    handle: EppHandle
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @classmethod
    def of(cls, type_name: str, parameters: Mapping[str, Any] | None = None, *,
           others: Sequence[tuple[str, Mapping[str, Any] | None]] = (),
           registry: PluginRegistry | None = None) -> PluginHarness:
        """Build ``type_name`` (after the ``others`` it reads through the handle)."""
        registry = registry or builtin_registry()
        handle = EppHandle()
        for other_type, other_params in others:
            registry.create(other_type, other_type, other_params, handle)
        plugin = registry.create(type_name, type_name, parameters, handle)
        return cls(plugin, handle)

    def filter(self, endpoints: Sequence[EndpointView],
               req: LLMRequest | None = None) -> list[EndpointView]:
        assert isinstance(self.plugin, Filter), f"{self.plugin.type_name} is not a filter"
        return list(self.plugin.filter(req or request(), endpoints))

    def score(self, endpoints: Sequence[EndpointView],
              req: LLMRequest | None = None) -> list[float]:
        assert isinstance(self.plugin, Scorer), f"{self.plugin.type_name} is not a scorer"
        return list(self.plugin.score(req or request(), endpoints))

    def pick(self, endpoints: Sequence[EndpointView], scores: Sequence[float],
             req: LLMRequest | None = None) -> list[EndpointView]:
        assert isinstance(self.plugin, Picker), f"{self.plugin.type_name} is not a picker"
        return self.plugin.pick(req or request(), endpoints, scores, self.rng)

    def commit(self, picked: EndpointView, req: LLMRequest | None = None) -> None:
        """Run every pre-request plugin of the handle as if ``picked`` was chosen."""
        result = SchedulingResult({"default": ProfileResult("default", [picked])}, "default")
        for plugin in self.handle.find(PreRequest):
            plugin.pre_request(req or request(), result)

    def produce(self, endpoints: Sequence[EndpointView], req: LLMRequest | None = None) -> None:
        for plugin in self.handle.find(DataProducer):
            plugin.produce(req or request(), endpoints)

    async def admit(self, endpoints: Sequence[EndpointView],
                    req: LLMRequest | None = None) -> None:
        assert isinstance(self.plugin, Admitter), f"{self.plugin.type_name} is not an admitter"
        waiting = self.plugin.admit(req or request(), endpoints)
        if waiting is not None:
            await waiting
