"""The simulated inference engine: continuous batching over a paged KV cache.

The engine is a synchronous state machine driven in *steps* by a clock it does not own:
:meth:`Engine.begin_step` schedules a batch at time ``now`` and returns when the step ends;
:meth:`Engine.finish_step` then gives every request in the batch one token. A unit test drives
it on a virtual clock (:func:`sim.clock.run_virtual`), the HTTP server on the asyncio clock
(:class:`sim.runner.EngineLoop`). Nothing here sleeps, so both see identical behaviour.

Per step (vLLM's scheduler, simplified):

1. every running request that already has its prompt computed decodes one token; if it needs a
   new KV block and none is free, the most recently admitted running request is preempted
   (blocks freed, back to the *front* of the waiting queue, recomputed when readmitted);
2. the step has a token budget, ``max_num_batched_tokens`` (vLLM V1's scheduler): running
   requests take from it first, in admission order (a decode one token, a prompt still in
   prefill its next chunk);
3. if nothing was preempted, waiting requests are admitted in FIFO order while fewer than
   ``max_num_seqs`` run and budget is left: a request whose LoRA adapter has no slot is
   skipped (it keeps its place), a request whose blocks do not fit stops admission (head of
   line); with ``enable_chunked_prefill`` (vLLM V1's default) a prompt larger than what is
   left is split (its first token comes with its last chunk), without it admission stops
   at a prompt that does not fit;
4. the step lasts :func:`sim.costs.step_time` (ITL plus the decodes' KV read, prefill overhead
   plus linear and attention terms of the prompt chunks, times the load factor, over the
   profile's ``speed``), scaled by ``time_scale``.
"""

from __future__ import annotations

import contextlib
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sim.costs import step_time
from sim.kvcache import REMOVED, STORED, BlockTable, KVCache
from sim.lora import LoraSlots
from sim.profiles import Profile
from sim.tokenizer import block_hashes, count_tokens, token_ids

if TYPE_CHECKING:
    import asyncio

    from sim.kvevents import BlockHasher, KVEventRecorder


class QueueFull(Exception):
    """The waiting queue is at ``max_waiting``; the server answers 429."""


class StatsSink(Protocol):
    """Receives per-request latency observations (the metrics module implements it)."""

    def observe_ttft(self, seconds: float) -> None: ...
    def observe_itl(self, seconds: float) -> None: ...
    def observe_queue_time(self, seconds: float) -> None: ...
    def observe_finished(self, req: SimRequest) -> None: ...


WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class SimRequest:
    """One generation request and its progress through the engine."""

    id: str
    prompt_tokens: int
    block_hashes: list[int]
    max_tokens: int
    output_tokens: int
    lora: str | None
    arrival: float
    text_seed: int
    state: str = WAITING
    generated: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    first_scheduled: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    blocks: BlockTable = field(default_factory=BlockTable)
    prefilled: bool = False
    #: Prompt tokens still to compute in this residency before the next token (chunked
    #: prefill); 0 while decoding.
    to_prefill: int = 0
    #: Prompt tokens whose KV a prefill server computed and this server pulled (P/D decode
    #: side); used at the first admission only (a preempted request recomputes locally).
    remote_tokens: int = 0
    #: Keep the blocks after finishing until a decoder pulls them (P/D prefill side).
    hold_kv: bool = False
    #: Wake the waiter on every token (streaming) or only at the end.
    stream: bool = True
    #: Completed by the engine when new tokens or the end are available (set by the server).
    waiter: asyncio.Future[None] | None = None
    #: Prompt token ids, kept only when KV events are published (they carry them).
    token_ids: list[int] | None = None
    cache_salt: str = ""
    #: Hashes of the request's unique multimodal items (:mod:`modelserver.multimodal`).
    mm_hashes: tuple[str, ...] = ()
    #: Of those, the ones an encode server already encoded (EC connector): loaded, not
    #: encoded.
    remote_mm: frozenset[str] = frozenset()

    @property
    def done(self) -> bool:
        """Finished or aborted."""
        return self.state == FINISHED or self.state == ABORTED

    @property
    def finish_reason(self) -> str:
        """OpenAI ``finish_reason``: ``length`` when ``max_tokens`` was reached."""
        return "length" if self.output_tokens >= self.max_tokens else "stop"

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


#: Events reported to :attr:`Engine.on_event`: kind (``arrive``, ``admit``, ``first_token``,
#: ``token`` for each later one, ``finish``, ``preempt``), request, engine time.
EventHook = Callable[[str, SimRequest, float], None]


class Engine:
    """Scheduler + KV cache + LoRA slots of one simulated server."""

    def __init__(
        self,
        profile: Profile,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        random_output_length: bool = False,
        stats: StatsSink | None = None,
        kv_events: KVEventRecorder | None = None,
        block_hasher: BlockHasher | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.profile = profile
        self.time_scale = time_scale
        self.seed = seed
        self.random_output_length = random_output_length
        self.stats = stats
        self.on_event: EventHook | None = None
        #: With KV events on, block hashes follow vLLM's scheme (``block_hasher``) and every
        #: cache change is recorded into ``kv_events``, flushed once per step.
        self.kv_events = kv_events
        self.block_hasher = block_hasher
        self._lora_ids: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        """Forget all requests and cached state (a server restart)."""
        p = self.profile
        self.kv = KVCache(p.num_gpu_blocks, p.block_size)
        if self.kv_events is not None:
            self.kv.journal = []
        self.loras = LoraSlots(p.max_loras)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._rng = random.Random(self.seed)
        self._counter = 0
        self._batch: list[SimRequest] = []
        self._partial: set[int] = set()
        self._step_end: float | None = None
        # Counters exported as Prometheus counters.
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_queries_total = 0
        self.prefix_hits_total = 0
        self.preemptions_total = 0
        self.finished_total = 0
        self.steps_total = 0
        #: P/D: prompt tokens offered to / loaded from a remote prefiller (vLLM's "external
        #: prefix cache" counters).
        self.external_queries_total = 0
        self.external_hits_total = 0
        #: Multimodal: the encoder cache (item hashes, LRU) and vLLM's mm cache counters;
        #: items encoded here and items loaded from an encode server.
        self.encoder_cache: OrderedDict[str, None] = OrderedDict()
        self.mm_cache_queries_total = 0
        self.mm_cache_hits_total = 0
        self.encoded_items_total = 0
        self.ec_loaded_items_total = 0
        #: P/D prefill side: finished requests whose blocks wait for a decoder, by id.
        self.held: dict[str, SimRequest] = {}
        #: Bumped whenever the set of running/waiting adapters may have changed.
        self.lora_version = 0

    # -- requests --------------------------------------------------------------------------
    def new_request(
        self,
        prompt: bytes,
        max_tokens: int,
        *,
        lora: str | None = None,
        now: float = 0.0,
        salt: str = "",
        request_id: str | None = None,
        lora_path: str | None = None,
    ) -> SimRequest:
        """Tokenize ``prompt`` and build a request (not yet queued; see :meth:`add`)."""
        self._counter += 1
        n_out = max_tokens
        if self.random_output_length and max_tokens > 1:
            n_out = self._rng.randint(1, max_tokens)
        hasher = self.block_hasher
        ids: list[int] | None = None
        if hasher is None:
            hashes = block_hashes(prompt, self.profile.block_size, (lora or "") + salt)
        else:
            ids = token_ids(prompt)
            hashes = [int.from_bytes(h[-8:], "big") for h in hasher.block_hashes(
                ids, self.profile.block_size, cache_salt=salt,
                lora=(lora, lora_path or lora) if lora else None)]
        return SimRequest(
            id=request_id or f"req-{self._counter}",
            prompt_tokens=max(1, count_tokens(prompt)),
            block_hashes=hashes,
            token_ids=ids,
            cache_salt=salt,
            max_tokens=max_tokens,
            output_tokens=max(1, n_out),
            lora=lora,
            arrival=now,
            text_seed=self._rng.randrange(1 << 30),
        )

    def add(self, req: SimRequest) -> None:
        """Queue a request.

        Raises :class:`QueueFull` past ``max_waiting`` and ``ValueError`` for a request that
        could never fit in the KV cache (it would block the queue forever).
        """
        if self.kv.blocks_for(req.prompt_tokens + req.output_tokens) > self.kv.num_blocks:
            raise ValueError(
                f"request needs {req.prompt_tokens + req.output_tokens} tokens of KV cache, "
                f"more than the server holds ({self.kv.num_blocks * self.kv.block_size})"
            )
        if len(self.waiting) >= self.profile.max_waiting:
            raise QueueFull(f"waiting queue is full ({self.profile.max_waiting} requests)")
        req.state = WAITING
        self.waiting.append(req)
        if req.lora is not None:
            self.lora_version += 1
        self._emit("arrive", req, req.arrival)

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is (client went away); idempotent."""
        if req.done:
            return
        if req.state == RUNNING:
            self.running.remove(req)
            self._release(req)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        req.state = ABORTED
        if req.lora is not None:
            self.lora_version += 1
        req._wake()

    def abort_all(self) -> None:
        """Abort every queued and running request."""
        for req in [*self.running, *self.waiting]:
            self.abort(req)

    @property
    def has_work(self) -> bool:
        """Whether a step would do anything."""
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue."""
        return len(self.waiting)

    @property
    def waiting_adapters(self) -> list[str]:
        """Distinct adapters of waiting requests, in queue order."""
        seen: dict[str, None] = {}
        for r in self.waiting:
            if r.lora is not None:
                seen[r.lora] = None
        return list(seen)

    # -- stepping --------------------------------------------------------------------------
    def begin_step(self, now: float) -> float:
        """Schedule one batch at ``now``; returns the time the step ends.

        Must be followed by :meth:`finish_step` before the next call.
        """
        kv = self.kv
        running = self.running
        preempted = False
        # 1. Running requests keep their KV: each that decodes grows by one token and may
        #    need one more block (a prompt still being prefilled already holds its blocks).
        i = 0
        while i < len(running):
            req = running[i]
            if req.to_prefill:
                i += 1
                continue
            need = kv.blocks_for(req.prompt_tokens + req.generated + 1)
            if need > req.blocks.num_blocks and not kv.append_block(req.blocks):
                victim = running[-1]
                self._preempt(victim, now)
                preempted = True
                if victim is req:
                    continue  # req itself went back to waiting; running[i] is the next one
                continue  # retry req with the freed blocks
            i += 1

        # 2. The token budget, running requests first (vLLM V1): a decode takes one token,
        #    an unfinished prefill its next chunk; past the budget a request sits this out.
        budget = self.profile.max_num_batched_tokens
        chunked = self.profile.enable_chunked_prefill
        batch: list[SimRequest] = []
        partial: set[int] = set()
        decoding = 0
        decode_context = 0
        #: (tokens already computed, chunk) of every prompt chunk of the step
        chunks: list[tuple[int, int]] = []
        local_prefills = 0
        for req in running:
            if budget <= 0:
                break
            if req.to_prefill:
                chunk = min(req.to_prefill, budget)
                chunks.append((req.prompt_tokens + req.generated - req.to_prefill, chunk))
                req.to_prefill -= chunk
                budget -= chunk
                local_prefills += 1
                if req.to_prefill:
                    partial.add(id(req))
            else:
                budget -= 1
                decoding += 1
                decode_context += req.prompt_tokens + req.generated
            batch.append(req)

        # 3. Admit from the waiting queue while the budget lasts.
        loads = 0
        admitted = 0
        encodes = 0.0
        if not preempted and self.waiting:
            max_seqs = self.profile.max_num_seqs
            skipped: list[SimRequest] = []
            waiting = self.waiting
            while waiting and len(running) < max_seqs and budget > 0:
                req = waiting[0]
                if req.lora is not None and not self.loras.can_acquire(req.lora):
                    skipped.append(waiting.popleft())
                    continue
                tokens = req.prompt_tokens + req.generated
                hashes = req.block_hashes
                hit = kv.match_prefix(hashes)
                total = kv.blocks_for(tokens + 1)
                # vLLM always recomputes at least the last prompt token.
                local = min(hit * kv.block_size, tokens - 1)
                cached = local
                if req.remote_tokens:
                    # KV pulled from a prefiller fills what the local cache did not have.
                    cached = max(local, min(req.remote_tokens, tokens - 1))
                uncached = tokens - cached
                if not chunked and uncached > budget and batch:
                    break  # a whole prompt must fit the step (unless the step is empty)
                if not kv.can_allocate(hashes, hit, total):
                    break
                waiting.popleft()
                req.blocks = kv.allocate(hashes, hit, total)
                if kv.journal:
                    self._record_kv(req)
                # A decode leg whose KV was pulled needs no embeddings (the prefiller used
                # them); otherwise the encoder runs in this step.
                if req.mm_hashes and not req.prefilled and not req.remote_tokens:
                    encodes += self._encode(req)
                if req.remote_tokens:
                    self.external_queries_total += tokens - local
                    self.external_hits_total += cached - local
                    req.remote_tokens = 0
                else:
                    local_prefills += 1
                chunk = min(uncached, budget) if chunked else uncached
                chunks.append((cached, chunk))
                req.to_prefill = uncached - chunk
                if req.to_prefill:
                    partial.add(id(req))
                budget -= chunk
                if req.lora is not None and self.loras.acquire(req.lora):
                    loads += 1
                self.prefix_queries_total += tokens
                self.prefix_hits_total += local
                if req.first_scheduled is None:
                    req.first_scheduled = now
                    req.cached_tokens = cached
                    self.prompt_tokens_total += req.prompt_tokens
                    if self.stats is not None:
                        self.stats.observe_queue_time(now - req.arrival)
                req.state = RUNNING
                req.prefilled = False
                running.append(req)
                batch.append(req)
                admitted += 1
                self._emit("admit", req, now)
            if skipped:
                waiting.extendleft(reversed(skipped))
            if admitted or loads:
                self.lora_version += 1

        # 4. Duration: the one cost model (sim.costs), shared with the twin. A request whose
        #    KV was pulled only computes its last prompt token: it rides in the decode batch
        #    without the fixed cost of a prefill step.
        duration = step_time(self.profile, decoding=decoding, decode_context=decode_context,
                             chunks=chunks, local_prefills=local_prefills,
                             running=len(running), lora_loads=loads,
                             encode=encodes) * self.time_scale
        self._batch = batch
        self._partial = partial
        if kv.journal:
            self._record_kv(None)
        end = now + duration
        self._step_end = end
        self.steps_total += 1
        return end

    def _encode(self, req: SimRequest) -> float:
        """Seconds of encoder work (unscaled) for ``req``'s items: 0 for those in the encoder
        cache, a load for those an encode server made, an encode for the rest."""
        cache = self.encoder_cache
        p = self.profile
        seconds = 0.0
        for h in req.mm_hashes:
            self.mm_cache_queries_total += 1
            if h in cache:
                self.mm_cache_hits_total += 1
                cache.move_to_end(h)
                continue
            if h in req.remote_mm:
                self.ec_loaded_items_total += 1
                seconds += p.ec_load_time_per_image
            else:
                self.encoded_items_total += 1
                seconds += p.encode_time_per_image
            cache[h] = None
        while len(cache) > p.encoder_cache_items:
            cache.popitem(last=False)
        return seconds

    def finish_step(self) -> None:
        """End the step begun by :meth:`begin_step`: one token for every request in it."""
        end = self._step_end
        if end is None:
            raise RuntimeError("finish_step() without begin_step()")
        self._step_end = None
        stats = self.stats
        finished: list[SimRequest] = []
        partial = self._partial
        for req in self._batch:
            if req.state != RUNNING:  # aborted or preempted during the step
                continue
            if id(req) in partial:  # a prefill chunk that did not reach the prompt's end
                continue
            req.prefilled = True
            req.generated += 1
            self.generation_tokens_total += 1
            last = req.last_token_time
            req.last_token_time = end
            if last is None:
                req.first_token_time = end
                if stats is not None:
                    stats.observe_ttft(end - req.arrival)
                self._emit("first_token", req, end)
            else:
                if stats is not None:
                    stats.observe_itl(end - last)
                self._emit("token", req, end)
            if req.generated >= req.output_tokens:
                finished.append(req)
            elif req.stream:
                req._wake()
        self._batch = []
        if self.kv_events is not None:
            self.kv_events.flush()
        for req in finished:
            self.running.remove(req)
            if req.hold_kv:
                self.held[req.id] = req  # freed by release_held (pulled or expired)
            else:
                self._release(req)
            req.state = FINISHED
            req.finish_time = end
            self.finished_total += 1
            if stats is not None:
                stats.observe_finished(req)
            self._emit("finish", req, end)
            req._wake()

    def release_held(self, request_id: str) -> SimRequest | None:
        """Free the blocks a finished prefill kept for a decoder; ``None`` if not held."""
        req = self.held.pop(request_id, None)
        if req is not None:
            self._release(req)
        return req
    def reset_prefix_cache(self) -> bool:
        """Drop every cached block, like vLLM's ``/reset_prefix_cache``.

        Refused (``False``) while requests (or a prefill kept for a decoder) hold blocks,
        as vLLM refuses it.
        """
        if self.running or self.held:
            return False
        self.kv.reset()
        if self.kv.journal:
            self._record_kv(None)
        if self.kv_events is not None:
            self.kv_events.flush()
        return True

    # -- internals -------------------------------------------------------------------------
    def _record_kv(self, req: SimRequest | None) -> None:
        """Turn the cache's journal into vLLM events (``req``: whose allocation stored).

        As in vLLM, one allocation's evictions come first, then one ``BlockStored`` per run
        of consecutive new blocks (a run's parent is the block before it).
        """
        rec = self.kv_events
        journal = self.kv.journal
        assert rec is not None and journal is not None
        run: list[int] = []
        for kind, value in journal:
            if kind == REMOVED:
                rec.removed(value)
            elif kind != STORED:
                rec.cleared()
        for kind, value in journal:
            if kind != STORED:
                continue
            if run and value != run[-1] + 1:
                self._stored(req, run)
                run = []
            run.append(value)
        if run:
            self._stored(req, run)
        journal.clear()

    def _stored(self, req: SimRequest | None, run: list[int]) -> None:
        assert req is not None and req.token_ids is not None and self.kv_events is not None
        bs = self.profile.block_size
        first, last = run[0], run[-1] + 1
        lora = req.lora
        # One entry per block, None where a block has no extra keys: vLLM 0.32 publishes
        # ``extra_keys: [None, ...]`` for plain prompts (tests/vllm's recorded layout).
        extra: list[list[Any] | None] = []
        for i in range(first, last):
            keys: list[Any] = [lora] if lora else []
            if i == 0 and req.cache_salt:
                keys.append(req.cache_salt)
            extra.append(keys or None)
        lora_id = None
        if lora:
            lora_id = self._lora_ids.setdefault(lora, len(self._lora_ids) + 1)
        self.kv_events.stored(
            req.block_hashes[first:last], req.block_hashes[first - 1] if first else None,
            req.token_ids[first * bs : last * bs], bs, lora, lora_id, extra)

    def _release(self, req: SimRequest) -> None:
        self.kv.free(req.blocks)
        if req.lora is not None:
            self.loras.release(req.lora)
            self.lora_version += 1

    def _preempt(self, req: SimRequest, now: float) -> None:
        self.running.remove(req)
        self._release(req)
        req.to_prefill = 0
        req.state = WAITING
        req.preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(req)
        self._emit("preempt", req, now)

    def _emit(self, kind: str, req: SimRequest, t: float) -> None:
        if self.on_event is not None:
            self.on_event(kind, req, t)
