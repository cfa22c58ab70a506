"""Custom scalar metrics (llm-d-router v0.10 ``engineConfigs[].customMetrics``): a gauge of
the ``/metrics`` page stored as a numeric endpoint attribute under a key of your choice,
which ``endpoint-attribute-filter`` and ``endpoint-attribute-scorer`` read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp.metrics.dialects import parse_spec
from epp.metrics.parser import scan


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """``attributeKey``: where the value is stored; ``metricSpec``: ``name{label=value,...}``
    selecting the sample (the last matching sample of the page wins, as upstream takes the
    latest)."""

    attribute_key: str = ""
    metric_spec: str = ""

    def __post_init__(self) -> None:
        if not self.attribute_key.strip():
            raise ValueError("customMetrics: attributeKey must not be empty")
        if not self.metric_spec.strip():
            raise ValueError(f"customMetrics {self.attribute_key!r}: metricSpec must not be "
                             f"empty")
        try:
            parse_spec(self.metric_spec)
        except ValueError as e:
            raise ValueError(f"customMetrics {self.attribute_key!r}: {e}") from None


@dataclass(frozen=True, slots=True)
class ScalarAttributes:
    """An endpoint's numeric attributes, by the extractor that made them (each replaces only
    its own on every reading): attribute key → value."""

    by_owner: Mapping[str, Mapping[str, float]]

    def get(self, key: str) -> float | None:
        """The value under ``key``, None when the endpoint does not have it."""
        for values in self.by_owner.values():
            if key in values:
                return values[key]
        return None

    @property
    def values(self) -> dict[str, float]:
        """Every attribute, whoever made it."""
        return {k: v for values in self.by_owner.values() for k, v in values.items()}


def publish_scalars(view: Any, owner: str, values: Mapping[str, float]) -> None:
    """Replace ``owner``'s numeric attributes of ``view`` with ``values``."""
    current = view.attribute(ScalarAttributes)
    mine = dict(current.by_owner) if current is not None else {}
    mine[owner] = dict(values)
    view.attributes[ScalarAttributes] = ScalarAttributes(mine)


class CustomMetricsReader:
    """Reads a fixed list of custom metrics from ``/metrics`` pages."""

    def __init__(self, metrics: Sequence[CustomMetric]) -> None:
        self._specs = [(m.attribute_key, *parse_spec(m.metric_spec)) for m in metrics]
        self._families = tuple({family for _, family, _ in self._specs})

    def read(self, text: str) -> dict[str, float]:
        """The attributes found on the page ``text``."""
        families = scan(text, self._families).families
        out: dict[str, float] = {}
        for key, family, labels in self._specs:
            for sample in families.get(family, ()):
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    out[key] = sample.value
        return out
