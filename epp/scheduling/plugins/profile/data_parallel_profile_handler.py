"""``data-parallel-profile-handler`` (llm-d, deprecated there): for pods running one
data-parallel engine behind one service port, pick a rank's port as usual, then send the
request to the pod's primary port and name the rank in ``x-data-parallel-endpoint``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from epp.requestcontrol.plugin import PreRequest
from epp.scheduling.plugins.profile.single_profile_handler import SingleProfileHandler
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.plugins import Handle

log = structlog.get_logger(__name__)

#: The header naming the rank (``ip:port``) the pick chose (llm-d's name, lower-cased).
DATA_PARALLEL_HEADER = "x-data-parallel-endpoint"


@dataclass(frozen=True, slots=True)
class DataParallelParameters:
    """``primaryPort``: the pod port every request is sent to."""

    primary_port: int = 8000

    def __post_init__(self) -> None:
        if not 1 <= self.primary_port <= 65535:
            raise ValueError(f"primaryPort must be in 1-65535, got {self.primary_port}")


class DataParallelProfileHandler(SingleProfileHandler, PreRequest):
    """One profile, as ``single-profile-handler``; then ``x-data-parallel-endpoint`` =
    the picked ``ip:port`` and the destination = the same IPs at ``primaryPort``."""

    type_name = "data-parallel-profile-handler"
    parameters_type = DataParallelParameters
    params: DataParallelParameters

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> DataParallelProfileHandler:
        log.warning("plugin type is deprecated in llm-d", type=cls.type_name,
                    use="single-profile-handler")
        return cls(name, params)

    def validate(self, profiles: Sequence[str]) -> None:
        if len(profiles) != 1:
            raise ValueError(f"data-parallel-profile-handler needs exactly one scheduling "
                             f"profile, got {len(profiles)} ({', '.join(profiles) or 'none'})")

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        picked = result.endpoints
        if not picked:
            return
        result.extra_headers[DATA_PARALLEL_HEADER] = picked[0].key
        port = self.params.primary_port
        hosts = (v.endpoint.address for v in picked)
        result.destination_override = ",".join(
            f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts)


__all__ = ["DATA_PARALLEL_HEADER", "DataParallelParameters", "DataParallelProfileHandler"]

