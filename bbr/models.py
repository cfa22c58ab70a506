"""``GET /v1/models`` answered at the gateway: every model the pools behind it serve.

Why in BBR: it is the one callout that sees every request, before any route is chosen. A
``GET /v1/models`` names no model, so no pool route (and so no EPP) would ever see it, and an
EPP knows only its own pool while the listing is the union of all of them.

What BBR knows: the base-model mappings it already reads for ``base-model-to-header``
(``--base-models`` file or the ``bbr-managed`` ConfigMaps, live): each ``baseModel`` and each
of its ``adapters``. Those lists hold every client-facing name that routes by base model
(LoRA adapters and InferenceModelRewrite names alike; a name missing there could not be
routed by base model either). The listing is shaped like vLLM's: base models with
``parent: null``, adapters with ``parent`` = their base model.

``GET /v1/models/{id}`` answers that one entry, or 404 ``model_not_found``. With an empty
mapping BBR answers nothing and the request goes on to the routes, as before.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import orjson

from bbr.basemodels import StaticBaseModels
from shared.errors import DirectResponse, NotFound

LIST_PATH = "/v1/models"
OWNER = "inference-gateway"


def model_entry(name: str, base: str, created: int) -> dict[str, Any]:
    """One listing entry, vLLM's fields (``root`` is the name: BBR knows no weights path)."""
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER,
            "root": name, "parent": None if name == base else base, "permission": []}


class ModelListing:
    """Answers ``GET /v1/models[/{id}]`` from a live :class:`StaticBaseModels`.

    The JSON is rebuilt only when the mapping object changes (a ConfigMap edit replaces it
    whole), so a listing request costs a dict lookup and a copy of cached bytes.
    """

    def __init__(self, base_models: StaticBaseModels, created: int | None = None) -> None:
        self.base_models = base_models
        self.created = int(time.time()) if created is None else created
        self._source: Mapping[str, str] | None = None
        self._entries: dict[str, dict[str, Any]] = {}
        self._listing = b""

    def _refresh(self) -> None:
        mapping = self.base_models.entries()
        if mapping is self._source:
            return
        bases = sorted({base for base in mapping.values()})
        entries: dict[str, dict[str, Any]] = {}
        for base in bases:
            entries[base] = model_entry(base, base, self.created)
            for name in sorted(n for n, b in mapping.items() if b == base and n != base):
                entries[name] = model_entry(name, base, self.created)
        self._entries = entries
        self._listing = orjson.dumps({"object": "list", "data": list(entries.values())})
        self._source = mapping

    def answer(self, method: str, path: str) -> None:
        """Raise the response when ``method path`` asks for models and BBR knows some; return
        (nothing to do) otherwise."""
        if method != "GET":
            return
        path = path.partition("?")[0]
        if path != LIST_PATH and not path.startswith(LIST_PATH + "/"):
            return
        self._refresh()
        if not self._entries:
            return
        if path == LIST_PATH:
            raise DirectResponse(self._listing)
        name = unquote(path[len(LIST_PATH) + 1:])
        entry = self._entries.get(name)
        if entry is None:
            raise NotFound(f"the model {name!r} does not exist")
        raise DirectResponse(orjson.dumps(entry))
