"""``precise-prefix-cache-scorer`` end to end: real Envoy → real ``epp`` process (with
``token-producer`` asking a simulator's ``/tokenize``) → simulated vLLM servers publishing
real KV events over ZMQ. The servers' caches are warmed *directly*, behind the EPP's back, so
only the events can tell the EPP where the blocks are. Both of llm-d's socket modes: the EPP
connecting to each server (``discoverPods``), and the servers, on distinct loopback IPs,
connecting to the one socket the EPP binds (``zmqEndpoint``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, ports_pool_manifests, write_yaml
from devkit.net import free_port_run
from sim import ServerConfig, start_fleet
from sim.kvevents import KVEventsConfig
from sim.profiles import TINY
from tests.support.processes import BackgroundLoop, EppProcess, pool_gateway_config

pytestmark = pytest.mark.envoy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
N = 3
OFFSET = 1000  # KV-event port = HTTP port + OFFSET (podDiscoveryConfig.socketPortOffset)
BLOCKS = 48    # small KV cache: a few long prompts evict older ones


def free_run() -> int:
    """A base port with N consecutive free ports, and N free ports OFFSET above."""
    return free_port_run(N, OFFSET)


def config(token_url: str, kv_events: str) -> str:
    return f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{modelName: {MODEL}, vllm: {{http: "{token_url}"}}}}
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {{blockSize: 16}}
    kvEventsConfig: {kv_events}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: precise-prefix-cache-scorer, weight: 10}}
  - {{pluginRef: max-score-picker}}
"""


def manifests(path: Path, base: int) -> None:
    """One pod (127.0.0.1) and a target port per server: N endpoints on one host."""
    write_yaml(path, ports_pool_manifests("sims", "127.0.0.1", [base + i for i in range(N)]))


class Rig:
    """Three simulated servers behind Envoy and the EPP.

    Discovery mode (default): one pod at 127.0.0.1, a target port per server, each server
    binding its publisher at its HTTP port + ``events_offset``. ``central``: pods at
    127.0.0.2-4 on one port, each server connecting its publisher to the EPP's
    ``zmqEndpoint`` with llm-d's topic ``kv@<pod ip>@<model>`` and binding its replay socket
    at ``podDiscoveryConfig.replaySocketPort`` on its own IP.
    """

    def __init__(self, bg: BackgroundLoop, tmp: Path, *, events_offset: int = OFFSET,
                 central: bool = False) -> None:
        self.bg = bg
        if central:
            self.base = base = free_port_run(3)  # HTTP, replay, the EPP's bound socket
            self.hosts = [f"127.0.0.{2 + i}" for i in range(N)]
            self.ports = [base] * N
            kv = [KVEventsConfig(enable_kv_cache_events=True,
                                 endpoint=f"tcp://127.0.0.1:{base + 2}",
                                 replay_endpoint=f"tcp://{h}:{base + 1}",
                                 topic="kv@{host}@{model}") for h in self.hosts]
            events = (f'{{zmqEndpoint: "tcp://127.0.0.1:{base + 2}", '
                      f"podDiscoveryConfig: {{replaySocketPort: {base + 1}}}}}")
            write_yaml(tmp / "pool.yaml", pool_manifests(
                "sims", [(f"sims-{i}", h) for i, h in enumerate(self.hosts)], base))
        else:
            self.base = base = free_run()
            self.hosts = ["127.0.0.1"] * N
            self.ports = [base + i for i in range(N)]
            kv = [KVEventsConfig(enable_kv_cache_events=True,
                                 endpoint=f"tcp://*:{base + OFFSET + i}",
                                 topic="kv@{host}@{model}") for i in range(N)]
            events = f'{{topicFilter: "kv@", podDiscoveryConfig: {{socketPortOffset: ' \
                     f"{events_offset}}}}}"
            manifests(tmp / "pool.yaml", base)
        cfgs = [ServerConfig(
            host=self.hosts[i], port=self.ports[i], name=f"sim-{i}", model=MODEL,
            time_scale=0.02, profile=TINY.with_overrides({"num_gpu_blocks": BLOCKS}),
            kv_events=kv[i]) for i in range(N)]

        async def enter() -> Any:
            cm = start_fleet(cfgs)
            return cm, await cm.__aenter__()

        self._fleet_cm, self.fleet = bg.run(enter())
        self.epp = EppProcess(tmp / "pool.yaml", "--config-text",
                              config(f"http://{self.key(0)}", events),
                              log_path=tmp / "epp.log").wait_serving()
        admin, self.port = e.free_port(), e.free_port()
        self.envoy = e.Envoy(pool_gateway_config(self.epp.port, admin, self.port),
                             admin_port=admin, workdir=tmp / "envoy").start()
        self.client = httpx.Client(timeout=30)
        self._fill = 0

    def key(self, i: int) -> str:
        return f"{self.hosts[i]}:{self.ports[i]}"

    def direct(self, i: int, prompt: str) -> None:
        """A request straight to server ``i`` (the EPP does not see it)."""
        r = self.client.post(f"http://{self.key(i)}/v1/completions",
                             json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
        assert r.status_code == 200, r.text

    def routed(self, prompt: str) -> str:
        """A request through Envoy; the server that answered."""
        r = self.client.post(f"http://127.0.0.1:{self.port}/v1/completions",
                             content=orjson.dumps({"model": MODEL, "prompt": prompt,
                                                   "max_tokens": 1}))
        assert r.status_code == 200, r.text
        return r.headers["x-inference-pod"]

    def metrics(self) -> str:
        return self.client.get(f"http://127.0.0.1:{self.epp.metrics}/metrics").text

    def indexed_blocks(self, i: int) -> int:
        want = f'inference_extension_kv_index_endpoint_blocks{{endpoint="{self.key(i)}"}} '
        for line in self.metrics().splitlines():
            if line.startswith(want):
                return int(float(line.split()[-1]))
        return 0

    def cached(self, i: int) -> int:
        return int(self.fleet.servers[i].engine.kv.num_cached)

    def until(self, cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}: {self.epp.log_tail()}")
            time.sleep(0.05)

    def subscribed(self) -> None:
        """Every server's events reach the EPP (fillers until the index shows blocks: a ZMQ
        subscriber misses what is published before it joined)."""
        for i in range(N):
            end = time.monotonic() + 20
            while self.indexed_blocks(i) == 0:
                assert time.monotonic() < end, self.epp.log_tail()
                self.direct(i, f"filler {self._fill} " * 40)
                self._fill += 1
                time.sleep(0.1)

    def in_step(self) -> None:
        """The EPP's index holds exactly what each server's cache holds."""
        self.until(lambda: all(self.indexed_blocks(i) == self.cached(i) for i in range(N)),
                   "index in step with the servers")

    def stop(self) -> None:
        self.client.close()
        self.envoy.stop()
        self.epp.stop()
        self.bg.run(self._fleet_cm.__aexit__(None, None, None))


@pytest.fixture(params=["discover-pods", "zmq-endpoint"])
def rig(bg: BackgroundLoop, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = Rig(bg, tmp_path, central=request.param == "zmq-endpoint")
    yield r
    r.stop()


def prefix(tag: str, blocks: int = 8) -> str:
    text = f"[{tag}] system prompt shared by many requests. " * 40
    return text[: blocks * 16 * 4]  # 4 bytes per simulator token, 16 tokens per block


def test_shared_prefixes_go_where_the_blocks_really_are_and_follow_eviction(rig: Rig) -> None:
    rig.subscribed()
    a, b = prefix("alpha"), prefix("beta")
    rig.direct(2, a + " warm")
    rig.direct(1, b + " warm")
    rig.in_step()
    picks = [(rig.routed(a + f" question {n}"), rig.routed(b + f" question {n}"))
             for n in range(4)]
    assert all(pa == "sim-2" and pb == "sim-1" for pa, pb in picks), picks

    # sim-2 evicts prefix a under pressure (its cache holds BLOCKS blocks), sim-0 gets it.
    for n in range(4):
        rig.direct(2, prefix(f"pressure {n}", 14) + " x")
    rig.direct(0, a + " warm again")
    rig.in_step()
    assert rig.routed(a + " after eviction") == "sim-0"
    rig.in_step()
    # /debug/pool shows per endpoint the blocks its events say it holds: its real cache.
    debug = rig.client.get(f"http://127.0.0.1:{rig.epp.metrics}/debug/pool").json()
    assert {ep["address"]: ep["kv_cached_blocks"] for ep in debug["endpoints"]} == \
        {rig.key(i): rig.cached(i) for i in range(N)}
    assert "inference_extension_precise_prefix_fallback_total" in rig.metrics()


def test_a_dead_event_stream_degrades_to_approximate_with_a_warning(
        bg: BackgroundLoop, tmp_path: Path) -> None:
    # The EPP looks for events where nothing publishes: every stream is dead.
    rig = Rig(bg, tmp_path, events_offset=OFFSET + 3 * N + 7)
    try:
        shared = prefix("gamma")
        picks = [rig.routed(shared + f" q{n}") for n in range(6)]
        # Approximate: the first pick is learnt, the same prefix follows it (random would
        # spread six picks over three servers).
        assert len(set(picks)) == 1, picks
        metrics = rig.metrics()
        assert 'inference_extension_precise_prefix_fallback_total{reason="no_stream"} 6.0' \
            in metrics, metrics
        log = Path(tmp_path / "epp.log").read_text()
        assert "precise prefix scoring degraded to approximate" in log
    finally:
        rig.stop()
