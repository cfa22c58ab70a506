"""Issue #28's twin figures as scenarios: a heterogeneous fleet (per-server speeds), tenants
with SLO headers and long decodes, and the report's SLO attainment and calibration of the
EPP's p90 predictions. The twin's engines are the simulator's; the EPP is the real runtime."""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path

import pytest

from bench.report import RunResult, calibration, slo_table, summarize
from bench.runner import _play, plan
from bench.scenario import Contender, ScenarioError, load_scenario
from bench.twin.baselines import RoundRobin
from bench.twin.loop import TwinConfig, TwinOutcome, run
from bench.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "bench" / "scenarios" / "configs"


def scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(("fleet", "where"), [
    ("{servers: 2, speeds: [1.0]}", "fleet.speeds: expected a list of 2 speeds"),
    ("{servers: 2, speeds: [1.0, 0]}", "fleet.speeds[1]: expected a positive number"),
    ("{servers: 2, speeds: fast}", "fleet.speeds: expected a list of 2 speeds"),
    ("{roles: {prefill: 1, decode: 1}, speeds: [1, 1]}", "fleet.speeds: per-server speeds"),
])
def test_bad_speeds_name_the_key(tmp_path: Path, fleet: str, where: str) -> None:
    wl = "pd-mix" if "roles" in fleet else "sharegpt"
    path = scenario(tmp_path, f"title: T\nworkload: {wl}\nfleet: {fleet}\n"
                              "contenders: [epp-default]\n")
    with pytest.raises(ScenarioError, match=rf"^{path}: .*{where}".replace("[", r"\[")
                       .replace("]", r"\]")):
        load_scenario(path)


def test_speeds_scale_the_offered_load_and_run_in_virtual_time_only(tmp_path: Path) -> None:
    path = scenario(tmp_path, """\
        title: T
        workload: sharegpt
        fleet: {servers: 4, speeds: [1, 1, 0.5, 0.5]}
        contenders: [epp-default]
        """)
    scn = load_scenario(path)
    assert scn.fleet.capacity_servers == 3.0
    assert plan(scn, servers=8).fleet.speeds == (1, 1, 0.5, 0.5) * 2
    with pytest.raises(ValueError, match=r"fleet\.speeds: .*virtual time only"):
        plan(scn, mode="real")


def test_a_slow_server_really_is_slow() -> None:
    """Round-robin over a fast and a half-speed server, light load (requests rarely
    overlap): the same requests decode twice as slowly on the second."""
    wl = WORKLOADS["sharegpt"]
    specs = wl.schedule(0.03, 200.0, 1, 2)
    cfg = TwinConfig(servers=2, seed=1, speeds=(1.0, 0.5))
    outcomes = run(specs, RoundRobin("rr", cfg.keys(), 1), cfg)
    tpot: dict[str, list[float]] = {}
    for o in outcomes:
        if o.ok and o.output_tokens > 1 and o.e2e is not None and o.ttft is not None:
            tpot.setdefault(o.pod, []).append((o.e2e - o.ttft) / (o.output_tokens - 1))
    servers = cfg.keys()   # the endpoint keys, fast one first
    fast, slow = (statistics.median(tpot[k]) for k in servers)
    assert slow / fast == pytest.approx(2.0, rel=0.15)


def test_tenants_send_their_slo_headers_and_long_decodes(tmp_path: Path) -> None:
    path = scenario(tmp_path, """\
        title: T
        workload:
          use: tenants
          parameters:
            tenants:
              chat: {share: 1, objective: interactive, slo_ttft_ms: 500, slo_tpot_ms: 25}
              long: {share: 1, objective: standard, output_scale: 4}
        contenders: [epp-default]
        """)
    wl = load_scenario(path).workload
    specs = wl.schedule(0.5, 30.0, 3, 4)
    chat = [s for s in specs if s.tag == "chat/interactive"]
    long = [s for s in specs if s.tag == "long/standard"]
    assert chat and long
    assert all(s.headers["x-slo-ttft-ms"] == "500" and s.headers["x-slo-tpot-ms"] == "25"
               for s in chat)
    assert not any("x-slo-ttft-ms" in s.headers for s in long)
    ratio = (statistics.mean(s.body["max_tokens"] for s in long)
             / statistics.mean(s.body["max_tokens"] for s in chat))
    assert 2.5 < ratio < 6


@pytest.mark.parametrize("bad", ["{share: 1, objective: standard, slo_ttft_ms: 0}",
                                 "{share: 1, objective: standard, slo_tpot: 3}",
                                 "{share: 1, objective: standard, output_scale: -2}"])
def test_bad_tenant_slo_keys_are_refused(tmp_path: Path, bad: str) -> None:
    path = scenario(tmp_path, f"title: T\nworkload: {{use: tenants, parameters: {{tenants: "
                              f"{{a: {bad}}}}}}}\ncontenders: [epp-default]\n")
    with pytest.raises(ScenarioError, match=r"workload\.parameters\.tenants"):
        load_scenario(path)


def _served(start: float, ttft: float, tpot: float, tokens: int = 11, **kw: float | None,
            ) -> TwinOutcome:
    return TwinOutcome(0, start, 200, ttft, ttft + tpot * (tokens - 1), tokens,
                       **kw)  # type: ignore[arg-type]


def test_slo_attainment_counts_every_target_a_request_set_and_errors_as_misses() -> None:
    outcomes = [
        _served(0.0, 0.1, 0.01, slo_ttft=0.5, slo_tpot=0.02),     # meets both
        _served(1.0, 0.6, 0.01, slo_ttft=0.5, slo_tpot=0.02),     # TTFT miss
        _served(2.0, 0.1, 0.03, slo_ttft=0.5, slo_tpot=0.02),     # TPOT miss
        _served(3.0, 0.9, 0.05),                                  # no SLO: not counted
        TwinOutcome(0, 4.0, 429, slo_ttft=0.5),                   # refused: a miss
        _served(5.0, 0.2, 0.05, slo_ttft=0.5),                    # TTFT-only SLO: met
    ]
    res = summarize(RunResult("w", 1.0, 1.0, "c", "ours"), outcomes, warmup=0.0)
    assert res.slo_requests == 5
    assert res.slo_attainment == pytest.approx(2 / 5)


def test_calibration_judges_the_quantile_predictions_against_what_was_measured() -> None:
    # TPOTs 1..100 ms; the p90 prediction 90.5 ms for all: 90 of 100 covered.
    outcomes = [_served(float(i), 0.1, i / 1000, predicted_tpot_q=0.0905,
                        predicted_ttft=0.11, predicted_ttft_q=0.2) for i in range(1, 101)]
    cal = calibration(outcomes)
    assert cal["tpot_coverage"] == pytest.approx(0.90)
    assert cal["ttft_mape"] == pytest.approx(10.0)
    assert cal["ttft_coverage"] == 1.0
    # The prediction equals the best constant here, so the losses are (nearly) equal.
    assert cal["tpot_pinball"] == pytest.approx(cal["tpot_pinball_const"], rel=0.01)
    assert {"tpot_coverage_t1", "tpot_coverage_t2", "tpot_coverage_t3"} <= set(cal)
    assert calibration([_served(0.0, 0.1, 0.01)]) == {}


def test_the_calibration_table_gives_the_pinball_over_the_constant_seed_by_seed() -> None:
    """Seeds whose losses differ a lot between them but whose predictions beat the constant
    by 10% on each: the marginal intervals overlap, the paired ratio says 0.90."""
    rows = []
    for seed, scale in enumerate((1.0, 1.5, 2.0, 2.5, 3.0)):
        r = RunResult("w", 1.0, 1.0, "epp-predict", "ours", seed=seed, requests=100, ok=100)
        r.calibration = {"tpot_coverage": 0.9, "tpot_pinball": 0.9e-4 * scale,
                         "tpot_pinball_const": 1e-4 * scale}
        rows.append(r)
    table = "\n".join(slo_table(rows, ["epp-predict"]))
    assert "| pinball / constant |" in table
    assert "| 0.90 [0.90, 0.90] |" in table


def test_latency_profiles_learn_in_the_twin_and_carry_their_predictions() -> None:
    """slo-p90 on a 2-server heterogeneous fleet: the producer learns on the virtual clock
    and every served request carries its p90 predictions and SLO, so the report can judge
    them."""
    path = CONFIGS / "slo-p90.yaml"
    c = Contender("slo-p90", epp_config=path)
    scn = load_scenario(ROOT / "bench" / "scenarios" / "slo-routing.yaml")
    fleet = plan(scn, servers=2).fleet
    specs = scn.workload.schedule(0.5, 25.0, 1, fleet.capacity_servers)
    outcomes = _play(c, fleet, 1, specs, None, RunResult("w", 0.5, 1.0, "slo-p90", "ours"))
    assert outcomes is not None
    assert len(outcomes) == len(specs)
    predicted = [o for o in outcomes if o.predicted_tpot_q is not None]
    assert len(predicted) > len(outcomes) / 3
    assert all(o.predicted_tpot_q >= o.predicted_tpot for o in predicted
               if o.predicted_tpot is not None)
    res = summarize(RunResult("w", 0.5, 1.0, "slo-p90", "ours", seed=1), outcomes)
    assert res.slo_requests > 0 and 0 < res.slo_attainment <= 1
    assert "tpot_coverage" in res.calibration
    lines = slo_table([res], ["slo-p90"])
    assert any(line.startswith("| slo-p90 |") for line in lines)


def test_slo_tiers_separate_the_fast_pods_from_the_slow_ones() -> None:
    """slo-tiers' premium chat TPOT SLO lies between a fast pod's and a slow pod's idle
    decode step (only the fast pods can meet it), its api SLO above both (any pod can): the
    design claim the scenario's ratios rest on."""
    import dataclasses

    from sim.costs import decode_step
    from sim.profiles import get_profile

    scn = load_scenario(ROOT / "bench" / "scenarios" / "slo-tiers.yaml")
    prof = get_profile(scn.fleet.profile)
    steps_ms = sorted(1000 * decode_step(dataclasses.replace(prof, speed=s), 1, 900)
                      for s in set(scn.fleet.speeds))
    fast, slow = steps_ms[0], steps_ms[-1]
    tenants = scn.workload.parameters["tenants"]
    assert fast < tenants["chat"]["slo_tpot_ms"] < slow
    assert tenants["api"]["slo_tpot_ms"] > slow
    assert {c.name for c in scn.contenders} >= {"epp-default", "load-active", "slo-p90-least"}
