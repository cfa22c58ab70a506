"""Results of a routing comparison (real time or twin): per-run summaries, tables with
medians and 95% intervals over seeds, verdicts, plots, and RESULTS.md sections.

One :class:`RunResult` is one (workload, load, seed, contender) run. Its headline figures
leave out the first :data:`WARMUP` of the requests (by arrival): a fresh fleet starts with
empty caches, which says little about a long-running pool; those requests are summarised
apart (``cold_*``). Ratios are paired by seed (:mod:`bench.stats`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.stats import Interval, bootstrap_median, paired_ratios, quantile, verdict

if TYPE_CHECKING:
    from bench.openloop import Outcome
    from bench.scenario import Target
    from bench.workloads import RequestSpec

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "RESULTS.md"
BASELINE = "envoy-rr"
#: Fraction of each run's requests (first by arrival) reported apart as the cold start.
WARMUP = 0.2


@dataclass
class RunResult:
    """One (workload, load, seed, contender) run, summarised. Times are model seconds;
    the figures are over the warm requests (all but the first :data:`WARMUP`)."""

    workload: str
    load: float
    offered_rps: float
    contender: str
    kind: str
    seed: int = 0
    servers: int = 0
    requests: int = 0
    ok: int = 0
    errors: int = 0
    ttft_p50: float = 0.0
    ttft_p90: float = 0.0
    ttft_p99: float = 0.0
    e2e_p90: float = 0.0
    tpot_p50: float = 0.0
    itl_p90: float = 0.0
    output_tps: float = 0.0
    achieved_rps: float = 0.0
    cache_hit: float = 0.0
    cold_requests: int = 0
    cold_ttft_p50: float = 0.0
    cold_ttft_p90: float = 0.0
    wall_seconds: float = 0.0
    #: CPU seconds the router's own process used over the run (0: it has none, or the twin),
    #: and how long its CPU budget held it back (``bench run --router-cpus``)
    router_cpu: float = 0.0
    router_throttled: float = 0.0
    pods: dict[str, int] = field(default_factory=dict)
    #: Per request class (tag, e.g. ``tenant/objective``) of by-class workloads, over the
    #: warm requests: ``{"requests", "errors", "ttft_p90"}``.
    classes: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Tenant workloads: Jain's index of the tenants' goodput in the arrival window
    #: (:func:`tenant_fairness`; 0: not computed)
    jain: float = 0.0
    #: Tenant workloads: each tenant's (tag's) share of the tokens served in the second half
    #: of the arrival window (:func:`token_shares`; empty: not computed)
    token_shares: dict[str, float] = field(default_factory=dict)
    #: Tenants with a token budget: tokens of the requests admitted in each 60 s window
    #: (every 30 s from the first full one) over the budget (:func:`budget_use`)
    budget_use: dict[str, list[float]] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    #: Real time with fault steps: what each step did, then the requests of the whole run
    #: (cold ones too) that failed
    faults: list[str] = field(default_factory=list)
    skipped: str = ""
    #: Warm requests that carried an SLO header, and the share of them that met every
    #: target they set (TTFT and/or TPOT; an error misses).
    slo_requests: int = 0
    slo_attainment: float = 0.0
    #: The EPP's predictions for the picked endpoint against what was measured (warm
    #: requests that had a prediction; empty without a latency model): see
    #: :func:`calibration`.
    calibration: dict[str, float] = field(default_factory=dict)
    #: Blocks the servers evicted over the run (their own counters; 0: not read)
    evictions: int = 0
    #: The EPPs' KV-event lag histogram, bucket bound -> cumulative batches, summed over
    #: replicas (real time, a precise prefix scorer; empty otherwise)
    kv_lag: dict[str, float] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return not self.skipped and self.ok > 0


def summarize(res: RunResult, outcomes: Sequence[Outcome], time_scale: float = 1.0,
              warmup: float = WARMUP, tags: Sequence[str] | None = None) -> RunResult:
    """Fill ``res`` from per-request outcomes (``start`` etc. in wall seconds); with
    ``tags`` (one per outcome, in the same order) also the per-class figures."""
    if tags is not None:
        res.classes = _classes(outcomes, tags, time_scale, warmup)
    ordered = sorted(outcomes, key=lambda o: o.start)
    n_cold = int(len(ordered) * warmup)
    cold, warm = ordered[:n_cold], ordered[n_cold:]
    ok = [o for o in warm if o.ok]
    res.requests, res.ok = len(warm), len(ok)
    res.errors = res.requests - res.ok
    res.error_samples = sorted({o.error or f"HTTP {o.status}" for o in ordered if not o.ok})[:3]
    ttft = [o.ttft / time_scale for o in ok if o.ttft is not None]
    e2e = [o.e2e / time_scale for o in ok if o.e2e is not None]
    res.ttft_p50, res.ttft_p90, res.ttft_p99 = (quantile(ttft, .5), quantile(ttft, .9),
                                                quantile(ttft, .99))
    res.e2e_p90 = quantile(e2e, .9)
    res.tpot_p50 = quantile([t for o in ok if (t := _tpot(o, time_scale)) is not None], .5)
    res.itl_p90 = quantile([g / time_scale for o in ok for g in o.itl], .9)
    if ok:
        first = min(o.start for o in warm)
        last = max(o.start + (o.e2e or 0.0) for o in ok)
        span = max(1e-9, (last - first) / time_scale)
        res.output_tps = sum(o.output_tokens for o in ok) / span
        res.achieved_rps = len(ok) / span
        prompt = sum(o.prompt_tokens for o in ok)
        res.cache_hit = sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0
    cold_ttft = [o.ttft / time_scale for o in cold if o.ok and o.ttft is not None]
    res.cold_requests = len(cold)
    res.cold_ttft_p50, res.cold_ttft_p90 = quantile(cold_ttft, .5), quantile(cold_ttft, .9)
    res.pods = dict(sorted(Counter(o.pod for o in ok).items()))
    _slo(res, warm, time_scale)
    res.calibration = calibration(ok, time_scale)
    return res


def _tpot(o: Outcome, time_scale: float) -> float | None:
    if o.e2e is None or o.ttft is None or o.output_tokens < 2:
        return None
    return (o.e2e - o.ttft) / (o.output_tokens - 1) / time_scale


def _slo(res: RunResult, warm: Sequence[Outcome], time_scale: float) -> None:
    """SLO attainment of the warm requests that set an SLO (``slo_ttft`` / ``slo_tpot``
    attributes of an outcome, seconds): met when it completed within every target it set."""
    def met(o: Outcome, ttft_slo: float | None, tpot_slo: float | None) -> bool:
        tpot = _tpot(o, time_scale)
        return (o.ok and o.ttft is not None
                and (ttft_slo is None or o.ttft / time_scale <= ttft_slo)
                and (tpot_slo is None or tpot is None or tpot <= tpot_slo))

    slos = [(o, getattr(o, "slo_ttft", None), getattr(o, "slo_tpot", None)) for o in warm]
    judged = [met(*x) for x in slos if x[1] is not None or x[2] is not None]
    res.slo_requests = len(judged)
    res.slo_attainment = sum(judged) / len(judged) if judged else 0.0


#: The quantile the EPP's quantile predictions are judged at (its default).
CALIBRATION_QUANTILE = 0.9


def calibration(ok: Sequence[Outcome], time_scale: float = 1.0,
                q: float = CALIBRATION_QUANTILE) -> dict[str, float]:
    """How well the EPP's predictions for the picked endpoints (``predicted_*``
    attributes) matched what the requests measured: ``tpot_coverage`` = share of TPOTs at
    or below their predicted ``q``-quantile, ``tpot_coverage_t1..3`` the same per tercile
    of the predicted value (low, middle, high), ``tpot_pinball`` the mean pinball loss of
    the quantile predictions and ``tpot_pinball_const`` that of the best constant (the
    ``q``-quantile of the measured TPOTs themselves, an oracle: it knows the run's
    distribution), ``ttft_mape`` (%) of the central TTFT, ``ttft_coverage`` of the TTFT
    quantile. Empty when nothing was predicted."""
    from epp.latency.predictor import pinball

    out: dict[str, float] = {}
    pairs = [(p, t) for o in ok if (p := getattr(o, "predicted_tpot_q", None)) is not None
             and (t := _tpot(o, time_scale)) is not None]
    if pairs:
        pairs.sort()
        actual = [t for _, t in pairs]
        out["tpot_n"] = float(len(pairs))
        out["tpot_coverage"] = sum(t <= p for p, t in pairs) / len(pairs)
        k = len(pairs) // 3
        for i, part in enumerate((pairs[:k], pairs[k:2 * k], pairs[2 * k:]), 1):
            if part:
                out[f"tpot_coverage_t{i}"] = sum(t <= p for p, t in part) / len(part)
        out["tpot_pinball"] = pinball([p for p, _ in pairs], actual, q)
        const = quantile(actual, q)
        out["tpot_pinball_const"] = pinball([const] * len(actual), actual, q)
    ttft = [(p, o.ttft / time_scale) for o in ok
            if (p := getattr(o, "predicted_ttft", None)) is not None and o.ttft]
    if ttft:
        out["ttft_mape"] = 100 * statistics.fmean(abs(p - a) / a for p, a in ttft)
    ttft_q = [(p, o.ttft / time_scale) for o in ok
              if (p := getattr(o, "predicted_ttft_q", None)) is not None and o.ttft]
    if ttft_q:
        out["ttft_coverage"] = sum(a <= p for p, a in ttft_q) / len(ttft_q)
    return out


def _classes(outcomes: Sequence[Outcome], tags: Sequence[str], time_scale: float,
             warmup: float) -> dict[str, dict[str, float]]:
    tagged = sorted(zip(outcomes, tags, strict=True), key=lambda ot: ot[0].start)
    warm = tagged[int(len(tagged) * warmup):]
    pods = sorted({o.pod for o, _ in tagged if o.ok})
    out: dict[str, dict[str, float]] = {}
    for tag in sorted(set(tags)):
        mine = [o for o, t in warm if t == tag]
        ttft = [o.ttft / time_scale for o in mine if o.ok and o.ttft is not None]
        # How evenly the class's prompt tokens spread over the pods: std / mean (0: even).
        tokens = [float(sum(o.prompt_tokens for o in mine if o.ok and o.pod == p))
                  for p in pods]
        mean = statistics.fmean(tokens) if tokens else 0.0
        out[tag] = {"requests": len(mine), "errors": sum(not o.ok for o in mine),
                    "ttft_p90": quantile(ttft, .9),
                    "ttft_mean": statistics.fmean(ttft) if ttft else 0.0,
                    "pod_cv": statistics.pstdev(tokens) / mean if mean else 0.0}
    return out


def token_shares(specs: Sequence[RequestSpec], outcomes: Sequence[Outcome], start: float,
                 end: float, time_scale: float = 1.0) -> dict[str, float]:
    """Each tenant's (tag's) share of the tokens served in [``start``, ``end``] model s, as
    a token-fairness policy counts them: a request's prompt tokens (the simulator's count, 4
    bytes a token) when its first token comes in the window, its output tokens spread evenly
    from its first token to its end (the part inside the window)."""
    got = dict.fromkeys(sorted({s.tag for s in specs}), 0.0)
    for spec, o in zip(specs, outcomes, strict=True):
        if not o.ok or o.ttft is None:
            continue
        first = (o.start + o.ttft) / time_scale
        last = (o.start + (o.e2e or o.ttft)) / time_scale
        if start <= first <= end:
            got[spec.tag] += len(str(spec.body.get("prompt", ""))) // 4
        inside = max(0.0, min(last, end) - max(first, start))
        got[spec.tag] += o.output_tokens * (inside / (last - first) if last > first
                                            else float(start <= first <= end))
    total = sum(got.values())
    return {t: v / total for t, v in got.items()} if total else {}


def budget_use(specs: Sequence[RequestSpec], outcomes: Sequence[Outcome],
               budgets: dict[str, int], start: float, end: float,
               time_scale: float = 1.0) -> dict[str, list[float]]:
    """For each tenant with a tokens-per-minute budget (``budgets`` by fairness id, ``*``:
    every other tenant; 0: no budget): the tokens (prompt + output, the server's ``usage``)
    of its requests that were served, by arrival, in each 60 s window starting every 30 s
    from ``start`` to ``end`` - 60 model s, over its budget. A request refused for the budget
    counts nothing."""
    def budget(tenant: str) -> int:
        return budgets.get(tenant, budgets.get("*", 0))

    tokens: dict[str, list[tuple[float, int]]] = {}
    for spec, o in zip(specs, outcomes, strict=True):
        tenant = spec.tag.split("/", 1)[0]
        if budget(tenant) and o.ok:
            tokens.setdefault(tenant, []).append((o.start / time_scale,
                                                  o.prompt_tokens + o.output_tokens))
    starts = [start + 30 * k for k in range(int((end - 60 - start) // 30) + 1)]
    return {tenant: [sum(n for at, n in served if w <= at < w + 60) / budget(tenant)
                     for w in starts]
            for tenant, served in sorted(tokens.items())}


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index of ``xs`` (1: all equal; 0 for none)."""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def tenant_fairness(specs: Sequence[RequestSpec], outcomes: Sequence[Outcome], window: float,
                    time_scale: float = 1.0) -> float:
    """Jain's index of each tenant's (tag's) output tokens received by ``window`` model s
    over its max-min fair share of all of them, the demand being the ``max_tokens`` its
    requests arriving by then asked for: 1 = every tenant got its fair share (0: nothing
    delivered). Token k arrives at start + TTFT + the first k-1 gaps (evenly spread from
    the first token to the last when the gaps were not recorded)."""
    got: dict[str, float] = {}
    asked: dict[str, float] = {}
    for spec, o in zip(specs, outcomes, strict=True):
        if spec.at / time_scale <= window:
            asked[spec.tag] = asked.get(spec.tag, 0) + int(spec.body.get("max_tokens", 0))
        if not o.ok or o.ttft is None:
            continue
        first, n = (o.start + o.ttft) / time_scale, o.output_tokens
        if first > window or n <= 0:
            continue
        k: float = 1
        if o.itl:
            at = o.start + o.ttft
            for gap in o.itl:
                at += gap
                if at / time_scale > window:
                    break
                k += 1
        else:
            last = (o.start + (o.e2e or o.ttft)) / time_scale
            k = n if last <= window or n == 1 else 1 + (n - 1) * (window - first) / (
                last - first)
        got[spec.tag] = got.get(spec.tag, 0.0) + k
    # water-filling: each tenant gets min(demand, an equal split of what is left)
    fair: dict[str, float] = {}
    left, pending = sum(got.get(t, 0.0) for t in asked), dict(asked)
    while pending:
        split = left / len(pending)
        small = {t: d for t, d in pending.items() if d <= split}
        if not small:
            fair.update(dict.fromkeys(pending, split))
            break
        for name, d in small.items():
            fair[name], left = d, left - d
            del pending[name]
    if not fair or not all(fair.values()):
        return 0.0
    return jain([got.get(t, 0.0) / fair[t] for t in asked])


# -- aggregation over seeds ------------------------------------------------------------------
Point = tuple[str, float]   # (workload, load)


def by_point(results: Iterable[RunResult]) -> dict[Point, list[RunResult]]:
    """Results grouped by (workload, load), in first-seen order."""
    out: dict[Point, list[RunResult]] = {}
    for r in results:
        out.setdefault((r.workload, r.load), []).append(r)
    return out


def _names(rows: Iterable[RunResult], order: Sequence[str]) -> list[str]:
    """The contenders of ``rows``: those of ``order`` first, then the others as met."""
    rows = list(rows)
    present = {r.contender for r in rows}
    return [n for n in dict.fromkeys([*order, *(r.contender for r in rows)]) if n in present]


def _each(rows: Sequence[RunResult], order: Sequence[str],
          value: Callable[[RunResult], Any]) -> list[tuple[str, list[Any]]]:
    """Per contender (in ``order``), ``value`` of its usable runs where set (none: left out)."""
    return [(n, xs) for n in _names(rows, order)
            if (xs := [value(r) for r in rows if r.contender == n and r.usable and value(r)])]


def per_seed(rows: Iterable[RunResult], contender: str,
             metric: Callable[[RunResult], float]) -> dict[int, float]:
    """``{seed: metric}`` of one contender's usable runs."""
    return {r.seed: metric(r) for r in rows if r.contender == contender and r.usable}


def ratio(rows: Sequence[RunResult], ours: str, base: str,
          metric: Callable[[RunResult], float]) -> Interval | None:
    """Median over seeds of ``ours / base`` (paired by seed) with its 95% interval."""
    xs = paired_ratios(per_seed(rows, ours, metric), per_seed(rows, base, metric))
    return bootstrap_median(xs) if xs else None


#: What a target may compare, by its name in a scenario: a figure of one run.
_METRICS: dict[str, Callable[[RunResult], float]] = {
    "TTFT p90": attrgetter("ttft_p90"), "output tok/s": attrgetter("output_tps"),
    "TPOT p50": attrgetter("tpot_p50"), "cache hit": attrgetter("cache_hit"),
    "SLO attainment": attrgetter("slo_attainment")}
_ttft90, _tps = _METRICS["TTFT p90"], _METRICS["output tok/s"]


def best_peer(rows: Sequence[RunResult]) -> str | None:
    """The peer with the lowest median TTFT p90 over seeds at this point."""
    meds = {name: statistics.median(vals) for name in {r.contender for r in rows
                                                       if r.kind == "peer"}
            if (vals := list(per_seed(rows, name, _ttft90).values()))}
    return min(meds, key=lambda k: meds[k]) if meds else None


def _med(rows: Sequence[RunResult], name: str, metric: Callable[[RunResult], float],
         fmt: str = ".3f") -> str:
    vals = list(per_seed(rows, name, metric).values())
    return format(statistics.median(vals), fmt) if vals else "n/a"


def _over_seeds(rows: Sequence[RunResult], name: str,
                value: Callable[[RunResult], float | None], fmt: str = ".2f") -> str:
    """Median [95% interval] over seeds of ``value`` of one contender's usable runs, where it
    is not None ("n/a": none)."""
    vals = [v for r in rows if r.contender == name and r.usable and (v := value(r)) is not None]
    return format(bootstrap_median(vals), fmt) if vals else "n/a"


def _iv(iv: Interval | None) -> str:
    return str(iv) if iv else "n/a"


def _row(*cells: str) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cells) + " |"


def _head(*columns: str, text: int = 1) -> list[str]:
    """A markdown table's header: the first ``text`` columns left-aligned, the rest right."""
    return [_row(*columns), "|" + "---|" * text + "---:|" * (len(columns) - text)]


def _listed(intro: str, items: list[str]) -> list[str]:
    """A paragraph ``intro`` and a list of ``items`` under it; nothing without items."""
    return [intro, "", *items, ""] if items else []


def table(rows: Sequence[RunResult], order: Sequence[str] = (),
          baseline: str = BASELINE) -> list[str]:
    """Markdown table of one (workload, load) point: medians over seeds of each contender's
    figures, and the paired ratios (median [95% interval]) to ``baseline`` (round-robin
    unless told) and the best peer."""
    short = "RR" if baseline == BASELINE else baseline
    peer = best_peer(rows)
    out = _head("contender", "seeds", "TTFT p50 s", "TTFT p90 s", "cold TTFT p90 s",
                "out tok/s", "errors", "cache hit", f"TTFT p90 / {short}",
                "TTFT p90 / best peer", f"tok/s / {short}")
    for name in _names(rows, order):
        mine = [r for r in rows if r.contender == name]
        usable = [r for r in mine if r.usable]
        if not usable:
            reason = next((r.skipped for r in mine if r.skipped), "no request completed")
            out.append(f"| {name} | 0 | skipped: {reason} |" + " |" * 8)
            continue
        errors = sum(r.errors for r in usable) / max(1, sum(r.requests for r in usable))
        out.append(_row(
            name, str(len(usable)), _med(rows, name, lambda r: r.ttft_p50),
            _med(rows, name, _ttft90), _med(rows, name, lambda r: r.cold_ttft_p90),
            _med(rows, name, _tps, '.0f'), f"{100 * errors:.1f}%",
            _med(rows, name, lambda r: 100 * r.cache_hit, '.0f') + "%",
            _iv(ratio(rows, name, baseline, _ttft90)),
            _iv(ratio(rows, name, peer, _ttft90)) if peer else 'n/a',
            _iv(ratio(rows, name, baseline, _tps))))
    if peer:
        out += ["", f"Best peer here (lowest median TTFT p90): {peer}."]
    return out


def class_ttft90(klass: str) -> Callable[[RunResult], float]:
    """TTFT p90 of one request class: the tag ``klass``, or every tag whose tenant part
    (before ``/``) is ``klass`` (their requests' p90 is not kept, so several tags read as the
    largest of their p90s); ``all``: the run's own TTFT p90."""
    if klass == "all":
        return _ttft90

    def metric(r: RunResult) -> float:
        p90s = [c["ttft_p90"] for tag, c in r.classes.items()
                if tag == klass or tag.split("/", 1)[0] == klass]
        return max(p90s) if p90s else math.nan
    return metric


def _paired(rows: Sequence[RunResult], t: Target, against: str) -> Interval | None:
    if (t.klass, t.against_class) == ("all", "all"):
        return ratio(rows, t.ours, against, _METRICS[t.metric])
    mine = {s: v for s, v in per_seed(rows, t.ours, class_ttft90(t.klass)).items()
            if not math.isnan(v)}
    base = {s: v for s, v in per_seed(rows, against, class_ttft90(t.against_class)).items()
            if not math.isnan(v)}
    xs = paired_ratios(mine, base)
    return bootstrap_median(xs) if xs else None


def target_lines(results: Sequence[RunResult], targets: Sequence[Target]) -> list[str]:
    """One line per target and point (workload, load) of the results: ratio, interval,
    verdict."""
    lines = []
    for t in targets:
        for (workload, load), rows in by_point(results).items():
            against = best_peer(rows) if t.against == "best-peer" else t.against
            iv = _paired(rows, t, against) if against else None
            sign = "<=" if t.at_most else ">="
            if (t.klass, t.against_class) == ("all", "all"):
                what = f"{workload} @ {load:g}, {t.ours}: {t.metric} / {against or t.against}"
            else:
                what = (f"{workload} @ {load:g}, {t.ours} ({t.klass} requests): {t.metric} / "
                        f"{against or t.against}'s ({t.against_class} requests)")
            if iv is None:
                lines.append(f"- {what} (target {sign} {t.bound:g}): no paired runs")
                continue
            v = verdict(iv, t.bound, at_most=t.at_most)
            lines.append(f"- {what} = {iv} over {iv.n} seeds (target {sign} {t.bound:g}): "
                         f"**{v}**")
    return lines


# -- RESULTS.md --------------------------------------------------------------------------------
def write_section(section: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section starting with the heading ``section`` in ``path``."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    start = old.find(section + "\n")
    if start < 0:
        new = old.rstrip() + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(section))
        rest = "\n" + old[end + 1:] if end >= 0 else ""
        new = old[:start] + text.rstrip() + "\n" + rest
    path.write_text(new)


def point_sections(results: Sequence[RunResult], wl: Any, order: Sequence[str],
                   baseline: str = BASELINE) -> list[str]:
    """The tables of workload ``wl`` (its ``name``, ``title``, ``description`` and
    ``source``), one per load (ratios to ``baseline``)."""
    points = by_point(results)
    lines = [f"### {wl.title}", "", wl.description, f"Source of the shape: {wl.source}.", ""]
    for (_, load), rows in sorted(points.items(), key=lambda p: p[0][1]):
        lines += [f"#### {wl.name} @ load {load:g} ({rows[0].offered_rps:.2f} req/s offered, "
                  f"{rows[0].servers} servers)", "", *table(rows, order, baseline), ""]
        if any(r.classes for r in rows):
            lines += [*class_table(rows, order), ""]
        if fair := [f"{n} {bootstrap_median(xs)}" for n, xs in _each(rows, order,
                                                                   lambda r: r.jain)]:
            lines += ["Jain's index of the tenants' goodput (output tokens within the "
                      "arrival window over max-min fair shares; 1 = fair), median [95% "
                      "interval] over seeds: " + "; ".join(fair) + ".", ""]
        lines += token_share_lines(rows, order)
        lines += budget_lines(rows, order)
        lines += kv_lines(rows, order)
        if any(r.slo_requests or r.calibration for r in rows):
            lines += [*slo_table(rows, order, baseline), ""]
    return lines if points else []


def token_share_lines(rows: Sequence[RunResult], order: Sequence[str]) -> list[str]:
    """Per contender, each tenant's share of the tokens served while all were backlogged and
    Jain's index of the shares (median [95% interval] over seeds); nothing when no run has
    them."""
    return _listed(
        "Tenants' shares of the tokens served (prompt + output) in the second half of the "
        "arrival window, and Jain's index of the shares, median [95% interval] over seeds:",
        [f"- {name}: " + ", ".join(f"{t} {bootstrap_median([s.get(t, 0.0) for s in runs])}"
                                   for t in sorted({t for s in runs for t in s}))
         + f"; Jain {bootstrap_median([jain(list(s.values())) for s in runs])}"
         for name, runs in _each(rows, order, lambda r: r.token_shares)])


def budget_lines(rows: Sequence[RunResult], order: Sequence[str]) -> list[str]:
    """Per contender and tenant with a budget: tokens served per minute over the budget,
    median [95% interval] over seeds of each seed's median window, and the lowest and
    highest window of any seed; nothing when no run has a budget."""
    lines = []
    for name, runs in _each(rows, order, lambda r: r.budget_use):
        for tenant in sorted({t for u in runs for t in u}):
            seeds = [u[tenant] for u in runs if u.get(tenant)]
            every = [x for xs in seeds for x in xs]
            lines.append(f"- {name}, {tenant}: "
                         f"{bootstrap_median([statistics.median(xs) for xs in seeds])}; "
                         f"windows {min(every):.3f} to {max(every):.3f}")
    return _listed("Tokens served per minute over the tenant's budget (60 s windows by "
                   "arrival, every 30 s after the first minute), median [95% interval] over "
                   "seeds of each seed's median window, and the lowest and highest window of "
                   "any seed:", lines)


def kv_lines(rows: Sequence[RunResult], order: Sequence[str]) -> list[str]:
    """Blocks the servers evicted per run (median over seeds) and the EPPs' KV-event lag p99
    over every seed's and replica's batches (one run's p99 is its worst few batches)."""
    out = []
    ev = [f"{n} {statistics.median(xs):,.0f}" for n, xs in _each(rows, order,
                                                                 lambda r: r.evictions)]
    if ev:
        out.append("Blocks the servers evicted per run (their own counters), median over "
                   "seeds: " + "; ".join(ev) + ".")
    lag = []
    for n, hists in _each(rows, order, lambda r: r.kv_lag):
        pooled: Counter[float] = Counter()
        for h in hists:
            pooled.update({float(le): count for le, count in h.items()})
        if (ordered := sorted(pooled.items())) and (total := ordered[-1][1]):
            p99 = next(le for le, c in ordered if c >= 0.99 * total)
            lag.append(f"{n} <= {p99 * 1000:g} ms over {total:,.0f} batches")
    if lag:
        out.append("KV-event lag p99, publish to indexed (the EPPs' histogram over every "
                   "seed and replica; a bucket bound): " + "; ".join(lag) + ".")
    return [*out, ""] if out else []


def _cal(rows: Sequence[RunResult], name: str, key: str, scale: float = 1.0,
         fmt: str = ".3f") -> str:
    """Median [95% interval] over seeds of one calibration figure ("n/a": none)."""
    return _over_seeds(rows, name, lambda r: r.calibration[key] * scale
                       if key in r.calibration else None, fmt)


def _pinball_ratio(r: RunResult) -> float | None:
    """The pinball loss over the best constant's in one run (both judge the same requests,
    so pairing them seed by seed removes the seeds' spread)."""
    c = r.calibration
    return c["tpot_pinball"] / c["tpot_pinball_const"] if c.get("tpot_pinball_const") else None


def slo_table(rows: Sequence[RunResult], order: Sequence[str],
              baseline: str = BASELINE) -> list[str]:
    """SLO attainment (median [95% interval] over seeds, and its paired ratio to
    ``baseline`` and to every other contender of the point) and, for contenders with a
    latency model, the calibration of its predictions (:func:`calibration`)."""
    names = [n for n in _names(rows, order) if any(r.contender == n and r.usable for r in rows)]
    out: list[str] = []
    if any(r.slo_requests for r in rows):
        out += ["SLO attainment (share of the warm requests with an SLO header that met every "
                "target they set; an error misses), median [95% interval] over seeds, and "
                "paired ratios:", "",
                *_head("contender", "SLO attainment", *(f"/ {n}" for n in names))]
        att = _METRICS["SLO attainment"]
        for name in names:
            cells = [_iv(ratio(rows, name, other, att)) if other != name else "-"
                     for other in names]
            out.append(_row(name, _over_seeds(rows, name, att), *cells))
        out.append("")
    if any(r.calibration for r in rows):
        out += [f"Predictions for the picked endpoint (warm requests): TPOT "
                f"p{100 * CALIBRATION_QUANTILE:g} coverage overall and per tercile of the "
                "predicted value, pinball loss (ms) of the quantile and of the best constant "
                "(the run's own quantile) and their ratio seed by seed, TTFT MAPE of the "
                "central prediction and TTFT quantile coverage; median [95% interval] over "
                "seeds:", "",
                *_head("contender", "TPOT coverage", "low / mid / high tercile", "pinball ms",
                       "best constant ms", "pinball / constant", "TTFT MAPE %",
                       "TTFT coverage")]
        for name in names:
            if not any(r.calibration for r in rows if r.contender == name):
                continue
            terciles = " / ".join(_cal(rows, name, f"tpot_coverage_t{i}", fmt=".2f")
                                  for i in (1, 2, 3))
            out.append(_row(name, _cal(rows, name, 'tpot_coverage'), terciles,
                            _cal(rows, name, 'tpot_pinball', 1e3),
                            _cal(rows, name, 'tpot_pinball_const', 1e3),
                            _over_seeds(rows, name, _pinball_ratio),
                            _cal(rows, name, 'ttft_mape', fmt='.1f'),
                            _cal(rows, name, 'ttft_coverage')))
    return out


def class_table(rows: Sequence[RunResult], order: Sequence[str]) -> list[str]:
    """Per request class: TTFT p90 (median over seeds) and the error share, per contender;
    then each class's TTFT mean and how unevenly its prompt tokens spread over the pods."""
    classes = sorted({c for r in rows for c in r.classes})
    names = [n for n in _names(rows, order) if any(r.contender == n and r.classes for r in rows)]
    out = ["Per request class (tenant/objective, or long/short prompts): TTFT p90 s, median "
           "over seeds (errors, all seeds).", "", *_head("contender", *classes)]
    spread = ["", "Per request class: TTFT mean s / how unevenly its prompt tokens spread over "
              "the pods (std / mean; 0: even), medians over seeds.", "",
              *_head("contender", *classes)]
    for name in names:
        mine = [r for r in rows if r.contender == name and r.classes]
        cells = []
        for c in classes:
            stats = [r.classes[c] for r in mine if c in r.classes]
            p90 = statistics.median(s["ttft_p90"] for s in stats) if stats else 0.0
            sent = sum(s["requests"] for s in stats)
            failed = sum(s["errors"] for s in stats)
            cells.append(f"{p90:.3f} ({failed / sent:.0%})" if sent else "n/a")
        out.append(_row(name, *cells))
        # the flow-control twin does not name the pods: no spread to show
        cells = [f"{statistics.median(r.classes[c]['ttft_mean'] for r in have):.3f} / " + (
                 f"{statistics.median(r.classes[c]['pod_cv'] for r in have):.3f}"
                 if any(set(r.pods) != {""} for r in have) else "n/a")
                 if (have := [r for r in mine if "pod_cv" in r.classes.get(c, {})]) else "n/a"
                 for c in classes]
        spread.append(_row(name, *cells))
    # runs saved before the second table's columns existed have none
    return out + spread if any("pod_cv" in s for r in rows for s in r.classes.values()) else out
