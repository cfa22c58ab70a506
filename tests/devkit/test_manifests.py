"""devkit.manifests: what the EPP makes of the pools the devkit writes."""

from __future__ import annotations

from devkit.manifests import ports_pool_manifests
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot


def test_a_ports_pool_is_one_endpoint_per_port_on_one_host() -> None:
    docs = ports_pool_manifests("sims", "127.0.0.1", [8000, 8001, 8002])
    snap = build_snapshot([o for o in map(parse_object, docs) if o is not None],
                          pool_name="sims", pool_namespace="default")
    assert sorted(f"{e.address}:{e.port}" for e in snap.endpoints) == [
        "127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"]
