"""Flow control: requests wait in the EPP by priority band and tenant (fairness id) and are
released when the pool has room (upstream v1.5's ``flowControl`` layer, feature gate
``flowControl``).

- :mod:`~epp.flowcontrol.config`: the ``flowControl`` config section (strict);
- :mod:`~epp.flowcontrol.types`: requests, outcomes, and the errors clients see;
- :mod:`~epp.flowcontrol.policies`: fairness, ordering and usage-limit policies;
- :mod:`~epp.flowcontrol.queues`: per-(band, flow) queues;
- :mod:`~epp.flowcontrol.controller`: the :class:`FlowController` and its dispatcher;
- :mod:`~epp.flowcontrol.metrics`: the ``inference_extension_flow_control_*`` series.
"""

from epp.flowcontrol.config import (
    FlowControlConfig,
    FlowControlConfigError,
    PriorityBandConfig,
)
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.flowcontrol.types import (
    DEFAULT_FAIRNESS_ID,
    FAIRNESS_ID_HEADER,
    FlowControlQueueFull,
    FlowControlRequest,
    FlowControlUnavailable,
    FlowKey,
    Outcome,
    error_for,
)

#: The EndpointPickerConfig feature gate that turns flow control on (upstream's name).
FEATURE_GATE = "flowControl"

__all__ = [
    "DEFAULT_FAIRNESS_ID",
    "FAIRNESS_ID_HEADER",
    "FEATURE_GATE",
    "FlowControlConfig",
    "FlowControlConfigError",
    "FlowControlMetrics",
    "FlowControlQueueFull",
    "FlowControlRequest",
    "FlowControlUnavailable",
    "FlowController",
    "FlowKey",
    "Outcome",
    "PriorityBandConfig",
    "error_for",
]
