"""Engine dialects: which metric families each model server exposes, read into
engine-neutral :class:`EndpointMetrics`.

| engine | waiting | running | KV usage | LoRA | cache config |
|---|---|---|---|---|---|
| vllm | vllm:num_requests_waiting | vllm:num_requests_running | vllm:kv_cache_usage_perc (older vllm:gpu_cache_usage_perc) | vllm:lora_requests_info | vllm:cache_config_info{block_size, num_gpu_blocks} |
| sglang | sglang:num_queue_reqs | sglang:num_running_reqs | sglang:token_usage | - | sglang:cache_config_info{page_size, num_pages} |
| trtllm-serve | trtllm_num_requests_waiting | trtllm_num_requests_running | trtllm_kv_cache_utilization | - | - |
| triton-tensorrt-llm | nv_trt_llm_request_metrics{request_type=waiting} | ...{request_type=scheduled} | nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction} | - | - |

Several samples of one family (e.g. data-parallel engines) are summed for request counts
and averaged for KV usage. Values a server should never report are corrected and reported
as :class:`Anomaly` so the scraper can warn once: NaN/Inf samples are dropped, negative
values become 0, KV usage above 1 becomes 1.
"""  # noqa: E501

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from epp.datastore import EndpointMetrics, EngineType, LoraInfo
from epp.metrics.parser import Sample, ScanResult, scan

#: Largest request count believed (a lying server's 1e308 is clamped to this).
MAX_COUNT = 1 << 31


class MetricsError(ValueError):
    """The page holds none of the engine's load metrics: not a scrape we can use."""


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A corrected value: ``family`` and what was wrong (stable text, for warn-once)."""

    family: str
    problem: str


@dataclass(frozen=True, slots=True)
class ParsedMetrics:
    """The outcome of reading one page."""

    metrics: EndpointMetrics
    anomalies: tuple[Anomaly, ...] = ()
    #: Load families (waiting / running / KV) the page did not have.
    missing: tuple[str, ...] = ()
    malformed_lines: int = 0


LabelPredicate = Callable[[Sample], bool]


@dataclass(frozen=True, slots=True)
class Dialect:
    """Metric family names of one engine; ``*_where`` narrows samples by label."""

    #: The engine (a custom ``engineConfigs`` name is a plain string).
    engine: EngineType | str
    waiting: str
    running: str
    kv_usage: tuple[str, ...]
    waiting_where: LabelPredicate | None = None
    running_where: LabelPredicate | None = None
    kv_where: LabelPredicate | None = None
    lora_info: str | None = None
    cache_config: str | None = None
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    #: Block size / block count read as a gauge's value (engines without an info gauge).
    block_size_gauge: str | None = None
    block_size_where: LabelPredicate | None = None
    num_blocks_gauge: str | None = None
    num_blocks_where: LabelPredicate | None = None

    @property
    def name(self) -> str:
        """The engine's name (``vllm``, or an ``engineConfigs`` name)."""
        return self.engine.value if isinstance(self.engine, EngineType) else self.engine

    @property
    def families(self) -> tuple[str, ...]:
        """Families read on every scrape (fallback KV names only when the first is absent:
        each family costs one pass over the page)."""
        names = [self.waiting, self.running, self.kv_usage[0]]
        if self.lora_info:
            names.append(self.lora_info)
        if self.cache_config:
            names.append(self.cache_config)
        names += [g for g in (self.block_size_gauge, self.num_blocks_gauge) if g]
        return tuple(dict.fromkeys(names))


def _label_is(name: str, value: str) -> LabelPredicate:
    return lambda s: s.labels.get(name) == value


def _labels_are(labels: Mapping[str, str]) -> LabelPredicate | None:
    if not labels:
        return None
    items = tuple(labels.items())
    return lambda s: all(s.labels.get(k) == v for k, v in items)


_SPEC = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?:"([^"]*)"|([^",}\s]+))\s*$')


def parse_spec(text: str) -> tuple[str, dict[str, str]]:
    """A metric specification as upstream writes it (a PromQL selector with ``=`` matchers
    only, quotes optional): ``nv_trt_llm_request_metrics{request_type=waiting}`` → the family
    and the labels a sample must have. ValueError names what is wrong."""
    m = _SPEC.match(text)
    if not m:
        raise ValueError(f"invalid metric specification {text!r} (use name or "
                         f"name{{label=value,...}})")
    labels: dict[str, str] = {}
    body = (m.group(2) or "").strip()
    for part in filter(None, (p.strip() for p in body.split(","))) if body else ():
        lm = _MATCHER.match(part)
        if not lm:
            raise ValueError(f"invalid label matcher {part!r} in metric specification "
                             f"{text!r} (only label=value)")
        labels[lm.group(1)] = lm.group(2) if lm.group(2) is not None else lm.group(3)
    return m.group(1), labels


@dataclass(frozen=True, slots=True)
class EngineSpecs:
    """One engine's metric specifications (upstream's ``engineConfigs`` entry and the
    deprecated ``--*-metric`` flags); an empty spec means "not read"."""

    queued: str = ""
    running: str = ""
    kv_usage: str = ""
    lora: str = ""
    cache_info: str = ""
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    block_size: str = ""
    num_blocks: str = ""


def dialect_from_specs(engine: EngineType | str, specs: EngineSpecs) -> Dialect:
    """A :class:`Dialect` reading the families ``specs`` names; ValueError on a bad spec or
    when none of queued / running / KV usage is given."""
    if not (specs.queued or specs.running or specs.kv_usage):
        raise ValueError("give at least one of queuedRequestsSpec, runningRequestsSpec, "
                         "kvUsageSpec")

    def one(text: str) -> tuple[str, LabelPredicate | None]:
        if not text:
            return "", None
        family, labels = parse_spec(text)
        return family, _labels_are(labels)

    (waiting, w_where), (running, r_where), (kv, kv_where) = (
        one(specs.queued), one(specs.running), one(specs.kv_usage))
    lora, cache = one(specs.lora)[0], one(specs.cache_info)[0]
    (bs, bs_where), (nb, nb_where) = one(specs.block_size), one(specs.num_blocks)
    # An unread family is one no page has: it reads as missing.
    return Dialect(engine, waiting=waiting or "-", running=running or "-",
                   kv_usage=(kv or "-",), waiting_where=w_where, running_where=r_where,
                   kv_where=kv_where, lora_info=lora or None, cache_config=cache or None,
                   block_size_label=specs.block_size_label or "block_size",
                   num_blocks_label=specs.num_blocks_label or "num_gpu_blocks",
                   block_size_gauge=bs or None, block_size_where=bs_where,
                   num_blocks_gauge=nb or None, num_blocks_where=nb_where)


def with_overrides(base: Dialect, specs: Mapping[str, str]) -> Dialect:
    """``base`` with some families replaced (the deprecated metric-name flags: keys
    ``queued``, ``running``, ``kv_usage``, ``lora``, ``cache_info``; an empty spec turns
    that metric off)."""
    changes: dict[str, object] = {}
    for key, text in specs.items():
        # An empty spec means "not read", as upstream's empty flag value does.
        family, labels = parse_spec(text) if text.strip() else ("-", {})
        where = _labels_are(labels)
        if key == "queued":
            changes.update(waiting=family, waiting_where=where)
        elif key == "running":
            changes.update(running=family, running_where=where)
        elif key == "kv_usage":
            changes.update(kv_usage=(family,), kv_where=where)
        elif key == "lora":
            changes.update(lora_info=None if family == "-" else family)
        elif key == "cache_info":
            changes.update(cache_config=None if family == "-" else family)
        else:
            raise ValueError(f"unknown metric {key!r}")
    return replace(base, **changes)  # type: ignore[arg-type]


DIALECTS: dict[EngineType, Dialect] = {
    EngineType.VLLM: Dialect(
        EngineType.VLLM,
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lora_info="vllm:lora_requests_info",
        cache_config="vllm:cache_config_info",
    ),
    EngineType.SGLANG: Dialect(
        EngineType.SGLANG,
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage=("sglang:token_usage",),
        cache_config="sglang:cache_config_info",
        block_size_label="page_size",
        num_blocks_label="num_pages",
    ),
    EngineType.TRTLLM_SERVE: Dialect(
        EngineType.TRTLLM_SERVE,
        waiting="trtllm_num_requests_waiting",
        running="trtllm_num_requests_running",
        kv_usage=("trtllm_kv_cache_utilization",),
        block_size_gauge="trtllm_kv_cache_tokens_per_block",
        num_blocks_gauge="trtllm_kv_cache_max_blocks",
    ),
    EngineType.TRITON_TRTLLM: Dialect(
        EngineType.TRITON_TRTLLM,
        waiting="nv_trt_llm_request_metrics",
        running="nv_trt_llm_request_metrics",
        kv_usage=("nv_trt_llm_kv_cache_block_metrics",),
        waiting_where=_label_is("request_type", "waiting"),
        running_where=_label_is("request_type", "scheduled"),
        kv_where=_label_is("kv_cache_block_type", "fraction"),
        block_size_gauge="nv_trt_llm_kv_cache_block_metrics",
        block_size_where=_label_is("kv_cache_block_type", "tokens_per"),
        num_blocks_gauge="nv_trt_llm_kv_cache_block_metrics",
        num_blocks_where=_label_is("kv_cache_block_type", "max"),
    ),
}


class _Reader:
    def __init__(self, text: str, scanned: ScanResult) -> None:
        self.text = text
        self.families = scanned.families
        self.anomalies: list[Anomaly] = []

    def values(self, family: str, where: LabelPredicate | None) -> list[float] | None:
        samples = self.families.get(family)
        if samples is None:
            return None
        out: list[float] = []
        for s in samples:
            if where is not None and not where(s):
                continue
            v = s.value
            if not math.isfinite(v):
                self.anomalies.append(Anomaly(family, "non-finite value dropped"))
                continue
            if v < 0:
                self.anomalies.append(Anomaly(family, "negative value clamped to 0"))
                v = 0.0
            out.append(v)
        return out or None

    def count(self, family: str, where: LabelPredicate | None) -> int | None:
        vals = self.values(family, where)
        if vals is None:
            return None
        total = sum(vals)
        # Finite samples can still sum past any int (1e308 + 1e308 = inf).
        if total > MAX_COUNT:
            self.anomalies.append(Anomaly(family, f"value above {MAX_COUNT} clamped"))
            return MAX_COUNT
        return round(total)

    def fraction(self, families: tuple[str, ...], where: LabelPredicate | None) -> float | None:
        for i, family in enumerate(families):  # first family present wins (newest name first)
            if i > 0 and family not in self.families:
                self.families.update(scan(self.text, (family,)).families)
            vals = self.values(family, where)
            if vals is None:
                continue
            v = sum(vals) / len(vals)
            if v > 1.0:
                self.anomalies.append(Anomaly(family, "value above 1 clamped to 1"))
                v = 1.0
            return v
        return None


def _lora(samples: list[Sample] | None) -> LoraInfo | None:
    """The newest ``lora_requests_info`` sample (its value is the update timestamp)."""
    if not samples:
        return None
    newest = max(samples, key=lambda s: s.value if math.isfinite(s.value) else -math.inf)
    labels = newest.labels
    try:
        max_lora = int(labels.get("max_lora", "0") or 0)
    except ValueError:
        max_lora = 0

    def names(key: str) -> frozenset[str]:
        return frozenset(x.strip() for x in labels.get(key, "").split(",") if x.strip())

    return LoraInfo(max_lora, names("running_lora_adapters"), names("waiting_lora_adapters"))


def _int_label(samples: list[Sample] | None, label: str) -> int | None:
    if not samples:
        return None
    raw = samples[-1].labels.get(label)
    try:
        value = int(float(raw)) if raw else None
    except (ValueError, OverflowError):  # "abc", "NaN"; "1e400" (inf)
        return None
    return value if value is not None and value > 0 else None


def _gauge_int(r: _Reader, family: str | None, where: LabelPredicate | None) -> int | None:
    if not family:
        return None
    vals = r.values(family, where)
    if not vals or vals[-1] < 1 or vals[-1] > MAX_COUNT:
        return None
    return int(vals[-1])


def detect_engine(text: str) -> EngineType | None:
    """The engine whose load metrics the page holds (the first, in :data:`DIALECTS` order,
    whose queue family appears), or None. For pods without an engine label whose page is not
    in the expected dialect: upstream reads those as the default engine and fails."""
    for engine, d in DIALECTS.items():
        if d.waiting in text:
            return engine
    return None


def parse_metrics(text: str, engine: EngineType | Dialect, now: float) -> ParsedMetrics:
    """Read ``text`` (a ``/metrics`` page) in ``engine``'s dialect (or the given dialect),
    stamped ``now``.

    Raises :class:`MetricsError` when none of waiting / running / KV usage is present.
    """
    d = engine if isinstance(engine, Dialect) else DIALECTS[engine]
    scanned = scan(text, d.families)
    r = _Reader(text, scanned)
    waiting = r.count(d.waiting, d.waiting_where)
    running = r.count(d.running, d.running_where)
    kv = r.fraction(d.kv_usage, d.kv_where)
    missing = tuple(
        name
        for name, value in (("waiting", waiting), ("running", running), ("kv_usage", kv))
        if value is None
    )
    if len(missing) == 3:
        raise MetricsError(
            f"no {d.name} load metrics on the page ({', '.join(d.families[:3])})"
        )
    cache = scanned.families.get(d.cache_config) if d.cache_config else None
    # vLLM and SGLang label their gauges with the served model: that is how the EPP learns
    # which base models the pool serves (for --reject-unknown-models).
    models = frozenset(
        s.labels["model_name"]
        for s in scanned.families.get(d.running, ())
        if "model_name" in s.labels
    )
    metrics = EndpointMetrics(
        waiting=waiting or 0,
        running=running or 0,
        kv_usage=kv or 0.0,
        lora=_lora(scanned.families.get(d.lora_info)) if d.lora_info else None,
        block_size=_int_label(cache, d.block_size_label)
        or _gauge_int(r, d.block_size_gauge, d.block_size_where),
        num_gpu_blocks=_int_label(cache, d.num_blocks_label)
        or _gauge_int(r, d.num_blocks_gauge, d.num_blocks_where),
        models=models,
        updated_at=now,
    )
    return ParsedMetrics(metrics, tuple(dict.fromkeys(r.anomalies)), missing, scanned.malformed)
