"""LoRA adapter slots: which adapters are resident on the GPU and which may be loaded.

A server has ``max_loras`` slots. An adapter in use by a running request pins its slot; an
adapter with no running request stays resident (so reusing it is free) until a request for a
different adapter needs the slot, in least-recently-used order. Loading an adapter into a slot
costs ``lora_load_time`` (charged to the engine step that admits the request).
"""

from __future__ import annotations

from collections import OrderedDict


class LoraSlots:
    """Residency and pin counts of LoRA adapters on one server."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self._resident: OrderedDict[str, int] = OrderedDict()  # name -> running requests
        self.loads = 0

    @property
    def running_adapters(self) -> list[str]:
        """Adapters used by at least one running request, in load order."""
        return [name for name, n in self._resident.items() if n > 0]

    @property
    def resident(self) -> list[str]:
        """Adapters currently occupying a slot (pinned or idle)."""
        return list(self._resident)

    def can_acquire(self, name: str) -> bool:
        """Whether a request for ``name`` could be admitted now."""
        if name in self._resident or len(self._resident) < self.max_loras:
            return True
        return any(n == 0 for n in self._resident.values())

    def acquire(self, name: str) -> bool:
        """Pin ``name`` for one running request; returns ``True`` if it had to be loaded.

        Call :meth:`can_acquire` first.
        """
        res = self._resident
        if name in res:
            res[name] += 1
            res.move_to_end(name)
            return False
        if len(res) >= self.max_loras:
            victim = next(n for n, c in res.items() if c == 0)
            del res[victim]
        res[name] = 1
        self.loads += 1
        return True

    def release(self, name: str) -> None:
        """Unpin ``name`` for one finished or preempted request."""
        self._resident[name] -= 1

    def evict(self, name: str) -> None:
        """Drop an idle adapter (e.g. after it was unloaded through the API)."""
        if self._resident.get(name) == 0:
            del self._resident[name]

    def reset(self) -> None:
        """Empty all slots."""
        self._resident.clear()
