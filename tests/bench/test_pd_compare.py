"""``bench.pd_compare``: its verdict rule, its workload, and short runs end to end (the fleets
start, ours disaggregates the long prompts and not the short ones, vllm-router's PD mode
moves the KV of every request through the simulator's NixlConnector roles)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bench.pd_compare import PD_CONFIGS, parse_split, ratio_interval, verdict, workload
from bench.peers import PEERS

ROOT = Path(__file__).resolve().parents[2]


def test_verdict_needs_the_whole_interval_on_one_side() -> None:
    assert verdict(0.4, 0.55, 0.6, "le") == "met"
    assert verdict(0.65, 0.9, 0.6, "le") == "not met"
    assert verdict(0.5, 0.7, 0.6, "le") == "inconclusive"
    assert verdict(1.01, 1.2, 1.0, "ge") == "met"
    assert verdict(0.8, 0.95, 1.0, "ge") == "not met"
    assert verdict(float("nan"), float("nan"), 1.0, "ge") == "inconclusive"


def test_ratio_interval_contains_the_geometric_mean_and_widens_with_spread() -> None:
    lo, hi = ratio_interval([0.5, 0.5, 0.5])
    assert abs(lo - 0.5) < 1e-9 and abs(hi - 0.5) < 1e-9
    lo, hi = ratio_interval([0.4, 0.5, 0.6, 0.5, 0.45])
    assert lo < 0.49 < hi < 0.6


def test_workload_mixes_long_prompts_and_short_streaming_decodes() -> None:
    specs = workload(3, rate=2.0, duration=50)
    long = [s for s in specs if s.tag == "long"]
    short = [s for s in specs if s.tag == "short"]
    assert long and short and all(s.body["stream"] for s in specs)
    assert all(4096 <= len(s.body["prompt"]) // 4 <= 16384 for s in long)
    assert all(100 <= len(s.body["prompt"]) // 4 <= 400 for s in short)
    assert all(200 <= s.body["max_tokens"] <= 500 for s in specs)
    assert [s.body for s in specs] == [s.body for s in workload(3, 2.0, 50)]


@pytest.mark.timeout(300)
def test_vllm_router_pd_mode_moves_kv_through_the_simulator_roles(tmp_path: Path) -> None:
    """vllm-router 0.1.x ``--vllm-pd-disaggregation`` over the same 2 prefill + 2 decode
    simulated servers: every request is prefilled on a prefill server and its KV pulled by a
    decode server (none recomputed), and the clients see no error."""
    if not PEERS["vllm-router"].installed():
        pytest.skip("vllm-router is not installed in .cache/peers (python -m bench.peers "
                    "install); it is a PyPI wheel, not a project dependency")
    proc = subprocess.run([sys.executable, "-m", "bench.pd_compare", "--seeds", "1",
                           "--duration", "4", "--rate", "1", "--fleets", "vllm-router-pd",
                           "--workdir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "errors: {'aggregated': 0, 'vllm-router-pd': 0}" in proc.stdout
    run = tmp_path / "vllm-router-pd-seed0"
    summary = orjson.loads((run / "summary.json").read_bytes())
    requests = len((run / "requests.jsonl").read_bytes().splitlines())
    assert requests > 0
    assert summary["counters"]["kv_pulls"] == requests
    assert summary["counters"]["failed_pulls"] == 0
    assert "--vllm-pd-disaggregation" in (run / "command.txt").read_text()


def test_an_unknown_fleet_is_a_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.pd_compare", "--fleets", "pd,sglang",
                           "--workdir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--fleets: unknown fleet(s) sglang" in proc.stderr


def test_split_is_prefill_colon_decode_with_both_sides_present() -> None:
    assert parse_split("2:2") == (2, 2) and parse_split("3:1") == (3, 1)
    for bad in ("4", "2:0", "0:4", "a:b", "2:-1"):
        with pytest.raises(ValueError, match="PREFILL:DECODE"):
            parse_split(bad)


def test_the_gie_scorers_config_scores_both_profiles_like_the_aggregated_fleet() -> None:
    from epp.config.loader import DEFAULT_CONFIG_YAML
    gie = yaml.safe_load(PD_CONFIGS["gie-scorers"] % 1024)
    default = yaml.safe_load(DEFAULT_CONFIG_YAML)
    refs = {(p["pluginRef"], p["weight"]) for p in default["schedulingProfiles"][0]["plugins"]}
    for profile in gie["schedulingProfiles"]:
        assert refs <= {(p["pluginRef"], p.get("weight")) for p in profile["plugins"]}


# Two P/D runs and one aggregated (time scale 0.25, a few requests each): the simulator 4x
# faster than model time, same requests and decisions. (This was two tests, each starting an
# aggregated and a P/D fleet; the first run now carries both tests' checks.)
@pytest.mark.timeout(300)
def test_a_3p1d_split_compares_both_fleets_and_a_sweep_run_reuses_the_baseline(
        tmp_path: Path) -> None:
    common = [sys.executable, "-m", "bench.pd_compare", "--seeds", "1", "--duration", "4",
              "--rate", "1", "--time-scale", "0.25", "--fleets", "pd", "--split", "3:1"]
    # 1. llm-d's sample config on 3 prefill + 1 decode servers, beside the aggregated fleet:
    #    the long prompts are disaggregated, the short ones decoded locally.
    first = tmp_path / "first"
    proc = subprocess.run([*common, "--workdir", str(first)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| long | tpot_p90 |" in proc.stdout
    assert "errors: {'aggregated': 0, 'pd': 0}" in proc.stdout
    pods = [d for d in yaml.safe_load_all((first / "pd-seed0" / "pool.yaml").read_text())
            if d["kind"] == "Pod"]
    roles = sorted(p["metadata"]["labels"]["llm-d.ai/role"] for p in pods)
    assert roles == ["decode", "prefill", "prefill", "prefill"]
    pd = orjson.loads((first / "pd-seed0" / "summary.json").read_bytes())
    tags = [orjson.loads(line)["tag"] for line in
            (first / "pd-seed0" / "requests.jsonl").read_bytes().splitlines()]
    assert "long" in tags and "short" in tags  # seed 0 at this rate: both classes
    sidecar = pd["counters"]["sidecar"]
    assert sidecar.get('{mode="disaggregated"}', 0) == tags.count("long")
    assert sidecar.get('{mode="local"}', 0) == tags.count("short")
    assert pd["counters"]["kv_pulls"] == tags.count("long")
    assert pd["counters"]["failed_pulls"] == 0
    assert pd["counters"]["decoder_requests"] == [len(tags)]  # the one decode server took all
    assert pd["settings"]["split"] == "3:1" and pd["settings"]["pd_config"] == "llm-d"
    # 2. A sweep point with GIE's scorers: the same seed's aggregated run is reused, only the
    #    pd fleet runs; threshold 1 disaggregates every request.
    second = tmp_path / "second"
    proc = subprocess.run([*common, "--pd-config", "gie-scorers", "--threshold", "1",
                           "--baseline", str(first / "results.json"),
                           "--workdir", str(second)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (second / "aggregated-seed0").exists()
    assert f"aggregated runs from {first / 'results.json'}" in proc.stdout
    assert "| long | tpot_p90 |" in proc.stdout
    assert "kv-cache-utilization-scorer" in (second / "pd-seed0" / "epp-config.yaml").read_text()
    again = orjson.loads((second / "pd-seed0" / "summary.json").read_bytes())
    assert again["settings"]["pd_config"] == "gie-scorers"
    assert again["counters"]["kv_pulls"] == len(tags)  # threshold 1: every request
    assert again["counters"]["decoder_requests"] == [len(tags)]
    assert len(again["counters"]["prefiller_requests"]) == 3  # every prefill leg counted
    assert sum(again["counters"]["prefiller_requests"]) == len(tags)


def test_a_baseline_of_other_settings_is_a_one_line_error(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_bytes(orjson.dumps([{"kind": "aggregated", "seed": 0, "summary": {},
                                       "counters": {}, "settings": {
                                           "rate": 0.6, "duration": 60.0, "time_scale": 1.0,
                                           "split": "2:2"}}]))
    for extra, message in ((["--seeds", "1", "--rate", "2"], "seed 0 ran rate 0.6, this run 2.0"),
                           (["--seeds", "2"], "no aggregated run for seed(s) [1]"),
                           (["--first-seed", "3", "--seeds", "1"],
                            "no aggregated run for seed(s) [3]"),
                           (["--seeds", "1", "--split", "2:1"], "another number of servers")):
        proc = subprocess.run([sys.executable, "-m", "bench.pd_compare", "--baseline",
                               str(results), "--workdir", str(tmp_path), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr.splitlines()[-1]


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

    rt = build(parse_config(PD_CONFIGS["token-load"] % 1024))
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
    rt = build(parse_config(PD_CONFIGS["spill"] % 1024), ds)
    pods = list(ds.candidates())

    def prefiller(prompt: str) -> str | None:
        return prefiller_of(rt, pods, prompt)

    # two 9,000-token prompts: one per prefill pod (token-load), both now over 8,000 tokens
    assert {prefiller(c * 36_000) for c in "ab"} == {pods[2].key, pods[3].key}
    assert prefiller("c" * 36_000) is None  # spilled: a decode pod with 1 request in flight
