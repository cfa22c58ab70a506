"""The engine's step cost: how long one batch takes on the modelled GPU.

One function, :func:`step_time`, used by :class:`sim.engine.Engine` for every step, so the
real-time simulator (``vllm-sim``) and the virtual-time twin (``bench``) time steps alike.
Formula (model seconds, before ``time_scale``)::

    factor = 1 + (load_factor - 1) * running / max_num_seqs
    work   = inter_token_latency                                   if any request decodes
           + kv_read_time_per_token * decode_context               (KV read of the decodes)
           + prefill_overhead                                      if any prompt is computed
           + prefill_time_per_token * prefill_tokens               (the linear layers)
           + prefill_attention_time * sum((start + chunk)^2 - start^2)   (causal attention)
    step   = (factor * work + lora_load_time * adapters_loaded + encode) / speed

``decode_context`` is the total context (prompt + generated tokens) of the requests that
decode in the step: each reads its whole KV cache once per token. A prompt chunk of ``chunk``
tokens that starts after ``start`` computed tokens attends to every earlier token, so a whole
prompt of ``L`` tokens costs ``prefill_attention_time * L^2`` however it is chunked. Profiles
whose two new coefficients are 0 (``8b-h100``, ``tiny``) time steps exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from sim.profiles import Profile


def step_time(p: Profile, *, decoding: int, decode_context: int,
              chunks: Iterable[tuple[int, int]], local_prefills: int, running: int,
              lora_loads: int = 0, encode: float = 0.0) -> float:
    """Model seconds of one step of ``p``.

    ``decoding``: requests decoding a token; ``decode_context``: their summed context;
    ``chunks``: ``(start, tokens)`` of every prompt chunk computed in the step (a request
    whose KV was pulled from a prefiller computes its last prompt token here, and costs no
    ``prefill_overhead`` unless ``local_prefills`` says a real prefill runs too);
    ``running``: requests holding a slot after admission; ``lora_loads``: adapters loaded;
    ``encode``: model seconds of the vision encoder (and EC loads) of the requests admitted.
    """
    work = 0.0
    if decoding:
        work += p.inter_token_latency + p.kv_read_time_per_token * decode_context
    prefill_tokens = 0
    attention = 0
    for start, tokens in chunks:
        prefill_tokens += tokens
        end = start + tokens
        attention += end * end - start * start
    if prefill_tokens:
        work += prefill_tokens * p.prefill_time_per_token + attention * p.prefill_attention_time
        if local_prefills:
            work += p.prefill_overhead
    factor = 1.0 + (p.load_factor - 1.0) * running / p.max_num_seqs
    return (factor * work + lora_loads * p.lora_load_time + encode) / p.speed


def isolated_prefill(p: Profile, prompt_tokens: int) -> float:
    """Model seconds from admission to the first token of one ``prompt_tokens`` prompt on an
    idle server of ``p`` (chunked by ``max_num_batched_tokens`` as the engine does): the
    "isolated prefill" an SLO of ``TTFT <= k x isolated prefill`` refers to."""
    budget = p.max_num_batched_tokens if p.enable_chunked_prefill else prompt_tokens
    done, total = 0, 0.0
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        total += step_time(p, decoding=0, decode_context=0, chunks=[(done, chunk)],
                           local_prefills=1, running=1)
        done += chunk
    return total


def decode_step(p: Profile, batch: int, context_per_request: int) -> float:
    """Model seconds of a decode-only step of ``batch`` requests of ``context_per_request``
    tokens each (a steady decode batch: its TPOT)."""
    return step_time(p, decoding=batch, decode_context=batch * context_per_request,
                     chunks=(), local_prefills=0, running=batch)
