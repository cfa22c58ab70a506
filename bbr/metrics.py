"""BBR's Prometheus metrics (upstream names, so existing dashboards keep working)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

#: upstream's labels: the commit (``unknown`` when not known) and the version as build_ref
INFO = Gauge("bbr_info", "BBR build information.", ["commit", "build_ref"])
SUCCESS = Counter("bbr_success_total", "Requests the router processed successfully.")
ERRORS = Counter("bbr_errors_total", "Requests the router ended with an error.", ["code"])
PLUGIN_DURATION = Histogram(
    "bbr_plugin_duration_seconds",
    "Time spent in one plugin for one request.",
    ["plugin_type", "plugin_name"],
    buckets=(1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2),
)
FIELD_NOT_FOUND = Counter(
    "bbr_body_field_not_found_total", "Requests whose body lacks the field.", ["field"]
)
FIELD_EMPTY = Counter("bbr_body_field_empty_total", "Requests whose field is empty.", ["field"])
