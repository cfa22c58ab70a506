"""Play a scenario (:mod:`bench.scenario`) in real time or in virtual time, with one path for
fleet, contenders and report.

- **real time** (``--real``): for every load x seed, each contender gets a fresh simulated
  fleet, is started in front of it (Envoy + our EPP, Envoy's own LB policies, a peer router)
  and the open-loop client plays the seed's schedule through it (:func:`run_one`;
  P/D fleets: ``bench.pd_fleet``'s fleets with the prefill/decode roles, sidecars and
  vllm-router's PD mode). The contenders' order alternates between seeds.
- **virtual time** (``--virtual``, the default): the same schedules through the same
  contenders in the twin: the real EPP scheduler and director over the simulator's engine
  model on a virtual clock (:mod:`bench.twin`; P/D fleets: :func:`bench.twin.pd.simulate`).
  Peers are not modelled there: their rows say so.

Both summarise each run into a :class:`bench.report.RunResult` (the first 20% of requests by
arrival reported apart as the cold start), so the tables, paired ratios, 95% intervals and
target verdicts are the same code. A run is saved as ``results.json`` (scenario, its digest,
the settings after overrides, the environment, every run's summary) beside a
``results.md`` table; ``bench report`` turns saved runs into RESULTS.md sections.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench import environment
from bench import report as rp
from bench.report import RunResult, summarize
from bench.scenario import Budget, Contender, Fault, Fleet, PdVariant, Scenario, load_scenario
from bench.twin.cpu import MEASURED_COST, ProcessCpu
from bench.workloads import MODEL, PROFILE, WORKLOADS, RequestSpec, Workload, write_specs

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / ".cache" / "bench-runs"


@dataclass(frozen=True, slots=True)
class Plan:
    """A scenario after the command line's overrides: what one ``bench run`` plays."""

    scenario: Scenario
    mode: str   # "real" | "virtual"
    fleet: Fleet
    workload: Workload
    seeds: tuple[int, ...]
    loads: tuple[float, ...]
    duration: float
    contenders: tuple[Contender, ...]
    jobs: int = 1
    #: the scenario's CPU budgets, the router's as ``--router-cpus`` said
    budget: Budget = field(default_factory=Budget)
    #: virtual time: the EPP's CPU modelled at ``router_cpus`` from these measured costs
    epp_cpu: ProcessCpu | None = None
    epp_cost: str = ""

    def settings(self) -> dict[str, Any]:
        """What the figures depend on besides the seed (kept with the results)."""
        f = self.fleet
        return {"mode": self.mode, "servers": f.servers, "roles": f.roles, "profile": f.profile,
                "profile_override": f.profile != self.scenario.fleet.profile,
                **({"labels": f.pod_labels()} if f.labels else {}),
                "time_scale": f.time_scale if self.mode == "real" else None,
                "workload": self.workload.name, "generator": self.workload.generator,
                "arrivals": self.workload.arrivals, "parameters": self.workload.parameters,
                "duration": self.duration, "seeds": list(self.seeds), "loads": list(self.loads),
                "contenders": [c.name for c in self.contenders],
                **({"baseline": self.scenario.baseline} if self.scenario.baseline else {}),
                "budget": asdict(self.budget) if self.mode == "real" else None,
                "epp_cpu": self.epp_cpu_statement(),
                **({"faults": [f"{f.action} at {f.at:g} s" + (
                    "" if self.mode == "real" else " (not modelled in virtual time)")
                    for f in self.scenario.faults]} if self.scenario.faults else {}),
                **({"speeds": list(f.speeds)} if f.speeds else {})}

    def epp_cpu_statement(self) -> str | None:
        """How the twin models the EPP's CPU (None: free)."""
        c = self.epp_cpu
        if c is None:
            return None
        return (f"{c.cpus:g} CPU, {c.per_request * 1e3:.2f} ms per request, "
                f"{c.per_token * 1e6:.0f} µs per streamed token, {c.idle:.2%} of a CPU for "
                f"scraping the {self.fleet.servers} pods (from {self.epp_cost})")


def plan(scn: Scenario, *, mode: str = "virtual", seeds: Sequence[int] | None = None,
         servers: int | None = None, workload: Workload | None = None,
         loads: Sequence[float] | None = None, duration: float | None = None,
         contenders: Sequence[str] | None = None, jobs: int = 1,
         router_cpus: float | None = None, epp_cost: Path = MEASURED_COST,
         time_scale: float | None = None, profile: str | None = None) -> Plan:
    """``scn`` with overrides (None: the scenario's own). In virtual time a router CPU
    budget models the EPP's CPU at that budget from ``epp_cost`` (``bench.epp_cpu --save``);
    raises ValueError naming the file when those costs cannot be read."""
    wl = workload or scn.workload
    chosen = scn.contenders
    if contenders:
        known = {c.name: c for c in scn.contenders}
        missing = [n for n in contenders if n not in known]
        if missing:
            raise ValueError(f"{scn.path}: no contender {', '.join(missing)} "
                             f"(the scenario has {', '.join(known)})")
        chosen = tuple(known[n] for n in contenders)
    _check_configs(scn, chosen)
    if mode == "virtual" and (budgeted := [c.name for c in chosen if token_budgets(c)]):
        raise ValueError(f"{scn.path}: {', '.join(budgeted)}: token budgets count wall-clock "
                         "minutes: real time only (run with --real)")
    fleet = scn.fleet.scaled(servers) if servers else scn.fleet
    if mode == "real" and fleet.speeds:
        raise ValueError(f"{scn.path}: fleet.speeds: per-server speeds are modelled in "
                         "virtual time only (run without --real)")
    if time_scale:
        fleet = dataclasses.replace(fleet, time_scale=time_scale)
    if profile and profile != fleet.profile:
        from sim.profiles import get_profile

        get_profile(profile)   # ValueError naming the known ones
        fleet = dataclasses.replace(fleet, profile=profile)
    cpus = scn.budget.router_cpus if router_cpus is None else router_cpus
    cpu = None
    if mode == "virtual" and cpus > 0:
        try:
            cpu = ProcessCpu.measured(epp_cost, cpus, fleet.servers)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{epp_cost}: cannot use the EPP's measured CPU costs: "
                             f"{type(e).__name__}: {e}") from None
    return Plan(scn, mode, fleet, wl, tuple(seeds) if seeds else scn.seeds,
                tuple(loads) if loads else (scn.loads if workload is None else wl.loads),
                duration or wl.duration, chosen, jobs,
                dataclasses.replace(scn.budget, router_cpus=cpus), cpu, epp_cost.name)


def token_budgets(c: Contender) -> dict[str, int]:
    """The tokens-per-minute budgets of ``c``'s ``token-budget-admitter`` by fairness id
    (``*``: every other tenant; 0: no budget), its parameters read as the plugin reads them;
    empty without one."""
    import yaml

    from epp.flowcontrol.budgets import TokenBudgetAdmitter
    from shared.plugins import parse_parameters

    if c.epp_config is None:
        return {}
    doc = yaml.safe_load(c.epp_config.read_text()) or {}
    for plugin in doc.get("plugins") or []:
        if isinstance(plugin, dict) and plugin.get("type") == TokenBudgetAdmitter.type_name:
            p = parse_parameters(TokenBudgetAdmitter.parameters_type,
                                 plugin.get("parameters") or {}, label=c.name)
            return {"*": p.tokens_per_minute, **p.tenants}
    return {}


def _check_configs(scn: Scenario, contenders: Sequence[Contender]) -> None:
    """Each EPP config file is read by the EPP's own loader before anything runs; a bad one
    is a ValueError naming the scenario, the contender and the config's own error."""
    from bench.twin.epp_adapter import ConfigError, EppRouter

    for c in contenders:
        if c.epp_config is None:
            continue
        try:
            EppRouter("check", ["127.0.0.1:8000"], 0, config_file=c.epp_config)
        except ConfigError as e:
            raise ValueError(f"{scn.path}: contender {c.name}: epp_config: {e}") from None


# -- virtual time -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Job:
    plan: Plan
    load: float
    seed: int


def _twin_router(c: Contender, keys: list[str], seed: int, cpu: ProcessCpu | None = None,
                 labels: list[dict[str, str]] | None = None) -> Any:
    """The twin's router for ``c`` (None: not modelled, the peers); ``cpu``: each EPP's own
    copy of this process CPU model; ``labels``: each server's extra pod labels."""
    from bench.contenders import TUNED_CONFIG
    from bench.twin.baselines import LeastRequest, Random, RoundRobin
    from bench.twin.epp_adapter import EppRouter
    from bench.twin.replicas import Replicas

    baseline = {"envoy-rr": RoundRobin, "envoy-random": Random, "envoy-lr": LeastRequest}
    if c.kind == "peer":
        return None
    if c.name in baseline:
        return baseline[c.name](c.name, keys, seed)
    if c.replicas:
        return Replicas(c.name, keys, seed, c.replicas, shared=c.store == "valkey",
                        config_file=c.epp_config, cpu=cpu)
    if c.epp_config is None and c.name not in ("epp-default", "epp-tuned"):
        return None
    return EppRouter(c.name, keys, seed, config_file=c.epp_config, model=MODEL,
                     cpu=dataclasses.replace(cpu) if cpu is not None else None,
                     labels=dict(zip(keys, labels, strict=True)) if labels else None,
                     config_text=TUNED_CONFIG if c.name == "epp-tuned" else None)


def _play(c: Contender, fleet: Fleet, seed: int, specs: list[RequestSpec],
          cpu: ProcessCpu | None, res: RunResult) -> list[Any] | None:
    """``specs`` through contender ``c`` on ``fleet`` in the twin (None: not modelled)."""
    from bench.twin.loop import TwinConfig, run

    if fleet.pd:
        return _pd_virtual(fleet, c, seed, specs)
    cfg = TwinConfig(servers=fleet.servers, seed=seed, profile=fleet.profile, model=MODEL,
                     speeds=fleet.speeds, kv_blocks=fleet.kv_blocks)
    router = _twin_router(c, cfg.keys(), seed, cpu, fleet.pod_labels())
    if router is None:
        return None
    stats: dict[str, float] = {}
    outcomes = run(specs, router, cfg, stats)
    res.evictions = int(stats["evictions"])
    return outcomes


def _virtual(job: _Job) -> list[RunResult]:
    """One (load, seed): the schedule, built once, through each contender in the twin."""
    p = job.plan
    specs = p.workload.schedule(job.load, p.duration, job.seed, p.fleet.capacity_servers)
    return [_twin_result(_result(p.workload, job.load, job.seed, p.fleet, c), c, p.fleet, specs,
                         p.workload, p.duration, p.epp_cpu) for c in p.contenders]


def _twin_result(res: RunResult, c: Contender, fleet: Fleet, specs: list[RequestSpec],
                 wl: Workload, duration: float, cpu: ProcessCpu | None) -> RunResult:
    """``res`` summarising ``specs`` (``wl``'s schedule over ``duration``) through ``c`` in
    the twin, or skipped when ``c`` is not modelled there."""
    started = time.monotonic()
    outcomes = _play(c, fleet, res.seed, specs, cpu, res)
    if outcomes is None:
        res.skipped = "not modelled in virtual time (run with --real)"
        return res
    _summarize(res, wl, specs, outcomes, duration)
    res.wall_seconds = time.monotonic() - started
    return res


def twin_run(workload: str | Workload, load: float, servers: int, seed: int, contender: str,
             duration: float, *, config: Path | None = None,
             cpu: ProcessCpu | None = None) -> RunResult:
    """One contender's virtual-time run of ``workload`` (a name of bench/workloads/ or a
    workload) on an aggregated fleet of ``servers`` (``config``: the EPP config of a
    contender that is not built in), the same path ``bench run --virtual`` takes."""
    wl = WORKLOADS[workload] if isinstance(workload, str) else workload
    c, fleet = Contender(contender, epp_config=config), Fleet(servers=servers)
    res = _twin_result(_result(wl, load, seed, fleet, c), c, fleet,
                       wl.schedule(load, duration, seed, servers), wl, duration, cpu)
    if res.skipped:
        raise ValueError(f"{contender!r} is not modelled in virtual time")
    return res


def _pd_virtual(fleet: Fleet, c: Contender, seed: int,
                specs: list[RequestSpec]) -> list[Any] | None:
    from bench.twin.loop import TwinOutcome
    from bench.twin.pd import parse_spill, simulate
    from sim.profiles import get_profile

    if c.name != "aggregated" and c.pd is None:
        return None
    v = c.pd or PdVariant()   # aggregated: no threshold, the default picks
    served = simulate(seed, fleet.roles["prefill"], fleet.roles["decode"],
                      None if c.pd is None else v.threshold, specs=specs,
                      profile=get_profile(fleet.profile), prefill_pick=v.prefill_pick,
                      decode_pick=v.decode_pick, spill=parse_spill(v.spill) if v.spill else None)
    # The twin's requests end in completion order; tags follow the schedule's order.
    by_arrival = sorted(served, key=lambda s: s.arrival)
    return [TwinOutcome(i, s.arrival, 200, s.ttft, s.ttft + s.tpot * max(0, s.output - 1),
                        s.output) for i, s in enumerate(by_arrival)]


# -- real time ----------------------------------------------------------------------------
def _real_contender(c: Contender, p: Plan) -> Any:
    from bench.contenders import Epp, EppReplicas, PeerRouter, all_contenders

    if p.fleet.pd:
        from bench.pd_fleet import PdRouter

        v = c.pd or PdVariant()
        obj: Any = PdRouter(c.name, c.kind, "pd" if c.pd is not None else c.name,
                            p.fleet.roles, v.threshold, v.config)
    elif ":" in c.name:
        peer, _, policy = c.name.partition(":")
        obj = PeerRouter(peer, policy, copies=c.replicas or 1)
    elif c.replicas:
        obj = EppReplicas(c.name, c.replicas, c.store,
                          c.epp_config.read_text() if c.epp_config else None)
    elif c.epp_config is not None:
        obj = Epp(c.name, c.epp_config.read_text())
    else:
        obj = all_contenders()[c.name]
    obj.cpus, obj.gateway_cpus = p.budget.router_cpus, p.budget.gateway_cpus
    return obj


def _real(p: Plan, load: float, seed: int, c: Contender, workdir: Path) -> RunResult:
    b = p.budget
    res: RunResult = run_one(
        p.workload, load, _real_contender(c, p), duration=p.duration, seed=seed,
        servers=p.fleet.servers, time_scale=p.fleet.time_scale, workdir=workdir,
        progress=False, timeout=p.scenario.timeout, fleet_cpus=b.fleet_cpus,
        client_cpus=b.client_cpus, profile=p.fleet.profile, labels=p.fleet.pod_labels(),
        faults=p.scenario.faults, kv_blocks=p.fleet.kv_blocks, kv_events=p.fleet.kv_events,
        budgets=token_budgets(c))
    res.contender, res.kind = c.name, c.kind
    return res


# -- one real-time run (fresh fleet, the contender, the open-loop client) -----------------------
def run_one(workload: Workload, load: float, contender: Any, *, duration: float,
            seed: int, servers: int, time_scale: float, workdir: Path, progress: bool,
            timeout: float, fleet_cpus: float = 0.0, client_cpus: float = 0.0,
            profile: str = PROFILE, labels: list[dict[str, str]] | None = None,
            faults: Sequence[Fault] = (), kv_blocks: int = 0,
            kv_events: bool = False, budgets: dict[str, int] | None = None) -> RunResult:
    """One run: fresh fleet, contender in front, the seed's schedule played open-loop;
    ``fleet_cpus`` / ``client_cpus``: CPU budgets of the simulator and the client (0: none);
    ``labels``: each server's extra pod labels; ``faults``: steps done at their model time
    from the client's start (what each did goes to ``faults.txt`` in ``workdir``);
    ``kv_blocks``, ``kv_events``: :class:`bench.contenders.SimFleet`'s; ``budgets``: the
    contender's token budgets (:func:`token_budgets`), measured from the first full minute
    (or a minute after the last ``kill-store``, when the budgets fail open)."""
    import subprocess

    import orjson

    from bench import cpubudget
    from bench.contenders import SimFleet
    from bench.openloop import Outcome

    specs = workload.schedule(load, duration, seed, servers)
    res = _result(workload, load, seed, Fleet(servers=servers), contender)
    reason = contender.unavailable()
    if reason:
        res.skipped = reason
        return res
    workdir.mkdir(parents=True, exist_ok=True)
    # The schedule is in model seconds; the simulator runs time_scale x slower than a GPU.
    specs = [dataclasses.replace(s, at=s.at * time_scale) for s in specs]
    write_specs(specs, workdir / "requests.jsonl")
    started = time.monotonic()
    sim = SimFleet(workdir / "fleet", size=servers, time_scale=time_scale, seed=seed,
                   cpus=fleet_cpus, profile=profile, labels=labels or [], kv_blocks=kv_blocks,
                   kv_events=kv_events)
    own = contender.own_fleet   # then sim is not started: only its settings are read
    with (contextlib.nullcontext(sim) if own else sim) as fleet, \
            contender.running(fleet, workdir) as url:
        cmd = [sys.executable, "-m", "bench.openloop", "--url", url,
               "--requests", str(workdir / "requests.jsonl"),
               "--out", str(workdir / "outcomes.jsonl"), "--timeout", str(timeout)]
        if progress:
            cmd.append("--progress")
        with contextlib.ExitStack() as stack:
            client = subprocess.Popen(cmd)
            stack.callback(client.kill)   # only if this block fails before it ends
            if faults:
                stack.enter_context(_faults(contender, faults, time_scale, workdir,
                                            None if own else fleet))
            if client_cpus:
                stack.enter_context(cpubudget.CpuBudget(client_cpus)).add(client.pid)
            if client.wait() != 0:
                raise subprocess.CalledProcessError(client.returncode, cmd)
        res.evictions, res.kv_lag = 0 if own else fleet.evictions(), contender.kv_lag()
        debug = contender.debug()
        if debug:
            (workdir / "debug.json").write_text(json.dumps(debug, indent=1))
    res.wall_seconds = time.monotonic() - started
    res.router_cpu, res.router_throttled = contender.cpu_used, contender.throttled
    outcomes = [Outcome(**dict(orjson.loads(line).items()))
                for line in (workdir / "outcomes.jsonl").read_bytes().splitlines()]
    _summarize(res, workload, specs, outcomes, duration, time_scale)
    if faults:
        res.faults = [*(workdir / "faults.txt").read_text().splitlines(),
                      f"{sum(not o.ok for o in outcomes)} of {len(outcomes)} requests failed"]
    if budgets:
        start = max([60.0] + [f.at + 60 for f in faults if f.action == "kill-store"])
        res.budget_use = rp.budget_use(specs, outcomes, budgets, start, duration, time_scale)
    return res


@contextlib.contextmanager
def _faults(contender: Any, faults: Sequence[Fault], time_scale: float,
            workdir: Path, fleet: Any = None) -> Iterator[None]:
    """The fault steps on a thread, timed from now (the client's start, within its import
    time: a fraction of a second); ``restart-server`` acts on ``fleet``, the rest on the
    contender."""
    t0, stop, done = time.monotonic(), threading.Event(), []

    def steps() -> None:
        for f in sorted(faults, key=lambda f: f.at):
            if stop.wait(max(0.0, t0 + f.at * time_scale - time.monotonic())):
                return
            did = (fleet.restart(0) if f.action == "restart-server" and fleet is not None
                   else contender.fault(f.action))
            done.append(f"{time.monotonic() - t0:.2f} s: {did}")

    thread = threading.Thread(target=steps, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        (workdir / "faults.txt").write_text("".join(line + "\n" for line in done))


def load_run(path: Path) -> tuple[str, float, list[RunResult]]:
    """A run saved by ``python -m bench run ... --save`` (``bench/runs/*.json``): the command
    that made it, its arrival window (model seconds) and its results."""
    saved = json.loads(path.read_text())
    return (str(saved["environment"].get("argv", "?")), float(saved["settings"]["duration"]),
            [RunResult(**r) for r in saved["results"]])


def _result(wl: Workload, load: float, seed: int, fleet: Fleet, c: Any) -> RunResult:
    """An empty result of contender ``c`` (its ``name`` and ``kind``) on ``fleet``."""
    return RunResult(wl.name, load, load * wl.capacity(fleet.capacity_servers), c.name, c.kind,
                     seed=seed, servers=fleet.servers)


def _summarize(res: RunResult, wl: Workload, specs: list[RequestSpec], outcomes: list[Any],
               duration: float, time_scale: float = 1.0) -> None:
    """Fill ``res`` from the outcomes of ``specs`` (``wl``'s schedule over ``duration``
    model seconds): per class for a by-class workload, the tenants' fairness for tenants."""
    summarize(res, outcomes, time_scale, tags=[s.tag for s in specs] if wl.by_class else None)
    if wl.generator == "tenants":
        res.jain = rp.tenant_fairness(specs, outcomes, duration, time_scale)
        res.token_shares = rp.token_shares(specs, outcomes, duration / 2, duration, time_scale)


# -- the run ------------------------------------------------------------------------------
def execute(p: Plan, run_dir: Path, *, log: Any = sys.stderr) -> dict[str, Any]:
    """Play ``p``; write ``run_dir/results.json`` (after every real-time run, so a stopped
    run keeps what it did) and ``run_dir/results.md``; return the saved document."""
    from bench import cpubudget

    run_dir.mkdir(parents=True, exist_ok=True)
    env = environment.capture(peers=p.mode == "real")
    if p.mode == "real":
        # What each budget is on this machine (a cgroup quota, or pinning): cpubudget says.
        env["budget"] = cpubudget.statement(asdict(p.budget))
        env["burners"] = p.budget.burners
    started = time.monotonic()
    results: list[RunResult] = []
    doc: dict[str, Any] = {}

    def save() -> None:
        env["loadavg_end"] = environment.loadavg()
        env["wall_seconds"] = round(time.monotonic() - started, 1)
        doc.update(scenario=_rel(p.scenario.path), digest=p.scenario.digest,
                   inputs_digest=p.scenario.inputs_digest,
                   title=p.scenario.title, settings=p.settings(), environment=env,
                   results=[asdict(r) for r in results])
        (run_dir / "results.json").write_text(json.dumps(doc, indent=1))

    if p.mode == "virtual":
        jobs = [_Job(p, load, seed) for load in p.loads for seed in p.seeds]
        with (ProcessPoolExecutor(max_workers=p.jobs) if p.jobs > 1
              else contextlib.nullcontext()) as pool:
            for batch in (pool.map if pool else map)(_virtual, jobs):
                results.extend(batch)
    else:
        with cpubudget.burners(p.budget.burners):
            flip = False
            for load in p.loads:
                for seed in p.seeds:
                    order = list(p.contenders)[::-1 if flip else 1]
                    flip = not flip
                    for c in order:
                        workdir = run_dir / f"{load:g}" / f"seed-{seed}" / c.name.replace(":", "-")
                        try:
                            res = _real(p, load, seed, c, workdir)
                        except Exception as exc:  # a contender that fails to start is a result
                            res = _result(p.workload, load, seed, p.fleet, c)
                            res.skipped = f"failed: {type(exc).__name__}: {exc}"[:300]
                        results.append(res)
                        save()
                        print(_progress(p.scenario.name, res), file=log, flush=True)
        skipped = sorted({r.contender for r in results
                          if r.skipped and not r.skipped.startswith("failed")})
        if skipped:
            print(f"WARNING: NOT RUN here: {', '.join(skipped)} (see the SKIPPED lines)",
                  file=log)
    save()
    (run_dir / "results.md").write_text(section(doc, str(run_dir / "results.json")))
    return doc


def _progress(name: str, r: RunResult) -> str:
    """One real-time run's line on stderr."""
    head = f"{name} load {r.load:g} seed {r.seed} {r.contender} "
    if r.skipped:
        return head + ("" if r.skipped.startswith("failed") else "SKIPPED ") + r.skipped
    cpu = (f", router CPU {r.router_cpu:.1f} s, throttled {r.router_throttled:.1f} s"
           if r.router_cpu else "")
    return (head + f"ok {r.ok}/{r.requests} TTFT p50 {r.ttft_p50:.3f} p90 {r.ttft_p90:.3f} s "
            f"(cold p90 {r.cold_ttft_p90:.3f})  {r.output_tps:.0f} tok/s  hit "
            f"{100 * r.cache_hit:.0f}%  ({r.wall_seconds:.0f} s{cpu})")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# -- the report ---------------------------------------------------------------------------
def section(doc: dict[str, Any], source: str) -> str:
    """The Markdown section of one saved run: heading, how it was made, targets, tables."""
    results = [RunResult(**r) for r in doc["results"]]
    s, env = doc["settings"], doc["environment"]
    fleet = (f"{s['roles']['prefill']} prefill + {s['roles']['decode']} decode servers"
             if s.get("roles") else f"{s['servers']} servers")
    how = ("virtual time (the twin: the real EPP scheduler over the simulator's engine model)"
           if s["mode"] == "virtual" else
           f"real time through Envoy (simulator time scale {s['time_scale']})")
    lines = [heading(doc), "",
             f"<!-- scenario: {doc['scenario']} digest: {doc['digest']} run: {source} -->", "",
             f"Scenario `{doc['scenario']}`; command `{env.get('argv', '?')}`; {how}; "
             f"fleet {fleet} of `vllm-sim` `{s['profile']}`; workload `{s['workload']}` for "
             f"{s['duration']:g} model s; seeds {s['seeds']}; took "
             f"{env.get('wall_seconds', 0):.0f} s wall.", "",
             f"Environment: {environment.line(env)}", ""]
    if s.get("epp_cpu"):
        lines += [f"The EPP's CPU is modelled: {s['epp_cpu']}.", ""]
    if s.get("faults"):
        did = [f"- {r.contender}, seed {r.seed}: {'; '.join(r.faults)}"
               for r in sorted(results, key=lambda r: (r.contender, r.seed)) if r.faults]
        lines += [f"Faults: {'; '.join(s['faults'])}.", "", *did, *([""] if did else [])]
    scenario_path = ROOT / doc["scenario"]
    targets = []
    if scenario_path.is_file():
        scn = load_scenario(scenario_path)
        if scn.description:
            lines[4:4] = [scn.description, ""]
        ran = {*s["contenders"], "best-peer"}
        targets = [t for t in scn.targets if t.ours in ran and t.against in ran]
    baseline = s.get("baseline") or ("aggregated" if s.get("roles") else rp.BASELINE)
    if tl := rp.target_lines(results, targets):
        lines += ["Targets:", "", *tl, ""]
    # a workload file outside bench/workloads: a stand-in for the headings
    wl = WORKLOADS.get(s["workload"]) or SimpleNamespace(
        name=s["workload"], title=s["workload"], description="",
        source="the scenario's own workload file")
    lines += rp.point_sections(results, wl, s["contenders"], baseline=baseline)
    return "\n".join(lines).rstrip() + "\n"


def heading(doc: dict[str, Any]) -> str:
    """A saved run's RESULTS.md heading: the scenario's title and the mode."""
    s = doc["settings"]
    profile = f", `{s['profile']}`" if s.get("profile_override") else ""
    return f"## {doc['title']} ({s['mode']} time, {s['servers']} servers{profile})"


def run_dir_for(scn: Scenario, mode: str) -> Path:
    return RUNS / f"{time.strftime('%Y%m%d-%H%M%S')}-{scn.name}-{mode}-{os.getpid()}"
