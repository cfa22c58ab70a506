"""The ``flowControl`` section of the EndpointPickerConfig (llm-d-router v0.10 names and
defaults: bounded by default).

The shape::

    flowControl:
      maxBytes: 10Gi             # global cap on queued request bytes (0/omitted: none)
      maxRequests: 5000          # global cap on queued requests (0/omitted: none)
      defaultRequestTTL: 60s     # how long a request may wait (omitted: 60s; "0s": until the
                                 # client goes)
      noEndpointRequestTTL: 5s   # ours: how long it may wait while the pool has no endpoints
                                 # (omitted: defaultRequestTTL, as upstream; "0s": 503 at once)
      usageLimitPolicyPluginRef: static-usage-limit-policy
      saturationDetector: {pluginRef: my-detector}   # the dispatch signal (v0.10)
      enableEviction: false      # evict in-flight sheddable requests for blocked higher ones
      defaultPriorityBand:       # template for priorities not listed below
        maxBytes: 1Gi
        maxRequests: 500
      defaultNegativePriorityBand:   # template for unlisted priorities < 0 (v0.10)
        maxRequests: 50
      priorityBands:
      - priority: 100
        maxBytes: 5Gi            # 0/omitted: 1 GB (upstream's default)
        maxRequests: 500         # 0/omitted: 5000 (upstream v0.10's default)
        fairnessPolicyRef: round-robin-fairness-policy   # default global-strict-fairness-policy
        orderingPolicyRef: fcfs-ordering-policy          # default fcfs-ordering-policy

Parsing is strict: an unknown key, a wrong type, a negative quantity or a duplicate priority is
a :class:`FlowControlConfigError` naming the path (``flowControl.priorityBands[1].maxBytes``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from shared.flags import duration

#: Upstream's default policies (plugin types; the loader instantiates them under these names).
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"
#: A band's byte capacity when none is configured (upstream: 1 GB).
DEFAULT_BAND_MAX_BYTES = 1_000_000_000
#: A band's request capacity when none is configured (upstream v0.10: 5,000).
DEFAULT_BAND_MAX_REQUESTS = 5000
#: How long a request may wait when ``defaultRequestTTL`` is omitted (upstream v0.10: 60 s).
DEFAULT_REQUEST_TTL = 60.0


class FlowControlConfigError(ValueError):
    """The ``flowControl`` section cannot be used; the message names the path and the reason."""


@dataclass(frozen=True, slots=True)
class PriorityBandConfig:
    """One priority band: capacity and the two policies that pick within it.

    ``max_bytes == 0`` means upstream's default (1 GB); ``max_requests == 0`` upstream
    v0.10's default (5,000): every band is bounded.
    """

    priority: int = 0
    max_bytes: int = 0
    max_requests: int = 0
    fairness_policy_ref: str = DEFAULT_FAIRNESS_POLICY
    ordering_policy_ref: str = DEFAULT_ORDERING_POLICY

    @property
    def effective_max_bytes(self) -> int:
        """The byte capacity enforced for this band."""
        return self.max_bytes or DEFAULT_BAND_MAX_BYTES

    @property
    def effective_max_requests(self) -> int:
        """The request capacity enforced for this band."""
        return self.max_requests or DEFAULT_BAND_MAX_REQUESTS


@dataclass(frozen=True, slots=True)
class FlowControlConfig:
    """The whole ``flowControl`` section; ``0`` limits mean "no global limit"."""

    max_bytes: int = 0
    max_requests: int = 0
    #: Seconds a request may wait in the queue; 0 means no TTL (only client cancellation).
    default_request_ttl: float = DEFAULT_REQUEST_TTL
    default_priority_band: PriorityBandConfig = field(default_factory=PriorityBandConfig)
    priority_bands: tuple[PriorityBandConfig, ...] = ()
    usage_limit_policy_ref: str = DEFAULT_USAGE_LIMIT_POLICY
    #: Template for unlisted priorities below 0 (None: ``default_priority_band``).
    default_negative_priority_band: PriorityBandConfig | None = None
    #: ``saturationDetector.pluginRef`` (None: the top-level detector, else
    #: ``utilization-detector``).
    saturation_detector_ref: str | None = None
    #: Evict in-flight sheddable requests when higher-priority ones are blocked.
    enable_eviction: bool = False
    #: Seconds a request may wait while the pool has no endpoints (None: the request's TTL).
    no_endpoint_request_ttl: float | None = None

    def band(self, priority: int) -> PriorityBandConfig:
        """The configuration for ``priority``: its explicit band, else the negative template
        for priorities below 0 when there is one, else the default template."""
        for b in self.priority_bands:
            if b.priority == priority:
                return b
        template = self.default_priority_band
        if priority < 0 and self.default_negative_priority_band is not None:
            template = self.default_negative_priority_band
        return replace(template, priority=priority)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "flowControl") -> FlowControlConfig:
        """Parse the section as found in YAML (``None`` gives the defaults)."""
        if raw is None:
            return cls()
        m = _mapping(raw, where)
        _only(m, where, ("maxBytes", "maxRequests", "defaultRequestTTL", "defaultPriorityBand",
                         "priorityBands", "usageLimitPolicyPluginRef",
                         "defaultNegativePriorityBand", "saturationDetector", "enableEviction",
                         "noEndpointRequestTTL"))
        bands: list[PriorityBandConfig] = []
        seen: set[int] = set()
        raw_bands = m.get("priorityBands")
        if raw_bands is not None and not isinstance(raw_bands, list):
            raise FlowControlConfigError(f"{where}.priorityBands: must be a list, "
                                         f"got {type(raw_bands).__name__}")
        for i, rb in enumerate(raw_bands or ()):
            b = _band(rb, f"{where}.priorityBands[{i}]", template=False)
            if b.priority in seen:
                raise FlowControlConfigError(
                    f"{where}.priorityBands[{i}].priority: duplicate priority {b.priority}")
            seen.add(b.priority)
            bands.append(b)
        default_band = PriorityBandConfig()
        if m.get("defaultPriorityBand") is not None:
            default_band = _band(m["defaultPriorityBand"], f"{where}.defaultPriorityBand",
                                 template=True)
        negative = None
        if m.get("defaultNegativePriorityBand") is not None:
            negative = _band(m["defaultNegativePriorityBand"],
                             f"{where}.defaultNegativePriorityBand", template=True)
        ttl = DEFAULT_REQUEST_TTL
        if m.get("defaultRequestTTL") is not None:  # an explicit "0s" turns the TTL off
            ttl = parse_go_duration(m["defaultRequestTTL"], f"{where}.defaultRequestTTL")
        no_ep_ttl = None
        if m.get("noEndpointRequestTTL") is not None:
            no_ep_ttl = parse_go_duration(m["noEndpointRequestTTL"],
                                          f"{where}.noEndpointRequestTTL")
        eviction = m.get("enableEviction", False)
        if not isinstance(eviction, bool):
            raise FlowControlConfigError(f"{where}.enableEviction: must be true or false, "
                                         f"got {eviction!r}")
        return cls(
            max_bytes=parse_quantity(m.get("maxBytes"), f"{where}.maxBytes"),
            max_requests=parse_quantity(m.get("maxRequests"), f"{where}.maxRequests"),
            default_request_ttl=ttl,
            default_priority_band=default_band,
            priority_bands=tuple(bands),
            usage_limit_policy_ref=_ref(m.get("usageLimitPolicyPluginRef"),
                                        f"{where}.usageLimitPolicyPluginRef",
                                        DEFAULT_USAGE_LIMIT_POLICY),
            default_negative_priority_band=negative,
            saturation_detector_ref=_detector(m.get("saturationDetector"),
                                              f"{where}.saturationDetector"),
            enable_eviction=eviction,
            no_endpoint_request_ttl=no_ep_ttl,
        )


def _detector(raw: Any, where: str) -> str | None:
    """``saturationDetector: {pluginRef: NAME}`` → NAME (None when absent or empty)."""
    if raw is None:
        return None
    m = _mapping(raw, where)
    _only(m, where, ("pluginRef",))
    ref = m.get("pluginRef")
    if ref is None or ref == "":
        return None
    if not isinstance(ref, str):
        raise FlowControlConfigError(f"{where}.pluginRef: must be a plugin name, got {ref!r}")
    return ref


def _band(raw: Any, where: str, *, template: bool) -> PriorityBandConfig:
    m = _mapping(raw, where)
    keys = ("maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef")
    if template:
        if "priority" in m:
            raise FlowControlConfigError(
                f"{where}.priority: the default band is a template for every unlisted "
                "priority; list a fixed priority under priorityBands instead")
        _only(m, where, keys)
        priority = 0
    else:
        _only(m, where, ("priority", *keys))
        if "priority" not in m:
            raise FlowControlConfigError(f"{where}.priority: required")
        priority = m["priority"]
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise FlowControlConfigError(f"{where}.priority: must be an integer, "
                                         f"got {priority!r}")
    return PriorityBandConfig(
        priority=priority,
        max_bytes=parse_quantity(m.get("maxBytes"), f"{where}.maxBytes"),
        max_requests=parse_quantity(m.get("maxRequests"), f"{where}.maxRequests"),
        fairness_policy_ref=_ref(m.get("fairnessPolicyRef"), f"{where}.fairnessPolicyRef",
                                 DEFAULT_FAIRNESS_POLICY),
        ordering_policy_ref=_ref(m.get("orderingPolicyRef"), f"{where}.orderingPolicyRef",
                                 DEFAULT_ORDERING_POLICY),
    )


# Kubernetes resource.Quantity: a decimal number with an optional binary (Ki…Ei), decimal
# (n…E) or exponent (e3) suffix. Value() rounds up to an integer, as upstream reads it.
_QUANTITY = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")
_SUFFIX = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


def parse_quantity(value: Any, where: str) -> int:
    """A Kubernetes quantity (``10Gi``, ``500M``, ``1k``, ``1e3``, or a plain integer) → an
    integer, rounded up; ``None`` → 0. Negative values are errors (upstream refuses them)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise FlowControlConfigError(f"{where}: must be a quantity like 512Mi or 100, "
                                     f"got {value!r}")
    if isinstance(value, int):
        n = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise FlowControlConfigError(f"{where}: must be a finite quantity, got {value!r}")
        n = Fraction(value)
    elif isinstance(value, str) and (mq := _QUANTITY.fullmatch(value.strip())):
        sign, number, suffix = mq.groups()
        suffix = suffix or ""
        scale = (Fraction(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E")
                 else _SUFFIX[suffix])
        n = Fraction(number) * scale * (-1 if sign == "-" else 1)
    else:
        raise FlowControlConfigError(f"{where}: must be a quantity like 512Mi or 100, "
                                     f"got {value!r}")
    if n < 0:
        raise FlowControlConfigError(f"{where}: must be non-negative, got {value!r}")
    return math.ceil(n)


def parse_go_duration(value: Any, where: str) -> float:
    """A Kubernetes ``metav1.Duration`` (a Go duration string: ``30s``, ``1m30s``, ``500ms``)
    → seconds; ``None`` → 0. Like Go, a number needs a unit unless it is ``0``."""
    if value is None:
        return 0.0
    if isinstance(value, str):
        s = value.strip()
        try:
            bare = float(s)
        except ValueError:
            bare = None
        if bare is not None and bare != 0:
            raise FlowControlConfigError(f"{where}: missing unit in duration {value!r} "
                                         "(use e.g. 30s, 500ms, 1m30s)")
        try:
            seconds = duration(s)
        except Exception:
            raise FlowControlConfigError(f"{where}: invalid duration {value!r} "
                                         "(use e.g. 30s, 500ms, 1m30s)") from None
        if seconds < 0:
            raise FlowControlConfigError(f"{where}: must not be negative, got {value!r}")
        return seconds
    raise FlowControlConfigError(f"{where}: must be a duration string like 30s, got {value!r}")


def _ref(value: Any, where: str, default: str) -> str:
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise FlowControlConfigError(f"{where}: must be a plugin name, got {value!r}")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FlowControlConfigError(f"{where}: must be a mapping, got {type(value).__name__}")
    return value


def _only(m: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> None:
    for key in m:
        if key not in allowed:
            raise FlowControlConfigError(
                f"{where}.{key}: unknown field (known: {', '.join(allowed)})")
