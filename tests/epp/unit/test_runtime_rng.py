"""Every plugin that draws takes the runtime's random source (``build(..., rng=...)``), so a
seeded runtime repeats itself: tests and the benchmark's twin depend on it."""

from __future__ import annotations

import random

from epp.config import build, parse_config
from epp.requestcontrol.plugins.disaggregatedset_rollout_screener import (
    DisaggregatedSetRolloutScreener,
)
from epp.requestcontrol.plugins.probabilistic_admitter import ProbabilisticAdmitter
from epp.scheduling.plugins.filter.prefix_cache_affinity_filter import PrefixCacheAffinityFilter
from epp.scheduling.plugins.filter.slo_headroom_tier_filter import SloHeadroomTierFilter

CONFIG = """\
plugins:
- type: slo-headroom-tier-filter
- type: prefix-cache-affinity-filter
- type: probabilistic-admitter
- type: disaggregatedset-rollout-screener
  parameters:
    scope: {labelSelector: "disaggregatedset.x-k8s.io/name=my-set"}
    revisionGating: {mode: disabled}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: max-score-picker
"""


def test_plugins_that_draw_take_the_runtimes_seeded_random_source() -> None:
    rng = random.Random(7)
    rt = build(parse_config(CONFIG), rng=rng)
    for kind in (SloHeadroomTierFilter, PrefixCacheAffinityFilter, ProbabilisticAdmitter,
                 DisaggregatedSetRolloutScreener):
        (plugin,) = rt.handle.find(kind)
        assert plugin.rng is rng, kind.__name__
