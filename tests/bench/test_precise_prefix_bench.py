"""Issue 15's figure as a scenario (``bench/scenarios/precise-prefix.yaml``): a fleet with
``kv_events: true`` publishes vLLM KV events that every precise EPP replica reads, the
``restart-server`` fault step kills and revives a server, and in virtual time the engines'
KV events reach every precise replica's index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.contenders import KV_EVENTS_OFFSET, SimFleet
from bench.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "bench" / "scenarios" / "configs"

SCENARIO = f"""\
title: Precise replicas on a small KV-event fleet
fleet: {{servers: 2, kv_blocks: 300, kv_events: true}}
workload: {{use: prefix-pool, duration: 4, parameters: {{prefixes: 12}}}}
contenders:
- {{name: precise, epp_config: {CONFIGS / 'precise-prefix.yaml'},
   replicas: {{count: 2, store: memory}}}}
seeds: [1]
loads: [0.2]
timeout: 30
faults:
- {{at: 2, action: restart-server}}
"""


def run(scenario: Path, *args: str) -> tuple[dict[str, Any], Path]:
    proc = subprocess.run([sys.executable, "-m", "bench", "run", str(scenario), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("results: "))
    path = Path(line.removeprefix("results: "))
    return json.loads(path.read_text()), path.parent


@pytest.mark.timeout(240)
def test_every_precise_replica_reads_every_servers_kv_events(tmp_path: Path) -> None:
    scenario = tmp_path / "precise.yaml"
    scenario.write_text(SCENARIO)
    doc, run_dir = run(scenario, "--real")
    (row,) = doc["results"]
    assert row["ok"] > 0 and row["cache_hit"] > 0.5, row
    debug = json.loads(next(run_dir.rglob("debug.json")).read_text())
    held = [[ep["kv_cached_blocks"] for ep in r["endpoints"]] for r in debug["replicas"]]
    # Both replicas index server 1 from its events (it never restarted, so it still holds
    # blocks), and about the same blocks: they read the same streams (read one after the
    # other, a last batch may reach one replica first).
    assert len(held) == 2 and held[0][1] > 0 and held[1][1] > 0, held
    assert abs(sum(held[0]) - sum(held[1])) <= 0.1 * max(sum(held[0]), sum(held[1])), held
    faults = next(run_dir.rglob("faults.txt")).read_text()
    assert "restart-server: sim-0 killed, revived 1 s later" in faults
    # The run keeps what each step did and what the whole run lost (cold requests too), and
    # its section says so per run: a saved fault run is a figure `bench report` regenerates.
    outcomes = [json.loads(ln) for ln in next(run_dir.rglob("outcomes.jsonl")).open()]
    failed = sum(o["status"] != 200 or bool(o["error"]) or o["ttft"] is None for o in outcomes)
    assert row["faults"] == [*faults.splitlines(),
                             f"{failed} of {len(outcomes)} requests failed"], row["faults"]
    assert f"- precise, seed 1: {'; '.join(row['faults'])}\n" in (
        run_dir / "results.md").read_text()
    # 12 prefixes of 48 blocks on 300-block servers: they evict, and say so; the replicas'
    # lag histograms are merged into the run's figures and the report pools them.
    assert row["evictions"] > 0
    assert row["kv_lag"]["+Inf"] >= 2  # both replicas indexed batches
    assert "KV-event lag p99, publish to indexed" in (run_dir / "results.md").read_text()


def test_in_the_twin_every_precise_replica_reads_the_engines_kv_events() -> None:
    # The scenario itself, one seed, 8 model seconds: without the engines' events reaching
    # the precise scorers (or with every request taken for an adapter: the director's
    # served-model cache filled before the first scrape) precise replicas route like
    # round-robin (~55% hit), below the approximate ones (~70%).
    doc, _ = run(ROOT / "bench" / "scenarios" / "precise-prefix.yaml", "--virtual",
                 "--seeds", "1", "--duration", "8", "--contenders", "approximate,precise")
    hit = {r["contender"]: r["cache_hit"] for r in doc["results"]}
    assert hit["precise"] >= 0.85 and hit["precise"] > hit["approximate"] + 0.1, hit


def test_kv_events_give_each_server_a_port_and_a_publisher_offset(tmp_path: Path) -> None:
    fleet = SimFleet(tmp_path, size=3, kv_events=True)
    fleet.port = 20_000
    fleet.hosts = ["127.0.0.1"] * 3
    assert fleet.endpoints == [("127.0.0.1", 20_000), ("127.0.0.1", 20_001),
                               ("127.0.0.1", 20_002)]
    assert KV_EVENTS_OFFSET == 1000  # configs/precise-prefix.yaml's socketPortOffset


def test_kv_events_are_for_an_aggregated_fleet_without_labels(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("kv_events: true", "kv_events: true, labels: [{a: b}, {}]"))
    with pytest.raises(ScenarioError, match=r"fleet\.kv_events: KV events are for an "
                                            r"aggregated fleet without labels"):
        load_scenario(bad)
    bad.write_text(SCENARIO.replace("kv_events: true", "kv_events: yes please"))
    with pytest.raises(ScenarioError, match=r"fleet\.kv_events: expected true or false"):
        load_scenario(bad)


def test_a_peer_scaled_out_is_a_count_of_processes_without_a_store(tmp_path: Path) -> None:
    scn = tmp_path / "peers.yaml"
    scn.write_text(SCENARIO.replace("- {name: precise",
                                    "- {name: sglang-router:cache_aware, replicas: {count: 3}}"
                                    "\n- {name: precise"))
    peer = load_scenario(scn).contenders[0]
    assert (peer.name, peer.kind, peer.replicas, peer.store) == (
        "sglang-router:cache_aware", "peer", 3, "")
    scn.write_text(SCENARIO.replace("- {name: precise", "- {name: vllm-router:cache_aware, "
                                    "replicas: {count: 2, store: valkey}}\n- {name: precise"))
    with pytest.raises(ScenarioError, match=r"contenders\[0\]\.replicas\.store: unknown key"):
        load_scenario(scn)


@pytest.mark.timeout(240)
def test_a_peer_scaled_out_runs_as_copies_behind_envoy(tmp_path: Path) -> None:
    from bench.peers import PEERS

    if PEERS["sglang-router"].problem():
        pytest.skip("sglang-router is not installed in .cache/peers (python -m bench.peers "
                    "install needs PyPI; CI does not install the peers)")
    scn = tmp_path / "peers.yaml"
    scn.write_text(SCENARIO.replace("- {name: precise", "- {name: sglang-router:cache_aware, "
                                    "replicas: {count: 2}}\n- {name: precise"))
    doc, run_dir = run(scn, "--real", "--contenders", "sglang-router:cache_aware")
    (row,) = doc["results"]
    assert row["ok"] > 0 and not row["skipped"], row
    commands = next(run_dir.rglob("command.txt")).read_text().splitlines()
    assert len(commands) == 2 and commands[0] != commands[1]  # two copies, own ports


def test_a_kv_cache_size_is_for_an_aggregated_fleet(tmp_path: Path) -> None:
    bad = tmp_path / "pd.yaml"
    bad.write_text("title: t\nfleet: {roles: {prefill: 1, decode: 1}, kv_blocks: 300}\n"
                   "workload: pd-mix\ncontenders: [aggregated]\n")
    with pytest.raises(ScenarioError, match=r"fleet\.kv_blocks: a KV cache size is for an "
                                            r"aggregated fleet"):
        load_scenario(bad)
