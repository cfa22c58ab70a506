"""Seeded workloads for the routing comparison (``bench.runner``) and the twin (``bench.twin``).

The workloads are data: one ``*.yaml`` file in this package per workload (name, title, the
source of its shape, generator, arrivals, parameters, loads, duration). A generator here turns
(parameters, arrival times, seed) into a schedule of streaming completion requests
(:class:`RequestSpec`: arrival offset + body). Same seed -> byte-identical schedule, so every
contender gets exactly the same requests at the same times.

Prompt text is made of 4-byte words because the simulator counts 1 token per 4 UTF-8 bytes
(``sim/tokenizer.py``), so "N tokens" below is exactly what the simulator prefills.

The sizes and the nominal capacities are fixed here, before any comparison (see
``docs/benchmarks.md`` for how they were scaled from the llm-d workload).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# The fleet every contender shares (bench.runner.run_one starts it; see docs/benchmarks.md).
FLEET_SIZE = 8
PROFILE = "8b-h100"
LORA_ADAPTERS = tuple(f"adapter-{i:02d}" for i in range(12))   # 12 adapters > 4 slots/server
HERE = Path(__file__).resolve().parent

#: The InferenceObjectives every benchmark pool declares (name -> priority), so a workload's
#: requests can name one in ``x-gateway-inference-objective``. Negative = sheddable, as
#: upstream v1.5 reads priorities.
OBJECTIVES = {"interactive": 10, "standard": 0, "sheddable": -1}
OBJECTIVE_HEADER = "x-gateway-inference-objective"
#: Upstream's SLO request headers (milliseconds; epp.latency.slo reads them).
SLO_TTFT_HEADER = "x-slo-ttft-ms"
SLO_TPOT_HEADER = "x-slo-tpot-ms"
#: Optional keys of a tenant (``share`` and ``objective`` are required).
TENANT_OPTIONAL = frozenset({"slo_ttft_ms", "slo_tpot_ms", "output_scale", "input_scale"})
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"

# 8b-h100 timing (sim/profiles.py), used only to state nominal capacities.
_ITL, _OVERHEAD, _PER_TOKEN = 0.012, 0.030, 0.00025


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a schedule: send ``body`` to ``path`` at ``at`` seconds (wall)."""

    at: float
    path: str
    body: dict[str, Any]
    tag: str = ""   # prefix group / adapter, for per-class analysis
    #: Extra request headers (e.g. a tenant's fairness id, an objective).
    headers: dict[str, str] = field(default_factory=dict)


def _words(rng: random.Random, tokens: int) -> str:
    # 3 letters + space = 4 bytes = one simulator token; random so prompts never share
    # a prefix by accident.
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(letters) + rng.choice(letters) + rng.choice(letters) + " "
                   for _ in range(tokens))


def _request(at: float, prompt: str, max_tokens: Any, tag: str = "",
             model: str = MODEL) -> RequestSpec:
    """A streaming completion request of ``prompt`` at ``at``."""
    return RequestSpec(at, "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": int(max_tokens), "stream": True,
        "stream_options": {"include_usage": True}}, tag)


def poisson_arrivals(rng: random.Random, rate: float, n: int) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` per second, from 0."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def burst_arrivals(rng: random.Random, rate: float, n: int, *, period: float = 6.0,
                   width: float = 0.5) -> list[float]:
    """Average ``rate``, delivered as one burst every ``period`` s: each burst's
    ``rate x period`` requests arrive uniformly within ``width`` s (a 12x peak by default)."""
    per_burst = max(1, round(rate * period))
    out: list[float] = []
    start = 0.0
    while len(out) < n:
        out.extend(sorted(start + rng.uniform(0, width) for _ in range(per_burst)))
        start += period
    return out[:n]


def gamma_arrivals(rng: random.Random, rate: float, n: int, *, cv: float = 2.0) -> list[float]:
    """``n`` arrival times at average ``rate`` with Gamma-distributed gaps whose coefficient
    of variation is ``cv`` (shape ``1 / cv**2``: vLLM's ``--burstiness`` 0.25 is CV 2; CV 1
    is Poisson)."""
    shape = 1.0 / (cv * cv)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(shape, 1.0 / (rate * shape))
    return out


Params = dict[str, Any]
Generator = Callable[[random.Random, Params, list[float]], list[RequestSpec]]


def _prefill(tokens: float) -> float:
    """Model seconds one server spends prefilling ``tokens`` uncached tokens alone."""
    return float(_OVERHEAD + _ITL + tokens * _PER_TOKEN)


# -- generators: (rng, parameters, arrival times) -> requests ---------------------------------
def shared_prefix(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """Groups of ``per_group`` prompts: a ``system_tokens`` group system prompt + a unique
    ``question_tokens`` question, ``output_tokens`` out; the prompts of each group are
    shuffled over the run. As many groups as the run has room for (n / per_group)."""
    n, per = len(times), int(p["per_group"])
    groups = math.ceil(n / per)
    systems = [_words(rng, int(p["system_tokens"])) for _ in range(groups)]
    order = [g for g in range(groups) for _ in range(per)]
    rng.shuffle(order)
    return [_request(t, systems[g] + _words(rng, int(p["question_tokens"])),
                     p["output_tokens"], f"group-{g}")
            for t, g in zip(times, order[:n], strict=True)]


def _sp_capacity(p: Params) -> float:
    # Ideal routing prefills the system prompt once per group: mean uncached = Q + S / per.
    return 1 / _prefill(p["question_tokens"] + p["system_tokens"] / p["per_group"])


def prefix_pool(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """A fixed pool of ``prefixes`` shared ``prefix_tokens`` prompts, each request one of
    them (Zipf weights ``1 / (k + 1) ** zipf``) + a unique ``question_tokens`` question,
    ``output_tokens`` out: a working set that may exceed the fleet's KV cache."""
    pool = [_words(rng, int(p["prefix_tokens"])) for _ in range(int(p["prefixes"]))]
    weights = [1 / (k + 1) ** float(p["zipf"]) for k in range(len(pool))]
    specs = []
    for t in times:
        k = rng.choices(range(len(pool)), weights)[0]
        specs.append(_request(t, pool[k] + _words(rng, int(p["question_tokens"])),
                              p["output_tokens"], f"prefix-{k}"))
    return specs


def lora_mix(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """``adapters`` adapters (Zipf popularity), unique ``prompt_tokens`` prompts,
    ``output_tokens`` out."""
    adapters = LORA_ADAPTERS[:int(p["adapters"])]
    weights = [1 / (i + 1) ** float(p["zipf"]) for i in range(len(adapters))]
    specs = []
    for t in times:
        adapter = rng.choices(adapters, weights)[0]
        specs.append(_request(t, _words(rng, int(p["prompt_tokens"])), p["output_tokens"],
                              adapter, adapter))
    return specs


def lengths(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """Unique prompts, lognormal input and output lengths (medians, sigmas, clipped)."""
    specs = []
    for t in times:
        prompt = int(min(p["input_max"], max(p["input_min"], rng.lognormvariate(
            math.log(p["input_median"]), p["input_sigma"]))))
        out = int(min(p["output_max"], max(4, rng.lognormvariate(
            math.log(p["output_median"]), p["output_sigma"]))))
        specs.append(_request(t, _words(rng, prompt), out))
    return specs


def tenants(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """The ShareGPT-like lengths from several tenants: each request belongs to a tenant
    drawn by its ``share``, names it in ``x-gateway-inference-fairness-id`` and the tenant's
    InferenceObjective (priority) in ``x-gateway-inference-objective``; tagged
    ``tenant/objective`` for the per-class table. Optional per tenant: ``slo_ttft_ms`` /
    ``slo_tpot_ms`` (sent as ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``, upstream's SLO headers),
    ``output_scale`` (its output lengths x this, still clipped at ``output_max`` x it: a
    tenant of long decodes) and ``input_scale`` (its prompts that many times longer, a new
    unique prompt: a tenant of long prompts)."""
    names = list(p["tenants"])
    shares = [float(p["tenants"][t]["share"]) for t in names]
    specs = []
    for spec in lengths(rng, p, times):
        tenant = rng.choices(names, shares)[0]
        t = p["tenants"][tenant]
        objective = str(t["objective"])
        headers = {FAIRNESS_HEADER: tenant, OBJECTIVE_HEADER: objective}
        for key, header in (("slo_ttft_ms", SLO_TTFT_HEADER), ("slo_tpot_ms", SLO_TPOT_HEADER)):
            if key in t:
                headers[header] = f"{float(t[key]):g}"
        body = spec.body
        if "input_scale" in t:
            tokens = round(len(body["prompt"]) // 4 * float(t["input_scale"]))
            body = {**body, "prompt": _words(rng, max(1, tokens))}
        if "output_scale" in t:
            body = {**body, "max_tokens": max(1, round(body["max_tokens"] *
                                                       float(t["output_scale"])))}
        specs.append(RequestSpec(spec.at, spec.path, body, tag=f"{tenant}/{objective}",
                                 headers=headers))
    return specs


def _lengths_capacity(p: Params) -> float:
    return 1 / _prefill(p["input_median"] * math.exp(p["input_sigma"] ** 2 / 2))


def multi_turn(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """Conversations of ``turns`` turns over a ``system_tokens`` system prompt: each turn's
    prompt is the previous turn's prompt + its ``output_tokens`` answer + a new
    ``question_tokens`` question, so a router that keeps a conversation on one server
    prefills only the new part. Conversations start at every ``turns``-th arrival time; a
    conversation's turns follow each other after exponential think times of mean
    ``think_seconds`` (fixed in the schedule: open loop, not waiting for the answer)."""
    turns, n = int(p["turns"]), len(times)
    specs = []
    for c, start in enumerate(times[::turns]):
        prompt, t = _words(rng, int(p["system_tokens"])), start
        for _ in range(turns):
            prompt += _words(rng, int(p["question_tokens"]))
            specs.append(_request(t, prompt, p["output_tokens"], f"conversation-{c}"))
            prompt += _words(rng, int(p["output_tokens"]))
            t += rng.expovariate(1 / float(p["think_seconds"]))
    specs.sort(key=lambda s: s.at)
    return specs[:n]


def pd_mix(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """A ``long_share`` of long prompts (``long_min``-``long_max`` tokens, tagged ``long``)
    among chat-like short ones (``short_min``-``short_max``, tagged ``short``), all unique,
    ``output_min``-``output_max`` tokens out: the P/D comparison's mix (issue #16)."""
    specs = []
    for t in times:
        long = rng.random() < float(p["long_share"])
        tokens = (rng.randint(int(p["long_min"]), int(p["long_max"])) if long
                  else rng.randint(int(p["short_min"]), int(p["short_max"])))
        out = rng.randint(int(p["output_min"]), int(p["output_max"]))
        specs.append(_request(t, _words(rng, tokens), out, "long" if long else "short"))
    return specs


def _pd_capacity(p: Params) -> float:
    share = float(p["long_share"])
    mean = (share * (p["long_min"] + p["long_max"]) / 2
            + (1 - share) * (p["short_min"] + p["short_max"]) / 2)
    return 1 / _prefill(mean)


def classes(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """Request classes drawn by their ``share`` (tagged with the class name), unique
    ``prompt_tokens`` prompts, ``output_tokens`` out; a class with ``groups`` and
    ``system_tokens`` puts one of its ``groups`` shared system prompts before each prompt
    (warm traffic among cold, short among long, ...)."""
    names = list(p["classes"])
    shares = [float(p["classes"][c]["share"]) for c in names]
    systems = {c: [_words(rng, int(k["system_tokens"])) for _ in range(int(k["groups"]))]
               for c, k in p["classes"].items() if k.get("groups")}
    specs = []
    for t in times:
        c = rng.choices(names, shares)[0]
        head = rng.choice(systems[c]) if c in systems else ""
        prompt = head + _words(rng, int(p["classes"][c]["prompt_tokens"]))
        specs.append(_request(t, prompt, p["output_tokens"], c))
    return specs


def _classes_capacity(p: Params) -> float:
    # Shared system prompts prefilled once per server: only the unique part counts.
    total = sum(float(k["share"]) for k in p["classes"].values())
    return 1 / _prefill(sum(float(k["share"]) * k["prompt_tokens"]
                            for k in p["classes"].values()) / total)


def rollout(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """RL-rollout steps: each ``groups x samples`` consecutive arrivals (one burst of the
    ``bursts`` arrivals) are ``samples`` identical copies of ``groups`` new
    ``prompt_tokens`` prompts, ``output_tokens`` out; tagged ``step-<n>``."""
    per = int(p["groups"]) * int(p["samples"])
    specs: list[RequestSpec] = []
    for step in range(math.ceil(len(times) / per)):
        prompts = [_words(rng, int(p["prompt_tokens"])) for _ in range(int(p["groups"]))]
        order = [g for g in range(int(p["groups"])) for _ in range(int(p["samples"]))]
        rng.shuffle(order)
        specs += [_request(t, prompts[g], p["output_tokens"], f"step-{step}")
                  for t, g in zip(times[step * per:(step + 1) * per], order, strict=False)]
    return specs


def multimodal(rng: random.Random, p: Params, times: list[float]) -> list[RequestSpec]:
    """Chat requests with a unique ``question_tokens`` question followed by
    ``images_min``-``images_max`` images (OpenAI's order: text, then ``image_url`` blocks),
    ``output_tokens`` out. Each image is, with probability ``repeat_share``, one already sent
    earlier in the run (uniformly among them; not twice in one request), else a new one; an
    image is a URL, so it stands for 640 x 360 = 225 placeholder tokens
    (:mod:`modelserver.multimodal`). Tagged ``repeat`` when the request has a repeated image."""
    seen: list[str] = []
    specs = []
    for i, t in enumerate(times):
        urls: list[str] = []
        for j in range(rng.randint(int(p["images_min"]), int(p["images_max"]))):
            old = [u for u in seen if u not in urls]
            if old and rng.random() < float(p["repeat_share"]):
                urls.append(rng.choice(old))
            else:
                urls.append(f"https://images.example/{rng.getrandbits(64):016x}-{i}-{j}.png")
        repeat = any(u in seen for u in urls)
        seen.extend(u for u in urls if u not in seen)
        content: list[dict[str, Any]] = [
            {"type": "text", "text": _words(rng, int(p["question_tokens"]))}]
        content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        specs.append(RequestSpec(t, "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": int(p["output_tokens"]), "stream": True,
            "stream_options": {"include_usage": True}}, tag="repeat" if repeat else "new"))
    return specs


def _mm_capacity(p: Params) -> float:
    # Every image encoded (40 ms, the 8b-h100 profile's encode_time_per_image) and prefilled
    # as 225 placeholder tokens; the chat template adds about 16 tokens.
    images = (p["images_min"] + p["images_max"]) / 2
    return 1 / (_prefill(p["question_tokens"] + 16 + images * 225) + images * 0.040)


def _mt_capacity(p: Params) -> float:
    # Ideal routing prefills per turn the new question, the previous answer and its share of
    # the system prompt.
    return 1 / _prefill(p["question_tokens"] + p["output_tokens"]
                        + p["system_tokens"] / p["turns"])


#: generator name -> (builder, nominal req/s of ONE server, its parameters)
GENERATORS: dict[str, tuple[Generator, Callable[[Params], float], frozenset[str]]] = {
    "shared-prefix": (shared_prefix, _sp_capacity,
                      frozenset({"system_tokens", "question_tokens", "output_tokens",
                                 "per_group"})),
    # ideal routing prefills each shared prompt once: the question alone per request
    "prefix-pool": (prefix_pool, lambda p: 1 / _prefill(p["question_tokens"]),
                    frozenset({"prefixes", "prefix_tokens", "question_tokens", "output_tokens",
                               "zipf"})),
    "lora": (lora_mix, lambda p: 1 / _prefill(p["prompt_tokens"]),
             frozenset({"adapters", "zipf", "prompt_tokens", "output_tokens"})),
    "lengths": (lengths, _lengths_capacity,
                frozenset({"input_median", "input_sigma", "input_min", "input_max",
                           "output_median", "output_sigma", "output_max"})),
    "tenants": (tenants, _lengths_capacity,
                frozenset({"input_median", "input_sigma", "input_min", "input_max",
                           "output_median", "output_sigma", "output_max", "tenants"})),
    "pd-mix": (pd_mix, _pd_capacity,
               frozenset({"long_share", "long_min", "long_max", "short_min", "short_max",
                          "output_min", "output_max"})),
    "classes": (classes, _classes_capacity, frozenset({"classes", "output_tokens"})),
    "rollout": (rollout, lambda p: 1 / _prefill(p["prompt_tokens"] / p["samples"]),
                frozenset({"groups", "samples", "prompt_tokens", "output_tokens"})),
    "multimodal": (multimodal, _mm_capacity,
                   frozenset({"question_tokens", "images_min", "images_max", "repeat_share",
                              "output_tokens"})),
    "multi-turn": (multi_turn, _mt_capacity,
                   frozenset({"system_tokens", "question_tokens", "output_tokens", "turns",
                              "think_seconds"})),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """A named request mix (one YAML file) with the offered loads the comparison runs.

    :attr:`per_server` is one server's nominal req/s for this mix; ``n`` servers have
    capacity ``n * per_server``; ``loads`` are the fractions of it that the full run offers,
    each for ``duration`` model seconds.
    """

    name: str
    title: str
    description: str
    source: str
    generator: str
    arrivals: str
    #: bursts: the period and width, s; gamma: the gaps' CV and 0
    burst_period: float
    burst_width: float
    parameters: Params
    loads: tuple[float, ...]
    duration: float

    @property
    def by_class(self) -> bool:
        """Whether the report breaks this workload down by request tag (tenant/objective)."""
        return self.generator in ("tenants", "pd-mix", "classes", "multimodal")

    @property
    def per_server(self) -> float:
        """Nominal req/s of one server."""
        return GENERATORS[self.generator][1](self.parameters)

    def capacity(self, servers: float = FLEET_SIZE) -> float:
        """Nominal req/s of ``servers`` servers (a heterogeneous fleet: the sum of their
        speeds)."""
        return servers * self.per_server

    def schedule(self, load: float, duration: float, seed: int = 0,
                 servers: float = FLEET_SIZE) -> list[RequestSpec]:
        """The schedule at ``load`` x capacity over about ``duration`` seconds."""
        rng = random.Random(f"{self.name}:{seed}")
        rate = load * self.capacity(servers)
        n = max(1, round(rate * duration))
        if self.arrivals == "poisson":
            times = poisson_arrivals(rng, rate, n)
        elif self.arrivals == "gamma":
            times = gamma_arrivals(rng, rate, n, cv=self.burst_period)
        else:
            times = burst_arrivals(rng, rate, n, period=self.burst_period,
                                   width=self.burst_width)
        return GENERATORS[self.generator][0](rng, self.parameters, times)


class WorkloadError(ValueError):
    """A workload file is wrong; the message is one line naming the file and the key path."""


class Reader:
    """Strict reading of one YAML file (a workload, a scenario) with the file and the key
    path in every error, raised as ``error``."""

    def __init__(self, path: Path, error: type[ValueError] = WorkloadError) -> None:
        self.path, self.error = path, error

    def fail(self, where: str, msg: str) -> ValueError:
        return self.error(f"{self.path}: {where}: {msg}" if where else f"{self.path}: {msg}")

    def load(self) -> Any:
        """The file's YAML."""
        try:
            return yaml.safe_load(self.path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise self.fail("", f"cannot read: {' '.join(str(e).split())}") from None

    def keys(self, raw: Any, where: str, allowed: Collection[str],
             required: Collection[str] = ()) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(where, f"expected a mapping, got {type(raw).__name__}")
        for key in raw:
            if key not in allowed:
                dot = f"{where}.{key}" if where else str(key)
                raise self.fail(dot, f"unknown key (known: {', '.join(sorted(allowed))})")
        for key in required:
            if key not in raw:
                raise self.fail(where, f"missing key {key!r}")
        return raw

    def one_of(self, raw: Any, where: str, known: Collection[str]) -> str:
        if raw not in known:
            raise self.fail(where, f"{raw!r} is not one of {', '.join(known)}")
        return str(raw)

    def positive_int(self, raw: Any, where: str, minimum: int = 1) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {raw!r}")
        return raw

    def number(self, raw: Any, where: str, *, positive: bool = False) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or raw < 0 or (
                positive and raw == 0):
            kind = "a positive number" if positive else "a number >= 0"
            raise self.fail(where, f"expected {kind}, got {raw!r}")
        return float(raw)

    def text(self, raw: Any, where: str) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise self.fail(where, f"expected a non-empty string, got {raw!r}")
        return raw

    def file(self, raw: Any, where: str) -> Path:
        path = (self.path.parent / self.text(raw, where)).resolve()
        if not path.is_file():
            raise self.fail(where, f"no such file: {path}")
        return path


def read_arrivals(r: Reader, raw: Any, where: str) -> tuple[str, float, float]:
    """``arrivals``: the process and its two numbers (:attr:`Workload.burst_period`,
    :attr:`Workload.burst_width`)."""
    if raw == "poisson":
        return "poisson", 0.0, 0.0
    b = raw.get("bursts") if isinstance(raw, dict) and set(raw) == {"bursts"} else None
    if isinstance(b, dict) and set(b) == {"period", "width"}:
        return "bursts", float(b["period"]), float(b["width"])
    g = raw.get("gamma") if isinstance(raw, dict) and set(raw) == {"gamma"} else None
    if isinstance(g, dict) and set(g) == {"cv"} and isinstance(g["cv"], int | float) \
            and not isinstance(g["cv"], bool) and g["cv"] > 0:
        return "gamma", float(g["cv"]), 0.0
    raise r.fail(where, "expected 'poisson', {bursts: {period: S, width: S}} or "
                 "{gamma: {cv: X > 0}}")


#: The structured parameters (tenants, classes): a mapping of names, each a mapping with
#: these required and optional keys, numbers positive (``objective``: a name).
_NAMED = {"tenants": (("share", "objective"), TENANT_OPTIONAL),
          "classes": (("share", "prompt_tokens"), frozenset({"groups", "system_tokens"}))}


def check_parameters(r: Reader, generator: str, params: Params, where: str) -> None:
    """The checks of a generator's structured parameters (tenants, classes) at ``where``."""
    if generator not in _NAMED:
        return
    required, optional = _NAMED[generator]
    items, where = params[generator], f"{where}.{generator}"
    if not isinstance(items, dict) or not items:
        raise r.fail(where, f"expected a mapping of {generator} names")
    for name, item in items.items():
        at = f"{where}.{name}"
        if not isinstance(item, dict) or not set(required) <= set(item) <= {*required,
                                                                             *optional}:
            raise r.fail(at, f"expected {{{', '.join(required)}}} and optionally "
                         f"{', '.join(sorted(optional))}")
        for k in (*required, *sorted(optional & set(item))):
            if k != "objective":
                r.number(item[k], f"{at}.{k}", positive=True)
        if "objective" in item:
            r.one_of(item["objective"], f"{at}.objective", OBJECTIVES)
        if ("groups" in item) != ("system_tokens" in item):
            raise r.fail(at, "give groups and system_tokens together")


def objective_manifests(pool: str) -> list[dict[str, Any]]:
    """The :data:`OBJECTIVES` as InferenceObjectives of ``pool``."""
    return [{"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
             "metadata": {"name": name, "namespace": "default"},
             "spec": {"priority": priority, "poolRef": {"name": pool}}}
            for name, priority in OBJECTIVES.items()]


_KEYS = ("name", "title", "source", "generator", "arrivals", "parameters", "loads",
         "duration")


def load_workload(path: Path) -> Workload:
    """Read and check one workload file (unknown fields and parameters are errors)."""
    r = Reader(path)
    raw = r.keys(r.load(), "", _KEYS, _KEYS)
    gen = r.one_of(raw["generator"], "generator", GENERATORS)
    params = r.keys(raw["parameters"], "parameters", GENERATORS[gen][2],
                    sorted(GENERATORS[gen][2]))
    check_parameters(r, gen, params, "parameters")
    if not isinstance(raw["loads"], list) or not raw["loads"]:
        raise r.fail("loads", "expected a list of loads")
    loads = tuple(r.number(x, f"loads[{i}]", positive=True) for i, x in enumerate(raw["loads"]))
    doc = " ".join((GENERATORS[gen][0].__doc__ or "").split())
    return Workload(str(raw["name"]), str(raw["title"]), doc, str(raw["source"]), gen,
                    *read_arrivals(r, raw["arrivals"], "arrivals"), dict(params), loads,
                    r.number(raw["duration"], "duration", positive=True))


_ORDER = ("shared-prefix", "lora", "sharegpt", "bursts")


def load_workloads(directory: Path = HERE) -> dict[str, Workload]:
    """Every ``*.yaml`` workload of ``directory`` by name (the four standard ones first)."""
    found = {w.name: w for w in (load_workload(p) for p in sorted(directory.glob("*.yaml")))}
    names = sorted(found, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k))
    return {k: found[k] for k in names}


WORKLOADS: dict[str, Workload] = load_workloads()


def find_workload(name: str, directory: Path) -> Workload:
    """The workload ``name`` of :data:`WORKLOADS`, else the workload file ``name`` (relative
    to ``directory``); a WorkloadError says it is neither."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    try:
        return load_workload((directory / name).resolve())
    except WorkloadError as e:
        raise WorkloadError(f"not a workload of bench/workloads/ ({', '.join(WORKLOADS)}) "
                            f"nor a workload file: {e}") from None


def write_specs(specs: list[RequestSpec], path: Path) -> None:
    """Write a schedule as JSONL for :mod:`bench.openloop`."""
    path.write_bytes(b"".join(orjson.dumps(
        {"at": s.at, "path": s.path, "body": s.body, "tag": s.tag, "headers": s.headers})
        + b"\n" for s in specs))
