"""A pool with zero endpoints is logged (issue 31, item 11): it used to be silent."""

from __future__ import annotations

from structlog.testing import capture_logs

from epp.datastore import Datastore, Endpoint, ObjectRef, Pool, Snapshot

POOL = Pool(ref=ObjectRef("InferencePool", "llm", "pool-a"), api_version="v1",
            selector={"app": "vllm"}, target_ports=(8000,))
POD = Endpoint(name="p-0", pod_name="p", namespace="llm", address="10.0.0.1", port=8000,
               rank=0, labels={"app": "vllm"})


def warnings(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["log_level"] == "warning"]


def test_an_empty_pool_warns_once_and_its_recovery_is_logged() -> None:
    ds = Datastore()
    with capture_logs() as logs:
        ds.replace(Snapshot(pool=POOL))
        ds.replace(Snapshot(pool=POOL))  # still empty: no second warning
    (w,) = warnings(logs)
    assert w["event"] == "pool has no ready endpoints: requests get 503 until one is ready"
    assert w["pool"] == "llm/pool-a" and w["selector"] == {"app": "vllm"}
    with capture_logs() as logs:
        ds.replace(Snapshot(pool=POOL, endpoints=(POD,)))
    assert [e["event"] for e in logs] == ["pool has ready endpoints again"]
    with capture_logs() as logs:
        ds.replace(Snapshot(pool=POOL))
    assert len(warnings(logs)) == 1  # empty again: warned again


def test_a_pool_with_endpoints_logs_nothing() -> None:
    with capture_logs() as logs:
        Datastore().replace(Snapshot(pool=POOL, endpoints=(POD,)))
    assert logs == []
