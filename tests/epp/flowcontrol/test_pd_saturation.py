"""Per-stage saturation for P/D pools: flow control's dispatch signal is the fuller of the
prefill and decode stages, not one mean over every endpoint."""

from __future__ import annotations

from devkit.manifests import pool_manifests
from epp.datastore import Datastore
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.flowcontrol.admitter import pool_saturation
from epp.requestcontrol.plugins import ConcurrencyDetector, ConcurrencyParameters


def pool(roles: list[str | None]) -> Datastore:
    """One endpoint per role (None: no role label), pods pod-0, pod-1, ..."""
    docs = pool_manifests("pool", [(f"pod-{i}", f"10.0.0.{i + 1}") for i in range(len(roles))],
                          8000)
    for doc in docs:
        if doc["kind"] == "Pod":
            role = roles[int(doc["metadata"]["name"].split("-")[1])]
            if role is not None:
                doc["metadata"]["labels"]["llm-d.ai/role"] = role
    ds = Datastore()
    ds.replace(build_snapshot([o for d in docs if (o := parse_object(d)) is not None],
                              pool_name="pool", pool_namespace="default"))
    return ds


def load(ds: Datastore, busy: dict[int, int]) -> None:
    views = sorted(ds.candidates(), key=lambda v: v.endpoint.pod_name)
    for i, n in busy.items():
        for _ in range(n):
            views[i].start_request()


DETECTOR = ConcurrencyDetector("d", ConcurrencyParameters(max_concurrency=2))


def test_a_full_prefill_stage_saturates_a_pd_pool() -> None:
    ds = pool(["prefill", "decode", "decode", "decode"])
    load(ds, {0: 2})  # the one prefiller is full, decoders idle
    assert DETECTOR.saturation(ds.candidates()) == 2 / 8  # one mean would say 0.25
    assert pool_saturation(DETECTOR, ds)() == 1.0


def test_a_full_decode_stage_saturates_a_pd_pool() -> None:
    ds = pool(["prefill", "prefill", "decode"])
    load(ds, {2: 2})
    assert pool_saturation(DETECTOR, ds)() == 1.0


def test_a_pool_without_prefill_only_endpoints_keeps_one_mean() -> None:
    ds = pool(["both", None, "decode"])
    load(ds, {0: 2})
    assert pool_saturation(DETECTOR, ds)() == 2 / 6
