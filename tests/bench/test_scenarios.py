"""The benchmark toolkit: scenario files are checked strictly, one runner plays a scenario in
virtual and in real time, RESULTS.md sections come from saved runs, peers are pinned.

The newcomer's path is tested as docs/benchmarks.md tells it: write a workload, an
EndpointPickerConfig and a scenario, then ``python -m bench run`` it twice (virtual, real).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from bench.runner import plan
from bench.scenario import SCENARIOS, ScenarioError, load_scenario, scenario_files

ROOT = Path(__file__).resolve().parents[2]

MY_WORKLOAD = """\
name: my-chat
title: My chat traffic
source: our own logs, roughly
generator: lengths
arrivals: poisson
parameters: {input_median: 300, input_sigma: 0.5, input_min: 16, input_max: 1200,
             output_median: 20, output_sigma: 0.4, output_max: 60}
loads: [0.3]
duration: 3
"""

MY_EPC = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 2
"""

MY_SCENARIO = """\
title: My fleet, my workload, my EPP
fleet: {servers: 2}
workload: my-workload.yaml
contenders:
- envoy-rr
- {name: epp-mine, epp_config: my-epc.yaml}
seeds: [7]
loads: [0.3]
timeout: 30
targets:
- {ours: epp-mine, against: envoy-rr, metric: TTFT p90, at_most: 5.0}
"""


def bench(*args: str, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def newcomer(tmp_path: Path) -> Path:
    write(tmp_path, "my-workload.yaml", MY_WORKLOAD)
    write(tmp_path, "my-epc.yaml", MY_EPC)
    return write(tmp_path, "mine.yaml", MY_SCENARIO)


@pytest.fixture(scope="module")
def newcomer_run(tmp_path_factory: pytest.TempPathFactory,
                 ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The newcomer's scenario and its one virtual-time run, which three tests read (each ran
    it before; the run is deterministic: same seed, same schedule)."""
    scenario = newcomer(tmp_path_factory.mktemp("newcomer"))
    return scenario, bench("run", str(scenario), "--virtual", "--jobs", "1")


def results_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("results: "))
    doc: dict[str, Any] = json.loads(Path(line.removeprefix("results: ")).read_text())
    return doc


# -- scenario files -----------------------------------------------------------------------
def test_every_scenario_of_the_repository_loads() -> None:
    files = scenario_files()
    assert {p.stem for p in files} >= {"shared-prefix", "lora", "bursts", "sharegpt", "pd",
                                       "tenants"}
    for path in files:
        scn = load_scenario(path)
        assert scn.contenders and scn.seeds and scn.loads


@pytest.mark.parametrize(("edit", "where"), [
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nsedes: [1]\n", "sedes: unknown key"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nfleet: {servers: 2, gpus: 1}\n",
     "fleet.gpus: unknown key"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nfleet: {servers: x}\n",
     "fleet.servers: expected an integer"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr, {name: e, epp_config: none.yaml}]\n",
     "contenders[1].epp_config: no such file"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-fast]\n",
     "contenders[0].name: unknown contender 'envoy-fast'"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\n"
     "targets: [{ours: epp-x, against: envoy-rr, metric: TTFT p90, at_most: 1}]\n",
     "targets[0].ours: 'epp-x' is not a contender"),
    ("title: T\nworkload: {use: tenants, parameters: {tenants: {a: {share: 1}}}}\n"
     "contenders: [envoy-rr]\n", "workload.parameters.tenants"),
    ("title: T\nworkload: {use: sharegpt, parameters: {input_mean: 3}}\ncontenders: [envoy-rr]\n",
     "workload.parameters.input_mean: unknown key"),
    ("title: T\nworkload: nothing-like-this\ncontenders: [envoy-rr]\n", "workload: not a workload"),
    ("title: T\nworkload: pd-mix\nfleet: {roles: {prefill: 1, decode: 1}, servers: 3}\n"
     "contenders: [aggregated]\n", "fleet.servers: 3 is not prefill + decode"),
    ("title: T\nworkload: pd-mix\nfleet: {roles: {prefill: 1, decode: 1}}\n"
     "contenders: [{name: p, pd: {threshold: 1, config: mine}}]\n",
     "contenders[0].pd.config: 'mine' is not one of"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nbudget: {router_cpu: 1}\n",
     "budget.router_cpu: unknown key"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nfleet: {servers: 2, labels: [{}]}\n",
     "fleet.labels: expected 2 mappings"),
    ("title: T\nworkload: {use: warm-cold, parameters: {classes: {a: {share: 1}}}}\n"
     "contenders: [envoy-rr]\n", "workload.parameters.classes.a: expected {share, prompt_tokens}"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nbaseline: envoy-lr\n",
     "baseline: 'envoy-lr' is not a contender"),
    ("title: T\nworkload: sharegpt\ncontenders: [envoy-rr]\nfaults: [{at: 1, action: reboot}]\n",
     "faults[0].action: 'reboot' is not one of"),
    ("title: T\nworkload: sharegpt\ncontenders: [{name: e, replicas: {count: 2, store: redis}}]\n",
     "contenders[0].replicas.store: 'redis' is not one of valkey, memory"),
])
def test_a_bad_scenario_gets_one_line_naming_file_and_key(tmp_path: Path, edit: str,
                                                          where: str) -> None:
    path = write(tmp_path, "bad.yaml", edit)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert where in message, message
    assert "\n" not in message


def test_the_command_line_answers_a_bad_scenario_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", "title: T\nworkload: sharegpt\ncontenders: [x]\n")
    proc = bench("run", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: contenders[0].name: unknown contender 'x' (built in: envoy-rr, "
        "envoy-lr, envoy-random, epp-default, epp-tuned, vllm-router:<policy>, "
        "sglang-router:<policy>; or give epp_config / pd)"]


def test_workload_overrides_in_a_scenario_change_the_schedule(tmp_path: Path) -> None:
    path = write(tmp_path, "t.yaml", textwrap.dedent("""\
        title: T
        workload:
          use: tenants
          arrivals: {bursts: {period: 4, width: 0.5}}
          parameters: {tenants: {solo: {share: 1, objective: sheddable}}}
          duration: 8
        contenders: [envoy-rr]
        """))
    wl = load_scenario(path).workload
    specs = wl.schedule(0.75, wl.duration, 0, 8)
    assert wl.arrivals == "bursts" and wl.duration == 8
    assert {s.headers["x-gateway-inference-objective"] for s in specs} == {"sheddable"}
    assert {s.tag for s in specs} == {"solo/sheddable"}


def test_servers_override_keeps_the_prefill_share_of_a_pd_fleet() -> None:
    scn = load_scenario(ROOT / "bench" / "scenarios" / "pd.yaml")
    p = plan(scn, servers=32)
    assert p.fleet.roles == {"prefill": 16, "decode": 16} and p.fleet.servers == 32
    assert plan(scn, servers=3).fleet.roles == {"prefill": 2, "decode": 1}


# -- the runner ---------------------------------------------------------------------------
def test_a_newcomer_runs_their_scenario_in_virtual_then_real_time(
        newcomer_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    scenario, virtual_run = newcomer_run
    virtual = results_of(virtual_run)
    real = results_of(bench("run", str(scenario), "--real"))
    for doc, mode in ((virtual, "virtual"), (real, "real")):
        assert doc["settings"]["mode"] == mode
        assert doc["settings"]["workload"] == "my-chat"
        assert doc["settings"]["servers"] == 2
        rows = {r["contender"]: r for r in doc["results"]}
        assert set(rows) == {"envoy-rr", "epp-mine"}
        for r in rows.values():
            assert not r["skipped"] and r["ok"] > 0 and r["errors"] == 0, r
            assert r["seed"] == 7 and r["servers"] == 2
        env = doc["environment"]
        assert env["python"] and env["envoy"].startswith("1.") and env["commit"]
        assert env["loadavg_start"] and env["loadavg_end"]
    # The same seed's schedule in both modes: the same number of requests.
    assert ({r["requests"] for r in virtual["results"]}
            == {r["requests"] for r in real["results"]})
    # Real time serves from the fleet's pods; the EPP contender used the newcomer's config.
    real_rows = {r["contender"]: r for r in real["results"]}
    assert set(real_rows["epp-mine"]["pods"]) <= {"sim-0", "sim-1"}
    assert real["environment"]["peers"]["vllm-router"].endswith("(pinned 0.1.17)")


def test_the_pd_figure_on_my_workload_at_32_servers_is_one_command(tmp_path: Path) -> None:
    """docs/benchmarks.md's promise: python -m bench run pd --servers 32 --workload FILE."""
    mine = write(tmp_path, "my-workload.yaml", MY_WORKLOAD)
    doc = results_of(bench("run", "pd", "--servers", "32", "--workload", str(mine),
                           "--seeds", "1", "--duration", "4", "--jobs", "1"))
    s = doc["settings"]
    assert s["roles"] == {"prefill": 16, "decode": 16} and s["workload"] == "my-chat"
    assert s["loads"] == [0.3]   # the workload's own loads
    rows = {r["contender"]: r for r in doc["results"]}
    for name in ("aggregated", "pd-1024", "pd-spill"):
        assert rows[name]["ok"] > 0 and rows[name]["servers"] == 32, rows[name]
    assert rows["vllm-router-pd"]["skipped"].startswith("not modelled in virtual time")


def test_a_real_time_pd_fleet_runs_on_the_profile_asked_for() -> None:
    """``--profile`` reaches the simulated prefill and decode servers of a real-time P/D run
    (issue #28: P/D through Envoy, the EPP and the sidecars on the calibrated costs)."""
    proc = bench("run", "pd", "--real", "--seeds", "1", "--duration", "2",
                 "--profile", "h100-llama8b", "--contenders", "pd-1024")
    (row,) = results_of(proc)["results"]
    assert row["ok"] > 0 and row["errors"] == 0, row
    run_dir = Path(proc.stderr.split("results: ")[1].split()[0]).parent
    (fleet,) = run_dir.rglob("fleet.yaml")
    assert "profile: h100-llama8b" in fleet.read_text()


def test_the_markdown_table_and_targets_come_with_the_run(
        newcomer_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    _, proc = newcomer_run
    doc = results_of(proc)
    md = Path(proc.stderr.split("results: ")[1].split()[0]).with_name("results.md").read_text()
    assert md.startswith("## My fleet, my workload, my EPP (virtual time, 2 servers)\n")
    assert f"digest: {doc['digest']}" in md
    assert "| epp-mine | 1 |" in md and "| envoy-rr | 1 |" in md
    assert "epp-mine: TTFT p90 / envoy-rr = " in md
    assert "Python " in md and "Envoy 1." in md


def test_peers_are_skipped_in_virtual_time_with_the_reason() -> None:
    scn = load_scenario(ROOT / "bench" / "scenarios" / "shared-prefix.yaml")
    from bench.runner import _Job, _virtual

    p = plan(scn, seeds=[0], duration=3, contenders=["envoy-rr", "vllm-router:cache_aware"])
    rows = {r.contender: r for r in _virtual(_Job(p, 0.3, 0))}
    assert rows["envoy-rr"].ok > 0
    assert rows["vllm-router:cache_aware"].skipped.startswith("not modelled in virtual time")


def test_a_peer_with_replicas_is_skipped_in_virtual_time_too() -> None:
    """precise-prefix's peers run as 4 processes each in real time; in virtual time they are
    peers, not EPP replicas."""
    scn = load_scenario(ROOT / "bench" / "scenarios" / "precise-prefix.yaml")
    from bench.runner import _Job, _virtual

    p = plan(scn, seeds=[11], duration=2, contenders=["sglang-router:cache_aware"])
    (row,) = _virtual(_Job(p, scn.loads[0], 11))
    assert row.skipped.startswith("not modelled in virtual time") and row.requests == 0


def test_the_inputs_digest_covers_the_built_in_default_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of ``epp-default`` depends on the EPP's default config as a run of a config file
    depends on the file: changing the default makes the saved run stale."""
    import bench.scenario

    gamma = load_scenario(SCENARIOS / "gamma.yaml")            # envoy-rr, epp-default
    pd = load_scenario(SCENARIOS / "pd.yaml")                  # config files only
    assert gamma.runs_default_profile and not pd.runs_default_profile
    before = (gamma.inputs_digest, pd.inputs_digest)
    monkeypatch.setattr(bench.scenario, "DEFAULT_CONFIG_YAML",
                        bench.scenario.DEFAULT_CONFIG_YAML + "# changed\n")
    assert gamma.inputs_digest != before[0] and pd.inputs_digest == before[1]


# -- RESULTS.md ---------------------------------------------------------------------------
def test_report_writes_sections_from_saved_runs_and_checks_the_scenario(
        tmp_path: Path, newcomer_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    scenario, proc = newcomer_run
    results = Path(proc.stderr.split("results: ")[1].split()[0])
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "mine-virtual.json").write_text(results.read_text())
    md = write(tmp_path, "RESULTS.md", "# Results\n\n## Hand-written\n\nkept as it is\n")
    args = ("--results", str(md), "--runs", str(runs))
    assert bench("report", "--check", *args).returncode == 1   # not generated yet
    done = bench("report", *args)
    assert done.returncode == 0, done.stderr
    text = md.read_text()
    assert "## Hand-written\n\nkept as it is\n" in text
    assert "## My fleet, my workload, my EPP (virtual time, 2 servers)\n" in text
    assert "| epp-mine | 1 |" in text
    assert bench("report", "--check", *args).returncode == 0

    def check_with(path: Path, text: str, original: str) -> subprocess.CompletedProcess[str]:
        """The check with ``path`` changed to ``text`` (the files are shared with the other
        tests of this module: put back afterwards)."""
        path.write_text(text)
        try:
            return bench("report", "--check", *args)
        finally:
            path.write_text(original)

    # The scenario changed after its run: the check names it.
    check = check_with(scenario, MY_SCENARIO.replace("seeds: [7]", "seeds: [8]"), MY_SCENARIO)
    assert check.returncode == 1
    assert f"{scenario} changed since this run" in check.stderr
    # So did the EPP config it runs (the scenario file itself did not).
    epc = scenario.with_name("my-epc.yaml")
    check = check_with(epc, MY_EPC.replace("weight: 2", "weight: 3"), MY_EPC)
    assert check.returncode == 1
    assert "an EPP config of" in check.stderr and "(my-epc.yaml) changed" in check.stderr
    assert bench("report", "--check", *args).returncode == 0


# -- peers --------------------------------------------------------------------------------
def test_a_peer_of_another_version_than_its_pin_is_not_used(tmp_path: Path) -> None:
    """A real venv holding vllm-router 0.1.16 (a stand-in distribution with the launcher
    module) is refused and named; the pin is what `install` asks pip for."""
    venv = tmp_path / "vllm-router"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "vllm_router").mkdir()
    (site / "vllm_router" / "__init__.py").write_text("")
    (site / "vllm_router" / "launch_router.py").write_text("")
    meta = site / "vllm_router-0.1.16.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-router\nVersion: 0.1.16\n")
    probe = ("from bench.peers import PEERS; p = PEERS['vllm-router']; "
             "print(p.problem())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, text=True, check=True,
                         capture_output=True, env={**os.environ, "BENCH_PEERS_DIR": str(tmp_path)})
    assert out.stdout.splitlines() == ["vllm-router 0.1.16 installed, 0.1.17 pinned"]
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-router\nVersion: 0.1.17\n")
    meta.rename(site / "vllm_router-0.1.17.dist-info")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, text=True, check=True,
                         capture_output=True, env={**os.environ, "BENCH_PEERS_DIR": str(tmp_path)})
    assert out.stdout.splitlines() == ["None"]


# -- make targets and RESULTS.md of the repository ----------------------------------------
def test_every_bench_make_target_runs_modules_that_exist() -> None:
    import importlib.util
    import re

    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^(bench[\w-]*):", makefile, re.M)
    assert {"bench", "bench-run", "bench-report", "bench-compare", "bench-twin"} <= set(targets)
    for target in targets:
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, text=True, capture_output=True,
                             check=True).stdout
        modules = re.findall(r" -m (bench[\w.]*)", dry)
        assert modules, (target, dry)
        for module in modules:
            assert importlib.util.find_spec(module) is not None, (target, module)


def test_make_bench_run_plays_a_scenario() -> None:
    proc = subprocess.run(["make", "bench-run", "SCENARIO=tenants",
                           "RUN_ARGS=--seeds 1 --duration 3 --loads 0.5 --jobs 1"],
                          cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| epp-tuned | 1 |" in proc.stdout


def test_results_are_generated_from_saved_runs() -> None:
    """RESULTS.md's generated sections match bench/runs/ and their scenarios are unchanged
    since those runs (python -m bench report rewrites them; the scenario needs a re-run)."""
    saved = sorted((ROOT / "bench" / "runs").glob("*.json"))
    assert saved
    proc = bench("report", "--check")
    assert proc.returncode == 0, proc.stderr


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (a repeated one gets -1, -2, ...)."""
    import re

    anchors: set[str] = set()
    count: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.*)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{count[slug]}" if slug in count else slug)
        count[slug] = count.get(slug, 0) + 1
    return anchors


def test_the_results_index_links_every_generated_section_and_no_link_is_broken() -> None:
    """RESULTS.md's index is hand-written: a section `bench report` appends for a new
    scenario needs its row there; every in-page link of RESULTS.md and HISTORY.md lands."""
    import re

    docs = {n: (ROOT / "bench" / n).read_text() for n in ("RESULTS.md", "HISTORY.md")}
    index = docs["RESULTS.md"].split("\n## Index\n", 1)[1].split("\n## ", 1)[0]
    generated = re.findall(r"^## (.*)\n\n<!-- scenario:", docs["RESULTS.md"], re.M)
    assert generated
    missing = [h for h in generated if f"[{h}](#" not in index]
    assert not missing, f"RESULTS.md's index has no row for: {missing}"
    for name, text in docs.items():
        for other, slug in re.findall(r"\]\(((?:RESULTS|HISTORY)\.md)?#([^)\s]+)\)", text):
            assert slug in _anchors(docs[other or name]), f"{name}: no heading for #{slug}"


def test_profile_override_reaches_the_fleet_the_saved_settings_and_the_heading() -> None:
    from bench.runner import heading
    from bench.scenario import SCENARIOS

    scn = load_scenario(SCENARIOS / "pd.yaml")
    p = plan(scn, profile="h100-llama8b")
    assert p.fleet.profile == "h100-llama8b" and p.fleet.roles == scn.fleet.roles
    settings = p.settings()
    assert settings["profile"] == "h100-llama8b" and settings["profile_override"]
    doc = {"title": scn.title, "settings": settings}
    assert heading(doc).endswith("(virtual time, 4 servers, `h100-llama8b`)")
    assert not plan(scn).settings()["profile_override"]
    with pytest.raises(ValueError, match="unknown profile 'nope'"):
        plan(scn, profile="nope")


def test_a_pd_scenario_on_a_calibrated_profile_runs_its_engine_in_the_twin() -> None:
    """The P/D twin serves the scenario's profile: the same schedule is faster on
    ``h100-llama8b`` than on ``8b-h100`` (prefill 36 vs 250 us per token)."""
    from bench.runner import _pd_virtual
    from bench.scenario import SCENARIOS, Contender, PdVariant

    scn = load_scenario(SCENARIOS / "pd.yaml")
    specs = scn.workload.schedule(0.28, 20, 0, 4)
    pd = Contender("pd", pd=PdVariant())
    ttft = {}
    for profile in ("8b-h100", "h100-llama8b"):
        fleet = plan(scn, profile=profile).fleet
        out = _pd_virtual(fleet, pd, 0, specs)
        assert out is not None and len(out) == len(specs)
        ttft[profile] = sorted(o.ttft for o in out)[len(out) // 2]
    assert ttft["h100-llama8b"] < 0.5 * ttft["8b-h100"]


def test_fleet_labels_reach_the_epp_in_virtual_time() -> None:
    """v010-context-length labels one pod of four for short contexts: with
    context-length-aware every short request lands on it, without it they spread."""
    from bench.runner import _Job, _virtual

    scn = load_scenario(SCENARIOS / "v010-context-length.yaml")
    results = _virtual(_Job(plan(scn, seeds=[0], duration=8), scn.loads[0], 0))
    spread = {r.contender: r.classes["short"]["pod_cv"] for r in results}
    # every short prompt on one pod: std / mean = sqrt(pods - 1) over the pods that served
    assert spread["epp-context-length"] > 1.4
    assert spread["epp-load"] < 0.5


def test_rollout_steps_are_samples_of_new_prompts() -> None:
    from bench.workloads import WORKLOADS

    specs = WORKLOADS["rollout"].schedule(WORKLOADS["rollout"].loads[0], 8.0, 0, 4)
    steps: dict[str, list[str]] = {}
    for s in specs:
        steps.setdefault(s.tag, []).append(s.body["prompt"])
    assert list(steps) == ["step-0", "step-1"]
    for prompts in steps.values():   # 4 prompts x 8 samples, within one 50 ms burst
        assert len(prompts) == 32 and sorted(prompts.count(p) for p in set(prompts)) == [8] * 4
    assert not set(steps["step-0"]) & set(steps["step-1"])
    assert max(s.at for s in specs if s.tag == "step-0") < 0.05


def test_a_burst_producer_contender_places_each_window_together() -> None:
    """v010-burst-prefix in virtual time: the burst producer's windows (on the twin's event loop)
    keep a step's samples together as a cold-cache load balancer does not."""
    from bench.runner import _Job, _virtual

    scn = load_scenario(SCENARIOS / "v010-burst-prefix.yaml")
    got = {r.contender: r for r in _virtual(_Job(plan(scn, seeds=[0], duration=12),
                                                 scn.loads[0], 0))}
    assert got["epp-burst"].cache_hit > 0.8 > 0.6 > got["epp-queue"].cache_hit
