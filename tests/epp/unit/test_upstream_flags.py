"""Upstream v1.5.0's ``epp`` and ``bbr`` flags (issue #13): each is accepted, and is either
implemented, deprecated with a warning, or ignored with the reason logged; a bad value stops
the command with one line naming the flag."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from bbr.main import parser as bbr_parser
from devkit.manifests import pool_manifests, write_yaml
from epp.config import build, parse_config
from epp.datalayer import CoreMetricsExtractor
from epp.datastore import EngineType
from epp.main import DEPRECATED, EPP_IGNORED, parser, settings
from shared import logs
from shared.upstream_flags import log_settings, report
from tests.support.processes import EppProcess
from tests.support.views import build_view

#: Every flag upstream v1.5.0's EPP defines (pkg/epp/server/options.go and the zap flags),
#: with a value a Deployment might give it.
UPSTREAM_EPP_FLAGS = [
    "--grpc-port=9002", "--ha-enable-leader-election=false",
    "--pool-group=inference.networking.k8s.io", "--pool-namespace=default", "--pool-name=p",
    "--endpoint-selector=app=x", "--endpoint-target-ports=8000",
    "--disable-endpoint-subset-filter=false", "--model-server-metrics-scheme=https",
    "--model-server-metrics-path=/metrics", "--model-server-metrics-port=8000",
    "--model-server-metrics-https-insecure-skip-verify=true",
    "--refresh-metrics-interval=50ms", "--refresh-prometheus-metrics-interval=5s",
    "--metrics-staleness-threshold=2s",
    "--total-queued-requests-metric=sglang:num_queue_reqs",
    "--total-running-requests-metric=sglang:num_running_reqs",
    "--kv-cache-usage-percentage-metric=sglang:token_usage",
    "--lora-info-metric=vllm:lora_requests_info", "--cache-info-metric=sglang:cache_config_info",
    "--v=3", "--zap-devel=false", "--zap-encoder=json", "--zap-log-level=info",
    "--zap-stacktrace-level=error", "--zap-time-encoding=rfc3339", "--tracing=true",
    "--health-checking=true", "--metrics-port=9090", "--grpc-health-port=9003",
    "--enable-pprof=true", "--cert-path=/certs", "--enable-cert-reload=true",
    "--secure-serving=true", "--metrics-endpoint-auth=true", "--config-file=/config.yaml",
]
UPSTREAM_BBR_FLAGS = [
    "--grpc-port=9004", "--grpc-health-port=9005", "--metrics-port=9090", "--tracing=false",
    "--metrics-endpoint-auth=true", "--streaming=true", "--secure-serving=true",
    "--enable-pprof=false", "--plugin=body-field-to-header:m2h", "--v=2",
    "--zap-encoder=console", "--zap-log-level=debug", "--zap-devel=true",
    "--zap-stacktrace-level=panic", "--zap-time-encoding=epoch",
]


def test_every_upstream_epp_flag_is_accepted() -> None:
    args = parser().parse_args(UPSTREAM_EPP_FLAGS)
    assert args.model_server_metrics_scheme == "https"
    assert args.refresh_prometheus_metrics_interval == 5.0
    assert args.zap_encoder == "json" and args.health_checking is True


def test_every_upstream_bbr_flag_is_accepted() -> None:
    args = bbr_parser().parse_args(UPSTREAM_BBR_FLAGS)
    assert args.tracing is False and args.zap_time_encoding == "epoch"


@pytest.mark.parametrize(("argv", "flag"), [
    (["--zap-encoder", "xml"], "--zap-encoder"),
    (["--zap-log-level", "loud"], "--zap-log-level"),
    (["--zap-log-level", "0"], "--zap-log-level"),
    (["--zap-time-encoding", "tai"], "--zap-time-encoding"),
    (["--zap-stacktrace-level", "debug"], "--zap-stacktrace-level"),
    (["--zap-devel=sometimes"], "--zap-devel"),
    (["--model-server-metrics-scheme", "ftp"], "--model-server-metrics-scheme"),
    (["--model-server-metrics-https-insecure-skip-verify=perhaps"],
     "--model-server-metrics-https-insecure-skip-verify"),
    (["--total-queued-requests-metric", "bad{"], "--total-queued-requests-metric"),
    (["--cache-info-metric", "x{a!=b}"], "--cache-info-metric"),
    (["--refresh-prometheus-metrics-interval", "soon"], "--refresh-prometheus-metrics-interval"),
    (["--tracing=maybe"], "--tracing"),
    (["--health-checking=2"], "--health-checking"),
    (["--enable-pprof=yes please"], "--enable-pprof"),
    (["--enable-cert-reload=x"], "--enable-cert-reload"),
    (["--metrics-endpoint-auth=x"], "--metrics-endpoint-auth"),
])
def test_bad_values_exit_with_one_line_naming_the_flag(
        argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"argument {flag}" in lines[0], lines


def test_bbr_bad_zap_value_exits_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bbr_parser().parse_args(["--zap-encoder", "yaml"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "argument --zap-encoder" in line


# -- deprecated: accepted, applied, warned about only when given -----------------------------


def warnings_for(argv: list[str]) -> list[str]:
    args = parser().parse_args(argv)
    with capture_logs() as logged:
        report(args, structlog.get_logger("x"), EPP_IGNORED, DEPRECATED)
    return [e["reason"] for e in logged]


def test_deprecated_flags_warn_only_when_given() -> None:
    assert warnings_for([]) == []
    (why,) = warnings_for(["--model-server-metrics-scheme=https"])
    assert why.startswith("--model-server-metrics-scheme:") and "metrics-data-source" in why
    (why,) = warnings_for(["--total-queued-requests-metric=sglang:num_queue_reqs"])
    assert "engineConfigs" in why


def test_ignored_flags_log_why_when_given() -> None:
    reasons = warnings_for(["--enable-pprof", "--tracing=true", "--metrics-endpoint-auth=true",
                            "--refresh-prometheus-metrics-interval=1s",
                            "--enable-cert-reload", "--zap-stacktrace-level=error"])
    assert [r.split(":")[0] for r in reasons] == [
        "--enable-pprof", "--metrics-endpoint-auth", "--zap-stacktrace-level",
        "--refresh-prometheus-metrics-interval", "--enable-cert-reload"]
    # asking for what already happens stays quiet; --tracing is implemented (shared.tracing)
    assert warnings_for(["--tracing=false", "--enable-pprof=false"]) == []


def test_scheme_and_tls_flags_reach_the_metrics_data_source() -> None:
    args = parser().parse_args(["--model-server-metrics-scheme=https",
                                "--model-server-metrics-https-insecure-skip-verify=false"])
    runtime = build(parse_config(None), settings=settings(args))
    (source,) = runtime.data_sources
    assert (source.config.scheme, source.config.insecure_skip_verify) == (  # type: ignore[attr-defined]
        "https", False)
    # a parameter in the config wins over the flag
    text = ("plugins:\n- type: metrics-data-source\n  parameters: {scheme: http}\n"
            "- type: core-metrics-extractor\n")
    (source,) = build(parse_config(text), settings=settings(args)).data_sources
    assert source.config.scheme == "http"  # type: ignore[attr-defined]


SGLANG_PAGE = """\
sglang:num_queue_reqs{model_name="m"} 7
sglang:num_running_reqs{model_name="m"} 3
sglang:token_usage{model_name="m"} 0.25
"""


def test_metric_name_flags_read_unlabelled_pods_with_those_names() -> None:
    args = parser().parse_args([
        "--total-queued-requests-metric=sglang:num_queue_reqs",
        "--total-running-requests-metric=sglang:num_running_reqs",
        "--kv-cache-usage-percentage-metric=sglang:token_usage"])
    runtime = build(parse_config(None), settings=settings(args))
    (extractor,) = runtime.handle.find(CoreMetricsExtractor)
    m = extractor.extract(SGLANG_PAGE, build_view(1, labels={}), 1.0).metrics
    assert (m.waiting, m.running, m.kv_usage) == (7, 3, 0.25)
    # without the flags the page has none of vLLM's names: it is read by the dialect detected
    # on it (SGLang's own names), and remembered for that endpoint
    (plain,) = build(parse_config(None)).handle.find(CoreMetricsExtractor)
    view = build_view(1, labels={})
    detected = plain.extract(SGLANG_PAGE, view, 1.0).metrics
    assert plain.engine(view) == EngineType.SGLANG
    assert detected.waiting == 7


def test_metric_flags_with_labels_select_samples() -> None:
    args = parser().parse_args([
        "--total-queued-requests-metric=nv{request_type=waiting}",
        "--total-running-requests-metric=nv{request_type=\"scheduled\"}"])
    (extractor,) = build(parse_config(None),
                         settings=settings(args)).handle.find(CoreMetricsExtractor)
    page = 'nv{request_type="waiting"} 4\nnv{request_type="scheduled"} 9\n'
    m = extractor.extract(page, build_view(1, labels={}), 1.0).metrics
    assert (m.waiting, m.running) == (4, 9)


# -- the zap logging flags -------------------------------------------------------------------


def test_zap_flags_choose_format_level_and_time(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["--zap-encoder=json", "--zap-log-level=error",
                                "--zap-time-encoding=epoch"])
    ls = log_settings(args)
    assert (ls.level, ls.json, ls.time_format) == (logging.ERROR, True, "epoch")
    saved = structlog.get_config()
    try:
        logs.configure(args.verbosity, json=ls.json, level=ls.level,
                       time_format=ls.time_format)
        log = structlog.get_logger("t")
        log.warning("dropped")
        log.error("kept")
    finally:
        structlog.configure(**saved)  # later tests must not write to this test's stderr
    lines = [json.loads(x) for x in capsys.readouterr().err.strip().splitlines()]
    assert [x["event"] for x in lines] == ["kept"]
    assert isinstance(lines[0]["timestamp"], float)


def test_zap_log_level_integer_is_a_verbosity_and_devel_means_console_debug() -> None:
    assert log_settings(parser().parse_args(["--zap-log-level=5"])).level == logging.DEBUG
    assert log_settings(parser().parse_args(["--zap-log-level=1"])).level == logging.INFO
    devel = log_settings(parser().parse_args(["--zap-devel"]))
    assert (devel.level, devel.json) == (logging.DEBUG, False)
    both = log_settings(parser().parse_args(["--zap-devel", "--zap-encoder=json"]))
    assert both.json is True


# -- implemented: --health-checking (a real epp) ---------------------------------------------


def ext_proc_port_health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(
                service="envoy.service.ext_proc.v3.ExternalProcessor"), timeout=5).status


def test_health_checking_serves_health_on_the_ext_proc_port(tmp_path: Path) -> None:
    manifests = tmp_path / "pool.yaml"
    write_yaml(manifests, pool_manifests("pool", [("p0", "127.0.1.1")], 8000))
    epp = EppProcess(manifests, "--health-checking", "--zap-encoder=json",
                     "--tracing=true").wait_serving()
    plain = EppProcess(manifests).wait_serving()
    try:
        assert ext_proc_port_health(epp.port) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            ext_proc_port_health(plain.port)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        log = epp.log_tail(200)
        # --tracing given with no exporter named: upstream's console exporter, whose
        # spans are JSON lines like the log's
        assert '"tracing on"' in log and '"exporter": "console"' in log
        assert all(json.loads(line) for line in log.splitlines() if line.strip())
    finally:
        epp.stop()
        plain.stop()


# -- BBR: upstream's fieldName -----------------------------------------------------------------


def test_bbr_takes_upstreams_field_name_parameter() -> None:
    from bbr.basemodels import StaticBaseModels
    from bbr.plugins import build as build_bbr

    (plugin,) = build_bbr(['body-field-to-header:m:{"fieldName":"target",'
                           '"headerName":"X-Target"}'], StaticBaseModels())
    assert plugin.headers({"target": "a", "model": "b"}) == {"x-target": "a"}  # type: ignore[attr-defined]


def test_an_empty_metric_flag_turns_that_metric_off() -> None:
    """Upstream's chart renders ``--lora-info-metric=`` for engines without LoRA metrics."""
    args = parser().parse_args(["--lora-info-metric=", "--cache-info-metric="])
    (extractor,) = build(parse_config(None),
                         settings=settings(args)).handle.find(CoreMetricsExtractor)
    assert (extractor.default.lora_info, extractor.default.cache_config) == (None, None)
    page = ('vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n'
            'vllm:kv_cache_usage_perc 0.5\nvllm:lora_requests_info{max_lora="1",'
            'running_lora_adapters="a",waiting_lora_adapters=""} 1\n')
    assert extractor.extract(page, build_view(1, labels={}), 1.0).metrics.lora is None
