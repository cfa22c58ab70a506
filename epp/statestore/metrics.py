"""The state store's own metrics (``inference_extension_state_store_*``).

Operations are the background sync's steps, never per request: ``push`` (this replica's
writes, one pipeline), ``pull`` (the other replicas' in-flight counts), ``load`` (reading the
shared prefix index and sessions after a (re)connect) and ``subscribe`` (the update feed).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)

OPERATIONS = Counter("inference_extension_state_store_operations_total",
                     "State-store operations attempted, by operation.", ["store", "operation"])
ERRORS = Counter("inference_extension_state_store_errors_total",
                 "State-store operations that failed, by operation.", ["store", "operation"])
LATENCY = Histogram("inference_extension_state_store_operation_duration_seconds",
                    "Time one state-store operation took.", ["store", "operation"],
                    buckets=_LATENCY)
UP = Gauge("inference_extension_state_store_up",
           "1 while this replica shares state through the store, 0 while it runs on local "
           "state only.", ["store"])
BACKLOG = Gauge("inference_extension_state_store_backlog",
                "Prefix-index and session writes queued for the store (grows while it is "
                "unreachable, bounded).", ["store"])
REJECTED = Counter("inference_extension_state_store_rejected_total",
                   "Values read from the store that were refused (bad shape, bad signature, "
                   "stale), by source (inflight, update, prefix, session, replica) and reason.",
                   ["store", "source", "reason"])
