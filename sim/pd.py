"""Prefill/decode roles of a simulated server: vLLM's NixlConnector, simulated.

Enabled by ``--kv-transfer-config`` (vLLM's flag, e.g.
``'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'``); without it a server ignores
``kv_transfer_params`` as vLLM without a connector does.

* **Prefill side** (``kv_role`` ``kv_producer`` or ``kv_both``): a non-streaming request with
  ``kv_transfer_params.do_remote_decode: true`` runs normally, but its KV blocks stay
  allocated after it finishes, and the response carries the ``kv_transfer_params`` a decoder
  needs (:class:`modelserver.pd.RemotePrefill`). The blocks are freed when a decoder pulls them
  (``POST /sim/kv/pull``) or after ``abort_timeout`` (vLLM's
  ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, counted as expired).
* **Decode side** (``kv_consumer`` or ``kv_both``): a request with
  ``kv_transfer_params.do_remote_prefill: true`` first pulls the KV from the prefiller named
  in the params, then joins the queue with those prompt tokens already computed: it is
  charged one prompt token and no prefill overhead. A failed pull (prefiller gone, KV expired,
  wrong engine) is counted and the request recomputes its prompt locally, like vLLM's
  ``kv_load_failure_policy: recompute``.
* **Transfer time** is modelled on the prefill side, which serves the read:
  ``latency + bytes / bandwidth`` with ``bytes = tokens x kv_bytes_per_token``; transfers
  share the link first-come first-served, so concurrent pulls queue behind each other.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from aiohttp import web

from modelserver.pd import ParamsError, RemotePrefill

if TYPE_CHECKING:
    from sim.engine import Engine, SimRequest

#: Link presets: (bandwidth in bytes/s, fixed latency in s). Assumptions, not measurements:
#: ``rdma`` is one 400 Gb/s NIC at ~80% of line rate (NIXL over UCX/RDMA);
#: ``tcp`` is a 25 Gb/s path at ~80% (NIXL's TCP fallback, or a cloud without RDMA).
LINKS: Final = {"rdma": (40e9, 50e-6), "tcp": (2.5e9, 500e-6)}

#: Bytes of KV per token of Llama-3.1-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes.
KV_BYTES_PER_TOKEN_8B: Final = 131072

ROLES: Final = ("kv_producer", "kv_consumer", "kv_both")
CONNECTORS: Final = ("NixlConnector",)
_VLLM_KEYS: Final = {"kv_connector", "kv_role", "engine_id", "kv_connector_extra_config"}
_SIM_KEYS: Final = {"link", "bandwidth", "latency", "kv_bytes_per_token", "abort_timeout"}


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    """The connector, the role and the link model of one server."""

    kv_role: str = "kv_both"
    kv_connector: str = "NixlConnector"
    #: NIXL engine id; empty = one made up per server.
    engine_id: str = ""
    #: Link bandwidth in bytes per second.
    bandwidth: float = LINKS["rdma"][0]
    #: Fixed cost of one transfer in seconds.
    latency: float = LINKS["rdma"][1]
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN_8B
    #: Seconds a prefill keeps its KV for a decoder that never comes.
    abort_timeout: float = 480.0

    @property
    def produces(self) -> bool:
        """Serves prefill legs."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        """Serves decode legs."""
        return self.kv_role in ("kv_consumer", "kv_both")

    def transfer_seconds(self, tokens: int) -> float:
        """Unscaled time to move ``tokens`` tokens of KV over the link."""
        return self.latency + tokens * self.kv_bytes_per_token / self.bandwidth


def parse_kv_transfer_config(data: Any, *, where: str = "--kv-transfer-config"
                             ) -> KVTransferConfig:
    """vLLM's ``--kv-transfer-config`` object, plus the simulator's link keys.

    Accepted keys: vLLM's ``kv_connector`` (``NixlConnector``), ``kv_role``, ``engine_id``,
    ``kv_connector_extra_config`` (ignored, as the simulator has no NIXL), and the
    simulator's ``link`` (``rdma``/``tcp``), ``bandwidth`` (GB/s), ``latency`` (ms),
    ``kv_bytes_per_token``, ``abort_timeout`` (s). Unknown keys are errors.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be a JSON object")
    unknown = sorted(set(data) - _VLLM_KEYS - _SIM_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    cfg = KVTransferConfig()
    connector = data.get("kv_connector", cfg.kv_connector)
    if connector not in CONNECTORS:
        raise ValueError(f"{where}: kv_connector must be one of {', '.join(CONNECTORS)}, "
                         f"got {connector!r}")
    role = data.get("kv_role", cfg.kv_role)
    if role not in ROLES:
        raise ValueError(f"{where}: kv_role must be one of {', '.join(ROLES)}, got {role!r}")
    engine_id = data.get("engine_id", "")
    if not isinstance(engine_id, str):
        raise ValueError(f"{where}: engine_id must be a string")
    extra = data.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise ValueError(f"{where}: kv_connector_extra_config must be an object")
    bandwidth, latency = cfg.bandwidth, cfg.latency
    if "link" in data:
        if data["link"] not in LINKS:
            raise ValueError(f"{where}: link must be one of {', '.join(LINKS)}, "
                             f"got {data['link']!r}")
        bandwidth, latency = LINKS[data["link"]]
    if "bandwidth" in data:
        bandwidth = _positive(data["bandwidth"], f"{where}: bandwidth (GB/s)") * 1e9
    if "latency" in data:
        latency = _nonneg(data["latency"], f"{where}: latency (ms)") / 1000.0
    per_token = data.get("kv_bytes_per_token", cfg.kv_bytes_per_token)
    if not isinstance(per_token, int) or isinstance(per_token, bool) or per_token <= 0:
        raise ValueError(f"{where}: kv_bytes_per_token must be a positive integer")
    abort_timeout = _positive(data.get("abort_timeout", cfg.abort_timeout),
                              f"{where}: abort_timeout (s)")
    return replace(cfg, kv_role=role, kv_connector=connector, engine_id=engine_id,
                   bandwidth=bandwidth, latency=latency, kv_bytes_per_token=per_token,
                   abort_timeout=abort_timeout)


def _nonneg(value: Any, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative number")
    return float(value)


def _positive(value: Any, what: str) -> float:
    if _nonneg(value, what) == 0:
        raise ValueError(f"{what} must be positive")
    return float(value)


class PullError(Exception):
    """A KV pull the prefiller refused or could not serve."""


class KVTransfer:
    """The connector of one simulated server: holds KV for decoders, pulls KV from prefillers.

    ``time_scale`` scales transfer times like every other simulated duration.
    """

    def __init__(self, cfg: KVTransferConfig, engine: Engine, *, time_scale: float) -> None:
        self.cfg = cfg
        self.engine = engine
        self.time_scale = time_scale
        self.engine_id = cfg.engine_id or f"sim-{os.urandom(6).hex()}"
        self._link_free_at = 0.0
        self._next_block_id = 0
        self._pulling: set[str] = set()
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self._session: aiohttp.ClientSession | None = None
        # Counters (exported with vLLM's NIXL metric names by sim.metrics).
        self.transfers_total = 0
        self.bytes_total = 0
        self.failed_transfers_total = 0
        #: Requests that read (part of) their prompt from a KV source (remote_kv_source).
        self.source_pulls_total = 0
        self.expired_total = 0
        #: Called with (seconds, bytes) of each successful pull on this (decode) side.
        self.observer: Callable[[float, int], None] | None = None

    # -- prefill side ------------------------------------------------------------------------
    def held_params(self, req: SimRequest, host: str, port: int) -> dict[str, Any]:
        """The response's ``kv_transfer_params`` for a finished prefill leg; arms expiry."""
        loop = asyncio.get_running_loop()
        timeout = self.cfg.abort_timeout * self.time_scale
        self._expiry[req.id] = loop.call_later(timeout, self._expire, req.id)
        # Block ids only need to be unique per server here (no real memory behind them).
        first = self._next_block_id
        self._next_block_id += req.blocks.num_blocks
        return RemotePrefill(
            remote_engine_id=self.engine_id, remote_request_id=req.id,
            remote_block_ids=tuple(range(first, first + req.blocks.num_blocks)),
            remote_host=host, remote_port=port).to_json()

    def _expire(self, request_id: str) -> None:
        self._expiry.pop(request_id, None)
        if self.engine.release_held(request_id) is not None:
            self.expired_total += 1

    async def serve_pull(self, request: web.Request) -> web.Response:
        """``POST /sim/kv/pull {"remote_engine_id", "remote_request_id"}``: the decoder's read.

        Answers after the link time of the request's prompt KV, then frees the blocks;
        404 when nothing is held under that id (expired, already pulled, restarted).
        """
        try:
            body = await request.json()
        except ValueError:
            return _pull_error(400, "body must be JSON")
        if not isinstance(body, dict):
            return _pull_error(400, "body must be a JSON object")
        if body.get("remote_engine_id") != self.engine_id:
            return _pull_error(404, "unknown remote_engine_id")
        request_id = body.get("remote_request_id")
        req = self.engine.held.get(request_id) if isinstance(request_id, str) else None
        if req is None or request_id is None or request_id in self._pulling:
            return _pull_error(404, "no KV held for this request (expired or pulled)")
        tokens = req.prompt_tokens
        hashes = req.block_hashes
        size = tokens * self.cfg.kv_bytes_per_token
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._link_free_at)
        busy = size / self.cfg.bandwidth * self.time_scale
        self._link_free_at = start + busy
        done = start + busy + self.cfg.latency * self.time_scale
        timer = self._expiry.pop(request_id, None)
        if timer is not None:
            timer.cancel()
        self._pulling.add(request_id)
        try:
            await asyncio.sleep(max(0.0, done - now))
        finally:
            # Read or abandoned by the decoder (it went away): either way the KV is done with.
            self._pulling.discard(request_id)
            self.engine.release_held(request_id)
        self.transfers_total += 1
        self.bytes_total += size
        return web.json_response({"tokens": tokens, "bytes": size, "block_hashes": hashes})

    # -- decode side -------------------------------------------------------------------------
    async def pull(self, params: Any, req: SimRequest) -> int:
        """Read a prefill's KV for ``req``; returns the prompt tokens now computed here.

        Only the part of the pulled KV that belongs to ``req``'s own prompt counts (the block
        hashes must agree: another prompt, adapter, salt or block size gives nothing). A
        failed pull returns 0 and is counted; the caller then recomputes locally.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            remote = RemotePrefill.from_json(params)
            tokens, hashes = await self._fetch(remote)
        except (TimeoutError, ParamsError, PullError, aiohttp.ClientError, OSError):
            self.failed_transfers_total += 1
            return 0
        if self.observer is not None:
            self.observer(loop.time() - started, tokens * self.cfg.kv_bytes_per_token)
        mine = req.block_hashes
        if hashes == mine and tokens == req.prompt_tokens:
            return tokens
        same = 0
        for a, b in zip(hashes, mine, strict=False):
            if a != b:
                break
            same += 1
        return same * self.engine.kv.block_size

    async def serve_prefix(self, request: web.Request) -> web.Response:
        """``POST /sim/kv/prefix {"block_hashes"}``: how many leading blocks of that prompt
        this server holds in its prefix cache (what a P2P pull of the prefix could read)."""
        try:
            body = await request.json()
        except ValueError:
            return _pull_error(400, "body must be JSON")
        hashes = body.get("block_hashes") if isinstance(body, dict) else None
        if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
            return _pull_error(400, "'block_hashes' must be a list of integers")
        return web.json_response({"blocks": self.engine.kv.match_prefix(hashes)})

    async def pull_source(self, source: Any, req: SimRequest) -> int:
        """Read the cached prefix of ``req``'s prompt from the KV source ``source``
        (``remote_kv_source``: ``remote_host``, ``remote_port``); returns the prompt tokens
        that need not be computed here (0 when the source holds none or cannot be reached;
        counted)."""
        try:
            if not isinstance(source, dict):
                raise PullError("remote_kv_source must be an object")
            host, port = source.get("remote_host"), source.get("remote_port")
            if not isinstance(host, str) or not host or not isinstance(port, int):
                raise PullError("remote_kv_source needs remote_host and remote_port")
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
            where = f"[{host}]" if ":" in host else host
            async with self._session.post(f"http://{where}:{port}/sim/kv/prefix",
                                          json={"block_hashes": req.block_hashes}) as resp:
                if resp.status != 200:
                    raise PullError(f"KV source answered {resp.status}")
                data = await resp.json()
            blocks = data.get("blocks") if isinstance(data, dict) else None
            if not isinstance(blocks, int) or blocks < 0:
                raise PullError("KV source sent a malformed answer")
        except (TimeoutError, PullError, aiohttp.ClientError, OSError, ValueError):
            self.failed_transfers_total += 1
            return 0
        tokens = min(blocks * self.engine.kv.block_size, req.prompt_tokens)
        if tokens:
            self.source_pulls_total += 1
            self.transfers_total += 1
            self.bytes_total += tokens * self.cfg.kv_bytes_per_token
        return tokens

    async def _fetch(self, remote: RemotePrefill) -> tuple[int, list[int]]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        host = f"[{remote.remote_host}]" if ":" in remote.remote_host else remote.remote_host
        url = f"http://{host}:{remote.remote_port}/sim/kv/pull"
        async with self._session.post(url, json={
                "remote_engine_id": remote.remote_engine_id,
                "remote_request_id": remote.remote_request_id}) as resp:
            if resp.status != 200:
                raise PullError(f"prefiller answered {resp.status}")
            data = await resp.json()
        if not isinstance(data, dict):
            raise PullError("prefiller sent a malformed pull answer")
        tokens, hashes = data.get("tokens"), data.get("block_hashes")
        if not isinstance(tokens, int) or tokens < 0 or not isinstance(hashes, list):
            raise PullError("prefiller sent a malformed pull answer")
        return tokens, hashes

    async def close(self) -> None:
        """Cancel expiry timers and close the pull client."""
        for t in self._expiry.values():
            t.cancel()
        self._expiry.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _pull_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "NotFoundError"
                                        if status == 404 else "BadRequestError",
                                        "param": None, "code": status}}, status=status)
