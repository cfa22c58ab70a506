"""Encode disaggregation (E/PD, E/P/D) in the simulator: vLLM's ``--ec-transfer-config`` with
its ``ECSharedStorageConnector``.

An encode server (``ec_role: ec_producer``) serves the sidecar's encode requests (chat with
one multimodal item, ``max_tokens`` 1): its engine runs the encoder for items it has not
encoded before (``encode_time_per_image``, :mod:`sim.profiles`) and, once the request is
done, writes one file per item hash under ``shared_storage_path``. A prefill or decode server
(``ec_consumer``) finds an item's file there before queueing a request and then loads the
embedding (``ec_load_time_per_image``) instead of encoding it. ``ec_both`` does both. The
files hold no embedding: the simulator only needs to know that one exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

CONNECTORS: Final = ("ECSharedStorageConnector",)
ROLES: Final = ("ec_producer", "ec_consumer", "ec_both")
_KEYS: Final = frozenset({"ec_connector", "ec_role", "ec_connector_extra_config"})


@dataclass(frozen=True, slots=True)
class ECTransferConfig:
    """vLLM's ``--ec-transfer-config``: connector, role and the shared folder."""

    ec_role: str
    shared_storage_path: Path
    ec_connector: str = CONNECTORS[0]

    @property
    def produces(self) -> bool:
        """Writes what it encodes for others."""
        return self.ec_role in ("ec_producer", "ec_both")

    @property
    def consumes(self) -> bool:
        """Loads what others encoded."""
        return self.ec_role in ("ec_consumer", "ec_both")


def parse_ec_transfer_config(data: Any, *, where: str = "--ec-transfer-config"
                             ) -> ECTransferConfig:
    """Validate the JSON object; unknown keys and values are errors naming ``where``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be a JSON object")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    connector = data.get("ec_connector", CONNECTORS[0])
    if connector not in CONNECTORS:
        raise ValueError(f"{where}: ec_connector must be one of {', '.join(CONNECTORS)}, "
                         f"got {connector!r}")
    role = data.get("ec_role")
    if role not in ROLES:
        raise ValueError(f"{where}: ec_role must be one of {', '.join(ROLES)}, got {role!r}")
    extra = data.get("ec_connector_extra_config", {})
    path = extra.get("shared_storage_path") if isinstance(extra, Mapping) else None
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: ec_connector_extra_config.shared_storage_path must name "
                         f"a folder")
    return ECTransferConfig(ec_role=role, shared_storage_path=Path(path),
                            ec_connector=connector)


class ECStorage:
    """The shared folder: one empty file per encoded item hash."""

    def __init__(self, cfg: ECTransferConfig) -> None:
        self.cfg = cfg
        cfg.shared_storage_path.mkdir(parents=True, exist_ok=True)
        #: Items written for others / found written by others.
        self.saved_total = 0
        self.found_total = 0

    def available(self, hashes: Iterable[str]) -> frozenset[str]:
        """The hashes an encode server already wrote (empty when this server does not
        consume)."""
        if not self.cfg.consumes:
            return frozenset()
        root = self.cfg.shared_storage_path
        found = frozenset(h for h in hashes if (root / h).exists())
        self.found_total += len(found)
        return found

    def save(self, hashes: Iterable[str]) -> None:
        """Publish encoded items (no-op when this server does not produce)."""
        if not self.cfg.produces:
            return
        root = self.cfg.shared_storage_path
        for h in hashes:
            (root / h).touch()
            self.saved_total += 1
