"""The gateway against real vLLM: every check the simulator stands in for elsewhere.

Runs only under ``make test-vllm`` (local CPU servers) or ``pytest tests/vllm --vllm-url
http://HOST:PORT ...`` (servers you run). Checks run in file order: the first sees the local
servers fresh. No check asserts on time; waits poll for a state and fail after a generous
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import zmq
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from devkit import envoy as e
from epp.datastore import EngineType
from epp.kvcache import (
    IndexConfig,
    KVBlockIndex,
    KVEventMetrics,
    KVEventSource,
    KVEventSubscriber,
    SubscriberConfig,
)
from epp.metrics.dialects import DIALECTS
from modelserver.kvevents import BlockStored, decode_batch, hash_to_u64, parse_message
from sim.kvevents import DEFAULT_NONE_HASH_SEED, BlockHasher, external
from tests.vllm.harness import (
    EPP_SATURATION,
    FLOW_CONTROL_CONFIG,
    HASH_ALGO,
    SHEDDABLE_QUEUE,
    Gateway,
    PDPool,
    RealPool,
    VllmServer,
    debug_pool,
)
from tests.vllm.kv_capture import comparable

T = TypeVar("T")
FIXTURES = Path(__file__).resolve().parent / "fixtures"
KV_LAYOUT = FIXTURES / "vllm_kv_events_layout.json"
#: Polls give a loaded two-core machine plenty of room; they end as soon as the state shows.
WAIT = 180.0

Samples = dict[str, list[tuple[dict[str, str], float]]]


# --- helpers -------------------------------------------------------------------------------

def words(seed: int, n: int) -> str:
    """``n`` words the tiny model's tokenizer knows: about one token each."""
    from tests.vllm.make_model import VOCABULARY

    rng = random.Random(seed)
    vocab = VOCABULARY.split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def samples(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scrape(server: VllmServer) -> Samples:
    return samples(server.get("/metrics"))


def total(page: Samples, name: str) -> float:
    return sum(v for _, v in page.get(name, []))


def newest_lora(page: Samples) -> dict[str, str] | None:
    rows = page.get("vllm:lora_requests_info")
    return max(rows, key=lambda r: r[1])[0] if rows else None


def until(what: str, probe: Callable[[], T | None], timeout: float = WAIT) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def wait_idle(pool: RealPool) -> None:
    """Every server idle as the EPP sees it, so the next pick is decided by the scorers."""
    def idle() -> bool:
        eps = debug_pool(pool.gateway).values()
        return all(ep["running"] == 0 and ep["waiting"] == 0 and ep["inflight_requests"] == 0
                   for ep in eps)
    until("an idle pool", idle)


def served(pool: RealPool) -> dict[str, float]:
    """Finished requests per server, from vLLM's own counter."""
    return {s.name: total(scrape(s), "vllm:request_success_total") for s in pool.servers}


class Flood:
    """Keeps ``n`` long streaming requests open against one server (directly, not through
    the gateway), re-sending each one that ends, until closed. Closing the connections
    makes vLLM abort the requests."""

    def __init__(self, server: VllmServer, model: str, n: int, max_tokens: int) -> None:
        self.server, self.model, self.n, self.max_tokens = server, model, n, max_tokens
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(n)]

    def _run(self, i: int) -> None:
        body = {"model": self.model, "prompt": f"flood {i} tell me about the gateway",
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("POST", self.server.url + "/v1/completions",
                                       json=body) as r:
                        if r.status_code != 200:
                            self.errors.append(f"{r.status_code}: {r.read()[:200]!r}")
                            return
                        for _ in r.iter_raw():
                            if self.stop.is_set():
                                return
                except httpx.HTTPError as err:
                    if not self.stop.is_set():
                        self.errors.append(repr(err))
                    return

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


@contextlib.contextmanager
def floods(*fl: Flood) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for f in fl:
            stack.enter_context(f)
        yield
        for f in fl:
            assert not f.errors, f"flood of {f.server.name} failed: {f.errors[:3]}"


def gw(pool: RealPool, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(pool.gateway.url + path, json=body, headers=headers, timeout=300)


def epp_metric(pool: RealPool | Gateway, name: str, **labels: str) -> float:
    """The EPP's ``name`` summed over the series whose labels include ``labels``."""
    gateway = pool.gateway if isinstance(pool, RealPool) else pool
    page = samples(gateway.epp_get("/metrics"))
    return sum(v for lab, v in page.get(name, []) if labels.items() <= lab.items())


def epp_metric_above(pool: RealPool, name: str, before: float, **labels: str) -> float:
    """Wait until the EPP's ``name`` (summed over matching series) exceeds ``before``."""
    def probe() -> float | None:
        v = epp_metric(pool, name, **labels)
        return v if v > before else None
    return until(f"the EPP's {name} to rise", probe)


def served_at_least(pool: RealPool, before: dict[str, float], n: int) -> dict[str, float]:
    """Wait until vLLM counted ``n`` more finished requests; the increase per server."""
    def probe() -> dict[str, float] | None:
        now = served(pool)
        got = {name: now[name] - before[name] for name in now}
        return got if sum(got.values()) >= n else None
    return until(f"vLLM to count {n} requests", probe)


def local_only(pool: RealPool, why: str) -> None:
    if not pool.local:
        pytest.skip(f"local servers only: {why}")


# --- the scraper and /debug/pool -----------------------------------------------------------

def test_scraper_reads_cache_config_and_lora_slots(real: RealPool) -> None:
    """scraper: cache config (block size, GPU blocks) and LoRA slots match each server's /metrics"""
    if real.local:
        lora = real.server("lora")
        # vLLM quirk: the LoRA gauge has no sample until the engine's first step.
        fresh = scrape(lora)
        assert "vllm:lora_requests_info" not in fresh
        assert debug_pool(real.gateway)[lora.key]["max_lora"] is None
        r = httpx.post(lora.url + "/v1/completions", timeout=300,
                       json={"model": real.model, "prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200
        until("the LoRA server's slots in /debug/pool",
              lambda: debug_pool(real.gateway)[lora.key]["max_lora"] == 2)
    pool = debug_pool(real.gateway)
    for s in real.servers:
        page = scrape(s)
        (cfg, _), *_ = page["vllm:cache_config_info"]
        ep = pool[s.key]
        assert ep["block_size"] == int(cfg["block_size"]), s.name
        assert ep["num_gpu_blocks"] == int(cfg["num_gpu_blocks"]), s.name
        lora_labels = newest_lora(page)
        expected = int(lora_labels["max_lora"]) if lora_labels else None
        assert ep["max_lora"] == expected, s.name
    if real.local:
        assert pool[real.server("small-kv").key]["block_size"] == 32
        assert pool[real.server("small-kv").key]["num_gpu_blocks"] == 40
        assert pool[real.server("small-kv").key]["max_lora"] is None  # no --enable-lora


def test_scraper_follows_queue_running_and_kv_usage(real: RealPool) -> None:
    """scraper: waiting, running and KV usage in /debug/pool follow a real queue"""
    target = real.server("small-kv") if real.local else real.servers[0]
    n, seqs = (7, 4) if real.local else (8, None)
    with floods(Flood(target, real.model, n, max_tokens=200)):
        def agree() -> tuple[dict[str, Any], Samples] | None:
            ep = debug_pool(real.gateway)[target.key]
            page = scrape(target)
            direct = (round(total(page, "vllm:num_requests_waiting")),
                      round(total(page, "vllm:num_requests_running")))
            if seqs is not None and direct != (n - seqs, seqs):
                return None
            if direct[1] == 0 or (ep["waiting"], ep["running"]) != direct:
                return None
            return ep, page
        ep, page = until("/debug/pool to show the server's queue", agree)
        assert ep["kv_usage"] > 0
        assert abs(ep["kv_usage"] - total(page, "vllm:kv_cache_usage_perc")) < 0.25
        assert ep["queue"] >= ep["waiting"]


def test_scraper_reads_running_lora_adapter_from_newest_sample(real: RealPool) -> None:
    """scraper: a running adapter shows in /debug/pool (the newest lora_requests_info sample)"""
    with_adapters = [(a, ss[0]) for a, ss in real.adapters.items()]
    if not with_adapters:
        pytest.skip("no server lists a LoRA adapter in /v1/models")
    adapter, server = with_adapters[0]
    with floods(Flood(server, adapter, 1, max_tokens=400)):
        ep = until(f"{adapter} running on {server.name} in /debug/pool",
                   lambda: (lambda ep: ep if ep["lora_running"] == [adapter] else None)(
                       debug_pool(real.gateway)[server.key]))
        assert ep["max_lora"] == int(newest_lora(scrape(server))["max_lora"])  # type: ignore[index]
    until(f"{adapter} gone from /debug/pool once it ended",
          lambda: debug_pool(real.gateway)[server.key]["lora_running"] == [])
    rows = scrape(server)["vllm:lora_requests_info"]
    assert len(rows) >= 2  # the quirk: every label set seen stays on the page
    assert newest_lora(scrape(server))["running_lora_adapters"] == ""  # type: ignore[index]


# --- requests through the gateway ----------------------------------------------------------

def test_model_rewrite_and_name_rewritten_back_json(real: RealPool) -> None:
    """rewrite: 'alias' reaches vLLM as the base model; JSON answers say 'alias'; usage read"""
    wait_idle(real)
    for path, body in (
        ("/v1/completions", {"prompt": "hello gateway", "max_tokens": 5}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}],
                                  "max_tokens": 5}),
    ):
        before = epp_metric(real, "inference_objective_input_tokens_sum",
                            model_name="alias", target_model_name=real.model)
        r = gw(real, path, {"model": "alias", **body})
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["model"] == "alias"
        assert data["usage"]["completion_tokens"] == 5
        after = epp_metric_above(real, "inference_objective_input_tokens_sum", before,
                                 model_name="alias", target_model_name=real.model)
        assert after - before == data["usage"]["prompt_tokens"]


def test_model_name_rewritten_back_in_sse_with_usage(real: RealPool) -> None:
    """rewrite: every SSE event says 'alias'; the usage event is read by the EPP"""
    for path, body in (
        ("/v1/completions", {"prompt": "hello gateway", "max_tokens": 6}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 6}),
    ):
        before = epp_metric(real, "inference_objective_output_tokens_sum",
                            model_name="alias", target_model_name=real.model)
        with httpx.stream("POST", real.gateway.url + path, timeout=300, json={
                "model": "alias", "stream": True, "stream_options": {"include_usage": True},
                **body}) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert len(events) >= 2
        assert {ev["model"] for ev in events} == {"alias"}
        usage = events[-1]["usage"]
        assert usage["completion_tokens"] == 6
        after = epp_metric_above(real, "inference_objective_output_tokens_sum", before,
                                 model_name="alias", target_model_name=real.model)
        assert after - before == 6


def test_lora_affinity_sends_adapter_traffic_to_the_server_with_it(real: RealPool) -> None:
    """LoRA affinity: adapter requests all land on the server that has the adapter"""
    partial = [(a, ss) for a, ss in real.adapters.items() if len(ss) < len(real.servers)]
    if not partial:
        pytest.skip("needs an adapter loaded on some servers but not all")
    adapter, holders = partial[0]
    wait_idle(real)
    before = served(real)
    for i in range(6):
        r = gw(real, "/v1/completions", {"model": adapter, "prompt": f"adapter {i}",
                                         "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == adapter
        wait_idle(real)
    got = served_at_least(real, before, 6)
    assert sum(got[s.name] for s in holders) == 6, got


def test_prefix_scorer_concentrates_a_shared_prefix(real: RealPool) -> None:
    """prefix: a shared system prompt goes to one server, whose prefix_cache_hits rise"""
    system = ("You are a helpful assistant for the gateway. " * 40).strip()  # ~ 400 tokens
    wait_idle(real)
    hits0 = {s.name: total(scrape(s), "vllm:prefix_cache_hits_total") for s in real.servers}
    before = served(real)
    for i in range(8):
        r = gw(real, "/v1/chat/completions", {
            "model": real.model, "max_tokens": 4,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"question number {i}?"}]})
        assert r.status_code == 200, r.text
        wait_idle(real)
    got = served_at_least(real, before, 8)
    winner = max(got, key=lambda n: got[n])
    assert got[winner] == 8, got
    hits = {s.name: total(scrape(s), "vllm:prefix_cache_hits_total") - hits0[s.name]
            for s in real.servers}
    assert hits[winner] > 0, hits
    assert all(v == 0 for name, v in hits.items() if name != winner), hits


def test_sheddable_requests_shed_against_a_real_queue(real: RealPool) -> None:
    """shedding: 429 for a sheddable request while every server queues; served again after"""
    local_only(real, "filling every queue needs their small --max-num-seqs")
    body = {"model": real.model, "prompt": "may I?", "max_tokens": 2}
    with floods(*(Flood(s, real.model, 7, max_tokens=200) for s in real.servers)):
        until("every server to queue >= 2 in /debug/pool",
              lambda: all(ep["queue"] >= 2 for ep in debug_pool(real.gateway).values()))
        r = gw(real, "/v1/completions", body, **{"x-gateway-inference-objective": "batch"})
        assert r.status_code == 429, r.text
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["code"] == "shed"
        # A critical request is admitted (it queues at vLLM: read only its status line).
        with httpx.stream("POST", real.gateway.url + "/v1/completions", timeout=300,
                          json={**body, "stream": True},
                          headers={"x-gateway-inference-objective": "chat"}) as ok:
            assert ok.status_code == 200
    wait_idle(real)
    r = gw(real, "/v1/completions", body, **{"x-gateway-inference-objective": "batch"})
    assert r.status_code == 200, r.text


def expected_saturation(pool: RealPool) -> float:
    """The pool's saturation computed here from each server's own ``/metrics``, as the EPP's
    ``utilization-detector`` does: mean of max(waiting / queueDepthThreshold,
    KV usage / kvCacheUtilThreshold)."""
    per_server = []
    for s in pool.servers:
        page = scrape(s)
        per_server.append(max(
            total(page, "vllm:num_requests_waiting") / EPP_SATURATION["queueDepthThreshold"],
            total(page, "vllm:kv_cache_usage_perc") / EPP_SATURATION["kvCacheUtilThreshold"]))
    return statistics.fmean(per_server)


#: What the burst holds for at least: longer than the 10 s ext_proc message timeout of the
#: gateway's Envoy, so the check fails if Envoy gives up on a request that waits in the EPP's
#: queue longer than that (it does not: in FULL_DUPLEX_STREAMED mode the timeout does not
#: apply). A minimum hold, not a timing assertion.
HOLD = 12.0
FC_QUEUE = "inference_extension_flow_control_request_queue_duration_seconds"


def test_flow_control_holds_a_burst_by_band_against_a_real_queue(real: RealPool) -> None:
    """flow control: a burst waits in the EPP while vLLM queues, critical goes first, none lost"""
    local_only(real, "holding every server saturated needs their small --max-num-seqs")
    fc = Gateway(real.workdir / "gateway-flow-control", real.servers, real.model,
                 sorted(real.adapters), epp_config=FLOW_CONTROL_CONFIG)
    try:
        fc.start()
        _flow_control_burst(real, fc)
    finally:
        fc.stop()


def _flow_control_burst(real: RealPool, fc: Gateway) -> None:
    n_critical, n_sheddable, max_tokens = 8, SHEDDABLE_QUEUE + 2, 16
    rank = itertools.count()  # completion order (of every answer, 429s included)
    answers: list[tuple[str, int, httpx.Response]] = []
    lock = threading.Lock()

    def send(objective: str, i: int) -> None:
        r = httpx.post(fc.url + "/v1/completions", timeout=600,
                       headers={"x-gateway-inference-objective": objective},
                       json={"model": real.model, "prompt": f"{objective} request {i}",
                             "max_tokens": max_tokens, "ignore_eos": True})
        with lock:
            answers.append((objective, next(rank), r))

    def queued() -> dict[int, int]:
        return {b["priority"]: b["queued"]
                for b in json.loads(fc.epp_get("/debug/pool"))["flowControl"]["bands"]}

    def status(objective: str, code: int) -> int:
        with lock:
            return sum(1 for o, _, r in answers if o == objective and r.status_code == code)

    def sees_real_queues() -> bool:
        """The EPP's endpoints show each server's own waiting queue, >= 4 on each."""
        pool = debug_pool(fc)
        for s in real.servers:
            waiting = round(total(scrape(s), "vllm:num_requests_waiting"))
            if waiting < 4 or pool[s.key]["waiting"] != waiting:
                return False
        return True

    # 10 long requests per server straight to vLLM: 4 run (--max-num-seqs 4), 6 wait. The
    # floods end first (vLLM aborts them), then the pool waits for every answer.
    with (ThreadPoolExecutor(n_critical + n_sheddable) as ex,
          floods(*(Flood(s, real.model, 10, max_tokens=200) for s in real.servers))):
        until("the flow-control EPP to see every server's real waiting queue",
              sees_real_queues)
        sent = [ex.submit(send, "batch", i) for i in range(n_sheddable)]
        until(f"{SHEDDABLE_QUEUE} sheddable requests queued and the rest refused",
              lambda: queued().get(-1) == SHEDDABLE_QUEUE
              and status("batch", 429) == n_sheddable - SHEDDABLE_QUEUE)
        sent += [ex.submit(send, "chat", i) for i in range(n_critical)]
        until(f"{n_critical} critical requests queued",
              lambda: queued().get(1) == n_critical)
        held = time.monotonic()
        # What the EPP's saturation detector reads is vLLM's own queue: its gauge equals
        # the saturation computed here from the servers' /metrics.
        got, want = until(
            "the EPP's pool saturation to equal the one computed from vLLM's /metrics",
            lambda: (lambda g, w: (g, w) if abs(g - w) < 1e-9 else None)(
                epp_metric(fc, "inference_extension_flow_control_pool_saturation"),
                expected_saturation(real)))
        assert got >= 1.0, (got, want)
        assert epp_metric(fc, "inference_extension_flow_control_queue_size",
                          priority="1") == n_critical
        assert epp_metric(fc, "inference_extension_flow_control_queue_size",
                          priority="-1") == SHEDDABLE_QUEUE
        until(f"the burst to have waited {HOLD:.0f}s in the EPP",
              lambda: time.monotonic() - held >= HOLD, timeout=HOLD + 5)
        assert queued() == {1: n_critical, -1: SHEDDABLE_QUEUE}, "released while saturated"
        assert len(answers) == n_sheddable - SHEDDABLE_QUEUE  # only the refusals so far
    for f in sent:
        f.result()  # a request that failed in the client (no answer) fails the check here
    assert len(answers) == n_critical + n_sheddable
    problems = []
    for objective, _, r in answers:
        if r.status_code == 200:
            if r.json()["usage"]["completion_tokens"] != max_tokens:
                problems.append(f"{objective}: {r.text[:200]}")
        elif not (objective == "batch" and r.status_code == 429
                  and r.json()["error"]["code"] == "flow_control_queue_full"
                  and int(r.headers["retry-after"]) >= 1):
            problems.append(f"{objective}: {r.status_code} {r.text[:200]}")
    assert not problems, problems
    assert status("chat", 200) == n_critical
    assert status("batch", 200) == SHEDDABLE_QUEUE
    assert status("batch", 429) == n_sheddable - SHEDDABLE_QUEUE
    # Released by band: the critical answers come back before the sheddable ones on average.
    served_ranks = {o: [k for oo, k, r in answers if oo == o and r.status_code == 200]
                    for o in ("chat", "batch")}
    assert statistics.fmean(served_ranks["chat"]) < statistics.fmean(served_ranks["batch"]), (
        served_ranks)
    # The EPP's flow-control metrics: every served request was dispatched from the queue
    # after the hold (none took the fast path, which records a wait of 0); the refusals are
    # RejectedCapacity.
    for priority, n in (("1", n_critical), ("-1", SHEDDABLE_QUEUE)):
        assert epp_metric(fc, FC_QUEUE + "_count", priority=priority,
                          outcome="Dispatched") == n
        assert epp_metric(fc, FC_QUEUE + "_bucket", priority=priority, outcome="Dispatched",
                          le="10.0") == 0, "a served request shows no wait in the metrics"
    assert epp_metric(fc, FC_QUEUE + "_count", priority="-1",
                      outcome="RejectedCapacity") == n_sheddable - SHEDDABLE_QUEUE


# --- fidelity: the simulator against the real server ---------------------------------------

def _families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name → (type, label names) of the ``vllm:`` families; ``_created`` series (a
    prometheus-client feature, not vLLM's) left out."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:") or fam.name.endswith("_created"):
            continue
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le", "quantile"}
        out[fam.name] = (fam.type, frozenset(labels))
    return out


@contextlib.contextmanager
def simulator(model: str, adapter: str) -> Iterator[str]:
    port = e.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.main", "--port", str(port), "--served-model-name", model,
         "--lora-modules", adapter, "--profile", "tiny", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        e.wait_for_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


#: Info gauges whose labels are the server's configuration: vLLM has dozens that change
#: between releases; the simulator must use a subset of them.
CONFIG_INFO = {"vllm:cache_config_info"}


def test_simulator_metrics_match_real_vllm_names_and_labels(real: RealPool) -> None:
    """fidelity: the simulator's /metrics families, types and labels are the real server's"""
    adapter = next(iter(real.adapters), "a1")
    # The real page with LoRA samples: a server that lists an adapter (it has run one).
    server = real.adapters[adapter][0] if real.adapters else real.servers[0]
    if adapter in real.adapters:
        r = httpx.post(server.url + "/v1/completions", timeout=300,
                       json={"model": adapter, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200
    real_fams = _families(server.get("/metrics"))
    with simulator(real.model, adapter) as sim:
        for model in (real.model, adapter):
            r = httpx.post(sim + "/v1/completions", timeout=60,
                           json={"model": model, "prompt": "x", "max_tokens": 2})
            assert r.status_code == 200
        sim_fams = _families(httpx.get(sim + "/metrics", timeout=10).text)
    problems = []
    for name, (kind, labels) in sorted(sim_fams.items()):
        if name not in real_fams:
            problems.append(f"{name}: the simulator exports it, vLLM does not")
            continue
        real_kind, real_labels = real_fams[name]
        if kind != real_kind:
            problems.append(f"{name}: type {kind} (sim) vs {real_kind} (vLLM)")
        ok = labels <= real_labels if name in CONFIG_INFO else labels == real_labels
        if real_labels and not ok:
            problems.append(f"{name}: labels {sorted(labels)} (sim) vs {sorted(real_labels)}")
    d = DIALECTS[EngineType.VLLM]
    assert d.cache_config is not None and d.lora_info is not None
    read = [d.waiting, d.running, d.kv_usage[0], d.cache_config]
    if real.adapters:
        read.append(d.lora_info)
    for name in read:
        for side, fams in (("vLLM", real_fams), ("the simulator", sim_fams)):
            if name not in fams:
                problems.append(f"{name}: the EPP reads it, {side} does not export it")
    for side, fams in (("vLLM", real_fams), ("the simulator", sim_fams)):
        cfg = fams.get(d.cache_config, ("", frozenset()))[1]
        for label in (d.block_size_label, d.num_blocks_label):
            if label not in cfg:
                problems.append(f"{d.cache_config}: {side} lacks the label {label}")
    assert not problems, "\n".join(problems)


def _shape(value: Any, path: str = "") -> set[str]:
    """Every key path in a JSON value (``choices[].message.content``); list items merged."""
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(f"{path}{k}")
            out |= _shape(v, f"{path}{k}.")
    elif isinstance(value, list):
        for v in value:
            out |= _shape(v, f"{path.removesuffix('.')}[].")
    return out


def _responses(base: str, model: str) -> dict[str, set[str]]:
    """Key paths of JSON and SSE answers of both APIs from one server."""
    out: dict[str, set[str]] = {}
    for api, body in (("completions", {"prompt": "hello"}),
                      ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = httpx.post(f"{base}/v1/{api}", timeout=300,
                       json={"model": model, "max_tokens": 3, **body})
        assert r.status_code == 200, r.text
        out[f"{api} JSON"] = _shape(r.json())
        with httpx.stream("POST", f"{base}/v1/{api}", timeout=300, json={
                "model": model, "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True}, **body}) as sse:
            events = [json.loads(line[6:]) for line in sse.iter_lines()
                      if line.startswith("data: {")]
        out[f"{api} SSE"] = set().union(*(_shape(ev) for ev in events[:-1]))
        out[f"{api} SSE usage event"] = _shape(events[-1])
    return out


def _leaves(paths: set[str]) -> set[str]:
    """Paths with nothing below them (null or scalar values)."""
    return {p for p in paths if not any(q.startswith(p + ".") for q in paths)}


#: Sent by vLLM only with ``--enable-prompt-tokens-details`` (JSON: null without it, SSE:
#: absent); the local servers have it on, a ``--vllm-url`` server may not.
OPTIONAL = "usage.prompt_tokens_details"
#: What the gateway reads from an answer; both servers must send it.
READ_BY_GATEWAY = {"model", "usage.prompt_tokens", "usage.completion_tokens",
                   "usage.total_tokens"}


def test_simulator_answers_use_real_vllm_fields(real: RealPool) -> None:
    """fidelity: the simulator's JSON and SSE answers use only real vLLM's fields"""
    real_side = _responses(real.servers[0].url, real.model)
    with simulator(real.model, "a1") as sim:
        sim_side = _responses(sim, real.model)
    problems = []
    for kind, keys in sim_side.items():
        theirs = real_side[kind]
        # Where vLLM sent null, the simulator may fill in vLLM's object; it always sends
        # what vLLM sends only with --enable-prompt-tokens-details (benchmarks read it).
        invented = {k for k in keys - theirs
                    if not any(k.startswith(leaf + ".") for leaf in _leaves(theirs))
                    and not (k.startswith(OPTIONAL) and not theirs & {OPTIONAL})}
        if invented:
            problems.append(f"{kind}: the simulator sends {sorted(invented)}, vLLM does not")
    for kind in ("completions JSON", "chat/completions JSON", "completions SSE usage event",
                 "chat/completions SSE usage event"):
        for side, shapes in (("vLLM", real_side), ("the simulator", sim_side)):
            missing = READ_BY_GATEWAY - shapes[kind]
            if missing:
                problems.append(f"{kind}: {side} lacks {sorted(missing)}")
    assert not problems, "\n".join(problems)


# --- KV events: the real side of the fidelity check ----------------------------------------

def test_kv_event_layout_matches_the_recorded_fixture(real: RealPool) -> None:
    """KV events: real vLLM's ZMQ/msgpack layout (stored, evicted) matches the committed fixture"""
    local_only(real, "needs the KV-event endpoint make test-vllm gives the small server")
    server = real.server("small-kv")
    assert real.venv is not None and server.kv_events_address is not None
    out = real.workdir / "kv_layout.json"
    cap = subprocess.Popen(
        [str(real.venv / "bin" / "python"), str(Path(__file__).parent / "kv_capture.py"),
         server.kv_events_address, str(out), "--seconds", "600", "--connect"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert cap.stdout is not None and cap.stdout.readline().strip() == "ready"
        # ~500-token prompts store ~16 of the 39 blocks each, so the third evicts; the
        # second extends the first, so its stored blocks have a parent.
        first = words(1000, 300)
        prompts = [first, first + " " + words(1001, 300),
                   *(words(1000 + i, 500) for i in range(2, 5))]
        for prompt in prompts:
            r = httpx.post(server.url + "/v1/completions", timeout=300,
                           json={"model": real.model, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200, r.text
        assert cap.wait(WAIT) == 0, cap.stdout.read()
    finally:
        if cap.poll() is None:
            cap.kill()
            cap.wait()
    seen = json.loads(out.read_text())
    assert seen["facts"]["block_size"] == [32] and seen["facts"]["tokens_per_block"] == [32]
    assert seen["counts"]["BlockRemoved"] > 0
    recorded = json.loads(KV_LAYOUT.read_text())
    now = {"vllm_version": seen["vllm_version"], **comparable(seen)}
    assert now == recorded, (
        f"real vLLM's KV-event layout differs from {KV_LAYOUT.name}; if the change is real, "
        f"copy {out} there (without 'counts' and 'sequence_steps') and update the simulator")


# --- the precise prefix index (epp/kvcache) fed by vLLM's real KV events -------------------

class IndexOnLoop:
    """``epp/kvcache``'s subscriber and block index on their own event loop, as in the EPP;
    the check's thread asks the loop for scores (the index is not thread-safe)."""

    def __init__(self, source: KVEventSource, block_size: int) -> None:
        self.source = source
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.index = KVBlockIndex(IndexConfig(block_size=block_size))
        self.sub = KVEventSubscriber(source, self.index, KVEventMetrics(CollectorRegistry()),
                                     SubscriberConfig(reconnect_max=1.0))

    def call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def score(self, tokens: list[int]) -> int:
        """Leading blocks of ``tokens`` the index says the server holds."""
        return self.call(lambda: self.index.score(tokens, self.source.model)).get(
            self.source.endpoint, 0)

    def __enter__(self) -> IndexOnLoop:
        self.thread.start()
        self.call(self.sub.start)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.sub.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def tokenize(server: VllmServer, model: str, text: str) -> list[int]:
    """The prompt's token ids as vLLM itself makes them (``/tokenize``)."""
    r = httpx.post(server.url + "/tokenize", json={"model": model, "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    tokens: list[int] = r.json()["tokens"]
    return tokens


def test_precise_index_agrees_with_what_vllm_reports_cached(real: RealPool) -> None:
    """precise prefix: the index fed by vLLM's KV events scores what vLLM reports cached"""
    local_only(real, "needs the small server's KV events and sha256_cbor hashes")
    server = real.server("small-kv")
    assert server.kv_events_address is not None
    bs = 32  # the small server's --block-size
    source = KVEventSource(endpoint=server.key, address=server.kv_events_address,
                           model=real.model)
    # A plain SUB socket beside the index's: the engine's own block hashes, to compare with
    # the simulator's BlockHasher for the same token ids.
    raw = zmq.Context.instance().socket(zmq.SUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.connect(server.kv_events_address)
    engine_hashes: set[int] = set()

    def heard(want: list[int]) -> bool:
        while raw.poll(0):
            _, _, payload = parse_message(raw.recv_multipart())
            for ev in decode_batch(payload).events:
                if isinstance(ev, BlockStored):
                    engine_hashes.update(hash_to_u64(h) for h in ev.block_hashes)
        return set(want) <= engine_hashes

    def prompt(seed: int, n: int, prefix: str = "") -> tuple[str, list[int]]:
        """A prompt whose length is not a whole number of blocks (vLLM then computes the last
        block again, and reports one block fewer cached than it holds)."""
        text = (prefix + " " if prefix else "") + words(seed, n)
        tokens = tokenize(server, real.model, text)
        while len(tokens) % bs == 0:
            text += " " + words(seed + 1, 1)
            tokens = tokenize(server, real.model, text)
        return text, tokens

    with IndexOnLoop(source, bs) as ix:
        def send(text: str, tokens: list[int]) -> tuple[int, int]:
            """(blocks the index predicted cached, tokens vLLM reports cached), after which
            the index has heard of every full block of the prompt."""
            predicted = ix.score(tokens)
            hits = total(scrape(server), "vllm:prefix_cache_hits_total")
            r = httpx.post(server.url + "/v1/completions", timeout=300, json={
                "model": real.model, "prompt": text, "max_tokens": 1})
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] == len(tokens), "/tokenize and serving disagree"
            cached: int = usage["prompt_tokens_details"]["cached_tokens"]
            until(f"vLLM's prefix_cache_hits_total to rise by the {cached} cached tokens",
                  lambda: total(scrape(server), "vllm:prefix_cache_hits_total") - hits
                  == cached)
            until("the index to hold every full block of the prompt just served",
                  lambda: ix.score(tokens) == len(tokens) // bs)
            return predicted, cached

        until("the index's subscriber to connect", lambda: ix.call(lambda: ix.sub.connected))
        # ZMQ delivers only what is published after the subscription arrives: retry a fresh
        # prompt until its blocks show, so the checks below see every event.
        for seed in range(5):
            _, warm = prompt(5000 + seed, 40)
            httpx.post(server.url + "/v1/completions", timeout=300, json={
                "model": real.model, "prompt": warm, "max_tokens": 1})
            with contextlib.suppress(AssertionError):
                until("a warm-up prompt in the index",
                      lambda w=warm: ix.score(w) == len(w) // bs and heard([]), timeout=20)
                break
        else:
            raise AssertionError("the index never heard of a warm-up prompt's blocks")

        a_text, a = prompt(5100, 150)  # fresh: nothing cached
        assert send(a_text, a) == (0, 0)
        want = [external(h) for h in BlockHasher(HASH_ALGO, DEFAULT_NONE_HASH_SEED)
                .block_hashes(a, bs)]
        until("vLLM's BlockStored hashes to be the ones the simulator computes for the "
              "same tokens (sha256_cbor)", lambda: heard(want))

        full = len(a) // bs
        assert send(a_text, a) == (full, full * bs)  # the same prompt: every full block hits

        b_text, b = prompt(5101, 80, prefix=a_text)  # extends the first prompt
        predicted, cached = send(b_text, b)
        assert predicted > 0 and cached == predicted * bs, (predicted, cached)

        # Fresh prompts until vLLM evicts some of the first prompt's blocks (40 blocks in
        # all); the index learns of it only from BlockRemoved events.
        for seed in range(5200, 5210):
            c_text, c = prompt(seed, 300)
            predicted, cached = send(c_text, c)
            assert (predicted, cached) == (0, 0)
            if ix.score(a) < full:
                break
        else:
            raise AssertionError("the first prompt's blocks were never evicted")
        predicted, cached = send(a_text, a)
        assert predicted < full and cached == predicted * bs, (predicted, cached)
    raw.close()


# --- P/D: llm-d's shared-storage mode over vLLM's ExampleConnector -------------------------

def labelled(page: Samples, name: str, **labels: str) -> float:
    """``name`` summed over the series whose labels include ``labels``."""
    return sum(v for lab, v in page.get(name, []) if labels.items() <= lab.items())


def by_source(page: Samples) -> dict[str, float]:
    """``vllm:prompt_tokens_by_source`` per source (``local_compute``, ``local_cache_hit``,
    ``external_kv_transfer``: how each prompt token was obtained)."""
    return {lab["source"]: v for lab, v in page.get("vllm:prompt_tokens_by_source_total", [])}


def test_pd_shared_storage_decoder_loads_the_prompt_instead_of_computing_it(
        real: RealPool, real_pd: PDPool) -> None:
    """P/D: the decoder loads the prompt's KV from shared storage, answers as aggregated"""
    pd = real_pd
    assert pd.gateway is not None
    model = pd.model
    info = scrape(pd.decoder)["vllm:cache_config_info"][0][0]
    bs = int(info["block_size"])
    # ExampleConnector stores the whole blocks of a prompt's first n-1 tokens, (n-1)//bs*bs,
    # in a folder named by them, and looks a prompt up by (n-2)//bs*bs tokens: the two differ
    # (the prompt is never found) when n % bs == 1. n % bs == 0 would work but leaves a whole
    # block to compute; both are avoided, so the decoder loads (n-2)//bs*bs tokens.
    text = words(7000, 300)
    tokens = tokenize(pd.prefiller, model, text)
    while len(tokens) % bs in (0, 1):
        text += " " + words(7001, 1)
        tokens = tokenize(pd.prefiller, model, text)
    n = len(tokens)
    loaded = (n - 2) // bs * bs
    assert loaded > 0, (n, bs)
    body = {"model": model, "prompt": text, "max_tokens": 8, "temperature": 0}

    # The aggregated run: the same request through the aggregated gateway (no connector).
    agg = gw(real, "/v1/completions", body)
    assert agg.status_code == 200, agg.text
    want = agg.json()["choices"][0]["text"]

    folders = set(pd.shared_dir.iterdir())
    prefill0, decode0 = scrape(pd.prefiller), scrape(pd.decoder)
    r = httpx.post(pd.gateway.url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    answer = r.json()

    # The EPP named the prefiller; the sidecar's prefill leg succeeded (no fallback).
    side = samples(pd.sidecar_metrics())
    assert labelled(side, "pd_sidecar_requests_total", mode="disaggregated") == 1, side
    assert total(side, "pd_sidecar_prefill_fallbacks_total") == 0, side
    # The prefiller computed the whole prompt, generated the leg's one token, and wrote its
    # KV to one new folder of the shared storage.
    prefill = until("the prefiller's counters to show the prefill leg", lambda: (
        p if by_source(p := scrape(pd.prefiller)).get("local_compute", 0)
        - by_source(prefill0).get("local_compute", 0) >= n else None))
    assert total(prefill, "vllm:generation_tokens_total") \
        - total(prefill0, "vllm:generation_tokens_total") == 1
    new = set(pd.shared_dir.iterdir()) - folders
    assert len(new) == 1 and any(f.suffix == ".safetensors" for f in next(iter(new)).iterdir()), \
        sorted(map(str, new))
    # The decoder loaded the block-aligned prompt from the connector and computed only the
    # rest: no local prefix-cache hit (it never saw the prompt), the connector's hits rise.
    decode = until("the decoder's counters to show the decode leg", lambda: (
        d if total(d := scrape(pd.decoder), "vllm:request_success_total")
        > total(decode0, "vllm:request_success_total") else None))
    moved = {k: by_source(decode).get(k, 0) - by_source(decode0).get(k, 0)
             for k in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    assert moved == {"local_compute": n - loaded, "local_cache_hit": 0,
                     "external_kv_transfer": loaded}, (n, bs, moved)
    for name, rise in (("vllm:external_prefix_cache_hits_total", loaded),
                       ("vllm:prefix_cache_hits_total", 0)):
        assert total(decode, name) - total(decode0, name) == rise, name
    usage = answer["usage"]
    assert usage["prompt_tokens"] == n
    assert usage["prompt_tokens_details"]["cached_tokens"] == loaded
    # Same greedy answer as the aggregated run: the loaded KV is the prompt's.
    assert answer["choices"][0]["text"] == want
    assert usage["completion_tokens"] == agg.json()["usage"]["completion_tokens"]
