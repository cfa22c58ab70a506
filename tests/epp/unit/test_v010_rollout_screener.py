"""``disaggregatedset-rollout-screener``: one revision per request across every profile,
weighted by Ready pods, strict and prefer header selectors, fail-closed 503s."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from devkit.manifests import pool_manifests
from epp.config import build
from epp.config.loader import ConfigError, parse_config
from epp.datastore import Datastore, EndpointMetrics
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.requestcontrol import Director
from shared.errors import ServiceUnavailable
from tests.epp.unit.test_director import HEADERS, body

REV, ROLE, SLICE = ("disaggregatedset.x-k8s.io/revision", "disaggregatedset.x-k8s.io/role",
                    "disaggregatedset.x-k8s.io/slice")

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: disaggregatedset-rollout-screener
  parameters:
    scope: {labelSelector: "disaggregatedset.x-k8s.io/name=my-set"}
    headerSelectors:
    - {name: revision, headerName: x-disagg-revision, labelKey: %(rev)s, mode: strict}
    - {name: slice, headerName: x-disagg-slice, labelKey: %(slice)s, mode: prefer}
    revisionGating: {mode: %(mode)s, requireRoles: {values: [prefill, decode]}}
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
"""


def fleet(pods: list[tuple[str, str, str]]) -> Datastore:
    """(revision, role, slice) per pod, all in the set."""
    docs = pool_manifests("pool", [(f"pod-{i}", f"10.2.0.{i + 1}") for i in range(len(pods))],
                          8000)
    for doc, (rev, role, sl) in zip(docs[1:], pods, strict=True):
        doc["metadata"]["labels"].update({REV: rev, ROLE: role, SLICE: sl,
                                          "disaggregatedset.x-k8s.io/name": "my-set"})
    ds = Datastore()
    ds.replace(build_snapshot([o for d in docs if (o := parse_object(d)) is not None],
                              pool_name="pool", pool_namespace="default"))
    for view in ds.views():
        view.begin_scrape()
        ds.record_scrape(view, EndpointMetrics(updated_at=time.monotonic() + 3600))
    return ds


def director(ds: Datastore, mode: str = "max-role", seed: int = 0) -> Director:
    text = CONFIG % {"rev": REV, "slice": SLICE, "mode": mode}
    rt = build(parse_config(text), ds, rng=random.Random(seed))
    rt.handle.plugin("disaggregatedset-rollout-screener", object).rng = random.Random(seed)
    return Director.of(rt)


def route(d: Director, **headers: str) -> Any:
    _, routed = d.route({**HEADERS, **headers}, body(), {})
    d.response_received(routed, 200, {})
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    return routed


# 2P:10D rollout, step 4 of upstream's example: A has 1P + 6D, B has 1P + 4D (60/40 by decode)
STEP4 = ([("A", "prefill", "0"), *[("A", "decode", "0")] * 6,
          ("B", "prefill", "1"), *[("B", "decode", "1")] * 4])


def test_max_role_shares_traffic_by_the_dominant_roles_ready_pods() -> None:
    d = director(fleet(STEP4))
    revs = Counter(route(d).endpoint.endpoint.labels[REV] for _ in range(400))
    assert 0.52 < revs["A"] / 400 < 0.68  # 6 of 10 decode pods


def test_sum_weights_by_every_required_role() -> None:
    d = director(fleet(STEP4), mode="sum")
    revs = Counter(route(d).endpoint.endpoint.labels[REV] for _ in range(400))
    assert 0.50 < revs["A"] / 400 < 0.66  # 7 of 12 pods


def test_a_revision_missing_a_role_gets_nothing_and_none_covered_is_503() -> None:
    ds = fleet([("A", "prefill", "0"), ("A", "decode", "0"), ("B", "decode", "1")])
    d = director(ds)
    assert {route(d).endpoint.endpoint.labels[REV] for _ in range(30)} == {"A"}
    with pytest.raises(ServiceUnavailable):
        route(director(fleet([("A", "decode", "0"), ("B", "prefill", "1")])))


def test_strict_revision_header_is_obeyed_or_fails_closed() -> None:
    ds = fleet(STEP4)
    d = director(ds)
    assert {route(d, **{"x-disagg-revision": "B"}).endpoint.endpoint.labels[REV]
            for _ in range(20)} == {"B"}
    with pytest.raises(ServiceUnavailable):
        route(d, **{"x-disagg-revision": "C"})
    incomplete = director(fleet([("A", "prefill", "0"), ("A", "decode", "0"),
                                 ("B", "decode", "1")]))
    with pytest.raises(ServiceUnavailable, match="lacks a Ready pod"):
        route(incomplete, **{"x-disagg-revision": "B"})


def test_the_response_carries_the_serving_pods_revision_and_slice() -> None:
    d = director(fleet(STEP4))
    routed = route(d)
    labels = routed.endpoint.endpoint.labels
    assert routed.response.set_headers["x-disagg-revision"] == labels[REV]
    assert routed.response.set_headers["x-disagg-slice"] == labels[SLICE]


def test_disabled_gating_keeps_every_revision_but_still_stamps() -> None:
    d = director(fleet(STEP4), mode="disabled")
    revs = {route(d).endpoint.endpoint.labels[REV] for _ in range(60)}
    assert revs == {"A", "B"}


@pytest.mark.parametrize(("params", "why"), [
    ("{revisionGating: {mode: sum, requireRoles: {values: [p]}}}", "labelSelector"),
    ("{scope: {labelSelector: a=b}}", "revisionGating is required"),
    ("{scope: {labelSelector: a=b}, revisionGating: {mode: sum}}", "requireRoles"),
    ("{scope: {labelSelector: 'a in (b)'}, revisionGating: {mode: disabled}}", "set-based"),
])
def test_bad_parameters_stop_the_config(params: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        build(parse_config(f"plugins:\n- type: disaggregatedset-rollout-screener\n"
                           f"  parameters: {params}\n- type: random-picker\n"))
