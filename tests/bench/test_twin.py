"""The virtual-time twin: faithful to the simulator's engine, deterministic per seed, the real
EPP objects behind its adapter, in-flight accounting that balances, scrapes on schedule."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.runner import twin_run as run_one
from bench.twin.baselines import LeastRequest, RoundRobin
from bench.twin.epp_adapter import ConfigError, EppRouter
from bench.twin.loop import ServerState, TwinConfig, run
from bench.workloads import MODEL, WORKLOADS
from sim.clock import run_virtual
from sim.engine import Engine
from sim.openai import parse_request
from sim.profiles import get_profile

ROOT = Path(__file__).resolve().parents[2]


def _same(a: object, b: object) -> dict[str, object]:
    da, db = asdict(a), asdict(b)  # type: ignore[call-overload]
    da.pop("wall_seconds"), db.pop("wall_seconds")
    return {k: (da[k], db[k]) for k in da if da[k] != db[k]}


@pytest.mark.parametrize("router", ["envoy-rr", "envoy-lr", "epp-default"])
def test_one_seed_gives_the_same_run_every_time(router: str) -> None:
    first, again = (run_one("lora", 0.75, 4, 3, router, 6.0) for _ in range(2))
    assert first.ok > 20
    assert _same(first, again) == {}
    other = run_one("lora", 0.75, 4, 4, router, 6.0)
    assert _same(first, other) != {}


def test_one_server_matches_the_simulators_own_virtual_driver() -> None:
    specs = WORKLOADS["sharegpt"].schedule(0.9, 8.0, seed=1, servers=1)
    cfg = TwinConfig(servers=1, seed=0, model=MODEL)
    outcomes = run(specs, RoundRobin("envoy-rr", cfg.keys(), 0), cfg)
    import orjson

    engine = Engine(get_profile("8b-h100"), seed=0)
    reqs = []

    def make(spec: object) -> object:
        def build(t: float) -> object:
            parsed = parse_request(orjson.dumps(spec.body), chat=False)  # type: ignore[attr-defined]
            req = engine.new_request(parsed.prompt, parsed.max_tokens or 1, now=t)
            reqs.append(req)
            return req
        return build

    run_virtual(engine, [(s.at, make(s)) for s in specs])  # type: ignore[misc]
    assert len(reqs) == len(outcomes) > 20
    for out, req in zip(outcomes, reqs, strict=True):
        assert out.ttft == pytest.approx(req.first_token_time - req.arrival)
        assert out.e2e == pytest.approx(req.finish_time - req.arrival)


def test_the_epp_routes_by_prefix_and_releases_every_request() -> None:
    specs = WORKLOADS["shared-prefix"].schedule(0.6, 15.0, seed=0, servers=4)
    cfg = TwinConfig(servers=4, seed=0, model=MODEL)
    epp = EppRouter("epp-default", cfg.keys(), 0, model=MODEL)
    outcomes = run(specs, epp, cfg)
    rr = run(specs, RoundRobin("envoy-rr", cfg.keys(), 0), cfg)

    def hit(outs: list) -> float:  # type: ignore[type-arg]
        return sum(o.cached_tokens for o in outs) / sum(o.prompt_tokens for o in outs)

    assert all(o.ok for o in outcomes)
    assert hit(outcomes) > hit(rr) + 0.2   # the prefix scorer is really in the loop
    # The director's in-flight accounting came back to zero on every endpoint.
    assert all(v.inflight_requests == 0 and v.inflight_tokens == 0 for v in epp.views.values())
    assert sum(v._picks for v in epp.views.values()) == len(specs)


def test_the_epp_config_file_is_the_one_used(tmp_path: Path) -> None:
    # A config whose only scorer prefers short queues and no prefix affinity gets no cache hits
    # beyond chance; the default config's prefix-cache-scorer gets many.
    cfg_file = tmp_path / "queue-only.yaml"
    cfg_file.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                        "kind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n")
    specs = WORKLOADS["shared-prefix"].schedule(0.5, 12.0, seed=2, servers=4)
    cfg = TwinConfig(servers=4, seed=2, model=MODEL)
    queue_only = run(specs, EppRouter("q", cfg.keys(), 2, config_file=cfg_file, model=MODEL),
                     cfg)
    default = run(specs, EppRouter("d", cfg.keys(), 2, model=MODEL), cfg)
    assert sum(o.cached_tokens for o in default) > 1.5 * sum(o.cached_tokens for o in queue_only)


class _Recorder(LeastRequest):
    """The least-request baseline, asking for scrapes and recording when they happen."""

    scrape_interval = 0.25

    def __init__(self, keys: list[str]) -> None:
        super().__init__("lr", keys, 0)
        self.now = 0.0
        self.log: list[tuple[str, str, float]] = []
        self.states: list[ServerState] = []

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        self.now = now
        return super().route(index, path, body, now, headers)

    def begin_scrape(self, key: str) -> None:
        self.log.append(("begin", key, self.now))

    def scraped(self, key: str, state: ServerState) -> None:
        self.log.append(("done", key, self.now))
        self.states.append(state)


def test_scrapes_run_per_server_at_the_interval_and_stop_after_the_last_arrival() -> None:
    specs = WORKLOADS["sharegpt"].schedule(0.5, 10.0, seed=0, servers=2)
    cfg = TwinConfig(servers=2, seed=0, model=MODEL)
    rec = _Recorder(cfg.keys())
    run(specs, rec, cfg)
    begins = [e for e in rec.log if e[0] == "begin"]
    # Every 0.25 s per server from a random phase until the last arrival, then no more.
    expected = 2 * specs[-1].at / 0.25
    assert expected - 2 <= len(begins) <= expected + 2
    assert sum(e[0] == "done" for e in rec.log) == len(begins)
    assert any(s.running > 0 for s in rec.states) and all(s.max_lora == 4 for s in rec.states)


def test_a_bad_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad-epc.yaml"
    bad.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                   "kind: EndpointPickerConfig\nplugins:\n- type: no-such-scorer\n")
    with pytest.raises(ConfigError, match="no-such-scorer"):
        EppRouter("x", ["127.0.0.1:8000"], 0, config_file=bad)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("title: T\nworkload: shared-prefix\n"
                        "contenders: [{name: mine, epp_config: bad-epc.yaml}]\n")
    proc = subprocess.run([sys.executable, "-m", "bench", "run", str(scenario), "--seeds", "1",
                           "--duration", "2", "--jobs", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert str(bad) in proc.stderr and "no-such-scorer" in proc.stderr


def test_cli_smoke_with_a_config_file(tmp_path: Path) -> None:
    cfg_file = tmp_path / "my-epc.yaml"
    cfg_file.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                        "kind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
                        "- type: prefix-cache-scorer\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("title: T\nworkload: lora\nfleet: {servers: 4}\n"
                        "contenders: [envoy-rr, {name: epp-mine, epp_config: my-epc.yaml}]\n")
    proc = subprocess.run([sys.executable, "-m", "bench", "run", str(scenario), "--loads", "0.9",
                           "--seeds", "2", "--duration", "5", "--jobs", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| epp-mine | 2 |" in proc.stdout and "| envoy-rr | 2 |" in proc.stdout


def test_unknown_scenario_and_workload_are_named() -> None:
    for args, word in ((["nope"], "nope"), (["shared-prefix", "--workload", "nah"], "nah")):
        proc = subprocess.run([sys.executable, "-m", "bench", "run", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and word in proc.stderr


def test_a_twin_scrape_stays_fresh_however_slow_the_run() -> None:
    """The saturation detector calls metrics older than 200 ms of wall time stale (and the
    pool saturated); a twin's scrape is as fresh as the loop says, so wall time spent between
    two scrapes (a loaded machine) must not age it."""
    import time

    keys = TwinConfig(servers=2).keys()
    epp = EppRouter("epp", keys, 0, model=MODEL)
    for key in keys:
        epp.begin_scrape(key)
        epp.scraped(key, ServerState(0, 0, 0.0, 4, frozenset(), frozenset(), 16, 1000))
    time.sleep(0.25)
    views = list(epp.views.values())
    assert not epp.runtime.saturation.is_saturated(views)
