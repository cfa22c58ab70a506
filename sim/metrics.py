"""Prometheus ``/metrics`` of one simulated server, in vLLM, SGLang or TRT-LLM naming.

Gauges and counters are read from the engine at scrape time (a custom collector), so a scrape
always shows the engine's current state; latency histograms are observed by the engine through
the :class:`~sim.engine.StatsSink` protocol. Every server has its own ``CollectorRegistry`` so
many servers can live in one process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sim.engine import Engine, SimRequest
from sim.pd import KVTransfer

# vLLM's bucket boundaries, so dashboards built for vLLM show sensible quantiles.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
# vLLM's NIXL transfer-time buckets; bytes: powers of 4 from 64 KiB to 16 GiB.
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(float(65536 * 4**i) for i in range(10))
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

_PREFIX = {"vllm": "vllm:", "sglang": "sglang:", "trtllm-serve": "trtllm_"}

#: vLLM's ``finished_reason`` label values of ``vllm:request_success_total`` (0.32).
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class ServerMetrics:
    """Registry, histograms and state collector of one server; also the engine's stats sink."""

    def __init__(self, engine: Engine, *, dialect: str, model_name: str,
                 gpu_cache_usage_metric: bool = False,
                 kv_transfer: KVTransfer | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        p = _PREFIX[dialect]
        # vLLM labels every per-engine series with the data-parallel engine index too.
        labels, values = (["model_name", "engine"], [model_name, "0"]) if dialect == "vllm" \
            else (["model_name"], [model_name])
        # vLLM 0.32 names the per-request mean ITL histogram request_time_per_output_token.
        tpot = f"{p}request_time_per_output_token_seconds" if dialect == "vllm" \
            else f"{p}time_per_output_token_seconds"
        self._ttft = Histogram(f"{p}time_to_first_token_seconds", "Time to first token.",
                               labels, buckets=TTFT_BUCKETS,
                               registry=self.registry).labels(*values)
        self._itl = Histogram(f"{p}inter_token_latency_seconds", "Time between tokens.",
                              labels, buckets=ITL_BUCKETS,
                              registry=self.registry).labels(*values)
        self._tpot = Histogram(tpot, "Mean time per output token of a request.", labels,
                               buckets=ITL_BUCKETS, registry=self.registry).labels(*values)
        self._e2e = Histogram(f"{p}e2e_request_latency_seconds", "End-to-end request latency.",
                              labels, buckets=E2E_BUCKETS,
                              registry=self.registry).labels(*values)
        self._queue = Histogram(f"{p}request_queue_time_seconds", "Time spent waiting.",
                                labels, buckets=E2E_BUCKETS,
                                registry=self.registry).labels(*values)
        #: Finished requests by OpenAI ``finish_reason`` (vLLM's ``finished_reason`` label).
        self.finished_by_reason: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.registry.register(_StateCollector(engine, dialect, model_name,
                                               gpu_cache_usage_metric, self.finished_by_reason,
                                               kv_transfer))
        if kv_transfer is not None and dialect == "vllm":
            xfer = Histogram("vllm:nixl_xfer_time_seconds",
                             "Duration of NIXL KV cache transfers (decode side).",
                             buckets=XFER_BUCKETS, registry=self.registry)
            size = Histogram("vllm:nixl_bytes_transferred",
                             "Bytes per NIXL KV cache transfer (decode side).",
                             buckets=BYTES_BUCKETS, registry=self.registry)

            def observe(seconds: float, nbytes: int) -> None:
                xfer.observe(seconds)
                size.observe(nbytes)

            kv_transfer.observer = observe
        engine.stats = self

    # -- StatsSink ---------------------------------------------------------------------------
    def observe_ttft(self, seconds: float) -> None:
        """Record one time to first token."""
        self._ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        """Record one inter-token gap."""
        self._itl.observe(seconds)

    def observe_queue_time(self, seconds: float) -> None:
        """Record how long a request waited before first being scheduled."""
        self._queue.observe(seconds)

    def observe_finished(self, req: SimRequest) -> None:
        """Record end-to-end latency and mean time per output token of a finished request."""
        if req.finish_time is None:
            return
        reason = req.finish_reason
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
        self._e2e.observe(req.finish_time - req.arrival)
        if req.generated > 1 and req.first_token_time is not None:
            self._tpot.observe((req.finish_time - req.first_token_time) / (req.generated - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges and counters computed from the engine when scraped."""

    def __init__(self, engine: Engine, dialect: str, model_name: str,
                 gpu_cache_usage_metric: bool, finished_by_reason: dict[str, int],
                 kv_transfer: KVTransfer | None = None) -> None:
        self.engine = engine
        self.kv_transfer = kv_transfer
        self.dialect = dialect
        self.model_name = model_name
        self.gpu_cache_usage_metric = gpu_cache_usage_metric
        self.finished_by_reason = finished_by_reason
        # vLLM adds the data-parallel engine index to every per-engine series.
        self._labels = ["model_name", "engine"] if dialect == "vllm" else ["model_name"]
        self._values = [model_name, "0"] if dialect == "vllm" else [model_name]
        self._lora_version = -1
        #: Every LoRA label set seen → when it was last current (vLLM keeps them all).
        self._lora_history: dict[tuple[str, str], float] = {}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self._labels)
        g.add_metric(self._values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=self._labels)
        c.add_metric(self._values, value)
        return c

    @staticmethod
    def _plain_counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc)
        c.add_metric([], value)
        return c

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        p = e.profile
        if self.dialect == "vllm":
            yield self._gauge("vllm:num_requests_running", "Requests in the running batch.",
                              e.num_running)
            yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                              e.num_waiting)
            yield self._gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).",
                              e.kv.usage)
            if self.gpu_cache_usage_metric:
                yield self._gauge("vllm:gpu_cache_usage_perc", "GPU KV cache usage (1 = 100%).",
                                  e.kv.usage)
            yield self._lora_info()
            info = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration.",
                                     labels=["block_size", "num_gpu_blocks", "cache_dtype",
                                             "enable_prefix_caching", "engine"])
            info.add_metric([str(p.block_size), str(p.num_gpu_blocks), "auto", "True", "0"],
                            1.0)
            yield info
            yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up.",
                                e.prefix_queries_total)
            yield self._counter("vllm:prefix_cache_hits", "Prompt tokens found in the cache.",
                                e.prefix_hits_total)
            yield self._counter("vllm:num_preemptions", "Preempted requests.",
                                e.preemptions_total)
            yield self._counter("vllm:mm_cache_queries",
                                "Multimodal items looked up in the encoder cache.",
                                e.mm_cache_queries_total)
            yield self._counter("vllm:mm_cache_hits",
                                "Multimodal items found in the encoder cache.",
                                e.mm_cache_hits_total)
            success = CounterMetricFamily("vllm:request_success", "Finished requests.",
                                          labels=[*self._labels, "finished_reason"])
            for reason, count in self.finished_by_reason.items():
                success.add_metric([*self._values, reason], count)
            yield success
            pd = self.kv_transfer
            if pd is not None:
                yield self._counter("vllm:external_prefix_cache_queries",
                                    "Prompt tokens offered to the KV connector.",
                                    e.external_queries_total)
                yield self._counter("vllm:external_prefix_cache_hits",
                                    "Prompt tokens loaded through the KV connector.",
                                    e.external_hits_total)
                yield self._plain_counter("vllm:nixl_num_failed_transfers",
                                          "Failed NIXL KV transfers (decode side).",
                                          pd.failed_transfers_total)
                yield self._plain_counter("vllm:nixl_num_kv_expired_reqs",
                                          "Prefills whose KV expired before a decoder read it.",
                                          pd.expired_total)
        elif self.dialect == "sglang":
            yield self._gauge("sglang:num_running_reqs", "Running requests.", e.num_running)
            yield self._gauge("sglang:num_queue_reqs", "Queued requests.", e.num_waiting)
            yield self._gauge("sglang:token_usage", "KV token usage (1 = 100%).", e.kv.usage)
            hit_rate = e.prefix_hits_total / e.prefix_queries_total if e.prefix_queries_total else 0
            yield self._gauge("sglang:cache_hit_rate", "Prefix cache hit rate.", hit_rate)
            info = GaugeMetricFamily("sglang:cache_config_info", "KV cache configuration.",
                                     labels=["page_size", "num_pages"])
            info.add_metric([str(p.block_size), str(p.num_gpu_blocks)], 1.0)
            yield info
        else:
            yield self._gauge("trtllm_num_requests_running", "Running requests.", e.num_running)
            yield self._gauge("trtllm_num_requests_waiting", "Waiting requests.", e.num_waiting)
            yield self._gauge("trtllm_kv_cache_utilization", "KV cache utilization (0..1).",
                              e.kv.usage)
        prefix = _PREFIX[self.dialect]
        yield self._counter(f"{prefix}prompt_tokens", "Prompt tokens processed.",
                            e.prompt_tokens_total)
        yield self._counter(f"{prefix}generation_tokens", "Tokens generated.",
                            e.generation_tokens_total)

    def _lora_info(self) -> GaugeMetricFamily:
        """vLLM's LoRA gauge: the labels carry the state, the value when it was last current.

        As in vLLM 0.32: no sample before the engine's first step (vLLM sets it from each
        step's scheduler stats), and every label set ever seen stays on the page with the
        time it was last current, so the current state is the sample with the largest value.
        """
        e = self.engine
        g = GaugeMetricFamily("vllm:lora_requests_info", "Running and waiting LoRA adapters.",
                              labels=["max_lora", "running_lora_adapters",
                                      "waiting_lora_adapters"])
        if e.steps_total == 0 and e.lora_version == 0:
            return g
        if e.lora_version != self._lora_version:
            self._lora_version = e.lora_version
            state = (",".join(e.loras.running_adapters), ",".join(e.waiting_adapters))
            # Strictly newer than any older state, even within one clock tick.
            newest = max(self._lora_history.values(), default=0.0)
            self._lora_history.pop(state, None)
            self._lora_history[state] = max(time.time(), newest + 1e-6)
        for (running, waiting), stamp in self._lora_history.items():
            g.add_metric([str(e.profile.max_loras), running, waiting], stamp)
        return g
