"""The routing sidecar's HTTP proxy: prefill on the EPP's prefiller, decode on the local server.

Request life (``POST /v1/completions`` and ``/v1/chat/completions``):

1. The ``x-prefiller-host-port`` header is removed, and so is any ``kv_transfer_params`` the
   client put in the body: only this sidecar talks the connector protocol to the decoder.
2. No header, or no entry the :class:`~sidecar.allowlist.PrefillerPolicy` accepts → the
   request goes to the local decode server as it is (a rejected header is counted).
3. Otherwise the *prefill leg* (:func:`modelserver.pd.prefill_leg_body`) goes to the prefiller.
   Its answer decides:

   * 2xx with NixlConnector ``kv_transfer_params`` → the *decode leg*: the client's body plus
     those params, to the local server, its answer streamed back unchanged;
   * with ``--kv-connector shared-storage`` (vLLM's ``ExampleConnector``, the former
     ``SharedStorageConnector``: the prefiller writes the prompt's KV to a shared folder and
     the decoder finds it by the prompt's tokens, no params travel) the prefill leg carries
     no ``kv_transfer_params``, any 2xx answer counts, and the decode leg is the client's
     body unchanged, as llm-d's ``shared-storage`` connector does;
   * 400-451 → the prefiller's error goes back to the client with its status (the request
     itself is wrong; the decoder would refuse it too);
   * unreachable, timed out, another status, or an answer without usable params → the
     request is decoded locally as if no prefiller had been named (counted by reason; the
     client sees no error, only a slower first token).

   With ``--enable-p2p-pull`` (llm-d-router v0.10), an ``x-kv-cache-source-host-port`` the
   policy accepts (an endpoint of the pool) adds ``remote_kv_source: {kv_request_id,
   remote_host, remote_port}`` to the ``kv_transfer_params`` of the leg that computes the
   prompt (the prefill leg, else the local decode request), so that server pulls the cached
   prefix from that pod instead of recomputing it. The header never reaches a model server;
   a malformed, refused or (without the flag) unwanted one is ignored and counted.

With ``--ec-connector ec-example`` and ``x-encoder-hosts-ports`` (E/PD and E/P/D, llm-d-router
v0.10) the *encode stage* runs first, on chat requests with multimodal items
(:mod:`modelserver.multimodal`): each unique item goes to an encoder the policy accepts (round robin
over the header's entries, all at once) as the client's body with ``messages`` reduced to one
user message holding that item, ``max_tokens`` 1 and not streamed; the encoders publish the
embeddings through vLLM's EC connector, where the prefill or decode server reads them. An
encoder's 400-451 goes back to the client; unreachable, timed out or another status: the items
are left to the prefill/decode server to encode (counted by reason; llm-d answers 502 instead).
The header never reaches a model server.

4. Errors of the decode leg go back with the decoder's status; a decoder that cannot be
   reached is a 503. Every error the sidecar makes itself is an OpenAI-style JSON body.

Other paths are passed to the local server (``/metrics``, ``/v1/models``, ...), bodies
without ``kv_transfer_params`` too; ``GET /health`` is answered by the sidecar.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
import structlog
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter

from modelserver.multimodal import ENCODER_HEADER, mm_items, unique_items
from modelserver.pd import (
    KV_SOURCE_HEADER,
    KV_TRANSFER_PARAMS,
    PREFILLER_HEADER,
    REMOTE_KV_SOURCE,
    TOKEN_LIMIT_FIELDS,
    ParamsError,
    RemotePrefill,
    prefill_leg_body,
    split_host_ports,
)
from shared.errors import BadRequest, GatewayError, ServiceUnavailable
from sidecar.allowlist import PrefillerPolicy

log = structlog.get_logger(__name__)

#: The OpenAI paths that take part in P/D (llm-d's sidecar intercepts the same two).
PD_PATHS: Final = ("/v1/completions", "/v1/chat/completions")
#: llm-d's connector protocols implemented here (``sglang`` is not).
KV_CONNECTORS: Final = ("nixlv2", "shared-storage")
#: llm-d's encoder connectors implemented here: ``ec-example`` (vLLM's
#: ECSharedStorageConnector: encoders write, the model server reads; nothing travels).
EC_CONNECTORS: Final = ("ec-example",)
#: Prompts can be long; the body is read whole to build both legs.
MAX_BODY: Final = 256 * 1024 * 1024
#: Request headers not forwarded: hop-by-hop ones, the ones aiohttp recomputes, ours.
_DROP_REQUEST: Final = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "proxy-connection", "expect", PREFILLER_HEADER, KV_SOURCE_HEADER,
    ENCODER_HEADER})
_DROP_RESPONSE: Final = frozenset({
    "content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """What the proxy needs at run time (built from the flags by :mod:`sidecar.main`)."""

    #: Base URL of the local decode server, e.g. ``http://127.0.0.1:8001``.
    decoder_url: str
    #: Pick a random accepted prefiller among the header's entries instead of the first.
    prefiller_sampling: bool = False
    #: Seconds the prefill leg may take before the request is decoded locally.
    prefill_timeout: float = 60.0
    #: ``http`` or ``https`` towards prefillers.
    prefiller_scheme: str = "http"
    #: llm-d's connector protocol: ``nixlv2`` or ``shared-storage`` (:data:`KV_CONNECTORS`).
    kv_connector: str = "nixlv2"
    #: llm-d's ``--ec-connector``: ``ec-example`` runs the encode stage; empty: none (the
    #: ``x-encoder-hosts-ports`` header is ignored, as llm-d does).
    ec_connector: str = ""
    #: Honour ``x-kv-cache-source-host-port`` (llm-d's ``--enable-p2p-pull``).
    enable_p2p_pull: bool = False
    #: Port of the servers' P2P tier (llm-d's ``--p2p-connector-port``); 0 = the port the
    #: header names (the simulator serves pulls on its HTTP port).
    p2p_connector_port: int = 7777

    def __post_init__(self) -> None:
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_connector must be one of {', '.join(KV_CONNECTORS)}")
        if self.ec_connector not in ("", *EC_CONNECTORS):
            raise ValueError(f"ec_connector must be empty or one of {', '.join(EC_CONNECTORS)}")
        if self.enable_p2p_pull and self.kv_connector != "nixlv2":
            raise ValueError("enable_p2p_pull needs the nixlv2 connector (llm-d: NIXLv2 with "
                             "--enable-p2p-pull, or its offloading connector)")


class SidecarMetrics:
    """The sidecar's own counters (served on ``--metrics-port``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "pd_sidecar_requests", "Inference requests by how they were served "
            "(disaggregated: prefilled remotely; local: decode server alone).",
            ["mode"], registry=self.registry)
        self.fallbacks = Counter(
            "pd_sidecar_prefill_fallbacks",
            "Prefill legs that failed and were replaced by a local prefill, by reason.",
            ["reason"], registry=self.registry)
        self.rejected = Counter(
            "pd_sidecar_prefiller_rejected",
            "Requests whose x-prefiller-host-port named no allowed prefiller (ignored).",
            registry=self.registry)
        self.encode_items = Counter(
            "pd_sidecar_encode_items",
            "Multimodal items of the encode stage by outcome (encoded on an encoder; or left "
            "to the prefill/decode server: failed, unreachable, timeout, error_status, "
            "rejected).", ["outcome"], registry=self.registry)
        self.kv_sources = Counter(
            "pd_sidecar_kv_source",
            "x-kv-cache-source-host-port headers by outcome (used; ignored: pulls off, "
            "malformed, not a pool endpoint).", ["outcome"], registry=self.registry)


class _Fallback(Exception):
    """The prefill leg failed in a way the decode server can make up for."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _error(exc: GatewayError) -> web.Response:
    return web.Response(body=orjson.dumps(exc.to_json()), status=exc.status,
                        content_type="application/json")


#: A body orjson refuses but Python's json (what the model server may use) reads: NaN,
#: Infinity, a lone surrogate escape. The sidecar cannot strip ``kv_transfer_params`` from
#: what it cannot parse, so such a body is refused rather than forwarded unchecked.
UNCHECKABLE = ("request body holds JSON this proxy cannot check (NaN, Infinity or an unpaired "
               "surrogate escape); send standard JSON")


def _lenient_json(raw: bytes) -> bool:
    """True when Python's json reads ``raw`` (although orjson did not)."""
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


def _without_kv_params(raw: bytes) -> bytes:
    """``raw`` without a top-level ``kv_transfer_params`` (other APIs, e.g. ``/v1/responses``,
    reach vLLM's connector too); bodies that are not JSON pass unchanged; JSON that only a
    lenient parser reads is :class:`BadRequest` (it could carry the key unseen)."""
    if not raw:
        return raw
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if _lenient_json(raw):
            raise BadRequest(UNCHECKABLE) from None
        return raw
    if b"kv_transfer" not in raw and b"\\u" not in raw:
        return raw
    if not isinstance(body, dict) or KV_TRANSFER_PARAMS not in body:
        return raw
    del body[KV_TRANSFER_PARAMS]
    return orjson.dumps(body)


def _forward_headers(headers: Mapping[str, str], request_id: str) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in headers.items() if k.lower() not in _DROP_REQUEST)
    out["x-request-id"] = request_id
    return out


class Sidecar:
    """The aiohttp application and the two legs of every disaggregated request."""

    def __init__(self, cfg: SidecarConfig, policy: PrefillerPolicy,
                 metrics: SidecarMetrics | None = None, *, rng: random.Random | None = None
                 ) -> None:
        self.cfg = cfg
        self.policy = policy
        self.metrics = metrics or SidecarMetrics()
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None

    # -- app -----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        """The proxy application (the session opens and closes with it)."""
        app = web.Application(client_max_size=MAX_BODY)
        app.cleanup_ctx.append(self._session_ctx)
        app.router.add_get("/health", self._health)
        for path in PD_PATHS:
            app.router.add_post(path, self._inference)
        app.router.add_route("*", "/{tail:.*}", self._passthrough)
        return app

    async def _session_ctx(self, _: web.Application) -> Any:
        # No total timeout: generations can run for minutes; the prefill leg has its own.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False)
        yield
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Sidecar.app() must be running"
        return self._session

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    # -- requests --------------------------------------------------------------------------------
    async def _inference(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        wanted = split_host_ports(",".join(request.headers.getall(PREFILLER_HEADER, [])))
        request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        headers = _forward_headers(request.headers, request_id)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            if _lenient_json(raw):
                return _error(BadRequest(UNCHECKABLE))
            if wanted:
                return _error(BadRequest(f"request body is not valid JSON: {e}"))
            body = None  # not ours to judge: the decode server answers it
        if body is not None and not isinstance(body, dict):
            if wanted:
                return _error(BadRequest("request body must be a JSON object"))
            body = None
        if isinstance(body, dict) and KV_TRANSFER_PARAMS in body:
            # Only the sidecar may tell the decoder where KV lives (else: SSRF via vLLM).
            del body[KV_TRANSFER_PARAMS]
            raw = orjson.dumps(body)
        if body is not None and self.cfg.ec_connector and ENCODER_HEADER in request.headers:
            try:
                await self._encode_stage(request, body, headers, request_id)
            except _ClientError as ce:
                return ce.response
        target = self._choose(wanted, request) if body is not None else None
        source = self._kv_source(request, request_id) if body is not None else None
        if target is None:
            self.metrics.requests.labels("local").inc()
            if source is not None and body is not None:  # the decoder computes the prompt
                raw = orjson.dumps({**body, KV_TRANSFER_PARAMS: {REMOTE_KV_SOURCE: source}})
            return await self._to_decoder(request, raw, headers)
        try:
            params = await self._prefill(target, body, request.path, headers, source)
        except _Fallback as fb:
            self.metrics.fallbacks.labels(fb.reason).inc()
            self.metrics.requests.labels("local").inc()
            log.warning("prefill failed; decoding locally", prefiller=target, reason=fb.reason,
                        request_id=request_id)
            return await self._to_decoder(request, raw, headers)
        except _ClientError as ce:
            return ce.response
        self.metrics.requests.labels("disaggregated").inc()
        if params is None:  # shared storage: the decoder finds the KV by the prompt
            return await self._to_decoder(request, raw, headers)
        decode_body = dict(body)
        decode_body[KV_TRANSFER_PARAMS] = params
        return await self._to_decoder(request, orjson.dumps(decode_body), headers)

    async def _encode_stage(self, request: web.Request, body: dict[str, Any],
                            headers: CIMultiDict[str], request_id: str) -> None:
        """Send each unique multimodal item of ``body`` to an accepted encoder and wait for
        all; an encoder's client error is raised as :class:`_ClientError`, other failures
        leave the items to the prefill/decode server."""
        named = split_host_ports(",".join(request.headers.getall(ENCODER_HEADER, [])))
        items = unique_items(mm_items(body.get("messages")))
        if not named or not items:
            return
        encoders = [hp for hp in named if self.policy.allows_encoder(hp)]
        if not encoders:
            self.metrics.encode_items.labels("rejected").inc(len(items))
            log.warning("x-encoder-hosts-ports names no allowed encoder; ignored",
                        encoders=named, client=request.remote)
            return
        outcomes = await asyncio.gather(*(
            self._encode_one(encoders[i % len(encoders)], body, item.block, headers,
                             f"{request_id}-enc-{i}")
            for i, item in enumerate(items)))
        for outcome in outcomes:
            if isinstance(outcome, _ClientError):
                raise outcome
            self.metrics.encode_items.labels(outcome).inc()
            if outcome != "encoded":
                log.warning("encode failed; the model server encodes the item itself",
                            reason=outcome, request_id=request_id)

    async def _encode_one(self, encoder: str, body: dict[str, Any], block: Any,
                          headers: CIMultiDict[str], request_id: str) -> str | _ClientError:
        """One item to one encoder: ``encoded``, a fallback reason, or the client error."""
        leg = {k: v for k, v in body.items()
               if k not in ("stream_options", KV_TRANSFER_PARAMS)}
        leg["messages"] = [{"role": "user", "content": [block]}]
        leg["stream"] = False
        for field in TOKEN_LIMIT_FIELDS:
            leg[field] = 1
        leg_headers = CIMultiDict(headers)
        leg_headers["content-type"] = "application/json"
        leg_headers["x-request-id"] = request_id
        url = f"{self.cfg.prefiller_scheme}://{encoder}/v1/chat/completions"
        try:
            status, data, content_type = await self._post_leg(url, leg, leg_headers)
        except TimeoutError:
            return "timeout"
        except (aiohttp.ClientError, OSError):
            return "unreachable"
        if 400 <= status <= 451:
            return _ClientError(web.Response(body=data, status=status, headers={
                "content-type": content_type}))
        return "encoded" if 200 <= status < 300 else "error_status"

    async def _post_leg(self, url: str, leg: dict[str, Any],
                        headers: CIMultiDict[str]) -> tuple[int, bytes, str]:
        """POST one stage's leg (encode or prefill) and read its whole answer: status, body,
        content type. Raises what aiohttp raises (the callers decide what a failure means)."""
        async with self.session.post(
                url, data=orjson.dumps(leg), headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.cfg.prefill_timeout)) as resp:
            return (resp.status, await resp.read(),
                    resp.headers.get("content-type", "application/json"))

    def _choose(self, wanted: list[str], request: web.Request) -> str | None:
        if not wanted:
            return None
        allowed = [hp for hp in wanted if self.policy.allows(hp)]
        if not allowed:
            self.metrics.rejected.inc()
            log.warning("x-prefiller-host-port names no allowed prefiller; ignored",
                        prefillers=wanted, client=request.remote)
            return None
        if self.cfg.prefiller_sampling and len(allowed) > 1:
            return self._rng.choice(allowed)
        return allowed[0]

    def _kv_source(self, request: web.Request, request_id: str) -> dict[str, Any] | None:
        """The ``remote_kv_source`` params of an acceptable ``x-kv-cache-source-host-port``
        (None: no header, pulls off, malformed, or not an endpoint of the pool)."""
        raw = ",".join(request.headers.getall(KV_SOURCE_HEADER, [])).strip()
        if not raw:
            return None
        outcome = "used"
        host, sep, port = raw.rpartition(":")
        host = host.strip("[]")
        if not self.cfg.enable_p2p_pull:
            outcome = "ignored_p2p_off"
        elif not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            outcome = "ignored_malformed"
        elif not self.policy.allows_source(raw):
            outcome = "ignored_not_allowed"
        self.metrics.kv_sources.labels(outcome).inc()
        if outcome != "used":
            log.info("x-kv-cache-source-host-port ignored", value=raw, outcome=outcome,
                     client=request.remote)
            return None
        return {"kv_request_id": request_id, "remote_host": host,
                "remote_port": self.cfg.p2p_connector_port or int(port)}

    async def _prefill(self, target: str, body: dict[str, Any], path: str,
                       headers: CIMultiDict[str], source: dict[str, Any] | None = None,
                       ) -> dict[str, Any] | None:
        """The prefill leg (with the KV source, when there is one, for the prefiller to pull
        from); returns the decode leg's ``kv_transfer_params`` (None with shared storage,
        where none are needed)."""
        url = f"{self.cfg.prefiller_scheme}://{target}{path}"
        leg_headers = CIMultiDict(headers)
        leg_headers["content-type"] = "application/json"
        leg = prefill_leg_body(body)
        shared_storage = self.cfg.kv_connector == "shared-storage"
        if shared_storage:
            del leg[KV_TRANSFER_PARAMS]
        elif source is not None:
            leg[KV_TRANSFER_PARAMS] = {**leg[KV_TRANSFER_PARAMS], REMOTE_KV_SOURCE: source}
        try:
            status, data, content_type = await self._post_leg(url, leg, leg_headers)
        except TimeoutError:
            raise _Fallback("timeout") from None
        except (aiohttp.ClientError, OSError):
            raise _Fallback("unreachable") from None
        if 400 <= status <= 451:
            raise _ClientError(web.Response(body=data, status=status, headers={
                "content-type": content_type}))
        if not 200 <= status < 300:
            raise _Fallback("error_status")
        if shared_storage:
            return None
        try:
            answer = orjson.loads(data)
            params = RemotePrefill.from_json(answer.get(KV_TRANSFER_PARAMS)).to_json()
        except (orjson.JSONDecodeError, AttributeError, ParamsError):
            raise _Fallback("bad_response") from None
        return params

    async def _to_decoder(self, request: web.Request, raw: bytes,
                          headers: CIMultiDict[str]) -> web.StreamResponse:
        """Send ``raw`` to the local decode server and relay its answer (streamed)."""
        return await self._relay(request, request.method, request.path_qs, raw, headers)

    async def _passthrough(self, request: web.Request) -> web.StreamResponse:
        request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        try:
            raw = _without_kv_params(await request.read())
        except BadRequest as e:
            return _error(e)
        return await self._relay(request, request.method, request.path_qs, raw,
                                 _forward_headers(request.headers, request_id))

    async def _relay(self, request: web.Request, method: str, path_qs: str, raw: bytes,
                     headers: CIMultiDict[str]) -> web.StreamResponse:
        url = self.cfg.decoder_url + path_qs
        try:
            upstream = await self.session.request(method, url, data=raw, headers=headers)
        except (aiohttp.ClientError, OSError) as e:
            log.error("decode server unreachable", url=url, error=str(e))
            return _error(ServiceUnavailable(
                "The decode server is not ready: check that the model server is running and "
                "--vllm-port is right.", code="decoder_unavailable"))
        async with upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _DROP_RESPONSE:
                    out.headers.add(k, v)
            if upstream.content_length is not None:
                out.content_length = upstream.content_length
            await out.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
            except (aiohttp.ClientError, OSError) as e:
                # Mid-stream: the status is gone already; end the stream, the client sees a
                # truncated answer (no [DONE]) exactly as from a dying model server.
                log.warning("decode server broke off the response", url=url, error=str(e))
                if request.transport is not None:
                    request.transport.close()
                return out
            await out.write_eof()
            return out


class _ClientError(Exception):
    """The prefiller rejected the request itself; its answer goes back to the client."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response
