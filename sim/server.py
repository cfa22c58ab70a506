"""One simulated model server: the aiohttp app, its listener and its engine.

Every response (errors, ``/metrics`` and ``/health`` included) carries ``x-inference-pod`` and
``x-inference-port`` so a test or benchmark behind a proxy can tell who served it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from sim.config import ServerConfig
from sim.encoder import ECStorage
from sim.engine import Engine, QueueFull
from sim.kvevents import BlockHasher, KVEventPublisher, KVEventRecorder
from sim.metrics import ServerMetrics
from sim.native import (
    AnthropicApi,
    Api,
    OpenAIApi,
    SglangGenerateApi,
    VllmGenerateApi,
    Writer,
    count_tokens_body,
    messages_prompt,
)
from sim.openai import ApiError, tokenize_input
from sim.pd import KVTransfer
from sim.runner import EngineLoop
from sim.tokenizer import count_tokens, token_ids

log = logging.getLogger("sim.server")

#: Prompts can be long (Envoy streams bodies of any size in FULL_DUPLEX_STREAMED mode).
MAX_BODY = 256 * 1024 * 1024
_JSON = "application/json"


_COMPLETIONS, _CHAT = OpenAIApi(chat=False), OpenAIApi(chat=True)
_ANTHROPIC = AnthropicApi()
_VLLM_GENERATE, _SGLANG_GENERATE = VllmGenerateApi(), SglangGenerateApi()


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type=_JSON)


def _error(exc: ApiError) -> web.Response:
    return web.Response(body=exc.body(), status=exc.status, content_type=_JSON)


class Siblings(Protocol):
    """The servers of the same process (:class:`sim.fleet.Fleet`), as a server sees them: a
    protocol, so the server does not import the fleet that builds it."""

    def server(self, port: int) -> SimServer | None:
        """The server bound to ``port``, if any."""


class SimServer:
    """A simulated vLLM (or SGLang / TRT-LLM) server on one port."""

    def __init__(self, cfg: ServerConfig, fleet: Siblings | None = None) -> None:
        self.cfg = cfg
        self.fleet = fleet
        self.faults = cfg.faults
        kv = cfg.kv_events if cfg.kv_events is not None and cfg.kv_events.active else None
        #: KV-event publisher (``--kv-events-config``); ``None`` when events are off.
        self.kv_publisher = KVEventPublisher(kv) if kv is not None else None
        self.engine = Engine(
            cfg.profile, time_scale=cfg.time_scale, seed=cfg.seed,
            random_output_length=cfg.random_output_length,
            kv_events=KVEventRecorder(self.kv_publisher.publish) if self.kv_publisher else None,
            block_hasher=BlockHasher(cfg.prefix_caching_hash_algo) if kv is not None else None)
        self.ec = ECStorage(cfg.ec_transfer) if cfg.ec_transfer is not None else None
        self.kv_transfer = (KVTransfer(cfg.kv_transfer, self.engine, time_scale=cfg.time_scale)
                            if cfg.kv_transfer is not None else None)
        self.metrics = ServerMetrics(self.engine, dialect=cfg.engine,
                                     model_name=cfg.model_names[0],
                                     gpu_cache_usage_metric=cfg.gpu_cache_usage_metric,
                                     kv_transfer=self.kv_transfer)
        self.loras: dict[str, str] = dict(cfg.lora_modules)
        self.port = cfg.port
        self.name = cfg.pod_name(cfg.port)
        self._rng = random.Random(cfg.seed ^ 0x5EED)
        self._runner: web.AppRunner | None = None
        self._loop: EngineLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._created = int(time.time())
        self.alive = False

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8001``."""
        return f"http://{self.cfg.host}:{self.port}"

    async def start(self) -> None:
        """Bind the port (0 = pick a free one), start the engine loop and schedule faults."""
        if self._loop is None:
            self._loop = EngineLoop(self.engine)
        self._loop.start()
        await self._listen()
        if self.kv_publisher is not None:
            self.kv_publisher.open(port=str(self.port), name=self.name, host=self.cfg.host,
                                   model=self.cfg.model_names[0])
        if self.faults.kill_after is not None:
            revive_after = self.faults.revive_after
            self.later(self.faults.kill_after, lambda: self.kill(revive_after))

    def later(self, delay: float, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn()`` after ``delay`` seconds unless the server is stopped first."""

        async def run() -> None:
            await asyncio.sleep(delay)
            await fn()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.cfg.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(1024)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self.name = self.cfg.pod_name(self.port)
        app = self._make_app()
        # Cancel handlers when the client goes away, so the engine drops abandoned requests;
        # a short shutdown timeout makes "kill" look like a dead pod (connections reset).
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1,
                               access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner
        self.alive = True

    async def stop(self) -> None:
        """Stop listening, drop all requests and stop the engine loop."""
        for t in list(self._tasks):
            t.cancel()
        self._tasks.clear()
        await self._unlisten()
        if self._loop is not None:
            await self._loop.stop()
        if self.kv_transfer is not None:
            await self.kv_transfer.close()
        if self.kv_publisher is not None:
            await self.kv_publisher.close()

    async def _unlisten(self) -> None:
        self.alive = False
        runner, self._runner = self._runner, None
        if runner is not None:
            self.engine.abort_all()
            await runner.cleanup()

    async def kill(self, revive_after: float | None = None) -> None:
        """Simulate a crashed pod: close the listener and connections, lose engine state."""
        if not self.alive:
            return
        await self._unlisten()
        if self._loop is not None:
            # A step in progress must not finish on the reset engine (it would end the loop).
            await self._loop.stop()
        self.engine.reset()
        if self.kv_publisher is not None:
            # A restarted vLLM has a new publisher: its sequence starts again at 0.
            await self.kv_publisher.close()
        log.info("killed %s (port %d)", self.name, self.port)
        if revive_after is not None:
            self.later(revive_after, self.revive)

    async def revive(self) -> None:
        """Bring a killed server back on the same port with a cold engine."""
        if self.alive:
            return
        await self._listen()
        if self.kv_publisher is not None:
            self.kv_publisher.open()  # same endpoints and topic as before the kill
        if self._loop is not None:
            self._loop.start()
        log.info("revived %s (port %d)", self.name, self.port)

    # -- app ---------------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.on_response_prepare.append(self._stamp)
        r = app.router
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/messages", self._messages)
        r.add_post("/v1/messages/count_tokens", self._count_tokens)
        r.add_post("/inference/v1/generate", self._vllm_generate)
        r.add_post("/generate", self._sglang_generate)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health)
        r.add_get("/ping", self._health)
        r.add_get("/metrics", self._metrics)
        r.add_get("/dcgm/metrics", self._dcgm_metrics)
        r.add_post("/v1/load_lora_adapter", self._load_lora)
        r.add_post("/v1/unload_lora_adapter", self._unload_lora)
        r.add_get("/get_load", self._get_load)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self._server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self._model_info)
        r.add_get("/version", self._version)
        r.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        r.add_post("/tokenize", self._tokenize)
        r.add_post("/v1/completions/render", self._render_completions)
        r.add_post("/v1/chat/completions/render", self._render_chat)
        r.add_get("/sim/faults", self._get_faults)
        r.add_post("/sim/faults", self._set_faults)
        r.add_get("/sim/state", self._state)
        r.add_post("/sim/kill", self._kill)
        r.add_post("/sim/revive", self._revive)
        if self.kv_transfer is not None and self.kv_transfer.cfg.produces:
            r.add_post("/sim/kv/pull", self.kv_transfer.serve_pull)
        if self.kv_transfer is not None:  # a P2P KV source: any server with a connector
            r.add_post("/sim/kv/prefix", self.kv_transfer.serve_prefix)
        return app

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-inference-pod"] = self.name
        response.headers["x-inference-port"] = str(self.port)

    # -- inference ---------------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, _COMPLETIONS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, _CHAT)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, _ANTHROPIC)

    async def _vllm_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, _VLLM_GENERATE)

    async def _sglang_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, _SGLANG_GENERATE)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        # vLLM's /v1/messages/count_tokens: the templated prompt's token count.
        try:
            body = count_tokens_body(await request.read())
            self._resolve_model(body["model"])
        except ApiError as exc:
            return web.Response(body=_ANTHROPIC.error(exc), status=exc.status,
                                content_type=_JSON)
        return _json({"input_tokens": count_tokens(messages_prompt(body))})

    def _resolve_model(self, model: str) -> str | None:
        """LoRA adapter named by ``model`` (``None`` = base model); 404 when unknown."""
        if not model or model in self.cfg.model_names:
            return None
        if model in self.loras:
            return model
        raise ApiError(404, f"The model `{model}` does not exist.")

    async def _generate(self, request: web.Request, api: Api) -> web.StreamResponse:
        def _error(exc: ApiError) -> web.Response:
            return web.Response(body=api.error(exc), status=exc.status, content_type=_JSON)

        try:
            parsed = api.parse(await request.read())
            lora = self._resolve_model(parsed.model)
        except ApiError as exc:
            return _error(exc)
        faults = self.faults
        if faults.hang:
            await asyncio.Event().wait()  # until the client or the server gives up
        if faults.error_rate > 0 and self._rng.random() < faults.error_rate:
            return _error(ApiError(faults.error_status, "Injected fault"))
        if faults.added_latency > 0:
            await asyncio.sleep(faults.added_latency)
        engine = self.engine
        p = engine.profile
        loop = asyncio.get_running_loop()
        max_tokens = parsed.max_tokens or p.default_max_tokens
        req = engine.new_request(parsed.prompt, max_tokens, lora=lora, now=loop.time(),
                                 lora_path=self.loras.get(lora) if lora else None,
                                 salt=parsed.cache_salt,
                                 request_id=request.headers.get("x-request-id"))
        if req.prompt_tokens + max_tokens > p.max_model_len:
            return _error(ApiError(400, (
                f"This model's maximum context length is {p.max_model_len} tokens. However, "
                f"you requested {req.prompt_tokens + max_tokens} tokens ({req.prompt_tokens} "
                f"in the messages, {max_tokens} in the completion). Please reduce the length "
                "of the messages or completion.")))
        req.stream = parsed.stream
        if parsed.mm_hashes:
            req.mm_hashes = parsed.mm_hashes
            if self.ec is not None:  # items an encode server made are loaded, not encoded
                req.remote_mm = self.ec.available(parsed.mm_hashes)
        kv_out = self._kv_role(parsed.kv_transfer_params, stream=parsed.stream)
        if kv_out == "decode":
            assert self.kv_transfer is not None
            # The pull happens before queueing; TTFT (from arrival) includes it, as in vLLM.
            req.remote_tokens = await self.kv_transfer.pull(parsed.kv_transfer_params, req)
        elif kv_out == "prefill":
            req.hold_kv = True
            # Held KV is found by request id: make it unique, as vLLM suffixes request ids.
            req.id = f"{req.id}-{os.urandom(4).hex()}"
        source = (parsed.kv_transfer_params or {}).get("remote_kv_source")
        if source is not None and self.kv_transfer is not None and kv_out != "decode":
            # llm-d-router v0.10's P2P pull: the prompt's cached prefix is read from the pod
            # the EPP named instead of being computed here (before queueing, as the pull).
            req.remote_tokens = max(req.remote_tokens,
                                    await self.kv_transfer.pull_source(source, req))
        try:
            engine.add(req)
        except QueueFull as exc:
            return _error(ApiError(429, str(exc)))
        except ValueError as exc:
            return _error(ApiError(400, str(exc)))
        assert self._loop is not None
        self._loop.notify()
        model = parsed.model or self.cfg.model_names[0]
        rid = api.new_id(parsed.request_id)
        handed_over = False  # a prefill leg's held KV is now the pull's (or expiry's) business
        try:
            if parsed.stream:
                return await self._stream(request, api.writer(
                    req, model=model, rid=rid, include_usage=parsed.include_usage))
            while not req.done:
                req.waiter = loop.create_future()
                await req.waiter
            if req.state != "finished":
                return _error(ApiError(503, "Request aborted: server restarting"))
            kv_params = None
            if req.hold_kv:
                assert self.kv_transfer is not None
                kv_params = self.kv_transfer.held_params(req, self.cfg.host, self.port)
                handed_over = True
            return web.Response(body=api.full(req, model=model, rid=rid,
                                              kv_transfer_params=kv_params),
                                content_type=_JSON)
        finally:
            if req.state == "finished" and self.ec is not None and req.mm_hashes:
                self.ec.save(req.mm_hashes)  # before the answer: the sidecar waits for it
            if not req.done:
                engine.abort(req)
                self._loop.notify()
            elif req.hold_kv and not handed_over:
                engine.release_held(req.id)  # nobody will ever learn where the KV is

    def _kv_role(self, params: dict[str, Any] | None, *, stream: bool) -> str | None:
        """Which P/D leg this request is for this server: ``prefill``, ``decode`` or ``None``
        (no connector, no params, or a leg this server's ``kv_role`` does not serve: the
        request then runs as a normal one, as in vLLM)."""
        pd = self.kv_transfer
        if pd is None or not params:
            return None
        if params.get("do_remote_decode") is True and pd.cfg.produces and not stream:
            return "prefill"
        if params.get("do_remote_prefill") is True and pd.cfg.consumes:
            return "decode"
        return None

    async def _stream(self, request: web.Request, sse: Writer) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        req = sse.req
        first = sse.preamble()
        if first:
            await resp.write(first)
        loop = asyncio.get_running_loop()
        while True:
            if req.generated == sse.sent and not req.done:
                req.waiter = loop.create_future()
                await req.waiter
            if req.state == "aborted":
                break  # server restarting: end the stream without [DONE]
            chunk = sse.take()
            if chunk:
                await resp.write(chunk)
            if req.done:
                break
        await resp.write_eof()
        return resp

    # -- other OpenAI / vLLM endpoints -------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        p = self.engine.profile
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "created": self._created, "owned_by": "vllm",
             "root": self.cfg.model, "parent": None, "max_model_len": p.max_model_len,
             "permission": []} for name in self.cfg.model_names]
        data += [{"id": name, "object": "model", "created": self._created, "owned_by": "vllm",
                  "root": path, "parent": self.cfg.model_names[0], "max_model_len": None,
                  "permission": []} for name, path in self.loras.items()]
        return _json({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.faults.metrics_hang:
            await asyncio.Event().wait()
        if self.faults.metrics_delay > 0:
            await asyncio.sleep(self.faults.metrics_delay)
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def gpu_util_percent(self) -> float:
        """What DCGM would report as GPU utilization: the share of the batch slots
        (``max_num_seqs``) running, in percent (pinned by the ``gpu_util_percent`` fault)."""
        if self.faults.gpu_util_percent is not None:
            return float(self.faults.gpu_util_percent)
        slots = max(1, self.cfg.profile.max_num_seqs)
        return min(100.0, 100.0 * self.engine.num_running / slots)

    async def _dcgm_metrics(self, request: web.Request) -> web.Response:
        # The page NVIDIA's DCGM exporter serves on :9400/metrics (one GPU, sidecar mode with
        # the Kubernetes labels DCGM_EXPORTER_KUBERNETES adds), for dcgm-data-source.
        labels = (f'gpu="0",UUID="GPU-sim-{self.port}",device="nvidia0",'
                  f'modelName="vllm-sim",Hostname="{self.cfg.host}",pod="{self.name}",'
                  f'namespace="default",container="vllm"')
        page = ("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
                "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
                f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {self.gpu_util_percent():g}\n")
        return web.Response(text=page, content_type="text/plain")

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError:
            raise ApiError(400, "Invalid JSON body") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Request body must be a JSON object")
        return body

    async def _load_lora(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
                raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.")
            if name in self.loras:
                raise ApiError(400, f"The lora adapter '{name}' has already been loaded.")
        except ApiError as exc:
            return _error(exc)
        self.loras[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                raise ApiError(400, "'lora_name' must be provided.")
            if name not in self.loras:
                raise ApiError(404, f"The lora adapter '{name}' cannot be found.")
        except ApiError as exc:
            return _error(exc)
        del self.loras[name]
        self.engine.loras.evict(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # -- peer-router compatibility -----------------------------------------------------------
    async def _get_load(self, request: web.Request) -> web.Response:
        e = self.engine
        used_tokens = round(e.kv.usage * e.kv.num_blocks * e.kv.block_size)
        return _json({"load": e.num_running + e.num_waiting, "dp_rank": 0,
                      "num_reqs": e.num_running + e.num_waiting,
                      "num_running_reqs": e.num_running, "num_waiting_reqs": e.num_waiting,
                      "num_tokens": used_tokens})

    async def _server_info(self, request: web.Request) -> web.Response:
        p = self.engine.profile
        return _json({
            "model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
            "served_model_name": self.cfg.model_names[0], "engine": self.cfg.engine,
            "max_num_seqs": p.max_num_seqs, "max_running_requests": p.max_num_seqs,
            "page_size": p.block_size, "block_size": p.block_size,
            "num_gpu_blocks": p.num_gpu_blocks,
            "max_total_num_tokens": p.num_gpu_blocks * p.block_size,
            "max_model_len": p.max_model_len, "context_length": p.max_model_len,
            "max_loras": p.max_loras, "dp_size": 1, "tp_size": 1,
            "profile": p.name, "time_scale": self.cfg.time_scale, "version": "0.0.0-sim",
        })

    async def _model_info(self, request: web.Request) -> web.Response:
        return _json({"model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
                      "served_model_name": self.cfg.model_names[0], "is_generation": True,
                      "max_model_len": self.engine.profile.max_model_len})

    async def _version(self, request: web.Request) -> web.Response:
        return _json({"version": "0.0.0-sim"})

    # -- admin (tests and benchmarks) --------------------------------------------------------
    async def _get_faults(self, request: web.Request) -> web.Response:
        return _json(self.faults.to_json())

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            try:
                self.faults.update(body)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
        except ApiError as exc:
            return _error(exc)
        return _json(self.faults.to_json())

    def _check_optional_model(self, body: dict[str, Any]) -> None:
        """A body's ``model`` may be left out; given, it must be a served model (400/404)."""
        model = body.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise ApiError(400, "'model' must be a string")
            self._resolve_model(model)  # 404 for an unknown model

    async def _tokenize(self, request: web.Request) -> web.Response:
        # vLLM's /tokenize: what llm-d's "tokenizer-vllm-http" token producer calls. The ids
        # are the simulator tokenizer's (4-byte chunks as uint32), the ones KV events carry.
        try:
            body = await self._read_json(request)
            self._check_optional_model(body)
            prompt = tokenize_input(body)
        except ApiError as exc:
            return _error(exc)
        ids = token_ids(prompt)
        return _json({"count": len(ids), "max_model_len": self.cfg.profile.max_model_len,
                      "tokens": ids, "token_strs": None})

    async def _render_input(self, request: web.Request, chat: bool) -> list[bytes]:
        """The prompts of a vLLM ``/render`` body (completions may batch several strings)."""
        body = await self._read_json(request)
        self._check_optional_model(body)
        if chat:
            if "messages" not in body:
                raise ApiError(400, "'messages' is required")
            return [tokenize_input({"messages": body["messages"]})]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) > 1 and all(
                isinstance(p, str) for p in prompt):
            return [p.encode() for p in prompt]
        if prompt is None:
            raise ApiError(400, "'prompt' is required")
        return [tokenize_input({"prompt": prompt})]

    async def _render_completions(self, request: web.Request) -> web.Response:
        # vLLM's /v1/completions/render (what llm-d-router v0.10's token-producer calls): one
        # entry per prompt, the token ids the engine would run (the ones KV events carry).
        try:
            prompts = await self._render_input(request, chat=False)
        except ApiError as exc:
            return _error(exc)
        return _json([{"token_ids": token_ids(p)} for p in prompts])

    async def _render_chat(self, request: web.Request) -> web.Response:
        # vLLM's /v1/chat/completions/render: the chat template applied, then tokenized.
        try:
            (prompt,) = await self._render_input(request, chat=True)
        except ApiError as exc:
            return _error(exc)
        return _json({"token_ids": token_ids(prompt)})

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        # vLLM answers 200 either way and logs a refusal; a test needs to know, so we say it.
        if not self.engine.reset_prefix_cache():
            return _json({"reset": False, "reason": "requests still hold blocks"}, status=409)
        return _json({"reset": True})

    async def _state(self, request: web.Request) -> web.Response:
        e = self.engine
        return _json({
            "name": self.name, "port": self.port, "running": e.num_running,
            "waiting": e.num_waiting, "kv_cache_usage": e.kv.usage,
            "cached_blocks": e.kv.num_cached, "free_blocks": e.kv.num_free,
            "evictions": e.kv.evictions, "preemptions": e.preemptions_total,
            "finished": e.finished_total, "prompt_tokens": e.prompt_tokens_total,
            "generation_tokens": e.generation_tokens_total,
            "prefix_cache_queries": e.prefix_queries_total,
            "prefix_cache_hits": e.prefix_hits_total, "resident_loras": e.loras.resident,
            "steps": e.steps_total, "max_lag": self._loop.max_lag if self._loop else 0.0,
            "kv_held": len(e.held),
            "kv_pulls_served": self.kv_transfer.transfers_total if self.kv_transfer else 0,
            "mm_encoded": e.encoded_items_total, "mm_loaded": e.ec_loaded_items_total,
        })

    def _target(self, body: dict[str, Any]) -> SimServer:
        port = body.get("port", self.port)
        if port == self.port:
            return self
        target = self.fleet.server(port) if self.fleet is not None else None
        if target is None:
            raise ApiError(404, f"no simulated server on port {port} in this process")
        return target

    async def _kill(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            target = self._target(body)
            revive_after = body.get("revive_after")
            if revive_after is not None and not isinstance(revive_after, int | float):
                raise ApiError(400, "'revive_after' must be a number of seconds")
        except ApiError as exc:
            return _error(exc)
        # Let this response leave before the listener (possibly our own) goes away.
        self.later(0.01, lambda: target.kill(revive_after))
        return _json({"killed": target.port, "revive_after": revive_after})

    async def _revive(self, request: web.Request) -> web.Response:
        try:
            target = self._target(await self._read_json(request))
        except ApiError as exc:
            return _error(exc)
        await target.revive()
        return _json({"revived": target.port})
