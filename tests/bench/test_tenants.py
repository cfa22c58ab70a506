"""The mixed tenants/priorities workload: its headers, its checks, and that the twin's EPP
reads them (sheddable requests are shed under overload, per-class figures are reported)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from bench.report import RunResult, class_table
from bench.runner import twin_run as run_one
from bench.workloads import (
    FAIRNESS_HEADER,
    HERE,
    OBJECTIVE_HEADER,
    OBJECTIVES,
    WORKLOADS,
    WorkloadError,
    load_workload,
)


def test_every_request_names_its_tenant_and_objective_in_the_shares_given() -> None:
    wl = WORKLOADS["tenants"]
    specs = wl.schedule(1.0, 60.0, seed=2, servers=8)
    tenants = wl.parameters["tenants"]
    for s in specs:
        tenant, objective = s.tag.split("/")
        assert s.headers == {FAIRNESS_HEADER: tenant, OBJECTIVE_HEADER: objective}
        assert tenants[tenant]["objective"] == objective and objective in OBJECTIVES
    counts = collections.Counter(s.headers[FAIRNESS_HEADER] for s in specs)
    for tenant, t in tenants.items():
        assert counts[tenant] / len(specs) == pytest.approx(t["share"], abs=0.05)


@pytest.mark.parametrize(("tenants", "message"), [
    ("tenants: {chat: {share: 1, objective: urgent}}",
     r"parameters.tenants.chat.objective: 'urgent' is not one of"),
    ("tenants: {chat: {share: 0, objective: standard}}",
     r"parameters.tenants.chat.share: expected a positive number"),
    ("tenants: {chat: {share: 1}}",
     r"parameters.tenants.chat: expected {share, objective} and optionally"),
    ("tenants: []", r"parameters.tenants: expected a mapping"),
])
def test_a_bad_tenant_is_named_with_its_file_and_field(tmp_path: Path, tenants: str,
                                                       message: str) -> None:
    text = (HERE / "tenants.yaml").read_text()
    start = text.index("  tenants:")
    end = text.index("loads:")
    path = tmp_path / "bad.yaml"
    path.write_text(text[:start] + "  " + tenants + "\n" + text[end:])
    with pytest.raises(WorkloadError, match=message) as e:
        load_workload(path)
    assert str(path) in str(e.value)


def test_the_twins_epp_sheds_only_the_sheddable_tenant_under_overload() -> None:
    # 1.5x the fleet's capacity: the EPP's saturation detector rejects sheddable requests
    # (priority < 0, from the InferenceObjective the header names) and no others; round-robin
    # reads no header and sheds nothing.
    epp = run_one("tenants", 1.5, 8, 0, "epp-default", 20.0)
    rr = run_one("tenants", 1.5, 8, 0, "envoy-rr", 20.0)
    assert epp.classes["backfill/sheddable"]["errors"] > 0
    assert epp.classes["chat/interactive"]["errors"] == 0
    assert epp.classes["api/standard"]["errors"] == 0
    assert all(c["errors"] == 0 for c in rr.classes.values())
    assert sum(c["requests"] for c in epp.classes.values()) == epp.requests


def test_the_class_table_shows_each_class_per_contender() -> None:
    rows = [RunResult("tenants", 1.5, 10.0, "envoy-rr", "baseline", seed=s,
                      classes={"a/standard": {"requests": 10, "errors": 0, "ttft_p90": 1.0 + s},
                               "b/sheddable": {"requests": 10, "errors": 5, "ttft_p90": 2.0}})
            for s in range(3)]
    text = "\n".join(class_table(rows, ["envoy-rr", "epp-default"]))
    assert "| contender | a/standard | b/sheddable |" in text
    assert "| envoy-rr | 2.000 (0%) | 2.000 (50%) |" in text
    assert "epp-default" not in text
