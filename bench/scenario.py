"""A benchmark scenario is data: one YAML file in ``bench/scenarios/`` names the fleet, the
workload, the contenders, the seeds and loads, the CPU budget, the targets and the
RESULTS.md section it reports. :func:`load_scenario` reads one strictly: an unknown key, a
wrong type or an unknown name is a :class:`ScenarioError` whose one line names the file and
the key path (``my.yaml: fleet.servers: expected a positive integer, got 'x'``).

The schema (every key but ``title``, ``workload`` and ``contenders`` may be left out)::

    title: Shared prefix                 # the RESULTS.md section heading
    description: one paragraph            # printed under the heading
    fleet:
      servers: 8                          # aggregated fleet size
      roles: {prefill: 2, decode: 2}      # a P/D fleet instead (servers = their sum)
      profile: 8b-h100                    # the simulator profile (sim/profiles.py)
      speeds: [1, 1, 0.6, 0.6]            # virtual time: per server, speed x the profile's
                                          # (a heterogeneous pool; one per server)
      time_scale: 1.0                     # real time only: the simulator runs N x slower
      labels: [{tier: short}, {}, {}, {}]  # more pod labels, one mapping per server (a
                                          # scaled fleet keeps the pattern's proportions)
      kv_blocks: 300                      # each server's KV cache in blocks (the profile's)
      kv_events: true                     # real time: servers publish vLLM KV events, each
                                          # on its own port + KV_EVENTS_OFFSET (1000; EPP:
                                          # podDiscoveryConfig.socketPortOffset: 1000)
    workload: shared-prefix               # bench/workloads/<name>.yaml, or a path
    # or, to change it for this scenario:
    # workload: {use: tenants, arrivals: {bursts: {period: 6, width: 0.5}},
    #            parameters: {tenants: {a: {share: 1, objective: interactive}}},
    #            duration: 20}
    contenders:
    - envoy-rr                            # built in: see CONTENDERS / PD_CONTENDERS
    - {name: epp-mine, epp_config: my-epc.yaml}   # an EndpointPickerConfig file
    - {name: pd-1024, pd: {threshold: 1024}}      # P/D fleets: a P/D EPP variant
    - {name: epp-2-shared, replicas: {count: 2, store: valkey}}  # active-active replicas
      # (store: valkey = one shared Valkey; memory = replicas that share nothing); with
      # epp_config or without (the EPP's default config)
    - {name: sglang-router:cache_aware, replicas: {count: 4}}  # a peer as 4 processes behind
      # Envoy's round robin, each with its own cache tree (how a peer is scaled out)
    baseline: envoy-rr                    # the contender the tables' ratios are to
    seeds: {first: 0, count: 5}           # or a list: [0, 1, 101]
    loads: [0.75]                         # offered load / the workload's nominal capacity
    budget: {router_cpus: 1, gateway_cpus: 1, fleet_cpus: 0, client_cpus: 0, burners: 0}
    timeout: 90                           # real time: per-request limit, wall seconds
    faults:                               # real time: steps at model seconds of the schedule
    - {at: 8, action: kill-replica}       # SIGKILL the first EPP replica (replicas contenders)
    - {at: 6, action: kill-store}         # SIGKILL the replicas' Valkey ...
    - {at: 12, action: restart-store}     # ... and start it again, empty
    - {at: 16, action: restart-server}    # kill server 0, revived 1 s later with a cold cache
    targets:
    - {ours: epp-tuned, against: envoy-rr, metric: TTFT p90, at_most: 0.5}
    - {ours: epp-tuned, against: best-peer, metric: output tok/s, at_least: 1.0}
    # by request class (tag, or its tenant part: ``interactive`` for ``interactive/...``);
    # ``all``: every warm request; TTFT p90 only; ``against_class`` defaults to ``class``
    - {ours: epp-fc, class: interactive, against: envoy-rr, against_class: all,
       metric: TTFT p90, at_most: 0.35}

Paths inside a scenario are relative to the scenario file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bench.workloads import (
    GENERATORS,
    Reader,
    Workload,
    WorkloadError,
    check_parameters,
    find_workload,
    read_arrivals,
)
from epp.config import DEFAULT_CONFIG_YAML

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "scenarios"
CONFIGS = SCENARIOS / "configs"

#: Built-in contenders of an aggregated fleet (``bench.contenders``; peers as
#: ``vllm-router:<policy>`` / ``sglang-router:<policy>``).
CONTENDERS = ("envoy-rr", "envoy-lr", "envoy-random", "epp-default", "epp-tuned")
PEER_NAMES = ("vllm-router", "sglang-router")
#: Built-in contenders of a P/D fleet: the same servers aggregated behind the EPP's default
#: config, and vllm-router's PD mode.
PD_CONTENDERS = ("aggregated", "vllm-router-pd")
#: What a target may compare (``bench.report``'s metrics).
METRICS = ("TTFT p90", "output tok/s", "TPOT p50", "cache hit", "SLO attainment")
#: What a fault step does (``bench.contenders.Contender.fault``).
FAULTS = ("kill-replica", "kill-store", "restart-store", "restart-server")
#: P/D variants: the EPP config family ``bench.pd_fleet`` builds, and the twin's picks.
PD_CONFIGS = ("llm-d", "gie-scorers", "token-load", "spill")
PD_PICKS = ("least", "tokens", "random")


class ScenarioError(ValueError):
    """A scenario file is wrong; the message is one line naming the file and key path."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """The simulated model servers."""

    servers: int = 8
    #: role -> servers, for a P/D fleet (``prefill``, ``decode``); empty: aggregated
    roles: dict[str, int] = field(default_factory=dict)
    profile: str = "8b-h100"
    time_scale: float = 1.0
    #: more pod labels, one mapping per server (empty: none)
    labels: tuple[dict[str, str], ...] = ()
    #: Per server, its speed relative to ``profile`` (virtual time; empty: all 1): a
    #: heterogeneous pool, e.g. H100-like 1.0 and A100-like 0.6 pods.
    speeds: tuple[float, ...] = ()
    #: each server's KV cache in blocks (0: the profile's)
    kv_blocks: int = 0
    #: real time: the servers publish KV events (``bench.contenders.KV_EVENTS_OFFSET``)
    kv_events: bool = False

    @property
    def pd(self) -> bool:
        return bool(self.roles)

    def pod_labels(self) -> list[dict[str, str]]:
        """Each server's extra pod labels (the pattern of ``labels`` stretched to
        ``servers``)."""
        n = len(self.labels)
        return [dict(self.labels[i * n // self.servers]) if n else {}
                for i in range(self.servers)]

    @property
    def capacity_servers(self) -> float:
        """What the fleet is worth in servers of its profile: a load is a fraction of this
        many servers' nominal capacity (the sum of the speeds when they differ)."""
        return sum(self.speeds) if self.speeds else float(self.servers)

    def scaled(self, servers: int) -> Fleet:
        """The same fleet at ``servers`` servers (a P/D fleet keeps its prefill share; per-
        server speeds repeat their pattern)."""
        if not self.pd:
            return replace(self, servers=servers, speeds=tuple(
                self.speeds[i % len(self.speeds)] for i in range(servers) if self.speeds))
        prefill = min(max(1, round(servers * self.roles["prefill"] / self.servers)), servers - 1)
        return replace(self, servers=servers,
                       roles={"prefill": prefill, "decode": servers - prefill})


@dataclass(frozen=True, slots=True)
class PdVariant:
    """A P/D EPP variant (``bench.pd_fleet`` in real time, ``bench.twin.pd`` in virtual
    time): the decider's ``nonCachedTokens``, the config family, the twin's picks and the
    load-aware decider's spill (``TOKENS:REQUESTS``)."""

    threshold: int = 1024
    config: str = "llm-d"
    prefill_pick: str = "least"
    decode_pick: str = "least"
    spill: str = ""


@dataclass(frozen=True, slots=True)
class Contender:
    """One router in front of the fleet: a built-in name, an EPP config file, or a P/D
    variant."""

    name: str
    epp_config: Path | None = None
    pd: PdVariant | None = None
    #: active-active EPP replicas behind one Envoy, or a peer's processes behind Envoy's
    #: round robin (0: one process, as built in)
    replicas: int = 0
    #: their state store: ``valkey`` (one shared Valkey) or ``memory`` (nothing shared)
    store: str = ""

    @property
    def kind(self) -> str:
        """``ours`` (an EPP), ``peer`` or ``baseline``."""
        if self.name.split(":")[0] in PEER_NAMES or self.name == "vllm-router-pd":
            return "peer"
        if (self.name.startswith("epp") or self.epp_config is not None or self.pd is not None
                or self.replicas):
            return "ours"
        return "baseline"


@dataclass(frozen=True, slots=True)
class Target:
    """``ours / against`` on ``metric`` (paired by seed) must stay on one side of
    ``bound``; ``against`` may be ``best-peer``."""

    ours: str
    against: str
    metric: str
    bound: float
    at_most: bool
    #: the request class of ``ours`` / ``against`` the metric is taken over ("all": every
    #: warm request; TTFT p90 only)
    klass: str = "all"
    against_class: str = "all"


@dataclass(frozen=True, slots=True)
class Fault:
    """A step of a real-time run: ``action`` at ``at`` model seconds of the schedule."""

    at: float
    action: str


@dataclass(frozen=True, slots=True)
class Budget:
    """CPU budgets, as ``bench.cpubudget``'s flags (0: none)."""

    router_cpus: float = 0.0
    gateway_cpus: float = 0.0
    fleet_cpus: float = 0.0
    client_cpus: float = 0.0
    burners: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    """One scenario file, checked."""

    path: Path
    name: str
    title: str
    description: str
    fleet: Fleet
    workload: Workload
    contenders: tuple[Contender, ...]
    seeds: tuple[int, ...]
    loads: tuple[float, ...]
    budget: Budget
    timeout: float
    targets: tuple[Target, ...]
    #: the contender the tables' ratios are to ("": envoy-rr, or aggregated on a P/D fleet)
    baseline: str = ""
    #: real time: fault steps, applied to every contender that has what they act on
    faults: tuple[Fault, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes (a saved run records it: ``bench report --check``)."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]

    @property
    def inputs(self) -> tuple[Path, ...]:
        """The EPP config files its contenders run (``epp-tuned``'s and each P/D family's
        too): they decide a run as much as the scenario file does."""
        paths = {c.epp_config for c in self.contenders if c.epp_config is not None}
        paths |= {CONFIGS / "epp-tuned.yaml" for c in self.contenders if c.name == "epp-tuned"}
        paths |= {CONFIGS / f"pd-{c.pd.config}.yaml" for c in self.contenders if c.pd}
        return tuple(sorted(paths))

    @property
    def runs_default_profile(self) -> bool:
        """A contender runs the EPP's built-in default config (``epp-default``)."""
        return any(c.name == "epp-default" and c.epp_config is None for c in self.contenders)

    @property
    def inputs_digest(self) -> str:
        """sha256 over :attr:`inputs` (names and bytes), and the built-in default config when
        :attr:`runs_default_profile`; recorded beside :attr:`digest`."""
        h = hashlib.sha256()
        for path in self.inputs:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        if self.runs_default_profile:
            h.update(b"epp-default\0" + DEFAULT_CONFIG_YAML.encode() + b"\0")
        return h.hexdigest()[:16]


_TOP: dict[str, type | tuple[type, ...]] = {
    "title": str, "description": str, "fleet": dict, "workload": (str, dict),
    "contenders": list, "seeds": (dict, list), "loads": list, "budget": dict,
    "timeout": (int, float), "targets": list, "baseline": str, "faults": list}
_REQUIRED = ("title", "workload", "contenders")


def load_scenario(path: Path | str) -> Scenario:
    """Read and check one scenario file (see the module docstring for the schema)."""
    path = Path(path)
    r = Reader(path, ScenarioError)
    raw = r.keys(r.load(), "", _TOP, _REQUIRED)
    for key, types in _TOP.items():
        if key in raw and not isinstance(raw[key], types):
            raise r.fail(key, f"wrong type {type(raw[key]).__name__}")
    fleet = _fleet(r, raw.get("fleet", {}))
    workload = _workload(r, raw["workload"])
    contenders = _contenders(r, raw["contenders"], fleet)
    names = [c.name for c in contenders]
    if raw.get("baseline", names[0]) not in names:
        raise r.fail("baseline", f"{raw['baseline']!r} is not a contender of this scenario")
    return Scenario(
        path=path, name=path.stem, title=r.text(raw["title"], "title"),
        description=str(raw.get("description", "")).strip(), fleet=fleet, workload=workload,
        contenders=contenders, seeds=_seeds(r, raw.get("seeds", {"first": 0, "count": 5})),
        loads=tuple(r.number(x, f"loads[{i}]", positive=True)
                    for i, x in enumerate(raw.get("loads", list(workload.loads)))) or
        workload.loads,
        budget=_budget(r, raw.get("budget", {})),
        timeout=r.number(raw.get("timeout", 90), "timeout", positive=True),
        targets=tuple(_target(r, t, f"targets[{i}]", names)
                      for i, t in enumerate(raw.get("targets", []))),
        baseline=raw.get("baseline", ""),
        faults=tuple(_fault(r, f, f"faults[{i}]") for i, f in enumerate(raw.get("faults", []))))


def _fault(r: Reader, raw: Any, where: str) -> Fault:
    f = r.keys(raw, where, {"at", "action"}, ("at", "action"))
    return Fault(r.number(f["at"], f"{where}.at"), r.one_of(f["action"], f"{where}.action", FAULTS))


def _fleet(r: Reader, raw: Any) -> Fleet:
    from sim.profiles import PROFILES

    f = r.keys(raw, "fleet", {"servers", "roles", "profile", "time_scale", "labels",
                              "speeds", "kv_blocks", "kv_events"})
    roles: dict[str, int] = {}
    if "roles" in f:
        roles_raw = r.keys(f["roles"], "fleet.roles", {"prefill", "decode"}, ("prefill", "decode"))
        roles = {k: r.positive_int(v, f"fleet.roles.{k}") for k, v in roles_raw.items()}
    servers = r.positive_int(f.get("servers", sum(roles.values()) or 8), "fleet.servers")
    if roles and servers != sum(roles.values()):
        raise r.fail("fleet.servers", f"{servers} is not prefill + decode "
                     f"({sum(roles.values())}); leave it out with roles")
    profile = r.one_of(f.get("profile", "8b-h100"), "fleet.profile", sorted(PROFILES))
    for key, what in (("labels", "labels are"), ("speeds", "per-server speeds are"),
                      ("kv_blocks", "a KV cache size is")):
        if key in f and roles:
            raise r.fail(f"fleet.{key}", f"{what} for an aggregated fleet")
    labels = f.get("labels", [])
    if not isinstance(labels, list) or (labels and len(labels) != servers) or any(
            not isinstance(x, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in x.items()) for x in labels):
        raise r.fail("fleet.labels", f"expected {servers} mappings of label to string "
                     "(one per server)")
    speeds: tuple[float, ...] = ()
    if "speeds" in f:
        if not isinstance(f["speeds"], list) or len(f["speeds"]) != servers:
            raise r.fail("fleet.speeds", f"expected a list of {servers} speeds (one per "
                         f"server), got {f['speeds']!r}")
        speeds = tuple(r.number(v, f"fleet.speeds[{i}]", positive=True)
                       for i, v in enumerate(f["speeds"]))
    kv_events = f.get("kv_events", False)
    if not isinstance(kv_events, bool):
        raise r.fail("fleet.kv_events", f"expected true or false, got {kv_events!r}")
    if kv_events and (roles or labels):
        raise r.fail("fleet.kv_events", "KV events are for an aggregated fleet without labels "
                     "(its servers share one address, a port each)")
    return Fleet(servers, roles, profile,
                 r.number(f.get("time_scale", 1.0), "fleet.time_scale", positive=True),
                 tuple(labels), speeds,
                 r.positive_int(f.get("kv_blocks", 0), "fleet.kv_blocks", 0), kv_events)


def _workload(r: Reader, raw: Any) -> Workload:
    spec = {"use": raw} if isinstance(raw, str) else r.keys(
        raw, "workload", {"use", "arrivals", "parameters", "duration"}, ("use",))
    where = "workload.use" if isinstance(raw, dict) else "workload"
    try:
        base = find_workload(r.text(spec["use"], where), r.path.parent)
    except WorkloadError as e:
        raise r.fail(where, str(e)) from None
    params = {**base.parameters, **r.keys(spec.get("parameters", {}), "workload.parameters",
                                          GENERATORS[base.generator][2])}
    check_parameters(r, base.generator, params, "workload.parameters")
    arrivals, period, width = (read_arrivals(r, spec["arrivals"], "workload.arrivals")
                               if "arrivals" in spec
                               else (base.arrivals, base.burst_period, base.burst_width))
    duration = (r.number(spec["duration"], "workload.duration", positive=True)
                if "duration" in spec else base.duration)
    return Workload(base.name, base.title, base.description, base.source, base.generator,
                    arrivals, period, width, params, base.loads, duration)


def _contenders(r: Reader, raw: list[Any], fleet: Fleet) -> tuple[Contender, ...]:
    if not raw:
        raise r.fail("contenders", "expected at least one contender")
    out: list[Contender] = []
    for i, item in enumerate(raw):
        where = f"contenders[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        c = r.keys(item, where, {"name", "epp_config", "pd", "replicas"}, ("name",))
        name = r.text(c["name"], f"{where}.name")
        if "epp_config" in c and "pd" in c:
            raise r.fail(where, "give epp_config or pd, not both")
        peer, _, policy = name.partition(":")
        is_peer = peer in PEER_NAMES and bool(policy)
        if "replicas" in c and (fleet.pd or "pd" in c):
            raise r.fail(f"{where}.replicas", "replicas are for an aggregated fleet")
        if "epp_config" in c and (fleet.pd or is_peer):
            raise r.fail(f"{where}.epp_config", "a P/D fleet takes pd variants" if fleet.pd
                         else "a peer router takes no EPP config")
        config = r.file(c["epp_config"], f"{where}.epp_config") if "epp_config" in c else None
        if "replicas" in c:
            # a peer's copies share nothing: no store
            need = ("count",) if is_peer else ("count", "store")
            rep = r.keys(c["replicas"], f"{where}.replicas", set(need), need)
            r.one_of(rep.get("store", "valkey"), f"{where}.replicas.store", ("valkey", "memory"))
            out.append(Contender(name, epp_config=config, store=rep.get("store", ""),
                                 replicas=r.positive_int(rep["count"], f"{where}.replicas.count")))
        elif "pd" in c:
            if not fleet.pd:
                raise r.fail(f"{where}.pd", "a pd variant needs a P/D fleet (fleet.roles)")
            out.append(Contender(name, pd=_pd(r, c["pd"] or {}, f"{where}.pd")))
        elif config is not None:
            out.append(Contender(name, epp_config=config))
        else:
            known = PD_CONTENDERS if fleet.pd else CONTENDERS
            if name not in known and not (not fleet.pd and is_peer):
                extra = "" if fleet.pd else ", vllm-router:<policy>, sglang-router:<policy>"
                raise r.fail(f"{where}.name", f"unknown contender {name!r} (built in: "
                             f"{', '.join(known)}{extra}; or give epp_config / pd)")
            out.append(Contender(name))
    names = [c.name for c in out]
    for n in names:
        if names.count(n) > 1:
            raise r.fail("contenders", f"{n!r} appears twice")
    return tuple(out)


def _pd(r: Reader, raw: Any, where: str) -> PdVariant:
    p = r.keys(raw, where, {f.name for f in fields(PdVariant)})
    v = PdVariant(**{k: str(x) for k, x in p.items() if k != "threshold"},
                  threshold=r.positive_int(p.get("threshold", 1024), f"{where}.threshold"))
    for key, known in (("config", PD_CONFIGS), ("prefill_pick", PD_PICKS),
                       ("decode_pick", PD_PICKS)):
        r.one_of(getattr(v, key), f"{where}.{key}", known)
    if v.spill:
        from bench.twin.pd import parse_spill

        try:
            parse_spill(v.spill)
        except ValueError as e:
            raise r.fail(f"{where}.spill", str(e)) from None
    return v


def _seeds(r: Reader, raw: Any) -> tuple[int, ...]:
    if isinstance(raw, list):
        if not raw:
            raise r.fail("seeds", "expected at least one seed")
        return tuple(r.positive_int(s, f"seeds[{i}]", 0) for i, s in enumerate(raw))
    s = r.keys(raw, "seeds", {"first", "count"})
    first = r.positive_int(s.get("first", 0), "seeds.first", 0)
    return tuple(range(first, first + r.positive_int(s.get("count", 5), "seeds.count")))


def _budget(r: Reader, raw: Any) -> Budget:
    b = r.keys(raw, "budget", {f.name for f in fields(Budget)})
    cpus = {k: r.number(v, f"budget.{k}") for k, v in b.items() if k != "burners"}
    return Budget(**cpus, burners=r.positive_int(b.get("burners", 0), "budget.burners", 0))


def _target(r: Reader, raw: Any, where: str, names: list[str]) -> Target:
    t = r.keys(raw, where, {"ours", "against", "metric", "at_most", "at_least", "class",
                            "against_class"}, ("ours", "against", "metric"))
    if ("at_most" in t) == ("at_least" in t):
        raise r.fail(where, "give exactly one of at_most, at_least")
    for key in ("ours", "against"):
        if t[key] not in names and not (key == "against" and t[key] == "best-peer"):
            raise r.fail(f"{where}.{key}", f"{t[key]!r} is not a contender of this scenario")
    r.one_of(t["metric"], f"{where}.metric", METRICS)
    at_most = "at_most" in t
    bound = r.number(t["at_most" if at_most else "at_least"],
                     f"{where}.{'at_most' if at_most else 'at_least'}", positive=True)
    klass = t.get("class", "all")
    against_class = t.get("against_class", klass)
    for key, value in (("class", klass), ("against_class", against_class)):
        if not isinstance(value, str) or not value:
            raise r.fail(f"{where}.{key}", f"expected a class name or 'all', got {value!r}")
    if (klass, against_class) != ("all", "all") and t["metric"] != "TTFT p90":
        raise r.fail(f"{where}.metric", "a class target compares TTFT p90 only")
    return Target(t["ours"], t["against"], t["metric"], bound, at_most, klass, against_class)


def scenario_files(directory: Path = SCENARIOS) -> list[Path]:
    """The scenario files of ``directory``, by name."""
    return sorted(directory.glob("*.yaml"))
