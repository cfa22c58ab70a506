"""Which prefill:decode split for this workload and SLO: a sweep in virtual time.

``python -m bench advise SCENARIO`` (the scenario gives the workload, the fleet's size and
profile, the seeds, the loads to sweep and the P/D variant: its first ``pd`` contender).
For every split ``P`` prefill + ``N - P`` decode servers (``P`` = 1 .. N-1) and the
aggregated fleet of ``N``, every load and every seed, the schedule is served by
:func:`bench.twin.pd.simulate` (the simulator's engine, :mod:`sim.costs`' step cost, no HTTP);
a request **meets the SLO** when

    TTFT <= max(ttft_floor, ttft_factor x its isolated prefill)   and   TPOT <= tpot

(isolated prefill: :func:`sim.costs.isolated_prefill` of its prompt on an idle server of the
profile). A fleet's **SLO goodput** at a seed is the highest offered rate of the sweep up to
which every rate had at least ``attainment`` of its requests meeting the SLO (0 when the
lowest fails). Per split: the median goodput over seeds, and the paired ratio to the
aggregated fleet (median, and the 95% interval of the geometric mean); the split with the
highest median goodput at the first TPOT bound is the advice (ties: the larger goodput at the
next bound, then fewer encode and more decode servers), unless the aggregated fleet's is
higher. Output tok/s is compared where both keep up: at the rates where both fleets meet the
SLO at the loosest bound, per seed.

A workload with multimodal items (``multimodal``) also gets **encode** splits (issue #29):
``E`` encode servers + ``N - E`` prefill-decode servers (E/PD) and ``E + P + D = N``
(E/P/D), ``E >= 1``; :func:`bench.twin.pd.simulate`'s encode stage plays them. A fleet is
the pair ``(E, P)``: ``(0, 0)`` aggregated, ``(0, P)`` P/D, ``(E, 0)`` E/PD.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.scenario import PdVariant
from bench.stats import geomean_interval
from bench.twin.pd import Served, parse_spill, simulate
from bench.workloads import Workload
from sim.costs import isolated_prefill
from sim.profiles import get_profile


@dataclass(frozen=True, slots=True)
class Slo:
    """The SLO a request meets (seconds) and the share of requests that must meet it."""

    tpot: float = 0.020
    ttft_floor: float = 0.5
    ttft_factor: float = 2.0
    attainment: float = 0.9

    def describe(self) -> str:
        return (f">= {self.attainment:.0%} of requests with TTFT <= max({self.ttft_floor:g} s, "
                f"{self.ttft_factor:g} x isolated prefill) and TPOT <= {self.tpot * 1e3:g} ms")


#: (encode, prefill) servers: (0, 0) the aggregated fleet, (0, P) P/D, (E, 0) E/PD, else E/P/D.
Fleet = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Cell:
    """One fleet at one load and seed: the share meeting each SLO, and output tok/s."""

    fleet: Fleet
    load: float
    seed: int
    met: tuple[float, ...]
    tps: float


@functools.lru_cache(maxsize=65536)
def _isolated(profile_name: str, prompt: int) -> float:
    return isolated_prefill(get_profile(profile_name), prompt)


def met_share(served: Sequence[Served], profile_name: str, slo: Slo) -> float:
    """Share of ``served`` meeting ``slo`` (the twin serves every request of the schedule,
    so ``served`` is all of it)."""
    if not served:
        return 0.0
    ok = sum(1 for s in served
             if s.ttft <= max(slo.ttft_floor, slo.ttft_factor * _isolated(profile_name, s.prompt))
             and s.tpot <= slo.tpot)
    return ok / len(served)


@dataclass(frozen=True, slots=True)
class _Job:
    workload: Workload
    profile: str
    servers: int
    fleet: Fleet
    load: float
    seed: int
    duration: float
    variant: PdVariant
    slos: tuple[Slo, ...]


def _cell(job: _Job) -> Cell:
    specs = job.workload.schedule(job.load, job.duration, job.seed, job.servers)
    v, (encode, prefill) = job.variant, job.fleet
    # prefill 0: the aggregated fleet (threshold None) of the servers left after encode
    served = simulate(job.seed, prefill, job.servers - encode - prefill,
                      v.threshold if prefill else None, specs=specs,
                      profile=get_profile(job.profile), prefill_pick=v.prefill_pick,
                      decode_pick=v.decode_pick, spill=parse_spill(v.spill) if v.spill else None,
                      encode=encode)
    span = max(s.end for s in served) - min(s.arrival for s in served)
    return Cell(job.fleet, job.load, job.seed,
                tuple(met_share(served, job.profile, slo) for slo in job.slos),
                sum(s.output for s in served) / span if span > 0 else 0.0)


def fleets(servers: int, encode: bool) -> list[Fleet]:
    """Every (encode, prefill) fleet of ``servers``: aggregated, P/D splits, and with
    ``encode`` the E/PD and E/P/D ones (at least one server left to decode)."""
    out = [(0, p) for p in range(servers)]
    if encode:
        out += [(e, p) for e in range(1, servers) for p in range(servers - e)]
    return out


def sweep(workload: Workload, profile: str, servers: int, loads: Sequence[float],
          seeds: Sequence[int], duration: float, variant: PdVariant, slos: Sequence[Slo],
          splits: Sequence[Fleet] | None = None, jobs: int = 1) -> list[Cell]:
    """Every (split, load, seed) cell; ``splits``: (encode, prefill) fleets (default
    :func:`fleets`, with encode splits when the workload is multimodal)."""
    if servers < 2:
        raise ValueError("a split needs at least 2 servers")
    chosen = (fleets(servers, workload.generator == "multimodal") if splits is None
              else list(splits))
    todo = [_Job(workload, profile, servers, fleet, load, seed, duration, variant, tuple(slos))
            for fleet in chosen for load in loads for seed in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(_cell, todo, chunksize=4))
    return [_cell(j) for j in todo]


def goodput(cells: Sequence[Cell], fleet: Fleet, seed: int, bound: int, slo: Slo,
            rate_of: dict[float, float]) -> float:
    """The highest rate up to which every swept load met ``slo`` (index ``bound``)."""
    best = 0.0
    for c in sorted((c for c in cells if c.fleet == fleet and c.seed == seed),
                    key=lambda c: c.load):
        if c.met[bound] < slo.attainment:
            break
        best = rate_of[c.load]
    return best


@dataclass(frozen=True, slots=True)
class Row:
    """One fleet's line of the advice."""

    fleet: Fleet
    goodput: tuple[float, ...]                      # median over seeds, per SLO
    ratio: tuple[tuple[float, float, float], ...]   # median, CI low, CI high, per SLO
    tps_ratio: tuple[float, float, float, int]      # median, low, high, pairs

    def name(self, servers: int) -> str:
        """``aggregated (N)``, ``PP+DD``, ``EE+NPD`` (E/PD) or ``EE+PP+DD``."""
        e, p = self.fleet
        if e == 0:
            return f"aggregated ({servers})" if p == 0 else f"{p}P+{servers - p}D"
        return (f"{e}E+{servers - e}PD" if p == 0 else f"{e}E+{p}P+{servers - e - p}D")


def summarize(cells: Sequence[Cell], servers: int, slos: Sequence[Slo],
              rate_of: dict[float, float]) -> tuple[list[Row], Fleet]:
    """Rows per fleet (aggregated first) and the advised (encode, prefill) fleet."""
    seeds = sorted({c.seed for c in cells})
    measured = sorted({c.fleet for c in cells})
    base = {(s, b): goodput(cells, (0, 0), s, b, slos[b], rate_of)
            for s in seeds for b in range(len(slos))}
    by = {(c.fleet, c.load, c.seed): c for c in cells}
    rows = []
    for fleet in measured:
        gp, ratios = [], []
        for b, slo in enumerate(slos):
            mine = {s: goodput(cells, fleet, s, b, slo, rate_of) for s in seeds}
            gp.append(statistics.median(mine.values()))
            paired = [mine[s] / base[s, b] for s in seeds if base[s, b] > 0]
            # A seed where this fleet met the SLO at no swept rate has ratio 0, which has no
            # geometric mean: no interval then (geomean_interval would silently drop it).
            lo, hi = (geomean_interval(paired) if paired and min(paired) > 0
                      else (math.nan, math.nan))
            ratios.append((statistics.median(paired) if paired else math.nan, lo, hi))
        loose = len(slos) - 1
        tps = [by[fleet, c.load, c.seed].tps / c.tps for c in cells
               if c.fleet == (0, 0) and c.tps > 0 and (fleet, c.load, c.seed) in by
               and c.met[loose] >= slos[loose].attainment
               and by[fleet, c.load, c.seed].met[loose] >= slos[loose].attainment]
        tlo, thi = geomean_interval(tps) if len(tps) > 1 else (math.nan, math.nan)
        rows.append(Row(fleet, tuple(gp), tuple(ratios),
                        (statistics.median(tps) if tps else math.nan, tlo, thi, len(tps))))
    splits = [r for r in rows if r.fleet != (0, 0)]
    advised = (max(splits, key=lambda r: (*r.goodput, -r.fleet[0], -r.fleet[1])).fleet
               if splits else (0, 0))
    aggregated = next((r for r in rows if r.fleet == (0, 0)), None)
    if advised != (0, 0) and aggregated is not None and aggregated.goodput > next(
            r for r in rows if r.fleet == advised).goodput:
        advised = (0, 0)   # no split beats the aggregated fleet
    return rows, advised


def table(rows: Sequence[Row], advised: Fleet, servers: int,
          slos: Sequence[Slo]) -> str:
    """The advice as a Markdown table."""
    head = "| fleet | " + " | ".join(
        f"SLO goodput @ TPOT {s.tpot * 1e3:g} ms (req/s) | ratio to aggregated"
        for s in slos) + " | output tok/s ratio where both keep up |"
    lines = [head, "|" + "---|" * (2 + 2 * len(slos))]
    for r in rows:
        name = r.name(servers) + (" **advised**" if r.fleet == advised else "")
        cells = []
        for g, (m, lo, hi) in zip(r.goodput, r.ratio, strict=True):
            cells.append(f"{g:.2f}")
            cells.append("1" if r.fleet == (0, 0) else _ratio(m, lo, hi))
        m, lo, hi, n = r.tps_ratio
        cells.append("1" if r.fleet == (0, 0) else
                     f"{_ratio(m, lo, hi)} ({n} runs)" if n else "no rate where both keep up")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(m: float, lo: float, hi: float) -> str:
    if math.isnan(m):
        return "n/a (aggregated goodput 0)"
    if math.isnan(lo):   # a seed with goodput 0 (or a single seed): no geometric mean
        return f"{m:.2f}x (no interval: goodput 0 in some seeds)"
    return f"{m:.2f}x [{lo:.2f}, {hi:.2f}]"
