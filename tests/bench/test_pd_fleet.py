"""``bench.pd_fleet``: the real-time P/D fleets start (ours disaggregates the long prompts and
not the short ones, vllm-router's PD mode moves the KV of every request through the
simulator's NixlConnector roles), and the EPP configs they run pick as they say."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.pd_fleet import Fleet, pd_config, start
from bench.peers import PEERS
from bench.workloads import WORKLOADS, write_specs


def _counter(where: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one counter family on a Prometheus endpoint ``host:port``."""
    with urllib.request.urlopen(f"http://{where}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    out: dict[str, float] = {}
    for line in lines:
        if line.startswith(name):
            key, value = line.rsplit(" ", 1)
            out[key[len(name):]] = out.get(key[len(name):], 0.0) + float(value)
    return out


def _play(fleet: Fleet, tmp_path: Path, load: float, seconds: float) -> list[str]:
    """Play a few seconds of the P/D mix (seed 0) through ``fleet``; the requests' tags."""
    specs = WORKLOADS["pd-mix"].schedule(load, seconds, 0, servers=4)
    write_specs(specs, tmp_path / "requests.jsonl")
    proc = subprocess.run([sys.executable, "-m", "bench.openloop", "--url", fleet.url,
                           "--requests", str(tmp_path / "requests.jsonl"),
                           "--out", str(tmp_path / "outcomes.jsonl"), "--timeout", "120"],
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"ok": false' not in (tmp_path / "outcomes.jsonl").read_text()
    return [s.tag for s in specs]


def _decoded(fleet: Fleet, name: str) -> list[float]:
    return [sum(_counter(f"127.0.0.1:{port}", name).values()) for port in fleet.decoders]


@pytest.mark.timeout(300)
def test_vllm_router_pd_mode_moves_kv_through_the_simulator_roles(tmp_path: Path) -> None:
    """vllm-router 0.1.x ``--vllm-pd-disaggregation`` over 2 prefill + 2 decode simulated
    servers: every request is prefilled on a prefill server and its KV pulled by a decode
    server (none recomputed), and the clients see no error."""
    if PEERS["vllm-router"].problem():
        pytest.skip("vllm-router is not installed in .cache/peers (python -m bench.peers "
                    "install); it is a PyPI wheel, not a project dependency")
    with start("vllm-router-pd", tmp_path, 0, 1024) as fleet:
        tags = _play(fleet, tmp_path, 0.5, 4)
        assert sum(_decoded(fleet, "vllm:nixl_xfer_time_seconds_count")) == len(tags)
        assert sum(_decoded(fleet, "vllm:nixl_num_failed_transfers_total")) == 0
    assert "--vllm-pd-disaggregation" in (tmp_path / "command.txt").read_text()


def test_the_gie_scorers_config_scores_both_profiles_with_gie_v15s_default_scorers() -> None:
    """GIE v1.5's default profile (ours adds prefill-load-scorer: docs/epp.md)."""
    gie = yaml.safe_load(pd_config("gie-scorers", 1024))
    refs = {("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3)}
    for profile in gie["schedulingProfiles"]:
        assert refs <= {(p["pluginRef"], p.get("weight")) for p in profile["plugins"]}


@pytest.mark.timeout(300)
def test_a_3p1d_fleet_disaggregates_the_long_prompts_and_keeps_the_short_ones(
        tmp_path: Path) -> None:
    """llm-d's sample config on 3 prefill + 1 decode servers behind Envoy, the EPP and the
    sidecar (the simulator 4x faster than model time): long prompts prefilled elsewhere with
    their KV pulled, short ones decoded locally, every request ending on the decode server."""
    with start("pd", tmp_path, 0, 1024, 0.25, (3, 1)) as fleet:
        tags = _play(fleet, tmp_path, 0.5, 4)
        assert "long" in tags and "short" in tags  # seed 0 at this load: both classes
        (sidecar,) = fleet.sidecar_metrics
        modes = _counter(sidecar, "pd_sidecar_requests_total")
        assert modes.get('{mode="disaggregated"}', 0) == tags.count("long")
        assert modes.get('{mode="local"}', 0) == tags.count("short")
        assert _decoded(fleet, "vllm:nixl_xfer_time_seconds_count") == [tags.count("long")]
        assert _decoded(fleet, "vllm:nixl_num_failed_transfers_total") == [0]
        assert _decoded(fleet, "vllm:request_success_total") == [len(tags)]
    pods = [d for d in yaml.safe_load_all((tmp_path / "pool.yaml").read_text())
            if d["kind"] == "Pod"]
    roles = sorted(p["metadata"]["labels"]["llm-d.ai/role"] for p in pods)
    assert roles == ["decode", "prefill", "prefill", "prefill"]


def prefiller_of(rt: Any, pods: list[Any], prompt: str) -> str | None:
    """Route ``prompt`` through the runtime's producers, scheduler and pre-request plugins
    (the director's steps); the prefill pod it names, if any."""
    from epp.testing import request

    req = request(prompt)
    for producer in rt.producers:
        producer.produce(req, pods)
    result = rt.scheduler.schedule(req, pods)
    for plugin in rt.pre_request:
        plugin.pre_request(req, result)
    found: str | None = result.extra_headers.get("x-prefiller-host-port")
    return found


def test_the_token_load_config_prefills_on_the_pod_with_fewest_prompt_tokens_in_flight() -> None:
    from epp.config import build, parse_config
    from epp.testing import endpoint
    from modelserver.pd import ROLE_LABEL

    rt = build(parse_config(pd_config("token-load", 1024)))
    pods = [endpoint(i, labels={ROLE_LABEL: r})
            for i, r in ((1, "decode"), (2, "decode"), (3, "prefill"), (4, "prefill"))]

    def prefiller(prompt: str) -> str:
        found = prefiller_of(rt, pods, prompt)
        assert found is not None
        return found

    big = prefiller("a" * 64_000)  # 16,000 tokens on one prefill pod
    other = pods[3].key if big == pods[2].key else pods[2].key
    # three 4,000-token prompts: more requests on the other pod, still fewer tokens
    assert [prefiller(c * 16_000) for c in "bcd"] == [other] * 3
    by_key = {v.key: v for v in pods}
    assert (by_key[big].inflight_requests, by_key[other].inflight_requests) == (1, 3)


def test_the_spill_config_decodes_a_long_prompt_locally_when_every_prefill_pod_is_busy() -> None:
    from devkit.manifests import pool_manifests
    from epp.config import build, parse_config
    from epp.datastore import Datastore
    from epp.datastore.objects import parse_object
    from epp.datastore.snapshot import build_snapshot
    from modelserver.pd import ROLE_LABEL

    objects = [o for o in (parse_object(d) for d in pool_manifests(
        "pool", [(f"pod-{i}", f"10.0.0.{i}") for i in (1, 2, 3, 4)], 8000)) if o is not None]
    for obj, role in zip(objects[1:], ("decode", "decode", "prefill", "prefill"), strict=True):
        obj.labels[ROLE_LABEL] = role  # type: ignore[union-attr]
    ds = Datastore()
    ds.replace(build_snapshot(objects, pool_name="pool", pool_namespace="default"))
    rt = build(parse_config(pd_config("spill", 1024)), ds)
    pods = list(ds.candidates())

    def prefiller(prompt: str) -> str | None:
        return prefiller_of(rt, pods, prompt)

    # two 9,000-token prompts: one per prefill pod (token-load), both now over 8,000 tokens
    assert {prefiller(c * 36_000) for c in "ab"} == {pods[2].key, pods[3].key}
    assert prefiller("c" * 36_000) is None  # spilled: a decode pod with 1 request in flight
