"""Custom scalar metrics (llm-d-router v0.10 ``engineConfigs[].customMetrics``): a gauge of
the ``/metrics`` page stored as a numeric endpoint attribute under a key of your choice,
which ``endpoint-attribute-filter`` and ``endpoint-attribute-scorer`` read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    """The custom metrics of one endpoint's latest scrape: attribute key → value (a key whose
    metric was not on the page is absent)."""

    values: Mapping[str, float]

    def get(self, key: str) -> float | None:
        """The value under ``key``, None when the endpoint does not have it."""
        return self.values.get(key)


class CustomMetricsReader:
    """Reads a fixed list of custom metrics from ``/metrics`` pages."""

    def __init__(self, metrics: Sequence[CustomMetric]) -> None:
        self._specs = [(m.attribute_key, *parse_spec(m.metric_spec)) for m in metrics]
        self._families = tuple({family for _, family, _ in self._specs})

    def read(self, text: str) -> ScalarAttributes:
        """The attributes found on the page ``text``."""
        families = scan(text, self._families).families
        out: dict[str, float] = {}
        for key, family, labels in self._specs:
            for sample in families.get(family, ()):
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    out[key] = sample.value
        return ScalarAttributes(out)
