"""What flow control did during a benchmark run: the EPP's own queue-duration histogram
(``inference_extension_flow_control_request_queue_duration_seconds``), read from its
``/metrics`` before the run ends, summarised per priority and fairness id.

:class:`FlowEpp` is the :class:`~bench.contenders.Epp` contender whose ``debug()`` (saved as
``debug.json`` next to each run) carries that summary under ``flowControlQueue``: per
``"<priority>/<fairness id>"`` the requests by outcome, how many waited at all (longer than
the histogram's first bucket, 0.1 ms), and their mean wait in seconds.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.contenders import Epp

SERIES = "inference_extension_flow_control_request_queue_duration_seconds"


def queue_summary(metrics_text: str) -> dict[str, dict[str, float]]:
    """Per ``"<priority>/<fairness id>"``: ``<outcome>`` counts, ``waited`` (requests that
    spent more than 0.1 ms queued) and ``mean_wait_s`` over all of them."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name != SERIES:
            continue
        for s in fam.samples:
            key = f"{s.labels.get('priority')}/{s.labels.get('fairness_id')}"
            row = out.setdefault(key, {"count": 0.0, "sum": 0.0, "fast": 0.0, "waited": 0.0})
            if s.name.endswith("_count"):
                row["count"] += s.value
                row[s.labels["outcome"]] = row.get(s.labels["outcome"], 0.0) + s.value
            elif s.name.endswith("_sum"):
                row["sum"] += s.value
            elif s.name.endswith("_bucket") and s.labels.get("le") == "0.0001":
                row["fast"] += s.value
    for row in out.values():
        row["waited"] = row["count"] - row.pop("fast")
        row["mean_wait_s"] = row.pop("sum") / row["count"] if row["count"] else 0.0
    return out


class FlowEpp(Epp):
    """The EPP contender whose debug snapshot adds what its flow controller did."""

    def debug(self) -> dict[str, Any]:
        data = super().debug()
        try:
            url = f"http://127.0.0.1:{self._metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as resp:
                data["flowControlQueue"] = queue_summary(resp.read().decode())
        except OSError:
            pass
        return data
