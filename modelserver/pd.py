"""Prefill/decode disaggregation: the names and shapes the EPP, the sidecar and the simulator
share.

The protocol is llm-d's (routing sidecar, ``nixlv2`` connector) over vLLM's NixlConnector:

1. The EPP picks a decode endpoint (the request goes there) and a prefill endpoint, which it
   names in the :data:`PREFILLER_HEADER` request header (``ip:port[,ip:port...]``).
2. The sidecar beside the decode server sends the *prefill leg* to that prefiller: the
   client's body with ``stream: false``, ``max_tokens``/``max_completion_tokens`` 1, and
   :func:`prefill_leg_params` as ``kv_transfer_params``.
3. The prefiller computes the prompt's KV, answers one token, and returns the
   ``kv_transfer_params`` a decoder needs to read that KV (:class:`RemotePrefill`).
4. The sidecar sends the *decode leg* to its local server: the client's body unchanged plus
   those ``kv_transfer_params``; the decoder reads the KV and decodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: Request header set by the EPP: the prefill endpoint(s) the decode side should use.
PREFILLER_HEADER: Final = "x-prefiller-host-port"
#: llm-d-router v0.10: a pod holding more of the prompt's prefix in cache than the pod that
#: computes it; the sidecar has the computing pod pull it over the P2P tier.
KV_SOURCE_HEADER: Final = "x-kv-cache-source-host-port"
#: The ``kv_transfer_params`` key naming that pod (llm-d's sidecar protocol).
REMOTE_KV_SOURCE: Final = "remote_kv_source"

#: The body field both legs carry (vLLM's name).
KV_TRANSFER_PARAMS: Final = "kv_transfer_params"

#: Pod label that says which role a model server plays (llm-d's key and values).
ROLE_LABEL: Final = "llm-d.ai/role"
#: Role values that may run the prefill leg (llm-d's ``prefill-filter`` keeps these).
PREFILL_ROLES: Final = frozenset(
    {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})
#: Role values that may decode (llm-d's ``decode-filter``; a pod without the label counts too).
DECODE_ROLES: Final = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})

#: Body fields that cap the output; the prefill leg sets each to 1.
TOKEN_LIMIT_FIELDS: Final = ("max_tokens", "max_completion_tokens")


def can_prefill(labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels may serve the prefill leg."""
    return labels.get(ROLE_LABEL) in PREFILL_ROLES


def can_decode(labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels may decode (no role label: yes, as llm-d)."""
    role = labels.get(ROLE_LABEL)
    return role is None or role in DECODE_ROLES


def prefill_leg_params() -> dict[str, Any]:
    """``kv_transfer_params`` of a prefill leg: compute the KV, keep it for a remote decoder."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }


def prefill_leg_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill leg's body from the client's: not streamed, one token, KV kept."""
    out = dict(body)
    out.pop("stream_options", None)
    out["stream"] = False
    for field in TOKEN_LIMIT_FIELDS:
        out[field] = 1
    out[KV_TRANSFER_PARAMS] = prefill_leg_params()
    return out


class ParamsError(ValueError):
    """``kv_transfer_params`` that do not have the NixlConnector shape."""


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """What a prefiller returns so a decoder can read the prompt's KV (NixlConnector shape).

    In vLLM ``remote_host``/``remote_port`` name NIXL's side channel; in the simulator they
    name the prefill server's HTTP listener, which serves ``/sim/kv/pull``.
    """

    remote_engine_id: str
    remote_request_id: str
    remote_block_ids: tuple[int, ...]
    remote_host: str
    remote_port: int
    tp_size: int = 1

    def to_json(self) -> dict[str, Any]:
        """The decode leg's ``kv_transfer_params``."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.remote_engine_id,
            "remote_request_id": self.remote_request_id,
            "remote_block_ids": list(self.remote_block_ids),
            "remote_host": self.remote_host,
            "remote_port": self.remote_port,
            "tp_size": self.tp_size,
        }

    @classmethod
    def from_json(cls, data: Any) -> RemotePrefill:
        """Validate a decode leg's ``kv_transfer_params``; :class:`ParamsError` names the
        field that is wrong."""
        if not isinstance(data, Mapping):
            raise ParamsError("kv_transfer_params must be an object")
        if data.get("do_remote_prefill") is not True:
            raise ParamsError("kv_transfer_params.do_remote_prefill must be true")
        engine = data.get("remote_engine_id")
        if not isinstance(engine, str) or not engine:
            raise ParamsError("kv_transfer_params.remote_engine_id must be a non-empty string")
        request_id = data.get("remote_request_id")
        if not isinstance(request_id, str) or not request_id:
            raise ParamsError("kv_transfer_params.remote_request_id must be a non-empty string")
        blocks = data.get("remote_block_ids")
        if not isinstance(blocks, list) or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks):
            raise ParamsError("kv_transfer_params.remote_block_ids must be a list of block ids")
        host = data.get("remote_host")
        if not isinstance(host, str) or not host:
            raise ParamsError("kv_transfer_params.remote_host must be a non-empty string")
        port = data.get("remote_port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ParamsError("kv_transfer_params.remote_port must be a port number")
        tp = data.get("tp_size", 1)
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ParamsError("kv_transfer_params.tp_size must be a positive integer")
        return cls(engine, request_id, tuple(blocks), host, port, tp)


def split_host_ports(value: str) -> list[str]:
    """The ``host:port`` entries of a :data:`PREFILLER_HEADER` value (empty ones dropped)."""
    return [p.strip() for p in value.split(",") if p.strip()]


#: Role values that may run the encode stage (llm-d's ``encode-filter`` keeps these).
ENCODE_ROLES: Final = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


def can_encode(labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels may encode multimodal items (E/PD, E/P/D)."""
    return labels.get(ROLE_LABEL) in ENCODE_ROLES
